"""What `attnscope bench` checks before it builds a model: its settings, that every sequence fits the model's
context, and that each batch shape fits the memory available (`estimated_bytes`, a rough lower bound that `circuit`'s
memory check builds on too). Each refusal is one line, said before any weights are built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from attnscope.analyses.harness import available_bytes
from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    import torch

BASELINES = ("tutorial", "cache")  # what users do today, against which attnscope's speed-up is reported
# Methods whose attention never holds an (n × n) map: SDPA's forward, and the capture's blocks of rows or tiles
STREAMING = ("floor", "attnscope", "fused", "blocks", "kvplan")


def check_settings(seqs: Sequence[int], batches: Sequence[int], repeats: int, warmup: int) -> None:
    """What can be checked before the model is known; each message names the setting and the value at fault."""
    if not seqs or not batches:
        raise AttnscopeError("give at least one sequence length and one batch size")
    for seq in seqs:
        if seq < 2:
            raise AttnscopeError(f"sequence length {seq}: a sequence needs at least 2 tokens")
    for batch in batches:
        if batch < 1:
            raise AttnscopeError(f"batch size {batch}: a batch needs at least 1 text")
    if repeats < 1:
        raise AttnscopeError(f"repeats {repeats}: at least 1 timed run is needed")
    if warmup < 0:
        raise AttnscopeError(f"warmup {warmup}: the number of untimed runs cannot be negative")


def check_context(seqs: Sequence[int], context: int) -> None:
    """Every sequence fits the model's context (known from its config, before any weights are built)."""
    for seq in seqs:
        if seq > context:
            raise AttnscopeError(f"sequence length {seq}: longer than the model's context, {context} tokens")


def estimated_bytes(config: Any, batch: int, seq: int, method: str, element: int) -> int:
    """A rough lower bound on the memory one call of `method` needs at batch × seq on a model of `config` whose
    weights take `element` bytes per value: the weights; the hidden states of one layer (the residual stream, the
    queries, keys and values, the MLP's 4d; about 14 values per token and model dimension); one layer's attention
    logits and weights in float32 (B·H·n² twice), except in the methods that never hold them (STREAMING: SDPA's
    floor, the capture's blocks of rows); the notebook ways run one text at a time, and also hold its maps of every
    layer and its logits over the vocabulary. Measured peaks on GPT-2 small are 1.1-1.4× this; it is used only to
    refuse a batch that cannot fit."""
    d, H, L = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    weights = element * (config.vocab_size * d + L * 12 * d * d)
    texts = 1 if method in BASELINES else batch  # the notebook ways run one text at a time
    forward = element * 14 * texts * seq * d
    if method not in STREAMING:
        forward += 4 * 2 * texts * H * seq * seq
    if method in BASELINES:
        forward += 4 * (L * H * seq * seq + seq * config.vocab_size)
    if method == "circuit":  # a batch's hidden states and heads' outputs at every layer, kept for the replays
        forward += element * 2 * L * batch * seq * d
    return weights + forward


def check_memory(
    config: Any, seqs: Sequence[int], batches: Sequence[int], methods: Sequence[str], device: torch.device, element: int
) -> None:
    """Refuse, before any weights are built, a batch shape whose estimated memory exceeds what is available: a run
    that the kernel would kill halfway (or that would swap for hours) teaches nothing."""
    free = available_bytes(device)
    if free is None:
        return
    for batch in batches:
        for seq in seqs:
            method = max(methods, key=lambda name: estimated_bytes(config, batch, seq, name, element))
            need = estimated_bytes(config, batch, seq, method, element)
            if need > free:
                raise AttnscopeError(
                    f"batch size {batch} × sequence length {seq}: the {method} method needs about "
                    f"{need / 2**30:,.1f} GiB (estimated), more than the {free / 2**30:,.1f} GiB available on "
                    f"{device.type}; use smaller --batch-sizes or --seq-lens"
                )
