"""`diversity` and `random-mha` end to end: the matrices against scipy's Jensen–Shannon on the from-scratch attention,
planted twin heads, the files, the table; the random-layer experiment."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch

from attnscope.pipeline.inputs import Text
from tests.support import CAT, build_tiny_gpt2, png_size, slow_diversity

TEXTS = [CAT, "Hello there, world"]
PAIR_COLUMNS = ["a", "b", "a_layer", "a_head", "b_layer", "b_head", "cosine", "js", "js_distance"]


def _diversity(cli, *args):
    code, out, err = cli("diversity", *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("layer", ["1", "all"])
def test_matrices_equal_scipy_on_the_from_scratch_attention(cli, model, model_dir, tmp_path, layer):
    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n\n".join(TEXTS) + "\n")  # two windows of different lengths: one is padded
    doc = _diversity(cli, "--file", corpus, "--layer", layer, "-m", model_dir)
    layers = [1] if layer == "1" else [0, 1]
    cosine, js, js_distance, scored = slow_diversity(model, [Text(text, "t") for text in TEXTS], layers)
    assert doc["input"]["scored_rows"] == scored
    assert doc["labels"] == [f"{lr}.{h}" for lr in layers for h in range(4)]
    for name, expected in (("cosine", cosine), ("js", js), ("js_distance", js_distance)):
        np.testing.assert_allclose(np.array(doc["matrices"][name]), expected, atol=2e-6, err_msg=name)
    for lr in layers:  # a layer's score: the mean JSD over the pairs of its heads
        block = js[4 * layers.index(lr) : 4 * layers.index(lr) + 4, 4 * layers.index(lr) : 4 * layers.index(lr) + 4]
        assert doc["layer_scores"][str(lr)] == pytest.approx(block[np.triu_indices(4, k=1)].mean(), abs=2e-6)


@pytest.fixture(scope="module")
def twin_heads_dir(tmp_path_factory):
    """A tiny GPT-2 whose heads 1.0 and 1.1 have identical query and key weights: identical attention."""
    from transformers import GPT2Model

    folder = build_tiny_gpt2(tmp_path_factory.mktemp("twin-heads"), seed=2)
    model = GPT2Model.from_pretrained(folder)
    c_attn = model.h[1].attn.c_attn
    d, d_head = 32, 8
    with torch.no_grad():
        for part in (0, d):  # the query and key column blocks of the fused projection
            c_attn.weight[:, part + d_head : part + 2 * d_head] = c_attn.weight[:, part : part + d_head]
            c_attn.bias[part + d_head : part + 2 * d_head] = c_attn.bias[part : part + d_head]
    model.save_pretrained(folder)
    return folder


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
def test_planted_twin_heads_are_found_through_the_cli(cli, twin_heads_dir):
    doc = _diversity(cli, CAT, "-m", twin_heads_dir, "--layer", "1")
    assert doc["command"] == "diversity" and doc["settings"]["layer"] == 1
    assert doc["redundant_groups"] == [["1.0", "1.1"]]
    top = doc["most_redundant"][0]
    assert (top["a"], top["b"]) == ("1.0", "1.1")
    assert top["js"] == pytest.approx(0.0, abs=1e-6) and top["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert top["js_distance"] == pytest.approx(0.0, abs=1e-6)  # the square root does not magnify rounding
    assert (top["a_layer"], top["a_head"], top["b_layer"], top["b_head"]) == (1, 0, 1, 1)
    assert doc["most_distinct"][0]["js"] > 0.1
    assert np.array(doc["matrices"]["js"]).shape == (4, 4)


def test_sampled_rows_report_standard_errors(cli, tiny_model_dir):
    doc = _diversity(cli, CAT, "-m", tiny_model_dir, "--layer", "all", "--sample-rows", "3", "--seed", "7")
    assert (doc["settings"]["sample_rows"], doc["settings"]["seed"]) == (3, 7)
    se = np.array(doc["matrices"]["js_se"])
    assert se.shape == (8, 8) and np.array(doc["matrices"]["js_distance_se"]).shape == (8, 8)
    largest = se[~np.eye(8, dtype=bool)].max()
    assert [note for note in doc["notes"] if note.startswith("JS estimated on 3 random scored rows per window")]
    assert f"largest standard error {largest:.2g} bits" in doc["notes"][-1]
    pair = doc["most_redundant"][0]
    assert pair["js_se"] == pytest.approx(se[doc["labels"].index(pair["a"]), doc["labels"].index(pair["b"])])
    again = _diversity(cli, CAT, "-m", tiny_model_dir, "--layer", "all", "--sample-rows", "3", "--seed", "7")
    assert again == doc  # seeded
    code, out, _ = cli("diversity", CAT, "-m", tiny_model_dir, "--layer", "1", "--sample-rows", "3", "--csv")
    assert code == 0 and list(csv.DictReader(io.StringIO(out)))[0].keys() >= {"js_se", "js_distance_se"}
    exact = _diversity(cli, CAT, "-m", tiny_model_dir, "--layer", "all")
    assert exact["settings"]["sample_rows"] == 0 and "js_se" not in exact["matrices"]


@pytest.mark.parametrize(
    "value, message", [("1", "--sample-rows 1: must be 0 (every row, exact) or from 2"), ("-1", "--sample-rows -1")]
)
def test_sample_rows_below_two_are_refused(cli, tiny_model_dir, value, message):
    code, out, err = cli("diversity", CAT, "-m", tiny_model_dir, "--layer", "1", "--sample-rows", value)
    assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("top", [1, 4])
def test_top_is_the_number_of_pairs_listed(cli, tiny_model_dir, top):
    doc = _diversity(cli, CAT, "-m", tiny_model_dir, "--layer", "1", "--top", top)
    assert doc["settings"]["top"] == top and "pairs" not in doc["settings"]
    js = np.array(doc["matrices"]["js"])
    pairs = sorted((js[a, b], f"{a}", f"{b}") for a in range(4) for b in range(a + 1, 4))
    lowest, highest = [f"1.{a}~1.{b}" for _, a, b in pairs[:top]], [f"1.{a}~1.{b}" for _, a, b in pairs[::-1][:top]]
    assert [f"{p['a']}~{p['b']}" for p in doc["most_redundant"]] == lowest
    assert [f"{p['a']}~{p['b']}" for p in doc["most_distinct"]] == highest


@pytest.mark.slow
def test_diversity_all_writes_matrices_and_plot(cli, model_dir, tmp_path):
    code, out, err = cli("diversity", CAT, "-m", model_dir, "--layer", "all", "--out", tmp_path, "--csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 8 * 7 // 2  # every pair of 8 heads
    assert list(rows[0]) == PAIR_COLUMNS
    for row in rows:  # integer columns: a numeric reader takes the labels 0.1 and 0.10 for the same number
        assert (row["a"], row["b"]) == (f"{row['a_layer']}.{row['a_head']}", f"{row['b_layer']}.{row['b_head']}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cosine_matrix.png",
        "diversity.json",
        "diversity_pairs.csv",
        "js_matrix.png",
        "layer_diversity.png",
    ]
    doc = json.loads((tmp_path / "diversity.json").read_text())
    assert doc["settings"]["layer"] == "all" and set(doc["layer_scores"]) == {"0", "1"} and len(doc["order"]) == 8
    js = np.array(doc["matrices"]["js"])
    for row in rows:  # the CSV is the JSON's matrices, pair by pair
        a, b = doc["labels"].index(row["a"]), doc["labels"].index(row["b"])
        assert float(row["js"]) == pytest.approx(js[a, b], abs=1e-12)
    # 8 heads: max(3, 0.44 × 8) = 3.52 in square + 2.5 in of margins across, + 1.8 in and 1.16 in of the
    # dendrogram down; the line plot 7 × 4.2 in; at 150 dpi
    assert png_size(tmp_path / "js_matrix.png") == (903, 972)
    assert png_size(tmp_path / "layer_diversity.png") == (1050, 630)
    assert (tmp_path / "diversity_pairs.csv").read_text() == out


def test_diversity_table_output(cli, model_dir):
    code, out, err = cli("diversity", CAT, "-m", model_dir, "--layer", "1")
    assert code == 0, err
    doc = _diversity(cli, CAT, "-m", model_dir, "--layer", "1")
    assert "Head diversity:" in out and "layer 1" in out  # the title (wrapped: the model's name is a long path)
    assert f"{doc['layer_scores']['1']:.3f}" in out  # the layer's score
    assert "Most redundant pairs" in out and "Most distinct pairs" in out
    for pair in doc["most_redundant"] + doc["most_distinct"]:
        assert f"{pair['a']} ~ {pair['b']}" in out and f"{pair['js']:.3f}" in out
    assert "Near-duplicate groups" in out


# ---------------------------------------------------------------------------------------------------- random-mha


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_random_mha_experiment(cli, tmp_path):
    args = ("random-mha", "--d-model", "32", "--head-counts", "4,2,1,2", "--trials", "2", "--seq-len", "16")
    code, out, err = cli(*args, "--json", "--out", tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "random-mha" and doc["settings"]["head_counts"] == [1, 2, 4]
    rows = doc["results"]
    # repeated counts run once, in ascending order
    assert [row["heads"] for row in rows] == [1, 2, 4] and [row["d_head"] for row in rows] == [32, 16, 8]
    assert rows[0]["js"] is None and rows[0]["cosine"] is None  # one head has no pair
    for row in rows[1:]:
        assert 0.0 < row["js"] < 1.0 and 0.0 < row["cosine"] < 1.0
        assert row["js_distance"] >= row["js"]  # sqrt(x) >= x on [0, 1], so the mean too
    assert all(0.0 < row["entropy_normalized"] <= 1.0 for row in rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["random_mha.json", "random_mha.png"]
    assert json.loads((tmp_path / "random_mha.json").read_text()) == doc
    code, again, _ = cli(*args, "--json")
    assert again == out  # seeded: the same numbers every run
    code, other, _ = cli(*args, "--json", "--seed", "1")
    assert json.loads(other)["results"] != rows
    code, table, _ = cli(*args)
    assert code == 0 and "Random multi-head attention" in table
    code, text, _ = cli(*args, "--csv")
    assert [int(row["heads"]) for row in csv.DictReader(io.StringIO(text))] == [1, 2, 4]
