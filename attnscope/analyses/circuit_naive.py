"""circuit's removals the naive way, and what `attnscope bench` times of circuit.

The naive way (`naive_changes`): for each head A below an explained head, the texts and the probe run whole again
with A's output replaced in a full forward, every layer scored: one full forward per removed head. It is the
reference the replay (`analyses.circuit_replay`) is checked against (tests), and bench's `circuit-naive` method,
timed against the replay's `circuit` on the same batches (`timed_pass`). The analysis never runs it, so it lives
apart from the analysis and the replay: `attnscope circuit` never imports this module.

Its ablations are its own (`_Replacing`, `_clean_outputs`), as `pipeline.ablation` defines them, computed another
way: every window run alone (no padding) through the intact model, its heads' outputs kept; the mean of a head over
all of them; a donor's outputs read back from them. Only the draw of the donors (`pipeline.ablation.donors`), a
definition rather than a computation, is shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnscope.analyses.circuit_replay import (
    Explained,
    Source,
    assemble,
    check_explained,
    layers_by_source,
    removal_pass,
    sources_of,
)
from attnscope.analyses.common import Progress, too_short
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.pipeline import interventions
from attnscope.pipeline.ablation import Ablation
from attnscope.pipeline.inputs import AnyTexts


class _Replacing:
    """A forward pre-hook on layer `layer`'s output projection putting `value` (B, n, d_head) in place of head
    `head`'s slice of its input (None: the model runs unchanged)."""

    def __init__(self, d_head: int):
        self.d_head = d_head
        self.layer, self.head, self.value = -1, -1, None

    def install(self, loaded: LoadedModel) -> Any:
        for layer, module in enumerate(loaded.family.output_projections(loaded.model)):
            yield module.register_forward_pre_hook(self._hook(layer))

    def _hook(self, layer: int) -> Any:
        def replace(module: Any, args: Any) -> Any:
            if self.value is None or layer != self.layer:
                return None
            x = args[0].clone()  # (B, n, H·d_head)
            x[..., self.head * self.d_head : (self.head + 1) * self.d_head] = self.value.to(x.dtype)
            return (x, *args[1:])

        return replace


def _clean_outputs(loaded: LoadedModel, source: Source, top: int) -> dict[int, list[Any]]:
    """Window index -> each layer's heads' outputs below `top` ((length, H·d_head) each), every window of `source`
    run alone through the intact model."""
    import torch

    outputs: dict[int, list[Any]] = {}
    for batch in source.batches():
        for row, index in enumerate(batch.indices):
            length = int(batch.lengths[row])
            found: dict[int, Any] = {}
            handles = [
                module.register_forward_pre_hook(_keeper(found, layer))
                for layer, module in enumerate(loaded.family.output_projections(loaded.model)[:top])
            ]
            try:
                with torch.no_grad():
                    loaded.model(input_ids=batch.input_ids[row : row + 1, :length], use_cache=False)
            finally:
                for handle in handles:
                    handle.remove()
            outputs[index] = [found[layer].clone() for layer in range(top)]
    return outputs


def _keeper(found: dict[int, Any], layer: int) -> Any:
    def keep(module: Any, args: Any) -> None:
        found[layer] = args[0][0]  # (length, H·d_head): the one window's

    return keep


def _value(mode: str, batch: Any, layer: int, head: int, d_head: int, outputs: dict, means: dict, donor: dict) -> Any:
    """What head `head` of `layer` outputs in `batch` once removed: (B, n, d_head)."""
    import torch

    B, n = batch.input_ids.shape
    part = slice(head * d_head, (head + 1) * d_head)
    value = torch.zeros(B, n, d_head, device=batch.input_ids.device)
    if mode == "zero":
        return value
    value[:] = means[layer][part]
    if mode == "resample":
        for row, index in enumerate(batch.indices):
            given = outputs[donor[index]][layer][:n, part]  # (≤ n, d_head): past the donor's end, the mean
            value[row, : given.shape[0]] = given
    return value


def _naive_pass(
    loaded: LoadedModel, source: Source, layers: Sequence[int], ablation: str = "zero", seed: int = 0
) -> tuple[dict[str, Any], dict[tuple[int, int], dict[str, Any]]]:
    """As `circuit_replay.removal_pass`, the naive way: every batch of `source` runs whole once with every head, then
    once more for each head A of a layer below max(`layers`), A's output replaced (`_Replacing`) by 0, its mean over
    every position of every window, or its output at the same position of the window's donor, every layer scored."""
    import torch

    from attnscope.pipeline import capture
    from attnscope.pipeline.ablation import donors

    H, d_head, top = loaded.n_head, loaded.d_head, max(layers)

    def reduced(batches: Any) -> Any:
        reducer = source.reducer()
        capture.run(loaded.model, batches, reducer, kernel=loaded.kernel)
        return reducer

    base = reduced(source.batches())
    count = source.count(base)
    if count == 0:
        raise AttnscopeError(too_short(loaded, "score"))
    outputs = _clean_outputs(loaded, source, top) if ablation != "zero" else {}
    order = sorted(outputs)
    means = {  # layer -> (H·d_head,): over every position of every window
        layer: torch.cat([outputs[index][layer] for index in order]).double().mean(0) for layer in range(top)
    } if outputs else {}  # fmt: skip
    drawn = donors([outputs[index][0].shape[0] for index in order], seed) if ablation == "resample" else []
    donor = {order[k]: order[d] for k, d in enumerate(drawn)}
    removed = {}
    replacing = _Replacing(d_head)

    def replaced(a: int, h: int) -> Any:
        for batch in source.batches():
            replacing.layer, replacing.head = a, h
            replacing.value = _value(ablation, batch, a, h, d_head, outputs, means, donor)
            yield batch

    with interventions.hooks(loaded, replacing):
        for a in range(top):
            for h in range(H):
                removed[(a, h)] = source.means(reduced(replaced(a, h)), count)
    return source.means(base, count), removed


def naive_changes(
    loaded: LoadedModel,
    texts: AnyTexts,
    explained: Sequence[Explained],
    heads: Any,
    progress: Progress | None = None,
    *,
    ablation: str,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """The reference: for each head A below an explained head, the texts and the probe run whole again with A's
    slice of the output projection's input replaced (`ablation`: zero, mean or resample with `seed`), every layer
    scored."""
    sources = sources_of(loaded, texts, heads, progress)
    check_explained(loaded, explained, sources)
    base, removed = {}, {}
    for name, layers in layers_by_source(explained).items():
        base[name], removed[name] = _naive_pass(loaded, sources[name], layers, ablation, seed)
    return assemble(loaded, explained, base, removed)


def timed_pass(
    loaded: LoadedModel, batches: Sequence[Any], naive: bool = False, ablation: str = "mean", seed: int = 0
) -> dict[tuple[int, int], Any]:
    """What `attnscope bench` times (methods circuit and circuit-naive): every head of layer 1 and above explained by
    its row statistics on `batches` (the texts' statistics; the probe left out, as bench's `attnscope` method leaves
    it out), each earlier head removed by replay or the naive way, as `ablation` says (circuit's default: mean); the
    means with each head removed."""
    from attnscope.pipeline.reducers import HeadStatistics
    from attnscope.scores import rows

    kind, L, H = loaded.kind, loaded.n_layer, loaded.n_head
    source = Source(
        lambda: batches,
        lambda: HeadStatistics(kind, L, H, loaded.device),
        lambda reducer, count: rows.finish(kind, reducer.sums.cpu(), reducer.uniform_sum.cpu(), count),
        lambda reducer: int(reducer.row_count),
    )
    layers = list(range(1, L))
    if naive:
        return _naive_pass(loaded, source, layers, ablation, seed)[1]
    replacing = Ablation(loaded, ablation, seed, top=max(layers)).prepare(source.batches)
    return removal_pass(loaded, source, layers, ablation=replacing)[1]
