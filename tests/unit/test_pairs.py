"""Diversity between heads (scores.pairs) against scipy and a slow loop, and the grouping of heads (scores.groups)
against hand-computed connected components and average linkage."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from attnscope.scores import groups, pairs


@pytest.fixture(params=["numpy", "torch"])
def kernel(request, monkeypatch):
    """Float32 rows on the CPU go to numpy's threaded kernel where numpy's log2 is vectorized, else to torch's:
    each test that takes this fixture runs on both, whatever this machine has."""
    monkeypatch.setattr(pairs, "numpy_log2_is_vectorized", lambda: request.param == "numpy")
    return request.param


def _random_rows(generator, count, n, zeros=True):
    rows = torch.rand(count, n, generator=generator, dtype=torch.float64) ** 3
    if zeros:
        rows[rows < 0.2] = 0.0  # exact zeros, where 0·log 0 matters
        rows[:, -1] += 0.01  # but never a row of zeros
        rows[0] = 0.0
        rows[0, 0] = 1.0  # a one-hot row
    return rows / rows.sum(-1, keepdim=True)


def test_js_divergence_matches_scipy_including_zeros():
    generator = torch.Generator().manual_seed(0)
    p, q = _random_rows(generator, 50, 9), _random_rows(generator, 50, 9)
    q[1] = p[1]  # identical rows: 0
    ours = pairs.js_divergence(p, q)
    expected = [jensenshannon(a.numpy(), b.numpy(), base=2) ** 2 for a, b in zip(p, q, strict=True)]
    assert ours.numpy() == pytest.approx(np.nan_to_num(expected), abs=1e-12)
    assert float(ours[1]) == 0.0
    disjoint = pairs.js_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert float(disjoint) == pytest.approx(1.0)  # bits: disjoint distributions are 1 apart


@pytest.mark.parametrize("budget_bytes", [1, 64 * 2**20])  # the smallest chunks, and one chunk
def test_pairwise_sums_match_a_slow_loop_with_scipy(budget_bytes):
    generator = torch.Generator().manual_seed(1)
    B, K, b, n = 2, 3, 4, 6
    attn = _random_rows(generator, B * K * b, n).reshape(B, K, b, n)
    scored = torch.tensor([[True, True, False, True], [True, False, True, True]])
    attn[~scored[:, None, :].expand(B, K, b)] = float("nan")  # unscored rows may hold anything
    dots, js, js_root = pairs.pairwise_sums(attn, scored, budget_bytes=budget_bytes)
    rows = [(x, r) for x in range(B) for r in range(b) if scored[x, r]]
    for k in range(K):
        for g in range(K):
            expected = [jensenshannon(attn[x, k, r].numpy(), attn[x, g, r].numpy(), base=2) for x, r in rows]
            assert float(js[k, g]) == pytest.approx(sum(d * d for d in expected), abs=1e-10)
            assert float(js_root[k, g]) == pytest.approx(sum(expected), abs=1e-6)
            dot = sum(float(attn[x, k, r] @ attn[x, g, r]) for x, r in rows)
            assert float(dots[k, g]) == pytest.approx(dot)
    # the means: cosine of the heads' scored rows flattened and concatenated, mean JSD, mean JS distance
    similar = pairs.similarity(dots, js, js_root, len(rows))
    flat = {k: np.concatenate([attn[x, k, r].numpy() for x, r in rows]) for k in range(K)}
    for k, g in itertools.product(range(K), repeat=2):
        cosine = flat[k] @ flat[g] / np.sqrt((flat[k] @ flat[k]) * (flat[g] @ flat[g]))
        assert float(similar["cosine"][k, g]) == pytest.approx(cosine)
        assert float(similar["js"][k, g]) == pytest.approx(float(js[k, g]) / len(rows))
    with pytest.raises(ValueError, match="no scored rows"):
        pairs.similarity(dots, js, js_root, 0)


def test_causal_rows_may_skip_the_keys_after_them():
    """With `positions` of causal rows, pairwise_sums skips the keys after a chunk's last row (zero in every causal
    row): the sums are those of the full maps."""
    generator = torch.Generator().manual_seed(2)
    B, K, n = 2, 4, 9
    logits = torch.randn(B, K, n, n, generator=generator, dtype=torch.float64) * 2
    attn = torch.softmax(logits.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), float("-inf")), -1)
    scored = torch.ones(B, n, dtype=torch.bool)
    scored[:, 0] = False
    scored[1, 6:] = False  # a shorter window
    full = pairs.pairwise_sums(attn, scored, budget_bytes=1)
    skipping = pairs.pairwise_sums(attn, scored, torch.arange(n), budget_bytes=1)
    for ours, theirs in zip(skipping, full, strict=True):
        assert torch.allclose(ours, theirs, atol=1e-12)


def test_identical_heads_are_zero_apart_in_float32(kernel):
    """Float32 softmax rows, as the capture gives them: a head and its copy must be 0 apart, not ~1e-7 bits (whose
    square root, ~4e-4, is what js_distance showed before the divergence was computed in float64)."""
    generator = torch.Generator().manual_seed(3)
    attn = torch.softmax(3 * torch.randn(2, 3, 64, 64, generator=generator), dim=-1)  # (B, K, b, n) float32
    attn[:, 1] = attn[:, 0]
    scored = torch.ones(2, 64, dtype=torch.bool)
    _, js, js_root = pairs.pairwise_sums(attn, scored)
    rows = int(scored.sum())
    for k, g in [(0, 1), (0, 0), (2, 2)]:
        assert float(js[k, g]) / rows < 1e-12 and float(js_root[k, g]) / rows < 1e-6
    assert float(js[0, 2]) / rows > 0.01  # different heads stay apart


def _softmax_rows(generator, K, R, n, scale):
    """(K, R, n) float32 softmax rows, near uniform (small scale) to peaked (large)."""
    return torch.softmax(scale * torch.randn(K, R, n, generator=generator), dim=-1)


def test_row_divergences_match_scipy_in_float64_with_zeros_and_one_hot_rows():
    generator = torch.Generator().manual_seed(4)
    K, R, n = 4, 6, 7
    rows = _random_rows(generator, K * R, n).reshape(K, R, n)  # exact zeros; row 0 of head 0 one-hot
    rows[3] = rows[1]  # a copy of a head
    ours = pairs.row_divergences(rows, budget_bytes=1)  # one head per chunk
    for k, g, r in itertools.product(range(K), range(K), range(R)):
        expected = jensenshannon(rows[k, r].numpy(), rows[g, r].numpy(), base=2) ** 2
        assert float(ours[k, g, r]) == pytest.approx(float(np.nan_to_num(expected)), abs=1e-14)
    assert torch.equal(ours, ours.transpose(0, 1))
    assert (ours[1, 3] == 0).all() and (ours.diagonal(dim1=0, dim2=1) == 0).all()


@pytest.mark.parametrize("scale", [0.1, 1.0, 5.0])  # GPT-2 with random weights is near uniform; trained, peaked
def test_float32_rows_are_within_the_stated_bound_of_float64(scale, kernel):
    """The float32 kernel against the same rows in float64: within 2e-6 bits per row (the bound row_divergences
    states), 2e-7 typically; some heads near uniform and some peaked in the same rows too."""
    generator = torch.Generator().manual_seed(5)
    rows = _softmax_rows(generator, 6, 20, 400, scale)  # (K, R, n) float32
    mixed = torch.cat([rows[:3], _softmax_rows(generator, 3, 20, 400, 0.1)])
    for weights in (rows, mixed):
        error = (pairs.row_divergences(weights) - pairs.row_divergences(weights.double())).abs()
        assert error.max() < 2e-6 and error.median() < 2e-7


def test_identical_heads_are_exactly_zero_apart_in_every_chunking(kernel):
    generator = torch.Generator().manual_seed(6)
    rows = _softmax_rows(generator, 5, 9, 33, 3.0)
    rows[4] = rows[0]
    rows[2] = rows[1]
    for budget in (1, 5 * 9 * 33 * 4 * 2, 2**30):  # one head per chunk, two, all
        ours = pairs.row_divergences(rows, budget)
        assert (ours[0, 4] == 0).all() and (ours[1, 2] == 0).all() and (ours[0, 1] > 0).all()


def test_the_two_float32_kernels_agree_with_float64_and_threads_change_no_bit(monkeypatch):
    """Σ s log2 s for every pair, from numpy's kernel (on 1 and 2 threads) and torch's, against float64: both
    within float32 rounding, and the numpy kernel's pieces give the same bits whichever thread computed them."""
    generator = torch.Generator().manual_seed(8)
    rows = torch.cat([_softmax_rows(generator, 4, 5, 37, 3.0), _softmax_rows(generator, 3, 5, 37, 0.1)])  # (7, 5, 37)
    s = rows[:, None] + rows[None, :]  # (K, K, R, keys)
    expected = torch.triu(torch.ones(7, 7)).bool()[..., None] * (s * torch.log2(s)).double().sum(-1)  # (K, K, R)
    threads = torch.get_num_threads()
    results = {}
    try:
        for name, count in (("numpy", 1), ("numpy", 2), ("torch", 2)):
            monkeypatch.setattr(pairs, "numpy_log2_is_vectorized", lambda name=name: name == "numpy")
            torch.set_num_threads(count)
            results[name, count] = pairs.pair_xlog2x(rows, budget_bytes=2 * 5 * 37 * 4)  # two heads a piece
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results["numpy", 1], results["numpy", 2])
    for Y in results.values():
        assert Y.dtype == torch.float32 and torch.allclose(Y.double(), expected, rtol=1e-5, atol=1e-6)


def test_the_numpy_kernel_called_from_the_worker_threads_works_in_place(monkeypatch):
    """Two calls on both of the pool's threads at once: were each to hand its pieces to the pool, both threads
    would wait for pieces no thread is free to run (the test hung so, before `threads.in_worker`); each works in
    place instead."""
    import os

    from attnscope import threads

    monkeypatch.setattr(pairs, "numpy_log2_is_vectorized", lambda: True)
    rows = _softmax_rows(torch.Generator().manual_seed(9), 6, 4, 21, 2.0)
    expected = pairs.pair_xlog2x(rows, budget_bytes=4 * 21 * 4)  # a head a piece, shared among threads
    count = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pool = threads.pool(2, os.getpid())
        started = threading.Barrier(2)

        def both_at_once() -> torch.Tensor:
            try:  # both pool threads are busy with a call before either shares its pieces
                started.wait(timeout=10)
            except threading.BrokenBarrierError:  # the pool had started one thread only: one call at a time
                pass
            return pairs.pair_xlog2x(rows, budget_bytes=4 * 21 * 4)

        calls = [pool.submit(both_at_once) for _ in range(2)]
        for call in calls:
            assert torch.equal(call.result(timeout=60), expected)
    finally:
        torch.set_num_threads(count)


def test_numpy_kernel_is_chosen_only_where_numpy_log2_is_vectorized(monkeypatch):
    introspect = pytest.importorskip("numpy.lib.introspect")
    for current, chosen in (("X86_V4", True), ("AVX512_SKX", True), ("baseline(X86_V2)", False), ("ASIMD", False)):
        report = {"log2": {"ff": {"current": current, "available": current}}}
        monkeypatch.setattr(introspect, "opt_func_info", lambda func_name, signature, report=report: report)
        pairs.numpy_log2_is_vectorized.cache_clear()
        assert pairs.numpy_log2_is_vectorized() is chosen, current
    pairs.numpy_log2_is_vectorized.cache_clear()


def test_window_sums_add_up_to_the_pairwise_sums():
    generator = torch.Generator().manual_seed(7)
    B, K, n = 3, 4, 12
    logits = torch.randn(B, K, n, n, generator=generator) * 2
    attn = torch.softmax(logits.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), float("-inf")), -1)
    scored = torch.ones(B, n, dtype=torch.bool)
    scored[:, 0] = False
    scored[2, 7:] = False
    positions = torch.arange(n)
    dots, js, js_root = pairs.pairwise_sums(attn, scored, positions)
    sums = pairs.window_divergence_sums(attn, scored, positions)  # (3, B, K, K)
    assert torch.allclose(sums[0].sum(0), js, atol=1e-12) and torch.allclose(sums[1].sum(0), js_root, atol=1e-12)
    assert torch.allclose(pairs.pairwise_dots(attn, scored, positions), dots, atol=1e-12)
    # the squares, window by window, from scipy
    x, k, g = 2, 0, 3
    expected = [jensenshannon(attn[x, k, r].double(), attn[x, g, r].double(), base=2) ** 4 for r in range(1, 7)]
    assert float(sums[2, x, k, g]) == pytest.approx(sum(expected), rel=1e-6)


def test_sample_rows_are_seeded_scored_and_all_of_them_when_few():
    scored = torch.zeros(3, 10, dtype=torch.bool)
    scored[0, 1:10] = True
    scored[1, 1:4] = True  # three scored rows: fewer than asked, all taken
    scored[2, 1:8] = True
    chosen = pairs.sample_rows(scored, 4, [11, 12, 13])
    assert chosen.sum(-1).tolist() == [4, 3, 4]
    assert not (chosen & ~scored).any()  # only scored rows
    assert torch.equal(chosen, pairs.sample_rows(scored, 4, [11, 12, 13]))  # the same seeds, the same rows
    others = [pairs.sample_rows(scored, 4, [seed, 12, 13])[0] for seed in range(20)]
    assert len({tuple(row.tolist()) for row in others}) > 5  # other seeds, other rows
    assert torch.equal(pairs.sample_rows(scored, 100, [1, 2, 3]), scored)


def test_stratified_estimate_is_exact_when_every_row_is_sampled():
    values = torch.rand(2, 5, 3, 3, dtype=torch.float64)  # (B, rows, K, K) per-row values
    sums, squares = values.sum(1), values.square().sum(1)
    estimate, variance = pairs.stratified_estimate(sums, squares, torch.tensor([5, 5]), torch.tensor([5, 5]))
    assert torch.allclose(estimate, values.sum((0, 1))) and (variance == 0).all()


def test_stratified_error_bars_cover_the_truth_on_a_planted_case():
    """Two windows whose per-row values differ (one has a block of rows far from the rest): over 400 seeds the
    estimate ± 2 standard errors covers the true sum about 95 % of the time, and the estimates average to it."""
    population = [torch.cat([torch.full((30,), 0.05), torch.full((10,), 0.6)]), torch.linspace(0.0, 0.3, 25)]
    truth = float(sum(rows.sum() for rows in population))
    covered, estimates = 0, []
    for seed in range(400):
        sums, squares, sampled = [], [], []
        for window, rows in enumerate(population):
            chosen = pairs.sample_rows(torch.ones(1, len(rows), dtype=torch.bool), 8, [seed * 2 + window])[0]
            sums.append(rows[chosen].sum())
            squares.append(rows[chosen].square().sum())
            sampled.append(int(chosen.sum()))
        estimate, variance = pairs.stratified_estimate(
            torch.stack(sums).double()[:, None, None],
            torch.stack(squares).double()[:, None, None],
            torch.tensor(sampled),
            torch.tensor([len(rows) for rows in population]),
        )
        estimates.append(float(estimate))
        covered += abs(float(estimate) - truth) <= 2 * float(variance.sqrt())
    assert 0.88 <= covered / 400 <= 0.99
    assert np.mean(estimates) == pytest.approx(truth, rel=0.02)


# ---------------------------------------------------------------------------------------------- groups

CHAIN = np.array([[0, 0.05, 0.5, 0.9], [0.05, 0, 0.08, 0.9], [0.5, 0.08, 0, 0.9], [0.9, 0.9, 0.9, 0]], dtype=float)


def test_near_duplicate_groups_are_the_connected_components_of_close_pairs():
    assert groups.near_duplicate_groups(CHAIN, 0.1) == [[0, 1, 2]]  # 0 and 2 are 0.5 apart, joined through 1
    assert groups.near_duplicate_groups(CHAIN, 0.06) == [[0, 1]]
    assert groups.near_duplicate_groups(CHAIN, 0.05) == []  # strictly closer than the threshold
    assert groups.near_duplicate_groups(CHAIN, 1.0) == [[0, 1, 2, 3]]
    # two components, interleaved: {0, 3} and {1, 4, 5}; singletons 2 and 6 are no group
    d = np.full((7, 7), 0.9)
    np.fill_diagonal(d, 0.0)
    for a, b in [(0, 3), (1, 5), (5, 4)]:
        d[a, b] = d[b, a] = 0.02
    assert groups.near_duplicate_groups(d, 0.1) == [[0, 3], [1, 4, 5]]


def test_average_linkage_and_clusters_of_a_hand_computed_example():
    """By hand: 0 and 1 join at 0.05; then {0, 1} is (0.5 + 0.08) / 2 = 0.29 from 2 and 0.9 from 3, 2 is 0.9 from
    3: 2 joins at 0.29; 3 last, at 0.9."""
    link = groups.average_linkage(CHAIN)
    assert link.merges[:, 2].tolist() == pytest.approx([0.05, 0.29, 0.9])
    assert link.merges[:, 3].tolist() == [2, 3, 4]  # sizes of the merged clusters
    assert groups.clusters(link, 0.1) == [[0, 1]]
    assert groups.clusters(link, 0.29) == [[0, 1]]  # merges strictly below the threshold
    assert groups.clusters(link, 0.3) == [[0, 1, 2]]
    assert groups.clusters(link, 0.05) == []
    assert groups.clusters(link, 1.0) == [[0, 1, 2, 3]]
    # the leaf order keeps 1 between 0 and 2 (0.05 + 0.08 apart, where 1, 0, 2 would be 0.05 + 0.5) and 3 at an end
    order = link.order
    assert sorted(order) == [0, 1, 2, 3] and order.index(3) in (0, 3)
    assert abs(order.index(1) - order.index(0)) == 1 and abs(order.index(1) - order.index(2)) == 1


def test_fewer_than_two_items_have_no_merges():
    link = groups.average_linkage(np.zeros((1, 1)))
    assert link.order == [0] and len(link.merges) == 0 and groups.clusters(link, 1.0) == []


def _naive_average_linkage(d: np.ndarray) -> list[tuple[frozenset, float]]:
    """UPGMA from its definition: join the two clusters whose members are closest on average, until one is left.
    Returns (merged cluster, height) in merge order."""
    clusters = [frozenset([k]) for k in range(len(d))]
    merges = []
    while len(clusters) > 1:

        def average(pair):
            a, b = pair
            return np.mean([d[i, j] for i in a for j in b])

        a, b = min(itertools.combinations(clusters, 2), key=average)
        merges.append((a | b, average((a, b))))
        clusters = [c for c in clusters if c not in (a, b)] + [a | b]
    return merges


def _cut(merges: list[tuple[frozenset, float]], threshold: float) -> list[list[int]]:
    """The clusters of two or more made by the merges below `threshold`, as groups.clusters reports them."""
    made = [cluster for cluster, height in merges if height < threshold]
    largest = [c for c in made if not any(c < other for other in made)]
    return sorted((sorted(c) for c in largest), key=lambda group: group[0])


@pytest.mark.parametrize("seed", [0, 1])
def test_linkage_matches_average_linkage_by_its_definition_on_random_distances(seed):
    points = np.random.default_rng(seed).random((12, 3))
    d = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    link = groups.average_linkage(d)
    expected = _naive_average_linkage(d)
    assert sorted(link.merges[:, 2]) == pytest.approx(sorted(height for _, height in expected))
    heights = sorted(height for _, height in expected)
    for k in (2, 5, 8):  # halfway between two merges: no rounding can move a merge across the cut
        threshold = (heights[k] + heights[k + 1]) / 2
        assert groups.clusters(link, threshold) == _cut(expected, threshold)
    # the leaf order lays out every cluster of the tree side by side
    position = {leaf: index for index, leaf in enumerate(link.order)}
    assert sorted(position) == list(range(12))
    for cluster, _ in expected:
        places = sorted(position[leaf] for leaf in cluster)
        assert places[-1] - places[0] == len(places) - 1, sorted(cluster)
