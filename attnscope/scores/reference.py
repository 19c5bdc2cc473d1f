"""A from-scratch multi-head attention, independent of transformers: the yardstick for the capture.

Given the input x of an attention layer and its fused projection W_qkv (d, 3d) and b_qkv (3d,), as GPT-2's
`c_attn` Conv1D stores them (y = x W + b), it computes for every head h

    Q_h, K_h, V_h = the h-th d_head-wide slice of x W_q + b_q, x W_k + b_k, x W_v + b_v
    A_h = softmax(Q_h K_hᵀ · scale + M)          M: 0 where key j <= query i (and j is a real token), else -inf
    out = concat_h(A_h V_h)

with scale = 1/√d_head unless given. An encoder (BERT) has no causal mask (M masks padded keys only) and keeps W_Q,
W_K, W_V as three `nn.Linear` layers (y = x Wᵀ + b, weight (out, in)): `bidirectional_attention` takes those.
Nothing here is shared with the capture code: it is what the tests compare
the capture against, and what later benchmarks time.
"""

from __future__ import annotations

import math

import torch


def split_heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, n, d) -> (B, H, n, d/H)."""
    B, n, d = x.shape
    return x.reshape(B, n, n_head, d // n_head).permute(0, 2, 1, 3)


def multi_head_attention(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor,
    n_head: int,
    lengths: torch.Tensor | None = None,
    causal: bool = True,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output (B, n, d) and weights (B, H, n, n) of x (B, n, d).

    lengths (B,): real tokens per sequence; keys at or past a sequence's length are masked out.
    """
    B, n, d = x.shape
    qkv = x @ w_qkv + b_qkv  # (B, n, 3d)
    q, k, v = (split_heads(part, n_head) for part in qkv.split(d, dim=-1))  # each (B, H, n, d_head)
    scale = 1.0 / math.sqrt(d // n_head) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale  # (B, H, n, n)
    allowed = torch.ones(n, n, dtype=torch.bool, device=x.device)  # (n, n)
    if causal:
        allowed = torch.tril(allowed)
    allowed = allowed.expand(B, n, n)  # (B, n, n)
    if lengths is not None:
        real_key = torch.arange(n, device=x.device)[None, :] < lengths[:, None]  # (B, n)
        allowed = allowed & real_key[:, None, :]
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))  # (B, H, n, n)
    weights = torch.softmax(scores, dim=-1)  # (B, H, n, n); fully masked rows become NaN: padding, never scored
    output = (weights.nan_to_num(0.0) @ v).permute(0, 2, 1, 3).reshape(B, n, d)  # (B, n, d)
    return output, weights


def bidirectional_attention(
    x: torch.Tensor,
    query: tuple[torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
    value: tuple[torch.Tensor, torch.Tensor],
    n_head: int,
    lengths: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """An encoder's attention: output (B, n, d) and weights (B, H, n, n) of x (B, n, d), every real key visible.

    query, key, value: (weight (d, d), bias (d,)) of `nn.Linear` layers (BERT's `attention.self.query` …), whose
    weight is (out, in): transposed here into the (in, out) layout of `multi_head_attention`.
    lengths (B,): real tokens per sequence; keys at or past a sequence's length are masked out.
    """
    w_qkv = torch.cat([query[0].T, key[0].T, value[0].T], dim=1)  # (d, 3d)
    b_qkv = torch.cat([query[1], key[1], value[1]])  # (3d,)
    return multi_head_attention(x, w_qkv, b_qkv, n_head, lengths=lengths, causal=False, scale=scale)


def numpy_mha_loop(x, w_qkv, b_qkv, n_head: int, causal: bool = True):
    """The tutorials' way: one head at a time in numpy. x (n, d) -> (output (n, d), weights (H, n, n))."""
    import numpy as np

    n, d = x.shape
    d_head = d // n_head
    qkv = x @ w_qkv + b_qkv  # (n, 3d)
    q, k, v = qkv[:, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :]
    mask = np.triu(np.ones((n, n), dtype=bool), k=1) if causal else np.zeros((n, n), dtype=bool)
    outputs, weights = [], []
    for h in range(n_head):
        part = slice(h * d_head, (h + 1) * d_head)
        scores = q[:, part] @ k[:, part].T / np.sqrt(d_head)  # (n, n)
        scores = np.where(mask, -np.inf, scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        attn = scores / scores.sum(axis=-1, keepdims=True)  # (n, n)
        outputs.append(attn @ v[:, part])  # (n, d_head)
        weights.append(attn)
    return np.concatenate(outputs, axis=-1), np.stack(weights)


def numpy_mha_batched(x, w_qkv, b_qkv, n_head: int, causal: bool = True):
    """All heads at once in numpy: x (n, d) -> (output (n, d), weights (H, n, n))."""
    import numpy as np

    n, d = x.shape
    qkv = (x @ w_qkv + b_qkv).reshape(n, 3, n_head, d // n_head).transpose(1, 2, 0, 3)  # (3, H, n, d_head)
    q, k, v = qkv
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(d // n_head)  # (H, n, n)
    if causal:
        scores = np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, scores)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    attn = scores / scores.sum(axis=-1, keepdims=True)  # (H, n, n)
    return (attn @ v).transpose(1, 0, 2).reshape(n, d), attn
