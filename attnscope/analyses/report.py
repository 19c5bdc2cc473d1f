"""`attnscope report`: the heads analysis, every head's attention on a few short texts, the diversity of all heads
and, when asked, the ablation, for one page (rendered by `output.report`).

Which maps the page holds (every head of every layer on each text shown, one byte per cell once encoded):

- texts: the first MAX_TEXTS input texts, each its first window cut to at most MAX_TOKENS tokens, and, for a decoder
  with the probe on, the probe's first repeated sequence (BOS, T random tokens, the same T again);
- a decoder's map stores its lower triangle (n(n+1)/2 cells), an encoder's the whole square (n² cells);
- all of it within MAP_CELLS cells for all heads together: when the texts would need more, the token cap is lowered
  (down to MIN_TOKENS), then input texts are left out from the last one (the first text and the probe stay).

Each text runs through the model alone, its maps kept for every layer (L · H · n² float32 at most, one text at a
time), so memory stays bounded whatever the corpus.

Several models (`run_models`: checkpoints of one run, a model and its fine-tune): the same texts through each model,
one at a time (loaded, run, what the page needs kept, freed), each checked comparable with the first
(`models.checks.check_comparable`: the same layers × heads and tokenizer) and its weights finite, as one model's are
(`common.check_weights`: its maps can be finite where its weights are not). Each model's heads are scored and its
maps drawn on the same texts, cut to the same cap; the models share one budget of MULTI_MAP_CELLS cells (twice a
one-model page's: two models keep a one-model page's maps each, more models share it, their texts cut shorter).
The page opens on the last model (for a training run, the trained one; models are given in the order of the run),
and the diversity, the ablation and the tables of the page are the last model's.

With `circuit`, the page also carries the circuit analysis's dependencies (`circuit_records`): for every head B its
CIRCUIT_TOP heads A whose removal changes B's deciding score most, as `attnscope circuit`'s JSON records them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope import settings
from attnscope.analyses.ablate import Ablate, AblationResult
from attnscope.analyses.common import Progress, check_finite, check_weights
from attnscope.analyses.diversity import Diversity, DiversityResult
from attnscope.analyses.result import Result
from attnscope.analyses.scoring import HeadRecord, HeadsResult, score_heads, scoring
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Comparable, check_comparable
from attnscope.models.loading import LoadedModel
from attnscope.models.sources import ModelSource
from attnscope.output.report import ReportView
from attnscope.pipeline import capture, distributed
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.labels import Labels, label_window
from attnscope.pipeline.probe import probe_windows
from attnscope.pipeline.tokens import Window, WindowStream, batches, pad_id
from attnscope.scores import groups
from attnscope.scores.catalog import ROLES, counted

TOP_PER_ROLE = 3
MAX_MAPS = 8
PAIRS = 5  # most redundant and most distinct pairs listed
MAX_TEXTS = 8  # input texts the page draws maps of (the first ones)
MAX_TOKENS = 128  # tokens of a text drawn at most (its first window, cut)
MIN_TOKENS = 16  # the token cap is never lowered below this to fit MAP_CELLS
MAP_CELLS = 3 * 2**20  # map cells the page holds at most, all heads and texts together (one byte each)
MULTI_MAP_CELLS = 2 * MAP_CELLS  # map cells of a page of several models, all models together
CIRCUIT_TOP = 5  # with `circuit`: the dependencies the page keeps per head (the largest changes)
COPYING_ROLES = ("induction", "duplicate-token", "retrieval")  # shown on a text that repeats itself
PROBE, TEXT = "probe", "text"


def circuit_records(loaded: LoadedModel, texts: Texts | Sequence[Text], scoring: settings.Scoring) -> list[dict]:
    """The page's head-to-head dependencies: `attnscope circuit`'s JSON records (`{"label": "1.0", "on": "0.2",
    "score": "induction", "with": 0.96, "without": 0.43, "change": -0.53}`: head `label`'s deciding score with and
    without head `on`), the CIRCUIT_TOP largest changes of each head, on the report's texts and probe settings.
    The page reads exactly these keys."""
    from attnscope.analyses.circuit import Circuit

    same = {name: getattr(scoring, name) for name in settings.SCORING}
    analysis = Circuit(top=CIRCUIT_TOP, weights=False, **same)  # removals only: no language-model head needed
    records = analysis.run(loaded, texts).dependencies(CIRCUIT_TOP)
    return [{key: record[key] for key in ("label", "on", "score", "with", "without", "change")} for record in records]


def characteristic_heads(heads: Sequence[HeadRecord]) -> list[HeadRecord]:
    """Per role (mixed excluded), the head of that role with the highest deciding score, in role order."""
    chosen = []
    for role in ROLES:
        members = [record for record in heads if record.role.role == role.name and role.score is not None]
        if members:
            chosen.append(max(members, key=lambda record: (record.role.score, -record.layer, -record.head)))
    return chosen[:MAX_MAPS]


def top_heads_per_role(heads: Sequence[HeadRecord], k: int = TOP_PER_ROLE) -> dict[str, list[HeadRecord]]:
    """role -> the k heads with the highest score of that role's rule, whatever role they were given (ties in
    layer.head order); roles whose score was not measured (the probe's, with the probe off) are left out."""
    table = {}
    for role in ROLES:
        if role.score is None or not heads or heads[0].scores.get(role.score) is None:
            continue
        table[role.name] = sorted(heads, key=lambda record: (-record.scores[role.score], record.layer, record.head))[:k]
    return table


def map_cells(n: int, causal: bool) -> int:
    """Cells a map of n tokens stores: a causal map's lower triangle, an encoder's whole square."""
    return n * (n + 1) // 2 if causal else n * n


def plan_maps(
    lengths: Sequence[int],
    n_heads: int,
    causal: bool,
    probe: bool = False,
    budget: int = MAP_CELLS,
    cap: int = MAX_TOKENS,
    floor: int = MIN_TOKENS,
) -> tuple[int, int]:
    """(token cap, number of input texts kept) so that every head's maps of the texts fit `budget` cells.
    `lengths`: the windows' lengths, the input texts' in order, then the probe's when `probe`. The cap is the
    largest from `cap` down to `floor` that fits; when even `floor` does not, input texts are left out from the
    last one, keeping the first (and the probe)."""
    texts = list(lengths[:-1] if probe else lengths)
    extra = [lengths[-1]] if probe else []

    def total(limit: int, kept: int) -> int:
        return n_heads * sum(map_cells(min(n, limit), causal) for n in texts[:kept] + extra)

    kept, floor = len(texts), min(floor, cap)
    for limit in range(cap, floor - 1, -1):
        if total(limit, kept) <= budget:
            return limit, kept
    while kept > 1 and total(floor, kept) > budget:
        kept -= 1
    return floor, kept


@dataclass
class ShownText:
    """One text the page draws every head on: its window `ids` (cut to the cap), their labels, and the maps of
    every layer, (L, H, n, n) float32 numpy. `length`: the window's tokens before the cut; `text_index`: which
    input text (None for the probe)."""

    name: str
    kind: str  # TEXT or PROBE
    text_index: int | None
    ids: tuple[int, ...]
    labels: Labels
    maps: Any
    length: int

    @property
    def cut(self) -> bool:
        return len(self.ids) < self.length

    def repeated_share(self) -> float:
        """The share of its tokens that already occurred earlier in the window (a text that repeats itself)."""
        seen: set[int] = set()
        repeats = 0
        for token in self.ids[1:]:
            repeats += token in seen
            seen.add(token)
        return repeats / max(len(self.ids) - 1, 1)


def _cut(window: Window, limit: int, prefix: int, suffix: int) -> Window:
    """The window's first tokens, at most `limit` in all; an encoder's closing [SEP] (`suffix`) stays last."""
    if len(window.ids) <= limit:
        return window
    body = window.ids[prefix : len(window.ids) - suffix][: limit - prefix - suffix]
    return Window(window.text_index, window.ids[:prefix] + body + window.ids[len(window.ids) - suffix :], window.start)


def _probe(model: LoadedModel, heads: HeadsResult) -> Window | None:
    """The probe's first sequence as the heads analysis ran it, or None with the probe off."""
    if "probe" not in heads.inputs:
        return None
    summary = heads.inputs["probe"]
    return probe_windows(model.tokenizer, summary["period"], model.n_ctx, summary["seed"], count=1)[0]


def _all_layer_maps(model: LoadedModel, window: Window) -> Any:
    """(L, H, n, n) float32 numpy: every layer's attention of one window, from one forward pass."""
    layers = range(model.n_layer)
    captured = capture.run(
        model.model,
        batches([window], 1, model.device, pad_id(model.tokenizer)),
        None,
        keep_layers=layers,
        keep_window=0,
    )
    maps = np.stack([captured.maps[layer].numpy() for layer in layers])  # (L, H, n, n)
    check_finite(model, "attention", maps, list(layers))
    return maps


def shown_texts(
    model: LoadedModel,
    texts: Texts | Sequence[Text],
    bos: bool | None,
    probe: Window | None,
    max_texts: int = MAX_TEXTS,
    max_tokens: int = MAX_TOKENS,
    budget: int = MAP_CELLS,
) -> tuple[list[ShownText], list[str], int]:
    """The texts the page draws every head on (see the module docstring) with their maps, notes saying what was cut
    or left out, and the token cap they were cut to."""
    stream = WindowStream(model, texts, bos)
    firsts: list[Window] = []
    more = False  # texts past the first max_texts
    for window in stream:
        if window.text_index >= max_texts:
            more = True
            break
        if not firsts or firsts[-1].text_index != window.text_index:
            firsts.append(window)
    names = [stream.sources[window.text_index] for window in firsts]
    lengths = [len(window.ids) for window in firsts] + ([len(probe.ids)] if probe is not None else [])
    cap, kept = plan_maps(
        lengths, model.n_layer * model.n_head, model.kind.causal, probe is not None, budget, max_tokens
    )
    notes = []
    if more:
        notes.append(f"the page draws maps of the first {max_texts} texts only")
    if kept < len(firsts):
        notes.append(f"the page draws maps of the first {kept} texts only, to stay within {budget:,} map cells")
    chosen: list[tuple[str, str, int | None, Window]] = [
        (name, TEXT, window.text_index, window) for name, window in zip(names[:kept], firsts[:kept], strict=True)
    ]
    if probe is not None:
        period = (len(probe.ids) - (1 if model.tokenizer.bos_token_id is not None else 0)) // 2
        chosen.append((f"probe: {period} random tokens, repeated", PROBE, None, probe))
    prefix, suffix = len(stream.prefix), len(stream.suffix)
    shown = []
    for name, kind, index, window in chosen:
        cut = _cut(window, cap, 0 if kind == PROBE else prefix, 0 if kind == PROBE else suffix)
        labels = label_window(model.tokenizer, cut.ids)
        shown.append(ShownText(name, kind, index, cut.ids, labels, _all_layer_maps(model, cut), len(window.ids)))
    cut_texts = [text for text in shown if text.cut]
    if cut_texts:
        notes.append(
            f"the page draws at most {cap} tokens of a text: {counted(len(cut_texts), 'text')} cut there "
            f"({', '.join(text.name for text in cut_texts)}); the scores use every token"
        )
    return shown, notes, cap


def example_texts(shown: Sequence[ShownText]) -> dict[str, int]:
    """role -> the text (an index into `shown`) a head of that role is first shown on: an induction,
    duplicate-token or retrieval head on the probe (or, without it, on the input text that repeats itself most: a
    retrieval head copies as an induction head does, and the page draws no needle), any other on the input text with
    the most words of letters (prose rather than code or numbers)."""
    inputs = [k for k, text in enumerate(shown) if text.kind == TEXT]
    if not inputs:
        return {}

    def words(k: int) -> int:
        return sum(word.isalpha() for word in shown[k].labels.word_text)

    longest = max(inputs, key=lambda k: (words(k), len(shown[k].ids), -k))
    probe = next((k for k, text in enumerate(shown) if text.kind == PROBE), None)
    repeating = max(inputs, key=lambda k: (shown[k].repeated_share(), -k)) if probe is None else probe
    return {role.name: repeating if role.name in COPYING_ROLES else longest for role in ROLES}


@dataclass(repr=False)  # its maps would fill a REPL: one line instead, its heads summarised by their own repr
class ReportModel:
    """One model of a report of several: its `label` (the revision, the folder's name or the name given), its heads,
    its characteristic heads and its maps on the report's texts (the same texts, tokens and cut for every model)."""

    label: str
    heads: HeadsResult
    characteristic: list[HeadRecord]
    texts: list[ShownText]

    def __repr__(self) -> str:
        heads = ", ".join(f"{record.label} {record.role.role}" for record in self.characteristic)
        return (
            f"<ReportModel {self.label}: characteristic heads {heads or 'none'}; maps on "
            f"{counted(len(self.texts), 'text')}; see .heads>"
        )


@dataclass(repr=False)  # the repr is Result's: a summary
class ReportResult(Result):
    view_class = ReportView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    heads: HeadsResult
    diversity: DiversityResult | None  # None with the diversity pass off
    characteristic: list[HeadRecord]
    top_per_role: dict[str, list[HeadRecord]]
    notes: list[str] = field(default_factory=list)
    texts: list[ShownText] = field(default_factory=list)  # every head's maps on these, for the page
    examples: dict[str, int] = field(default_factory=dict)  # role -> the text (index into `texts`) shown first
    linkage: Any = None  # scipy's average-linkage matrix (K-1, 4) of the diversity's JS divergence (the dendrogram)
    ablation: AblationResult | None = None  # with `ablate`
    map_notes: list[str] = field(default_factory=list)  # what the page's maps leave out
    token_cap: int = MAX_TOKENS  # the texts drawn were cut to this many tokens at most
    models: list[ReportModel] = field(default_factory=list)  # several models: each one's heads and maps, in order
    dependencies: list[dict] | None = None  # with `circuit`: the circuit analysis's records (see circuit_records)

    @property
    def model(self) -> dict[str, Any]:
        return self.heads.model


class Report(settings.Report):
    """Everything the report page shows (attnscope.settings.Report): the heads analysis with these scoring
    settings, every head's maps on the first texts (and the probe), with `diversity` one more pass for the diversity
    of all heads, with `ablate` the loss ablation of every head (the model needs its language-model head), with
    `circuit` the circuit analysis's dependencies."""

    def run(
        self,
        model: LoadedModel,
        texts: Texts | Sequence[Text],
        progress: Progress | None = None,
        budget: int = MAP_CELLS,
    ) -> ReportResult:
        """The report of one model; `budget`: the map cells its maps may take."""
        batching = {"bos": self.bos, "batch_size": self.batch_size, "max_tokens": self.max_tokens}
        ablation_settings = Ablate(**batching) if self.ablate else None  # checked before any pass
        check_weights(model)  # a page of a damaged checkpoint would pass for a sound model's (its maps can be finite)
        heads = score_heads(model, texts, scoring(self), progress)
        shown, map_notes, cap = shown_texts(model, texts, self.bos, _probe(model, heads), budget=budget)
        diversity = linkage = None
        if self.diversity:
            diversity = Diversity(layer=None, top=PAIRS, **batching).run(model, texts, progress)
            linkage = groups.average_linkage(diversity.js).merges
        ablation = ablation_settings.run(model, texts, progress) if ablation_settings is not None else None
        notes = list(heads.notes) + ([] if ablation is None else [n for n in ablation.notes if n not in heads.notes])
        dependencies = circuit_records(model, texts, self) if self.circuit else None
        return ReportResult(
            heads,
            diversity,
            characteristic_heads(heads.heads),
            top_heads_per_role(heads.heads),
            notes,
            shown,
            example_texts(shown),
            linkage,
            ablation,
            map_notes,
            cap,
            dependencies=dependencies,
        )

    def pieces(self, count: int, processes: int) -> list[list[int]]:
        """How `count` models are shared among `processes` (torchrun's; `distributed.run_shared` gives piece i to
        process i mod N): one process opens them all, in order; several, a model each, the last (the page's own, its
        diversity and ablation the costliest) on the first process, model i < last on process (i + 1) mod N."""
        if processes == 1:
            return [list(range(count))]
        return [[count - 1]] + [[index] for index in range(count - 1)]

    def run_models(
        self, sources: Sequence[ModelSource], texts: Texts | Sequence[Text], progress: Progress | None = None
    ) -> ReportResult:
        """The report of several models, opened one at a time (and freed once read when this run loaded them): the
        last model's report (for a training run, the trained model), with every model's heads and maps in
        `models`. Each model is checked comparable with the first, whose config and tokenizer stay. Under torchrun
        the models are shared among the processes (`pieces`), each model whole on one, and gathered in order."""
        self.check_models(len(sources))
        labels = [source.label for source in sources]
        budget = MULTI_MAP_CELLS // len(sources)
        pieces = self.pieces(len(sources), distributed.working().size)

        def run_piece(piece: list[int]) -> list[tuple[int, ReportModel, ReportResult | None, Comparable]]:
            with distributed.alone():  # a piece is one process's, each model's passes over the texts whole
                return self._run_piece(piece, sources, texts, progress, budget)

        found = {index: rest for opened in distributed.run_shared(pieces, run_piece) for index, *rest in opened}
        pages: list[ReportModel] = []
        result: ReportResult | None = None
        for index, source in enumerate(sources):
            page, result_here, reference = found[index]
            if index and len(pieces) > 1:  # the piece that opened it did not open the first
                check_comparable(found[0][2], reference, labels[0], source.label)
            if pages and [text.ids for text in page.texts] != [text.ids for text in pages[0].texts]:
                raise AttnscopeError(
                    f"models {labels[0]} and {source.label} cannot be compared: the texts drawn are not the same "
                    "tokens in both (a different tokenizer, context or probe)"
                )
            pages.append(page)
            result = result_here if result_here is not None else result
        assert result is not None
        result.models = pages
        ran = ["the tables"] + [
            name
            for name, done in (
                ("the diversity", result.diversity is not None),
                ("the ablation", result.ablation is not None),
            )
            if done
        ]
        listed = ", ".join(ran[:-1]) + f" and {ran[-1]}" if len(ran) > 1 else ran[0]
        result.notes = list(result.notes) + [
            f"{counted(len(pages), 'model')} ({', '.join(labels)}): the page opens on the last, {labels[-1]}; the role "
            f"map and the head panel follow the model chosen; {listed} are the last model's ({labels[-1]})"
        ]
        each = "as a one-model page" if budget >= MAP_CELLS else f"a one-model page holds {MAP_CELLS:,}"
        result.map_notes = list(result.map_notes) + [
            f"the {len(pages)} models share {MULTI_MAP_CELLS:,} map cells: {budget:,} each ({each})"
        ]
        return result

    def _run_piece(
        self,
        piece: Sequence[int],
        sources: Sequence[ModelSource],
        texts: Texts | Sequence[Text],
        progress: Progress | None,
        budget: int,
    ) -> list[tuple[int, ReportModel, ReportResult | None, Comparable]]:
        """The models of one piece, opened one at a time: each one's page (heads and maps), the last model's whole
        report, and what the check of comparability reads of each."""
        heads_settings = scoring(self)
        opened: list[tuple[int, ReportModel, ReportResult | None, Comparable]] = []
        first: LoadedModel | None = None  # the first model, its weights freed: its config and tokenizer stay
        for index in piece:
            source = sources[index]
            last = index == len(sources) - 1
            loaded = source.open(self.needs_lm_head and last)  # the ablation is the last model's
            result = None
            with source.holding(loaded):  # closed after; an error names the model
                if index == 0:
                    first = loaded
                elif first is not None:
                    check_comparable(first, loaded, sources[0].label, source.label)
                if last:
                    result = self.run(loaded, texts, progress, budget=budget)
                    heads, shown = result.heads, result.texts
                else:
                    check_weights(loaded)  # as `run` checks the last
                    heads = score_heads(loaded, texts, heads_settings, progress)
                    shown, _, _ = shown_texts(loaded, texts, self.bos, _probe(loaded, heads), budget=budget)
                reference = Comparable.of(loaded)
            del loaded
            page = ReportModel(source.label, heads, characteristic_heads(heads.heads), shown)
            opened.append((index, page, result, reference))
            if opened[0][0] == 0 and [text.ids for text in shown] != [text.ids for text in opened[0][1].texts]:
                break  # refused by `run_models` (other tokens than the first model's), before the next model loads
        return opened
