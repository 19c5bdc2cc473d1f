"""Every command end to end through the real CLI on a tiny random-weight BERT loaded by path (bidirectional
attention), checked against the from-scratch attention where there are numbers to check."""

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnscope import metrics, roles
from attnscope.inputs import Text
from attnscope.tokens import batches, tokenize
from tests.test_capture_encoder import reference_maps
from tests.test_cli import png_size

CAT = "The cat sat on the mat because it was tired."
PROBE_NOTE = "the repeated-token probe measures left-to-right copying; skipped for encoder models"


def reference_batch(loaded, texts):
    windows = tokenize(loaded.tokenizer, [Text(text, "t") for text in texts], loaded.n_ctx).windows
    return next(batches(windows, len(windows), loaded.device, loaded.tokenizer.pad_token_id))


def test_heads_json_scores_equal_the_from_scratch_attention(cli, tiny_bert, tiny_bert_dir):
    code, out, err = cli("heads", CAT, "--model", tiny_bert_dir, "--device", "cpu", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["model_type"] == "bert" and doc["model"]["attention_params"] == 4 * 32 * 32 + 4 * 32
    # [CLS] + 11 word pieces + [SEP]; scored: the 11 between them
    assert doc["input"]["n_tokens"] == 13 and doc["input"]["bos"] is True and doc["input"]["scored_rows"] == 11
    assert PROBE_NOTE in doc["notes"] and PROBE_NOTE in err
    assert "probe" not in doc["input"]
    assert set(doc["settings"]["thresholds"]) == set(roles.roles_for(encoder=True)) - {"mixed"}
    batch = reference_batch(tiny_bert, [CAT])
    reference = reference_maps(tiny_bert, batch)
    for record in doc["heads"]:
        expected = metrics.head_scores(reference[record["layer"]], batch.lengths, causal=False)
        for name in metrics.ALL_SCORES:
            assert record[name] == pytest.approx(float(expected[name][record["head"]]), abs=2e-6), (record["label"], name)
        assert record["induction"] is None and record["duplicate_token"] is None
        assert record["role"] in roles.roles_for(encoder=True)
        assert record["role"] == roles.classify(record).role
        assert record["role_score"] == record[record["role_metric"]]


def test_decoder_records_carry_null_next_and_last(cli, tiny_model_dir):
    code, out, _ = cli("heads", CAT, "--model", tiny_model_dir, "--json")
    assert code == 0
    doc = json.loads(out)
    keys = list(doc["heads"][0])
    assert keys[-4:] == ["next_token", "last_token", "induction", "duplicate_token"]
    assert all(h["next_token"] is None and h["last_token"] is None for h in doc["heads"])
    assert "next-token" not in doc["settings"]["thresholds"]  # a decoder's settings are what they were
    code, _, err = cli("heads", CAT, "--model", tiny_model_dir, "--sort", "next_token")
    assert code == 2 and "encoder" in err and len(err.strip().splitlines()) == 1


def test_planted_roles_are_found():
    """The new pattern roles, on scores with next_token / last_token (and None probe scores, as for an encoder)."""
    base = {"previous_token": 0.1, "first_token": 0.1, "self": 0.1, "local_lift": 0.1, "entropy_normalized": 0.3,
            "induction": None, "duplicate_token": None}
    assert roles.classify({**base, "next_token": 0.7, "last_token": 0.1}).role == "next-token"
    assert roles.classify({**base, "next_token": 0.1, "last_token": 0.6}) == roles.Role("last-token", "last_token", 0.6)
    decoder = {**base, "next_token": None, "last_token": None, "induction": 0.1, "duplicate_token": 0.1}
    assert roles.classify(decoder).role == "mixed"
    assert roles.parse_thresholds(["last-token=0.7"])["last-token"] == 0.7


def test_csv_table_sort_and_top(cli, tiny_bert_dir):
    _, out_json, _ = cli("heads", CAT, "--model", tiny_bert_dir, "--json")
    code, out_csv, _ = cli("heads", CAT, "--model", tiny_bert_dir, "--csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out_csv)))
    records = json.loads(out_json)["heads"]
    assert len(rows) == 8 and "next_token" in rows[0] and "last_token" in rows[0]
    for row, record in zip(rows, records):
        assert float(row["last_token"]) == pytest.approx(record["last_token"]) and row["induction"] == ""
    code, out, _ = cli("heads", CAT, "-m", tiny_bert_dir, "--sort", "last_token", "--top", "3", "--json")
    assert code == 0
    assert [h["label"] for h in json.loads(out)["heads"]] == [
        h["label"] for h in sorted(records, key=lambda h: -h["last_token"])[:3]
    ]
    code, out, _ = cli("heads", CAT, "-m", tiny_bert_dir)
    assert code == 0
    assert "Head roles" in out and "next=next-token" in out and "last=last-token" in out and "induc" not in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_out_writes_tables_and_pictures(cli, tiny_bert_dir, tmp_path):
    code, out, err = cli("heads", CAT, "-m", tiny_bert_dir, "--out", tmp_path, "--plot", "1.2", "--json")
    assert code == 0, err
    names = sorted(p.name for p in tmp_path.iterdir())
    scores = ["confidence", "entropy", "entropy_normalized", "first_token", "local", "local_lift", "previous_token",
              "self", "next_token", "last_token"]
    assert names == sorted(["heads.json", "heads.csv", "role_map.png", "attention_1.2.png"] + [f"score_{s}.png" for s in scores])
    assert json.loads((tmp_path / "heads.json").read_text()) == json.loads(out)
    png_size(tmp_path / "role_map.png")
    png_size(tmp_path / "attention_1.2.png")


def test_show(cli, tiny_bert_dir, tmp_path):
    code, out, err = cli("show", CAT, "--layer", "1", "-m", tiny_bert_dir, "--out", tmp_path)
    assert code == 0, err
    png_size(Path(out.strip()))
    code, out, _ = cli("show", CAT, "--layer", "0", "--head", "2", "-m", tiny_bert_dir, "--out", tmp_path)
    assert code == 0 and Path(out.strip()) == tmp_path / "attention_0.2.png"
    png_size(tmp_path / "attention_0.2.png")


def test_diversity_equals_pairwise_sums_of_the_reference_maps(cli, tiny_bert, tiny_bert_dir, tmp_path):
    texts = [CAT, "Hello there, world"]
    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n\n".join(texts) + "\n")
    code, out, err = cli("diversity", "--file", corpus, "--layer", "1", "-m", tiny_bert_dir, "--json")
    assert code == 0, err
    doc = json.loads(out)
    batch = reference_batch(tiny_bert, texts)
    maps = reference_maps(tiny_bert, batch)[1].nan_to_num(0.0)  # (B, H, n, n)
    scored = metrics.scored_rows(batch.lengths, torch.arange(maps.shape[-1]), causal=False)
    dots, js, _ = metrics.pairwise_sums(maps, scored)  # every key, encoder rows
    assert doc["input"]["scored_rows"] == int(scored.sum()) == 11 + 4
    np.testing.assert_allclose(np.array(doc["matrices"]["js"]), (js / scored.sum()).numpy(), atol=1e-5)
    code, out, err = cli("diversity", CAT, "--layer", "all", "-m", tiny_bert_dir, "--json")
    assert code == 0, err
    assert len(json.loads(out)["labels"]) == 8


def test_attend_to_a_later_token(cli, tiny_bert, tiny_bert_dir):
    code, out, err = cli("attend", CAT, "--from", "cat", "--to", "mat", "-m", tiny_bert_dir, "--json")
    assert code == 0, err
    doc = json.loads(out)
    tokens = doc["input"]["tokens"]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    source, target = doc["from"]["position"], doc["to"]["positions"]
    assert tokens[source] == "cat" and target == [tokens.index("mat")] and target[0] > source
    reference = reference_maps(tiny_bert, reference_batch(tiny_bert, [CAT]))
    rows = np.array(doc["rows"])  # (L, H, n)
    for layer in range(2):
        np.testing.assert_allclose(rows[layer], reference[layer][0, :, source].numpy(), atol=1e-5)
        assert rows[layer][:, source + 1 :].max() > 0.01  # later tokens are seen
    weights = {h["label"]: h["to_weight"] for h in doc["heads"]}
    assert weights["1.2"] == pytest.approx(float(reference[1][0, 2, source, target[0]]), abs=1e-5)


def test_ablate_loss_and_gradient(cli, tiny_bert_dir):
    code, out, err = cli("ablate", CAT, "-m", tiny_bert_dir, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["baseline_loss"] > 0 and len(doc["heads"]) == 8
    assert any("masked-LM loss" in note for note in doc["notes"])
    assert doc["input"]["predicted_tokens"] == 2  # round(15 % of 11) masked positions
    code, out, err = cli("ablate", CAT, "-m", tiny_bert_dir, "--method", "gradient", "--prune", "2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert all(h["importance"] >= 0 for h in doc["heads"]) and len(doc["prune"]) == 2


def test_report(cli, tiny_bert_dir, tmp_path):
    import re

    code, out, err = cli("report", CAT, "-m", tiny_bert_dir, "--out", tmp_path, "-q")
    assert code == 0, err
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="attnscope-data">(.*?)</script>', text, re.S).group(1))
    assert data["heads"]["heads"][0]["next_token"] is not None
    assert "next_token" in text and PROBE_NOTE in text


def test_bad_input_ends_in_one_line_and_status_2(cli, tiny_bert_dir, tmp_path):
    m = ["-m", str(tiny_bert_dir)]
    cases = {
        "sort by a probe score": (["heads", CAT, *m, "--sort", "induction"], "skipped for encoder"),
        "nothing between [CLS] and [SEP]": (["heads", "cat", *m, "--no-bos"], "no text has a token"),
        "ablate nothing to mask": (["ablate", "cat", *m, "--no-bos"], "nothing to mask"),
        "attend missing token": (["attend", CAT, *m, "--from", "dog"], "is not a token"),
        "layer out of range": (["diversity", CAT, *m, "--layer", "2"], "out of range"),
        "bench is for decoders": (["bench", *m, "--device", "cpu"], "GPT-2-family decoders only"),
        "bench random weights": (["bench", *m, "--random-weights", "--device", "cpu"], "GPT-2-family decoders only"),
    }
    for name, (args, expected) in cases.items():
        code, out, err = cli(*args)
        assert code == 2, (name, code, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("attnscope: error: ") and expected in lines[0], (name, err)
        assert out == "", name
