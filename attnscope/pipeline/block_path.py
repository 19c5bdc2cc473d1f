"""The block path: a layer's attention in PyTorch, one block of query rows at a time, every block handed to the
reducer before it is freed (one of the capture's two kernels; the other is `fused_path`, the choice `kernels`).

A layer runs as named steps, block after block (transformers' `sdpa_attention.py` and nanoGPT as models):

    _block_logits    scaled (and soft-capped) logits of the block's rows over the keys they can see, in base 2
    _mask_block      the layer's mask applied in place: the causal triangle, the model's mask, or none
    _softmax_parts   2^(s - max) and Z (and a sink's share), without normalising the block
    _block_output    (2^(s - max) V) / Z: the block's share of the layer's output
    _gathered        the logits at the keys the reducer asked for, and whether each row sees them
    _hand_over       the block to a reducer that wants blocks, its maps to the pictures

then the per-row summaries of the whole layer (LayerRows) go to the reducer. The output equals eager attention's;
softmax runs in float32 whatever the model's dtype, on logits in base 2 (blocks.LOG2E: exp2 is the CPU's fast
exponential), and the output is (2^(s - max) V) / Z, which spares a pass normalising the block. At long context on
the CPU, when nothing needs a block's weights, a block walks its keys in tiles instead (`pipeline.tiles`: an online
softmax whose tiles stay in the cache, its blocks shared among threads); for kvplan's reducer, which reads one sum
a row, by torch's fused kernel and each row's logsumexp (`pipeline.distant`). A causal layer without a sliding window,
on right-padded windows, masks with a small triangle per block instead of adding the model's whole mask (the same
keys, half the passes).

On a small model every tensor operation here costs more in Python and dispatch than in arithmetic, so a layer does
as few as it can: what depends only on the batch's geometry (positions, the causal triangle, the keys the reducer
gathers and whether rows see them) is computed by the first layer and reused by the others (`geometry`), and one
block's pieces are used as they are rather than copied into whole-layer buffers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnscope.pipeline import distant, tiles
from attnscope.pipeline.blocks import (
    LN2,
    LOG2E,
    LOGIT_FLOOR_BASE2,
    MASKED,
    AttentionBlock,
    BlockGeometry,
    CaptureState,
    LayerCall,
    LayerRows,
    is_masked,
)

# Float32 logits per window in one block (H, rows, keys): the block is this times the batch size. Small enough to
# stay cache-friendly, large enough that per-operation overhead and tiny matmuls do not dominate. Measured on the
# 2-core CPU (one GPT-2 small layer, 12 heads, time over SDPA's, /tmp script interleaving the settings): at batch
# 8 × 1024 tokens 0.5, 1, 2 and 4 MiB gave 2.39, 1.86, 1.86 and 2.17×; at 1 × 1024 1.82, 1.56, 1.86 and 1.75×; at
# 8 × 512 1.45, 1.22, 1.44 and 1.92×.
BLOCK_BYTES = 1 * 2**20
# ... but at long context, room for this many query rows over all of a layer's keys. BLOCK_BYTES alone holds a few
# rows there (9 heads × 8,192 keys: 3), and each block's two matrix products read every key and value again for
# them: matrix-vector products, bound by memory. The room is for the whole layer, not a floor on each block's rows,
# so that the blocks stay about one size and the allocator reuses them (a floor of 64 rows on each block let blocks
# grow with their keys, and the C heap grew to 1.5 GB at 8,192 tokens instead of 0.6). Measured on the 2-core CPU
# (an 8-layer Llama-shaped model, 9 heads over 3 KV heads, d_head 64, one window; /tmp scripts alternating the
# settings with the bare SDPA forward, the least of 2 each): at 8,192 tokens 2.25× the forward with 1 row, 1.70×
# with 32, 1.71× with 64; at 4,096 tokens 1.43× with 32, 1.55× with 64; peak memory above the model at 8,192
# tokens 607, 617 and 737 MB with 1, 32 and 64 rows.
MIN_BLOCK_ROWS = 32
# On a GPU the block holds up to this share of the free memory (the block path keeps about four times its logits
# alive at once: logits, their exponentials, a copy in the values' dtype, masks), up to GPU_BLOCK_MAX for the whole
# batch, so that a layer is one block or a few (GPT-2 small at 8 × 1024 tokens: 400 MB of logits a layer) and the
# launches of many small blocks (~15 kernels each) do not dominate.
GPU_BLOCK_SHARE = 8
GPU_BLOCK_MAX = 4 * 2**30


def attention(
    state: CaptureState, call: LayerCall, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask
) -> torch.Tensor:
    """The layer's output (B, n, H, d_head), computed one block of query rows at a time; the blocks go to the
    reducer (when it wants them) and the layer's per-row summaries after the last block.

    query: (B, H, n, d_head) after the family's rotary embedding and norms; key/value: (B, H_kv, n_k, d_head), the
    key/value heads only (grouped-query attention: query head h reads key/value head h // (H / H_kv), as
    transformers' repeat_kv does, without copying them); attention_mask: (B, 1, n, n_k) with the causal triangle,
    sliding window and padding of this layer (boolean, or additive: 0 or the dtype's minimum), or None."""
    B, H, n, d_head = query.shape
    H_kv, n_keys = key.shape[1], key.shape[-2]
    device = query.device
    if distant.wants_lse(state, call, device, n_keys):  # kvplan at long context: SDPA's kernel and its logsumexp
        return distant.attention(state, call, query, key, value)
    reducer = state.reducer
    # float32 logits per window in one block; at long context, room for MIN_BLOCK_ROWS rows over all the keys, so that
    # the blocks stay about one size (the allocator reuses them) and each is more than a few rows
    budget = max(block_budget(state, device), MIN_BLOCK_ROWS * n_keys * H * 4)
    # GPT-2's key and value are strided views into one (B, n, 3d) tensor; a matmul given such a view copies the whole
    # of it first, so every block of rows would copy all keys and values again. One copy per layer instead (none
    # asked for when one block holds every row: its matmuls copy them once anyway).
    tiled = tiles.wants_tiles(state, call, device, n_keys)
    if tiled or _block_rows(0, n_keys, H * 4, budget, call.causal) < n:
        key, value = key.contiguous(), value.contiguous()  # (B, H_kv, n_k, d_head)
    query = query.reshape(B, H_kv, H // H_kv, n, d_head)  # query heads grouped by the key/value head they read
    keys_t = key.transpose(-1, -2)  # (B, H_kv, d_head, n_k), a transposed view a matmul reads as it is
    sink_logits = None if call.sinks is None else call.sinks.float().view(1, H, 1) * LOG2E  # (1, H, 1), base 2
    gather_keys = reducer.keys_to_gather if reducer is not None else None
    summed_keys = reducer.summed_keys if reducer is not None else None
    lengths = state.lengths_on(device)  # (B,)
    pieces = _LayerPieces()
    if tiled:  # long rows, summaries only: the keys in tiles that stay in the cache, blocks shared among threads
        jobs = []
        rows = tiles.rows_per_block(B)
        expected = reducer is None or "expected_logit" in reducer.reads
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            block = geometry(state, start, stop, device, call.triangle, gather_keys)  # here: it fills caches
            keys = stop if call.causal else n_keys
            jobs.append(
                (query, key, value, attention_mask, call, block, start, stop, keys, sink_logits, lengths, summed_keys,
                 expected)
            )  # fmt: skip
        for parts in tiles.blocks_in_tiles(jobs):
            pieces.add_tiled(*parts)
    start = n if tiled else 0
    while start < n:
        stop = min(n, start + _block_rows(start, n_keys, H * 4, budget, call.causal))
        keys = stop if call.causal else n_keys  # a causal row never sees a key after itself
        block = geometry(state, start, stop, device, call.triangle, gather_keys)
        logits = _block_logits(query, keys_t, start, stop, keys, call)  # (B, H, b, k)
        masked, visible = _mask_block(logits, block, attention_mask, call, start, stop, keys)
        exp_logits, block_z, peak, mass = _softmax_parts(logits, sink_logits)
        pieces.add(_block_output(exp_logits, block_z, value, keys), block_z, visible, peak, mass)
        pieces.add_gathered(_gathered(logits, block, masked, call.causal, keys, lengths))
        if summed_keys is not None:
            pieces.summeds.append(_summed(exp_logits, block_z, block.positions, summed_keys))
        _hand_over(state, call, exp_logits, block_z, block.positions, lengths, n_keys, keys)
        # Σ_j exp(s_ij) s_ij, multiplying in place: the logits are not needed after this
        pieces.expected_logits.append(logits.mul_(exp_logits).sum(dim=-1).mul_(LN2) / block_z)  # (B, H, b) nats
        start = stop
    if reducer is not None:
        reducer.add_layer(call.layer, pieces.rows(lengths, call.sliding_window))
    return joined(pieces.outputs, -2).transpose(1, 2)  # (B, n, H, d_head)


# ----------------------------------------------------------------------------------------------------- the steps


def _block_logits(
    query: torch.Tensor, keys_t: torch.Tensor, start: int, stop: int, keys: int, call: LayerCall
) -> torch.Tensor:
    """(B, H, b, k) float32: the scaled (and soft-capped) logits of rows start:stop over the first `keys` keys, in
    base 2 (× log2 e: blocks.LOG2E).
    query: (B, H_kv, G, n, d_head), the G query heads of a key/value head side by side; they are stacked as G·b rows
    of one matmul over their shared keys (a broadcast over G instead would copy the keys once per query head and
    block)."""
    B, H_kv, G, _, d_head = query.shape
    b = stop - start
    block_queries = (query[:, :, :, start:stop] * (call.scaling * LOG2E)).reshape(B, H_kv, G * b, d_head)
    logits = torch.matmul(block_queries, keys_t[..., :keys]).float().view(B, H_kv * G, b, keys)  # (B, H, b, k)
    return call.soft_capped(logits)


def _mask_block(
    logits: torch.Tensor, block: BlockGeometry, attention_mask, call: LayerCall, start: int, stop: int, keys: int
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Mask, in place, the keys rows start:stop do not see. Returns where the model's mask forbids a key ((B, 1, b,
    k), or None where the triangle was applied here or there is no mask) and how many keys each row sees (B, b)."""
    if call.triangle:
        # Batches are right-padded, so a real row's keys 0..i are all real: the causal triangle of the block's last b
        # keys is the whole mask (padded rows see padded keys, and are never scored). One small in-place add instead
        # of a pass over the block adding the model's mask.
        logits[..., start:stop].add_(block.causal_bias)  # (b, b) broadcast
        return None, block.visible  # (B, b)
    if attention_mask is not None:
        block_mask = attention_mask[:, :, start:stop, :keys]  # (B, 1, b, k)
        masked = is_masked(block_mask)  # (B, 1, b, k)
        if block_mask.dtype == torch.bool:
            logits.masked_fill_(masked, MASKED)  # broadcast over heads
        else:
            logits.add_(block_mask)
        return masked, keys - masked[:, 0].sum(-1)  # (B, b)
    return None, torch.full((logits.shape[0], stop - start), keys, device=logits.device)  # an encoder's full batch


def _softmax_parts(
    logits: torch.Tensor, sink_logits: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(exp_logits (B, H, b, k), Z (B, H, b), peak, mass) of masked logits in base 2, which are shifted in place so
    that each row's maximum is 0 (or below a learned sink's logit, which may outweigh every key), and floored at
    LOGIT_FLOOR (in base 2): A = exp_logits / Z. With sinks (gpt-oss, base 2 too), Z counts the sink too, and peak
    (B, H, b) = the row's largest logit over the shift (in nats), mass (B, H, b) = the share on the keys; both None
    without."""
    row_max = logits.amax(dim=-1)  # (B, H, b)
    shift = row_max if sink_logits is None else torch.maximum(row_max, sink_logits)
    logits.sub_(shift[..., None]).clamp_(min=LOGIT_FLOOR_BASE2)
    exp_logits = torch.exp2(logits)  # (B, H, b, k)
    block_z = exp_logits.sum(dim=-1)  # (B, H, b)
    if sink_logits is None:
        return exp_logits, block_z, None, None
    sink_weight = torch.exp2((sink_logits - shift).clamp(min=LOGIT_FLOOR_BASE2))  # (B, H, b)
    block_z = block_z + sink_weight
    return exp_logits, block_z, (row_max - shift) * LN2, 1.0 - sink_weight / block_z


def _block_output(exp_logits: torch.Tensor, block_z: torch.Tensor, value: torch.Tensor, keys: int) -> torch.Tensor:
    """(B, H, b, d_head): the block's rows of the layer's output, (exp(s - max) V) / Z in the values' dtype; the G
    query heads of a key/value head as G·b rows of one matmul."""
    B, H, b, _ = exp_logits.shape
    H_kv, d_head = value.shape[1], value.shape[-1]
    grouped = exp_logits.to(value.dtype).view(B, H_kv, (H // H_kv) * b, keys)  # (B, H_kv, G·b, k)
    values = torch.matmul(grouped, value[:, :, :keys]).view(B, H, b, d_head)  # (B, H, b, d_head)
    return values / block_z[..., None].to(value.dtype)


def _gathered(
    logits: torch.Tensor, block: BlockGeometry, masked: torch.Tensor | None, causal: bool, keys: int, lengths
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(gathered (B, H, b, m), gathered_visible (B, b, m)): the shifted logits (base 2) at the keys the reducer
    gathers, in nats, and whether each row sees each of them (the triangle's answer, the same in every layer, or
    this layer's mask's); None when the reducer gathers none."""
    index = block.gather_index  # (B, b, m)
    if index is None:
        return None
    B, H, b, _ = logits.shape
    gathered = logits.gather(-1, index[:, None].expand(B, H, b, index.shape[-1])).mul_(LN2)  # (B, H, b, m)
    if block.gathered_visible is not None:
        return gathered, block.gathered_visible
    if masked is None:
        in_sight = index <= (block.positions[None, :, None] if causal else keys - 1)  # (B, b, m)
    else:
        in_sight = ~masked[:, 0].gather(-1, index)  # (B, b, m)
    return gathered, in_sight & (index < lengths[:, None, None])


def _summed(
    exp_logits: torch.Tensor, block_z: torch.Tensor, positions: torch.Tensor, summed_keys: tuple[int, int]
) -> torch.Tensor:
    """(B, H, b): each row's attention on the keys S <= j <= i - R (the reducer's `summed_keys` (S, R))."""
    sink, recent = summed_keys
    keys = torch.arange(exp_logits.shape[-1], device=exp_logits.device)  # (k,)
    wanted = (keys[None, :] >= sink) & (keys[None, :] <= positions[:, None] - recent)  # (b, k)
    return (exp_logits * wanted).sum(dim=-1) / block_z


def _hand_over(
    state: CaptureState,
    call: LayerCall,
    exp_logits: torch.Tensor,
    block_z: torch.Tensor,
    positions: torch.Tensor,
    lengths: torch.Tensor,
    n_keys: int,
    keys: int,
) -> None:
    """The block to a reducer that wants blocks, and its weights of the kept window to the pictures (on the host,
    every key of the layer: those a causal block did not reach weigh 0)."""
    layer = call.layer
    wanted = state.reducer is not None and state.reducer.wants_blocks
    keep = state.keeps(layer)
    if not (wanted or keep):
        return
    block = AttentionBlock(exp_logits, block_z, positions, lengths, n_keys, call.sliding_window)
    if wanted:
        state.reducer.add_block(layer, block)
    if keep:
        H, b = exp_logits.shape[1], exp_logits.shape[2]
        kept = torch.zeros(H, b, n_keys)  # (H, b, n_k) on the host
        kept[..., :keys] = block.probs[state.keep_row].cpu()
        state.kept.setdefault(layer, []).append(kept)


@dataclass
class _LayerPieces:
    """Each block's pieces of the layer's output and per-row summaries, joined along the rows at the end."""

    outputs: list[torch.Tensor] = field(default_factory=list)
    normalizers: list[torch.Tensor] = field(default_factory=list)
    expected_logits: list[torch.Tensor] = field(default_factory=list)
    visibles: list[torch.Tensor] = field(default_factory=list)
    gathereds: list[torch.Tensor] = field(default_factory=list)
    gathered_visibles: list[torch.Tensor] = field(default_factory=list)
    peaks: list[torch.Tensor] = field(default_factory=list)
    masses: list[torch.Tensor] = field(default_factory=list)
    summeds: list[torch.Tensor] = field(default_factory=list)

    def add(self, output, normalizer, visible, peak, mass) -> None:
        self.outputs.append(output)
        self.normalizers.append(normalizer)
        self.visibles.append(visible)
        if peak is not None:
            self.peaks.append(peak)
            self.masses.append(mass)

    def add_tiled(self, output, normalizer, visible, peak, mass, expected_logit, gathered, summed) -> None:
        """A block computed in tiles (pipeline.tiles.block_in_tiles): its pieces, all at once."""
        self.add(output, normalizer, visible, peak, mass)
        if expected_logit is not None:
            self.expected_logits.append(expected_logit)
        self.add_gathered(gathered)
        if summed is not None:
            self.summeds.append(summed)

    def add_gathered(self, gathered: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        if gathered is not None:
            self.gathereds.append(gathered[0])
            self.gathered_visibles.append(gathered[1])

    def rows(self, lengths: torch.Tensor, sliding_window: int | None) -> LayerRows:
        return LayerRows(
            normalizer=joined(self.normalizers, -1),  # (B, H, n)
            expected_logit=joined(self.expected_logits, -1) if self.expected_logits else None,  # (B, H, n)
            gathered=joined(self.gathereds, -2) if self.gathereds else None,  # (B, H, n, m)
            lengths=lengths,
            visible=joined(self.visibles, -1),  # (B, n)
            gathered_visible=joined(self.gathered_visibles, -2) if self.gathered_visibles else None,  # (B, n, m)
            peak=joined(self.peaks, -1) if self.peaks else None,
            mass=joined(self.masses, -1) if self.masses else None,
            summed=joined(self.summeds, -1) if self.summeds else None,  # (B, H, n)
            sliding_window=sliding_window,
        )


# ------------------------------------------------------------------------------------- the blocks and their shape


def geometry(
    state: CaptureState, start: int, stop: int, device: torch.device, triangle: bool, gather_keys: Callable | None
) -> BlockGeometry:
    """Block `start:stop`'s geometry on `device` (`triangle`: a causal layer masked by the plain causal triangle);
    `gather_keys` is the reducer's `keys_to_gather`, or None. Computed by the batch's first layer, and what no
    window changes by the run's first batch."""
    cache_key = (start, stop, device, triangle)
    cached = state.geometries.get(cache_key)
    if cached is not None:
        return cached
    lengths = state.lengths_on(device)  # (B,)
    B, b = lengths.shape[0], stop - start
    fixed = state.run_geometry.get(cache_key)
    if fixed is None:
        positions = torch.arange(start, stop, device=device)  # (b,)
        bias = causal_bias(b, device) if triangle else None  # (b, b)
        wanted = None if gather_keys is None else gather_keys(positions, lengths)  # (b, m), (B, b, m) or None
        if wanted is not None and wanted.dim() == 3:  # the keys depend on the windows: not for other batches
            fixed = (positions, bias, None, None)
        else:
            in_sight = None if wanted is None or not triangle else wanted <= positions[:, None]  # (b, m)
            fixed = state.run_geometry[cache_key] = (positions, bias, wanted, in_sight)
    else:
        wanted = fixed[2]
    positions, bias, _, in_sight = fixed
    block = BlockGeometry(positions, bias)
    if triangle:
        block.visible = (positions + 1).expand(B, b)  # (B, b): keys 0..i
    if wanted is not None:
        m = wanted.shape[-1]
        block.gather_index = wanted.view(-1, b, m).expand(B, b, m)  # (B, b, m)
        if triangle:  # keys up to the row's own
            if in_sight is None:
                in_sight = block.gather_index <= positions[None, :, None]  # (B, b, m)
            block.gathered_visible = in_sight.expand(B, b, m)
    state.geometries[cache_key] = block
    return block


def causal_bias(size: int, device: torch.device) -> torch.Tensor:
    """(size, size) float32, MASKED above the diagonal (keys after the query), 0 elsewhere: added, not filled in,
    because a broadcast add runs twice as fast as a broadcast masked fill on the CPU."""
    return torch.full((size, size), MASKED, device=device).triu(diagonal=1)


def _block_rows(start: int, n: int, per_entry: int, budget: int, causal: bool) -> int:
    """Rows for the block starting at `start` so that rows × keys × per_entry ≈ budget, where keys grow with the
    block when causal (rows · (start + rows) = budget / per_entry, solved for rows)."""
    entries = max(1, budget // per_entry)
    if not causal:
        return max(1, entries // n)
    return max(1, int((-start + math.sqrt(start * start + 4 * entries)) / 2))


def block_budget(state: CaptureState, device: torch.device) -> int:
    """Float32 logits per window in one block on `device`, for this batch (block_bytes, once per batch)."""
    if device not in state.block_budgets:
        windows = int(state.lengths.shape[0])
        pinned = getattr(state.reducer, "block_bytes", None)  # a reducer that needs the blocks of an earlier run
        state.block_budgets[device] = pinned(device, windows) if pinned else block_bytes(device, windows)
    return state.block_budgets[device]


def block_bytes(device: torch.device, windows: int) -> int:
    """Float32 logits per window in one block of the block path: BLOCK_BYTES on the CPU (sized for its caches, and
    measured there); on a GPU, sized from its memory: a GPU_BLOCK_SHARE share of what is free (torch's cached but
    unused memory included), at most GPU_BLOCK_MAX for the batch, at least BLOCK_BYTES."""
    if device.type != "cuda":
        return BLOCK_BYTES
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return max(BLOCK_BYTES, min(free // GPU_BLOCK_SHARE, GPU_BLOCK_MAX) // max(1, windows))


def joined(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The blocks' pieces of one layer side by side along `dim` (no copy when one block held every row)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)
