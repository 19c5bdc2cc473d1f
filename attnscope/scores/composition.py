"""How heads compose and what they copy, from the weights alone (Elhage et al. 2021, "A Mathematical Framework for
Transformer Circuits"): pure functions of tensors, no model.

Interface (stable; `attnscope circuit` calls these with `models.weights.head_weights(loaded)`):

    composition_scores(W_Q, W_K, W_V, W_O) -> Composition
        W_Q, W_K, W_V (L, H, d, d_head), W_O (L, H, d_head, d): pass HeadWeights.W_O_written
        .q, .k, .v: numpy (L, H, L, H) float64, [layer_A, head_A, layer_B, head_B]; NaN unless layer_A < layer_B
        .records() -> [{"from": "0.2", "to": "1.0", "q": 0.31, "k": 0.05, "v": 0.12}, ...] (A before B, in order)
    composition_scores(..., readers=[(1, 0), (1, 3)]): only those heads B (every earlier A), NaN elsewhere
    random_baseline(d_model, d_head, samples=16, seed=0) -> {"q": {"mean", "std"}, "k": {…}, "v": {…},
        "expected_rms": 1/√d_model, "samples", "seed"}
    copying_scores(W_E, W_V, W_O, W_U) -> numpy (L, H) float64 in [-1, 1]
        W_E (V, d), W_V (L, H, d, d_head), W_O (L, H, d_head, d), W_U (d, V)

Definitions, per head: W_QK = W_Q W_Kᵀ and W_OV = W_V W_O (d × d, "x @ W": a token at x attends to one at y with
logit x W_QK yᵀ, and moves y W_OV). For an earlier head A and a later head B (layer_A < layer_B):

    Q-composition  ‖W_OV(A) W_QK(B)‖_F  / (‖W_OV(A)‖_F ‖W_QK(B)‖_F)   A's output read by B's queries
    K-composition  ‖W_QK(B) W_OV(A)ᵀ‖_F / (‖W_OV(A)‖_F ‖W_QK(B)‖_F)   … by B's keys (an induction head's K on a
                                                                         previous-token head)
    V-composition  ‖W_OV(A) W_OV(B)‖_F  / (‖W_OV(A)‖_F ‖W_OV(B)‖_F)   … by B's values

Each is at most 1 (‖MN‖_F ≤ ‖M‖_F ‖N‖_F), 0 when A writes into a subspace B does not read, and ~1/√d for random
matrices (see `random_baseline`): a score means something only well above that baseline.

How it is computed without any d × d matrix: for a factor W (d × k) with WᵀW = RᵀR (R k × k), ‖M Wᵀ‖_F = ‖M Rᵀ‖_F
for any M, since ‖U Vᵀ‖_F² = tr((UᵀU)(VᵀV)). So each head gives small factors once: the writer X_A = R_V(A) W_O(A)
(k × d, R_V from W_V(A)) and the readers Y_Q(B) = W_Q(B) R_K(B)ᵀ, Y_K(B) = W_K(B) R_Q(B)ᵀ, Y_V(B) = W_V(B) R_O(B)ᵀ
(d × k, R_O from W_O(B)ᵀ). Then Q = ‖X_A Y_Q(B)‖_F / (‖X_A‖_F ‖Y_Q(B)‖_F), K and V likewise, since ‖W_OV(A)‖_F =
‖X_A‖_F, ‖W_QK(B)‖_F = ‖Y_Q(B)‖_F = ‖Y_K(B)‖_F and ‖W_OV(B)‖_F = ‖Y_V(B)‖_F. A pair costs three k × k products,
6 k² d flops. (Inner products of the d × d Gram matrices, 2 d² flops a pair, would cost fewer flops when d < k², but
hold d² floats per head, 2.4 MB for GPT-2 small, 67 MB at d = 4096, and lose precision near 0 in float32.)

Measured (`scripts/time_composition.py`, float32, on the project's 2-core CPU shared with other jobs, load 9–12, so
upper bounds): GPT-2 small's shape (12 × 12 heads, d 768, d_head 64: 9,504 pairs) 14.7 s; a Llama-7B shape (32 × 32
heads, d 4096, d_head 128: 507,904 pairs, 2·10¹⁴ flops) about 3.1 h, extrapolated from 16 writers against one layer
of readers (no GPU was available to measure it there: at ~50 TFLOP/s of float32, seconds). `readers` cuts the cost
in proportion: one head of a 7B model against every earlier head is 3·10¹¹ flops.

Copying (Elhage et al. 2021): the full OV circuit W_E W_OV W_U (V × V) maps a token attended to onto the logits it
raises. Its eigenvalues λ tell what it does: positive ones raise the token itself (copying), negative ones lower it
(copy suppression, McDougall et al. 2023). The copying score Σ_i Re λ_i / Σ_i |λ_i| is 1 for a head that only
copies, −1 for one that only suppresses. The nonzero eigenvalues of a product do not change under cyclic
permutation, so they are those of the k × k matrix W_O (W_U W_E) W_V; complex eigenvalues come in conjugate pairs,
whose real parts count in the numerator and moduli in the denominator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    import torch

KINDS = ("q", "k", "v")
# The products of one chunk of writers with one layer of readers stay under this many bytes.
CHUNK_BYTES = 1 << 28


def head_label(layer: int, head: int) -> str:
    return f"{layer}.{head}"


@dataclass
class Composition:
    """Q-, K- and V-composition of every earlier head A into every later head B: (L, H, L, H) float64 arrays
    indexed [layer_A, head_A, layer_B, head_B], NaN where layer_A ≥ layer_B."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray

    def records(self) -> list[dict[str, Any]]:
        """One record per pair A → B scored (layer_A < layer_B), by A then B: {"from", "to", "q", "k", "v"}."""
        L, H = self.q.shape[:2]
        return [
            {
                "from": head_label(la, ha),
                "to": head_label(lb, hb),
                **{kind: float(getattr(self, kind)[la, ha, lb, hb]) for kind in KINDS},
            }
            for la in range(L)
            for ha in range(H)
            for lb in range(la + 1, L)
            for hb in range(H)
            if not np.isnan(self.q[la, ha, lb, hb])
        ]


def _finite(matrix: torch.Tensor) -> torch.Tensor:
    """`matrix`, if it holds no NaN nor infinity: LAPACK fails on those and prints its complaint on standard output
    (the weights themselves are checked before; a product of finite weights can still overflow)."""
    if not bool(matrix.isfinite().all()):
        raise AttnscopeError(
            "the weight circuits cannot be computed: products of the model's weights overflowed (NaN or infinity); "
            "its weights are far larger than any trained model's"
        )
    return matrix


def _r_factor(W: torch.Tensor) -> torch.Tensor:
    """R (…, k, k) with RᵀR = WᵀW for W (…, d, k), so that ‖M Wᵀ‖_F = ‖M Rᵀ‖_F for any M: the Cholesky factor of
    the Gram matrix (on a CPU forty times faster than batched QR), or, for a rank-deficient W (a pruned head, a
    planted test), Λ^½ Eᵀ from its eigendecomposition."""
    import torch

    gram = _finite(W.transpose(-1, -2) @ W)  # (…, k, k)
    lower, info = torch.linalg.cholesky_ex(gram)
    R = lower.transpose(-1, -2)
    singular = info != 0
    if bool(singular.any()):
        values, vectors = torch.linalg.eigh(gram[singular])
        R[singular] = values.clamp_min(0).sqrt()[..., :, None] * vectors.transpose(-1, -2)
    return R


def writer_factors(W_V: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """X = R_V W_O (…, k, d) with W_V = Q R_V: ‖X‖_F = ‖W_OV‖_F and ‖X Y‖_F = ‖W_OV Z‖_F for Z = Y Qᵀ-free readers."""
    return _r_factor(W_V) @ W_O  # (…, k, k) @ (…, k, d)


def reader_factors(
    W_Q: torch.Tensor, W_K: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Y_Q, Y_K, Y_V), each (…, d, k): W_QK = Y_Q Q_Kᵀ, W_QKᵀ = Y_K Q_Qᵀ, W_OV = Y_V Q_Oᵀ with orthonormal Q's, so
    that ‖X W_QK‖_F = ‖X Y_Q‖_F and so on."""
    Y_Q = W_Q @ _r_factor(W_K).transpose(-1, -2)  # (…, d, k)
    Y_K = W_K @ _r_factor(W_Q).transpose(-1, -2)
    Y_V = W_V @ _r_factor(W_O.transpose(-1, -2)).transpose(-1, -2)
    return Y_Q, Y_K, Y_V


def pair_scores(X: torch.Tensor, Y: torch.Tensor, chunk_bytes: int = CHUNK_BYTES) -> torch.Tensor:
    """‖X_a Y_b‖_F / (‖X_a‖_F ‖Y_b‖_F) for every writer a and reader b: X (A, k, d), Y (B, d, k) -> (A, B); 0 where
    a norm is 0."""
    import torch

    A, k, d = X.shape
    B, _, k_reader = Y.shape
    Y_flat = Y.permute(1, 0, 2).reshape(d, B * k_reader)  # (d, B·k)
    squares = torch.empty(A, B, dtype=X.dtype, device=X.device)
    step = max(1, chunk_bytes // (k * B * k_reader * X.element_size()))
    for start in range(0, A, step):
        chunk = X[start : start + step]  # (a, k, d)
        products = chunk.reshape(-1, d) @ Y_flat  # (a·k, B·k)
        squares[start : start + step] = products.view(len(chunk), k, B, k_reader).square().sum(dim=(1, 3))
    norms = X.square().sum(dim=(1, 2))[:, None] * Y.square().sum(dim=(1, 2))[None, :]  # (A, B)
    return torch.where(norms > 0, (squares / norms.clamp_min(torch.finfo(X.dtype).tiny)).sqrt(), 0.0)


def composition_scores(
    W_Q: torch.Tensor,
    W_K: torch.Tensor,
    W_V: torch.Tensor,
    W_O: torch.Tensor,
    readers: Sequence[tuple[int, int]] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Composition:
    """Q-, K- and V-composition of every pair of heads A → B with layer_A < layer_B (see the module docstring):
    W_Q, W_K, W_V (L, H, d, k) and W_O (L, H, k, d), computed in their dtype on their device. `readers` (layer, head)
    restricts the heads B scored (every earlier head A still is): the cost is proportional to their number."""
    import torch

    L, H, d, k = W_Q.shape
    wanted = {layer: list(range(H)) for layer in range(L)}
    if readers is not None:
        wanted = {}
        for layer, head in sorted(set(readers)):
            wanted.setdefault(layer, []).append(head)
    X = writer_factors(W_V[:-1], W_O[:-1]).reshape((L - 1) * H, k, d)  # (L·H, k, d): the last layer writes to none
    scores = {kind: np.full((L, H, L, H), np.nan) for kind in KINDS}
    with torch.no_grad():
        for layer, heads in wanted.items():
            if layer == 0:
                continue
            readers_ = reader_factors(W_Q[layer, heads], W_K[layer, heads], W_V[layer, heads], W_O[layer, heads])
            together = pair_scores(X[: layer * H], torch.cat(readers_), chunk_bytes)  # (layer·H, 3·heads)
            values = together.double().cpu().numpy().reshape(layer, H, 3, len(heads))
            for index, kind in enumerate(KINDS):
                scores[kind][:layer, :, layer, heads] = values[:, :, index, :]
    return Composition(**scores)


def random_baseline(d_model: int, d_head: int, samples: int = 16, seed: int = 0) -> dict[str, Any]:
    """Composition scores of random heads of the same shapes: `samples` writers A and `samples` readers B with
    independent standard normal W_Q, W_K, W_V, W_O (seeded), every pair scored: mean and standard deviation per kind.

    Expected value: for independent isotropic Gaussian weights, the row space of X_A and the column space of Y_B are
    uniformly random k-dimensional subspaces, independent of the singular values. With X = a Pᵀ, Y = P' b (P, P'
    random orthonormal d × k) and C = Pᵀ P', E[C_ij C_lm] = δ_il δ_jm / d, so E‖a C b‖_F² = ‖a‖_F² ‖b‖_F² / d:
    E[score²] = 1/d exactly, for Q, K and V alike and any d_head. The score itself averages a little below
    `expected_rms` = 1/√d (Jensen), with a spread that shrinks as d_head grows."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    writers = writer_factors(normal(samples, d_model, d_head), normal(samples, d_head, d_model))  # (S, k, d)
    W_Q, W_K, W_V = (normal(samples, d_model, d_head) for _ in range(3))
    readers = reader_factors(W_Q, W_K, W_V, normal(samples, d_head, d_model))
    result: dict[str, Any] = {}
    for kind, Y in zip(KINDS, readers, strict=True):
        values = pair_scores(writers, Y).numpy().ravel()
        result[kind] = {"mean": float(values.mean()), "std": float(values.std())}
    return {**result, "expected_rms": 1.0 / math.sqrt(d_model), "samples": samples, "seed": seed}


def copying_scores(W_E: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor, W_U: torch.Tensor) -> np.ndarray:
    """Σ Re λ / Σ |λ| over the eigenvalues λ of each head's W_E W_V W_O W_U (see the module docstring): W_E (V, d),
    W_V (L, H, d, k), W_O (L, H, k, d), W_U (d, V) -> (L, H) float64; 0 for a head whose circuit is 0."""
    import torch

    with torch.no_grad():
        M = W_U @ W_E  # (d, d): the only product over the vocabulary
        small = _finite(W_O @ M @ W_V)  # (L, H, k, k): same nonzero eigenvalues as W_E W_V W_O W_U
        eigenvalues = torch.linalg.eigvals(small.double().cpu())  # (L, H, k) complex
        total = eigenvalues.abs().sum(-1)
        copying = torch.where(total > 0, eigenvalues.real.sum(-1) / total.clamp_min(1e-300), 0.0)
    return copying.numpy()
