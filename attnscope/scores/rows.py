"""Per-head statistics from per-row statistics: exact sums over scored rows, and their means.

Every statistic is a mean over the *scored rows* (see `scores.kinds`), pooled over all windows (a long text weighs
more than a short one); padded rows are not text. Sums are float64 and counts integers, so partial sums over blocks,
layers, batches, runs and processes add up exactly.

Derived, from the means: local_lift = (local - local_uniform) / (1 - local_uniform): 0 for uniform attention,
1 when all attention stays in the window, so a uniform head on a short text is not mistaken for a local one.

On the repeated-random-token probe (BOS, then T random tokens, then the same T again; Olsson et al. 2022), for
every query i of the second copy (decoders only: the probe measures left-to-right copying):

    induction           mean_i A[i, i-(T-1)]    (the token right after the earlier occurrence of token i)
    duplicate_token     mean_i A[i, i-T]        (the earlier occurrence itself)

On the needle-in-a-haystack probe (`pipeline.needle`: a haystack holding a cue and a needle n_0 … n_{N-1}, then the
cue and the needle again, the copy; Wu et al. 2024, teacher-forced), over the rows q_k whose next token is the copy's
n_k, k = 0 … N-1, of every window w (decoders only):

    retrieval           (1 / (W·N)) Σ_w Σ_k 1[argmax_j A_w[q_k, j] = s_w + k]

with s_w the position of n_0 in window w's haystack: the share of the needle's tokens at which the head's strongest
key (the first of maximal weight, as torch.argmax breaks ties) is the needle token being copied. Wu et al. count
+1/N at each step of the model's own greedy decoding where the top-1 key lies in the needle and holds the token just
generated (their retrieval_head_detection.py); with a needle of distinct tokens found nowhere else that key is s_w + k.
Teacher-forced, the copy is given rather than generated, so the score says where the head looks whether or not the
model would have copied: it does not need the language-model head, and it counts rows where the model would have
generated something else, which Wu et al. do not see (they also keep only tests the model answered, ROUGE-1 recall
> 0.5).
"""

from __future__ import annotations

import torch

from attnscope.scores import catalog
from attnscope.scores.kinds import DEFAULT_WINDOW, Kind

PROBE_SCORES = tuple(score.name for score in catalog.SCORES if score.source == catalog.PROBE)  # in the sums' order


def sum_scored_rows(
    kind: Kind, scores: dict[str, torch.Tensor], positions: torch.Tensor, lengths: torch.Tensor, layers: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row scores (name -> (B, H, b), and `local_uniform` (B, b)) summed over the scored rows: (sums (H, S) float64
    in the order of `kind.row_score_names`, local_uniform sum (scalar float64), scored row count (scalar)).

    With `layers` = L > 0 the windows are L layers' windows one layer after the other (B = L·B', layer-major, see
    pipeline.blocks.LayerRows.stack), and each layer keeps its own sums: (L, H, S), (L,) and (L,). (The L layers
    may be those of several batches of the same shape.)"""
    scored = kind.scored_rows(lengths, positions)  # (B, b)
    # scores side by side along a first dimension: a stack along the last one writes them element by element
    stacked = torch.stack([scores[name] for name in kind.row_score_names])  # (S, B, H, b)
    stacked = torch.where(scored[:, None], stacked, 0.0)  # padded rows may hold anything, even NaN
    uniform = torch.where(scored, scores["local_uniform"], 0.0)  # (B, b)
    if not layers:
        return stacked.sum(dim=(1, 3), dtype=torch.float64).T, uniform.sum(), scored.sum()  # (H, S), (), ()
    S, B, H, b = stacked.shape
    sums = stacked.view(S, layers, B // layers, H, b).sum(dim=(2, 4), dtype=torch.float64)  # (S, L, H)
    return sums.permute(1, 2, 0), uniform.view(layers, -1).sum(-1), scored.view(layers, -1).sum(-1)


def finish(kind: Kind, sums: torch.Tensor, uniform_sum: torch.Tensor | float, count: int) -> dict[str, torch.Tensor]:
    """Means from accumulated sums (..., H, S) and local_uniform sums (...,) (one per layer, since a sliding window
    changes what uniform attention puts in the local window): name -> (..., H) tensor, with `local_uniform` and
    `local_lift`."""
    if count == 0:
        raise ValueError("no scored rows: every window is too short to score")
    means = sums / count  # (..., H, S)
    result = {name: means[..., k] for k, name in enumerate(kind.row_score_names)}
    uniform = torch.as_tensor(uniform_sum, dtype=torch.float64) / count  # (...)
    uniform = uniform[..., None].expand_as(result["local"]).clone()  # (..., H)
    result["local_uniform"] = uniform
    result["local_lift"] = (result["local"] - uniform) / (1.0 - uniform)
    return result


def head_scores(
    kind: Kind,
    attn: torch.Tensor,
    lengths: torch.Tensor,
    window: int = DEFAULT_WINDOW,
    visible: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Every statistic of every head from full maps: attn (B, H, n, n) of B right-padded windows with `lengths`
    (B,) real tokens; `visible` (B, n, n) the keys each row sees (default: the kind's geometry). Returns name ->
    (H,) float64 means over the scored rows of all windows."""
    positions = torch.arange(attn.shape[-2], device=attn.device)  # (n,)
    scores = kind.row_scores(attn, positions, lengths, window, visible)
    sums, uniform, count = sum_scored_rows(kind, scores, positions, lengths)
    return finish(kind, sums, uniform, int(count))


def retrieval_hits(
    weights: torch.Tensor,
    positions: torch.Tensor,
    lengths: torch.Tensor,
    first_query: int,
    needle_starts: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Wu et al.'s hits on the needle probe (see the module docstring): weights (B, H, b, k) of query rows
    `positions` (b,), attention or anything increasing in it (the capture's exp of shifted logits), of windows of
    `lengths` (B,) whose copy is scored from row `first_query` to the row before the last token, and whose needle
    starts at `needle_starts` (B,). Returns (hits (H,) int64, the copy's rows among `positions` (scalar int64))."""
    copy = (positions[None, :] >= first_query) & (positions[None, :] < lengths[:, None] - 1)  # (B, b)
    targets = needle_starts[:, None] + (positions[None, :] - first_query)  # (B, b)
    strongest = weights.argmax(dim=-1)  # (B, H, b): the first key of maximal weight
    hits = (strongest == targets[:, None, :]) & copy[:, None, :]  # (B, H, b)
    return hits.sum(dim=(0, 2)), copy.sum()


def offset_attention(attn: torch.Tensor, positions: torch.Tensor, offset: int) -> torch.Tensor:
    """(B, H, b): A[i, i + offset] for the query rows `positions` (offset <= 0; 0 where i + offset < 0)."""
    B, H, b, _ = attn.shape
    keys = positions + offset  # (b,)
    gathered = attn.gather(-1, keys.clamp(min=0).view(1, 1, b, 1).expand(B, H, b, 1)).squeeze(-1)  # (B, H, b)
    return torch.where(keys[None, None, :] >= 0, gathered, 0.0)
