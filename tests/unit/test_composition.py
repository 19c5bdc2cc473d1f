"""Composition and copying scores against from-scratch computations with explicit d_model × d_model (or V × V)
matrices in float64 numpy, planted heads whose answer is known by construction, and the random baseline against
its analytic expectation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnscope.scores.composition import Composition, composition_scores, copying_scores, random_baseline


def random_heads(L=3, H=2, d=12, k=3, seed=0, rank_deficient=False):
    generator = torch.Generator().manual_seed(seed)
    W_Q, W_K, W_V = (torch.randn(L, H, d, k, generator=generator, dtype=torch.float64) for _ in range(3))
    W_O = torch.randn(L, H, k, d, generator=generator, dtype=torch.float64)
    if rank_deficient:  # a head whose W_V and W_K have one column only (a pruned head's shape), and a zero head
        W_V[1, 0, :, 1:] = 0
        W_K[2, 1, :, 1:] = 0
        W_O[0, 1] = 0
    return W_Q, W_K, W_V, W_O


def explicit(W_Q, W_K, W_V, W_O):
    """The definitions with the d × d matrices themselves: [la, ha, lb, hb] for la < lb, NaN elsewhere."""
    Q, K, V, Wo = (w.numpy() for w in (W_Q, W_K, W_V, W_O))
    L, H = Q.shape[:2]
    ov = {(la, ha): V[la, ha] @ Wo[la, ha] for la in range(L) for ha in range(H)}
    qk = {(la, ha): Q[la, ha] @ K[la, ha].T for la in range(L) for ha in range(H)}

    def ratio(product, *factors):  # a head whose matrix is 0 composes with nothing: 0
        denominator = np.prod([np.linalg.norm(f) for f in factors])  # Frobenius norms
        return np.linalg.norm(product) / denominator if denominator > 0 else 0.0

    scores = {kind: np.full((L, H, L, H), np.nan) for kind in "qkv"}
    for (la, ha), A in ov.items():
        for (lb, hb), B in qk.items():
            if la >= lb:
                continue
            scores["q"][la, ha, lb, hb] = ratio(A @ B, A, B)
            scores["k"][la, ha, lb, hb] = ratio(B @ A.T, A, B)
            scores["v"][la, ha, lb, hb] = ratio(A @ ov[lb, hb], A, ov[lb, hb])
    return scores


@pytest.mark.parametrize("rank_deficient", [False, True])
def test_composition_equals_the_definition_with_explicit_matrices(rank_deficient):
    weights = random_heads(rank_deficient=rank_deficient)
    got = composition_scores(*weights)
    want = explicit(*weights)
    for kind in "qkv":
        np.testing.assert_allclose(getattr(got, kind), want[kind], rtol=1e-10, atol=1e-12, equal_nan=True)


def test_small_chunks_give_the_same_scores():
    weights = random_heads(L=3, H=2)
    whole, chunked = composition_scores(*weights), composition_scores(*weights, chunk_bytes=1)
    for kind in "qkv":
        np.testing.assert_allclose(getattr(whole, kind), getattr(chunked, kind), rtol=1e-12, equal_nan=True)


def test_records_name_every_earlier_head_and_later_head_once():
    got = composition_scores(*random_heads(L=3, H=2))
    records = got.records()
    assert len(records) == 2 * 2 * (1 + 2)  # pairs of layers (0,1), (0,2), (1,2), 2 × 2 heads each
    assert records[0].keys() == {"from", "to", "q", "k", "v"}
    assert records[0]["from"] == "0.0" and records[0]["to"] == "1.0"
    assert all(int(r["from"].split(".")[0]) < int(r["to"].split(".")[0]) for r in records)
    assert records[-1] == {
        "from": "1.1",
        "to": "2.1",
        **{kind: float(getattr(got, kind)[1, 1, 2, 1]) for kind in "qkv"},
    }


def planted(d=8, k=2):
    """Two layers of one head each: A writes into span(e0, e1); B's W_Q, W_K, W_V read from coordinates chosen per
    test. Returns zero weights to fill."""
    W_Q, W_K, W_V = (torch.zeros(2, 1, d, k, dtype=torch.float64) for _ in range(3))
    W_O = torch.zeros(2, 1, k, d, dtype=torch.float64)
    W_V[0, 0] = torch.randn(d, k, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    W_O[0, 0, 0, 0] = W_O[0, 0, 1, 1] = 1.0  # A's output: e0, e1
    return W_Q, W_K, W_V, W_O


def test_a_head_reading_where_nothing_was_written_composes_zero():
    W_Q, W_K, W_V, W_O = planted()
    generator = torch.Generator().manual_seed(2)
    for W in (W_Q, W_K, W_V):  # B reads only coordinates 2..7, orthogonal to what A writes
        W[1, 0, 2:] = torch.randn(6, 2, generator=generator, dtype=torch.float64)
    W_O[1, 0] = torch.randn(2, 8, generator=generator, dtype=torch.float64)
    got = composition_scores(W_Q, W_K, W_V, W_O)
    assert [float(getattr(got, kind)[0, 0, 1, 0]) for kind in "qkv"] == pytest.approx([0, 0, 0], abs=1e-12)


def test_aligned_heads_compose_at_the_maximum():
    """Rank-one heads on the same direction reach 1 (‖MN‖_F = ‖M‖_F ‖N‖_F only there); heads using both of their
    dimensions equally on the same subspace reach 1/√k (‖P P‖_F / ‖P‖_F² for a projection P of rank k)."""
    d, k = 8, 2
    W_Q, W_K, W_V = (torch.zeros(2, 1, d, k, dtype=torch.float64) for _ in range(3))
    W_O = torch.zeros(2, 1, k, d, dtype=torch.float64)
    W_V[0, 0, 0, 0] = 2.0  # A: rank one, e0 -> e0
    W_O[0, 0, 0, 0] = 3.0
    for W in (W_Q, W_K, W_V):  # B: reads e0 (rank one)
        W[1, 0, 0, 0] = 1.5
    W_O[1, 0, 0, 5] = 1.0
    got = composition_scores(W_Q, W_K, W_V, W_O)
    assert [float(getattr(got, kind)[0, 0, 1, 0]) for kind in "qkv"] == pytest.approx([1, 1, 1], abs=1e-12)
    eye = torch.eye(d, dtype=torch.float64)[:, :k]  # (d, k): the subspace span(e0, e1), used whole
    for W in (W_Q, W_K, W_V):
        W[:, 0] = eye
    W_O[:, 0] = eye.T
    got = composition_scores(W_Q, W_K, W_V, W_O)
    assert [float(getattr(got, kind)[0, 0, 1, 0]) for kind in "qkv"] == pytest.approx([1 / math.sqrt(k)] * 3)


def test_the_random_baseline_matches_its_expected_value():
    """E[score²] = 1/d for independent Gaussian heads (the docstring derives it): mean² + variance of the simulated
    scores within a few percent of it, for two shapes."""
    for d, k in ((32, 8), (48, 16)):
        baseline = random_baseline(d, k, samples=16, seed=3)
        assert baseline["expected_rms"] == pytest.approx(1 / math.sqrt(d))
        for kind in "qkv":
            mean, std = baseline[kind]["mean"], baseline[kind]["std"]
            assert mean**2 + std**2 == pytest.approx(1 / d, rel=0.05), (d, k, kind)
            assert 0 < std < mean / 3
    assert random_baseline(32, 4, samples=4, seed=1) == random_baseline(32, 4, samples=4, seed=1)  # seeded


def explicit_copying(W_E, W_V, W_O, W_U):
    """Σ Re λ / Σ |λ| over the eigenvalues of the full V × V circuit W_E W_V W_O W_U."""
    E, V, Wo, U = (w.numpy() for w in (W_E, W_V, W_O, W_U))
    L, H = V.shape[:2]
    scores = np.zeros((L, H))
    for layer in range(L):
        for head in range(H):
            eigenvalues = np.linalg.eigvals(E @ V[layer, head] @ Wo[layer, head] @ U)
            scores[layer, head] = eigenvalues.real.sum() / np.abs(eigenvalues).sum()
    return scores


def test_copying_equals_the_eigenvalues_of_the_full_circuit():
    generator = torch.Generator().manual_seed(4)
    vocabulary, d, k = 20, 8, 3
    W_E = torch.randn(vocabulary, d, generator=generator, dtype=torch.float64)
    W_U = torch.randn(d, vocabulary, generator=generator, dtype=torch.float64)
    W_V = torch.randn(2, 3, d, k, generator=generator, dtype=torch.float64)
    W_O = torch.randn(2, 3, k, d, generator=generator, dtype=torch.float64)
    np.testing.assert_allclose(copying_scores(W_E, W_V, W_O, W_U), explicit_copying(W_E, W_V, W_O, W_U), atol=1e-10)


def test_copying_heads_suppressing_heads_and_rotating_heads():
    """W_U = W_Eᵀ: a head whose OV circuit is the identity on its subspace copies (1), its negative suppresses (−1),
    a rotation by 90° has eigenvalues ±i and scores 0 (real parts over moduli)."""
    d, k = 6, 2
    W_E = torch.eye(d, dtype=torch.float64)[:5].repeat(2, 1)  # (10, d): two tokens per direction, e5 unused
    W_U = W_E.T.clone()
    basis = torch.eye(d, dtype=torch.float64)[:, :k]  # (d, k)
    rotation = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    W_V = basis.expand(1, 3, d, k).clone()
    W_O = torch.stack([basis.T, -basis.T, rotation @ basis.T])[None]  # (1, 3, k, d)
    np.testing.assert_allclose(copying_scores(W_E, W_V, W_O, W_U), [[1.0, -1.0, 0.0]], atol=1e-12)
    zero = copying_scores(W_E, W_V, torch.zeros_like(W_O), W_U)
    assert np.array_equal(zero, np.zeros((1, 3)))


def test_composition_of_a_real_shape_is_float32_and_close_to_float64():
    """The default dtype of the weights (float32) agrees with float64 to 1e-5."""
    weights = random_heads(L=2, H=2, d=64, k=8, seed=5)
    double = composition_scores(*weights)
    single = composition_scores(*(w.float() for w in weights))
    assert isinstance(single, Composition)
    for kind in "qkv":
        np.testing.assert_allclose(getattr(single, kind), getattr(double, kind), atol=1e-5, equal_nan=True)


def test_chosen_readers_get_the_same_scores_and_the_others_none():
    weights = random_heads(L=3, H=3)
    every = composition_scores(*weights)
    some = composition_scores(*weights, readers=[(2, 1), (1, 0), (0, 2)])  # a layer-0 reader has no writers
    for kind in "qkv":
        np.testing.assert_allclose(getattr(some, kind)[:, :, 2, 1], getattr(every, kind)[:, :, 2, 1], equal_nan=True)
        np.testing.assert_allclose(getattr(some, kind)[:, :, 1, 0], getattr(every, kind)[:, :, 1, 0], equal_nan=True)
        assert np.isnan(getattr(some, kind)[:, :, 2, 0]).all() and np.isnan(getattr(some, kind)[:, :, 1, 2]).all()
    assert {(r["from"], r["to"]) for r in some.records()} == {
        (f"{la}.{ha}", to) for to, layer in (("1.0", 1), ("2.1", 2)) for la in range(layer) for ha in range(3)
    }
