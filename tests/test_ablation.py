"""`ablate`: head importance against an independent removal (zeroed c_proj weights) and transformers' own loss."""

import json

import numpy as np
import pytest
import torch

from attnscope.ablation import ablate
from attnscope.errors import AttnscopeError
from attnscope.inputs import Text
from attnscope.model import load_model

TEXTS = [
    Text("The cat sat on the mat because it was tired.", "a"),
    Text("Hello world, again and again and again.", "b"),
    Text("Short one", "c"),
]


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    return load_model(str(tiny_model_dir), "cpu", lm_head=True)


def reference_loss(folder, texts, removed=(), scale=None):
    """Token-weighted mean next-token loss of `texts` (BOS first), one text at a time with transformers' own loss,
    on a fresh GPT2LMHeadModel whose c_proj input rows of the `removed` heads are zeroed (or of head `scale[0]`
    multiplied by scale[1]). Returns (mean loss, per-text losses)."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    d_head = model.config.n_embd // model.config.n_head
    with torch.no_grad():
        for layer, head in removed:
            model.transformer.h[layer].attn.c_proj.weight[head * d_head : (head + 1) * d_head] = 0  # Conv1D: (in, out)
        if scale is not None:
            (layer, head), factor = scale
            model.transformer.h[layer].attn.c_proj.weight[head * d_head : (head + 1) * d_head] *= factor
        per_text, weights = [], []
        for item in texts:
            ids = torch.tensor([[tokenizer.bos_token_id] + tokenizer(item.text)["input_ids"]])
            per_text.append(float(model(input_ids=ids, labels=ids).loss))
            weights.append(ids.shape[1] - 1)
    return float(np.average(per_text, weights=weights)), per_text


def test_loss_method_equals_zeroed_weights(tiny_lm, tiny_model_dir):
    result = ablate(tiny_lm, TEXTS, "loss", batch_size=2)  # padded batches of texts of different lengths
    baseline, _ = reference_loss(tiny_model_dir, TEXTS)
    assert result.baseline_loss == pytest.approx(baseline, abs=1e-5)
    for layer in range(2):
        for head in range(4):
            without, _ = reference_loss(tiny_model_dir, TEXTS, removed=[(layer, head)])
            assert result.ablated_loss[layer, head] == pytest.approx(without, abs=1e-5)
            assert result.importance[layer, head] == pytest.approx(without - baseline, abs=1e-5)
    assert np.ptp(result.importance) > 0.01  # the heads really differ, so a swapped head would fail


def test_gradient_method_equals_finite_differences(tiny_lm, tiny_model_dir):
    result = ablate(tiny_lm, TEXTS, "gradient", batch_size=3)
    eps = 1e-2
    for layer, head in [(0, 0), (0, 3), (1, 1), (1, 2)]:
        _, up = reference_loss(tiny_model_dir, TEXTS, scale=((layer, head), 1 + eps))
        _, down = reference_loss(tiny_model_dir, TEXTS, scale=((layer, head), 1 - eps))
        expected = np.mean(np.abs((np.array(up) - np.array(down)) / (2 * eps)))  # mean over texts of |dL_t/d gate|
        assert result.importance[layer, head] == pytest.approx(expected, rel=2e-2, abs=1e-4)
    assert result.ablated_loss is None


def test_prune_removes_the_least_important_heads_cumulatively(tiny_lm, tiny_model_dir):
    result = ablate(tiny_lm, TEXTS[:2], "loss", prune=3)
    least = result.ranked()[::-1][:3]
    assert [step["head"] for step in result.prune] == [f"{layer}.{head}" for layer, head in least]
    for k, step in enumerate(result.prune):
        expected, _ = reference_loss(tiny_model_dir, TEXTS[:2], removed=least[: k + 1])
        assert step["removed"] == k + 1 and step["loss"] == pytest.approx(expected, abs=1e-5)


def test_model_without_its_head_and_bad_prune_are_refused(tiny, tiny_lm):
    with pytest.raises(AttnscopeError, match="language-model head"):
        ablate(tiny, TEXTS)
    with pytest.raises(AttnscopeError, match="--prune 9: this model has 8 heads"):
        ablate(tiny_lm, TEXTS, prune=9)


def test_cli(cli, tiny_model_dir, tmp_path):
    code, out, err = cli("ablate", TEXTS[0].text, "-m", tiny_model_dir, "--json", "--prune", "2")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "ablate" and doc["settings"]["method"] == "loss"
    assert doc["baseline_loss"] == pytest.approx(reference_loss(tiny_model_dir, TEXTS[:1])[0], abs=1e-5)
    assert sorted(record["rank"] for record in doc["heads"]) == list(range(1, 9))
    assert len(doc["prune"]) == 2
    assert cli("ablate", TEXTS[0].text, "-m", tiny_model_dir, "--json", "--prune", "2")[1] == out  # deterministic
    code, out, err = cli("ablate", TEXTS[0].text, "-m", tiny_model_dir, "--csv", "--method", "gradient")
    assert code == 0 and out.splitlines()[0] == "layer,head,label,importance,rank"
    code, out, err = cli("ablate", TEXTS[0].text, "-m", tiny_model_dir, "--prune", "3", "--out", tmp_path / "abl")
    assert code == 0, err
    names = sorted(p.name for p in (tmp_path / "abl").iterdir())
    assert names == ["ablate.csv", "ablate.json", "importance.png", "prune.png"]
    assert "baseline loss" in out and "Most important heads" in out
    for args, message in [
        (["--method", "magic"], "--method 'magic': use one of loss, gradient"),
        (["--prune", "100"], "--prune 100: this model has 8 heads"),
        (["--json", "--csv"], "give --json or --csv, not both"),
    ]:
        code, out, err = cli("ablate", TEXTS[0].text, "-m", tiny_model_dir, *args)
        assert code == 2 and err.count("\n") == 1 and message in err, err
