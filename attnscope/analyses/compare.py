"""`attnscope compare`: the same texts and the same probe through several models (checkpoints of one training run,
a base model and its fine-tune, revisions of one Hub repository): every head's scores and role in each, when each
role formed, and, for two models, how far each head's attention itself moved (its divergence).

Models are loaded one at a time and freed before the next loads (models.sources): memory is that of one model. Each
runs the `heads` analysis with the same settings (so a model's scores are exactly those `attnscope heads` gives it);
only the per-head scores and roles are kept. With two models, the divergence of each head is the mean Jensen–Shannon
divergence (bits) between the two models' attention rows on the same tokens, computed in the capture
(pipeline.divergence): the first model's rows are spooled to a temporary file, the second's compared with them as
they are produced. ("Change" is kept for a difference of scores, as in `circuit`.)

    from attnscope import compare
    result = compare(["runs/step-0000", "runs/step-1000"], "The cat sat on the mat.")
    result.heads[0].formed["induction"], result.heads[0].divergence
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attnscope import settings
from attnscope.analyses.common import Progress
from attnscope.analyses.heads import scoring
from attnscope.analyses.result import Result
from attnscope.errors import AttnscopeError
from attnscope.models.checks import check_comparable
from attnscope.models.loading import LoadedModel
from attnscope.models.sources import ModelSource
from attnscope.pipeline.inputs import Text, Texts
from attnscope.scores import catalog
from attnscope.scores.kinds import Kind

# The score drawn as heads × models when none is asked for: the first of these the run measured (induction heads'
# formation is the best-known phase change of training, Olsson et al. 2022).
DEFAULT_SCORES = ("induction", "previous_token", "entropy_normalized")


@dataclass(frozen=True)
class CompareHead:
    """One head across the models: `scores[name][k]` is its score in model k (None where not measured),
    `roles[k]` its role there, `formed[role]` the label of the first model from which it holds `role` to the last
    (None: it does not hold it in the last), `divergence` its mean JSD in bits between two models (None otherwise)."""

    layer: int
    head: int
    scores: dict[str, list[float | None]]
    roles: list[str]
    formed: dict[str, str | None]
    divergence: float | None = None

    @property
    def label(self) -> str:
        return f"{self.layer}.{self.head}"


@dataclass(repr=False)  # the repr is Result's: a summary
class CompareResult(Result):
    model: dict[str, Any]  # the first model's facts (the shape every model shares), `compared`: each model's
    kind: Kind
    labels: list[str]  # the models, in the order given
    inputs: dict[str, Any]
    settings: dict[str, Any]
    heads: list[CompareHead]
    measured: tuple[str, ...]
    score: str  # the score of the heads × models heatmap
    notes: list[str] = field(default_factory=list)

    @property
    def has_divergence(self) -> bool:
        return any(head.divergence is not None for head in self.heads)

    def ranked_by_divergence(self) -> list[CompareHead]:
        """Heads by divergence, largest first (ties in layer.head order)."""
        return sorted(self.heads, key=lambda head: -(head.divergence or 0.0))

    def role_changes(self) -> list[CompareHead]:
        """The heads whose role is not the same in every model, in layer.head order."""
        return [head for head in self.heads if len(set(head.roles)) > 1]


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


class Compare(settings.Compare):
    """A comparison of several models (attnscope.settings.Compare): the same scoring settings for every model, the
    divergence of each head with two models, the heatmap's score and the ranked tables' rows."""

    def run_models(
        self, sources: Sequence[ModelSource], texts: Texts | Sequence[Text], progress: Progress | None = None
    ) -> CompareResult:
        """Every model's heads analysis of `texts`, one model in memory at a time; the divergence with two."""
        from attnscope.pipeline.divergence import AttentionSpool, DivergenceStatistics, SpoolWriter

        labels = [source.label for source in sources]
        self.check_models(len(sources))
        divergence = self.divergence if self.divergence is not None else len(sources) == 2
        heads = scoring(self)
        runs: list[Any] = []  # each model's HeadsResult, without its maps
        infos: list[dict[str, Any]] = []
        reference: LoadedModel | None = None  # the first model, its weights freed: its config and tokenizer stay
        spool: AttentionSpool | None = None
        divergences = None
        try:
            for index, source in enumerate(sources):
                with source.opened() as model:  # an error names the model
                    if reference is None:
                        reference = model
                        self.check_shape(model.shape)
                    else:
                        check_comparable(reference, model, labels[0], labels[index])
                    also = None
                    if divergence and spool is None:
                        spool = AttentionSpool(model.kind)
                        also = SpoolWriter(spool)
                    elif divergence:
                        also = DivergenceStatistics(spool, model.n_layer, model.n_head, model.device)
                    result = heads.run(model, texts, _part(progress, index, len(sources)), also)
                    if isinstance(also, DivergenceStatistics):
                        divergences = also.means()
                    info = model.info()
                del model
                runs.append(result)
                facts = {key: info[key] for key in ("n_params", "device", "dtype")}
                infos.append({"label": source.label, "name": source.name, "revision": source.revision, **facts})
        finally:
            if spool is not None:
                spool.close()
        return self._result(runs, infos, labels, divergences)

    def _result(self, runs: list[Any], infos: list[dict], labels: list[str], divergences: Any) -> CompareResult:
        first = runs[0]
        kind = first.kind
        measured = first.measured
        score = self.score or next((name for name in DEFAULT_SCORES if name in measured), measured[0])
        if score not in measured:  # local_lift where the window holds every text
            raise AttnscopeError(f"score {score} was not measured (see the notes of heads)")
        role_names = [role.name for role in catalog.roles_for(kind.name) if role.name != "mixed"]
        heads = []
        for position, record in enumerate(first.heads):
            records = [run.heads[position] for run in runs]
            held = [record.role.role for record in records]
            heads.append(
                CompareHead(
                    record.layer,
                    record.head,
                    {name: [r.scores[name] for r in records] for name in catalog.SCORE_NAMES if name in measured},
                    held,
                    formation(held, labels, role_names),
                    None if divergences is None else float(divergences[record.layer, record.head]),
                )
            )
        notes = list(first.notes)
        for label, run in zip(labels[1:], runs[1:], strict=True):
            notes += [f"{label}: {note}" for note in run.notes if note not in first.notes]
        settings = {
            **first.settings,
            "probe_len": first.inputs.get("probe", {}).get("period"),
            "probe_seed": self.probe_seed,
            "revisions": None if self.revisions is None else list(self.revisions),
            "divergence": divergences is not None,
            "score": score,
            "top": self.top,
        }
        for key in ("layer", "sort"):
            settings.pop(key, None)
        model = {**first.model, "name": infos[0]["name"], "compared": infos}
        return CompareResult(model, kind, labels, first.inputs, settings, heads, measured, score, notes)


def _part(progress: Progress | None, index: int, count: int) -> Progress | None:
    """The progress of model `index` of `count`, as a share of the whole comparison."""
    if progress is None:
        return None
    return lambda texts, tokens, share: progress(texts, tokens, (index + share) / count)
