"""Reducers: what the capture hands each layer's attention to. Each turns attention into exact sums (float64 sums,
integer counts) on the device where attention was computed, so partial runs add up across blocks, layers, batches,
runs and processes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnscope.pipeline.blocks import AttentionBlock, LayerRows, Reducer
from attnscope.scores import pairs, rows
from attnscope.scores.kinds import DEFAULT_WINDOW, Kind


class HeadStatistics(Reducer):
    """Running sums of every row statistic of `kind` for every (layer, head), kept on the model's device; each
    layer's sums are reduced on the device that layer ran on, and only those (H, S) sums move.

    Layers are scored together, not one by one: `add_layer` keeps a layer's per-row summaries back, and those kept
    are stacked and scored in one pass when they hold PENDING_BYTES or the run ends (`end_run`; `means` and `merge`
    score what is left too). Scoring takes some forty small tensor operations whatever the size, which on a small
    model cost more than its attention: layer by layer, the bundled demo model (2 layers × 4 heads) at 32 tokens
    spent ~0.25 ms a layer there against a ~0.75 ms forward pass; now a run of many short batches scores them all
    at once, and one batch scores its layers at once.
    """

    # Per-row summaries kept back before they are scored: ~3.5× this in temporaries while they are (one GPT-2 small
    # layer at 8 × 1024 tokens holds ~2.8 MiB, so it goes alone; a small model's many batches go together). Not more:
    # small tensors kept alive across batches pin the C heap under the batches' large temporaries (glibc cannot give
    # it back), and at 8 MiB a long run of the demo model peaked at 830 MB instead of 480 MB; at 1 MiB it stays at
    # ~480 MB, as fast (scripts and figures in docs/performance.md, "Small models").
    PENDING_BYTES = 2**20
    # On a GPU, where the fused kernel leaves scoring's forty small kernels as a layer's main cost beside its
    # attention, a batch's layers are scored in one pass (GPT-2 small at 8 × 1024 tokens: 12 layers, 33 MB); no C
    # heap to pin there.
    PENDING_BYTES_GPU = 64 * 2**20

    def __init__(self, kind: Kind, n_layer: int, n_head: int, device: torch.device, window: int = DEFAULT_WINDOW):
        self.kind = kind
        self.window = window
        self.sums = torch.zeros(n_layer, n_head, len(kind.row_score_names), dtype=torch.float64, device=device)
        self.uniform_sum = torch.zeros(n_layer, dtype=torch.float64, device=device)  # a sliding window changes it
        self.row_count = torch.zeros((), dtype=torch.long, device=device)
        self.pending: list[tuple[int, LayerRows]] = []  # layers kept back, in the order they came
        self.pending_bytes = 0
        self.pending_limit = self.PENDING_BYTES_GPU if torch.device(device).type == "cuda" else self.PENDING_BYTES

    def keys_to_gather(self, positions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.kind.gathered_keys(positions, lengths, self.window)

    def add_layer(self, layer: int, summary: LayerRows) -> None:
        """Keep layer `layer`'s per-row summaries of a batch until the run ends (or enough are kept)."""
        self.pending.append((layer, summary))
        self.pending_bytes += sum(
            part.numel() * part.element_size()
            for part in (summary.normalizer, summary.expected_logit, summary.gathered, summary.peak, summary.mass)
            if part is not None
        )
        if self.pending_bytes >= self.pending_limit:
            self.end_run()

    def end_run(self) -> None:
        """Score every layer kept back: those that can be stacked (same device, same shapes) in one pass."""
        groups: dict[tuple, list[tuple[int, LayerRows]]] = {}
        for layer, summary in self.pending:
            shape = (summary.normalizer.device, summary.normalizer.shape, summary.lengths.shape, summary.peak is None)
            gathered = None if summary.gathered is None else summary.gathered.shape
            groups.setdefault((*shape, gathered), []).append((layer, summary))
        self.pending, self.pending_bytes = [], 0
        for group in groups.values():
            self._add_layers([layer for layer, _ in group], LayerRows.stack([summary for _, summary in group]))

    def _add_layers(self, layers: list[int], summary: LayerRows) -> None:
        """Add every row of stacked summaries (LayerRows.stack), the k-th of layer `layers[k]` (of one batch or
        several, so a layer may come more than once)."""
        scores = self.kind.layer_row_scores(summary, self.window)
        positions = torch.arange(summary.normalizer.shape[-1], device=summary.normalizer.device)  # (n,)
        sums, uniform, count = rows.sum_scored_rows(self.kind, scores, positions, summary.lengths, len(layers))
        index = torch.tensor(layers, device=self.sums.device)  # (L,)
        self.sums.index_add_(0, index, sums.to(self.sums.device))  # (n_layer, H, S) += (L, H, S)
        self.uniform_sum.index_add_(0, index, uniform.to(self.sums.device))
        first = [k for k, layer in enumerate(layers) if layer == 0]
        if first:  # the scored rows are the same in every layer: count them once
            self.row_count += count[first].sum().to(self.sums.device)

    def merge(self, other: HeadStatistics) -> None:
        self.end_run()
        other.end_run()
        self.sums += other.sums.to(self.sums.device)
        self.uniform_sum += other.uniform_sum.to(self.sums.device)
        self.row_count += other.row_count.to(self.sums.device)

    def means(self) -> dict[str, torch.Tensor]:
        """name -> (n_layer, n_head) float64 on the host."""
        self.end_run()  # layers kept back by a caller that drove add_layer itself
        return rows.finish(self.kind, self.sums.cpu(), self.uniform_sum.cpu(), int(self.row_count))


class ProbeStatistics(Reducer):
    """Induction and duplicate-token sums over the second copy of the repeated-random-token probe.

    Windows are `first_query - period` BOS tokens (0 or 1), T = `period` tokens, the same T again; the second copy
    starts at `first_query`.
    """

    wants_blocks = True

    def __init__(self, n_layer: int, n_head: int, device: torch.device, period: int, first_query: int):
        self.period = period
        self.first_query = first_query
        self.sums = torch.zeros(n_layer, n_head, len(rows.PROBE_SCORES), dtype=torch.float64, device=device)
        self.row_count = torch.zeros((), dtype=torch.long, device=device)

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        attn, positions, lengths = block.probs, block.positions, block.lengths
        second_copy = (positions[None, :] >= self.first_query) & (positions[None, :] < lengths[:, None])  # (B, b)
        induction = rows.offset_attention(attn, positions, -(self.period - 1))  # (B, H, b)
        duplicate = rows.offset_attention(attn, positions, -self.period)  # (B, H, b)
        stacked = torch.stack([induction, duplicate], dim=-1)  # (B, H, b, 2)
        stacked = torch.where(second_copy[:, None, :, None], stacked, 0.0)
        self.sums[layer] += stacked.sum(dim=(0, 2), dtype=torch.float64).to(self.sums.device)  # (H, 2)
        if layer == 0:
            self.row_count += second_copy.sum().to(self.sums.device)

    def means(self) -> dict[str, torch.Tensor]:
        """name -> (n_layer, n_head) float64 on the host."""
        means = self.sums.cpu() / int(self.row_count)
        return {name: means[..., k] for k, name in enumerate(rows.PROBE_SCORES)}


class DistantAttention(Reducer):
    """kvplan's sums: for every (layer, query head), the attention each scored row gives to keys outside the first
    `sink` keys and the last `recent` keys it sees, the keys a streaming KV cache (DuoAttention's) would drop.

    For a causal row i those are the keys S <= j <= i - R (S = sink, R = recent); rows with i >= S + R, the first
    that have any, are scored (every real row from there, each weighing the same), the others left out: a row that
    sees no more than S + R keys loses nothing in a streaming cache, and counting it would dilute the score with
    zeros that say nothing about the head; `spans`, when set, narrows each window's scored rows further. A key the
    model's own mask hides (a sliding window, padding) carries no attention, so it adds nothing here either;
    `sliding_windows` keeps each layer's window as the model gave it.

        sums[l, h] = Σ_rows Σ_{S <= j <= i - R} A_ij     (float64)     row_count = scored rows (each layer's alike)

    The inner sum is the capture's (LayerRows.summed, asked for by `summed_keys`): block by block, or at long context
    on the CPU from the fused kernel's logsumexp and the sink's and recent window's keys alone (`pipeline.distant`),
    so that kvplan's score costs about a forward.
    """

    reads = frozenset({"summed"})  # of LayerRows' summaries, `add_layer` reads `summed` alone

    def __init__(self, n_layer: int, n_head: int, device: torch.device, sink: int, recent: int):
        self.sink, self.recent = sink, recent
        self.summed_keys = (sink, recent)  # the capture sums each row's attention on them (LayerRows.summed)
        self.sums = torch.zeros(n_layer, n_head, dtype=torch.float64, device=device)
        self.row_count = torch.zeros((), dtype=torch.long, device=device)
        self.sliding_windows: dict[int, int | None] = {}  # layer -> its window (None: it sees every earlier key)
        # (B, 2) long: the rows [first, end) scored in each window of the batch being run, in the batch's order
        # (kvplan's passkey probe scores the rows that predict the passkey alone); None: every row from S + R on
        self.spans: torch.Tensor | None = None

    def add_layer(self, layer: int, rows: LayerRows) -> None:
        self.sliding_windows[layer] = rows.sliding_window
        lengths = rows.lengths  # (B,)
        positions = torch.arange(rows.summed.shape[-1], device=lengths.device)  # (n,)
        scored = (positions[None, :] >= self.sink + self.recent) & (positions[None, :] < lengths[:, None])  # (B, n)
        if self.spans is not None:  # only the rows each window's span names
            spans = self.spans.to(lengths.device)  # (B, 2)
            scored &= (positions[None, :] >= spans[:, :1]) & (positions[None, :] < spans[:, 1:])  # (B, n)
        mass = torch.where(scored[:, None, :], rows.summed, 0.0)  # (B, H, n)
        self.sums[layer] += mass.sum(dim=(0, 2), dtype=torch.float64).to(self.sums.device)  # (H,)
        if layer == 0:
            self.row_count += scored.sum().to(self.row_count.device)

    def means(self) -> torch.Tensor:
        """(n_layer, n_head) float64 on the host: the mean over scored rows (NaN when no row was scored)."""
        count = int(self.row_count)
        return self.sums.cpu() / count if count else torch.full_like(self.sums.cpu(), float("nan"))


class RetrievalStatistics(Reducer):
    """Retrieval hits over the copy of the needle probe (`pipeline.needle`, `scores.rows.retrieval_hits`): exact
    integer counts of the rows whose strongest key is the needle token being copied, per (layer, head).

    Fed the blocks of one batch of the probe's windows, `needle_starts` (B,) each window's needle start in the
    batch's order (`Needle.batch`). Only the copy's rows (from `first_query`) matter: a block before them costs one
    comparison, and of a block that reaches them only their rows are looked at. The argmax is taken over the block's
    exp of shifted logits, in the order of the weights; a row of a learned-sink family (gpt-oss) whose every key
    lies more than 87 nats below the sink has them all clamped alike (blocks.LOGIT_FLOOR), and its strongest key is
    then taken as the first.
    """

    wants_blocks = True

    def __init__(self, n_layer: int, n_head: int, device: torch.device, first_query: int, needle_starts: torch.Tensor):
        self.first_query = first_query
        self.needle_starts = needle_starts
        self.hits = torch.zeros(n_layer, n_head, dtype=torch.long, device=device)
        self.row_count = torch.zeros((), dtype=torch.long, device=device)

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        first, last = int(block.positions[0]), int(block.positions[-1])
        if last < self.first_query:
            return
        copy = slice(max(0, self.first_query - first), None)  # the block's rows from the copy's first on
        starts = self.needle_starts.to(block.exp_logits.device)
        hits, count = rows.retrieval_hits(
            block.exp_logits[:, :, copy], block.positions[copy], block.lengths, self.first_query, starts
        )  # (H,), ()
        self.hits[layer] += hits.to(self.hits.device)
        if layer == 0:
            self.row_count += count.to(self.hits.device)

    def means(self) -> dict[str, torch.Tensor]:
        """retrieval -> (n_layer, n_head) float64 on the host: hits over the rows of the copy."""
        return {"retrieval": self.hits.cpu().double() / int(self.row_count)}


class LayerBuffer:
    """The attention of several layers of one batch, heads side by side, (B, L·H, n, n) for the layers `layers` in
    their order: a pair of heads may span two layers whose attention exists at different moments of the forward
    pass, so a reducer that compares them copies each block here (`add_block`) and reduces the whole batch once it
    has run (`take`). The caller sizes batches so that this fits in memory (diversity's `layers_fit`)."""

    def __init__(self, layers: Sequence[int]):
        self.layers = list(layers)
        self.maps: torch.Tensor | None = None  # (B, L·H, n, n), made by the batch's first block
        self.lengths: torch.Tensor | None = None  # (B,)

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        """Copy one block of query rows of `layer` (one of `layers`) into its place; keys the block did not reach
        (after a causal block's last row) stay 0."""
        attn, positions = block.probs, block.positions  # (B, H, b, k)
        B, H, _, k = attn.shape
        if self.maps is None:
            n = block.n_keys
            self.maps = torch.zeros(B, len(self.layers) * H, n, n, dtype=attn.dtype, device=attn.device)
            self.lengths = block.lengths
        first = self.layers.index(layer) * H
        self.maps[:, first : first + H, int(positions[0]) : int(positions[-1]) + 1, :k] = attn

    def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(maps (B, L·H, n, n), lengths (B,)) of the batch buffered, emptying the buffer; None when it is empty."""
        if self.maps is None:
            return None
        taken = (self.maps, self.lengths)
        self.maps, self.lengths = None, None
        return taken


class DiversityStatistics(Reducer):
    """Pairwise sums (dot products, JSD, sqrt JSD) between the heads of `layers`, over the scored rows of `kind`.

    One layer: each block the capture hands over holds all its heads, so pairs are summed block by block and
    nothing is stored. Several layers: their blocks are copied into a LayerBuffer until the batch ends (`flush`, the
    capture's `on_batch`), then reduced.
    """

    wants_blocks = True

    def __init__(self, kind: Kind, layers: list[int], n_head: int, device: torch.device):
        self.kind = kind
        self.layers = list(layers)
        self.n_head = n_head
        K = len(self.layers) * n_head
        self.dots = torch.zeros(K, K, dtype=torch.float64, device=device)
        self.js = torch.zeros(K, K, dtype=torch.float64, device=device)
        self.js_root = torch.zeros(K, K, dtype=torch.float64, device=device)
        self.row_count = torch.zeros((), dtype=torch.long, device=device)
        self.buffer = LayerBuffer(self.layers)  # for several layers

    def _add(self, attn: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor) -> None:
        scored = self.kind.scored_rows(lengths, positions)  # (B, b)
        # a causal row's keys end at the row: the keys after a chunk's last row may be skipped
        dots, js, js_root = pairs.pairwise_sums(attn, scored, positions if self.kind.causal else None)
        self.dots += dots.to(self.dots.device)
        self.js += js.to(self.dots.device)
        self.js_root += js_root.to(self.dots.device)
        self.row_count += scored.sum().to(self.dots.device)

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        if layer not in self.layers:
            return
        if len(self.layers) == 1:  # k = keys up to the block's last row
            self._add(block.probs, block.positions, block.lengths)  # (B, H, b, k)
            return
        self.buffer.add_block(layer, block)

    def flush(self, _batch=None) -> None:
        """Reduce the buffered batch: heads of all layers side by side."""
        buffered = self.buffer.take()
        if buffered is not None:
            maps, lengths = buffered  # (B, K, n, n), (B,)
            self._add(maps, torch.arange(maps.shape[2], device=maps.device), lengths)

    def results(self) -> dict[str, torch.Tensor]:
        """(K, K) float64 on the host: cosine, js (mean JSD, bits), js_distance (mean sqrt JSD)."""
        return pairs.similarity(self.dots.cpu(), self.js.cpu(), self.js_root.cpu(), int(self.row_count))


class QueryRowReducer(Reducer):
    """Keeps rows `positions` of window 0's attention, every layer: rows[layer] is (H, P, n_keys) float32 on the
    host, one row per position asked for, in that order. In a causal model the keys after a query weigh exactly 0
    (the capture leaves masked keys a weight of at most 1.6e-38, see blocks.LOGIT_FLOOR)."""

    wants_blocks = True

    def __init__(self, kind: Kind, positions: Sequence[int]):
        self.kind = kind
        self.positions = list(positions)
        self.parts: dict[int, dict[int, Any]] = {}  # layer -> index of the position -> (H, n_keys)

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        first, last = int(block.positions[0]), int(block.positions[-1])
        for index, position in enumerate(self.positions):
            if not first <= position <= last:
                continue
            r = position - first
            row = block.exp_logits[0, :, r] / block.normalizer[0, :, r, None]  # (H, k)
            full = row.new_zeros(row.shape[0], block.n_keys)  # (H, n_keys): keys the block did not reach weigh 0
            full[:, : row.shape[1]] = row
            if self.kind.causal:
                full[:, position + 1 :] = 0
            self.parts.setdefault(layer, {})[index] = full.cpu()

    @property
    def rows(self) -> dict[int, Any]:
        """layer -> (H, P, n_keys): the rows of `positions`, in their order."""
        return {
            layer: torch.stack([parts[index] for index in range(len(self.positions))], dim=1)
            for layer, parts in self.parts.items()
        }
