"""How far each head's attention moved between two models run on the same windows: the mean Jensen–Shannon
divergence between their rows, without ever holding a layer's maps of either model.

The two models are never in memory together. While the first runs, `SpoolWriter` writes every block of query rows
the capture hands over to a temporary file (`AttentionSpool`, float32, the rows as computed); while the second runs,
`DivergenceStatistics` reads the same rows back, block by block as the second model produces them, and reduces each pair
of rows to per-head sums on the device: Σ JSD(A_first[i], A_second[i]) over the scored rows (kinds' `scored_rows`,
the rows every score of `heads` averages over). Nothing but one block of each model exists at a time; the file holds
one model's rows (for a causal model only the keys each row sees: (n + 1) n / 2 per head and window).

Rows are stored by position, not by block: a region per (batch, layer) whose row r starts after the keys of rows
0..r-1, so the second run finds its rows whatever its block sizes (a GPU sizes blocks by its free memory). Both runs
must batch the windows alike (the same texts, tokenizer and batching settings: the compare analysis sees to it);
the lengths of every batch are checked, and a difference is refused rather than compared row against wrong row.

Exactness: the rows are float32 as the capture computed them, and JSD(p, p) is exactly 0 in floating point
(m = (p + p) / 2 = p, so H(m) - (H(p) + H(p)) / 2 = 0), so a head whose maps did not change (identical weights up to
it) shows exactly 0. Keys a causal row does not see are set to 0 in both rows (the capture leaves them a weight of
at most 1.6e-38, blocks.LOGIT_FLOOR, and a block of the second run may reach further than the first's).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from attnscope.errors import AttnscopeError
from attnscope.pipeline.blocks import AttentionBlock, LayerRows, Reducer
from attnscope.scores import pairs
from attnscope.scores.kinds import Kind

FLOAT_BYTES = 4


class Reducers(Reducer):
    """Several reducers fed by one capture: blocks go to those that want them, every layer's summaries to all.
    At most one of them may gather keys (HeadStatistics does)."""

    def __init__(self, *reducers: Reducer):
        self.reducers = reducers
        self.wants_blocks = any(reducer.wants_blocks for reducer in reducers)
        summed = {reducer.summed_keys for reducer in reducers} - {None}
        assert len(summed) <= 1, "reducers combined must want the same summed keys"
        self.summed_keys = next(iter(summed), None)
        pinned = [reducer.block_bytes for reducer in reducers if hasattr(reducer, "block_bytes")]
        if pinned:  # the block path's sizes, as one of them needs them (see block_path.block_budget)
            self.block_bytes = pinned[0]

    def keys_to_gather(self, positions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor | None:
        for reducer in self.reducers:
            wanted = reducer.keys_to_gather(positions, lengths)
            if wanted is not None:
                return wanted
        return None

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        for reducer in self.reducers:
            if reducer.wants_blocks:
                reducer.add_block(layer, block)

    def add_layer(self, layer: int, rows: LayerRows) -> None:
        for reducer in self.reducers:
            reducer.add_layer(layer, rows)

    def end_run(self) -> None:
        for reducer in self.reducers:
            reducer.end_run()


class AttentionSpool:
    """A temporary file of one model's attention rows, removed by `close` (also on an error or Ctrl-C: use it as a
    context manager). `regions[(batch, layer)]` = (first float of the region, lengths of the batch's windows, heads,
    keys of the batch); rows are stored by position (see the module docstring)."""

    def __init__(self, kind: Kind, folder: str | os.PathLike | None = None):
        self.kind = kind
        descriptor, name = tempfile.mkstemp(prefix="attnscope-compare-", suffix=".f32", dir=folder)
        self.path = Path(name)
        self.file: Any = os.fdopen(descriptor, "wb")
        self.regions: dict[tuple[int, int], tuple[int, tuple[int, ...], int, int]] = {}
        self.floats = 0  # written so far
        self.budgets: list[int] = []  # the block path's budget of each batch (and device) of the first run
        self.mapped: Any = None  # the file, memory-mapped for reading once written

    def __enter__(self) -> AttentionSpool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def bytes(self) -> int:
        return self.floats * FLOAT_BYTES

    def entries(self, row: int, n_keys: int) -> int:
        """Stored keys of rows 0..row-1 (per window and head): a causal row r stores its r + 1 keys."""
        return row * (row + 1) // 2 if self.kind.causal else row * n_keys

    def stored_keys(self, positions: torch.Tensor, keys: int) -> torch.Tensor:
        """(b, keys) bool: the keys of rows `positions` that are stored (those a causal row sees; all otherwise)."""
        if not self.kind.causal:
            return torch.ones(len(positions), keys, dtype=torch.bool, device=positions.device)
        return torch.arange(keys, device=positions.device)[None, :] <= positions[:, None]  # (b, k)

    def write(self, batch: int, layer: int, block: AttentionBlock) -> None:
        """Append one block of rows of (batch, layer); the blocks of a layer come in row order."""
        B, H, b, k = block.exp_logits.shape
        key = (batch, layer)
        if key not in self.regions:
            self.regions[key] = (self.floats, tuple(int(n) for n in block.lengths), H, block.n_keys)
        stored = block.probs.permute(2, 3, 0, 1)[self.stored_keys(block.positions, k)]  # (entries, B, H)
        data = stored.float().contiguous().cpu().numpy()
        try:
            self.file.write(data.tobytes())
        except OSError as error:
            raise AttnscopeError(
                f"cannot write the first model's attention to {self.path.parent} ({error.strerror or error}) after "
                f"{self.bytes / 2**30:.2f} GiB: set TMPDIR to a folder with more room, or give fewer texts"
            ) from None
        self.floats += data.size

    def finish(self) -> None:
        """The first model has run: map the file for reading."""
        import numpy as np

        self.file.close()
        self.mapped = np.memmap(self.path, dtype=np.float32, mode="r") if self.floats else np.zeros(0, np.float32)

    def read(self, batch: int, layer: int, block: AttentionBlock) -> torch.Tensor:
        """(B, H, b, k) the first model's rows of the rows of `block` (of the second model), 0 at keys not stored."""
        B, H, b, k = block.exp_logits.shape
        region = self.regions.get((batch, layer))
        lengths = tuple(int(n) for n in block.lengths)
        if region is None or region[1] != lengths or region[2:] != (H, block.n_keys):
            raise AttnscopeError(
                "the two models did not read the texts in the same windows (batch "
                f"{batch}, layer {layer}); their attention rows cannot be compared"
            )
        start, stop = int(block.positions[0]), int(block.positions[-1]) + 1
        first = region[0] + self.entries(start, block.n_keys) * B * H
        last = region[0] + self.entries(stop, block.n_keys) * B * H
        import numpy as np

        stored = torch.from_numpy(np.array(self.mapped[first:last])).view(-1, B, H).to(block.exp_logits.device)
        rows = torch.zeros(b, k, B, H, device=stored.device)  # (b, k, B, H)
        rows[self.stored_keys(block.positions, k)] = stored
        return rows.permute(2, 3, 0, 1).contiguous()  # (B, H, b, k), laid out as the second model's rows

    def close(self) -> None:
        """Remove the file (whatever happened)."""
        self.mapped = None
        if not self.file.closed:
            self.file.close()
        self.path.unlink(missing_ok=True)


class _Batches(Reducer):
    """Counts the batches of a capture from its blocks: a batch begins with layer 0's first block. Both runs cut
    each batch's layers into the same blocks (`block_bytes`, read by block_path.block_budget): the first run's sizes
    are noted and the second takes them, because a matmul over blocks of other sizes may round otherwise, and a head
    whose maps did not change must show exactly 0 (on a GPU the sizes follow the free memory, which differs)."""

    wants_blocks = True

    def __init__(self, spool: AttentionSpool) -> None:
        self.batch = -1
        self.spool = spool
        self.budgets = 0  # block sizes handed out in this run

    def block_bytes(self, device: Any, windows: int) -> int:
        """The block path's budget for this batch on `device`: the first run's own, noted; the second run's, read."""
        from attnscope.pipeline import block_path

        noted = self.spool.budgets
        if isinstance(self, SpoolWriter):
            noted.append(block_path.block_bytes(torch.device(device), windows))
        elif self.budgets >= len(noted):
            raise AttnscopeError("the two models did not read the texts in the same batches; they cannot be compared")
        self.budgets += 1
        return noted[self.budgets - 1]

    def _count(self, layer: int, block: AttentionBlock) -> int:
        if layer == 0 and int(block.positions[0]) == 0:
            self.batch += 1
        return self.batch


class SpoolWriter(_Batches):
    """Reducer of the first model: every block of rows into `spool`."""

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        self.spool.write(self._count(layer, block), layer, block)

    def end_run(self) -> None:
        self.spool.finish()


class DivergenceStatistics(_Batches):
    """Reducer of the second model: Σ JSD (bits) between its rows and the first model's (read from `spool`), per
    (layer, head), over the scored rows, on the device; `means()` divides by the rows counted."""

    def __init__(self, spool: AttentionSpool, n_layer: int, n_head: int, device: Any):
        super().__init__(spool)
        self.kind = spool.kind
        self.sums = torch.zeros(n_layer, n_head, dtype=torch.float64, device=device)
        self.row_count = torch.zeros((), dtype=torch.long, device=device)

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        batch = self._count(layer, block)
        first = self.spool.read(batch, layer, block)  # (B, H, b, k)
        k = first.shape[-1]
        seen = self.spool.stored_keys(block.positions, k)  # (b, k)
        second = torch.where(seen, block.probs, 0.0).contiguous()  # (B, H, b, k)
        # both rows laid out alike, so that equal rows are summed in the same order: JSD(p, p) is then exactly 0
        divergence = pairs.js_divergence(first, second)  # (B, H, b) bits
        scored = self.kind.scored_rows(block.lengths, block.positions)  # (B, b)
        divergence = torch.where(scored[:, None, :], divergence, 0.0)
        self.sums[layer] += divergence.sum(dim=(0, 2), dtype=torch.float64).to(self.sums.device)  # (H,)
        if layer == 0:
            self.row_count += scored.sum().to(self.sums.device)

    def means(self) -> torch.Tensor:
        """(n_layer, n_head) float64 on the host: the mean JSD in bits over the scored rows."""
        return self.sums.cpu() / max(int(self.row_count), 1)
