"""kvplan's long rows at the cost of the forward: a layer's output and each row's log-sum-exp from torch's fused CPU
attention, and each row's attention on the keys a streaming cache drops from the few keys it keeps.

kvplan's reducer (`reducers.DistantAttention`) reads one number a row: Σ_{S <= j <= i - R} A_ij, the attention of
row i on the keys after the sink S and before the recent window R. At long context the block path's tiles
(`pipeline.tiles`) compute every row's whole softmax for it, and cost ~1.3× the SDPA forward at 32k tokens. This path
asks SDPA's CPU flash kernel (`_scaled_dot_product_flash_attention_for_cpu`, the kernel `scaled_dot_product_attention`
runs on the CPU) for the output and each row's logsumexp, lse_i = log Σ_j e^(s_ij), which it computes anyway; then a
kept key's weight is A_ij = e^(s_ij − lse_i) from its logit alone, and

    Σ_{S <= j <= i - R} A_ij = 1 − Σ_{j < S} A_ij − Σ_{i - R < j <= i} A_ij        (rows i >= S + R; 0 before)

so only the S sink keys and the R recent keys of each row are computed again (in bands of rows: `distant_share`),
about (S + R + BAND_ROWS) / (n / 2) of the attention's logits at n tokens (3 % at 32k with 128 and 256), and no
product with the values. The subtraction loses what float32 keeps below 1: a row's share is exact to ~1e-7 on the
scale of 1, not of the share (up to ~3e-5 where logits are large: float32 rounds a logit of 100 by 1e-5), far below
any difference that ranks heads (the tests hold it to the eager maps' sums within 1e-6).

Taken where the layer is what the kernel computes: on the CPU, at `tiles.TILED_FROM` keys or more, its mask exactly
the causal triangle (right-padded windows: a real row sees real keys only), no soft cap, no learned sink, nothing
wanting a block's weights, and a reducer that reads the summed keys alone (`Reducer.reads`). Grouped-query layers
go as they are: the kernel shares a KV head among its query heads, as SDPA's `enable_gqa` does.
"""

from __future__ import annotations

import torch

from attnscope.pipeline import tiles
from attnscope.pipeline.blocks import CaptureState, LayerCall, LayerRows

# Query rows per band: a band's kept keys' logits are (B, H, BAND_ROWS, S + BAND_ROWS + R − 1) float32, 0.9 MB with
# 9 heads, S = 128 and R = 256, in the cache; each row computes BAND_ROWS − 1 recent keys it does not keep. Measured
# (one thread, 9 query heads over 3 KV heads, d_head 64, 8,192 tokens, /tmp script, two rounds): 512, 256, 128, 64
# and 32 rows took 0.28–0.38, 0.15–0.22, 0.15–0.17, 0.13 and 0.12–0.13 s, against 1.15 s for the fused kernel.
BAND_ROWS = 64


# torch's fused CPU attention with each row's logsumexp (what scaled_dot_product_attention runs on the CPU); None in a
# torch without it, which takes the tiles
KERNEL = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def wants_lse(state: CaptureState, call: LayerCall, device: torch.device, n_keys: int) -> bool:
    """Whether this layer goes by the fused kernel's output and log-sum-exp (see the module docstring)."""
    reducer = state.reducer
    return (
        KERNEL is not None
        and reducer is not None
        and reducer.reads <= {"summed"}
        and tiles.wants_tiles(state, call, device, n_keys)
        and call.triangle
        and call.softcap is None
        and call.sinks is None
    )


def attention(
    state: CaptureState, call: LayerCall, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """The layer's output (B, n, H, d_head) by the fused kernel; the reducer gets each row's summed keys (LayerRows
    with `summed` and `lengths`; the other summaries None). query (B, H, n, d_head), key and value (B, H_kv, n,
    d_head)."""
    output, lse = KERNEL(query, key, value, 0.0, True, scale=call.scaling)  # (B, H, n, d_head), (B, H, n) in nats
    lengths = state.lengths_on(query.device)
    summed = distant_share(query, key, lse, call.scaling, state.reducer.summed_keys)
    state.reducer.add_layer(call.layer, LayerRows.summed_alone(summed, lengths, call.sliding_window))
    return output.transpose(1, 2)


def distant_share(
    query: torch.Tensor, key: torch.Tensor, lse: torch.Tensor, scaling: float, summed_keys: tuple[int, int]
) -> torch.Tensor:
    """(B, H, n) float32: each causal row's attention on the keys S <= j <= i - R, (S, R) = `summed_keys`, as 1 less
    its weights on the first S keys and on its last R (rows i < S + R: 0, they have no such key). query
    (B, H, n, d_head), key (B, H_kv, n, d_head), lse (B, H, n) in nats.

    A band of BAND_ROWS rows takes its kept keys in one product: the S sink keys, then the keys from its first row's
    recent window to its last row (BAND_ROWS + R − 1), of which each row keeps its own R (`kept`, the same for every
    full band); a row's sink keys and recent keys never overlap, since its first recent key is past S."""
    sink, recent = summed_keys
    B, H, n, _ = query.shape
    groups = H // key.shape[1]
    summed = torch.zeros(B, H, n, dtype=torch.float32, device=query.device)
    kept = None
    for start in range(sink + recent, n, BAND_ROWS):
        stop = min(n, start + BAND_ROWS)
        low = start - recent + 1  # the band's first row's first recent key (> S)
        if kept is None or kept.shape[0] != stop - start:
            kept = _kept(stop - start, sink, recent, query.device)  # (b, S + b + R − 1)
        keys = torch.cat([key[:, :, :sink], key[:, :, low:stop]], dim=-2).float()  # (B, H_kv, S + b + R − 1, d)
        if groups > 1:  # query head h reads KV head h // G
            keys = keys.repeat_interleave(groups, dim=1)
        rows = query[:, :, start:stop].float() * scaling  # (B, H, b, d)
        weights = torch.matmul(rows, keys.transpose(-1, -2)).sub_(lse[:, :, start:stop, None]).exp_()
        summed[:, :, start:stop] = (1.0 - weights.mul_(kept).sum(dim=-1)).clamp_(min=0.0)
    return summed


def _kept(rows: int, sink: int, recent: int, device: torch.device) -> torch.Tensor:
    """(rows, S + rows + R − 1) float32, 1 at the keys each row of a band keeps: every sink key, and of the band's
    recent keys (the first row's first recent key on) its own R, the last of them itself."""
    offsets = torch.arange(rows + recent - 1, device=device)[None, :] - torch.arange(rows, device=device)[:, None]
    own = (offsets >= 0) & (offsets < recent)  # key low + m is row start + r's for r <= m < r + R
    return torch.cat([torch.ones(rows, sink, device=device), own.float()], dim=-1)
