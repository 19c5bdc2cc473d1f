"""pipeline.interventions: what `hooks`, `attention` and `weights_frozen` change is undone however their block ends,
even when a kind of hook fails halfway through its installation; the gates and the stop do what they say."""

from __future__ import annotations

import pytest
import torch

from attnscope.pipeline import interventions


def _installed(model) -> int:
    """Every hook and replaced forward on the model's modules."""
    return sum(
        len(module._forward_pre_hooks) + len(module._forward_hooks) + ("forward" in module.__dict__)
        for module in model.modules()
    )


def _every_kind(loaded) -> list:
    recorder = interventions.DirectPathRecorder([], lambda layer, x: None, [loaded.family.layers(loaded.model)[0]])
    return [
        interventions.HeadGates(),
        interventions.LayerInputsRecorder(loaded.n_layer - 1),
        interventions.AttentionWeightsRecorder(),
        recorder,
        interventions.ReplacedAttention(0, lambda *args, **kwargs: None),
        interventions.StopAfterAttention(loaded.n_layer - 1),
    ]


def test_hooks_remove_what_they_installed_however_the_block_ends(tiny):
    before = _installed(tiny.model)
    with pytest.raises(RuntimeError, match="inside"):
        with interventions.hooks(tiny, *_every_kind(tiny)) as kinds:
            assert len(kinds) == 6 and _installed(tiny.model) > before
            raise RuntimeError("inside")
    assert _installed(tiny.model) == before
    assert "forward" not in tiny.family.attention_modules(tiny.model)[0].__dict__  # the class's method again


def test_a_kind_that_fails_halfway_leaves_nothing_behind(tiny):
    class Failing:
        def install(self, loaded):
            yield from interventions.HeadGates().install(loaded)  # every layer's gate in place, then
            raise ValueError("halfway")

    before = _installed(tiny.model)
    with pytest.raises(ValueError, match="halfway"):
        with interventions.hooks(tiny, interventions.AttentionWeightsRecorder(), Failing()):
            pass  # never reached
    assert _installed(tiny.model) == before


def test_gates_off_or_all_open_leave_the_forward_as_it_was_and_a_closed_gate_changes_it(tiny):
    ids = torch.arange(2, 12)[None]  # (1, 10)
    L, H = tiny.n_layer, tiny.n_head
    with torch.no_grad():
        plain = tiny.model(input_ids=ids).last_hidden_state  # (1, 10, d)
        gates = interventions.HeadGates()
        with interventions.hooks(tiny, gates):
            off = tiny.model(input_ids=ids).last_hidden_state
            gates.values = torch.ones(1, L, H)
            kept = tiny.model(input_ids=ids).last_hidden_state
            gates.values[0, 0, 1] = 0
            removed = tiny.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(off, plain, rtol=0, atol=0)
    torch.testing.assert_close(kept, plain)
    assert (removed - plain).abs().max() > 1e-4


def test_the_stop_leaves_the_forward_after_the_attention_it_watches(tiny):
    recorder = interventions.LayerInputsRecorder(tiny.n_layer - 1)
    with interventions.hooks(tiny, recorder, interventions.StopAfterAttention(0)), torch.no_grad():
        with pytest.raises(interventions.Stop):
            tiny.model(input_ids=torch.arange(2, 8)[None])
    assert sorted(recorder.calls) == [0]  # layer 1 was never entered
    assert sorted(recorder.outputs) == [0]  # layer 0's attention ran, and returned
    assert sorted(recorder.z) == [0]  # GPT-2's output projection is inside its attention module


def test_the_attention_implementation_and_the_weights_gradients_come_back_after_an_error(tiny):
    previous = tiny.config._attn_implementation
    other = "eager" if previous != "eager" else "sdpa"
    needing = [parameter.requires_grad for parameter in tiny.model.parameters()]
    with pytest.raises(RuntimeError, match="inside"):
        with interventions.attention(tiny, other), interventions.weights_frozen(tiny):
            assert tiny.config._attn_implementation == other
            assert not any(parameter.requires_grad for parameter in tiny.model.parameters())
            raise RuntimeError("inside")
    assert tiny.config._attn_implementation == previous
    assert [parameter.requires_grad for parameter in tiny.model.parameters()] == needing
