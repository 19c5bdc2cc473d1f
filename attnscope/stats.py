"""Stage 4: per-head statistics accumulated exactly (sums and counts) across blocks, layers, batches and runs."""

from __future__ import annotations

import torch

from attnscope import metrics
from attnscope.capture import AttentionBlock, LayerRows, Reducer


class HeadStatistics(Reducer):
    """Running sums of every row statistic for every (layer, head), kept on the device the model runs on.

    Sums are float64 and counts integers, so two partial runs merged with `merge` give the same means as one run.
    """

    def __init__(
        self, n_layer: int, n_head: int, device: torch.device, window: int = metrics.DEFAULT_WINDOW, causal: bool = True
    ):
        self.window = window
        self.causal = causal  # False: an encoder, scored and summed by the bidirectional definitions (see metrics)
        names = metrics.row_score_names(causal)
        self.sums = torch.zeros(n_layer, n_head, len(names), dtype=torch.float64, device=device)
        self.uniform_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.row_count = torch.zeros((), dtype=torch.long, device=device)

    def keys_to_gather(self, positions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.causal:
            return metrics.gathered_keys(positions, self.window)  # (b, w+2)
        return metrics.encoder_gathered_keys(positions, lengths, self.window)  # (B, b, 2w+3)

    def add_layer(self, layer: int, rows: LayerRows) -> None:
        """Add every row of layer `layer` of a batch, from the capture's per-row summaries."""
        scores = metrics.layer_row_scores(
            rows.normalizer, rows.expected_logit, rows.gathered, self.window, rows.lengths, self.causal
        )
        positions = torch.arange(rows.normalizer.shape[-1], device=rows.normalizer.device)  # (n,)
        sums, uniform, count = metrics.sum_scored_rows(scores, positions, rows.lengths, self.window, self.causal)
        self.sums[layer] += sums
        if layer == 0:  # row-level quantities are the same for every layer: count them once
            self.uniform_sum += uniform
            self.row_count += count

    def merge(self, other: "HeadStatistics") -> None:
        self.sums += other.sums.to(self.sums.device)
        self.uniform_sum += other.uniform_sum.to(self.sums.device)
        self.row_count += other.row_count.to(self.sums.device)

    def means(self) -> dict[str, torch.Tensor]:
        """name -> (n_layer, n_head) float64 on the host."""
        return metrics.finish(self.sums.cpu(), float(self.uniform_sum), int(self.row_count), self.causal)


class ProbeStatistics(Reducer):
    """Induction and duplicate-token sums over the second copy of the repeated-random-token probe.

    Windows are `first_query - period` BOS tokens (0 or 1), T = `period` tokens, the same T again; the second copy
    starts at `first_query`.
    """

    SCORES = ("induction", "duplicate_token")
    wants_blocks = True

    def __init__(self, n_layer: int, n_head: int, device: torch.device, period: int, first_query: int):
        self.period = period
        self.first_query = first_query
        self.sums = torch.zeros(n_layer, n_head, 2, dtype=torch.float64, device=device)
        self.row_count = torch.zeros((), dtype=torch.long, device=device)

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        attn, positions, lengths = block.probs, block.positions, block.lengths
        second_copy = (positions[None, :] >= self.first_query) & (positions[None, :] < lengths[:, None])  # (B, b)
        induction = metrics.offset_attention(attn, positions, -(self.period - 1))  # (B, H, b)
        duplicate = metrics.offset_attention(attn, positions, -self.period)  # (B, H, b)
        stacked = torch.stack([induction, duplicate], dim=-1)  # (B, H, b, 2)
        stacked = torch.where(second_copy[:, None, :, None], stacked, 0.0)
        self.sums[layer] += stacked.sum(dim=(0, 2), dtype=torch.float64)  # (H, 2)
        if layer == 0:
            self.row_count += second_copy.sum()

    def means(self) -> dict[str, torch.Tensor]:
        """name -> (n_layer, n_head) float64 on the host."""
        means = self.sums.cpu() / int(self.row_count)
        return {name: means[..., k] for k, name in enumerate(self.SCORES)}


class DiversityStatistics(Reducer):
    """Pairwise sums (dot products, JSD, sqrt JSD) between the heads of `layers`, over scored rows (see
    metrics.scored_rows: a decoder's rows 1 .. length-1, an encoder's 1 .. length-2).

    One layer: each block the capture hands over holds all its heads, so pairs are summed block by block and
    nothing is stored. Several layers: a pair may span two layers whose attention exists at different moments of
    the forward pass, so those layers' blocks are copied into one buffer (B, L·H, n, n) until the batch ends
    (`flush`, the capture's `on_batch`), then reduced; the caller sizes batches so that this stays within memory.
    """

    wants_blocks = True

    def __init__(self, layers: list[int], n_head: int, device: torch.device, causal: bool = True):
        self.layers = list(layers)
        self.causal = causal  # an encoder scores rows 1 .. length-2, and every key of them may be nonzero
        self.n_head = n_head
        K = len(self.layers) * n_head
        self.dots = torch.zeros(K, K, dtype=torch.float64, device=device)
        self.js = torch.zeros(K, K, dtype=torch.float64, device=device)
        self.js_root = torch.zeros(K, K, dtype=torch.float64, device=device)
        self.row_count = torch.zeros((), dtype=torch.long, device=device)
        self.buffer: torch.Tensor | None = None  # (B, K, n, n) for several layers
        self.lengths: torch.Tensor | None = None

    def _add(self, attn: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor) -> None:
        scored = metrics.scored_rows(lengths, positions, self.causal)  # (B, b)
        dots, js, js_root = metrics.pairwise_sums(attn, scored, positions if self.causal else None)
        self.dots += dots
        self.js += js
        self.js_root += js_root
        self.row_count += scored.sum()

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        if layer not in self.layers:
            return
        attn, positions = block.probs, block.positions  # (B, H, b, k), k = keys up to the block's last row
        if len(self.layers) == 1:
            self._add(attn, positions, block.lengths)
            return
        B, H, _, k = attn.shape
        if self.buffer is None:
            n = block.n_keys
            self.buffer = torch.zeros(B, len(self.layers) * H, n, n, dtype=attn.dtype, device=attn.device)
            self.lengths = block.lengths
        first = self.layers.index(layer) * H
        self.buffer[:, first : first + H, int(positions[0]) : int(positions[-1]) + 1, :k] = attn

    def flush(self, _batch=None) -> None:
        """Reduce the buffered batch: heads of all layers side by side."""
        if self.buffer is None:
            return
        maps, self.buffer = self.buffer, None
        self._add(maps, torch.arange(maps.shape[2], device=maps.device), self.lengths)

    def results(self) -> dict[str, torch.Tensor]:
        """(K, K) float64 on the host: cosine, js (mean JSD, bits), js_distance (mean sqrt JSD)."""
        count = int(self.row_count)
        if count == 0:
            raise ValueError("no scored rows")
        dots = self.dots.cpu()
        norms = dots.diagonal().sqrt()
        return {
            "cosine": dots / (norms[:, None] * norms[None, :]).clamp(min=1e-300),
            "js": self.js.cpu() / count,
            "js_distance": self.js_root.cpu() / count,
        }
