"""The draw of resample ablation's donors, and the saved model without heads (`ablate --remove --save`) against the
removal the analyses make in memory, the weights zeroed by hand (tests.support) and transformers reading the folder
back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnscope.analyses.ablate import Ablate
from attnscope.analyses.circuit_replay import removal_changes
from attnscope.analyses.heads import Heads
from attnscope.errors import AttnscopeError
from attnscope.models import removal
from attnscope.models.loading import load_model
from attnscope.pipeline.ablation import donors
from tests.support import FAMILY_TEXTS, without_head
from tests.support import TEXTS as DEMO_TEXTS


def test_donors_are_other_windows_at_least_as_long():
    lengths = [5, 9, 3, 9, 7, 12, 3]
    drawn = donors(lengths, seed=0)
    for window, donor in enumerate(drawn):
        assert donor != window
        if lengths[window] < max(lengths):
            assert lengths[donor] >= lengths[window], (window, donor)
        else:  # the longest, alone: a donor among the longest others
            assert lengths[donor] == 9
    assert donors(lengths, seed=0) == drawn and donors(lengths, seed=1) != drawn
    # uniform among the candidates: window 2 (length 3) may take any of the other six
    taken = {donors(lengths, seed)[2] for seed in range(200)}
    assert taken == {0, 1, 3, 4, 5, 6}
    with pytest.raises(AttnscopeError, match="there is one window: give more text, or use ablation mean"):
        donors([8], seed=0)


# ------------------------------------------------------------------------------------------- the saved model


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", "cpu", lm_head=True)


def _weights(model):
    return {name: value.clone() for name, value in model.state_dict().items()}


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_the_saved_model_is_the_removal_the_analyses_make(demo, tmp_path, mode):
    """ablate on the saved model gives what ablate gave without the head (its baseline is ablate's loss without
    0.2 on the whole model, each head's loss the same); its heads score as the replay's removal of 0.2; transformers
    reads c_proj with head 2's rows zero (and, for the mean, the bias moved by them); the model in memory is left as
    it was."""
    before = _weights(demo.lm_model)
    whole = Ablate(ablation=mode).run(demo, DEMO_TEXTS)
    folder = tmp_path / "demo-no-0.2"
    removed = Ablate(ablation=mode, remove=["0.2"], save=folder, score=True).run(demo, DEMO_TEXTS)
    assert all(torch.equal(value, demo.lm_model.state_dict()[name]) for name, value in before.items())
    saved = load_model(str(folder), "cpu", lm_head=True)
    again = Ablate(ablation=mode).run(saved, DEMO_TEXTS)
    assert again.baseline_loss == pytest.approx(whole.ablated_loss[0, 2], abs=1e-5)
    assert removed.baseline_loss == pytest.approx(again.baseline_loss, abs=1e-5)
    assert removed.intact_loss == pytest.approx(whole.baseline_loss, abs=1e-9)
    np.testing.assert_allclose(removed.ablated_loss, again.ablated_loss, atol=1e-5)
    assert removed.importance[0, 2] == 0 and removed.settings["remove"] == ["0.2"]
    assert removed.settings["save"] == str(folder) and any(str(folder) in note for note in removed.notes)

    heads = Heads(probe=False)
    scores = {(r.layer, r.head): r.scores for r in heads.run(saved, DEMO_TEXTS).heads}
    if mode == "zero":  # the weights zeroed by hand (tests.support)
        expected = {(r.layer, r.head): r.scores for r in heads.run(without_head(demo, 0, 2), DEMO_TEXTS).heads}
        for key in scores:
            assert scores[key]["previous_token"] == pytest.approx(expected[key]["previous_token"], abs=1e-6)
    explained = [(1, head, name) for head in range(4) for name in ("previous_token", "first_token", "self")]
    with_values, changes = removal_changes(demo, DEMO_TEXTS, explained, heads, ablation=mode)
    for i, (layer, head, name) in enumerate(explained):  # the replay's removal of 0.2, hooked in memory
        assert scores[(layer, head)][name] == pytest.approx(with_values[i] + changes[i, 0, 2], abs=2e-6)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    theirs = AutoModelForCausalLM.from_pretrained(folder)
    assert AutoTokenizer.from_pretrained(folder)("The cat")["input_ids"] == demo.tokenizer("The cat")["input_ids"]
    c_proj, original = theirs.transformer.h[0].attn.c_proj, demo.lm_model.transformer.h[0].attn.c_proj
    d_head = demo.d_head
    assert not c_proj.weight[2 * d_head : 3 * d_head].any()
    torch.testing.assert_close(c_proj.weight[: 2 * d_head], original.weight[: 2 * d_head], rtol=0, atol=0)
    assert torch.equal(c_proj.bias, original.bias) == (mode == "zero")


@pytest.mark.slow
def test_save_alone_scores_no_head_and_saves_the_same_model(demo, tmp_path, monkeypatch):
    """`ablate --remove 0.2 --save DIR` once scored every head first (270 ablations on a 30-layer model) to save one
    model: saving alone runs two configurations (every head, and without 0.2), never more at once, and reports the
    loss without the head; the folder holds the bytes that saving with scoring writes."""
    from attnscope.analyses import ablate

    asked = []
    run_losses = ablate.losses_under

    def counted(loaded, windows, configurations, *args, **kwargs):
        asked.append(len(configurations))
        return run_losses(loaded, windows, configurations, *args, **kwargs)

    monkeypatch.setattr(ablate, "losses_under", counted)
    alone = Ablate(remove=["0.2"], save=tmp_path / "alone").run(demo, DEMO_TEXTS)
    assert asked == [1, 1]  # the whole model's loss, and the loss without 0.2
    scored = Ablate(remove=["0.2"], save=tmp_path / "scored", score=True).run(demo, DEMO_TEXTS)
    assert asked[2:] == [1, 8]  # the whole model's, and the baseline with each of the 7 other heads removed too
    assert alone.importance is None and alone.ablated_loss is None and alone.ranked() == []
    assert alone.settings["score"] is False and scored.settings["score"] is True
    assert alone.baseline_loss == pytest.approx(scored.baseline_loss, abs=1e-6)
    assert alone.intact_loss == scored.intact_loss
    assert any(note.startswith("no head was scored: --save writes the model") for note in alone.notes)
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "alone" / name).read_bytes() == (tmp_path / "scored" / name).read_bytes()
    assert alone.to_records() == [] and alone.to_document()["heads"] == [] and alone.plot() == {}
    assert "no head scored" in repr(alone) and "baseline loss" in alone._repr_html_()
    files = alone.save(tmp_path / "out")
    assert sorted(path.name for path in files) == ["ablate.csv", "ablate.json"]
    assert (tmp_path / "out" / "ablate.csv").read_text().strip() == "layer,head,label,importance,rank"


@pytest.mark.slow
def test_mean_ablation_saves_a_grouped_query_llama_in_the_bias_its_config_adds(family_dir, tmp_path):
    """Llama's o_proj has no bias, and mean ablation, the default, once refused to save ("save with ablation
    zero"): its config's attention_bias gives q, k, v and o_proj biases, and the saved model (o_proj's bias holding
    the means, the others 0) gives the loss the removal gives in memory (a grouped-query Llama: 4 heads, 2 KV
    heads); the model in memory is left as it was, its config too."""
    llama = load_model(str(family_dir("llama")), "cpu", lm_head=True)
    before = _weights(llama.lm_model)
    removed = Ablate(remove=["0.1", "1.3"], save=tmp_path / "saved").run(llama, FAMILY_TEXTS)
    assert _weights(llama.lm_model).keys() == before.keys() and llama.config.attention_bias is False
    assert all(torch.equal(value, llama.lm_model.state_dict()[name]) for name, value in before.items())
    assert any("the saved config sets attention_bias" in note for note in removed.notes)
    saved = load_model(str(tmp_path / "saved"), "cpu", lm_head=True)
    again = Ablate(score=False).run(saved, FAMILY_TEXTS)
    assert again.baseline_loss == pytest.approx(removed.baseline_loss, abs=1e-5)
    assert abs(removed.baseline_loss - removed.intact_loss) > 1e-3  # the removal changed the loss

    from transformers import AutoModelForCausalLM

    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert theirs.config.attention_bias is True and theirs.config.num_key_value_heads == 2
    attention, d_head = theirs.model.layers[0].self_attn, llama.d_head
    assert not any(getattr(attention, name).bias.any() for name in ("q_proj", "k_proj", "v_proj"))
    assert attention.o_proj.bias.abs().max() > 0 and not attention.o_proj.weight[:, d_head : 2 * d_head].any()


def test_save_refuses_what_weights_cannot_hold_and_writes_nothing_on_error(demo, family_dir, tmp_path, monkeypatch):
    with pytest.raises(AttnscopeError, match="no weight can hold: save with ablation mean or zero"):
        removal.check_removable(demo, "resample")
    mistral = load_model(str(family_dir("mistral")), "cpu")  # no setting of its config gives o_proj a bias
    with pytest.raises(
        AttnscopeError,
        match=r"this Mistral model's \(self_attn.o_proj\) has none, nor a setting of its config that adds one: save "
        r"with ablation zero \(--ablation zero\), which every family can hold$",
    ):
        removal.check_removable(mistral, "mean")
    removal.check_removable(mistral, "zero")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(AttnscopeError, match="the folder exists and is not empty"):
        Ablate(remove=["0.2"], save=tmp_path / "full")
    with pytest.raises(AttnscopeError, match="give remove too"):
        Ablate(save=tmp_path / "new")
    with pytest.raises(AttnscopeError, match="resample ablation has no fixed value"):
        Ablate(remove="0.2", ablation="resample")

    before = _weights(demo.lm_model)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(type(demo.tokenizer), "save_pretrained", full_disk)  # once the weights are written
    target = tmp_path / "deep" / "new"
    with pytest.raises(
        AttnscopeError, match=r"^save \(--save\) .*: cannot write: .*No space left on device; nothing was written$"
    ):
        Ablate(remove="0.2,1.1", save=target, method="gradient").run(demo, DEMO_TEXTS[:2])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["full"]  # no folder, no hidden stage
    assert all(torch.equal(value, demo.lm_model.state_dict()[name]) for name, value in before.items())


def test_the_weights_hold_the_removal_of_both_kinds(loaded_models, kind):
    """Every family's output projection is an nn.Linear (weight (out, in): a head owns columns) or GPT-2's Conv1D
    (rows): the weights edited by `removed` give the model's output with the heads' slices replaced by hand (0, or
    the given means), and are put back exactly after."""
    loaded = loaded_models[kind]
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 2]])
    removed_heads = [(0, 1), (1, 2), (1, 3)]
    d_head = loaded.d_head
    generator = torch.Generator().manual_seed(0)
    means = {layer: torch.randn(loaded.n_head, d_head, generator=generator) for layer in range(loaded.n_layer)}
    before = _weights(loaded.model)

    def by_hand(mean: bool) -> torch.Tensor:
        handles = []
        for layer, module in enumerate(loaded.family.output_projections(loaded.model)):

            def replace(module, args, layer=layer):
                x = args[0].clone()
                for at, head in removed_heads:
                    if at == layer:
                        x[..., head * d_head : (head + 1) * d_head] = means[layer][head] if mean else 0.0
                return (x,)

            handles.append(module.register_forward_pre_hook(replace))
        try:
            with torch.no_grad():
                return loaded.model(input_ids=ids).last_hidden_state
        finally:
            for handle in handles:
                handle.remove()

    for mean in (False, True):
        with removal.removed(loaded, removed_heads, means if mean else None), torch.no_grad():
            edited = loaded.model(input_ids=ids).last_hidden_state
        torch.testing.assert_close(edited, by_hand(mean), atol=1e-5, rtol=1e-5)
        assert all(torch.equal(value, loaded.model.state_dict()[name]) for name, value in before.items())
    with torch.no_grad():
        assert not torch.allclose(by_hand(True), loaded.model(input_ids=ids).last_hidden_state, atol=1e-3)
