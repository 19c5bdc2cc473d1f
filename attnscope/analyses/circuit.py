"""`attnscope circuit`: which heads each head depends on, by removing every earlier head and scoring it again.

For every explained head B and every head A of an earlier layer: B's score with A, without A (A's slice of the
output projection's input zeroed, exactly as `ablate` removes a head: `pipeline.interventions.HeadGates`), and the
change, on the same texts and the same repeated-token probe as `heads`. B's score is its deciding score by default
(the score that gave it its role; for a `mixed` head, the score that came closest to its role's threshold), or the
one `score` names.

    change(B, A) = score_B(A removed) − score_B(every head kept)          (B's layer > A's layer; 0 otherwise)

Two methods compute it, each in its own module:

    removal:  exact and cheap: each batch runs once and is replayed from A's layer only (`analyses.circuit_replay`;
              the naive way, one full forward per removed head, is its reference: `analyses.circuit_naive`)
    gradient: attribution patching, the first-order estimate (`analyses.circuit_gradient`)

Both share one signature (`CHANGES`): (loaded, texts, explained [(layer, head, score name)], heads settings) ->
(with_values (n,), changes (n, L, H)), changes exactly 0 where A's layer >= B's layer. This module holds the
settings (`Circuit`), the analysis (`Circuit.run`: the heads analysis, the changes, and with `weights` the
composition, copying and direct effects) and its result (`CircuitResult`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from attnscope import options
from attnscope.analyses.circuit_replay import Explained, removal_changes
from attnscope.analyses.common import Progress, head_label, parse_head
from attnscope.analyses.heads import Scoring, sort_score
from attnscope.analyses.result import Result
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape
from attnscope.models.loading import LoadedModel
from attnscope.pipeline.inputs import Text, Texts
from attnscope.scores import catalog

METHODS = options.CIRCUIT_METHODS
DEFAULT_TOP = 10  # dependencies listed per explained head


def gradient_changes(*args: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
    """`--method gradient`: attnscope.analyses.circuit_gradient.gradient_changes, imported when first asked for."""
    from attnscope.analyses.circuit_gradient import gradient_changes

    return gradient_changes(*args, **kwargs)


CHANGES: dict[str, Callable] = {"removal": removal_changes, "gradient": gradient_changes}  # the methods, by name


# ------------------------------------------------------------------------------------------------- the analysis


@dataclass
class CircuitResult(Result):
    """Which heads each explained head depends on.

    explained: [(layer, head, score)] of each head B; with_values (n,) its score with every head; changes (n, L, H)
    the change of that score when head A is removed (0 where A's layer >= B's); heads: one record per head of the
    model (label, layer, head, role, the score a head is explained by or decided by, copying, direct_effect);
    composition (scores.composition.Composition, or None without the weights) and its random baseline."""

    model: dict[str, Any]
    inputs: dict[str, Any]
    settings: dict[str, Any]
    explained: list[Explained]
    with_values: np.ndarray
    changes: np.ndarray
    heads: list[dict[str, Any]]
    composition: Any = None
    baseline: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def top(self) -> int:
        return self.settings["top"]

    def dependencies(self, top: int | None = None) -> list[dict[str, Any]]:
        """One record per pair (B, A earlier), B in layer.head order; within B, by change, the most negative first
        (the heads B needs most), ties in A's layer.head order. `top` keeps each B's `top` largest |change|."""
        _, L, H = self.changes.shape
        records = []
        for i, (layer, head, score) in enumerate(self.explained):
            pairs = [(a, h) for a in range(layer) for h in range(H)]
            if top is not None:
                pairs = sorted(pairs, key=lambda ah: (-abs(self.changes[i][ah]), ah))[:top]
            pairs.sort(key=lambda ah: (self.changes[i][ah], ah))
            for a, h in pairs:
                change = float(self.changes[i, a, h])
                records.append(
                    {
                        "label": f"{layer}.{head}",
                        "on": f"{a}.{h}",
                        "score": score,
                        "with": float(self.with_values[i]),
                        "without": float(self.with_values[i]) + change,
                        "change": change,
                    }
                )
        return records

    def edges(
        self, threshold: float, per_head: int, limit: int
    ) -> tuple[list[tuple[int, int, int, int, float]], int, int]:
        """The dependencies to draw, as (layer A, head A, layer B, head B, change): those with |change| >=
        `threshold`, each head B's `per_head` largest, the `limit` largest of all; and how many pairs fell below
        the threshold, and how many passed it but were left out by the two limits."""
        _, _, H = self.changes.shape
        passing, below, over = [], 0, 0
        for i, (layer, head, _) in enumerate(self.explained):
            mine = []
            for a in range(layer):
                for h in range(H):
                    change = float(self.changes[i, a, h])
                    if abs(change) >= threshold:
                        mine.append((a, h, layer, head, change))
                    else:
                        below += 1
            mine.sort(key=lambda edge: (-abs(edge[4]), edge[:4]))
            passing += mine[:per_head]
            over += max(0, len(mine) - per_head)
        passing.sort(key=lambda edge: (-abs(edge[4]), edge[:4]))
        return passing[:limit], below, over + max(0, len(passing) - limit)

    def composition_records(self) -> list[dict[str, Any]]:
        return [] if self.composition is None else self.composition.records()


def _head_labels(heads: Any) -> tuple[str, ...]:
    """The heads B named, `L.H` labels (a string alone is one head; None: none), each checked for its form."""
    items = () if heads is None else (heads,) if isinstance(heads, str) else heads
    if isinstance(items, (bytes, Mapping)) or not isinstance(items, Iterable):
        raise AttnscopeError(f"head {options.shown(heads)}: expected heads such as ['1.0', '2.3'] (LAYER.HEAD)")
    labels = []
    for label in items:
        if not isinstance(label, str):
            raise AttnscopeError(f"head {options.shown(label)}: expected a head such as '1.0' (LAYER.HEAD, 0-based)")
        head_label(label)
        labels.append(label.strip())
    return tuple(labels)


@dataclass(frozen=True)
class Circuit(Scoring):
    """Settings of a circuit analysis (see the module docstring); `run` checks what needs the model first.

    score: one score explained for every head B (None: each head's deciding score); head: the heads B explained,
    `L.H` labels (empty: every head of layer 1 and above); top: dependencies listed per head B; method: removal
    (exact) or gradient (attribution patching); steps: the gradient's integration points (0: the gradient with
    every head kept, attribution patching proper; N: integrated gradients over N points, N times the cost, closer to
    removal where a softmax saturates); weights: also the composition and copying scores from the weights
    and each head's direct effect (needs the language-model head). The rest are the heads analysis's settings."""

    score: str | None = None
    head: Sequence[str] | None = None  # a tuple once built
    top: int = DEFAULT_TOP
    method: str = "removal"
    weights: bool = True
    steps: int = 0  # gradient: 0, the gradient at every head kept; N, integrated gradients over N points
    OPTIONS: ClassVar[dict[str, options.Option]] = {
        **Scoring.SCORING_OPTIONS,
        "top": options.TOP,
        "method": options.CIRCUIT_METHOD,
        "weights": options.FLAG,
        "steps": options.STEPS,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.score is not None:
            object.__setattr__(self, "score", sort_score(options.check_text(self.score, "score")).name)
        object.__setattr__(self, "head", _head_labels(self.head))
        if self.steps and self.method != "gradient":
            raise AttnscopeError("steps (--steps) are the gradient's integration points: give method gradient too")

    @property
    def needs_lm_head(self) -> bool:
        return self.weights  # the unembedding of the copying scores, the logits of the direct effects

    def check_shape(self, shape: Shape) -> None:
        """The heads B (in range, above layer 0), the model has more than one layer, the score its kind measures:
        from the config before the weights load, and again."""
        if shape.n_layer < 2:
            raise AttnscopeError("this model has one layer: no head has an earlier head to depend on")
        for label in self.head:
            layer, head = parse_head(label, shape.n_layer, shape.n_head)
            if layer == 0:
                raise AttnscopeError(f"head {label}: it is in layer 0, and no head comes before it to depend on")
        if self.score is not None and shape.kind_name is not None:
            score = catalog.score_named(self.score)
            if shape.kind_name not in score.kinds:
                measured = " and ".join(f"{name}s" for name in sorted(score.kinds))
                raise AttnscopeError(f"score {self.score}: that score is measured for {measured} only")
            if score.source == catalog.PROBE and not self.probe:
                raise AttnscopeError(f"score {self.score}: that score comes from the probe, which is off")

    def run(
        self, loaded: LoadedModel, texts: Texts | Sequence[Text], progress: Progress | None = None
    ) -> CircuitResult:
        self.check_shape(loaded.shape)
        L, H = loaded.n_layer, loaded.n_head
        heads = self.heads_settings()
        base = heads.run(loaded, texts, progress)  # every head's scores and role
        chosen = [head_label(label) for label in self.head] or [(a, h) for a in range(1, L) for h in range(H)]
        chosen = list(dict.fromkeys(chosen))
        records = {(record.layer, record.head): record for record in base.heads}
        explained = []
        for layer, head in sorted(chosen):
            record = records[(layer, head)]
            score = self.score or record.role.metric
            if record.scores.get(score) is None:
                raise AttnscopeError(f"score {score} of head {layer}.{head} was not measured (see the notes of heads)")
            explained.append((layer, head, score))
        function = CHANGES[self.method]
        # the removal pass reports its progress (the texts' pass again, the longest); the gradient takes its steps
        shown = {"progress": progress} if self.method == "removal" else {"steps": self.steps}
        with_values, changes = function(loaded, texts, explained, heads, **shown)
        with_values, changes = np.asarray(with_values, dtype=np.float64), np.asarray(changes, dtype=np.float64)
        notes = list(base.notes)
        composition = baseline = copying = effects = None
        if self.weights:
            from attnscope.analyses.composition import weight_circuits
            from attnscope.analyses.direct_effect import direct_effects

            circuits = weight_circuits(loaded, readers=[(layer, head) for layer, head, _ in explained])
            composition, baseline, copying = circuits.composition, circuits.baseline, circuits.copying
            notes += circuits.notes
            found = direct_effects(loaded, texts, self.bos, self.batch_size, self.max_tokens)
            effects = found.heads
            notes += [note for note in found.notes if note not in notes]
        explained_scores = {(layer, head): score for layer, head, score in explained}
        head_records = []
        for record in base.heads:
            key = (record.layer, record.head)
            score = explained_scores.get(key, record.role.metric)
            head_records.append(
                {
                    "label": record.label,
                    "layer": record.layer,
                    "head": record.head,
                    "role": record.role.role,
                    "explained": key in explained_scores,
                    "score": score,
                    "value": record.scores.get(score),
                    "copying": None if copying is None else float(copying[key]),
                    "direct_effect": None if effects is None else float(effects[key]),
                }
            )
        settings = {
            "score": self.score,
            "head": list(self.head),
            "top": self.top,
            "method": self.method,
            "steps": self.steps,
            "weights": self.weights,
            "window": self.window,
            "thresholds": base.settings["thresholds"],
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "probe": self.probe,
            "probe_len": self.probe_len,
            "probe_seed": self.probe_seed,
        }
        return CircuitResult(
            model=base.model,
            inputs=base.inputs,
            settings=settings,
            explained=explained,
            with_values=with_values,
            changes=changes,
            heads=head_records,
            composition=composition,
            baseline=baseline,
            notes=notes,
        )
