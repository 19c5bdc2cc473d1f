"""`circuit --method gradient` (attribution patching, `gradient_changes`) against independent references: the heads
analysis for the values with every head kept; finite differences of the heads analysis's scores, with one head's
output scaled by hand (a forward pre-hook on the output projection), for the derivative; a copy of the model whose
head's slice of W_O is zeroed, scored by the heads analysis, for exact removal (the demo's induction circuit)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from attnscope.analyses.circuit_gradient import gradient_changes
from attnscope.analyses.heads import Heads
from attnscope.errors import AttnscopeError
from attnscope.models.loading import load_model
from attnscope.pipeline.inputs import Text, sample_texts
from attnscope.scores import catalog
from tests.support import FAMILY_TEXTS, TEXTS

SETTINGS = Heads(probe_len=8)  # a short probe: the tiny models' scores, quickly


def _measured(loaded, smooth: bool = False) -> list[str]:
    """The per-head scores this kind of model measures that have a gradient at all (local_uniform is the same for
    every head; retrieval, a count of argmax hits, is refused: see below); `smooth`: those differentiable
    everywhere, not confidence (a row maximum: on the tiny GPT-2 its one-sided derivatives at ξ = 1 differ, -0.0377
    and -0.031 for 1.1 against 0.0, where the strongest key of some row changes)."""
    scores = catalog.scores_for(loaded.kind.name)
    names = [score.name for score in scores if score.per_head and score.name != "retrieval"]
    return [name for name in names if name != "confidence"] if smooth else names


def _every_pair(loaded) -> list[tuple[int, int, str]]:
    return [(layer, head, name) for layer in range(loaded.n_layer) for head in range(loaded.n_head)
            for name in _measured(loaded)]  # fmt: skip


def _scores(loaded, texts, settings, scale=None):
    """Every head's scores by the heads analysis, with head `scale[0]`'s output multiplied by scale[1] (a forward
    pre-hook on its layer's output projection, written here)."""
    handle = None
    if scale is not None:
        (layer, head), factor = scale
        d_head = loaded.d_head

        def scaled(module, args):
            x = args[0].clone()  # (B, n, H·d_head)
            x[..., head * d_head : (head + 1) * d_head] *= factor
            return (x, *args[1:])

        handle = loaded.family.output_projections(loaded.model)[layer].register_forward_pre_hook(scaled)
    try:
        result = settings.run(loaded, texts)
    finally:
        if handle is not None:
            handle.remove()
    return {
        (record.layer, record.head, name): value for record in result.heads for name, value in record.scores.items()
    }


def _without(loaded, layer: int, head: int):
    """A copy of the model with head layer.head's slice of the output projection's weight zeroed by hand."""
    removed = copy.deepcopy(loaded)
    projection = removed.family.output_projections(removed.model)[layer]
    part = slice(head * loaded.d_head, (head + 1) * loaded.d_head)
    with torch.no_grad():
        if type(projection).__name__ == "Conv1D":  # GPT-2: weight (in, out), a head owns rows
            projection.weight[part] = 0
        else:  # nn.Linear: weight (out, in), a head owns columns
            projection.weight[:, part] = 0
    return removed


def test_values_equal_the_heads_analysis(model):
    explained = _every_pair(model)
    values, changes = gradient_changes(model, TEXTS, explained, SETTINGS, ablation="zero")
    expected = _scores(model, TEXTS, SETTINGS)
    assert values.shape == (len(explained),) and changes.shape == (len(explained), model.n_layer, model.n_head)
    np.testing.assert_allclose(values, [expected[item] for item in explained], atol=2e-6)


def test_the_estimate_is_minus_the_derivative_and_zero_from_the_head_s_own_layer_up(model):
    explained = [(1, head, name) for head in range(model.n_head) for name in _measured(model, smooth=True)]
    explained.append((0, 2, "previous_token"))
    _, changes = gradient_changes(model, TEXTS, explained, SETTINGS, ablation="zero")
    step = 1e-3
    for head in range(model.n_head):  # central differences of the heads analysis, one layer-0 head scaled at a time
        up = _scores(model, TEXTS, SETTINGS, ((0, head), 1 + step))
        down = _scores(model, TEXTS, SETTINGS, ((0, head), 1 - step))
        derivative = np.array([(up[item] - down[item]) / (2 * step) for item in explained])
        scale = max(1.0, np.abs(derivative).max())
        np.testing.assert_allclose(changes[:, 0, head], -derivative, atol=2e-3 * scale)
    assert (changes[:, 1] == 0).all()  # A in B's layer: B's attention is computed before A writes
    assert (changes[-1] == 0).all()  # B in layer 0: nothing comes before it


def test_a_head_whose_output_weights_are_zero_is_estimated_to_change_nothing(tiny):
    removed = _without(tiny, 0, 1)
    explained = [(1, head, "previous_token") for head in range(tiny.n_head)] + [(1, 0, "induction")]
    for steps in (0, 2):
        _, changes = gradient_changes(removed, TEXTS, explained, SETTINGS, steps=steps, ablation="zero")
        assert (changes[:, 0, 1] == 0).all()
        assert np.abs(changes[:, 0, [0, 2, 3]]).max() > 0


def test_the_model_is_left_as_it_was(tiny):
    before = _scores(tiny, TEXTS, SETTINGS)
    implementation = tiny.config._attn_implementation
    gradient_changes(tiny, TEXTS, [(1, 0, "induction"), (1, 1, "entropy")], SETTINGS, steps=2, ablation="zero")
    assert tiny.config._attn_implementation == implementation
    assert all(parameter.grad is None and parameter.requires_grad for parameter in tiny.model.parameters())
    assert _scores(tiny, TEXTS, SETTINGS) == before


def test_batched_backward_passes_equal_one_after_another(tiny, monkeypatch):
    """The backward passes of a chunk of scores run together (vmap); one by one, or with vmap refused, the same
    (to float32 rounding: batched matrix products add in another order)."""
    from attnscope.analyses import circuit_gradient

    explained = [(1, head, name) for head in range(tiny.n_head) for name in ("previous_token", "induction")]
    _, batched = gradient_changes(tiny, TEXTS, explained, SETTINGS, ablation="zero")
    monkeypatch.setattr(circuit_gradient, "GRADIENTS_AT_ONCE", 1)
    np.testing.assert_allclose(
        gradient_changes(tiny, TEXTS, explained, SETTINGS, ablation="zero")[1], batched, atol=1e-6
    )
    grad = torch.autograd.grad

    def refuse_batches(*args, **kwargs):
        if kwargs.get("is_grads_batched"):
            raise RuntimeError("vmap: not supported")
        return grad(*args, **kwargs)

    monkeypatch.setattr(circuit_gradient, "GRADIENTS_AT_ONCE", 16)
    monkeypatch.setattr(torch.autograd, "grad", refuse_batches)
    np.testing.assert_allclose(
        gradient_changes(tiny, TEXTS, explained, SETTINGS, ablation="zero")[1], batched, atol=1e-6
    )


@pytest.mark.parametrize(
    "explained, settings, message",
    [
        ([(1, 0, "bogus")], SETTINGS, "score 'bogus'"),
        ([(2, 0, "previous_token")], SETTINGS, "layer 2 is out of range"),
        ([(1, 4, "previous_token")], SETTINGS, "head 4 is out of range"),
        ([(1, 0, "induction")], Heads(probe=False), "the probe, which is off"),
        ([(1, 0, "next_token")], SETTINGS, "measured for encoders only"),
    ],
)
def test_bad_requests_are_refused(tiny, explained, settings, message):
    with pytest.raises(AttnscopeError, match=message):
        gradient_changes(tiny, TEXTS, explained, settings, ablation="zero")
    with pytest.raises(AttnscopeError, match="steps"):
        gradient_changes(tiny, TEXTS, [(1, 0, "self")], SETTINGS, steps=-1, ablation="zero")


def test_an_encoder_has_no_probe_score(tiny_bert):
    with pytest.raises(AttnscopeError, match="measured for decoders only"):
        gradient_changes(tiny_bert, TEXTS, [(1, 0, "induction")], SETTINGS, ablation="zero")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "gemma2", "gpt_oss", "modernbert"])
def test_values_equal_the_heads_analysis_with_windows_softcaps_and_sinks(family_dir, family):
    """Sliding windows in some layers only (each layer's own mask, and its own local_uniform), Gemma 2's soft-capping,
    gpt-oss's sinks, ModernBERT's local layers: every score of every layer in one call."""
    loaded = load_model(str(family_dir(family)), "cpu")
    texts = [*TEXTS, *FAMILY_TEXTS]
    explained = _every_pair(loaded)
    values, changes = gradient_changes(loaded, texts, explained, SETTINGS, ablation="zero")
    expected = _scores(loaded, texts, SETTINGS)
    np.testing.assert_allclose(values, [expected[item] for item in explained], atol=2e-6)
    assert np.isfinite(changes).all() and np.abs(changes[[k for k, item in enumerate(explained) if item[0]]]).max() > 0


@pytest.mark.slow
def test_grouped_query_llama_values_and_derivative(family_dir):
    """A tiny Llama with two key/value heads for four query heads: values and derivative as above."""
    llama = load_model(str(family_dir("llama")), "cpu")
    texts = [*TEXTS, *FAMILY_TEXTS]
    explained = [(1, head, name) for head in range(llama.n_head) for name in _measured(llama, smooth=True)]
    values, changes = gradient_changes(llama, texts, explained, SETTINGS, ablation="zero")
    expected = _scores(llama, texts, SETTINGS)
    np.testing.assert_allclose(values, [expected[item] for item in explained], atol=2e-6)
    step = 1e-3
    for head in range(llama.n_head):
        up = _scores(llama, texts, SETTINGS, ((0, head), 1 + step))
        down = _scores(llama, texts, SETTINGS, ((0, head), 1 - step))
        derivative = np.array([(up[item] - down[item]) / (2 * step) for item in explained])
        np.testing.assert_allclose(changes[:, 0, head], -derivative, atol=2e-3 * max(1.0, np.abs(derivative).max()))


@pytest.mark.slow
def test_the_demo_s_induction_circuit():
    """Removing previous-token head 0.2 lowers the induction score of 1.0, 1.2 and 1.3 (exact removal: W_O's slice
    zeroed in a copy). Integrated gradients find it: 0.2 is each one's strongest dependency, pointing down. Plain
    attribution patching does not: those heads' attention is saturated on the induction target (0.73-0.96 of a
    row), so the derivative at ξ = 1 is a small fraction of the change (documented in docs/circuit.md)."""
    demo = load_model("demo", "cpu")
    texts = sample_texts()
    settings = Heads()
    inductive = [(1, head, "induction") for head in (0, 2, 3)]
    values, linear = gradient_changes(demo, texts, inductive, settings, ablation="zero")
    _, integrated = gradient_changes(demo, texts, inductive, settings, steps=4, ablation="zero")
    exact = _scores(_without(demo, 0, 2), texts, settings)
    for k, item in enumerate(inductive):
        change = exact[item] - values[k]
        assert change < -0.3  # the circuit, measured by removal
        assert integrated[k, 0, 2] < -0.3 and np.argmin(integrated[k, 0]) == 2
        assert abs(integrated[k, 0, 2] - change) < 0.25
        assert abs(linear[k, 0, 2]) < abs(change) / 4  # attribution patching's blind spot


def test_gradient_texts_may_be_a_stream(tiny):
    """Texts as any analysis takes them: a list of Text, or one Text alone in a list."""
    values, _ = gradient_changes(
        tiny, [Text("The cat sat on the mat.", "x")], [(1, 0, "self")], SETTINGS, ablation="zero"
    )
    assert 0 <= values[0] <= 1


def test_a_count_of_argmax_hits_is_refused_and_its_heads_left_out_with_a_note():
    """Retrieval is constant between its jumps: its gradient is 0 wherever it has one, so attribution patching would
    call every head irrelevant to it. Asked for by name, it is refused before any pass; as a head's deciding score
    (the demo's induction heads, retrieval heads once induction's threshold is out of reach), the head is left out
    and a note says so; every other head is explained."""
    from attnscope.analyses.circuit import Circuit

    with pytest.raises(AttnscopeError, match=r"^score retrieval: a count of argmax hits has no gradient"):  # canonical
        Circuit(method="gradient", score="retr")
    demo = load_model("demo", "cpu")
    with pytest.raises(AttnscopeError, match=r"^score retrieval: a count of argmax hits has no gradient"):
        gradient_changes(demo, TEXTS[:1], [(1, 0, "retrieval")], Heads(), ablation="zero")
    analysis = Circuit(method="gradient", weights=False, thresholds={"induction": 0.99}, head=("1.0", "1.1"))
    result = analysis.run(demo, TEXTS[:1])
    decided = {record["label"]: record["score"] for record in result.heads}
    assert decided["1.0"] == "retrieval" != decided["1.1"]  # 1.0: the demo's induction head (demo_model/scores.json)
    assert result.explained_labels == ["1.1"]
    note = next(note for note in result.notes if note.startswith("method gradient: 1 head not explained (1.0)"))
    assert "method removal measures them" in note
