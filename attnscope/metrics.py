"""Per-head attention statistics: pure functions of attention tensors (no model, no I/O).

Notation: A is one head's attention map of one window of `length` real tokens, A[i, j] the weight query row i puts
on key j (Σ_j A[i, j] = 1). In a decoder (causal, GPT-2) row i sees keys 0 <= j <= i; in an encoder (bidirectional,
BERT) every row sees all `length` keys. Every statistic is a mean over the *scored rows*, pooled over all windows
(a long text weighs more than a short one); padded rows are not text.

Decoders: scored rows are 1 <= i < length. Row 0 sees only itself, so every quantity there is fixed by construction
(A[0, 0] = 1, entropy 0) and carries no information about the head.

    previous_token      mean_i A[i, i-1]
    first_token         mean_i A[i, 0]                       (attention sink)
    self                mean_i A[i, i]
    local               mean_i Σ_{j = max(1, i-w)}^{i} A[i, j]   (current token and the w before it, token 0 excluded)
    local_uniform       mean_i |{max(1, i-w) .. i}| / (i + 1)    (what `local` would be for uniform attention)
    entropy             mean_i -Σ_j A[i, j] ln A[i, j]           (nats)
    entropy_normalized  mean_i (-Σ_j A[i, j] ln A[i, j]) / ln(i + 1)   (1.0 = uniform over the visible keys)
    confidence          mean_i max_j A[i, j]                     (Voita et al. 2019)

Encoders: scored rows are 1 <= i <= length-2, every row but the first and the last token (with [CLS] … [SEP] on,
exactly the text's tokens), so every scored row has a previous and a next token; a window of fewer than 3 tokens
scores nothing. The same definitions hold with every key visible, and two more scores:

    next_token          mean_i A[i, i+1]
    last_token          mean_i A[i, length-1]                (the [SEP] sink, beside first_token's [CLS])
    local               mean_i Σ_{j = max(1, i-w)}^{min(length-2, i+w)} A[i, j]   (symmetric; first and last excluded)
    local_uniform       mean_i |{max(1, i-w) .. min(length-2, i+w)}| / length
    entropy_normalized  mean_i (-Σ_j A[i, j] ln A[i, j]) / ln(length)   (1.0 = uniform over all keys)

For decoders next_token and last_token are not defined (None in the outputs).

On the repeated-random-token probe (BOS, then T random tokens, then the same T again; Olsson et al. 2022), for
every query i of the second copy (decoders only: the probe measures left-to-right copying):

    induction           mean_i A[i, i-(T-1)]    (the token right after the earlier occurrence of token i)
    duplicate_token     mean_i A[i, i-T]        (the earlier occurrence itself)

Derived, from the means: local_lift = (local - local_uniform) / (1 - local_uniform): 0 for uniform attention,
1 when all attention stays in the window, so a uniform head on a short text is not mistaken for a local one.
"""

from __future__ import annotations

import torch

ROW_SCORES = (
    "previous_token",
    "first_token",
    "self",
    "local",
    "entropy",
    "entropy_normalized",
    "confidence",
)
ENCODER_SCORES = ("next_token", "last_token")  # row scores of encoders only
SCORES = ROW_SCORES + ("local_uniform", "local_lift")
ALL_SCORES = SCORES + ENCODER_SCORES
DEFAULT_WINDOW = 3


def row_score_names(causal: bool = True) -> tuple[str, ...]:
    """The row scores summed for a decoder (`causal`) or an encoder, in the order of the sums' last dim."""
    return ROW_SCORES if causal else ROW_SCORES + ENCODER_SCORES


def encoder_window_mask(positions: torch.Tensor, lengths: torch.Tensor, n_keys: int, window: int) -> torch.Tensor:
    """(B, b, n_keys) bool: key j is in the symmetric local window of the query at `positions[r]` of a window of
    `lengths[B]` tokens, max(1, i-w) <= j <= min(length-2, i+w)."""
    keys = torch.arange(n_keys, device=positions.device)  # (n,)
    low = (positions - window).clamp(min=1)  # (b,)
    high = torch.minimum(positions[None, :] + window, lengths[:, None] - 2)  # (B, b)
    return (keys[None, None, :] >= low[None, :, None]) & (keys[None, None, :] <= high[:, :, None])  # (B, b, n)


def window_mask(positions: torch.Tensor, n_keys: int, window: int) -> torch.Tensor:
    """(b, n_keys) bool: key j is in the local window of the query at `positions[r]`, max(1, i-w) <= j <= i."""
    keys = torch.arange(n_keys, device=positions.device)  # (n,)
    low = (positions - window).clamp(min=1)  # (b,)
    return (keys[None, :] >= low[:, None]) & (keys[None, :] <= positions[:, None])  # (b, n)


def row_scores(
    attn: torch.Tensor,
    positions: torch.Tensor,
    window: int = DEFAULT_WINDOW,
    lengths: torch.Tensor | None = None,
    causal: bool = True,
) -> dict[str, torch.Tensor]:
    """Every row statistic for a block of query rows (the reference form: from probabilities).

    attn: (B, H, b, n) attention probabilities of query rows `positions` (b,) over keys 0..n-1; lengths (B,) real
    tokens per window, needed when not `causal` (an encoder).
    Returns name -> (B, H, b). Values at rows that are not scored (row 0, padding) are meaningless; weight them 0.
    """
    if not causal:
        return _encoder_row_scores(attn, positions, window, lengths)
    B, H, b, n = attn.shape
    index_shape = (B, H, b, 1)
    previous = (positions - 1).clamp(min=0).view(1, 1, b, 1).expand(index_shape)  # (B, H, b, 1)
    current = positions.view(1, 1, b, 1).expand(index_shape)  # (B, H, b, 1)
    entropy = -torch.special.xlogy(attn, attn).sum(-1)  # (B, H, b); 0·ln 0 = 0
    visible = (positions + 1).to(attn.dtype)  # (b,) keys a causal row sees
    return {
        "previous_token": attn.gather(-1, previous).squeeze(-1),  # (B, H, b)
        "first_token": attn[..., 0],  # (B, H, b)
        "self": attn.gather(-1, current).squeeze(-1),  # (B, H, b)
        "local": (attn * window_mask(positions, n, window)).sum(-1),  # (B, H, b)
        "entropy": entropy,
        "entropy_normalized": entropy / torch.log(visible).clamp(min=1e-12),  # (B, H, b)
        "confidence": attn.amax(-1),  # (B, H, b)
    }


def _encoder_row_scores(
    attn: torch.Tensor, positions: torch.Tensor, window: int, lengths: torch.Tensor
) -> dict[str, torch.Tensor]:
    """`row_scores` of a bidirectional map: attn (B, H, b, n), every key visible; lengths (B,)."""
    B, H, b, n = attn.shape

    def at(keys: torch.Tensor) -> torch.Tensor:  # keys (B, b) -> A[.., r, keys[B, r]] (B, H, b)
        index = keys.clamp(0, n - 1).view(B, 1, b, 1).expand(B, H, b, 1)  # (B, H, b, 1)
        return attn.gather(-1, index).squeeze(-1)

    rows = positions[None, :].expand(B, b)  # (B, b)
    entropy = -torch.special.xlogy(attn, attn).sum(-1)  # (B, H, b); 0·ln 0 = 0
    visible = lengths.to(attn.dtype)[:, None, None]  # (B, 1, 1) every real key is visible
    return {
        "previous_token": at(rows - 1),
        "first_token": attn[..., 0],  # (B, H, b)
        "self": at(rows),
        "local": (attn * encoder_window_mask(positions, lengths, n, window)[:, None]).sum(-1),  # (B, H, b)
        "entropy": entropy,
        "entropy_normalized": entropy / torch.log(visible).clamp(min=1e-12),  # (B, H, b)
        "confidence": attn.amax(-1),  # (B, H, b)
        "next_token": at(rows + 1),
        "last_token": at((lengths - 1)[:, None].expand(B, b)),
    }


def gathered_keys(positions: torch.Tensor, window: int = DEFAULT_WINDOW) -> torch.Tensor:
    """(b, w+2) the keys `layer_row_scores` needs for rows `positions`: i, i-1, ..., i-w (clamped at 0), then 0."""
    offsets = torch.arange(window + 1, device=positions.device)  # (w+1,) 0 = self, 1 = previous, ...
    window_keys = (positions[:, None] - offsets[None, :]).clamp(min=0)  # (b, w+1)
    return torch.cat([window_keys, torch.zeros_like(positions)[:, None]], dim=1)  # (b, w+2)


def encoder_offsets(window: int, device: torch.device | None = None) -> torch.Tensor:
    """(2w+1,) key offsets of an encoder's local window in gathered order: 0 (self), -1 .. -w, +1 .. +w."""
    back = -torch.arange(window + 1, device=device)  # (w+1,) 0, -1, ..., -w
    return torch.cat([back, torch.arange(1, window + 1, device=device)])  # (2w+1,)


def encoder_gathered_keys(positions: torch.Tensor, lengths: torch.Tensor, window: int = DEFAULT_WINDOW) -> torch.Tensor:
    """(B, b, 2w+3) the keys `layer_row_scores` needs for rows `positions` of an encoder's windows of `lengths`:
    i, i-1, ..., i-w, i+1, ..., i+w, then 0 and length-1 (the last real token, which differs per window); every
    key clamped into 0..length-1 (a clamped key is never inside a scored row's window)."""
    offsets = encoder_offsets(window, positions.device)  # (2w+1,)
    window_keys = positions[:, None] + offsets[None, :]  # (b, 2w+1)
    last = (lengths - 1)[:, None, None]  # (B, 1, 1)
    B, b = lengths.shape[0], positions.shape[0]
    keys = torch.cat(
        [window_keys[None].expand(B, -1, -1), torch.zeros_like(last).expand(B, b, 1), last.expand(B, b, 1)], dim=-1
    )  # (B, b, 2w+3)
    return torch.minimum(keys.clamp(min=0), last)


def layer_row_scores(
    normalizer: torch.Tensor,
    expected_logit: torch.Tensor,
    gathered: torch.Tensor,
    window: int = DEFAULT_WINDOW,
    lengths: torch.Tensor | None = None,
    causal: bool = True,
) -> dict[str, torch.Tensor]:
    """The statistics of `row_scores` for every row of a layer (window >= 1), without any (n × n) tensor; an
    encoder (`causal` False) needs `lengths` (B,) and keys from `encoder_gathered_keys`.

    With s_ij the scaled logits shifted so each row's maximum is 0 (the capture's form), the inputs are per row
    (all (B, H, n)): normalizer Z_i = Σ_j exp(s_ij), expected_logit = Σ_j A_ij s_ij, and `gathered` (B, H, n, w+2)
    s_ij at the keys of `gathered_keys`. Then exactly, with A_ij = exp(s_ij) / Z_i:
        confidence = max_j A_ij = 1 / Z_i               (the row maximum is exp(0))
        entropy    = -Σ_j A_ij ln A_ij = ln Z_i - expected_logit
        A at keys i, i-1, ..., i-w, 0 = exp(gathered) / Z_i
    """
    if not causal:
        return _encoder_layer_row_scores(normalizer, expected_logit, gathered, window, lengths)
    n = normalizer.shape[-1]
    positions = torch.arange(n, device=normalizer.device)  # (n,)
    probs = torch.exp(gathered) / normalizer[..., None]  # (B, H, n, w+2)
    in_window = (positions[:, None] - torch.arange(window + 1, device=normalizer.device) >= 1).to(probs.dtype)
    entropy = torch.log(normalizer) - expected_logit  # (B, H, n)
    return {
        "previous_token": probs[..., 1],
        "first_token": probs[..., -1],
        "self": probs[..., 0],
        "local": (probs[..., : window + 1] * in_window).sum(-1),  # (B, H, n); token 0 is never local
        "entropy": entropy,
        "entropy_normalized": entropy / torch.log((positions + 1).to(entropy.dtype)).clamp(min=1e-12),
        "confidence": 1.0 / normalizer,
    }


def _encoder_layer_row_scores(
    normalizer: torch.Tensor, expected_logit: torch.Tensor, gathered: torch.Tensor, window: int, lengths: torch.Tensor
) -> dict[str, torch.Tensor]:
    """`layer_row_scores` of an encoder: gathered (B, H, n, 2w+3) at the keys of `encoder_gathered_keys`."""
    n = normalizer.shape[-1]
    positions = torch.arange(n, device=normalizer.device)  # (n,)
    probs = torch.exp(gathered) / normalizer[..., None]  # (B, H, n, 2w+3)
    keys = positions[:, None] + encoder_offsets(window, normalizer.device)[None, :]  # (n, 2w+1) unclamped
    in_window = (keys[None] >= 1) & (keys[None] <= (lengths - 2)[:, None, None])  # (B, n, 2w+1)
    entropy = torch.log(normalizer) - expected_logit  # (B, H, n)
    visible = lengths.to(entropy.dtype)[:, None, None]  # (B, 1, 1)
    return {
        "previous_token": probs[..., 1],
        "first_token": probs[..., -2],
        "self": probs[..., 0],
        "local": (probs[..., : 2 * window + 1] * in_window[:, None].to(probs.dtype)).sum(-1),  # (B, H, n)
        "entropy": entropy,
        "entropy_normalized": entropy / torch.log(visible).clamp(min=1e-12),
        "confidence": 1.0 / normalizer,
        "next_token": probs[..., window + 1],
        "last_token": probs[..., -1],
    }


def local_uniform(
    positions: torch.Tensor, window: int = DEFAULT_WINDOW, lengths: torch.Tensor | None = None, causal: bool = True
) -> torch.Tensor:
    """Share of the visible keys that lie in the local window: `local` for uniform attention. (b,) for a decoder;
    (B, b) for an encoder, whose window and visible keys depend on each window's length."""
    if not causal:
        high = torch.minimum(positions[None, :] + window, lengths[:, None] - 2)  # (B, b)
        size = (high - (positions - window).clamp(min=1)[None, :] + 1).clamp(min=0)  # (B, b)
        return size.to(torch.float64) / lengths[:, None].to(torch.float64)
    in_window = positions - (positions - window).clamp(min=1) + 1  # (b,)
    return in_window.to(torch.float64) / (positions + 1).to(torch.float64)


def scored_rows(lengths: torch.Tensor, positions: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """(B, b) bool: query row `positions[r]` of window `B` is scored: real text (< length) and not row 0; for an
    encoder also not the last token (rows 1 .. length-2)."""
    last = lengths[:, None] - (1 if causal else 2)  # (B, 1)
    return (positions[None, :] >= 1) & (positions[None, :] <= last)


def weighted_row_sums(
    attn: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor, window: int = DEFAULT_WINDOW, causal: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sums over scored rows of one block of probabilities attn (B, H, b, n), ready to accumulate exactly across
    blocks, layers and texts.

    Returns (sums (H, S) float64 with S = len(row_score_names(causal)), local_uniform sum (scalar float64), scored
    row count (scalar)).
    """
    scores = row_scores(attn, positions, window, lengths, causal)
    return sum_scored_rows(scores, positions, lengths, window, causal)


def sum_scored_rows(
    scores: dict[str, torch.Tensor],
    positions: torch.Tensor,
    lengths: torch.Tensor,
    window: int = DEFAULT_WINDOW,
    causal: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row scores (name -> (B, H, b)) summed over the scored rows: (sums (H, S) float64, local_uniform sum, count)."""
    scored = scored_rows(lengths, positions, causal)  # (B, b)
    stacked = torch.stack([scores[name] for name in row_score_names(causal)], dim=-1)  # (B, H, b, S)
    stacked = torch.where(scored[:, None, :, None], stacked, 0.0)  # padded rows may hold anything, even NaN
    sums = stacked.sum(dim=(0, 2), dtype=torch.float64)  # (H, S)
    uniform = (local_uniform(positions, window, lengths, causal) * scored).sum()  # scalar
    return sums, uniform, scored.sum()


def finish(sums: torch.Tensor, uniform_sum: float, count: int, causal: bool = True) -> dict[str, torch.Tensor]:
    """Means from accumulated sums: name -> (..., H) tensor, plus `local_uniform` and `local_lift` (and, for an
    encoder, `next_token` and `last_token`)."""
    if count == 0:
        raise ValueError("no scored rows: every window is too short to score")
    means = sums / count  # (..., H, S)
    result = {name: means[..., k] for k, name in enumerate(row_score_names(causal))}
    uniform = torch.full_like(result["local"], uniform_sum / count)
    result["local_uniform"] = uniform
    result["local_lift"] = (result["local"] - uniform) / (1.0 - uniform)
    return result


def head_scores(
    attn: torch.Tensor, lengths: torch.Tensor, window: int = DEFAULT_WINDOW, causal: bool = True
) -> dict[str, torch.Tensor]:
    """Every statistic of every head from full maps.

    attn: (B, H, n, n) attention (causal, or an encoder's) of B right-padded windows; lengths: (B,) real tokens
    per window. Returns name -> (H,) float64 means over the scored rows of all windows.
    """
    positions = torch.arange(attn.shape[-2], device=attn.device)  # (n,)
    sums, uniform, count = weighted_row_sums(attn, positions, lengths, window, causal)
    return finish(sums, float(uniform), int(count), causal)


def offset_attention(attn: torch.Tensor, positions: torch.Tensor, offset: int) -> torch.Tensor:
    """(B, H, b): A[i, i + offset] for the query rows `positions` (offset <= 0; 0 where i + offset < 0)."""
    B, H, b, _ = attn.shape
    keys = positions + offset  # (b,)
    gathered = attn.gather(-1, keys.clamp(min=0).view(1, 1, b, 1).expand(B, H, b, 1)).squeeze(-1)  # (B, H, b)
    return torch.where(keys[None, None, :] >= 0, gathered, 0.0)


# ---------------------------------------------------------------------------------------------------------------
# Diversity between heads.
#
#   cosine(h, g)  = Σ A_h·A_g / sqrt(Σ A_h² · Σ A_g²), the sums running over every scored row of every window and
#                   every key: the cosine of the two heads' maps flattened and concatenated over all texts (so many
#                   texts give one number, and a long text weighs by its entries).
#   JSD(p, q)     = H(m) - (H(p) + H(q)) / 2 with m = (p + q) / 2 and H in bits: 0 = identical, 1 = disjoint.
#   js(h, g)      = mean over scored rows of JSD(A_h[i], A_g[i]);   js_distance(h, g) = mean of sqrt(JSD) per row
#                   (scipy.spatial.distance.jensenshannon(p, q, base=2) is that square root for one row).
# ---------------------------------------------------------------------------------------------------------------

LN2 = 0.6931471805599453


TINY = 1e-30  # stands in for 0 inside a logarithm: 1e-30 · ln 1e-30 ≈ -7e-29, far below float64 resolution


def entropy_bits(p: torch.Tensor) -> torch.Tensor:
    """Σ_j -p_j log2 p_j over the last dim (0·log 0 = 0)."""
    return -torch.special.xlogy(p, p).sum(-1) / LN2


def _sum_xlogx(x: torch.Tensor) -> torch.Tensor:
    """Σ_j x_j ln x_j over the last dim, zeros counting 0: the fast form of the pairwise loop (a clamp, a log and
    a dot product: ~2.7× faster on CPU than xlogy followed by a sum, which matters at K² pairs per row)."""
    clamped = x.clamp(min=TINY)
    return torch.einsum("...n,...n->...", clamped, clamped.log())


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen–Shannon divergence in bits between distributions along the last dim (broadcasting), >= 0."""
    return (entropy_bits((p + q) / 2) - (entropy_bits(p) + entropy_bits(q)) / 2).clamp(min=0.0)


def pairwise_sums(
    attn: torch.Tensor,
    scored: torch.Tensor,
    positions: torch.Tensor | None = None,
    budget_bytes: int = 64 * 2**20,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sums over scored rows for every pair of the K heads of `attn` (B, K, b, n), scored (B, b) bool.

    Returns (dot products (K, K), JSD sums (K, K), sqrt-JSD sums (K, K)), float64, symmetric. Work goes in chunks
    of rows and heads so that no intermediate exceeds about `budget_bytes`; only pairs g >= k are computed (the
    matrices are symmetric), and with `positions` (b,) of causal rows the keys after a chunk's last row, zero in
    every scored row, are skipped. The divergences are computed in float64.
    """
    B, K, b, n = attn.shape
    device = attn.device
    dots = torch.zeros(K, K, dtype=torch.float64, device=device)
    js = torch.zeros(K, K, dtype=torch.float64, device=device)
    js_root = torch.zeros(K, K, dtype=torch.float64, device=device)
    rows = max(1, min(b, 64, budget_bytes // max(1, 4 * B * K * n * 8)))
    for r0 in range(0, b, rows):
        r1 = min(b, r0 + rows)
        keys = n if positions is None else min(n, int(positions[r1 - 1]) + 1)
        scored_rows = scored[:, r0:r1]  # (B, r)
        if not bool(scored_rows.any()):
            continue
        weights = scored_rows.to(torch.float64)  # (B, r)
        block = torch.where(scored_rows[:, None, :, None], attn[:, :, r0:r1, :keys], 0.0)  # (B, K, r, keys)
        dots += torch.einsum("bkrn,bgrn->kg", block, block).to(torch.float64)  # (K, K)
        # JSD is a small difference of entropies of up to ln n nats: in float32 the rounding left ~2e-7 bits between
        # identical rows, which the square root of js_distance magnified to ~4e-4. In float64 it is ~1e-16.
        wide = block.to(torch.float64)  # (B, K, r, keys)
        own = _sum_xlogx(wide)  # (B, K, r) Σ p ln p
        heads = max(1, min(K, budget_bytes // max(1, 3 * B * K * (r1 - r0) * keys * 8)))
        for k0 in range(0, K, heads):
            k1 = min(K, k0 + heads)
            mixed = torch.lerp(wide[:, k0:k1, None], wide[:, None, k0:], 0.5)  # (B, k, K - k0, r, keys) m = (p + q) / 2
            # H(m) - (H(p) + H(q)) / 2 nats, with no shortcut that assumes Σ p = 1 (float32 rows miss it by ~1e-7)
            divergence = ((own[:, k0:k1, None] + own[:, None, k0:]) / 2 - _sum_xlogx(mixed)).clamp(min=0.0) / LN2  # bits
            js[k0:k1, k0:] += torch.einsum("bkgr,br->kg", divergence, weights)  # (k, K - k0)
            js_root[k0:k1, k0:] += torch.einsum("bkgr,br->kg", divergence.sqrt(), weights)  # (k, K - k0)
    upper = torch.triu(torch.ones(K, K, dtype=torch.bool, device=device))  # (K, K), diagonal included
    js = torch.where(upper, js, js.T)
    js_root = torch.where(upper, js_root, js_root.T)
    return dots, js, js_root
