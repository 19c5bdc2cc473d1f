"""Every head's scores over texts and its role, the probes' (repeated tokens, a needle in a haystack) and the
model's sink rate: the one scoring pass of the analyses. `heads` runs it with its own settings; `circuit`, `compare`
and `report` run it again with theirs (`settings.Scoring`, made whole by `scoring`). Its result, `HeadsResult`, is
rendered by output/heads.py.

`score_heads` is the pass, in named steps: the probes made (before the texts run, so that a probe the context cannot
hold is refused before any forward pass), the texts captured into every head's sums (and the maps of the plotted
heads' layers, for the first window), the means, the probes' scores, every head's record and role, the maps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnscope import options
from attnscope import settings as settings_module
from attnscope.analyses.common import (
    Progress,
    Run,
    check_finite,
    check_rows,
    input_summary,
    run_windows,
    too_short,
)
from attnscope.analyses.maps import AttentionMap, with_words
from attnscope.analyses.result import HeadAt, Result
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.output.heads import HeadsView
from attnscope.pipeline import capture, distributed
from attnscope.pipeline.blocks import Reducer
from attnscope.pipeline.divergence import Reducers
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.labels import label_window
from attnscope.pipeline.needle import Needle, needle_for
from attnscope.pipeline.probe import PROBE_SEQUENCES, Probe, probe_for
from attnscope.pipeline.reducers import HeadStatistics, ProbeStatistics, RetrievalStatistics
from attnscope.pipeline.tokens import WindowStream, batches
from attnscope.scores import catalog, roles
from attnscope.scores.kinds import Kind


@dataclass(frozen=True)
class HeadRecord(HeadAt):
    scores: dict[str, float | None]  # every score of the catalog; None where not measured
    role: roles.Role


@dataclass(repr=False)  # the repr is Result's: a summary
class HeadsResult(Result):
    view_class = HeadsView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    model: dict[str, Any]
    kind: Kind
    inputs: dict[str, Any]
    settings: dict[str, Any]  # window, thresholds (the roles this kind can be given), batching, probe
    heads: list[HeadRecord]
    measured: tuple[str, ...]  # the scores this run measured (catalog order); the others are None
    notes: list[str] = field(default_factory=list)
    attention: dict[int, AttentionMap] = field(default_factory=dict)  # layer -> maps of the first window
    plotted: list[tuple[int, int]] = field(default_factory=list)  # heads whose maps were asked for, as (layer, head)
    selection: dict[str, Any] = field(default_factory=dict)  # layer, sort, top: which heads `selected` holds

    def select(self, layer: int | None = None, sort: str | None = None, top: int | None = None) -> list[HeadRecord]:
        """Heads of one layer (or all), sorted by a score (descending, ties in layer.head order), the first `top`."""
        if layer is not None:
            settings_module.check_layer(layer, self.model["n_layer"])
        name = None if sort is None else settings_module.SCORE.check(sort, "sort")
        settings_module.check_measured(sort, self.kind.name, "probe" in self.inputs, "sort by")
        selected = [record for record in self.heads if layer is None or record.layer == layer]
        if name is not None:  # a score left out of this run (None) sorts last
            selected.sort(key=lambda record: (record.scores[name] is None, -(record.scores[name] or 0.0)))
        return selected if top is None else selected[:top]

    @property
    def sink_rate(self) -> roles.SinkRate:
        """The share of heads whose first_token exceeds catalog.SINK_EPSILON, over the model and per layer (Gu et al.
        2024; see scores.roles)."""
        first_token = [[0.0] * self.model["n_head"] for _ in range(self.model["n_layer"])]
        for record in self.heads:
            first_token[record.layer][record.head] = record.scores["first_token"]
        return roles.sink_rate(first_token)

    @property
    def plotted_labels(self) -> list[str]:
        """The heads whose maps were asked for (`plotted`), as `L.H` labels."""
        return [f"{layer}.{head}" for layer, head in self.plotted]

    @property
    def selected(self) -> list[HeadRecord]:
        """The heads the run's selection (layer, sort, top) picks: the rows of the table, --json and --csv."""
        return self.select(**self.selection)


def scoring(settings: settings_module.Scoring) -> settings_module.Heads:
    """The heads settings that `settings` (circuit's, compare's, report's) score every head with: their scoring
    settings (window, thresholds, bos, batching, probe), everything else at its default."""
    return settings_module.Heads(**{name: getattr(settings, name) for name in settings_module.SCORING})


def score_heads(
    model: LoadedModel,
    texts: Texts | Sequence[Text],
    heads: settings_module.Heads,
    progress: Progress | None = None,
    also: Reducer | None = None,
) -> HeadsResult:
    """Every head's statistics over `texts` and its role, as `heads` (its settings) asks; full maps of the plotted
    heads' layers. `also`: a reducer fed by the same capture of the texts (not the probe's), as `compare` feeds its
    spool."""
    heads.check_shape(model.shape)
    # each head drawn once, in the order first asked for
    plotted = [options.head_in(label, model.n_layer, model.n_head) for label in heads.plot]
    windows = WindowStream(model, texts, heads.bos)
    probe, needle, probe_notes = _probes(model, heads)  # before the texts run
    statistics, captured = _captured(model, windows, heads, sorted({layer for layer, _ in plotted}), progress, also)
    means, window_notes = _means(model, windows, statistics, heads.window)
    notes = windows.notes() + probe_notes + captured.notes + window_notes
    summary = input_summary(windows, int(statistics.row_count))
    _add_probe_scores(model, probe, needle, means, summary)
    per_layer = torch.cat([value.reshape(model.n_layer, -1) for value in means.values()], dim=1)  # (L, ·)
    check_finite(model, "attention", per_layer, range(model.n_layer))
    return HeadsResult(
        model=model.info(),
        kind=model.kind,
        inputs=summary,
        settings=_shown_settings(heads, model.kind),
        heads=head_records(means, model.n_layer, model.n_head, heads.thresholds),
        measured=tuple(name for name in catalog.SCORE_NAMES if name in means),
        notes=notes,
        attention=_plotted_maps(model, captured, heads.words),
        plotted=plotted,
        selection={"layer": heads.layer, "sort": heads.sort, "top": heads.top},
    )


def _probes(model: LoadedModel, heads: settings_module.Scoring) -> tuple[Probe | None, Needle | None, list[str]]:
    """The repeated-token probe and the needle probe that `heads` asks for (None: off, or not for this model), and
    their notes; made before the texts run, so that one the model's context cannot hold is refused first."""
    probe, notes = probe_for(model, heads.probe, heads.probe_len, heads.probe_seed)
    needle, needle_notes = needle_for(model, heads.probe, heads.haystack_len, heads.probe_seed)
    return probe, needle, notes + needle_notes


def _captured(
    model: LoadedModel,
    windows: WindowStream,
    heads: settings_module.Scoring,
    keep_layers: list[int],
    progress: Progress | None,
    also: Reducer | None,
) -> tuple[HeadStatistics, Run]:
    """Every head's sums over the texts' windows (added across torchrun's processes), `also` fed by the same
    capture, and the maps of `keep_layers` for the first window; refused in one line when no row was scored."""
    statistics = HeadStatistics(model.kind, model.n_layer, model.n_head, model.device, heads.window)
    reducer = statistics if also is None else Reducers(statistics, also)
    captured = run_windows(model, windows, reducer, heads.batch_size, heads.max_tokens, progress, keep_layers)
    distributed.all_reduce_sum(statistics.sums, statistics.uniform_sum, statistics.row_count)
    if int(statistics.row_count) == 0:
        raise AttnscopeError(too_short(model, "score"))
    check_rows(model, windows)
    return statistics, captured


def _means(
    model: LoadedModel, windows: WindowStream, statistics: HeadStatistics, window: int
) -> tuple[dict[str, Any], list[str]]:
    """Every head's mean of each row score, name -> (n_layer, n_head), and a note where one is left out: local_lift
    where the local window holds every token a row sees but the first, since it would be a function of the sinks
    alone."""
    means = statistics.means()
    if not model.kind.window_covers(windows.longest, window):
        return means, []
    del means["local_lift"]
    note = (
        f"the local window (window {window}) holds every token each row sees but the first, since no "
        f"window is longer than {windows.longest} tokens: local attention is all that is not on the first "
        "token, so local_lift (and the local role) is not reported; use a smaller window or longer texts"
    )
    return means, [note]


def _add_probe_scores(
    model: LoadedModel, probe: Probe | None, needle: Needle | None, means: dict[str, Any], summary: dict[str, Any]
) -> None:
    """The probes' scores added to `means` (each probe one forward pass of its own), and what each probe was to
    the input `summary`."""
    if probe is not None:
        probe_means, summary["probe"] = probe_scores(model, probe)
        means.update(probe_means)
    if needle is not None:
        means.update(needle_scores(model, needle))
        summary["needle"] = needle.summary()


def head_records(means: dict[str, Any], n_layer: int, n_head: int, thresholds: Any) -> list[HeadRecord]:
    """Every head's record, in layer.head order: each score of the catalog (None where not measured) and the role
    they give it under `thresholds`."""
    records = []
    for layer in range(n_layer):
        for head in range(n_head):
            scores = {name: float(means[name][layer, head]) if name in means else None for name in catalog.SCORE_NAMES}
            records.append(HeadRecord(layer, head, scores, roles.classify(scores, thresholds)))
    return records


def _plotted_maps(model: LoadedModel, captured: Run, words: bool) -> dict[int, AttentionMap]:
    """The maps kept of the first window, layer -> AttentionMap, labelled with its tokens; word by word with
    `words`."""
    first = captured.first_window
    labels = label_window(model.tokenizer, first.ids) if first is not None else None
    attention = {layer: AttentionMap(layer, maps, labels, first.text_index) for layer, maps in captured.maps.items()}
    if words:
        attention = {layer: with_words(maps) for layer, maps in attention.items()}
    return attention


def _shown_settings(heads: settings_module.Heads, kind: Kind) -> dict[str, Any]:
    """The settings a result reports; only the thresholds of the roles this kind of model can be given (a
    decoder's JSON is what it was before encoders)."""
    kind_roles = {role.name for role in catalog.roles_for(kind.name)}
    return {
        "window": heads.window,
        "thresholds": {role: value for role, value in heads.thresholds.items() if role in kind_roles},
        "batch_size": heads.batch_size,
        "max_tokens": heads.max_tokens,
        "probe": heads.probe,
        "layer": heads.layer,
        "sort": heads.sort,
        "top": heads.top,
    }


def probe_scores(model: LoadedModel, probe: Probe) -> tuple[dict[str, Any], dict[str, Any]]:
    """Induction and duplicate-token scores of every head, name -> (n_layer, n_head), from one forward pass over
    the probe's windows (seeded random sequences of `period` tokens repeated twice); and a summary for the JSON."""
    statistics = ProbeStatistics(model.n_layer, model.n_head, model.device, probe.period, probe.first_query)
    windows = probe.windows
    capture.run(model.model, batches(windows, len(windows), model.device), statistics, kernel=model.kernel)
    summary = {
        "period": probe.period,
        "sequences": PROBE_SEQUENCES,
        "seed": probe.seed,
        "scored_rows": int(statistics.row_count),
    }
    return statistics.means(), summary


def needle_scores(model: LoadedModel, needle: Needle) -> dict[str, Any]:
    """Every head's retrieval score, retrieval -> (n_layer, n_head), from one forward pass over the needle probe's
    windows (one per depth)."""
    batch, starts = needle.batch(model.device)
    statistics = RetrievalStatistics(model.n_layer, model.n_head, model.device, needle.first_query, starts)
    capture.run(model.model, [batch], statistics, kernel=model.kernel)
    return statistics.means()
