"""Stage 3: run the model and hand each layer's attention, a block of query rows at a time, to a reducer.

Attention weights are computed inside a registered attention function (`transformers.AttentionInterface`), one
block of query rows at a time, on the device the model runs on. The reducer turns each block into statistics right
there, so no more than one block of one layer's attention exists at any moment; full maps are kept (on the host)
only for the layers a picture needs, and only for one window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnscope.tokens import Batch

IMPLEMENTATION = "attnscope"
BLOCK_BYTES = 32 * 2**20  # one block of float32 attention probabilities (B, H, rows, n) stays under this

# reducer(layer, attn (B, H, b, n) float32, positions (b,), lengths (B,))
Reducer = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclass
class CaptureState:
    """What the attention function needs to know about the batch being run; passed through the model's kwargs."""

    reducer: Reducer | None
    lengths: torch.Tensor  # (B,) real tokens per window
    keep_layers: frozenset[int] = frozenset()
    keep_row: int | None = None  # which window of the batch to keep full maps of
    block_bytes: int = BLOCK_BYTES
    kept: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    layers_seen: list[int] = field(default_factory=list)


def _eager_fallback(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    from transformers.models.gpt2.modeling_gpt2 import eager_attention_forward

    return eager_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)


def reducing_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention with the weights handed to a reducer instead of returned.

    query: (B, H, n, d_head), key/value: (B, H, n_k, d_head), attention_mask: (B, 1, n, n_k) additive (0 or the
    dtype's minimum). Returns (output (B, n, H, d_head), None), as transformers expects.
    """
    state: CaptureState | None = kwargs.get("attnscope_state")
    if state is None:  # the model was called outside a capture: behave exactly like eager attention
        return _eager_fallback(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)
    layer = module.layer_idx
    state.layers_seen.append(layer)
    B, H, n, _ = query.shape
    n_keys = key.shape[-2]
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    rows = max(1, state.block_bytes // (B * H * n_keys * 4))
    output = torch.empty_like(query)  # (B, H, n, d_head)
    keys_t = key.transpose(-1, -2)  # (B, H, d_head, n_k)
    keep = layer in state.keep_layers and state.keep_row is not None
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        logits = torch.matmul(query[:, :, start:stop], keys_t).float() * scaling  # (B, H, b, n_k)
        if attention_mask is not None:
            logits = logits + attention_mask[:, :, start:stop, :n_keys].float()  # (B, 1, b, n_k) broadcast
        probs = torch.softmax(logits, dim=-1)  # (B, H, b, n_k) float32 whatever the model's dtype
        output[:, :, start:stop] = torch.matmul(probs.to(value.dtype), value)  # (B, H, b, d_head)
        if state.reducer is not None:
            positions = torch.arange(start, stop, device=query.device)  # (b,)
            state.reducer(layer, probs, positions, state.lengths)
        if keep:
            state.kept.setdefault(layer, []).append(probs[state.keep_row].cpu())  # (H, b, n_k)
    return output.transpose(1, 2), None  # (B, n, H, d_head)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(IMPLEMENTATION, reducing_attention)
    # Without a mask function for our name, transformers silently drops the padding mask.
    AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)


@dataclass
class Captured:
    """Full maps kept for pictures: layer -> (H, n, n) float32 on the host, for window `window_index`."""

    window_index: int | None
    maps: dict[int, torch.Tensor]


def run(
    model: Any,
    batches: Iterable[Batch],
    reducer: Reducer | None,
    keep_layers: Iterable[int] = (),
    keep_window: int | None = None,
    on_batch: Callable[[Batch], None] | None = None,
) -> Captured:
    """Forward every batch through `model` with attention going to `reducer`; keep the maps of `keep_layers`
    for window `keep_window` (an index into the windows the batches were made from)."""
    _register()
    n_layer = model.config.num_hidden_layers
    previous = model.config._attn_implementation
    model.set_attn_implementation(IMPLEMENTATION)
    keep = frozenset(keep_layers)
    maps: dict[int, torch.Tensor] = {}
    try:
        with torch.inference_mode():
            for batch in batches:
                keep_row = batch.indices.index(keep_window) if keep_window in batch.indices else None
                state = CaptureState(reducer, batch.lengths, keep if keep_row is not None else frozenset(), keep_row)
                model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, attnscope_state=state)
                if sorted(state.layers_seen) != list(range(n_layer)):
                    raise RuntimeError(f"attention of layers {state.layers_seen} captured, expected 0..{n_layer - 1}")
                if keep_row is not None:
                    length = int(batch.lengths[keep_row])
                    for layer, blocks in state.kept.items():
                        maps[layer] = torch.cat(blocks, dim=1)[:, :length, :length]  # (H, n, n)
                if on_batch is not None:
                    on_batch(batch)
    finally:
        model.set_attn_implementation(previous)
    return Captured(keep_window, maps)
