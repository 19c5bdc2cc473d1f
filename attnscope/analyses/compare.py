"""`attnscope compare`: the same texts and the same probe through several models (checkpoints of one training run,
a base model and its fine-tune, revisions of one Hub repository): every head's scores and role in each, when each
role formed, and, for two models, how much each head's attention itself changed.

Models are loaded one at a time and freed before the next loads: memory is that of one model. Each runs the `heads`
analysis with the same settings (so a model's scores are exactly those `attnscope heads` gives it); only the
per-head scores and roles are kept. With two models, the change of each head is the mean Jensen–Shannon divergence
(bits) between the two models' attention rows on the same tokens, computed in the capture (pipeline.change): the
first model's rows are spooled to a temporary file, the second's compared with them as they are produced.

    from attnscope import compare
    result = compare(["runs/step-0000", "runs/step-1000"], "The cat sat on the mat.")
    result.heads[0].formed["induction"], result.heads[0].change
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from attnscope import options
from attnscope.analyses.common import Progress
from attnscope.analyses.heads import Scoring, check_sort, sort_score
from attnscope.analyses.result import Result
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape, check_comparable, check_same_shapes
from attnscope.models.loading import DEMO, LoadedModel
from attnscope.pipeline.inputs import Text, Texts
from attnscope.scores import catalog
from attnscope.scores.kinds import Kind

DEFAULT_TOP = 20
# The score drawn as heads × models when none is asked for: the first of these the run measured (induction heads'
# formation is the best-known phase change of training, Olsson et al. 2022).
DEFAULT_SCORES = ("induction", "previous_token", "entropy_normalized")


@dataclass(frozen=True)
class Checkpoint:
    """One model to compare: its `label` (the revision, the folder's name, the Hub id), what it is (`name`,
    `revision`), and `load`, which gives it. `owned`: loaded for this comparison, and freed after its run (a model
    the caller loaded is used as it is)."""

    label: str
    name: str
    revision: str | None
    load: Callable[[], LoadedModel]
    owned: bool = True


@dataclass(frozen=True)
class CompareHead:
    """One head across the models: `scores[name][k]` is its score in model k (None where not measured),
    `roles[k]` its role there, `formed[role]` the label of the first model from which it holds `role` to the last
    (None: it does not hold it in the last), `change` its mean JSD in bits between two models (None otherwise)."""

    layer: int
    head: int
    scores: dict[str, list[float | None]]
    roles: list[str]
    formed: dict[str, str | None]
    change: float | None = None

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
    def has_change(self) -> bool:
        return any(head.change is not None for head in self.heads)

    def ranked_by_change(self) -> list[CompareHead]:
        """Heads by change, largest first (ties in layer.head order)."""
        return sorted(self.heads, key=lambda head: -(head.change or 0.0))

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


def model_label(name: str, revision: str | None = None) -> str:
    """How a model is named in the comparison: its revision, a folder's name, `demo`, or its Hub id."""
    if revision is not None:
        return revision
    if name == DEMO:
        return DEMO
    path = Path(name).expanduser()
    if _is_folder(name):
        return path.resolve().name or str(path)
    return name


def _is_folder(name: str) -> bool:
    return name != DEMO and (name.startswith((".", "/", "~")) or os.path.isdir(os.path.expanduser(name)))


def unique_labels(labels: Sequence[str], names: Sequence[str]) -> tuple[list[str], str | None]:
    """`labels` made unique where two are equal: folders by their parent folders (`run1/final`, `run2/final`), then
    anything still equal by its place (`demo`, `demo#2`); and a note saying so (None when nothing changed)."""
    shown = list(labels)
    for label in set(labels):
        same = [k for k, other in enumerate(labels) if other == label]
        if len(same) < 2 or not all(_is_folder(names[k]) for k in same):
            continue
        parts = [Path(names[k]).expanduser().resolve().parts for k in same]
        for depth in range(2, max(len(p) for p in parts) + 1):
            longer = ["/".join(p[-depth:]) for p in parts]
            if len(set(longer)) == len(longer):
                for k, text in zip(same, longer, strict=True):
                    shown[k] = text
                break
    seen: dict[str, int] = {}
    for k, label in enumerate(shown):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            shown[k] = f"{label}#{seen[label]}"
    changed = [f"{before} as {after}" for before, after in zip(labels, shown, strict=True) if before != after]
    if not changed:
        return shown, None
    return shown, f"models with the same name are labelled apart: {', '.join(changed)}"


def parse_revisions(revisions: Any) -> tuple[str, ...] | None:
    """Revisions as given: `step0,step512` (a string, comma-separated) or a list of names; each non-empty."""
    if revisions is None:
        return None
    items = revisions.split(",") if isinstance(revisions, str) else revisions
    if isinstance(items, (bytes, Mapping)) or not isinstance(items, Sequence):
        raise AttnscopeError(f"revisions {options.shown(revisions)}: expected revisions such as step0,step512")
    names = tuple(item.strip() if isinstance(item, str) else item for item in items)
    if not names or any(not isinstance(name, str) or not name for name in names):
        raise AttnscopeError(
            f"revisions {options.shown(revisions)}: expected revisions such as step0,step512 (each a branch, tag or "
            "commit of the Hub repository of --model)"
        )
    return names


@dataclass(frozen=True)
class Compare(Scoring):
    """Settings of a comparison: those of `heads` that decide scores and roles (the same for every model), the
    revisions of one repository to compare, whether to measure the change of each head (None: for exactly two
    models), the score of the heads × models heatmap (None: induction when measured) and the rows of the ranked
    tables (`top`)."""

    revisions: Sequence[str] | str | None = None  # a tuple once built
    change: bool | None = None
    score: str | None = None
    top: int = DEFAULT_TOP
    OPTIONS: ClassVar[dict[str, options.Option]] = {
        **Scoring.SCORING_OPTIONS,
        "change": options.FLAG.or_none(),
        "top": options.TOP,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "revisions", parse_revisions(self.revisions))
        if self.score is not None:  # stored under its name, whichever spelling was given
            object.__setattr__(self, "score", sort_score(options.check_text(self.score, "score")).name)

    def sources(self, names: Sequence[str]) -> list[tuple[str, str | None]]:
        """(name, revision) of each model to load: the models given, or with `revisions` the revisions of the one
        model given. Checked before anything loads."""
        if not names:
            raise AttnscopeError("give the models to compare: --model A --model B (or one --model with --revisions)")
        if self.revisions is not None:
            if len(names) != 1:
                raise AttnscopeError(
                    f"--revisions names revisions of one repository, but {len(names)} models were given: give "
                    "--model once with --revisions, or each model with its own --model"
                )
            if names[0] == DEMO or _is_folder(names[0]):
                raise AttnscopeError(
                    f"--revisions {','.join(self.revisions)}: model '{names[0]}' is a folder on this machine, which "
                    "has no revisions; --revisions picks branches, tags or commits of one model on the Hugging Face Hub"
                )
            return [(names[0], revision) for revision in self.revisions]
        return [(name, None) for name in names]

    def check_count(self, count: int) -> None:
        if count < 2:
            raise AttnscopeError(
                f"compare needs at least two models, {count} given: --model A --model B, or one --model with "
                "--revisions R1,R2"
            )
        if self.change and count != 2:
            raise AttnscopeError(f"change compares the maps of two models; {count} were given")

    def check_shapes(self, shapes: Sequence[Shape | None], labels: Sequence[str]) -> None:
        """The models' shapes from their configs (None where unknown), refused in one line where two differ: before
        any weights load."""
        known = [(label, shape) for label, shape in zip(labels, shapes, strict=True) if shape is not None]
        check_same_shapes(known)
        if known and known[0][1].kind_name is not None:
            self.check_score(known[0][1].kind_name)

    def check_score(self, kind_name: str) -> None:
        """The heatmap's score (--score), checked against what this kind of model, with or without the probe,
        measures."""
        if self.score is None:
            return
        try:
            check_sort(self.score, kind_name, self.probe)
        except AttnscopeError as error:
            raise AttnscopeError(str(error).replace("sort by", "score", 1)) from None

    def run(
        self, checkpoints: Sequence[Checkpoint], texts: Texts | Sequence[Text], progress: Progress | None = None
    ) -> CompareResult:
        """Every model's heads analysis of `texts`, one model in memory at a time; the change with two."""
        from attnscope.pipeline.change import AttentionSpool, ChangeStatistics, SpoolWriter

        labels = [checkpoint.label for checkpoint in checkpoints]
        if len(set(labels)) != len(labels):
            raise AttnscopeError(f"two models share a label ({', '.join(labels)}): give each its own")
        self.check_count(len(checkpoints))
        change = self.change if self.change is not None else len(checkpoints) == 2
        settings = self.heads_settings()
        runs: list[Any] = []  # each model's HeadsResult, without its maps
        infos: list[dict[str, Any]] = []
        reference: LoadedModel | None = None
        spool: AttentionSpool | None = None
        changes = None
        try:
            for index, checkpoint in enumerate(checkpoints):
                model = checkpoint.load()
                try:
                    if reference is None:
                        reference = _reference(model)
                        self.check_score(model.kind.name)
                    else:
                        check_comparable(reference, model, labels[0], labels[index])
                    also = None
                    if change and spool is None:
                        spool = AttentionSpool(model.kind)
                        also = SpoolWriter(spool)
                    elif change:
                        also = ChangeStatistics(spool, model.n_layer, model.n_head, model.device)
                    result = settings.run(model, texts, _part(progress, index, len(checkpoints)), also)
                    if isinstance(also, ChangeStatistics):
                        changes = also.means()
                    info = model.info()
                finally:
                    if checkpoint.owned:
                        _free(model)
                    del model
                runs.append(result)
                facts = {key: info[key] for key in ("n_params", "device", "dtype")}
                infos.append(
                    {"label": checkpoint.label, "name": checkpoint.name, "revision": checkpoint.revision, **facts}
                )
        finally:
            if spool is not None:
                spool.close()
        return self._result(runs, infos, labels, changes)

    def _result(self, runs: list[Any], infos: list[dict], labels: list[str], changes: Any) -> CompareResult:
        first = runs[0]
        kind = first.kind
        measured = first.measured
        score = self.score or next((name for name in DEFAULT_SCORES if name in measured), measured[0])
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
                    None if changes is None else float(changes[record.layer, record.head]),
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
            "change": changes is not None,
            "score": score,
            "top": self.top,
        }
        for key in ("layer", "sort"):
            settings.pop(key, None)
        model = {**first.model, "name": infos[0]["name"], "compared": infos}
        return CompareResult(model, kind, labels, first.inputs, settings, heads, measured, score, notes)


def _reference(model: LoadedModel) -> LoadedModel:
    """What the first model leaves for the others to be checked against once its weights are freed: its config
    (shape, context) and tokenizer."""
    return LoadedModel(model.name, _ConfigOnly(model.config), model.tokenizer, model.device, model.family)


@dataclass
class _ConfigOnly:
    config: Any


def _part(progress: Progress | None, index: int, count: int) -> Progress | None:
    """The progress of model `index` of `count`, as a share of the whole comparison."""
    if progress is None:
        return None
    return lambda texts, tokens, share: progress(texts, tokens, (index + share) / count)


def _free(model: LoadedModel) -> None:
    """Let a model's weights go before the next loads (the caller drops its own reference). Their tensors are freed
    as the last reference goes (checked: no cycle holds them, so no gc.collect, which took 0.25 s a model); on a GPU
    torch's cache gives the memory back too."""
    import torch

    device = model.device
    model.model = None
    model.lm_model = None
    if getattr(device, "type", None) == "cuda":
        torch.cuda.empty_cache()
