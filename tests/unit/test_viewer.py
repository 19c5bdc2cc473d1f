"""The report page's data, without a model: maps and matrices encoded compactly and decoded back here by formulas
written out independently (the layouts of output/viewer.py's docstring), the budget of maps the page holds, and
which text each role is shown on."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from attnscope.analyses.report import PROBE, TEXT, ShownText, example_texts, map_cells, plan_maps
from attnscope.output.viewer import encode_maps, encode_matrix, script_json
from attnscope.pipeline.labels import Labels


def _causal_maps(generator, shape, n):
    """Random causal softmax maps (..., n, n): each row a distribution over keys 0..i, zeros after."""
    logits = generator.normal(scale=3.0, size=(*shape, n, n))
    logits[..., np.triu_indices(n, k=1)[0], np.triu_indices(n, k=1)[1]] = -np.inf
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True)


def _decode_triangle(data: bytes, scales, n: int, index: int) -> np.ndarray:
    """Map `index` (layer-major, then head) of a causal encoding, read cell by cell: row i holds keys 0..i."""
    cells = n * (n + 1) // 2
    codes = np.frombuffer(data, dtype=np.uint8)[index * cells : (index + 1) * cells]
    out = np.full((n, n), np.nan)
    k = 0
    for i in range(n):
        for j in range(i + 1):
            out[i, j] = scales[index] * (codes[k] / 255) ** 2
            k += 1
    return out


def test_causal_maps_keep_their_lower_triangle_within_the_square_root_bound():
    generator = np.random.default_rng(0)
    maps = _causal_maps(generator, (2, 3), 7)  # (L, H, n, n)
    maps[1, 2] = np.tril(np.full((7, 7), 0.3))  # a map whose largest weight is 0.3, not 1
    data, scales = encode_maps(maps, causal=True)
    assert len(data) == 2 * 3 * map_cells(7, True) == 2 * 3 * 28
    assert scales.shape == (2, 3) and scales[1, 2] == pytest.approx(0.3) and scales[0, 0] == 1.0
    for index in range(6):
        layer, head = divmod(index, 3)
        decoded = _decode_triangle(data, scales.ravel(), 7, index)
        original = maps[layer, head]
        lower = np.tril(np.ones((7, 7), dtype=bool))
        assert np.isnan(decoded[~lower]).all()  # the keys after a query are not stored: never a weight of 0
        s = scales[layer, head]
        root = np.sqrt(original[lower] / s)
        bound = s * (0.5 / 255) * (2 * root + 0.5 / 255) + 1e-12  # |s(x̂² - x²)| with |x̂ - x| <= 1/510
        assert (np.abs(decoded[lower] - original[lower]) <= bound).all()
    small = np.zeros((1, 1, 3, 3))
    small[0, 0] = [[1, 0, 0], [0.99, 0.01, 0], [0.9, 0.0999, 0.0001]]
    data, scales = encode_maps(small, causal=True)
    assert list(data) == [255, 254, 26, 242, 81, 3]  # round(255·sqrt(a)): 0.01 -> 25.5 -> 26, 0.0001 -> 2.55 -> 3


def test_encoder_maps_keep_the_whole_square():
    generator = np.random.default_rng(1)
    maps = generator.dirichlet(np.ones(5), size=(2, 5))  # (H, n, n) rows summing to 1
    data, scales = encode_maps(maps, causal=False)
    assert len(data) == 2 * 25
    codes = np.frombuffer(data, dtype=np.uint8).reshape(2, 5, 5)
    decoded = scales[:, None, None] * (codes / 255.0) ** 2
    assert np.abs(decoded - maps).max() < 2 * 0.5 / 255 + 1e-9
    assert scales.tolist() == [float(f"{value:.6g}") for value in maps.max(axis=(1, 2))]


def test_matrices_are_the_pairs_above_the_diagonal_as_uint16():
    matrix = np.array([[0.0, 0.25, 1.0], [0.25, 0.0, 0.123456789], [1.0, 0.123456789, 0.0]])
    codes = np.frombuffer(base64.b64decode(encode_matrix(matrix)), dtype="<u2")
    assert codes.tolist() == [round(0.25 * 65535), 65535, round(0.123456789 * 65535)]
    assert np.abs(codes / 65535 - [0.25, 1.0, 0.123456789]).max() <= 1 / 131070


def test_script_json_cannot_end_its_element():
    data = {"name": "</script><script>alert(1)</script>"}
    text = script_json(data)
    assert "</" not in text and json.loads(text) == data


def test_the_plan_keeps_every_text_and_the_full_cap_when_they_fit():
    assert plan_maps([12, 75, 40], n_heads=144, causal=True, budget=10**9) == (128, 3)
    # 8 heads, one text of 300 tokens and a probe of 101: the cap is the largest that fits 8·(c(c+1)/2 + 101·102/2)
    budget = 8 * (map_cells(60, True) + map_cells(60, True))
    assert plan_maps([300, 101], n_heads=8, causal=True, probe=True, budget=budget) == (60, 1)
    assert plan_maps([300, 101], n_heads=8, causal=True, probe=True, budget=budget - 1) == (59, 1)


def test_the_plan_leaves_out_the_last_texts_when_even_the_smallest_cap_is_too_much():
    lengths = [100, 100, 100, 100, 101]  # four texts and the probe
    one = map_cells(16, False)
    assert plan_maps(lengths, n_heads=1, causal=False, probe=True, budget=3 * one) == (16, 2)  # 2 texts + probe
    assert plan_maps(lengths, n_heads=1, causal=False, probe=True, budget=one) == (16, 1)  # the first text stays
    assert plan_maps(lengths[:4], n_heads=1, causal=False, budget=2 * one + 1) == (16, 2)


def _shown(kind, ids, words):
    """A text of one token per word, `words` its words."""
    labels = Labels([str(i) for i in ids], [str(i) for i in ids], [range(k, k + 1) for k in range(len(ids))], words)
    return ShownText("t", kind, 0 if kind == TEXT else None, tuple(ids), labels, None, len(ids))


def test_copying_heads_are_shown_on_the_probe_and_the_others_on_prose():
    shown = [
        _shown(TEXT, [0, 1, 2], ["<bos>", "a", "cat"]),
        _shown(TEXT, [0, 5, 6, 7, 8, 9], ["<bos>", "the", "dog", "sat", "down", "."]),  # the most words of letters
        _shown(TEXT, [0, 1, 1, 2, 3, 4, 10], ["<bos>", "a", "a", "(", "1", ")", "=", "x"]),  # longer, but code
        _shown(PROBE, [0, 3, 4], ["<bos>", "sun", "moon"]),
    ]
    examples = example_texts(shown)
    assert examples["induction"] == examples["duplicate-token"] == 3
    assert examples["previous-token"] == examples["first-token"] == examples["mixed"] == 1
    without_probe = example_texts(shown[:3])
    assert without_probe["induction"] == 2  # the text that repeats itself most (one token of six)
    assert without_probe["broad"] == 1
    assert example_texts([]) == {}
