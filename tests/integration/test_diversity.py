"""Head diversity on both kinds of model against an independent computation: numpy and scipy on the from-scratch maps
of each window alone (no padding), over the rows each kind scores."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope import api
from attnscope.analyses.diversity import Diversity
from attnscope.errors import AttnscopeError
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.tokens import tokenize
from tests.support import TEXTS, slow_diversity

TWO_TEXTS = [Text("The cat sat on the mat because it was tired.", "a"), Text("Hello there, world", "b")]


def test_layer_diversity_matches_independent_computation(model, kind):
    result = api.diversity(model, TWO_TEXTS, layer=1)
    cosine, js, js_distance, scored = slow_diversity(model, TWO_TEXTS, [1])
    assert result.labels == ["1.0", "1.1", "1.2", "1.3"] and result.layer == 1
    assert result.cosine == pytest.approx(cosine, abs=1e-5)
    assert result.js == pytest.approx(js, abs=1e-5)
    assert result.js_distance == pytest.approx(js_distance, abs=1e-5)
    assert result.layer_scores == {1: pytest.approx(js[np.triu_indices(4, k=1)].mean(), abs=1e-5)}
    assert result.inputs["scored_rows"] == scored
    assert js[np.triu_indices(4, k=1)].min() > 0.01  # the heads differ: a swapped pair would fail


def test_all_layers_in_a_padded_batch_match_independent_computation(model, kind):
    lengths = [len(window.ids) for window in tokenize(model, TEXTS).windows]
    assert len(set(lengths)) == 4  # one batch of four windows of different lengths: three are padded
    result = api.diversity(model, TEXTS, layer=None, batch_size=4)
    cosine, js, js_distance, _ = slow_diversity(model, TEXTS, [0, 1])
    assert result.labels == [f"{layer}.{head}" for layer in range(2) for head in range(4)] and result.layer is None
    assert result.cosine == pytest.approx(cosine, abs=1e-5)  # cross-layer pairs included: the full 8 × 8
    assert result.js == pytest.approx(js, abs=1e-5)
    assert result.js_distance == pytest.approx(js_distance, abs=1e-5)
    assert js[:4, 4:].min() > 0.01  # the cross-layer block compares different heads


def test_all_layers_agree_with_each_layer(model):
    every = api.diversity(model, TWO_TEXTS, layer=None, batch_size=1)
    assert len(every.labels) == 8 and sorted(every.order) == list(range(8))
    assert set(every.layer_scores) == {0, 1}
    for layer in range(2):
        alone = api.diversity(model, TWO_TEXTS, layer=layer)
        block = slice(4 * layer, 4 * layer + 4)
        assert every.js[block, block] == pytest.approx(alone.js, abs=1e-6)  # float32 rows, other chunking
        assert every.cosine[block, block] == pytest.approx(alone.cosine, abs=1e-6)
        assert every.layer_scores[layer] == pytest.approx(alone.layer_scores[layer], abs=1e-6)


def test_sampling_every_row_is_the_exact_result(model, kind):
    """--sample-rows at least every window's scored rows takes them all: the exact values, standard errors 0."""
    exact = api.diversity(model, TEXTS, layer=None, batch_size=2)
    sampled = api.diversity(model, TEXTS, layer=None, batch_size=2, sample_rows=10_000, seed=3)
    for name in ("cosine", "js", "js_distance"):
        assert getattr(sampled, name) == pytest.approx(getattr(exact, name), abs=1e-12), name
    assert (sampled.js_se == 0).all() and (sampled.js_distance_se == 0).all()
    assert exact.js_se is None and "js_se" not in exact.pairs()[0]
    assert sampled.settings["sample_rows"] == 10_000 and sampled.settings["seed"] == 3
    assert "standard error 0 bits" in sampled.notes[-1]


def test_sampled_rows_depend_on_the_seed_only(model):
    """The same seed gives the same numbers whatever the batch size (each window's rows come from the seed and the
    window's index); another seed draws other rows; cosine stays exact."""
    first = api.diversity(model, TEXTS, layer=1, batch_size=1, sample_rows=2, seed=5)
    again = api.diversity(model, TEXTS, layer=1, batch_size=4, sample_rows=2, seed=5)
    other = api.diversity(model, TEXTS, layer=1, batch_size=4, sample_rows=2, seed=6)
    exact = api.diversity(model, TEXTS, layer=1)
    # the same rows (padding to another length only moves float32 roundings): far closer than another sample
    assert first.js == pytest.approx(again.js, abs=1e-6) and first.js_se == pytest.approx(again.js_se, abs=1e-6)
    assert np.abs(first.js - other.js).max() > 1e-3
    assert first.cosine == pytest.approx(exact.cosine, abs=1e-6)  # every row, chunked otherwise
    assert first.inputs["scored_rows"] == exact.inputs["scored_rows"]  # the mean is over every scored row


def test_sampled_estimates_are_within_their_error_bars_of_the_exact_values(model):
    exact = api.diversity(model, TEXTS, layer=None)
    off = ~np.eye(len(exact.labels), dtype=bool)
    misses = []
    for seed in range(5):
        sampled = api.diversity(model, TEXTS, layer=None, sample_rows=3, seed=seed)
        assert (sampled.js_se[off] > 0).all()  # windows have more than 3 scored rows: an estimate
        misses.append(np.mean(np.abs(sampled.js - exact.js)[off] > 3 * sampled.js_se[off]))
        assert np.abs(sampled.js_distance - exact.js_distance)[off].max() < 5 * sampled.js_distance_se[off].max()
    assert np.mean(misses) < 0.05  # 3 standard errors: ~0.3 % of pairs if the errors were normal


def test_pairs_are_ranked_by_js(model):
    result = Diversity(layer=1, top=2).run(model, TWO_TEXTS)
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
        Diversity(layer=0, bos=False).run(model, [Text("cat", "t")])


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"redundant": -0.1}, "redundant -0.1: must be a number from 0 to 1"),
        ({"cluster_at": 2.0}, "cluster_at 2.0: must be a number from 0 to 1"),
        ({"top": 0}, "top 0: must be a whole number from 1 to 1,000,000"),
        ({"sample_rows": 1}, "sample_rows 1: must be 0 \\(every row, exact\\) or from 2 to 2,147,483,647"),
        ({"seed": -1}, "seed -1: must be a whole number from 0 to 4,294,967,295"),
    ],
)
def test_bad_settings_are_refused_on_construction(settings, message):
    with pytest.raises(AttnscopeError, match=f"^{message}$"):
        Diversity(layer=1, **settings)


def test_a_layer_out_of_range_is_refused(model):
    with pytest.raises(AttnscopeError, match=r"^layer 2 is out of range"):
        Diversity(layer=2).run(model, TWO_TEXTS)
