"""The multi-head-attention tutorials' experiment: how different are the heads of an untrained attention layer?

Random weights, random inputs, the from-scratch attention of `reference.py`; the same diversity measures as for
a trained model, so a user can compare a trained layer's heads with untrained ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnscope import settings
from attnscope.analyses.result import Result
from attnscope.errors import AttnscopeError
from attnscope.output.random_mha import RandomMhaView
from attnscope.scores import pairs
from attnscope.scores.catalog import counted
from attnscope.scores.kinds import DECODER
from attnscope.scores.reference import multi_head_attention

MAX_D_MODEL = 4096
MAX_SEQ_LEN = 4096
MAX_SEED = 2**32 - 1
BATCH = 8  # random sequences per trial
MAX_ATTENTION_BYTES = 512 * 2**20  # one trial's attention maps, held at once (8 sequences of 4096 tokens, 1 head)
# Pairwise comparisons of a run (trials × sequences × Σ heads² × seq_len², the term that dominates its time): about
# 3·10^7 a second on 2 CPU cores, so this is hours; beyond it a run is refused rather than left to run for days.
MAX_COMPARISONS = 10**12


def check_settings(d_model: int, heads: Sequence[int], seq_len: int, batch: int, trials: int, seed: int) -> None:
    """Every setting in its range, and the attention of the largest head count within MAX_ATTENTION_BYTES."""
    if not 1 <= d_model <= MAX_D_MODEL:
        raise AttnscopeError(f"d_model {d_model}: must be between 1 and {MAX_D_MODEL}")
    if not 2 <= seq_len <= MAX_SEQ_LEN:
        raise AttnscopeError(f"sequence length {seq_len}: must be between 2 and {MAX_SEQ_LEN}")
    if trials < 1 or batch < 1:
        raise AttnscopeError(f"trials {trials}, batch {batch}: both must be at least 1")
    if not 0 <= seed <= MAX_SEED:
        raise AttnscopeError(f"seed {seed}: must be between 0 and {MAX_SEED}")
    if not heads:
        raise AttnscopeError("give at least one head count")
    for count in heads:
        if count < 1:
            raise AttnscopeError(f"head count {count}: must be at least 1")
        if d_model % count:
            raise AttnscopeError(f"head count {count}: must divide d_model {d_model}")
    comparisons = trials * batch * sum(count * count for count in heads) * seq_len**2
    if comparisons > MAX_COMPARISONS:
        raise AttnscopeError(
            f"{counted(trials, 'trial')} of head counts {', '.join(map(str, heads))} at sequence length {seq_len} make "
            f"{comparisons:.2g} pairwise comparisons (trials × {batch} sequences × heads² × length²; at most "
            f"{MAX_COMPARISONS:.0g}, already hours): use fewer --trials or heads, or shorter sequences"
        )
    attention_bytes = batch * max(heads) * seq_len**2 * 4  # (B, H, n, n) float32 of the most heads
    if attention_bytes > MAX_ATTENTION_BYTES:
        raise AttnscopeError(
            f"{max(heads)} heads at sequence length {seq_len}: the attention of {counted(batch, 'sequence')} "
            "would take "
            f"{attention_bytes / 2**20:,.0f} MiB (at most {MAX_ATTENTION_BYTES // 2**20}); use fewer heads or tokens"
        )


def _diversity_by_heads(
    d_model: int, heads: Sequence[int], seq_len: int, batch: int, trials: int, seed: int
) -> list[dict]:
    """For each head count H: mean pairwise JSD (bits), JS distance and cosine between the H heads, and their mean
    normalised entropy, over `trials` random layers, each run on `batch` random sequences of `seq_len` vectors.

    Weights W_qkv ~ N(0, 1/d_model), biases 0, inputs x ~ N(0, 1): queries and keys then have unit variance and the
    logits QKᵀ/√d_head unit variance whatever H, so only the number of heads changes. Causal masking, like GPT-2.
    """
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
            lengths = torch.full((batch,), seq_len)  # (B,)
            row_scores = DECODER.row_scores(attn, positions, lengths)
            entropy += float(row_scores["entropy_normalized"][:, :, 1:].mean())
            if count > 1:
                similarity = pairs.similarity(*pairs.pairwise_sums(attn, scored), rows_total)
                pair = torch.triu(torch.ones(count, count, dtype=torch.bool), diagonal=1)
                js += float(similarity["js"][pair].mean())
                js_root += float(similarity["js_distance"][pair].mean())
                cosine += float(similarity["cosine"][pair].mean())
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


@dataclass(repr=False)  # the repr is Result's: a summary
class RandomMhaResult(Result):
    view_class = RandomMhaView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    settings: dict[str, Any]
    rows: list[dict]  # one per head count, ascending
    notes: list[str] = field(default_factory=list)


class RandomMha(settings.RandomMha):
    """The tutorials' experiment: diversity of an untrained layer's heads against their number (each head count
    once, ascending)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_settings(self.d_model, self.head_counts, self.seq_len, BATCH, self.trials, self.seed)

    def run(self) -> RandomMhaResult:
        rows = _diversity_by_heads(self.d_model, self.head_counts, self.seq_len, BATCH, self.trials, self.seed)
        settings = {
            "d_model": self.d_model,
            "head_counts": list(self.head_counts),
            "seq_len": self.seq_len,
            "trials": self.trials,
            "seed": self.seed,
        }
        return RandomMhaResult(settings, rows)
