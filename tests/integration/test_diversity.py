"""Head diversity on both kinds of model against an independent computation: numpy and scipy on the from-scratch maps
of each window alone (no padding), over the rows each kind scores."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from attnscope.analyses.diversity import Diversity, analyze_diversity
from attnscope.errors import AttnscopeError
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from tests.support import TEXTS, reference_maps

TWO_TEXTS = [Text("The cat sat on the mat because it was tired.", "a"), Text("Hello there, world", "b")]


def _scored_rows(kind: str, n: int) -> slice:
    """The rows of a window of n tokens that are compared: a decoder's 1 .. n-1 (row 0 sees only itself), an
    encoder's 1 .. n-2 (the text between [CLS] and [SEP])."""
    return slice(1, n) if kind == "decoder" else slice(1, n - 1)


def _slow_diversity(loaded, kind, texts, layers):
    """Cosine over concatenated scored rows, mean row JSD and mean JS distance, with numpy and scipy, from
    from-scratch maps computed one window at a time, for every head of `layers`."""
    heads = [(layer, h) for layer in layers for h in range(loaded.n_head)]
    rows = {head: [] for head in heads}
    for window in tokenize(loaded, texts).windows:
        batch = next(batches([window], 1, loaded.device, pad_id(loaded.tokenizer)))
        maps = reference_maps(loaded, batch)  # layer -> (1, H, n, n)
        scored = _scored_rows(kind, len(window.ids))
        for layer, h in heads:
            rows[layer, h].extend(maps[layer][0, h, scored].double().numpy())
    K = len(heads)
    cosine, js, js_distance = np.zeros((K, K)), np.zeros((K, K)), np.zeros((K, K))
    for a in range(K):
        for b in range(K):
            x, y = np.concatenate(rows[heads[a]]), np.concatenate(rows[heads[b]])
            cosine[a, b] = x @ y / np.sqrt((x @ x) * (y @ y))
            distances = [jensenshannon(p, q, base=2) for p, q in zip(rows[heads[a]], rows[heads[b]], strict=True)]
            js[a, b], js_distance[a, b] = np.mean(np.square(distances)), np.mean(distances)
    return cosine, js, js_distance


def test_layer_diversity_matches_independent_computation(model, kind):
    result = analyze_diversity(model, TWO_TEXTS, layer=1)
    cosine, js, js_distance = _slow_diversity(model, kind, TWO_TEXTS, [1])
    assert result.labels == ["1.0", "1.1", "1.2", "1.3"] and result.layer == 1
    assert result.cosine == pytest.approx(cosine, abs=1e-5)
    assert result.js == pytest.approx(js, abs=1e-5)
    assert result.js_distance == pytest.approx(js_distance, abs=1e-5)
    assert result.layer_scores == {1: pytest.approx(js[np.triu_indices(4, k=1)].mean(), abs=1e-5)}
    windows = tokenize(model, TWO_TEXTS).windows
    assert result.inputs["scored_rows"] == sum(len(range(len(w.ids))[_scored_rows(kind, len(w.ids))]) for w in windows)
    assert js[np.triu_indices(4, k=1)].min() > 0.01  # the heads differ: a swapped pair would fail


def test_all_layers_in_a_padded_batch_match_independent_computation(model, kind):
    lengths = [len(window.ids) for window in tokenize(model, TEXTS).windows]
    assert len(set(lengths)) == 4  # one batch of four windows of different lengths: three are padded
    result = analyze_diversity(model, TEXTS, layer=None, batch_size=4)
    cosine, js, js_distance = _slow_diversity(model, kind, TEXTS, [0, 1])
    assert result.labels == [f"{layer}.{head}" for layer in range(2) for head in range(4)] and result.layer is None
    assert result.cosine == pytest.approx(cosine, abs=1e-5)  # cross-layer pairs included: the full 8 × 8
    assert result.js == pytest.approx(js, abs=1e-5)
    assert result.js_distance == pytest.approx(js_distance, abs=1e-5)
    assert js[:4, 4:].min() > 0.01  # the cross-layer block compares different heads


def test_all_layers_agree_with_each_layer(model):
    every = analyze_diversity(model, TWO_TEXTS, layer=None, batch_size=1)
    assert len(every.labels) == 8 and sorted(every.order) == list(range(8))
    assert set(every.layer_scores) == {0, 1}
    for layer in range(2):
        alone = analyze_diversity(model, TWO_TEXTS, layer=layer)
        block = slice(4 * layer, 4 * layer + 4)
        assert every.js[block, block] == pytest.approx(alone.js, abs=1e-6)  # float32 rows, other chunking
        assert every.cosine[block, block] == pytest.approx(alone.cosine, abs=1e-6)
        assert every.layer_scores[layer] == pytest.approx(alone.layer_scores[layer], abs=1e-6)


def test_pairs_are_ranked_by_js(model):
    result = Diversity(1, top=2).run(model, TWO_TEXTS)
    pairs = result.pairs()
    assert [(p["a"], p["b"]) for p in pairs] == [(f"1.{i}", f"1.{j}") for i in range(4) for j in range(i + 1, 4)]
    for pair in pairs:
        i, j = result.labels.index(pair["a"]), result.labels.index(pair["b"])
        assert pair["js"] == result.js[i, j] and (pair["a_layer"], pair["a_head"]) == (1, i)
    by_js = sorted(pairs, key=lambda p: p["js"])
    assert result.ranked_pairs(most_similar=True) == by_js[:2]
    assert result.ranked_pairs(most_similar=False) == by_js[::-1][:2]


def test_a_text_with_no_scored_row_is_refused(model, kind):
    # one token: a decoder's window is BOS and it; with special tokens off, an encoder's window is the token alone
    with pytest.raises(AttnscopeError, match="give at least"):
        Diversity(0, bos=False).run(model, [Text("cat", "t")])


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"redundant": 0.0}, "redundant 0.0: a JS divergence in bits, above 0 and at most 1"),
        ({"cluster_at": 2.0}, "cluster-at 2.0: a JS divergence in bits, above 0 and at most 1"),
        ({"top": 0}, "top 0: must be at least 1"),
    ],
)
def test_bad_settings_are_refused_on_construction(settings, message):
    with pytest.raises(AttnscopeError, match=f"^{message}$"):
        Diversity(1, **settings)


def test_a_layer_out_of_range_is_refused(model):
    with pytest.raises(AttnscopeError, match=r"^layer 2 is out of range"):
        Diversity(2).run(model, TWO_TEXTS)
