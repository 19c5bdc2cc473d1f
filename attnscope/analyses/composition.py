"""Composition and copying of a loaded model, from its weights alone (no text): `models.weights` reads the matrices,
`scores.composition` scores them.

Interface (stable; `attnscope circuit` calls it):

    weight_circuits(loaded, readers=None, samples=16, seed=0) -> WeightCircuits
        .composition  scores.composition.Composition: .q, .k, .v (L, H, L, H), .records()
                      [{"from": "0.2", "to": "1.0", "q", "k", "v"}, ...]
        .baseline     {"q": {"mean", "std"}, "k": …, "v": …, "expected_rms": 1/√d_model, "samples", "seed"}: the
                      scores of random heads of the same shapes
        .copying      numpy (L, H) float64, or None when the unembedding cannot be had (an untied decoder loaded
                      without lm_head=True; a note says so)
        .notes        what these scores leave out for this model (rotary, QK-norm, biases, …)
        .head_records()  [{"label": "0.2", "copying": 0.67}, ...] in layer.head order
    `readers` [(layer, head)] restricts the heads B whose composition is scored (the cost is proportional).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.models.readout import embedding, unembedding
from attnscope.models.weights import head_weights, weight_notes
from attnscope.scores.composition import Composition, composition_scores, copying_scores, random_baseline


@dataclass
class WeightCircuits:
    composition: Composition
    baseline: dict[str, Any]
    copying: np.ndarray | None
    notes: list[str] = field(default_factory=list)

    def head_records(self) -> list[dict[str, Any]]:
        if self.copying is None:
            return []
        L, H = self.copying.shape
        return [
            {"label": f"{layer}.{head}", "copying": float(self.copying[layer, head])}
            for layer in range(L)
            for head in range(H)
        ]


def weight_circuits(
    loaded: LoadedModel, readers: Sequence[tuple[int, int]] | None = None, samples: int = 16, seed: int = 0
) -> WeightCircuits:
    """Composition of every earlier head into every later one (or into `readers`), its random baseline, and every
    head's copying score (see the module docstring)."""
    weights = head_weights(loaded)
    written = weights.W_O_written
    _check_finite(loaded, weights.W_Q, weights.W_K, weights.W_V, written)
    composition = composition_scores(weights.W_Q, weights.W_K, weights.W_V, written, readers=readers)
    L, H, d, k = weights.shape
    baseline = random_baseline(d, k, samples=samples, seed=seed)
    notes = weight_notes(loaded)
    notes.append(
        f"random heads of the same shapes compose at {baseline['q']['mean']:.3f} ± {baseline['q']['std']:.3f} "
        f"(Q; about 1/√d_model = {baseline['expected_rms']:.3f} for every kind): a score means something only well "
        "above that"
    )
    try:
        W_E, W_U = embedding(loaded), unembedding(loaded)
    except AttnscopeError as error:
        copying = None
        notes.append(f"no copying scores: {error}")
    else:
        _check_finite(loaded, W_E, W_U)
        copying = copying_scores(W_E, weights.W_V, written, W_U)
    return WeightCircuits(composition, baseline, copying, notes)


def _check_finite(loaded: LoadedModel, *matrices: Any) -> None:
    """Refuse weights holding NaN or infinity before any linear algebra sees them: LAPACK fails on them, and prints
    its complaint on standard output (`Intel oneMKL ERROR: Parameter 3 was incorrect on entry to DGEBAL`), where
    only the result may go."""
    from attnscope.analyses.common import damaged_weights, first_non_finite_weight

    if all(bool(matrix.isfinite().all()) for matrix in matrices):
        return
    network = loaded.lm_model if loaded.lm_model is not None else loaded.model
    name = first_non_finite_weight(network) or "a weight"
    raise AttnscopeError(f"the weight circuits cannot be computed: {damaged_weights(name)}")
