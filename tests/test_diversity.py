"""Head diversity: JS against scipy, pairwise sums against a slow loop, planted duplicate heads, the CLI."""

import csv
import io
import json

import numpy as np
import pytest
import torch
from scipy.cluster.hierarchy import linkage as scipy_linkage
from scipy.spatial.distance import jensenshannon, squareform

from attnscope import groups, metrics, plots
from attnscope.analysis import analyze_diversity
from attnscope.inputs import Text
from attnscope.tokens import batches, tokenize
from tests import helpers
from tests.conftest import build_tiny_gpt2
from tests.test_capture import reference_maps
from tests.test_cli import CAT, png_size

TEXTS = [Text("The cat sat on the mat because it was tired.", "a"), Text("Hello there, world", "b")]


def random_rows(generator, count, n, zeros=True):
    rows = torch.rand(count, n, generator=generator, dtype=torch.float64) ** 3
    if zeros:
        rows[rows < 0.2] = 0.0  # exact zeros, where 0·log 0 matters
        rows[:, -1] += 0.01  # but never a row of zeros
        rows[0] = 0.0
        rows[0, 0] = 1.0  # a one-hot row
    return rows / rows.sum(-1, keepdim=True)


def test_js_divergence_matches_scipy_including_zeros():
    generator = torch.Generator().manual_seed(0)
    p, q = random_rows(generator, 50, 9), random_rows(generator, 50, 9)
    q[1] = p[1]  # identical rows: 0
    ours = metrics.js_divergence(p, q)
    expected = [jensenshannon(a.numpy(), b.numpy(), base=2) ** 2 for a, b in zip(p, q)]
    assert ours.numpy() == pytest.approx(np.nan_to_num(expected), abs=1e-12)
    assert float(ours[1]) == 0.0
    disjoint = metrics.js_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert float(disjoint) == pytest.approx(1.0)  # bits: disjoint distributions are 1 apart


def test_pairwise_sums_match_a_slow_loop_with_scipy():
    generator = torch.Generator().manual_seed(1)
    B, K, b, n = 2, 3, 4, 6
    attn = random_rows(generator, B * K * b, n).reshape(B, K, b, n)
    scored = torch.tensor([[True, True, False, True], [True, False, True, True]])
    attn[~scored[:, None, :].expand(B, K, b)] = float("nan")  # unscored rows may hold anything
    dots, js, js_root = metrics.pairwise_sums(attn, scored, budget_bytes=1)  # the smallest chunks
    for k in range(K):
        for g in range(K):
            rows = [(x, r) for x in range(B) for r in range(b) if scored[x, r]]
            expected = [jensenshannon(attn[x, k, r].numpy(), attn[x, g, r].numpy(), base=2) for x, r in rows]
            assert float(js[k, g]) == pytest.approx(sum(d * d for d in expected), abs=1e-10)
            assert float(js_root[k, g]) == pytest.approx(sum(expected), abs=1e-6)
            dot = sum(float(attn[x, k, r] @ attn[x, g, r]) for x, r in rows)
            assert float(dots[k, g]) == pytest.approx(dot)


def test_identical_heads_are_zero_apart_in_float32():
    """Float32 softmax rows, as the capture gives them: a head and its copy must be 0 apart, not ~1e-7 bits (whose
    square root, ~4e-4, is what js_distance showed before the divergence was computed in float64)."""
    generator = torch.Generator().manual_seed(3)
    attn = torch.softmax(3 * torch.randn(2, 3, 64, 64, generator=generator), dim=-1)  # (B, K, b, n) float32
    attn[:, 1] = attn[:, 0]
    scored = torch.ones(2, 64, dtype=torch.bool)
    _, js, js_root = metrics.pairwise_sums(attn, scored)
    rows = int(scored.sum())
    for k, g in [(0, 1), (0, 0), (2, 2)]:
        assert float(js[k, g]) / rows < 1e-12 and float(js_root[k, g]) / rows < 1e-6
    assert float(js[0, 2]) / rows > 0.01  # different heads stay apart


def slow_diversity(loaded, texts, layers):
    """Cosine over concatenated valid entries, mean row JSD and mean JS distance, with numpy and scipy, from
    from-scratch maps computed one window at a time (no padding), for every head of `layers`."""
    windows = tokenize(loaded.tokenizer, texts, loaded.n_ctx).windows
    heads = [(layer, h) for layer in layers for h in range(loaded.n_head)]
    rows = {head: [] for head in heads}
    for window in windows:
        batch = next(batches([window], 1, loaded.device))
        maps = reference_maps(loaded, batch)  # layer -> (1, H, n, n)
        for layer, h in heads:
            rows[layer, h].extend(maps[layer][0, h, 1:].double().numpy())  # scored rows: i >= 1
    K = len(heads)
    cosine, js, js_distance = np.zeros((K, K)), np.zeros((K, K)), np.zeros((K, K))
    for a in range(K):
        for b in range(K):
            x, y = np.concatenate(rows[heads[a]]), np.concatenate(rows[heads[b]])
            cosine[a, b] = x @ y / np.sqrt((x @ x) * (y @ y))
            distances = [jensenshannon(p, q, base=2) for p, q in zip(rows[heads[a]], rows[heads[b]])]
            js[a, b], js_distance[a, b] = np.mean(np.square(distances)), np.mean(distances)
    return cosine, js, js_distance


def test_layer_diversity_matches_independent_computation(tiny):
    result = analyze_diversity(tiny, TEXTS, layer=1)
    cosine, js, _ = slow_diversity(tiny, TEXTS, [1])
    assert result.labels == ["1.0", "1.1", "1.2", "1.3"]
    assert result.cosine == pytest.approx(cosine, abs=1e-5)
    assert result.js == pytest.approx(js, abs=1e-5)
    assert result.layer_scores[1] == pytest.approx(js[np.triu_indices(4, k=1)].mean(), abs=1e-5)


def test_all_layers_in_a_padded_batch_match_independent_computation(tiny):
    lengths = [len(window.ids) for window in tokenize(tiny.tokenizer, helpers.TEXTS, tiny.n_ctx).windows]
    assert len(set(lengths)) == 4  # one batch of four windows of different lengths: three are padded
    result = analyze_diversity(tiny, helpers.TEXTS, layer=None, batch_size=4)
    cosine, js, js_distance = slow_diversity(tiny, helpers.TEXTS, [0, 1])
    assert result.labels == [f"{layer}.{head}" for layer in range(2) for head in range(4)]
    assert result.cosine == pytest.approx(cosine, abs=1e-5)  # cross-layer pairs included: the full 8 × 8
    assert result.js == pytest.approx(js, abs=1e-5)
    assert result.js_distance == pytest.approx(js_distance, abs=1e-5)
    assert js[:4, 4:].min() > 0.01  # the cross-layer block compares different heads


def test_all_layers_agree_with_each_layer(tiny):
    every = analyze_diversity(tiny, TEXTS, layer=None, batch_size=1)
    assert len(every.labels) == 8 and sorted(every.order) == list(range(8))
    for layer in range(2):
        alone = analyze_diversity(tiny, TEXTS, layer=layer)
        block = slice(4 * layer, 4 * layer + 4)
        assert every.js[block, block] == pytest.approx(alone.js, abs=1e-6)  # float32 rows, other chunking
        assert every.layer_scores[layer] == pytest.approx(alone.layer_scores[layer], abs=1e-6)


def test_near_duplicate_groups_and_clusters():
    d = np.array(
        [[0, 0.05, 0.5, 0.9], [0.05, 0, 0.08, 0.9], [0.5, 0.08, 0, 0.9], [0.9, 0.9, 0.9, 0]], dtype=float
    )
    assert groups.near_duplicate_groups(d, 0.1) == [[0, 1, 2]]  # joined through 1
    assert groups.near_duplicate_groups(d, 0.01) == []
    link = groups.average_linkage(d)
    heights = sorted(height for _, _, height in link.merges)
    assert heights == pytest.approx(sorted(scipy_linkage(squareform(d), method="average")[:, 2]))
    assert groups.clusters(link, 0.1) == [[0, 1]]  # 2 joins {0, 1} at (0.5 + 0.08) / 2 = 0.29
    assert groups.clusters(link, 0.3) == [[0, 1, 2]]
    assert link.order[-1] == 3


def test_linkage_heights_match_scipy_on_random_distances():
    generator = np.random.default_rng(0)
    points = generator.random((12, 3))
    d = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    ours = sorted(height for _, _, height in groups.average_linkage(d).merges)
    assert ours == pytest.approx(sorted(scipy_linkage(squareform(d), method="average")[:, 2]))


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


def test_planted_twin_heads_are_found_through_the_cli(cli, twin_heads_dir):
    code, out, err = cli("diversity", "The cat sat on the mat because it was tired.", "-m", twin_heads_dir, "--layer", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "diversity" and doc["settings"]["layer"] == 1
    assert doc["redundant_groups"] == [["1.0", "1.1"]]
    top = doc["most_redundant"][0]
    assert (top["a"], top["b"]) == ("1.0", "1.1")
    assert top["js"] == pytest.approx(0.0, abs=1e-6) and top["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert top["js_distance"] == pytest.approx(0.0, abs=1e-6)  # the square root does not magnify rounding
    assert (top["a_layer"], top["a_head"], top["b_layer"], top["b_head"]) == (1, 0, 1, 1)
    assert doc["most_distinct"][0]["js"] > 0.1
    assert np.array(doc["matrices"]["js"]).shape == (4, 4)


def test_diversity_all_writes_matrices_and_plot(cli, tiny_model_dir, tmp_path):
    code, out, err = cli("diversity", "-m", tiny_model_dir, "--layer", "all", "--out", tmp_path, "--csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 8 * 7 // 2  # every pair of 8 heads
    assert list(rows[0]) == ["a", "b", "a_layer", "a_head", "b_layer", "b_head", "cosine", "js", "js_distance"]
    for row in rows:  # integer columns: a numeric reader takes the labels 0.1 and 0.10 for the same number
        assert (row["a"], row["b"]) == (f"{row['a_layer']}.{row['a_head']}", f"{row['b_layer']}.{row['b_head']}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cosine_matrix.png", "diversity.json", "diversity_pairs.csv", "js_matrix.png", "layer_diversity.png"
    ]
    doc = json.loads((tmp_path / "diversity.json").read_text())
    assert doc["settings"]["layer"] == "all" and set(doc["layer_scores"]) == {"0", "1"} and len(doc["order"]) == 8
    # 8 heads: max(3, 0.45 × 8) = 3.6 in square + 2.4 in and 1.6 in of margins, at 100 dpi
    assert png_size(tmp_path / "js_matrix.png") == (600, 520)
    assert png_size(tmp_path / "layer_diversity.png") == (700, 400)
    assert (tmp_path / "diversity_pairs.csv").read_text() == out


def test_matrix_of_many_heads_gives_each_head_its_label(tmp_path):
    labels = [f"{layer}.{head}" for layer in range(12) for head in range(12)]  # GPT-2 small
    matrix = np.random.default_rng(0).random((144, 144))
    plots.head_matrix(matrix, labels, "JS", tmp_path / "m.png", 0.0, 1.0, "viridis_r")
    # 0.1 in per head (16 in, up from 0.45 in per head up to 16 heads) + 2.4 in and 1.6 in of margins, at 100 dpi
    assert png_size(tmp_path / "m.png") == (1840, 1760)


def test_diversity_table_output(cli, tiny_model_dir):
    code, out, err = cli("diversity", CAT, "-m", tiny_model_dir, "--layer", "1")
    assert code == 0, err
    _, json_out, _ = cli("diversity", CAT, "-m", tiny_model_dir, "--layer", "1", "--json")
    doc = json.loads(json_out)
    assert "Head diversity:" in out and "layer 1" in out  # the title (wrapped: the model's name is a long path)
    assert f"{doc['layer_scores']['1']:.3f}" in out  # the layer's score
    assert "Most redundant pairs" in out and "Most distinct pairs" in out
    for pair in doc["most_redundant"] + doc["most_distinct"]:
        assert f"{pair['a']} ~ {pair['b']}" in out and f"{pair['js']:.3f}" in out
    assert "Near-duplicate groups" in out


def test_random_mha_experiment(cli, tmp_path):
    code, out, _ = cli("diversity", "--random-mha", "--d-model", "32", "--heads", "4,2,1,2", "--trials", "2", "--json", "--out", tmp_path)
    assert code == 0
    rows = json.loads(out)["random_mha"]
    # repeated counts run once, in ascending order
    assert [row["heads"] for row in rows] == [1, 2, 4] and [row["d_head"] for row in rows] == [32, 16, 8]
    assert rows[0]["js"] is None  # one head has no pair
    for row in rows[1:]:
        assert 0.0 < row["js"] < 1.0 and 0.0 < row["cosine"] < 1.0
        assert row["js_distance"] >= row["js"]  # sqrt(x) >= x on [0, 1], so the mean too
    assert (tmp_path / "random_mha.png").exists()


RUN = ["Some text here", "-m", "TINY"]  # a model run on the tiny model


@pytest.mark.parametrize(
    "args, expected",
    [
        ([*RUN, "--layer", "9"], "out of range"),
        ([*RUN, "--layer", "-1"], "--layer"),
        ([*RUN, "--layer", "five"], "'all'"),
        ([*RUN], "--layer is required"),
        ([*RUN, "--layer", "1", "--redundant", "0"], "--redundant"),
        ([*RUN, "--layer", "1", "--redundant", "-1"], "--redundant"),
        ([*RUN, "--layer", "1", "--redundant", "nan"], "--redundant"),
        ([*RUN, "--layer", "all", "--cluster-at", "2"], "--cluster-at"),
        ([*RUN, "--layer", "1", "--pairs", "0"], "--pairs"),
        ([*RUN, "--layer", "1", "--seed", "3"], "--seed: used with --random-mha only"),
        (["--random-mha", "--heads", "3"], "divide"),
        (["--random-mha", "--heads", "two"], "--heads"),
        (["--random-mha", "--heads", "0"], "--heads 0: a number of heads must be positive"),
        (["--random-mha", "--heads", "-2"], "must be positive"),
        (["--random-mha", "--d-model", "0"], "--d-model"),
        (["--random-mha", "--seq-len", "100000000"], "--seq-len must be between 2 and 4096"),
        (["--random-mha", "--seq-len", "4096", "--heads", "8"], "lower --seq-len or --heads"),
        (["Some text here", "--random-mha"], "TEXT: not used by --random-mha"),
        (["--random-mha", "--layer", "1", "-m", "TINY"], "--layer, --model: not used by --random-mha"),
    ],
)
def test_diversity_errors(cli, tiny_model_dir, args, expected):
    code, out, err = cli("diversity", *(tiny_model_dir if arg == "TINY" else arg for arg in args))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnscope: error: ") and expected in lines[0]
