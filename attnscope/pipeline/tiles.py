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
# 64 × 512 1.16×, the block path 1.43×; with one thread (CPU time), 128 × 512 1.10×, the block path 1.26×.
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
):
    """The block of rows start:stop over its first `keys` keys, in tiles: (output (B, H, b, d_head) in the values'
    dtype, Z (B, H, b), visible (B, b), peak, mass (None without a sink), expected logit (B, H, b) in nats, gathered
    (or None), summed (B, H, b): the attention on the keys S <= j <= i - R of `summed_keys` (S, R), or None), as
    block_path's steps give them. query: (B, H_kv, G, n, d_head), key and value (B, H_kv, n_k, d_head),
    sink_logits (1, H, 1) in base 2 or None; lengths (B,) the windows' real tokens."""
    B, H_kv, G, _, d_head = query.shape
    H, b = H_kv * G, stop - start
    rows = (query[:, :, :, start:stop] * (call.scaling * LOG2E)).reshape(B, H_kv, G * b, d_head)  # (B, H_kv, G·b, d)
    keys_t = key.transpose(-1, -2)  # (B, H_kv, d_head, n_k)
    sums = _TileSums()
    visible = None if call.triangle else torch.zeros(B, b, dtype=torch.long, device=query.device)
    for low, high in _tiles(start, stop, keys, call.triangle):
        logits = torch.matmul(rows, keys_t[..., low:high]).float().view(B, H, b, high - low)  # (B, H, b, c)
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
        sums.add(logits, value[:, :, low:high], _in_range(summed_keys, block.positions, low, high))
    if call.triangle:
        visible = block.visible
    m, total, weighted, accumulated, summed = sums.combined()  # (B, H, b) ×3, (B, H_kv, G·b, d_head), (B, H, b)
    shift = m if sink_logits is None else torch.maximum(m, sink_logits)
    lead = (m - shift).clamp(min=FAR)  # <= 0: 0 without a sink
    kept = torch.exp2(lead) * total  # c·l
    z = kept if sink_logits is None else kept + torch.exp2((sink_logits - shift).clamp(min=LOGIT_FLOOR_BASE2))
    share = torch.exp2(lead) / z  # c / Z
    output = (accumulated.view(B, H, b, d_head) * share[..., None]).to(value.dtype)
    expected = share * (weighted + lead * total) * LN2
    peak, mass = (None, None) if sink_logits is None else (lead * LN2, kept / z)
    gathered = _gathered(rows, key, attention_mask, call, block, start, stop, keys, shift, lengths)
    return output, z, visible, peak, mass, expected, gathered, None if summed is None else share * summed


def _tiles(start: int, stop: int, keys: int, triangle: bool) -> list[tuple[int, int]]:
    """The key ranges of the block start:stop: under the plain causal triangle, those before `start` in KEY_TILE's
    and then the block's own square; otherwise its `keys` keys in KEY_TILE's."""
    end = start if triangle else keys
    ranges = [(low, min(low + KEY_TILE, end)) for low in range(0, end, KEY_TILE)]
    return [*ranges, (start, stop)] if triangle else ranges


class _TileSums:
    """A block's softmax over its tiles: each tile's own maximum m_c (B, H, b), total l_c, weighted t_c (see the
    module, relative to m_c) and output products (B, H_kv, G·b, d_head), kept until the block's last tile and then
    combined at once (`combined`): a tile costs its few large operations, and the rescaling is done once per block
    rather than once per tile."""

    def __init__(self):
        self.maxima, self.totals, self.weighteds, self.products, self.summeds = [], [], [], [], []

    def add(self, logits: torch.Tensor, value: torch.Tensor, in_range) -> None:
        """One tile: logits (B, H, b, c) in base 2, masked (shifted in place), and its values (B, H_kv, c, d);
        in_range: which of its keys each row sums (`_in_range`: None for no sum, True, False or a (b, c) mask)."""
        B, H, b, c = logits.shape
        tile_max = logits.amax(dim=-1)  # (B, H, b)
        # no floor before exp2, unlike the block path's exp: exp2 has no slow path for results that underflow, and
        # the capture flushes denormals, so a masked key weighs exactly 0 (0 · −1e30 stays 0 in the weighted sum)
        weights = torch.exp2(logits.sub_(tile_max[..., None]))  # (B, H, b, c)
        self.maxima.append(tile_max)
        total = weights.sum(dim=-1)  # (B, H, b)
        self.totals.append(total)
        if in_range is True:
            self.summeds.append(total)
        elif in_range is False:
            self.summeds.append(torch.zeros_like(total))
        elif in_range is not None:
            self.summeds.append((weights * in_range).sum(dim=-1))
        self.weighteds.append(torch.linalg.vecdot(weights, logits))  # Σ_j w_ij (s_ij − m_c)
        self.products.append(torch.matmul(weights.to(value.dtype).view(B, value.shape[1], -1, c), value))

    def combined(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(m, l, t, output accumulator, summed) over all tiles, relative to the block's maximum m (B, H, b): with a_c
        = 2^(m_c − m), l = Σ_c a_c l_c, t = Σ_c a_c (t_c + (m_c − m) l_c), output = Σ_c a_c products_c (float32),
        summed = Σ_c a_c summed_c (None when no tile summed)."""
        maxima = torch.stack(self.maxima)  # (T, B, H, b)
        m = maxima.amax(dim=0)
        lead = (maxima - m).clamp_(min=FAR)  # (T, B, H, b), <= 0
        scale = torch.exp2(lead)
        totals = torch.stack(self.totals)
        total = (scale * totals).sum(dim=0)
        weighted = (scale * (torch.stack(self.weighteds) + lead * totals)).sum(dim=0)
        products = torch.stack(self.products).float()  # (T, B, H_kv, G·b, d)
        T, B, H_kv, Gb, _ = products.shape
        output = (products * scale.view(T, B, H_kv, Gb, 1)).sum(dim=0)  # (B, H_kv, G·b, d)
        summed = (scale * torch.stack(self.summeds)).sum(dim=0) if self.summeds else None
        return m, total, weighted, output, summed


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
