"""What a removed head's output becomes (`--ablation`): zero, its mean, or another window's output at the same
position; one definition for `ablate` and `circuit` (its replay, its naive reference and its gradient).

A head's output is its slice of the output projection's input z (B, n, H·d_head), head h in columns
h·d_head .. (h+1)·d_head, where `pipeline.interventions.HeadGates` gates it. Removing head h replaces z_h by r:

    zero      r = 0: what Michel et al. 2019 mask; off the model's distribution (Wang et al. 2022, Chan et al. 2022)
    mean      r = m_h, the mean of z_h over every real position of every window of the input (the first, BOS or
              [CLS], included), the same vector at every position (Wang et al. 2022, IOI's mean ablation)
    resample  r(w, i) = z_h(d(w), i): the head's output at the same position i of a donor window d(w) ≠ w of the same
              input, run through the intact model (Chan et al. 2022, causal scrubbing; Conmy et al. 2023, ACDC)

The mean is over the positions where the replacement is made: every real position (padding excluded), since the
replacement is made at every position (which is also what a weight can hold: `models.removal`). The input is what
the removals are scored on: `ablate`'s loss windows (an encoder's with its [MASK]s in place), or, for `circuit`, the
texts for the scores of the texts and each probe's windows for that probe's scores, each with its own means and
donors.

Donors (`donors`): window w's donor is drawn uniformly, by a numpy generator seeded `seed`, among the other windows
of the input at least as long as w, so that every position of w exists in it; windows of one text count as others
(a long text gives several). The one window longer than every other, if there is one, draws among the longest
others, and takes the mean at its positions past the donor's end, which no other window has (the mean is what a
resample estimates). An input of one window has no donor: refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.pipeline import interventions
from attnscope.pipeline.tokens import Window, pad_id

if TYPE_CHECKING:
    from attnscope.models.loading import LoadedModel
    from attnscope.pipeline.tokens import Batch

ABLATIONS = options.ABLATIONS


def donors(lengths: Sequence[int], seed: int) -> list[int]:
    """Each window's donor (an index into `lengths`, never its own): drawn uniformly among the other windows at least
    as long, the longest window (when no other is as long) among the longest others; one numpy generator seeded
    `seed` draws for the windows in order."""
    count = len(lengths)
    if count < 2:
        raise AttnscopeError(
            "resample ablation takes each head's output from another window of the texts, and there is one window: "
            "give more text, or use ablation mean"
        )
    lengths = np.asarray(lengths)  # (N,)
    order = np.argsort(-lengths, kind="stable")  # longest first
    rank = np.empty(count, dtype=np.int64)
    rank[order] = np.arange(count)  # (N,) each window's place in `order`
    longer = np.searchsorted(-lengths[order], -lengths, side="right")  # (N,) windows at least as long, itself too
    second = int(np.sum(lengths[order] == lengths[order][1]))  # windows of the second-longest length (if unique max)
    generator = np.random.default_rng(seed)
    chosen = []
    for window in range(count):
        others = int(longer[window]) - 1
        if others == 0:  # the longest, alone: among the longest others, order[1 .. second]
            chosen.append(int(order[1 + generator.integers(second)]))
            continue
        pick = int(generator.integers(others))  # among order[0 .. others], skipping the window itself
        chosen.append(int(order[pick if pick < rank[window] else pick + 1]))
    return chosen


class _Outputs:
    """Forward pre-hooks on the output projections of the layers below `top`, handing each layer's heads' outputs
    (B, n, H·d_head) to `on_heads(layer, z)`; the forward stops (`interventions.Stop`) once layer top−1's are in."""

    def __init__(self, top: int, on_heads: Callable[[int, Any], None]):
        self.top = top
        self.on_heads = on_heads

    def install(self, loaded: LoadedModel) -> Iterator[interventions.Handle]:
        for layer, module in enumerate(loaded.family.output_projections(loaded.model)[: self.top]):
            yield module.register_forward_pre_hook(self._hook(layer))

    def _hook(self, layer: int) -> Callable:
        def record(module: Any, args: Any) -> None:
            self.on_heads(layer, args[0])
            if layer == self.top - 1:
                raise interventions.Stop

        return record


def _forward(loaded: LoadedModel, input_ids: Any, attention_mask: Any, top: int, on_heads: Callable) -> None:
    """The model (as it is: hooks installed elsewhere still act) up to layer top−1's output projection."""
    import torch

    with torch.no_grad(), interventions.hooks(loaded, _Outputs(top, on_heads)):
        try:
            loaded.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        except interventions.Stop:
            pass


def _windows_of(batch: Batch) -> list[Window]:
    """The batch's windows; for a batch made by hand without them (bench), from its ids and lengths."""
    if batch.windows:
        return list(batch.windows)
    ids, lengths = batch.input_ids.tolist(), batch.lengths.tolist()
    return [Window(0, tuple(row[:length]), 0) for row, length in zip(ids, lengths, strict=True)]


class Ablation:
    """What the removed heads of the layers below `top` (all by default) are replaced by, for the windows of one
    input: `prepare` reads the input once (for the means, one forward pass; for resample, its windows), then
    `for_batch` gives each batch's replacements, as `HeadGates.replacements` takes them."""

    def __init__(self, loaded: LoadedModel, mode: str, seed: int = 0, top: int | None = None):
        self.loaded = loaded
        self.mode = options.ABLATION.check(mode, "ablation")
        self.seed = seed
        self.top = loaded.n_layer if top is None else top
        self.means: dict[int, Any] | None = None  # layer -> (H, d_head), in the layer's dtype, on its device
        self.positions = 0  # the real positions the means are over
        self.windows: dict[int, Window] = {}  # resample: every window of the input, by index
        self.donor: dict[int, int] = {}  # resample: window index -> its donor's

    def prepare(self, batches: Callable[[], Iterable[Batch]]) -> Ablation:
        """Read the input (`batches()` makes its batches, as the analysis makes them): the means for mean ablation,
        the donors for resample (and the means too when a window is longer than its donor)."""
        if self.mode == "resample":
            for batch in batches():
                self.windows.update(zip(batch.indices, _windows_of(batch), strict=True))
            order = sorted(self.windows)
            lengths = [len(self.windows[index].ids) for index in order]
            drawn = donors(lengths, self.seed)
            self.donor = {order[k]: order[d] for k, d in enumerate(drawn)}
            if all(lengths[d] >= lengths[k] for k, d in enumerate(drawn)):
                return self
        if self.mode != "zero":
            self.means, self.positions = head_means(self.loaded, batches(), self.top)
        return self

    def for_batch(self, batch: Batch | None) -> dict[int, Any] | None:
        """layer -> the removed heads' replacement in `batch`, broadcastable to (B, n, H, d_head): the means
        (1, 1, H, d_head), or the donors' outputs (B, n, H, d_head), from one forward pass of the donor windows
        through the model as it is (gates off); None for zero ablation. Mean ablation needs no batch."""
        if self.mode == "zero":
            return None
        if self.mode == "mean":
            return {layer: self.means[layer][None, None] for layer in range(self.top)}  # (1, 1, H, d_head)
        return self._donated(batch)

    def _donated(self, batch: Batch) -> dict[int, Any]:
        import torch

        B, n = batch.input_ids.shape
        H = self.loaded.n_head
        given = [self.windows[self.donor[index]] for index in batch.indices]
        longest = max(len(window.ids) for window in given)
        device = batch.input_ids.device
        pad = 0 if self.loaded.tokenizer is None else pad_id(self.loaded.tokenizer)  # bench's models have none
        ids = torch.full((B, longest), pad, dtype=torch.long)  # (B, n_d)
        for row, window in enumerate(given):
            ids[row, : len(window.ids)] = torch.tensor(window.ids, dtype=torch.long)
        lengths = torch.tensor([len(window.ids) for window in given], device=device)  # (B,)
        mask = (torch.arange(longest, device=device)[None, :] < lengths[:, None]).long()  # (B, n_d)
        found: dict[int, Any] = {}
        _forward(self.loaded, ids.to(device), mask, self.top, found.__setitem__)
        replacements = {}
        for layer, z in found.items():
            z = z.view(B, longest, H, -1)[:, :n]  # (B, min(n_d, n), H, d_head)
            if z.shape[1] < n or self.means is not None:  # the longest window's positions past its donor's end
                past = torch.arange(n, device=z.device)[None, :] >= lengths.to(z.device)[:, None]  # (B, n)
                mean = self.means[layer][None, None].to(z.device, z.dtype)  # (1, 1, H, d_head)
                padded = torch.cat([z, mean.expand(B, n - z.shape[1], H, -1)], dim=1)  # (B, n, H, d_head)
                z = torch.where(past[:, :, None, None], mean, padded)
            replacements[layer] = z
        return replacements

    def describe(self) -> str:
        """One line saying which ablation ran, for a result's notes."""
        return describe(self.mode, self.seed)


def describe(mode: str, seed: int = 0, probe: bool = False) -> str:
    """One line saying which ablation ran (`mode`, with `seed` for resample), for a result's notes; `probe`: a
    probe's scores were measured too, on its own input."""
    if mode == "zero":
        return "zero ablation: a removed head's output is set to 0"
    own = " (a probe's scores: the probe's own windows)" if probe else ""
    if mode == "mean":
        return f"mean ablation: a removed head's output is replaced by its mean over every position of the texts{own}"
    return (
        f"resample ablation (seed {seed}): a removed head's output is replaced by its output at the same position "
        f"of another window of the texts{own}"
    )


def head_means(loaded: LoadedModel, batches: Iterable[Batch], top: int) -> tuple[dict[int, Any], int]:
    """Each head's mean output over every real position of every window of `batches`, layers below `top`, as the
    model runs now (hooks included): (layer -> (H, d_head) in the layer's dtype, on its device; positions counted)."""
    import torch

    sums: dict[int, Any] = {}
    dtypes: dict[int, Any] = {}
    count = 0
    for batch in batches:
        real = batch.attention_mask.to(torch.float64)[..., None]  # (B, n, 1)

        def add(layer: int, z: Any, real: Any = real) -> None:
            total = (z.to(torch.float64) * real.to(z.device)).sum(dim=(0, 1))  # (H·d_head,) on the layer's device
            sums[layer] = total if layer not in sums else sums[layer] + total
            dtypes[layer] = z.dtype

        _forward(loaded, batch.input_ids, batch.attention_mask, top, add)
        count += int(batch.attention_mask.sum())
    if count == 0:
        raise AttnscopeError("no position to average a head's output over: the texts have no tokens")
    means = {layer: (sums[layer] / count).view(loaded.n_head, -1).to(dtypes[layer]) for layer in range(top)}
    return means, count
