"""Long rows in tiles: a block of query rows walks its keys KEY_TILE at a time with an online softmax (flash attention,
in PyTorch), for the block path on the CPU when the reducer wants per-row summaries only (`wants_tiles`).

At long context a block of rows over all of a layer's keys no longer fits the CPU's caches (9 heads × 32 rows ×
8,192 keys is 9.4 MB of float32 logits), and each of the block's elementwise passes (mask, maximum, shift, exp2,
sums) then streams it from memory: at 8,192 tokens that made the capture 1.9× the bare SDPA forward. A tile of
ROW_TILE rows × KEY_TILE keys stays in the cache. Each tile c keeps, per row, as `pipeline.fused` does on a GPU
(logits s in base 2, as the block path's: blocks.LOG2E): its maximum m_c, l_c = Σ_j 2^(s_ij − m_c), t_c = Σ_j
2^(s_ij − m_c)(s_ij − m_c) and its share of the output Σ_j 2^(s_ij − m_c) v_j. Once the block's last tile is done,
they are combined relative to the block's maximum m, with a_c = 2^(m_c − m): l = Σ_c a_c l_c, t = Σ_c a_c (t_c +
(m_c − m) l_c), acc = Σ_c a_c (its share) — the online softmax of flash attention, rescaled once per block rather
than once per tile (fewer small operations, each of which costs as much in dispatch as in arithmetic). Then, with
shift = max(m, sink logit) and c = 2^(m − shift), the block path's summaries come out of them:

    Z = c·l (+ 2^(sink − shift))      expected logit = c·(t + (m − shift)·l) / Z     output = c·acc / Z

and the logits at the keys the reducer gathers are computed again as q·k at those keys (m·d multiply-adds a row,
against n·d for the row's attention), shifted and floored like the block path's. A tile's weights are not floored
(the block path's are, at 2^−125.5 = e^−87: blocks.LOGIT_FLOOR), which changes weights below 1.6e-38 only.

Per tile that is two matrix products and five passes (maximum, exp2, Σ w, Σ w·s and its product; kvplan's reducer
reads no expected logit, so it has neither Σ w·s nor a copy of the logits: Reducer.reads). The shift by the row's
reference comes with the first product (`baddbmm`), not as a pass of its own. At 8,192 tokens, one thread, the two
products are ~75 % of the tiles' time, the passes ~20 % (torch.profiler; scripts/time_tiles.py times them).

Tiles of a causal layer masked by the plain triangle follow the block: the keys before its first row in tiles of
KEY_TILE, all seen, then the block's own square with its causal triangle (the block path's `causal_bias`); other
layers apply their mask to each tile and count the keys each row sees as they go.
"""

from __future__ import annotations

import os

import torch

from attnscope import threads
from attnscope.pipeline.blocks import (
    LN2,
    LOG2E,
    LOGIT_FLOOR_BASE2,
    MASKED,
    BlockGeometry,
    CaptureState,
    LayerCall,
    is_masked,
)

# Keys per tile, and query rows per block when the block is tiled: one tile of 9 heads is then 2.4 MB of float32
# logits, in this CPU's 32 MB L3 beside its keys and values, where a block of 32 rows over 8,192 keys is 9.4 MB.
# Measured on the 2-core CPU with an 8-layer Llama-shaped model (9 heads over 3 KV heads, d_head 64), time over
# the SDPA forward's, /tmp scripts alternating the settings: at 8,192 tokens with 2 threads, 128 × 512 1.13×,
# 64 × 512 1.16×, the block path 1.43×; with one thread (CPU time), 128 × 512 1.10×, the block path 1.26×. Again
# with the shift in the matmul (one layer's attention over SDPA's, one thread, the median of 5 rounds): 128 × 512
# 1.20×, 256 × 256 1.22×, 256 × 512 1.29×, 128 × 1,024 1.39×.
KEY_TILE = 512
ROW_TILE = 128
# Tiles are taken from this many keys on: below, a block of rows over all its keys is within the cache budget.
TILED_FROM = 2048
# ... and at least this many rows per block when a batch holds several windows (ROW_TILE // windows otherwise)
MIN_ROW_TILE = 32
# How far a tile's maximum lies below the block's (or the block's below a sink's) is floored here before it scales:
# 2^−1000 is 0 in float32 all the same, and a fully masked tile's maximum (−1e30, or an additive mask's float32
# minimum) times its total stays finite.
FAR = -1000.0
# How far a tile's maximum may pass a block's reference maximum before the block's sums are rescaled to it: its
# weights are then at most 2^16, and a row's sums over a million keys at most 2^36, far from float32's 2^128.
HEADROOM = 16.0
# Later tiles are shifted by the block's reference maximum in their matmul while every row's reference is above
# −FOLD_LIMIT: a logit, not a fully masked tile's −1e30, whose sum with q·k would lose q·k.
FOLD_LIMIT = 2.0**10


def rows_per_block(windows: int) -> int:
    """Query rows per tiled block for a batch of `windows`: a tile of every window stays about ROW_TILE rows'
    size."""
    return max(MIN_ROW_TILE, ROW_TILE // windows)


def blocks_in_tiles(jobs: list[tuple]) -> list[tuple]:
    """`block_in_tiles(*job)` for each job (a layer's blocks), in order, on as many threads as torch's intra-op
    threads, each block's operations on one of them.

    A tile's operations are too small for torch to share well between threads: a matmul over 3 key/value heads
    splits 2 + 1 on 2 threads, and reductions over a row did not get faster with a second thread at all (measured
    on the 2-core CPU: 8,192 tokens, one layer, 1.72× SDPA's time with both threads on every operation, 1.40× with
    the blocks shared between 2 threads of one). So, as SDPA shares its blocks of rows, the blocks are shared here:
    torch runs on one intra-op thread while the layer's blocks go to a pool of threads (torch releases the GIL
    inside its operations), then gets its threads back. Each block is computed by one thread with the same
    operations whichever thread it is: the results do not depend on the threads. A worker keeps the caller's
    inference mode and flushes denormals as the capture does (both are per thread)."""
    workers = torch.get_num_threads()
    if workers == 1 or len(jobs) == 1 or threads.in_worker():
        return [block_in_tiles(*job) for job in jobs]
    inference = torch.is_inference_mode_enabled()

    def run(job: tuple) -> tuple:
        torch.set_flush_denormal(True)
        with torch.inference_mode(inference):
            return block_in_tiles(*job)

    torch.set_num_threads(1)  # before the pool's threads start: a thread takes the count torch has at its first use
    try:
        return list(threads.pool(workers, os.getpid()).map(run, jobs))  # an interrupt cancels the blocks not begun
    finally:
        torch.set_num_threads(workers)


def wants_tiles(state: CaptureState, call: LayerCall, device: torch.device, n_keys: int) -> bool:
    """Whether the block path takes its rows in tiles for this layer: on the CPU, at TILED_FROM keys or more, when
    nothing needs a block's weights (a reducer wanting blocks, the pictures' maps)."""
    wanted = state.reducer is not None and state.reducer.wants_blocks
    return device.type == "cpu" and n_keys >= TILED_FROM and not wanted and not state.keeps(call.layer)


def block_in_tiles(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    call: LayerCall,
    block: BlockGeometry,
    start: int,
    stop: int,
    keys: int,
    sink_logits: torch.Tensor | None,
    lengths: torch.Tensor,
    summed_keys: tuple[int, int] | None = None,
    expected: bool = True,
):
    """The block of rows start:stop over its first `keys` keys, in tiles: (output (B, H, b, d_head) in the values'
    dtype, Z (B, H, b), visible (B, b), peak, mass (None without a sink), expected logit (B, H, b) in nats, or None
    when not `expected`, gathered (or None), summed (B, H, b): the attention on the keys S <= j <= i - R of
    `summed_keys` (S, R), or None), as block_path's steps give them. query: (B, H_kv, G, n, d_head), key and value
    (B, H_kv, n_k, d_head), contiguous; sink_logits (1, H, 1) in base 2 or None; lengths (B,) the windows' real
    tokens."""
    B, H_kv, G, _, d_head = query.shape
    H, b = H_kv * G, stop - start
    rows = (query[:, :, :, start:stop] * (call.scaling * LOG2E)).reshape(B, H_kv, G * b, d_head)  # (B, H_kv, G·b, d)
    stacked = rows.view(B * H_kv, G * b, d_head)  # (B·H_kv, G·b, d_head)
    keys_t = key.view(B * H_kv, -1, d_head).transpose(-1, -2)  # (B·H_kv, d_head, n_k)
    # the reference folded into the matmul: not through a soft cap (which comes first), nor for other dtypes
    foldable = call.softcap is None and rows.dtype == torch.float32
    sums = _TileSums(B * H_kv, expected)
    visible = None if call.triangle else torch.zeros(B, b, dtype=torch.long, device=query.device)
    for low, high in _tiles(start, stop, keys, call.triangle):
        shifted = foldable and sums.folding
        if shifted:  # s − ref in one matmul: beta · ref's negative added by the BLAS, not in a pass of its own
            logits = torch.baddbmm(sums.neg_ref, stacked, keys_t[..., low:high]).view(B, H, b, high - low)
        else:
            logits = torch.bmm(stacked, keys_t[..., low:high]).float().view(B, H, b, high - low)  # (B, H, b, c)
            logits = call.soft_capped(logits)
        if call.triangle:
            if high > start:  # the block's own square: its causal triangle
                logits.add_(block.causal_bias)
        elif attention_mask is not None:
            tile_mask = attention_mask[:, :, start:stop, low:high]  # (B, 1, b, c)
            masked = is_masked(tile_mask)
            if tile_mask.dtype == torch.bool:
                logits.masked_fill_(masked, MASKED)
            else:
                logits.add_(tile_mask)
            visible += (high - low) - masked[:, 0].sum(-1)
        else:
            visible += high - low
        sums.add(logits, shifted, value[:, :, low:high], _in_range(summed_keys, block.positions, low, high))
    if call.triangle:
        visible = block.visible
    m, total, weighted, accumulated, summed = sums.combined()  # (B, H, b) ×3, (B·H_kv, G·b, d_head), (B, H, b)
    shift = m if sink_logits is None else torch.maximum(m, sink_logits)
    lead = (m - shift).clamp(min=FAR)  # <= 0: 0 without a sink
    kept = torch.exp2(lead) * total  # c·l
    z = kept if sink_logits is None else kept + torch.exp2((sink_logits - shift).clamp(min=LOGIT_FLOOR_BASE2))
    share = torch.exp2(lead) / z  # c / Z
    output = (accumulated.view(B, H, b, d_head) * share[..., None]).to(value.dtype)
    expected_logit = None if weighted is None else share * (weighted + lead * total) * LN2
    peak, mass = (None, None) if sink_logits is None else (lead * LN2, kept / z)
    gathered = _gathered(rows, key, attention_mask, call, block, start, stop, keys, shift, lengths)
    return output, z, visible, peak, mass, expected_logit, gathered, None if summed is None else share * summed


def _tiles(start: int, stop: int, keys: int, triangle: bool) -> list[tuple[int, int]]:
    """The key ranges of the block start:stop: under the plain causal triangle, those before `start` in KEY_TILE's
    and then the block's own square; otherwise its `keys` keys in KEY_TILE's."""
    end = start if triangle else keys
    ranges = [(low, min(low + KEY_TILE, end)) for low in range(0, end, KEY_TILE)]
    return [*ranges, (start, stop)] if triangle else ranges


class _TileSums:
    """A block's online softmax over its tiles, relative to a reference maximum per row, `ref` (B, H, b), in base 2:
    l = Σ_j 2^(s_ij − ref), t = Σ_j 2^(s_ij − ref)(s_ij − ref) (when `expected`: a reducer that reads no expected
    logit spares its pass), the output's accumulator Σ_j 2^(s_ij − ref) v_j (B·H_kv, G·b, d_head, float32, added to
    in place by the tiles' matmuls) and the summed keys' share. `ref` is the first tile's maximum, and moves only
    when a tile's maximum passes it by more than HEADROOM (weights up to 2^HEADROOM are exact in float32): the sums
    are rescaled then, rarely, rather than at every tile as flash attention does, and nothing of a tile is kept once
    it is added (a block over 32,768 keys once kept 64 tiles of output products, 19 MB, and streamed them from
    memory three times to combine them). `peak` is the row's true maximum, to which `combined` refers the sums at
    the end.

    Once `ref` is known the later tiles come shifted by it from their matmul (`neg_ref`, block_in_tiles), one pass
    fewer over each, while every row's `ref` is a logit (`folding`: within FOLD_LIMIT of 0): a fully masked first
    tile's maximum (−1e30) would swallow q·k in the sum, so such a block shifts its tiles after their matmul until
    a tile with a real maximum has moved its `ref`."""

    def __init__(self, groups: int, expected: bool = True):
        self.groups, self.expected = groups, expected  # groups: B·H_kv, the tiles' matmuls' batch
        self.ref = self.neg_ref = self.peak = None
        self.folding = False
        self.total = self.weighted = self.accumulated = self.summed = None

    def add(self, logits: torch.Tensor, shifted: bool, value: torch.Tensor, in_range) -> None:
        """One tile: logits (B, H, b, c) in base 2, masked, relative to `ref` when `shifted` (else shifted here, in
        place), and its values (B, H_kv, c, d); in_range: which of its keys each row sums (`_in_range`: None for no
        sum, True, False or a (b, c) mask)."""
        B, H, b, c = logits.shape
        H_kv, d_head = value.shape[1], value.shape[-1]
        tile_max = logits.amax(dim=-1)  # (B, H, b), over `ref` when shifted
        if self.ref is None:
            self._refer(tile_max, tile_max)
        else:
            over = float((tile_max if shifted else tile_max - self.ref).max()) > HEADROOM
            if shifted:
                tile_max += self.ref
            self.peak = torch.maximum(self.peak, tile_max)
            if over:
                old = self.ref
                self._rescale(self.peak)
                if shifted:  # to the new reference
                    logits.sub_((self.ref - old)[..., None])
        if not shifted:
            logits.sub_(self.ref[..., None])  # (B, H, b, c), <= HEADROOM
        # no floor before exp2, unlike the block path's exp: exp2 has no slow path for results that underflow, and
        # the capture flushes denormals, so a masked key weighs exactly 0 (0 · −1e30 stays 0 in the weighted sum)
        weights = torch.exp2(logits) if self.expected else logits.exp2_()  # (B, H, b, c); in place: logits not read
        total = weights.sum(dim=-1)  # (B, H, b)
        summed = None
        if in_range is True:
            summed = total
        elif in_range is not None and in_range is not False:
            summed = (weights * in_range).sum(dim=-1)
        # Σ_j w_ij (s_ij − ref), multiplying in place: the logits are done (torch.linalg.vecdot, one pass without the
        # write, measured no faster: 0.12 ms a tile against 0.10; a batched (1 × c)(c × 1) product 0.7 ms)
        weighted = logits.mul_(weights).sum(dim=-1) if self.expected else None
        grouped = weights.view(B * H_kv, -1, c)  # (B·H_kv, G·b, c)
        values = value.reshape(B * H_kv, c, d_head)  # (B·H_kv, c, d_head), a view of the layer's contiguous values
        if self.total is None:
            self.total, self.weighted = total, weighted
            if in_range is not None:  # a copy: `total` itself when every key is summed, added to on its own
                self.summed = torch.zeros_like(total) if summed is None else summed.clone()
            self.accumulated = torch.bmm(grouped.to(value.dtype), values).float()  # (B·H_kv, G·b, d_head)
            return
        self.total += total
        if weighted is not None:
            self.weighted += weighted
        if summed is not None:
            self.summed += summed
        if value.dtype == torch.float32:
            self.accumulated.baddbmm_(grouped, values)  # added in place: no tile of products is kept
        else:
            self.accumulated += torch.bmm(grouped.to(value.dtype), values).float()

    def _refer(self, ref: torch.Tensor, peak: torch.Tensor) -> None:
        """`ref` (B, H, b) the reference from now on, and whether later tiles may be shifted by it in their matmul."""
        self.ref, self.peak = ref, peak
        self.folding = bool((ref > -FOLD_LIMIT).all())
        self.neg_ref = (-ref).view(self.groups, -1, 1) if self.folding else None  # (B·H_kv, G·b, 1)

    def _rescale(self, ref: torch.Tensor) -> None:
        """Refer the sums to a new reference maximum `ref` (B, H, b), at least the old one: with a = 2^(old − ref),
        l ← a·l, t ← a·(t + (old − ref)·l), the accumulator and the summed share ← a·them."""
        lead = (self.ref - ref).clamp_(min=FAR)  # (B, H, b), <= 0
        scale = torch.exp2(lead)
        if self.weighted is not None:
            self.weighted = scale * (self.weighted + lead * self.total)
        self.total = scale * self.total
        if self.summed is not None:
            self.summed = scale * self.summed
        self.accumulated = self.accumulated * scale.view(self.accumulated.shape[0], -1, 1)
        self._refer(ref, self.peak)

    def combined(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """(m, l, t or None, output accumulator, summed), relative to the block's maximum m (B, H, b) = `peak`: the
        running sums referred from `ref` to m once (see `_rescale`); the accumulator (B·H_kv, G·b, d_head) float32."""
        self._rescale(self.peak)
        return self.peak, self.total, self.weighted, self.accumulated, self.summed


def _in_range(summed_keys: tuple[int, int] | None, positions: torch.Tensor, low: int, high: int):
    """Which keys low:high each row `positions` (b,) sums, of the keys S <= j <= i - R (`summed_keys` (S, R)): None
    when nothing is summed, True for all of them (every row), False for none, else a (b, c) mask."""
    if summed_keys is None:
        return None
    sink, recent = summed_keys
    first, last = int(positions[0]), int(positions[-1])
    if high <= sink or low > last - recent:
        return False
    if low >= sink and high - 1 <= first - recent:
        return True
    keys = torch.arange(low, high, device=positions.device)  # (c,)
    return (keys[None, :] >= sink) & (keys[None, :] <= positions[:, None] - recent)  # (b, c)


def _gathered(rows, key, attention_mask, call: LayerCall, block: BlockGeometry, start, stop, keys, shift, lengths):
    """(gathered (B, H, b, m) in nats, gathered_visible (B, b, m)) at the keys the reducer gathers, as block_path's
    `_gathered` gives them, from q·k at those keys; None when it gathers none. rows: the block's queries (B, H_kv,
    G·b, d_head), scaled to base 2; shift (B, H, b) in base 2."""
    index = block.gather_index  # (B, b, m)
    if index is None:
        return None
    B, H_kv, _, d_head = rows.shape
    b, m = index.shape[1], index.shape[2]
    H = shift.shape[1]
    picked = key.transpose(1, 2)[torch.arange(B, device=key.device)[:, None, None], index]  # (B, b, m, H_kv, d)
    queries = rows.view(B, H_kv, H // H_kv, b, d_head)
    logits = torch.einsum("bkgid,bimkd->bkgim", queries, picked.to(queries.dtype)).float().reshape(B, H, b, m)
    logits = call.soft_capped(logits)
    if block.gathered_visible is not None:
        seen = block.gathered_visible  # (B, b, m)
    elif attention_mask is not None:
        masked = is_masked(attention_mask[:, 0, start:stop]).expand(B, -1, -1)  # (B, b, n_k)
        seen = ~masked.gather(-1, index) & (index < lengths[:, None, None])
    else:
        seen = (index <= (block.positions[None, :, None] if call.causal else keys - 1)) & (
            index < lengths[:, None, None]
        )
    shifted = (logits - shift[..., None]).clamp_(min=LOGIT_FLOOR_BASE2)
    shifted = torch.where(seen[:, None], shifted, LOGIT_FLOOR_BASE2)
    return shifted.mul_(LN2), seen
