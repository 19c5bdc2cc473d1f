"""circuit's removals the naive way, and what `attnscope bench` times of circuit.

The naive way (`naive_changes`): for each head A below an explained head, the texts and the probe run whole again
with A gated off (`pipeline.interventions.HeadGates`, as `ablate` removes a head), every layer scored: one full
forward per removed head. It is the reference the replay (`analyses.circuit_replay`) is checked against (tests), and
bench's `circuit-naive` method, timed against the replay's `circuit` on the same batches (`timed_pass`). The analysis
never runs it, so it lives apart from the analysis and the replay: `attnscope circuit` never imports this module.
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
from attnscope.pipeline.inputs import AnyTexts


def _naive_pass(
    loaded: LoadedModel, source: Source, layers: Sequence[int]
) -> tuple[dict[str, Any], dict[tuple[int, int], dict[str, Any]]]:
    """As `circuit_replay.removal_pass`, the naive way: every batch of `source` runs whole once with every head, then
    once more for each head A of a layer below max(`layers`), A gated off by `HeadGates`, every layer scored."""
    import torch

    from attnscope.pipeline import capture

    L, H = loaded.n_layer, loaded.n_head

    def reduced() -> Any:
        reducer = source.reducer()
        capture.run(loaded.model, source.batches(), reducer, kernel=loaded.kernel)
        return reducer

    base = reduced()
    count = source.count(base)
    if count == 0:
        raise AttnscopeError(too_short(loaded, "score"))
    removed = {}
    gates = interventions.HeadGates()
    with interventions.hooks(loaded, gates):
        for a in range(max(layers)):
            for h in range(H):
                gates.values = torch.ones(1, L, H, device=loaded.device)  # (1, L, H): every window alike
                gates.values[0, a, h] = 0
                removed[(a, h)] = source.means(reduced(), count)
    return source.means(base, count), removed


def naive_changes(
    loaded: LoadedModel, texts: AnyTexts, explained: Sequence[Explained], heads: Any, progress: Progress | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The reference: for each head A below an explained head, the texts and the probe run whole again with A's
    slice of the output projection's input zeroed (`HeadGates`, as `ablate` removes a head), every layer scored."""
    sources = sources_of(loaded, texts, heads, progress)
    check_explained(loaded, explained, sources)
    base, removed = {}, {}
    for name, layers in layers_by_source(explained).items():
        base[name], removed[name] = _naive_pass(loaded, sources[name], layers)
    return assemble(loaded, explained, base, removed)


def timed_pass(loaded: LoadedModel, batches: Sequence[Any], naive: bool = False) -> dict[tuple[int, int], Any]:
    """What `attnscope bench` times (methods circuit and circuit-naive): every head of layer 1 and above explained by
    its row statistics on `batches` (the texts' statistics; the probe left out, as bench's `attnscope` method leaves
    it out), each earlier head removed by replay or the naive way; the means with each head removed."""
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
    return (_naive_pass if naive else removal_pass)(loaded, source, layers)[1]
