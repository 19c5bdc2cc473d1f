"""The multi-head-attention tutorials' experiment: how different are the heads of an untrained attention layer?

Random weights, random inputs, the from-scratch attention of `reference.py`; the same diversity measures as for
a trained model, so a user can compare a trained layer's heads with untrained ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from attnscope import metrics
from attnscope.errors import AttnscopeError
from attnscope.reference import multi_head_attention

MAX_D_MODEL = 4096
MAX_SEQ_LEN = 4096
MAX_ATTENTION_BYTES = 512 * 2**20  # one trial's attention maps, held at once (8 sequences of 4096 tokens, 1 head)


def random_mha_diversity(
    d_model: int = 64,
    heads: Sequence[int] = (1, 2, 4, 8),
    seq_len: int = 32,
    batch: int = 8,
    trials: int = 4,
    seed: int = 0,
) -> list[dict]:
    """For each head count H: mean pairwise JSD (bits), JS distance and cosine between the H heads, and their mean
    normalised entropy, over `trials` random layers, each run on `batch` random sequences of `seq_len` vectors.

    Weights W_qkv ~ N(0, 1/d_model), biases 0, inputs x ~ N(0, 1): queries and keys then have unit variance and the
    logits QKᵀ/√d_head unit variance whatever H, so only the number of heads changes. Causal masking, like GPT-2.
    """
    if not 1 <= d_model <= MAX_D_MODEL:
        raise AttnscopeError(f"--d-model must be between 1 and {MAX_D_MODEL}")
    if not 2 <= seq_len <= MAX_SEQ_LEN:
        raise AttnscopeError(f"--seq-len must be between 2 and {MAX_SEQ_LEN}")
    if trials < 1:
        raise AttnscopeError("--trials must be positive")
    if batch < 1:
        raise AttnscopeError("batch must be positive")
    for count in heads:
        if count < 1:
            raise AttnscopeError(f"--heads {count}: a number of heads must be positive")
        if d_model % count:
            raise AttnscopeError(f"--heads {count}: the number of heads must divide --d-model {d_model}")
    attention_bytes = batch * max(heads, default=1) * seq_len**2 * 4  # (B, H, n, n) float32 of the most heads
    if attention_bytes > MAX_ATTENTION_BYTES:
        raise AttnscopeError(
            f"--heads {max(heads)} at --seq-len {seq_len}: the attention of {batch} sequences would take "
            f"{attention_bytes / 2**20:,.0f} MiB (at most {MAX_ATTENTION_BYTES // 2**20}); lower --seq-len or --heads"
        )
    rows = []
    positions = torch.arange(seq_len)  # (n,)
    scored = (positions >= 1)[None, :].expand(batch, seq_len)  # (B, n)
    for count in heads:
        js = js_root = cosine = entropy = 0.0
        for trial in range(trials):
            generator = torch.Generator().manual_seed(seed * 1_000_003 + count * 1009 + trial)
            x = torch.randn(batch, seq_len, d_model, generator=generator)  # (B, n, d)
            w_qkv = torch.randn(d_model, 3 * d_model, generator=generator) / math.sqrt(d_model)  # (d, 3d)
            _, attn = multi_head_attention(x, w_qkv, torch.zeros(3 * d_model), count)  # (B, H, n, n)
            rows_total = int(scored.sum())
            entropy += float(metrics.row_scores(attn, positions)["entropy_normalized"][:, :, 1:].mean())
            if count > 1:
                dots, js_sum, root_sum = metrics.pairwise_sums(attn, scored)
                norms = dots.diagonal().sqrt()
                pair = torch.triu(torch.ones(count, count, dtype=torch.bool), diagonal=1)
                js += float((js_sum / rows_total)[pair].mean())
                js_root += float((root_sum / rows_total)[pair].mean())
                cosine += float((dots / (norms[:, None] * norms[None, :]))[pair].mean())
        rows.append(
            {
                "heads": count,
                "d_head": d_model // count,
                "js": js / trials if count > 1 else None,
                "js_distance": js_root / trials if count > 1 else None,
                "cosine": cosine / trials if count > 1 else None,
                "entropy_normalized": entropy / trials,
            }
        )
    return rows
