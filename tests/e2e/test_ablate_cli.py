"""`ablate` end to end: the baseline loss against transformers' own loss, the ranking, pruning, --top, the files."""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pytest
import torch

from tests.support import CAT, png_size

TEXT = CAT


def _reference_loss(folder, text):
    """Next-token loss of `text` with BOS first, by transformers' own GPT2LMHeadModel and its `labels` loss."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor([[tokenizer.bos_token_id] + tokenizer(text)["input_ids"]])
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


def _ablate(cli, *args):
    code, out, err = cli("ablate", *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_cli(cli, tiny_model_dir):
    code, out, err = cli("ablate", TEXT, "-m", tiny_model_dir, "--json", "--prune", "2")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "ablate" and doc["settings"]["method"] == "loss"
    assert doc["baseline_loss"] == pytest.approx(_reference_loss(tiny_model_dir, TEXT), abs=1e-5)
    assert doc["input"]["predicted_tokens"] == 11  # every token after BOS
    heads = doc["heads"]
    assert sorted(record["rank"] for record in heads) == list(range(1, 9))
    for record in heads:  # importance: the loss without the head, less the loss with every head
        assert record["importance"] == pytest.approx(record["loss_without_head"] - doc["baseline_loss"], abs=2e-6)
    by_rank = sorted(heads, key=lambda record: record["rank"])
    assert [r["importance"] for r in by_rank] == sorted((r["importance"] for r in heads), reverse=True)
    # pruning removes the least important heads first, one more at each step
    assert [step["head"] for step in doc["prune"]] == [r["label"] for r in by_rank[::-1][:2]]
    assert [step["removed"] for step in doc["prune"]] == [1, 2]
    assert doc["prune"][0]["loss"] == pytest.approx(by_rank[-1]["loss_without_head"], abs=2e-6)
    assert cli("ablate", TEXT, "-m", tiny_model_dir, "--json", "--prune", "2")[1] == out  # deterministic
    code, out, _ = cli("ablate", TEXT, "-m", tiny_model_dir, "--csv", "--method", "gradient")
    assert code == 0 and out.splitlines()[0] == "layer,head,label,importance,rank"
    assert len(list(csv.DictReader(io.StringIO(out)))) == 8


@pytest.mark.slow
def test_out_writes_tables_and_pictures(cli, model_dir, tmp_path):
    code, out, err = cli("ablate", TEXT, "-m", model_dir, "--prune", "3", "--out", tmp_path / "abl")
    assert code == 0, err
    names = sorted(p.name for p in (tmp_path / "abl").iterdir())
    assert names == ["ablate.csv", "ablate.json", "importance.png", "prune.png"]
    png_size(tmp_path / "abl" / "importance.png")
    png_size(tmp_path / "abl" / "prune.png")
    assert "baseline loss" in out and "Most important heads" in out
    assert len(json.loads((tmp_path / "abl" / "ablate.json").read_text())["prune"]) == 3


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
def test_encoder_loss_and_gradient(cli, tiny_bert_dir):
    doc = _ablate(cli, TEXT, "-m", tiny_bert_dir)
    assert doc["baseline_loss"] > 0 and len(doc["heads"]) == 8
    assert any("masked-LM loss" in note for note in doc["notes"])
    assert doc["input"]["predicted_tokens"] == 2  # round(15 % of 11) masked positions
    doc = _ablate(cli, TEXT, "-m", tiny_bert_dir, "--method", "gradient", "--prune", "2")
    assert doc["settings"]["method"] == "gradient"
    assert all(h["importance"] >= 0 for h in doc["heads"]) and len(doc["prune"]) == 2
    assert all("loss_without_head" not in h for h in doc["heads"])  # only the loss method removes heads


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("top", [3])
def test_top_is_the_number_of_rows_shown(cli, model_dir, top):
    code, out, err = cli("ablate", TEXT, "-m", model_dir, "--method", "gradient", "--top", top)
    assert code == 0, err
    doc = _ablate(cli, TEXT, "-m", model_dir, "--method", "gradient", "--top", top)
    heads = doc["heads"]
    assert len(heads) == 8  # --top picks the ranked table's rows; the JSON has every head
    grid, table = out.split("Most important heads")
    assert len(re.findall(r"^\s*[01]\s+(?:-?\d+\s+){4}$", grid, re.MULTILINE)) == 2  # the grid: every head
    labels = re.findall(r"^\s*\d+\s+\d+\s+(\d+\.\d+)\s", table, re.MULTILINE)  # layer, head, label, ...
    by_rank = [h["label"] for h in sorted(heads, key=lambda h: h["rank"])]
    assert labels == by_rank[:top] == doc["most_important"]  # the table, and its ranked list in the JSON
    importance = np.array([h["importance"] for h in heads])
    assert len(set(importance.round(6))) == 8  # distinct, so the order is the measurement's, not a tie's


def test_ablation_and_removed_heads_are_recorded(cli, tmp_path):
    """--ablation and its seed in the settings, the note saying which ran; --remove (comma-separated or repeated)
    with the whole model's loss beside the baseline."""
    texts = tmp_path / "texts.txt"
    texts.write_text("The cat sat on the mat.\n\nThe doctor said that she would help.\n", encoding="utf-8")
    args = ("ablate", "--model", "demo", "--file", texts, "--method", "gradient", "--json")
    doc = _ablate(cli, *args[1:-1], "--ablation", "resample", "--resample-seed", "2")  # _ablate adds --json
    assert doc["settings"]["ablation"] == "resample" and doc["settings"]["resample_seed"] == 2
    assert any(note.startswith("resample ablation (seed 2): ") for note in doc["notes"])
    assert doc["intact_loss"] is None and doc["settings"]["remove"] == []
    doc = _ablate(cli, *args[1:-1], "--remove", "0.2,1.0", "--remove", "L1H3")
    assert doc["settings"]["ablation"] == "mean" and doc["settings"]["remove"] == ["0.2", "1.0", "1.3"]
    assert abs(doc["intact_loss"] - doc["baseline_loss"]) > 1e-3  # the whole model's loss, and the loss without them
    assert {h["label"]: h["importance"] for h in doc["heads"]}["1.3"] == 0
    code, out, err = cli(*args[:-1], "--ablation", "resample", "--remove", "0.2")
    assert code == 2 and "resample ablation has no fixed value" in err and "\n" not in err.strip()


@pytest.mark.slow
def test_save_then_compare_the_model_without_a_head(cli, tmp_path, monkeypatch, fresh_loads):
    """The README's offline compare: `ablate --remove 0.2 --save demo-no-0.2` as written (no head scored: the
    terminal shows the loss without 0.2, no table of heads), then `compare --model demo --model demo-no-0.2`; the
    folder holds a model and its tokenizer, labelled by its name (fresh loads: compare frees the models it loads,
    and the same name means another folder in another test)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("ablate", "--model", "demo", "--remove", "0.2", "--save", "demo-no-0.2")
    assert code == 0, err
    assert "is saved in demo-no-0.2" in err and "no head was scored" in err
    assert out.startswith("baseline loss ") and "Most important heads" not in out
    names = {path.name for path in (tmp_path / "demo-no-0.2").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    code, out, err = cli("compare", "--model", "demo", "--model", "demo-no-0.2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["models"] == ["demo", "demo-no-0.2"]
    moved = {head["label"]: head["divergence"] for head in doc["heads"]}
    assert all(moved[f"0.{h}"] == 0 for h in range(4)) and max(moved[f"1.{h}"] for h in range(4)) > 0.05
    code, out, err = cli("ablate", "--model", "demo", "--remove", "0.2", "--save", "demo-no-0.2")
    assert code == 2 and "the folder exists and is not empty" in err
