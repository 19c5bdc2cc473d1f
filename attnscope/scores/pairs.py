"""Diversity between heads: pairwise cosine and Jensen–Shannon sums over scored rows (pure tensor maths).

cosine(h, g)  = Σ A_h·A_g / sqrt(Σ A_h² · Σ A_g²), the sums running over every scored row of every window and
                every key: the cosine of the two heads' maps flattened and concatenated over all texts (so many
                texts give one number, and a long text weighs by its entries).
JSD(p, q)     = H(m) - (H(p) + H(q)) / 2 with m = (p + q) / 2 and H in bits: 0 = identical, 1 = disjoint.
js(h, g)      = mean over scored rows of JSD(A_h[i], A_g[i]);   js_distance(h, g) = mean of sqrt(JSD) per row
                (scipy.spatial.distance.jensenshannon(p, q, base=2) is that square root for one row).

How the pairs are computed (`row_divergences`): with s = p + q and Y(p, q) = Σ_j s_j log2 s_j (on rows scaled so
that s is near 1, see there),

    JSD(p, q) = [ (Y(p, p) + Y(q, q)) / 2 - Y(p, q) ] / 2  bits,

an identity (Σ m log2 m = Y(p, q)/2 - Σ s/2 and Σ p log2 p = Y(p, p)/2 - Σ p: the masses cancel, so rows
that miss Σ p = 1 by a rounding are still exact). One logarithm per pair and key, the least there is; the diagonal
Y(p, p) comes out of the same kernel as the pairs, so a head and its copy give bit-identical Y and JSD exactly 0.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

import numpy as np
import torch

from attnscope import threads

LN2 = 0.6931471805599453
TINY = 1e-30  # added to every s (as TINY/2 to each row) so that log2 s is finite: 1e-30 · log2 1e-30 ≈ -1e-28
# Pair terms (heads × rows × keys) computed at once: a few MiB, so that s and log2 s stay in the cache.
PAIR_BUDGET_BYTES = 4 * 2**20
ROWS_PER_CHUNK = 16  # causal rows chunked by position: a chunk's keys end at its last row (≤ 15 wasted keys per row)


def entropy_bits(p: torch.Tensor) -> torch.Tensor:
    """Σ_j -p_j log2 p_j over the last dim (0·log 0 = 0)."""
    return -torch.special.xlogy(p, p).sum(-1) / LN2


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen–Shannon divergence in bits between distributions along the last dim (broadcasting), >= 0."""
    return (entropy_bits((p + q) / 2) - (entropy_bits(p) + entropy_bits(q)) / 2).clamp(min=0.0)


def pair_xlog2x(rows: torch.Tensor, budget_bytes: int = PAIR_BUDGET_BYTES) -> torch.Tensor:
    """Y[k, g, r] = Σ_j s_j log2 s_j with s = rows[k, r] + rows[g, r] + TINY, for rows (K, R, keys) of non-negative
    weights (not necessarily distributions): (K, K, R) in the dtype of `rows`, filled for g >= k only (else 0).

    Pairs go in pieces of (heads, R, keys) terms within `budget_bytes`. Every entry, the diagonal included, is
    reduced by the same operations over the same key count, so equal rows give bit-equal Y. Float32 rows on a CPU
    whose numpy has a vectorized float32 log2 go to `_pair_xlog2x_numpy`; the rest to `_pair_xlog2x_torch`.
    """
    if rows.device.type == "cpu" and rows.dtype == torch.float32 and numpy_log2_is_vectorized():
        return _pair_xlog2x_numpy(rows, budget_bytes)
    return _pair_xlog2x_torch(rows, budget_bytes)


@functools.cache
def numpy_log2_is_vectorized() -> bool:
    """Whether numpy's float32 log2 runs on AVX-512 here (numpy's dispatch, `numpy.lib.introspect`, numpy >= 2).

    The logarithm is most of the pairs' cost (one per pair and key), and on the 2-core AVX-512 CPU numpy's log2
    (SVML) took 0.25 ns per element against 1.0 ns for torch's log (SLEEF, 1-ulp): 4.5× faster, within 2.1 ulp
    (torch's: 0.9). Without AVX-512, numpy's float32 log2 is scalar (2.5 ns there) and torch's is used.
    """
    try:
        from numpy.lib.introspect import opt_func_info
    except ImportError:  # numpy 1.x
        return False
    for targets in opt_func_info(func_name="^log2$", signature="float32").get("log2", {}).values():
        return str(targets.get("current", "")).startswith(("X86_V4", "AVX512"))
    return False


def _pair_xlog2x_torch(rows: torch.Tensor, budget_bytes: int) -> torch.Tensor:
    """`pair_xlog2x` in torch operations, a block (k heads × K - k0 heads) at a time on the device of `rows`."""
    K, R, keys = rows.shape
    shifted = rows + TINY / 2  # (K, R, keys)
    Y = torch.zeros(K, K, R, dtype=rows.dtype, device=rows.device)
    heads = max(1, min(K, budget_bytes // max(1, K * R * keys * rows.element_size())))
    for k0 in range(0, K, heads):
        k1 = min(K, k0 + heads)
        s = shifted[k0:k1, None] + shifted[None, k0:]  # (k, K - k0, R, keys) s = p + q
        Y[k0:k1, k0:] = torch.log2(s).mul_(s).sum(-1)  # (k, K - k0, R) Σ s log2 s
    return Y


def _pair_xlog2x_numpy(rows: torch.Tensor, budget_bytes: int) -> torch.Tensor:
    """`pair_xlog2x` for float32 rows on the CPU, in numpy, the pieces shared among torch's count of threads.

    A piece is one head k against up to `budget_bytes` worth of heads g >= k: s = p_k + p_g, log2 s, and Σ_j s·log2 s
    in one einsum, in buffers each thread keeps. Each piece is computed the same way whichever thread takes it, so
    the result does not depend on the threads. On the 2-core CPU, for the 144 heads of GPT-2 over a window of 400
    tokens in chunks of 16 rows: 0.35 s, against 0.82 s for the torch kernel on 2 threads (0.58 s on one thread).
    """
    K, R, keys = rows.shape
    shifted = (rows.detach() + TINY / 2).numpy()  # (K, R, keys)
    Y = np.zeros((K, K, R), dtype=np.float32)
    per_head = R * keys
    heads = max(1, min(K, budget_bytes // max(1, per_head * 4)))
    pieces = [(k, g0, min(K, g0 + heads)) for k in range(K) for g0 in range(k, K, heads)]

    def run(share: list[tuple[int, int, int]]) -> None:
        s = np.empty((heads, R, keys), dtype=np.float32)
        logs = np.empty_like(s)
        for k, g0, g1 in share:
            np.add(shifted[k], shifted[g0:g1], out=s[: g1 - g0])  # (g, R, keys) s = p + q
            np.log2(s[: g1 - g0], out=logs[: g1 - g0])
            Y[k, g0:g1] = np.einsum("grj,grj->gr", s[: g1 - g0], logs[: g1 - g0])  # (g, R) Σ s log2 s

    workers = min(torch.get_num_threads(), len(pieces))
    if workers <= 1 or threads.in_worker():
        run(pieces)
    else:  # pieces dealt round the threads: each share has small and large pieces
        list(threads.pool(workers, os.getpid()).map(run, [pieces[w::workers] for w in range(workers)]))
    return torch.from_numpy(Y)


def row_divergences(rows: torch.Tensor, budget_bytes: int = PAIR_BUDGET_BYTES) -> torch.Tensor:
    """JSD in bits between every pair of heads, row by row: rows (K, R, keys) -> (K, K, R) float64, symmetric.

    Each row r is first scaled by a power of two a_r (exact in floating point) that brings its typical weight to
    about 1/2, so that s' = a_r (p + q) is near 1 and the rounding of log2 s' is small in absolute terms; the identity
    holds for any a_r (the masses cancel): JSD = [ (Y'(p, p) + Y'(q, q)) / 2 - Y'(p, q) ] / (2 a_r).
    Float32 rows are computed in float32 (float64 ones in float64) and combined in float64. The error of a row's
    JSD is that of its three Σ s' log2 s' sums, about ε_32 · Σ_j |s'_j log2 s'_j| / a_r: measured below 2e-6
    bits per row from near-uniform to peaked rows of 400 keys (typically 1e-8 to 1e-7), and smaller still in a
    mean over many rows, where the roundings partly cancel. Identical rows give exactly 0 (bit-equal Y'); the tiny
    negative differences roundings leave are clamped to 0.
    """
    typical = rows.square().sum(-1).mean(0).clamp(min=TINY)  # (R,) Σ_j p_j², the mass-weighted mean weight
    scale = torch.exp2(torch.round(-torch.log2(2 * typical)))  # (R,) a power of two
    Y = pair_xlog2x(rows * scale[:, None], budget_bytes).to(torch.float64)  # (K, K, R), g >= k filled
    upper = torch.triu(torch.ones(Y.shape[:2], dtype=torch.bool, device=Y.device))  # (K, K)
    Y = torch.where(upper[..., None], Y, Y.transpose(0, 1))  # (K, K, R) symmetric
    own = Y.diagonal(dim1=0, dim2=1).T  # (K, R) Y'(p, p)
    divergence = ((own[:, None] + own[None, :]) / 2 - Y).clamp_(min=0.0)  # (K, K, R) bits · 2 a_r
    return divergence / (2 * scale.to(torch.float64))


def _row_chunks(
    attn: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor | None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The rows of `attn` (B, K, b, n) that `rows` (B, b) marks, ROWS_PER_CHUNK positions at a time: (compact rows
    (K, R, keys), window of each row (R,)). With `positions` (b,) of causal rows, a chunk's keys end at its last
    row (the later keys are zero in every one of its rows)."""
    B, K, b, n = attn.shape
    for r0 in range(0, b, ROWS_PER_CHUNK):
        r1 = min(b, r0 + ROWS_PER_CHUNK)
        marked = rows[:, r0:r1]  # (B, r)
        if not bool(marked.any()):
            continue
        keys = n if positions is None else min(n, int(positions[r1 - 1]) + 1)
        compact = attn[:, :, r0:r1, :keys].transpose(0, 1)[:, marked]  # (K, R, keys), rows in (window, row) order
        yield compact, marked.nonzero()[:, 0]  # (R,) the window of each row


def pairwise_sums(
    attn: torch.Tensor,
    scored: torch.Tensor,
    positions: torch.Tensor | None = None,
    budget_bytes: int = PAIR_BUDGET_BYTES,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sums over scored rows for every pair of the K heads of `attn` (B, K, b, n), scored (B, b) bool.

    Returns (dot products (K, K), JSD sums (K, K), sqrt-JSD sums (K, K)), float64, symmetric: the dot products
    from a float32 (or float64) matmul, the divergences from `row_divergences`. With `positions` (b,) of causal
    rows the keys after a chunk's last row are skipped. Unscored rows are never read (they may hold anything).
    """
    K = attn.shape[1]
    dots = torch.zeros(K, K, dtype=torch.float64, device=attn.device)
    js = torch.zeros_like(dots)
    js_root = torch.zeros_like(dots)
    for compact, _ in _row_chunks(attn, scored, positions):
        flat = compact.reshape(K, -1)  # (K, R·keys)
        dots += (flat @ flat.T).to(torch.float64)  # (K, K)
        divergence = row_divergences(compact, budget_bytes)  # (K, K, R) bits
        js += divergence.sum(-1)
        js_root += divergence.sqrt().sum(-1)
    return dots, js, js_root


def pairwise_dots(attn: torch.Tensor, scored: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """(K, K) float64 Σ A_h·A_g over the scored rows of `attn` (B, K, b, n) (the numerator of the cosine)."""
    K = attn.shape[1]
    dots = torch.zeros(K, K, dtype=torch.float64, device=attn.device)
    for compact, _ in _row_chunks(attn, scored, positions):
        flat = compact.reshape(K, -1)  # (K, R·keys)
        dots += (flat @ flat.T).to(torch.float64)
    return dots


def window_divergence_sums(
    attn: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor | None = None,
    budget_bytes: int = PAIR_BUDGET_BYTES,
) -> torch.Tensor:
    """Per window, sums over the rows marked in `rows` (B, b) of attn (B, K, b, n): (3, B, K, K) float64 holding
    Σ JSD, Σ sqrt(JSD) and Σ JSD² (bits) for every pair of heads (the sums a stratified estimate needs)."""
    B, K = attn.shape[:2]
    sums = torch.zeros(3, B, K, K, dtype=torch.float64, device=attn.device)
    for compact, window in _row_chunks(attn, rows, positions):
        divergence = row_divergences(compact, budget_bytes).permute(2, 0, 1)  # (R, K, K)
        sums[0].index_add_(0, window, divergence)
        sums[1].index_add_(0, window, divergence.sqrt())
        sums[2].index_add_(0, window, divergence.square())
    return sums


def sample_rows(scored: torch.Tensor, count: int, seeds: list[int]) -> torch.Tensor:
    """(B, b) bool: `count` of each window's scored rows (all of them where it has no more), drawn uniformly
    without replacement by a generator seeded with that window's entry of `seeds`."""
    chosen = torch.zeros_like(scored)
    for window, seed in enumerate(seeds):
        candidates = scored[window].nonzero()[:, 0].cpu()  # (R_w,)
        if len(candidates) > count:
            order = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed))
            candidates = candidates[order[:count]]
        chosen[window, candidates.to(scored.device)] = True
    return chosen


def stratified_estimate(
    sums: torch.Tensor, squares: torch.Tensor, sampled: torch.Tensor, scored: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimate of Σ x over every scored row, and its variance, from a sample of rows per window (stratum).

    sums, squares: (B, K, K) Σ x and Σ x² over each window's N_w sampled rows; sampled, scored: (B,) N_w and R_w.
    Estimate Σ_w (R_w / N_w) Σ_sample x; variance Σ_w R_w² (1 - N_w / R_w) s_w² / N_w, with s_w² the sample
    variance of x in window w (a window sampled whole, N_w = R_w, adds no variance; N_w >= 2 otherwise).
    """
    n = sampled.to(torch.float64).clamp(min=1)[:, None, None]  # (B, 1, 1)
    R = scored.to(torch.float64)[:, None, None]  # (B, 1, 1)
    estimate = (R / n * sums).sum(0)  # (K, K)
    spread = (squares - sums.square() / n).clamp(min=0.0) / (n - 1).clamp(min=1)  # (B, K, K) s_w²
    variance = (R.square() * (1 - n / R.clamp(min=1)) * spread / n).sum(0)  # (K, K)
    return estimate, variance


def similarity(
    dots: torch.Tensor, js_sum: torch.Tensor, js_root_sum: torch.Tensor, count: int
) -> dict[str, torch.Tensor]:
    """(K, K) cosine, js (mean JSD, bits) and js_distance (mean sqrt JSD) from the sums of `pairwise_sums` over
    `count` scored rows."""
    if count == 0:
        raise ValueError("no scored rows")
    norms = dots.diagonal().sqrt()
    return {
        "cosine": dots / (norms[:, None] * norms[None, :]).clamp(min=1e-300),
        "js": js_sum / count,
        "js_distance": js_root_sum / count,
    }
