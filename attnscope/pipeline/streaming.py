"""Streaming heads at any length: DuoAttention's streaming heads (Xiao et al. 2024) imposed inside the attention
function, tile by tile, so that no (n × n) map of a head ever exists (kvplan's check, `pipeline.passkey`).

A streaming query head sees, from the query at position p, the key j iff j <= p and (j < S or j > p − R): the first
S keys (the sink) and the last R (the recent window), what the KV cache of DuoAttention's streaming heads holds; the
layer's own mask (padding, a sliding window) still applies. The other heads of the layer see what they always see.

`streaming_attention` has transformers' attention-function signature and is registered under IMPLEMENTATION (with
SDPA's mask function, as the capture's is: a boolean mask, or none for a causal layer without padding). Per layer:

- no streaming head, and neither Gemma's soft cap nor gpt-oss's sinks: transformers' own SDPA function, unchanged
  (full attention is what `attention(loaded, "sdpa")` computes);
- the full heads, with no soft cap and no sinks: SDPA over those heads (is_causal when the layer has no mask: the
  CPU's flash kernel, O(n) memory);
- the streaming heads: queries in blocks of BLOCK rows. The rows [q0, q1) see at most the keys [0, S) and
  [q0 − R + 1, q1): each block gathers those (≤ S + R + BLOCK keys) and attends over them with the block's small
  mask (band, causal, the layer's mask at those keys): by SDPA, or, with Gemma's soft cap (logits ← c·tanh(logits
  / c), before the mask) or gpt-oss's sink logit (one extra column per head, dropped after the softmax), by an
  explicit softmax, as the families' eager functions compute them;
- the full heads of a layer with a soft cap or sinks: the same blocks over the keys [0, q1) (SDPA has neither): a
  block's logits are BLOCK × n, never n × n.

Memory: a block of the streaming heads holds (B, h, BLOCK, ≤ S + R + BLOCK) logits; the keys and values of the
layer's heads are gathered per query head once, O(n·d) each. The one (n × n_k) object is transformers' own boolean
mask of a layer that slides with a window shorter than the text, or of a padded batch (one per layer, 1 byte a pair,
not per head): a causal layer without padding gets none.

Families whose attention does not go through transformers' attention interface (gptj, gpt_neo, falcon, bloom) are
refused in one line once a forward shows it (`StreamingPlan.check`), as are encoders and forwards with a cache
(streaming heads are defined for causal self-attention over the same positions).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnscope.errors import AttnscopeError
from attnscope.pipeline.blocks import LayerCall

IMPLEMENTATION = "attnscope_streaming"
KEYWORD = "attnscope_streaming"  # the forward's keyword argument that carries the plan to every layer
# Query rows per block: the streaming heads' blocks see S + R + BLOCK keys at most (640 at DuoAttention's 128 / 256),
# the full heads' blocks (soft cap or sinks only) BLOCK × n logits per head
BLOCK = 256


@dataclass
class StreamingPlan:
    """Which query heads stream (layer -> heads), with the sink S and the recent window R; `layers_seen` notes the
    layers whose attention went through `streaming_attention` in the forward, for `check`."""

    heads: dict[int, tuple[int, ...]]
    sink: int
    recent: int
    layers_seen: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, streaming: dict[int, Sequence[int]] | None, sink: int, recent: int) -> StreamingPlan:
        return cls({layer: tuple(sorted(set(heads))) for layer, heads in (streaming or {}).items() if heads}, sink,
                   recent)  # fmt: skip

    def check(self, n_layer: int) -> None:
        """Refuse a model some of whose layers computed attention without the attention interface: their heads
        would not have streamed."""
        missed = sorted(set(range(n_layer)) - set(self.layers_seen))
        self.layers_seen.clear()
        if missed:
            raise AttnscopeError(
                f"the attention of {'layer' if len(missed) == 1 else 'layers'} {', '.join(map(str, missed))} did not "
                "go through transformers' attention interface, so attnscope cannot stream its heads; this model's "
                "family cannot be checked"
            )


@functools.cache
def _register() -> None:
    """Register the streaming attention with transformers, once per process (with SDPA's mask function: without
    one for its name, transformers would drop the padding mask without a word)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, streaming_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


@contextlib.contextmanager
def streaming(loaded: Any) -> Iterator[None]:
    """`loaded`'s model computes attention with `streaming_attention` inside the block; a forward streams the heads
    of the plan given as its keyword KEYWORD (`forward`), and computes full attention without one."""
    from attnscope.pipeline.interventions import attention

    _register()
    with attention(loaded, IMPLEMENTATION):
        yield


def forward(model: Any, plan: StreamingPlan, n_layer: int, **inputs: Any) -> Any:
    """`model(**inputs)` with the heads of `plan` streaming (inside `streaming`), without a KV cache; refused where
    a layer's attention did not take the plan."""
    output = model(**inputs, use_cache=False, **{KEYWORD: plan})
    plan.check(n_layer)
    return output


def streaming_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention with the plan's streaming heads narrowed to their sink and recent window (module docstring).

    query (B, H, n, d) after the family's rotary embedding and norms; key/value (B, H_kv, n_k, d) (query head h reads
    KV head h // (H / H_kv)); attention_mask (B, 1, n, n_k) boolean, or None for a causal layer without padding.
    Returns (output (B, n, H, d), None), as transformers expects."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plan: StreamingPlan | None = kwargs.pop(KEYWORD, None)
    call = LayerCall.of(module, query, key, attention_mask, scaling, kwargs)
    streamed = () if plan is None else plan.heads.get(call.layer, ())
    if plan is not None:
        plan.layers_seen.append(call.layer)
    plain = call.softcap is None and call.sinks is None
    if not streamed and plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)  # fmt: skip
    if not call.causal:
        raise AttnscopeError(
            "streaming heads need causal self-attention over the same positions (a decoder, no KV cache): layer "
            f"{call.layer} has {query.shape[-2]} queries over {key.shape[-2]} keys"
        )
    B, H, n, d = query.shape
    seen = _allowed(attention_mask)  # (B or 1, 1, n, n) bool, or None: the causal triangle
    full = [head for head in range(H) if head not in streamed]
    output = query.new_empty(B, n, H, d)  # (B, n, H, d)
    if full:
        keys, values = _per_query_head(key, H, full), _per_query_head(value, H, full)  # (B, h, n, d) each
        if plain:
            output[:, :, full] = _sdpa(query[:, full], keys, values, seen, call.scaling).transpose(1, 2)
        else:
            output[:, :, full] = _blocks(query[:, full], keys, values, seen, call, full, None).transpose(1, 2)
    if streamed:
        heads = list(streamed)
        keys, values = _per_query_head(key, H, heads), _per_query_head(value, H, heads)  # (B, h, n, d) each
        band = (plan.sink, plan.recent)
        output[:, :, heads] = _blocks(query[:, heads], keys, values, seen, call, heads, band).transpose(1, 2)
    return output, None


def _per_query_head(key: torch.Tensor, n_head: int, heads: Sequence[int]) -> torch.Tensor:
    """(B, h, n_k, d): the KV head each of the query heads `heads` reads (h // (H / H_kv)), from (B, H_kv, n_k, d)."""
    group = n_head // key.shape[1]
    return key[:, [head // group for head in heads]]


def _allowed(mask: Any) -> torch.Tensor | None:
    """A layer's mask as booleans (True: the key is seen), from a boolean one or an additive one (0 where allowed,
    the dtype's lowest value where not); None stays None (the causal triangle)."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, seen: Any, scaling: float) -> torch.Tensor:
    """Full heads by SDPA: (B, h, n, d); causal by the flag where the layer has no mask (the flash kernel)."""
    if seen is None:
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=seen, scale=scaling)


def block_keys(q0: int, q1: int, band: tuple[int, int] | None) -> torch.Tensor:
    """The keys the rows [q0, q1) can see (positions, ascending): [0, S) and [q0 − R + 1, q1) for a streaming band
    (S, R), [0, q1) without one."""
    if band is None:
        return torch.arange(q1)
    sink, recent = band
    sink = min(sink, q1)
    return torch.cat([torch.arange(sink), torch.arange(max(sink, q0 - recent + 1), q1)])


def _block_mask(q0: int, q1: int, index: torch.Tensor, band: tuple[int, int] | None, seen: Any) -> torch.Tensor:
    """(B or 1, 1, T, K) bool: which of the block's keys `index` (K,) each row q0 .. q1 − 1 sees: causal, inside the
    band, and allowed by the layer's mask."""
    rows = torch.arange(q0, q1)[:, None]  # (T, 1) positions
    keys = index[None, :]  # (1, K)
    visible = keys <= rows  # (T, K)
    if band is not None:
        sink, recent = band
        visible &= (keys < sink) | (keys > rows - recent)
    visible = visible.to(index.device)[None, None]  # (1, 1, T, K)
    if seen is not None:
        visible = visible & seen[:, :, q0:q1][..., index]  # (B or 1, 1, T, K)
    return visible


def _blocks(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, seen: Any, call: LayerCall, heads: Sequence[int],
    band: tuple[int, int] | None,
) -> torch.Tensor:  # fmt: skip
    """Attention of the query heads `heads`, BLOCK rows at a time, over the keys each block can see (`block_keys`),
    with the family's soft cap and sinks, as its eager function computes them: (B, h, n, d). `query` (B, h, n, d),
    `key` and `value` (B, h, n, d) per query head; `band` (S, R) for streaming heads, None for full ones."""
    B, h, n, d = query.shape
    lowest = torch.finfo(query.dtype).min
    sinks = None if call.sinks is None else call.sinks[list(heads)].to(query.dtype).view(1, h, 1, 1)  # (1, h, 1, 1)
    output = torch.empty_like(query)  # (B, h, n, d)
    for q0 in range(0, n, BLOCK):
        q1 = min(n, q0 + BLOCK)
        index = block_keys(q0, q1, band).to(query.device)  # (K,)
        visible = _block_mask(q0, q1, index, band, seen)  # (B or 1, 1, T, K)
        rows, keys, values = query[:, :, q0:q1], key[:, :, index], value[:, :, index]  # (B, h, T or K, d)
        if call.softcap is None and sinks is None:  # SDPA's fused kernel: one pass over the block's logits
            output[:, :, q0:q1] = torch.nn.functional.scaled_dot_product_attention(
                rows, keys, values, attn_mask=visible, scale=call.scaling
            )  # (B, h, T, d)
            continue
        logits = rows @ keys.transpose(-1, -2) * call.scaling  # (B, h, T, K)
        if call.softcap is not None:  # Gemma 2/3: before the mask
            logits = torch.tanh(logits / call.softcap) * call.softcap
        logits = logits.masked_fill(~visible, lowest)  # (B, h, T, K)
        if sinks is None:
            weights = logits.softmax(-1)  # (B, h, T, K)
        else:  # gpt-oss: a sink logit per head as one more key, its weight dropped
            extra = sinks.expand(B, h, q1 - q0, 1)  # (B, h, T, 1)
            weights = torch.cat([logits, extra], -1).softmax(-1)[..., :-1]  # (B, h, T, K)
        output[:, :, q0:q1] = weights.to(value.dtype) @ values  # (B, h, T, d)
    return output
