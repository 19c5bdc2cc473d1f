"""`attnscope heads`: every head's scores over the texts, its role, the probes (repeated tokens, a needle in a
haystack) and the model's sink rate."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnscope import options
from attnscope import settings as settings_module
from attnscope.analyses.common import Progress, check_finite, check_rows, input_summary, run_windows, too_short
from attnscope.analyses.maps import AttentionMap, with_words
from attnscope.analyses.result import Result
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
class HeadRecord:
    layer: int
    head: int
    scores: dict[str, float | None]  # every score of the catalog; None where not measured
    role: roles.Role

    @property
    def label(self) -> str:
        return f"{self.layer}.{self.head}"


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


def scoring(settings: settings_module.Scoring) -> Heads:
    """The heads analysis that `settings` (circuit's, compare's, report's) score every head with: their scoring
    settings (window, thresholds, bos, batching, probe), everything else at its default."""
    return Heads(**{name: getattr(settings, name) for name in settings_module.SCORING})


class Heads(settings_module.Heads):
    """Every head's statistics over the texts and its role (the settings: attnscope.settings.Heads)."""

    def run(
        self,
        model: LoadedModel,
        texts: Texts | Sequence[Text],
        progress: Progress | None = None,
        also: Reducer | None = None,
    ) -> HeadsResult:
        """Every head's statistics over `texts` and its role; full maps of the plotted heads' layers. `also`: a
        reducer fed by the same capture of the texts (not the probe's), as `compare` feeds its spool."""
        kind = model.kind
        self.check_shape(model.shape)
        # each head drawn once, in the order first asked for
        plotted = [options.head_in(label, model.n_layer, model.n_head) for label in self.plot]
        windows = WindowStream(model, texts, self.bos)
        probe, notes = probe_for(model, self.probe, self.probe_len, self.probe_seed)  # before the texts run
        needle, needle_notes = needle_for(model, self.probe, self.haystack_len, self.probe_seed)
        notes += needle_notes
        statistics = HeadStatistics(kind, model.n_layer, model.n_head, model.device, self.window)
        keep_layers = sorted({layer for layer, _ in plotted})
        reducer = statistics if also is None else Reducers(statistics, also)
        captured = run_windows(model, windows, reducer, self.batch_size, self.max_tokens, progress, keep_layers)
        notes = windows.notes() + notes + captured.notes
        distributed.all_reduce_sum(statistics.sums, statistics.uniform_sum, statistics.row_count)
        if int(statistics.row_count) == 0:
            raise AttnscopeError(too_short(model, "score"))
        check_rows(model, windows)
        means = statistics.means()
        if kind.window_covers(windows.longest, self.window):  # local_lift would be a function of the sinks alone
            del means["local_lift"]
            notes.append(
                f"the local window (window {self.window}) holds every token each row sees but the first, since no "
                f"window is longer than {windows.longest} tokens: local attention is all that is not on the first "
                "token, so local_lift (and the local role) is not reported; use a smaller window or longer texts"
            )
        summary = input_summary(windows, int(statistics.row_count))
        if probe is not None:
            probe_means, summary["probe"] = probe_scores(model, probe)
            means.update(probe_means)
        if needle is not None:
            means.update(needle_scores(model, needle))
            summary["needle"] = needle.summary()
        per_layer = torch.cat([value.reshape(model.n_layer, -1) for value in means.values()], dim=1)  # (L, ·)
        check_finite(model, "attention", per_layer, range(model.n_layer))
        heads = []
        for layer in range(model.n_layer):
            for head in range(model.n_head):
                scores = {
                    name: float(means[name][layer, head]) if name in means else None for name in catalog.SCORE_NAMES
                }
                heads.append(HeadRecord(layer, head, scores, roles.classify(scores, self.thresholds)))
        first = captured.first_window
        labels = label_window(model.tokenizer, first.ids) if first is not None else None
        attention = {
            layer: AttentionMap(layer, maps, labels, first.text_index) for layer, maps in captured.maps.items()
        }
        if self.words:
            attention = {layer: with_words(maps) for layer, maps in attention.items()}
        # only the roles this kind of model can be given (a decoder's JSON is what it was before encoders)
        kind_roles = {role.name for role in catalog.roles_for(kind.name)}
        settings = {
            "window": self.window,
            "thresholds": {role: value for role, value in self.thresholds.items() if role in kind_roles},
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "probe": self.probe,
            "layer": self.layer,
            "sort": self.sort,
            "top": self.top,
        }
        return HeadsResult(
            model=model.info(),
            kind=kind,
            inputs=summary,
            settings=settings,
            heads=heads,
            measured=tuple(name for name in catalog.SCORE_NAMES if name in means),
            notes=notes,
            attention=attention,
            plotted=plotted,
            selection={"layer": self.layer, "sort": self.sort, "top": self.top},
        )


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
