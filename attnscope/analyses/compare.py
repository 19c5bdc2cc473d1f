"""`attnscope compare`: the same texts and the same probe through several models (checkpoints of one training run,
a base model and its fine-tune, revisions of one Hub repository): every head's scores and role in each, when each
role formed and where its score rose most (its transition), each model's language-model loss on the texts, and, for
two models, how far each head's attention itself moved (its divergence).

Models are loaded one at a time and freed before the next loads (models.sources): memory is that of one model. Each
runs the `heads` analysis with the same settings (so a model's scores are exactly those `attnscope heads` gives it);
only the per-head scores and roles are kept. With two models, the divergence of each head is the mean Jensen–Shannon
divergence (bits) between the two models' attention rows on the same tokens, computed in the capture
(pipeline.divergence): the first model's rows are spooled to a temporary file, the second's compared with them as
they are produced. ("Change" is kept for a difference of scores, as in `circuit`.)

Under torchrun the models are shared among the processes, each model whole on one (`Compare.pieces`): model i on
process i mod N; with the divergence of two models, one process scores both (their rows meet only where both run:
the first's spooled, the second's compared with them as they come) and another measures their two losses. What
each piece found is gathered in order (`distributed.run_shared`): the result is one process's, bit for bit.

When a role appeared, two ways (`formation`, `transition`), which differ on a training run: a score that rises
steeply and then slowly crosses a threshold late, after the change itself.

    formed[role]      the first model from which the head holds the role in every later model (a threshold
                      crossing: where the role's score passed its threshold for good, and the other rules let it)
    transition[role]  the model that ends the largest rise of the role's deciding score s between consecutive
                      models: argmax over k ≥ 1 of s[k] − s[k−1] (the earliest on a tie; None where s never rises,
                      or is not measured); whatever the threshold, and whether or not the head ever holds the role

A head's `change` (the ranking of "heads whose role changes", and what --top keeps): its largest step between
consecutive models, up or down, of the deciding score of the role it holds in the last model (for a head that ends
mixed, of the roles it held before): how sharply it became what it is, or stopped being what it was.

Each model's `sink_rate`: the share of its heads whose first_token exceeds 0.3 (Gu et al. 2024, who watch it emerge
during pre-training; `scores.roles.sink_rate`), over the model and per layer, from its heads analysis.

Each model's `loss`: the mean language-model loss of the texts in nats per predicted token, exactly as `ablate`
measures its baseline (`pipeline.loss_windows`: a decoder's next-token cross-entropy over every predicted token; an
encoder's masked-LM loss on a deterministic 15 % of its tokens), from the model loaded with its own language-model
head (exact whatever the head: tied or not, soft-capped or not), while it is the one model in memory; one forward
pass over the texts more per model, with the fastest attention. None, with a note, for a model without a head, or
whose loss overflowed (a half precision). Every model's weights are checked as it opens (`common.check_weights`): a
NaN in an MLP after the last attention leaves the heads finite and the loss not, so the model is refused, named.

    from attnscope import compare
    result = compare(["runs/step-0000", "runs/step-1000"], "The cat sat on the mat.")
    result.heads[0].formed["induction"], result.heads[0].transition["induction"], result.losses
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attnscope import settings
from attnscope.analyses.common import Progress, check_finite, check_weights
from attnscope.analyses.result import HeadAt, Result
from attnscope.analyses.scoring import HeadsResult, score_heads, scoring
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Comparable, check_comparable
from attnscope.models.loading import LoadedModel
from attnscope.models.sources import ModelSource
from attnscope.output.compare import CompareView
from attnscope.pipeline import distributed
from attnscope.pipeline.inputs import Text, Texts
from attnscope.scores import catalog
from attnscope.scores.kinds import Kind

# The score drawn as heads × models when none is asked for: the first of these the run measured (induction heads'
# formation is the best-known phase change of training, Olsson et al. 2022).
DEFAULT_SCORES = ("induction", "previous_token", "entropy_normalized")


@dataclass(frozen=True)
class Step:
    """A step of a score between two consecutive models: the score's name, its `value` (later − earlier) and the
    label of the `model` that ends it."""

    score: str
    value: float
    model: str


@dataclass(frozen=True)
class CompareHead(HeadAt):
    """One head across the models: `scores[name][k]` is its score in model k (None where not measured),
    `roles[k]` its role there, `formed[role]` the label of the first model from which it holds `role` to the last
    (None: it does not hold it in the last), `divergence` its mean JSD in bits between two models (None otherwise),
    `transition[role]` the label of the model that ends the largest rise of the role's deciding score, `change` its
    largest step of the deciding score of its last role (see the module docstring; None: mixed in every model)."""

    scores: dict[str, list[float | None]]
    roles: list[str]
    formed: dict[str, str | None]
    divergence: float | None = None
    transition: dict[str, str | None] = field(default_factory=dict)
    change: Step | None = None


@dataclass(repr=False)  # the repr is Result's: a summary
class CompareResult(Result):
    view_class = CompareView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    model: dict[str, Any]  # the first model's facts (the shape every model shares), `compared`: each model's
    kind: Kind
    labels: list[str]  # the models, in the order given
    inputs: dict[str, Any]
    settings: dict[str, Any]
    heads: list[CompareHead]
    measured: tuple[str, ...]
    score: str  # the score of the heads × models heatmap
    notes: list[str] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)  # each model's loss (nats per predicted token); [] off
    sink_rates: list[Any] = field(default_factory=list)  # each model's sink rate (scores.roles.SinkRate)

    @property
    def has_divergence(self) -> bool:
        return any(head.divergence is not None for head in self.heads)

    @property
    def has_loss(self) -> bool:
        return any(loss is not None for loss in self.losses)

    def ranked_by_divergence(self) -> list[CompareHead]:
        """Heads by divergence, largest first (ties in layer.head order)."""
        return sorted(self.heads, key=lambda head: -(head.divergence or 0.0))

    def role_changes(self) -> list[CompareHead]:
        """The heads whose role is not the same in every model, the most changed first: by the size of their
        `change` (the largest step of a deciding score of a role they hold), ties in layer.head order."""
        changing = [head for head in self.heads if len(set(head.roles)) > 1]
        return sorted(changing, key=lambda head: -abs(head.change.value) if head.change else 0.0)


def formation(held: Sequence[str], labels: Sequence[str], role_names: Sequence[str]) -> dict[str, str | None]:
    """For each role of `role_names`, the label of the first model (in the order given) from which a head holds it
    in every later model, given the head's role in each model (`held`); None when it does not hold it in the last.

    formation(["mixed", "induction", "mixed", "induction", "induction"], ["s0", "s1", "s2", "s3", "s4"],
    ["induction"]) == {"induction": "s3"}: held at s1, lost at s2, held from s3 on."""
    if len(held) != len(labels):
        raise ValueError("one role per model")
    formed: dict[str, str | None] = {}
    for role in role_names:
        start = None
        for index in range(len(held) - 1, -1, -1):
            if held[index] != role:
                break
            start = index
        formed[role] = None if start is None else labels[start]
    return formed


def transition(values: Sequence[float | None], labels: Sequence[str]) -> str | None:
    """The label of the model that ends the largest rise of `values` (a score in each model, in order) between two
    consecutive models: argmax over k ≥ 1 of values[k] − values[k−1], the earliest on a tie; None when no step
    rises (a step from or to a model without the score is skipped).

    transition([0.02, 0.03, 0.07, 0.24, 0.36, 0.49, 0.51], [f"s{k}" for k in range(7)]) == "s3": the rise of 0.17
    ends there, where the threshold of 0.5 is crossed only at s6."""
    if len(values) != len(labels):
        raise ValueError("one value per model")
    step = largest_step(values, rises_only=True)
    return None if step is None else labels[step[1]]


def largest_step(values: Sequence[float | None], rises_only: bool = False) -> tuple[float, int] | None:
    """(values[k] − values[k−1], k) of the largest step between consecutive values, by size (`rises_only`: the
    largest rise), the earliest on a tie; None when there is none (or, `rises_only`, none rises)."""
    best: tuple[float, int] | None = None
    for k in range(1, len(values)):
        before, after = values[k - 1], values[k]
        if before is None or after is None:
            continue
        step = after - before
        size = step if rises_only else abs(step)
        if size > 0 and (best is None or size > (best[0] if rises_only else abs(best[0]))):
            best = (step, k)
    return best


def head_change(scores: dict[str, list[float | None]], held: Sequence[str], labels: Sequence[str]) -> Step | None:
    """A head's largest step, up or down, between consecutive models, of the deciding score of the role it holds in
    the last model; for a head that ends mixed, of any role it held before (the largest). Ties: the earlier model,
    then the catalog's order of the roles. None for a head that is mixed in every model."""
    final = catalog.ROLE[held[-1]]
    roles = [final] if final.score is not None else [role for role in catalog.ROLES if role.name in held]
    best: Step | None = None
    for role in roles:
        if role.score is None or role.score not in scores:
            continue
        step = largest_step(scores[role.score])
        if step is not None and (best is None or abs(step[0]) > abs(best.value)):
            best = Step(role.score, step[0], labels[step[1]])
    return best


def model_loss(loaded: LoadedModel, texts: Texts | Sequence[Text], compare: settings.Compare) -> tuple[float, list]:
    """A model's mean language-model loss of `texts` (nats per predicted token) as `ablate` measures its baseline,
    and the notes of the windows it ran on; the model must have its language-model head."""
    import torch

    from attnscope.analyses.ablate import losses_under
    from attnscope.models.loading import fastest_attention
    from attnscope.pipeline import interventions
    from attnscope.pipeline.loss_windows import loss_windows

    windows, _, notes = loss_windows(loaded, texts, compare.bos)
    keep_all = torch.ones(1, loaded.n_layer, loaded.n_head)  # (1, L, H): every head kept
    with interventions.attention(loaded, fastest_attention(loaded.model)):
        loss = float(losses_under(loaded, windows, keep_all, compare.batch_size, compare.max_tokens)[0])
    check_finite(loaded, "loss", [loss])  # its weights are finite (checked at open): a half precision overflowed
    return loss, notes


@dataclass
class ModelPart:
    """What one piece of a comparison found of model `index`: its heads analysis (`run`, without maps) where the
    piece scored it, its loss and the loss's notes where the piece measured it, its facts (`info`), what
    `models.checks.check_comparable` reads of it (`reference`), and, for the second of two models, the divergence."""

    index: int
    run: Any = None
    measured: bool = False  # whether the piece measured the loss (`loss`: None where the model has no head)
    loss: float | None = None
    loss_notes: list[str] = field(default_factory=list)
    info: dict[str, Any] | None = None
    reference: Any = None
    divergences: Any = None


# A piece of a comparison: the models it opens, in order, each as (index, scored: runs its heads analysis, loss:
# measures its loss). One process does a piece whole (`Compare.pieces`).
Piece = list[tuple[int, bool, bool]]


class Compare(settings.Compare):
    """A comparison of several models (attnscope.settings.Compare): the same scoring settings for every model, the
    divergence of each head with two models, the heatmap's score and the ranked tables' rows."""

    def pieces(self, count: int, divergence: bool, processes: int) -> list[Piece]:
        """How `count` models are shared among `processes` (torchrun's; `distributed.run_shared` gives piece i to
        process i mod N). One process: one piece, every model scored and its loss measured while it is loaded.
        Several: a piece per model (scored, its loss measured), model i on process i mod N; with the divergence of
        two models, whose rows meet only where both run on one process (the first model's spooled while it runs,
        the second's compared with them as they are produced), one piece scores the two models and another
        measures their two losses. Every number is computed as one process computes it, so the result is one
        process's, bit for bit."""
        if processes == 1:
            return [[(index, True, self.loss) for index in range(count)]]
        if divergence:
            losses = [[(index, False, True) for index in range(count)]] if self.loss else []
            return [[(index, True, False) for index in range(count)], *losses]
        return [[(index, True, self.loss)] for index in range(count)]

    def run_models(
        self, sources: Sequence[ModelSource], texts: Texts | Sequence[Text], progress: Progress | None = None
    ) -> CompareResult:
        """Every model's heads analysis of `texts`, one model in memory at a time; the divergence with two. Under
        torchrun the models are shared among the processes (`pieces`) and what each found gathered, in order."""
        labels = [source.label for source in sources]
        self.check_models(len(sources))
        divergence = self.divergence if self.divergence is not None else len(sources) == 2
        pieces = self.pieces(len(sources), divergence, distributed.working().size)

        def run_piece(piece: Piece) -> list[ModelPart]:
            with distributed.alone():  # a piece is one process's, each model's passes over the texts whole
                return self._run_piece(piece, sources, texts, progress, divergence)

        parts: dict[int, ModelPart] = {}
        for part in (part for found in distributed.run_shared(pieces, run_piece) for part in found):
            known = parts.setdefault(part.index, part)  # opened by two pieces: scored by one, its loss by the other
            if part.run is not None:
                known.run, known.divergences = part.run, part.divergences
            if part.measured:
                known.loss, known.loss_notes, known.measured = part.loss, part.loss_notes, True
        ordered = [parts[index] for index in range(len(sources))]
        for index, part in enumerate(ordered[1:] if len(pieces) > 1 else [], 1):  # where the first was elsewhere
            check_comparable(ordered[0].reference, part.reference, labels[0], labels[index])
        losses = [part.loss for part in ordered] if self.loss else []
        loss_notes: list[str] = []
        for part in ordered:
            loss_notes += [note for note in part.loss_notes if note not in loss_notes]
        divergences = next((part.divergences for part in ordered if part.divergences is not None), None)
        infos = [{"label": source.label, "name": source.name, "revision": source.revision, **part.info}
                 for source, part in zip(sources, ordered, strict=True)]  # fmt: skip
        result = self._result([part.run for part in ordered], infos, labels, divergences)
        result.losses = losses
        result.notes += loss_notes
        return result

    def _run_piece(
        self,
        piece: Piece,
        sources: Sequence[ModelSource],
        texts: Texts | Sequence[Text],
        progress: Progress | None,
        divergence: bool,
    ) -> list[ModelPart]:
        """The models of one piece, opened one at a time: the scored ones' heads analysis (spooling the first's
        rows, comparing the second's with them, with the divergence), the loss where asked."""
        from attnscope.pipeline.divergence import AttentionSpool, DivergenceStatistics, SpoolWriter

        heads = scoring(self)
        parts: list[ModelPart] = []
        reference: LoadedModel | None = None  # the first model, its weights freed: its config and tokenizer stay
        spool: AttentionSpool | None = None
        try:
            for index, scored, loss in piece:
                source, part = sources[index], ModelPart(index)
                model = self._open(source, part.loss_notes) if loss else source.open()
                with source.holding(model):  # closed after; an error names the model
                    if index == 0:
                        reference = model
                        self.check_shape(model.shape)
                    elif reference is not None:
                        check_comparable(reference, model, sources[0].label, source.label)
                    check_weights(model)  # a NaN after the last attention leaves the heads finite, the loss not
                    if scored:
                        also = None
                        if divergence and spool is None:
                            spool = AttentionSpool(model.kind)
                            also = SpoolWriter(spool)
                        elif divergence:
                            also = DivergenceStatistics(spool, model.n_layer, model.n_head, model.device)
                        part.run = score_heads(model, texts, heads, _part(progress, index, len(sources)), also)
                        if isinstance(also, DivergenceStatistics):
                            part.divergences = also.means()
                    if loss:
                        part.loss = self._loss(model, source.label, texts, part.loss_notes)
                        part.measured = True
                    info = model.info()
                    part.reference = Comparable.of(model)
                del model
                part.info = {key: info[key] for key in ("n_params", "device", "dtype")}
                parts.append(part)
        finally:
            if spool is not None:
                spool.close()
        return parts

    def _open(self, source: ModelSource, notes: list[str]) -> LoadedModel:
        """A model with its language-model head for the loss (without, and a note, where it has none); without it
        when the loss is off."""
        if not self.loss:
            return source.open()
        try:
            return source.open(True)
        except AttnscopeError as error:  # a checkpoint saved without its head: the heads need none
            model = source.open()  # anything else fails here again, as it would have without the loss
            notes.append(f"{source.label}: no loss ({error})")
            return model

    def _loss(self, model: LoadedModel, label: str, texts: Texts | Sequence[Text], notes: list[str]) -> float | None:
        if model.lm_model is None:
            if not any(note.startswith(f"{label}: no loss") for note in notes):
                notes.append(f"{label}: no loss (the model was given without its language-model head)")
            return None
        try:
            loss, windows_notes = model_loss(model, texts, self)
        except AttnscopeError as error:
            notes.append(f"{label}: no loss ({error})")
            return None
        notes += [note for note in windows_notes if note.startswith("masked-LM") and note not in notes]
        return loss

    def _result(self, runs: list[HeadsResult], infos: list[dict], labels: list[str], divergences: Any) -> CompareResult:
        """The comparison of the models' heads analyses (`runs`, in order), the first's settings and input."""
        first, measured = runs[0], runs[0].measured
        score = self._shown_score(measured)
        settings = self._shown_settings(first, score, divergences)
        heads = compared_heads(runs, labels, divergences)
        model = {**first.model, "name": infos[0]["name"], "compared": infos}
        sink_rates = [run.sink_rate for run in runs]
        notes = list(first.notes)  # then each other model's own, named by its label
        for label, run in zip(labels[1:], runs[1:], strict=True):
            notes += [f"{label}: {note}" for note in run.notes if note not in first.notes]
        return CompareResult(
            model, first.kind, labels, first.inputs, settings, heads, measured, score, notes, sink_rates=sink_rates
        )

    def _shown_score(self, measured: Sequence[str]) -> str:
        """The score of the heads × models heatmap: `score`, or the first of DEFAULT_SCORES the run measured;
        refused where it was not measured."""
        score = self.score or next((name for name in DEFAULT_SCORES if name in measured), measured[0])
        if score not in measured:  # local_lift where the window holds every text
            raise AttnscopeError(f"score {score} was not measured (see the notes of heads)")
        return score

    def _shown_settings(self, first: HeadsResult, score: str, divergences: Any) -> dict[str, Any]:
        """The settings the result reports: the first model's heads analysis's (its layer and sort aside), the
        probes' lengths it used, and compare's own."""
        settings = {
            **first.settings,
            "probe_len": first.inputs.get("probe", {}).get("period"),
            "probe_seed": self.probe_seed,
            "haystack_len": first.inputs.get("needle", {}).get("haystack_len"),
            "revisions": None if self.revisions is None else list(self.revisions),
            "divergence": divergences is not None,
            "loss": self.loss,
            "score": score,
            "top": self.top,
        }
        for key in ("layer", "sort"):
            settings.pop(key, None)
        return settings


def compared_heads(runs: list[HeadsResult], labels: list[str], divergences: Any) -> list[CompareHead]:
    """Every head across the models, in layer.head order: its measured scores and role in each model, where each
    role formed, each role's transition, how the head changed, and its divergence (with two models)."""
    first = runs[0]
    role_names = [role.name for role in catalog.roles_for(first.kind.name) if role.name != "mixed"]
    heads = []
    for position, record in enumerate(first.heads):
        records = [run.heads[position] for run in runs]
        held = [record.role.role for record in records]
        scores = {name: [r.scores[name] for r in records] for name in catalog.SCORE_NAMES if name in first.measured}
        transitions = {
            role: transition(scores[catalog.ROLE[role].score], labels) if catalog.ROLE[role].score in scores else None
            for role in role_names
        }
        heads.append(
            CompareHead(
                record.layer,
                record.head,
                scores,
                held,
                formation(held, labels, role_names),
                None if divergences is None else float(divergences[record.layer, record.head]),
                transitions,
                head_change(scores, held, labels),
            )
        )
    return heads


def _part(progress: Progress | None, index: int, count: int) -> Progress | None:
    """The progress of model `index` of `count`, as a share of the whole comparison."""
    if progress is None:
        return None
    return lambda texts, tokens, share: progress(texts, tokens, (index + share) / count)
