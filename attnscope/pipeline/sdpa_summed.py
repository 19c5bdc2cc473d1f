"""kvplan's long rows on the CPU: torch's fused attention kernel gives the layer's output and each row's log-sum-exp,
and the attention on the keys a streaming KV cache drops (LayerRows.summed) is what is left of 1 once the keys it
keeps are counted.

kvplan's reducer reads one summary a row, Σ_{S <= j <= i − R} A_ij (reducers.DistantAttention, `summed_keys` (S, R)).
In tiles (pipeline.tiles) that costs an online softmax over every key the row sees, besides the output's. But SDPA's
CPU kernel (`_scaled_dot_product_flash_attention_for_cpu`, which the bare forward's SDPA calls: the same output)
returns lse_i = ln Σ_j exp(s_ij) beside the output, so A_ij = exp(s_ij − lse_i) at any key, and

    summed_i = 1 − Σ_{j < S, j <= i} A_ij − Σ_{max(S, i − R + 1) <= j <= i} A_ij        (0 when i < S + R: no key)

needs the logits of each row's S + R kept keys alone: (S + R)·d multiply-adds a row, against i·d for its attention.
The difference from the sum over the dropped keys is float32 rounding on the scale of 1 (~1e-7 a row), not of
summed_i itself; kvplan's score, a mean of summed_i over rows, reads either alike.

Taken for a causal layer masked by the plain triangle (no sliding window; padding on the right, so that a real row's
keys are all real), with no soft cap and no sink (the kernel takes neither), in float32, on the CPU, at SDPA_FROM keys
or more, for a reducer that reads `summed` alone (Reducer.reads).
"""

from __future__ import annotations

import torch

from attnscope.pipeline.blocks import LOG2E, MASKED, CaptureState, LayerCall, LayerRows

# Keys from which a layer takes this path: as the tiles (tiles.TILED_FROM), where the block path's rows no longer fit
# the CPU's caches.
SDPA_FROM = 2048
# Query rows per block of the kept keys' logits: (H, ROWS, S + ROWS + R − 1) float32 each, 4.7 MB with 9 heads and
# S, R = 128, 256, and ROWS + R − 1 recent keys a row computed for R used.
ROWS = 128


def wanted(state: CaptureState, call: LayerCall, device: torch.device, n_keys: int, dtype: torch.dtype) -> bool:
    """Whether this layer's attention takes this path (see the module's docstring)."""
    reducer = state.reducer
    return (
        device.type == "cpu"
        and n_keys >= SDPA_FROM
        and reducer is not None
        and reducer.summed_keys is not None
        and reducer.reads <= {"summed"}
        and not reducer.wants_blocks
        and not state.keeps(call.layer)
        and call.triangle
        and call.softcap is None
        and call.sinks is None
        and dtype == torch.float32
    )


def attention(
    state: CaptureState, call: LayerCall, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """The layer's output (B, n, H, d_head), its rows' summed attention to the reducer. query: (B, H, n, d_head),
    key and value (B, H_kv, n, d_head), as block_path.attention takes them."""
    B, _, n, _ = query.shape
    output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, True, scale=call.scaling
    )  # (B, H, n, d_head), (B, H, n) in nats; the query heads of a key/value head share it as SDPA's enable_gqa
    sink, recent = state.reducer.summed_keys
    hidden: dict[int, torch.Tensor] = {}  # the kept keys' mask of blocks past the first rows, the same for each
    parts = [
        _summed(query, key, lse, start, min(n, start + ROWS), sink, recent, call.scaling, hidden)
        for start in range(0, n, ROWS)
    ]  # (B, H, b) each
    visible = (torch.arange(n, device=query.device) + 1).expand(B, n)  # (B, n): keys 0..i
    rows = LayerRows(
        normalizer=None, expected_logit=None, gathered=None, lengths=state.lengths_on(query.device), visible=visible,
        gathered_visible=None, summed=torch.cat(parts, dim=-1), sliding_window=call.sliding_window,
    )  # fmt: skip
    state.reducer.add_layer(call.layer, rows)
    return output.transpose(1, 2)  # (B, n, H, d_head)


def _summed(query, key, lse, start: int, stop: int, sink: int, recent: int, scaling: float, hidden: dict):
    """(B, H, b): summed_i of rows start:stop (the module's docstring), from the logits of their first `sink` keys
    and their last `recent` (those at or after the sink's), in base 2 and shifted by lse in their matmul."""
    B, H, _, d_head = query.shape
    H_kv, b = key.shape[1], stop - start
    device = query.device
    rows = query[:, :, start:stop].reshape(B * H_kv, H // H_kv * b, d_head)  # (B·H_kv, G·b, d_head)
    first = min(max(sink, start - recent + 1), stop)  # the recent keys of the block's rows, after the sink's
    kept = torch.cat([torch.arange(min(sink, stop)), torch.arange(first, stop)]).to(device)  # (k,)
    keys = key[:, :, kept].view(B * H_kv, -1, d_head).transpose(-1, -2)  # (B·H_kv, d_head, k)
    shift = (lse[:, :, start:stop] * -LOG2E).reshape(B * H_kv, -1, 1)  # (B·H_kv, G·b, 1): −lse in base 2
    logits = torch.baddbmm(shift, rows, keys, alpha=scaling * LOG2E).view(B, H, b, -1)  # (B, H, b, k): s − lse
    interior = start >= sink + recent  # every row's sink keys seen, its recent ones after them: one mask for all
    if not interior or b not in hidden:
        positions = torch.arange(start, stop, device=device)[:, None]  # (b, 1)
        seen = (kept <= positions) & ((kept < sink) | (kept > positions - recent))  # (b, k): a kept key the row sees
        mask = torch.zeros(seen.shape, device=device).masked_fill_(~seen, MASKED)  # (b, k): added, not filled in
        if not interior:
            return _first_rows(logits, mask, positions[:, 0], sink + recent)
        hidden[b] = mask
    return (1.0 - logits.add_(hidden[b]).exp2_().sum(dim=-1)).clamp_(min=0.0)  # (B, H, b)


def _first_rows(logits: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, first: int) -> torch.Tensor:
    """summed (B, H, b) of rows `positions` (b,) of which some come before `first` = S + R: 0 for those."""
    summed = (1.0 - logits.add_(mask).exp2_().sum(dim=-1)).clamp_(min=0.0)  # (B, H, b)
    return torch.where(positions >= first, summed, 0.0)
