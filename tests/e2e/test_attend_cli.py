"""`attend` end to end: one token's attention row in every layer and head, against the from-scratch attention; what
--top (the strongest heads) and --tokens (each head's top tokens) mean."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from attnscope.pipeline.inputs import Text
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from tests.support import CAT, png_size, reference_maps

SENTENCE = "The doctor said that she would help the doctor."


def _reference_rows(model, text):
    """(L, H, n, n) attention of the one window of `text`, recomputed from each layer's own weights."""
    windows = tokenize(model, [Text(text, "t")]).windows
    maps = reference_maps(model, next(batches(windows, 1, model.device, pad_id(model.tokenizer))))
    return np.stack([maps[layer][0].double().numpy() for layer in range(model.n_layer)])


def _attend(cli, *args):
    code, out, err = cli("attend", *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
def test_cli_json_and_csv(cli, tiny, tiny_model_dir):
    args = ("attend", SENTENCE, "--from", "she", "--to", "doctor", "-m", tiny_model_dir, "--json", "--tokens", "2")
    code, out, err = cli(*args)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "attend" and doc["schema_version"] == 1
    assert doc["from"] == {"token": " she", "position": 5, "positions": [5], "word": "she"}
    # occurrences after " she" are out of its sight
    assert doc["to"] == {"token": "doctor", "positions": [2], "words": [[2]]}
    assert doc["view"] == "tokens" and "words" not in doc and "word_rows" not in doc
    expected = _reference_rows(tiny, SENTENCE)[:, :, 5]  # (L, H, n)
    np.testing.assert_allclose(np.array(doc["rows"]), expected, atol=1e-5)
    assert np.all(np.array(doc["rows"])[..., 6:] == 0)  # causal: nothing after the query
    records = {record["label"]: record for record in doc["heads"]}
    assert len(records) == 2 * 4
    for layer in range(2):
        for head in range(4):
            record = records[f"{layer}.{head}"]
            assert record["to_weight"] == pytest.approx(expected[layer, head, 2], abs=1e-5)
            top = np.argsort(-expected[layer, head], kind="stable")[:2]
            assert record["top1_position"] == top[0] and record["top2_position"] == top[1]
            assert record["top1_weight"] == pytest.approx(expected[layer, head, top[0]], abs=1e-5)
            assert record["top1_token"] == doc["input"]["tokens"][top[0]]
    assert doc["strongest"][0] == max(records, key=lambda label: records[label]["to_weight"])
    assert cli(*args)[1] == out  # deterministic

    code, out, err = cli("attend", SENTENCE, "--from", "she", "-m", tiny_model_dir, "--csv")
    assert code == 0, err
    header = out.splitlines()[0].split(",")
    assert header[:3] == ["layer", "head", "label"] and "to_weight" not in header and "top3_weight" in header
    assert "top4_weight" not in header  # --tokens: 3 by default
    assert len(out.splitlines()) == 1 + 8


@pytest.mark.slow
def test_out_writes_the_table_and_the_picture(cli, model_dir, tmp_path):
    code, out, err = cli("attend", CAT, "--from", "sat", "-m", model_dir, "--out", tmp_path / "att")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "att").iterdir()) == ["attend.csv", "attend.json", "attend.png"]
    png_size(tmp_path / "att" / "attend.png")
    assert "sat" in out and "Strongest heads" in out
    code, printed, _ = cli("attend", CAT, "--from", "sat", "-m", model_dir, "--json")
    assert json.loads((tmp_path / "att" / "attend.json").read_text()) == json.loads(printed)


def test_the_last_word_looks_at_every_occurrence_unless_one_is_picked(cli, tiny, tiny_model_dir):
    expected = _reference_rows(tiny, SENTENCE)
    both = _attend(cli, SENTENCE, "--from", "doctor", "--from-index", "1", "--to", "doctor", "-m", tiny_model_dir)
    query = both["from"]["position"]
    assert both["to"]["positions"] == [2, query]
    weights = {r["label"]: r["to_weight"] for r in both["heads"]}
    for layer in range(2):
        for head in range(4):
            summed = expected[layer, head, query, 2] + expected[layer, head, query, query]
            assert weights[f"{layer}.{head}"] == pytest.approx(summed, abs=1e-5)
    picked = ("--from", "doctor", "--from-index", "1", "--to", "doctor", "--to-index", "0")
    first = _attend(cli, SENTENCE, *picked, "-m", tiny_model_dir)
    assert first["to"]["positions"] == [2]
    assert first["heads"][0]["to_weight"] == pytest.approx(expected[0, 0, query, 2], abs=1e-5)


def test_an_encoder_token_attends_to_a_later_token(cli, tiny_bert, tiny_bert_dir):
    doc = _attend(cli, CAT, "--from", "cat", "--to", "mat", "-m", tiny_bert_dir)
    tokens = doc["input"]["tokens"]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    source, target = doc["from"]["position"], doc["to"]["positions"]
    assert tokens[source] == "cat" and target == [tokens.index("mat")] and target[0] > source
    reference = _reference_rows(tiny_bert, CAT)
    rows = np.array(doc["rows"])  # (L, H, n)
    for layer in range(2):
        np.testing.assert_allclose(rows[layer], reference[layer, :, source], atol=1e-5)
        assert rows[layer][:, source + 1 :].max() > 0.01  # later tokens are seen
    weights = {h["label"]: h["to_weight"] for h in doc["heads"]}
    assert weights["1.2"] == pytest.approx(reference[1, 2, source, target[0]], abs=1e-5)


@pytest.mark.parametrize("top, tokens", [(1, 5), (6, 1)])
def test_top_counts_heads_and_tokens_counts_keys(cli, model, model_dir, top, tokens):
    """--top K: the K strongest heads (the table, `strongest`); --tokens K: each head's K top keys."""
    doc = _attend(cli, CAT, "--from", "sat", "-m", model_dir, "--top", top, "--tokens", tokens)
    assert (doc["settings"]["top"], doc["settings"]["tokens"]) == (top, tokens)
    rows = np.array(doc["rows"])  # (L, H, n)
    # without a target, a head's strength is its largest weight; ties in layer.head order
    strength = {f"{layer}.{head}": rows[layer, head].max() for layer in range(2) for head in range(4)}
    assert doc["strongest"] == sorted(strength, key=lambda label: -strength[label])[:top]
    assert len(doc["heads"]) == 8  # every head is still reported
    for record in doc["heads"]:
        ranked = [key for key in record if key.startswith("top") and key.endswith("_position")]
        assert ranked == [f"top{k}_position" for k in range(1, tokens + 1)]
        row = rows[record["layer"], record["head"]]
        best = sorted(range(len(row)), key=lambda j: (-row[j], j))[:tokens]
        assert [record[f"top{k}_position"] for k in range(1, tokens + 1)] == best
    code, table, _ = cli("attend", CAT, "--from", "sat", "-m", model_dir, "--top", top, "--tokens", tokens)
    assert code == 0
    # a row: the head's label, then its first top token as `label@position` (a long row wraps onto lines of its own)
    listed = re.findall(r"^\s*(\d+\.\d+)\s+\S+@\d+:", table.split("Strongest heads")[1], re.MULTILINE)
    assert listed == doc["strongest"]
