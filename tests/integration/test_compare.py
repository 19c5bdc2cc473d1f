"""compare on tiny models: the change is exactly 0 where no weight below a head changed and equals scipy's JSD on
from-scratch maps elsewhere (whatever the blocks of each run); each model's scores are those of its own `heads` run;
roles form where separate runs say; models that cannot be compared are refused; revisions of one Hub repository."""

from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest
import torch

from attnscope import api
from attnscope.analyses.compare import Compare
from attnscope.errors import AttnscopeError
from attnscope.models.sources import ModelSource
from attnscope.pipeline import block_path
from tests.support import TEXTS, build_tiny_gpt2, given_models, slow_divergence, without_head


def _divergence(result) -> np.ndarray:
    matrix = np.zeros((result.model["n_layer"], result.model["n_head"]))
    for head in result.heads:
        matrix[head.layer, head.head] = head.divergence
    return matrix


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_identical_models_diverge_exactly_0_everywhere(model):
    result = api.compare([model, copy.deepcopy(model)], TEXTS, batch_size=2)
    assert result.labels[1] == f"{result.labels[0]}#2" and "labelled apart" in result.notes[0]
    assert result.has_divergence and all(head.divergence == 0.0 for head in result.heads)


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_a_removed_head_changes_only_the_heads_above_it_as_scipy_says(tiny, monkeypatch):
    """Head 0.1 writes nothing in the copy: layer 0's attention is the same (exactly 0), layer 1's differs, by the
    JSD of the from-scratch maps. The first run is set to one query row per block and the second to whole layers:
    the second takes the first's blocks (other blocks could round otherwise)."""
    copy = without_head(tiny, 0, 1)
    sizes = iter([1, None])

    def loading(loaded):
        def load(lm_head):
            block_path.BLOCK_BYTES = next(sizes) or original
            return loaded

        return load

    original = block_path.BLOCK_BYTES
    monkeypatch.setattr(block_path, "BLOCK_BYTES", original)
    monkeypatch.setattr(block_path, "MIN_BLOCK_ROWS", 0)  # the budget alone sizes the blocks: one row at 1 byte
    sources = [
        ModelSource("a", tiny.name, None, loading(tiny), owned=False),
        ModelSource("b", copy.name, None, loading(copy), owned=False),
    ]
    result = Compare(batch_size=3).run_models(sources, TEXTS)
    divergence = _divergence(result)
    assert (divergence[0] == 0.0).all()
    assert (divergence[1] > 1e-4).any()
    np.testing.assert_allclose(divergence, slow_divergence(tiny, copy, TEXTS), atol=2e-5)


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_each_models_scores_are_those_of_its_own_heads_run(tiny):
    copy = without_head(tiny, 0, 2)
    result = api.compare([tiny, copy], TEXTS, probe_len=5)
    for index, model in enumerate((tiny, copy)):
        alone = api.heads(model, TEXTS, probe_len=5)
        for head, record in zip(result.heads, alone.heads, strict=True):
            assert {name: values[index] for name, values in head.scores.items()} == {
                name: value for name, value in record.scores.items() if value is not None
            }
            assert head.roles[index] == record.role.role


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_roles_form_where_separate_runs_say(monkeypatch):
    """The demo model has induction heads in layer 1 that need the previous-token head 0.2: without it they are
    gone. Models [without 0.2, with, with]: a head formed induction at the second model exactly where separate heads
    runs give it induction in the full model and not without 0.2; [with, with, without]: no head holds it to the end."""
    demo = api.load("demo", "cpu")
    broken = without_head(demo, 0, 2, name="broken")
    roles = {label: api.heads(model, TEXTS) for label, model in (("demo", demo), ("broken", broken))}
    expected = {
        record.label: record.role.role == "induction" and other.role.role != "induction"
        for record, other in zip(roles["demo"].heads, roles["broken"].heads, strict=True)
    }
    assert any(expected.values())  # planted: removing 0.2 breaks some induction head
    result = api.compare([broken, demo, copy.deepcopy(demo)], TEXTS)  # the same model twice: two objects
    assert result.labels == ["broken", "demo", "demo#2"] and not result.has_divergence
    for head in result.heads:
        assert (head.formed["induction"] == "demo") == expected[head.label], head.label
    later = api.compare([demo, copy.deepcopy(demo), broken], TEXTS)
    assert all(head.formed["induction"] is None for head in later.heads if expected[head.label])


def test_models_of_another_kind_are_refused_in_one_line(tiny, tiny_bert):
    with pytest.raises(AttnscopeError, match="differ in kind: decoder against encoder"):
        api.compare([tiny, tiny_bert], TEXTS)


@pytest.mark.slow
def test_the_cli_refuses_another_shape_before_loading_and_another_tokenizer_after(cli, tiny_model_dir, tmp_path):
    deeper = build_tiny_gpt2(tmp_path / "deeper", n_layer=3)
    code, out, err = cli("compare", "x", "--model", tiny_model_dir, "--model", deeper, "--device", "cpu")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "differ in shape: 2 layers × 4 heads against 3 × 4" in err
    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_model_dir, other)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json"):
        (other / name).unlink(missing_ok=True)
    from attnscope.models.loading import demo_model_dir

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model_dir() / name, other / name)
    code, out, err = cli("compare", "x y", "--model", tiny_model_dir, "--model", other, "--device", "cpu")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "have different tokenizers:" in err and "tokens" in err, err


@pytest.mark.slow
def test_revisions_of_one_hub_repository_are_compared_offline(monkeypatch, tmp_path, tmp_path_factory):
    """A fake Hugging Face cache holding three revisions of one repository (different weights): `--revisions`
    labels each model by its revision and runs each revision's own weights; a local folder has no revisions."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo, revisions = "EleutherAI/pythia-tiny", ["step0", "step512", "step1000"]
    folder = tmp_path / "hub" / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    sources = {}
    for seed, revision in enumerate(revisions):
        source = build_tiny_gpt2(tmp_path_factory.mktemp(revision), seed=seed)
        commit = f"{seed + 1}" * 40
        shutil.copytree(source, folder / "snapshots" / commit)
        (folder / "refs" / revision).write_text(commit)
        sources[revision] = source
    result = api.compare(repo, TEXTS[:2], revisions=",".join(revisions), device="cpu", probe=False)
    assert result.labels == revisions and [m["revision"] for m in result.model["compared"]] == revisions
    for index, revision in enumerate(revisions):
        alone = api.heads(str(sources[revision]), TEXTS[:2], device="cpu", probe=False)
        got = [head.scores["previous_token"][index] for head in result.heads]
        assert got == [record.scores["previous_token"] for record in alone.heads], revision
    with pytest.raises(AttnscopeError, match="a folder on this machine, which has no revisions"):
        api.compare(str(sources["step0"]), revisions=revisions, device="cpu")


@pytest.mark.slow
def test_the_cli_gives_byte_identical_json_and_a_long_csv(cli, tiny_model_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    args = (
        "compare",
        "The cat sat on the mat.",
        "-m",
        tiny_model_dir,
        "-m",
        copy,
        "--device",
        "cpu",
        "--probe-len",
        "5",
    )
    first, second = cli(*args, "--json"), cli(*args, "--json")
    assert first[0] == 0 and first[1] == second[1]
    code, out, err = cli(*args, "--csv")
    rows = out.strip().splitlines()
    assert code == 0 and len(rows) == 1 + 8 * 2
    assert rows[0].startswith("layer,head,label,model,model_index,role,")
    code, out, err = cli(*args, "--out", tmp_path / "out")
    assert code == 0, err
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [
        "compare.csv", "compare.json", "divergence.png", "score_induction.png", "trajectories.png",
    ]  # fmt: skip
    assert "Heads ranked by divergence" in out


@pytest.mark.parametrize("stop", [AttnscopeError("the second model cannot be loaded"), KeyboardInterrupt()])
def test_the_spool_is_removed_after_an_error_or_ctrl_c(tiny, monkeypatch, tmp_path, stop):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def fail(lm_head):
        assert list(tmp_path.iterdir()), "the first model's rows were spooled"
        raise stop

    sources = [*given_models(("a", tiny)), ModelSource("b", "b", None, fail, owned=False)]
    with pytest.raises(type(stop)):
        Compare().run_models(sources, TEXTS[:1])
    assert list(tmp_path.iterdir()) == []


def _loss_here(folder, texts) -> float:
    """The mean next-token cross-entropy (nats) over every predicted token of `texts`, computed here with the
    model's own language-model head (transformers' GPT2LMHeadModel), each text alone with BOS before it."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    total, count = 0.0, 0
    for text in texts:
        ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(text.text)["input_ids"]]])  # (1, n)
        with torch.no_grad():
            logits = model(ids).logits  # (1, n, V)
        total += float(torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum"))
        count += ids.shape[1] - 1
    return total / count


@pytest.mark.slow
def test_each_models_loss_is_its_next_token_loss_computed_here(tiny_model_dir, tmp_path):
    """`loss`, one per model at the top of the JSON: each model's mean next-token loss of the texts, as computed
    here with its own language-model head (the tiny GPT-2, and a copy of it with head 0.1 removed by hand)."""
    import json

    from tests.support import save_without_head

    folders = [tiny_model_dir, save_without_head(tiny_model_dir, tmp_path / "without-0.1", 0, 1)]
    result = api.compare([str(folder) for folder in folders], TEXTS, device="cpu", divergence=False, probe=False)
    expected = [_loss_here(folder, TEXTS) for folder in folders]
    assert expected[0] != pytest.approx(expected[1], rel=1e-3)  # two different models
    np.testing.assert_allclose(result.losses, expected, rtol=1e-5)
    assert json.loads(result.to_json())["loss"] == pytest.approx(expected, rel=1e-5)
    assert result.settings["loss"] is True


def test_a_model_without_its_head_has_no_loss_and_a_note(tiny):
    """Models given loaded without their language-model head: compared as before, their loss None, one note each;
    loss=False (--no-loss): no loss asked, none noted, `loss` null in the JSON."""
    import json

    copy = without_head(tiny, 0, 2, name="copy")
    result = api.compare([tiny, copy], TEXTS, probe=False, divergence=False)
    assert result.losses == [None, None] and not result.has_loss
    assert [note.split(": ")[0] for note in result.notes if "no loss" in note] == [result.labels[0], "copy"]
    assert all("language-model head" in note for note in result.notes if "no loss" in note)
    off = api.compare([tiny, copy], TEXTS, probe=False, divergence=False, loss=False)
    assert off.losses == [] and json.loads(off.to_json())["loss"] is None and off.settings["loss"] is False
    assert not any("no loss" in note for note in off.notes)


DAMAGED_MLP = (
    "model 'damaged': the model's weights hold NaN or infinite values (first in h.1.mlp.c_fc.weight): the checkpoint "
    "is damaged"
)


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("damaged_first", [True, False], ids=["damaged first", "damaged second"])
def test_a_model_whose_mlp_holds_nan_is_refused_first_or_second(tiny, mlp_nan_model, damaged_first):
    """Its attention is finite and its loss is not: it was compared, its loss null without a word. Each model's
    weights are checked as it opens, the tensor named."""
    models = [("tiny", tiny), ("damaged", mlp_nan_model)][:: -1 if damaged_first else 1]
    with pytest.raises(AttnscopeError) as refused:
        Compare(probe=False, divergence=False).run_models(given_models(*models), TEXTS)
    assert str(refused.value) == DAMAGED_MLP


def test_a_loss_that_is_not_finite_is_null_with_a_note(tiny, monkeypatch):
    """With the weights checked as each model opens, a loss that still comes out NaN overflowed (a half precision):
    null, and a note says why (it was null without a word)."""
    import json
    from dataclasses import replace

    from attnscope.analyses import ablate

    monkeypatch.setattr(ablate, "losses_under", lambda *args, **kwargs: np.array([np.nan]))  # (K,) = (1,)
    with_head = replace(tiny, lm_model=tiny.model)  # never run: the losses are the stand-in's
    models = given_models(("a", with_head), ("b", with_head))
    result = Compare(probe=False, divergence=False).run_models(models, TEXTS)
    assert result.losses == [None, None] and json.loads(result.to_json())["loss"] == [None, None]
    assert [note for note in result.notes if "no loss" in note] == [
        f"{label}: no loss (the loss is not finite (NaN or infinity); nothing is reported: the model's activations "
        "overflowed)"
        for label in "ab"
    ]


@pytest.mark.slow
def test_an_encoders_loss_is_the_masked_lm_loss_ablate_measures(tiny_bert_dir, tmp_path):
    """An encoder's loss is `ablate`'s masked-LM baseline (the same deterministic masks) of each model."""
    from tests.support import build_tiny_bert

    other = build_tiny_bert(tmp_path / "bert-1", seed=1)
    result = api.compare([str(tiny_bert_dir), str(other)], TEXTS)
    for loss, folder in zip(result.losses, (tiny_bert_dir, other), strict=True):
        assert loss == pytest.approx(api.ablate(str(folder), TEXTS).baseline_loss, rel=1e-6)
    assert any(note.startswith("masked-LM loss") for note in result.notes)
