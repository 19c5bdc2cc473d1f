"""`attnscope circuit`: which heads each head depends on, by removing every earlier head and scoring it again.

For every explained head B and every head A of an earlier layer: B's score with A, without A (A's slice of the
output projection's input replaced, exactly as `ablate` removes a head: by its mean over the input's positions, 0, or
another window's output at the same position, as `ablation` says: `pipeline.ablation`), and the change, on the same
texts and the same repeated-token probe as `heads` (each input with its own means and donors). B's score is its
deciding score by default (the score that gave it its role; for a `mixed` head, the score that came closest to its
role's threshold), or the one `score` names.

    change(B, A) = score_B(A removed) − score_B(every head kept)          (B's layer > A's layer; 0 otherwise)

Two methods compute it, each in its own module:

    removal:  exact and cheap: each batch runs once and is replayed from A's layer only (`analyses.circuit_replay`;
              the naive way, one full forward per removed head, is its reference: `analyses.circuit_naive`)
    gradient: attribution patching, the first-order estimate (`analyses.circuit_gradient`)

Both share one signature (`CHANGES`): (loaded, texts, explained [(layer, head, score name)], heads settings) ->
(with_values (n,), changes (n, L, H)), changes exactly 0 where A's layer >= B's layer. This module holds the
settings (`Circuit`), the analysis (`Circuit.run`: the heads analysis, the changes, and with `weights` the
composition, copying and direct effects) and its result (`CircuitResult`).

Under torchrun the removals are shared (`analyses.circuit_replay`: every process runs every batch, and replays every
N-th removal), and the batches of the gradient and of the direct effects (`distributed.in_rounds`); everything else
runs whole in every process, the heads analysis included (`distributed.alone`: a share of the windows, its sums
added, would round otherwise), so the result is one process's, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope import options, settings
from attnscope.analyses.circuit_replay import Explained, removal_changes
from attnscope.analyses.common import Progress
from attnscope.analyses.result import Result
from attnscope.analyses.scoring import HeadsResult, score_heads, scoring
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.output.circuit import CircuitView
from attnscope.pipeline import distributed
from attnscope.pipeline.ablation import describe
from attnscope.pipeline.inputs import Text, Texts
from attnscope.scores import catalog

METHODS = options.CIRCUIT_METHODS


def gradient_changes(*args: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
    """`--method gradient`: attnscope.analyses.circuit_gradient.gradient_changes, imported when first asked for."""
    from attnscope.analyses.circuit_gradient import gradient_changes

    return gradient_changes(*args, **kwargs)


CHANGES: dict[str, Callable] = {"removal": removal_changes, "gradient": gradient_changes}  # the methods, by name
# why a score that is not `differentiable` (catalog) cannot be explained by the gradient
NO_GRADIENT = (
    f"{', '.join(score.name for score in catalog.SCORES if not score.differentiable)}: a count of argmax hits, "
    "constant between its jumps, whose gradient is 0 wherever it has one"
)
ESTIMATE_NOTE = (
    "method gradient: every change is an estimate, not a measure (attribution patching: the first-order change from "
    "the gradient of the score by each head's gate, {how}); it can miss or reverse the effect of a head whose "
    "attention is saturated: confirm the dependencies that matter with method removal (--method removal), which "
    "measures them. Where with + change leaves the range the score can take, `without` is clipped to it and marked "
    "clipped"
)


# ------------------------------------------------------------------------------------------------- the analysis


@dataclass(repr=False)  # the repr is Result's: a summary
class CircuitResult(Result):
    """Which heads each explained head depends on.

    explained: [(layer, head, score)] of each head B; with_values (n,) its score with every head; changes (n, L, H)
    the change of that score when head A is removed (0 where A's layer >= B's); heads: one record per head of the
    model (label, layer, head, role, the score a head is explained by or decided by, copying, direct_effect);
    composition (scores.composition.Composition, or None without the weights) and its random baseline."""

    view_class = CircuitView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

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
    def top(self) -> int | None:
        return self.settings["top"]

    @property
    def explained_labels(self) -> list[str]:
        """The heads B explained (`explained`, the rows of `with_values` and `changes`), as `L.H` labels."""
        return [f"{layer}.{head}" for layer, head, _ in self.explained]

    @property
    def estimate(self) -> bool:
        """Whether the changes are estimates (`gradient`: attribution patching) rather than measured (`removal`)."""
        return self.settings.get("method") == "gradient"

    def dependencies(self, top: int | None = None) -> list[dict[str, Any]]:
        """One record per pair (B, A earlier), B in layer.head order; within B, by change, the most negative first
        (the heads B needs most), ties in A's layer.head order. `top` keeps each B's `top` largest |change|.

        `estimate`: the change is the gradient's estimate, not a removal's measure. `without` is `with + change`,
        except where an estimate leaves the range the score can take (catalog.RANGES: a share below 0 or above 1, a
        lift above 1, an entropy below 0): it is clipped to the range there and `clipped` is true (`with + change`
        still gives the raw estimate; a linear estimate that leaves the range has broken down: confirm by removal).
        A removal's scores are measured, so never clipped."""
        _, L, H = self.changes.shape
        records = []
        for i, (layer, head, score) in enumerate(self.explained):
            low, high = catalog.RANGES[catalog.SCORE[score].unit]
            pairs = [(a, h) for a in range(layer) for h in range(H)]
            if top is not None:
                pairs = sorted(pairs, key=lambda ah: (-abs(self.changes[i][ah]), ah))[:top]
            pairs.sort(key=lambda ah: (self.changes[i][ah], ah))
            for a, h in pairs:
                change = float(self.changes[i, a, h])
                implied = float(self.with_values[i]) + change
                kept = min(high, max(low, implied)) if self.estimate else implied
                records.append(
                    {
                        "label": f"{layer}.{head}",
                        "on": f"{a}.{h}",
                        "score": score,
                        "with": float(self.with_values[i]),
                        "without": kept,
                        "change": change,
                        "estimate": self.estimate,
                        "clipped": kept != implied,
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


class Circuit(settings.Circuit):
    """Settings of a circuit analysis (attnscope.settings.Circuit; see the module docstring)."""

    def run(
        self, loaded: LoadedModel, texts: Texts | Sequence[Text], progress: Progress | None = None
    ) -> CircuitResult:
        self.check_shape(loaded.shape)
        heads = scoring(self)
        check_memory(loaded, texts, heads)  # before any forward
        with distributed.alone():  # under torchrun every process scores every head on every text, as one does
            base = score_heads(loaded, texts, heads, progress)  # every head's scores and role
        explained, flat = self._explained(loaded, base)
        with_values, changes = self._changes(loaded, texts, explained, heads, progress)
        notes = list(base.notes) + self._method_notes(explained, flat)
        weights = self._from_weights(loaded, texts, explained, notes)
        return CircuitResult(
            model=base.model,
            inputs=base.inputs,
            settings=self._shown_settings(base),
            explained=explained,
            with_values=with_values,
            changes=changes,
            heads=_head_records(base, explained, weights.copying, weights.effects),
            composition=weights.composition,
            baseline=weights.baseline,
            notes=notes + weights.notes,
        )

    def _explained(self, loaded: LoadedModel, base: HeadsResult) -> tuple[list[Explained], list[str]]:
        """The heads to explain, (layer, head, score) in layer.head order (the `head`s asked for, or every head past
        layer 0), each by `score` or its deciding score; and, with the gradient, the labels of those left out
        because that score has no gradient. Refused where a score was not measured, or where no head is left."""
        L, H = loaded.n_layer, loaded.n_head
        chosen = [options.head_of(label) for label in self.head] or [(a, h) for a in range(1, L) for h in range(H)]
        chosen = list(dict.fromkeys(chosen))
        records = {(record.layer, record.head): record for record in base.heads}
        explained, flat = [], []
        for layer, head in sorted(chosen):
            record = records[(layer, head)]
            score = self.score or record.role.metric
            if record.scores.get(score) is None:
                raise AttnscopeError(f"score {score} of head {layer}.{head} was not measured (see the notes of heads)")
            if self.method == "gradient" and not catalog.SCORE[score].differentiable:
                flat.append(record.label)  # its deciding score has no gradient: attribution patching cannot see it
                continue
            explained.append((layer, head, score))
        if flat and not explained:
            raise AttnscopeError(
                f"method gradient: every head asked for is decided by a score with no gradient ({NO_GRADIENT}); "
                "use method removal"
            )
        return explained, flat

    def _changes(
        self,
        loaded: LoadedModel,
        texts: Texts | Sequence[Text],
        explained: list[Explained],
        heads: settings.Heads,
        progress: Progress | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each explained score with every head kept (n,) and its change without each earlier head (n, L, H), by
        the method asked for (`CHANGES`), float64."""
        function = CHANGES[self.method]
        # the removal pass reports its progress (the texts' pass again, the longest); the gradient takes its steps
        shown = {"progress": progress} if self.method == "removal" else {"steps": self.steps}
        ablation = {"ablation": self.ablation, "seed": self.resample_seed}
        with_values, changes = function(loaded, texts, explained, heads, **shown, **ablation)
        return np.asarray(with_values, dtype=np.float64), np.asarray(changes, dtype=np.float64)

    def _method_notes(self, explained: list[Explained], flat: list[str]) -> list[str]:
        """What the reader should know of how the changes were found: the ablation, the heads the gradient left
        out, and that the gradient's changes are estimates."""
        probed = any(catalog.score_named(score).source in catalog.PROBES for _, _, score in explained)
        notes = [describe(self.ablation, self.resample_seed, probed)]
        if flat:
            notes.append(
                f"method gradient: {catalog.counted(len(flat), 'head')} not explained ({', '.join(flat)}): decided "
                f"by a score with no gradient ({NO_GRADIENT}); method removal measures them"
            )
        if self.method == "gradient":
            notes.append(
                ESTIMATE_NOTE.format(how=f"integrated over {self.steps} points" if self.steps else "at every head kept")
            )
        return notes

    def _from_weights(
        self, loaded: LoadedModel, texts: Texts | Sequence[Text], explained: list[Explained], notes: list[str]
    ) -> FromWeights:
        """With `weights`: the composition of the explained heads with earlier ones and its baseline, every head's
        copying and direct effect, and their notes not already among `notes`; nothing without."""
        if not self.weights:
            return FromWeights()
        from attnscope.analyses.composition import weight_circuits
        from attnscope.analyses.direct_effect import direct_effects

        circuits = weight_circuits(loaded, readers=[(layer, head) for layer, head, _ in explained])
        found = direct_effects(loaded, texts, self.bos, self.batch_size, self.max_tokens)
        added = list(circuits.notes)
        added += [note for note in found.notes if note not in notes + added]
        return FromWeights(circuits.composition, circuits.baseline, circuits.copying, found.heads, added)

    def _shown_settings(self, base: HeadsResult) -> dict[str, Any]:
        """The settings the result reports (the thresholds as the heads analysis reports them: its kind's roles)."""
        return {
            "score": self.score,
            "head": list(self.head),
            "top": self.top,
            "method": self.method,
            "ablation": self.ablation,
            "resample_seed": self.resample_seed if self.ablation == "resample" else None,
            "steps": self.steps,
            "weights": self.weights,
            "window": self.window,
            "thresholds": base.settings["thresholds"],
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "probe": self.probe,
            "probe_len": self.probe_len,
            "haystack_len": self.haystack_len,
            "probe_seed": self.probe_seed,
        }


@dataclass
class FromWeights:
    """What `circuit --weights` adds from the model's weights: the explained heads' composition with earlier heads
    and its random baseline, every head's copying and direct effect ((L, H) each); None without the weights."""

    composition: Any = None
    baseline: dict[str, Any] | None = None
    copying: Any = None
    effects: Any = None
    notes: list[str] = field(default_factory=list)


def _head_records(base: HeadsResult, explained: list[Explained], copying: Any, effects: Any) -> list[dict[str, Any]]:
    """One record per head of the model, in layer.head order: its role, the score it is explained by (or, not
    explained, decided by) and its value, its copying and direct effect (None without the weights)."""
    explained_scores = {(layer, head): score for layer, head, score in explained}
    records = []
    for record in base.heads:
        key = (record.layer, record.head)
        score = explained_scores.get(key, record.role.metric)
        records.append(
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
    return records


def check_memory(loaded: LoadedModel, texts: Texts | Sequence[Text], heads: Any) -> None:
    """Refuse, before any forward, batches whose replays would not fit: for each batch the removals keep every
    layer's inputs and its heads' outputs (and, on a GPU, run copies of the batch: `interventions.MAX_COPY_TOKENS`
    tokens at most), on top of a forward's own activations (bench's estimate, `analyses.bench_limits.estimated_bytes`, a
    lower bound). The largest batch is that of the longest window (its padded tokens bounded by max_tokens)."""
    from attnscope.analyses import harness
    from attnscope.analyses.bench_limits import estimated_bytes
    from attnscope.pipeline.interventions import MAX_COPY_TOKENS
    from attnscope.pipeline.tokens import WindowStream

    windows = WindowStream(loaded, texts, heads.bos)
    for _ in windows:  # tokenized only: the longest window sizes the largest batch
        pass
    n = windows.longest
    if not n:
        return
    fitting = n if heads.max_tokens is None else max(1, heads.max_tokens // n)
    batch = min(heads.batch_size, windows.n_windows, fitting)
    element = loaded.dtype.itemsize
    config = loaded.config
    weights = estimated_bytes(config, 0, 0, "circuit", element)
    need = estimated_bytes(config, batch, n, "circuit", element) - weights
    if loaded.device.type == "cuda":  # the removals of one layer replayed as copies of the batch
        need += element * 16 * config.hidden_size * min(loaded.n_head * batch * n, max(MAX_COPY_TOKENS, batch * n))
    free = harness.available_bytes(loaded.device)
    if free is not None and need > free:
        raise AttnscopeError(
            f"circuit keeps every layer's inputs and heads' outputs of a batch for its replays: batches of "
            f"{batch} × {n:,} tokens need about {need / 2**30:,.1f} GiB (estimated), more than the "
            f"{free / 2**30:,.1f} GiB available on {loaded.device.type}; lower batch_size or max_tokens "
            "(--batch-size, --max-tokens), or give shorter texts"
        )
