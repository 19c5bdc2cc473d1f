"""What the capture hands to reducers, and what it knows while a batch runs: the block data types.

The capture (`pipeline.capture`) computes each layer's attention with one of two kernels, peers with one interface
(`pipeline.block_path`, `pipeline.fused_path`; which one: `pipeline.kernels`), and hands the result to a `Reducer`:
blocks of query rows (`AttentionBlock`, block path only) and per-row summaries of the whole layer (`LayerRows`, both
paths). `LayerCall` is what transformers tells the attention function about the layer, `CaptureState` what the
capture tells it about the batch and the run (and what the paths keep between layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from attnscope.pipeline import kernels

MASKED = -1e30  # a masked logit: finite, so 0 · logit stays 0 (no NaN)
# Shifted logits are clamped here before exp: torch's exp takes a slow path for results that underflow (14x slower
# on the CPU this was measured on), which masked keys and peaked heads hit constantly. exp(-87) = 1.6e-38 is the
# smallest normal float32, so a masked key or a negligible one weighs at most 1.6e-38 / Z instead of 0.
LOGIT_FLOOR = -87.0
# The block path computes logits in base 2 (s · log2 e, the factor folded into the queries' scaling) and weights as
# exp2: A = 2^(s·log2 e − shift) / Z is the same softmax, and torch's exp2 ran 3.3× faster than its exp on the 2-core
# CPU (AVX-512, 9 × 64 × 512 tile: 87 µs against 292 µs), with no slow path for results that underflow. What leaves
# the block path is in nats again (gathered and expected logits, peaks: × ln 2).
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
LOGIT_FLOOR_BASE2 = LOGIT_FLOOR * LOG2E


@dataclass
class AttentionBlock:
    """Attention of query rows `positions` of one layer, as the capture computed it (all float32).

    exp_logits: (B, H, b, k) exp(s) with s the scaled logits shifted so that each row's maximum is 0; k = keys up
             to the block's last row in a causal layer (later keys are masked), all keys in an encoder's;
    normalizer: (B, H, b) Σ_j exp(s), so A = exp_logits / normalizer.
    lengths: (B,) real tokens per window;  n_keys: all keys of the layer (the padded window length);
    sliding_window: the layer's own window as the model gives it (a row i sees keys i - W < j <= i), None without.
    """

    exp_logits: torch.Tensor
    normalizer: torch.Tensor
    positions: torch.Tensor
    lengths: torch.Tensor
    n_keys: int
    sliding_window: int | None = None

    @classmethod
    def from_probs(cls, probs: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor) -> AttentionBlock:
        """A block from given probabilities (B, H, b, k), e.g. hand-built ones."""
        exp_logits = probs.float() / probs.float().amax(dim=-1, keepdim=True)  # row maximum 1 = exp(0)
        return cls(exp_logits, exp_logits.sum(-1), positions, lengths, int(probs.shape[-1]))

    @cached_property
    def probs(self) -> torch.Tensor:
        """(B, H, b, k) attention probabilities."""
        return self.exp_logits / self.normalizer[..., None]


@dataclass
class LayerRows:
    """Per-row summaries of one layer's attention, gathered block by block, that determine every per-head
    statistic without any (n × n) tensor (see Kind.layer_row_scores). With s the scaled logits shifted by each
    row's maximum (over the keys, and the learned sink where the family has one):

    normalizer: (B, H, n) Z_i = Σ_j exp(s_ij) (+ exp(s_sink)), so that A_ij = exp(s_ij) / Z_i are the model's
        weights; expected_logit: (B, H, n) Σ_j A_ij s_ij over the keys (either None for a reducer that does not read
        it: Reducer.reads);
    gathered: (B, H, n, m) s_ij at the keys the reducer's `keys_to_gather` named for each row (of each window);
    visible: (B, n) the keys each row sees (real tokens the model's mask allows: the causal triangle, a sliding
        window, padding); gathered_visible: (B, n, m) whether each gathered key is one of them;
    peak: (B, H, n) max_j s_ij (0 unless a sink outweighs every key), mass: (B, H, n) Σ_j A_ij (1 unless the
        family has a sink); None when the family has no sink;
    summed: (B, H, n) Σ_{S <= j <= i - R} A_ij, each row's attention on the keys the reducer's `summed_keys` (S, R)
        names (None when it names none); sliding_window: the layer's own window (None without, or for a stack).
    """

    normalizer: torch.Tensor | None
    expected_logit: torch.Tensor | None
    gathered: torch.Tensor | None
    lengths: torch.Tensor
    visible: torch.Tensor
    gathered_visible: torch.Tensor | None
    peak: torch.Tensor | None = None
    mass: torch.Tensor | None = None
    summed: torch.Tensor | None = None
    sliding_window: int | None = None

    @classmethod
    def summed_alone(cls, summed: torch.Tensor, lengths: torch.Tensor, sliding_window: int | None) -> LayerRows:
        """Each row's summed keys alone (and the windows' lengths), for a reducer that reads nothing else
        (`Reducer.reads`): the other summaries are None (`pipeline.distant` computes none of them)."""
        nothing: Any = None
        return cls(nothing, nothing, None, lengths, nothing, None, summed=summed, sliding_window=sliding_window)

    @classmethod
    def stack(cls, layers: list[LayerRows]) -> LayerRows:
        """Several layers' summaries (of one batch or of several of the same shape, on one device) as one whose
        windows are the layers' windows one layer after the other (L·B windows, layer-major), so that one pass scores
        them all."""
        if len(layers) == 1:
            return layers[0]

        def joined(name: str) -> torch.Tensor | None:
            parts = [getattr(rows, name) for rows in layers]
            return None if parts[0] is None else torch.cat(parts)  # (L·B, ...)

        return cls(
            normalizer=joined("normalizer"),
            expected_logit=joined("expected_logit"),
            gathered=joined("gathered"),
            lengths=joined("lengths"),
            visible=joined("visible"),
            gathered_visible=joined("gathered_visible"),
            peak=joined("peak"),
            mass=joined("mass"),
            summed=joined("summed"),
        )


class Reducer:
    """What the capture hands attention to. A reducer overrides one or both methods; `wants_blocks` says whether
    `add_block` must be called (the capture then keeps no more than one block alive at a time either way)."""

    wants_blocks = False
    # (S, R): `add_layer` wants each row i's attention on the keys S <= j <= i - R (LayerRows.summed), the keys a
    # streaming KV cache with a sink of S and a recent window of R drops; None: not wanted.
    summed_keys: tuple[int, int] | None = None
    # The per-row summaries (LayerRows' fields) `add_layer` reads: all unless a reducer names fewer, so that the CPU's
    # long rows spare what it does not read (kvplan's reads `summed` alone: pipeline.tiles skip the expected logit,
    # pipeline.distant computes a long layer by torch's fused kernel, LayerRows.summed_alone).
    reads = frozenset({"normalizer", "expected_logit", "gathered", "peak", "mass", "summed"})

    def keys_to_gather(self, positions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor | None:
        """Key indices whose logits `add_layer` wants for rows `positions` of windows of `lengths` (B,): (b, m), the
        same for every window, or (B, b, m) when they differ per window (an encoder's last real token). Each key
        must be one the row sees: <= its row's position in a causal model, < the padded length otherwise."""
        return None

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        """One block of query rows of layer `layer`, probabilities available as `block.probs`."""

    def add_layer(self, layer: int, rows: LayerRows) -> None:
        """The per-row summaries of layer `layer`, once all its blocks are done."""

    def end_run(self) -> None:
        """Every batch of a run has gone through: reduce what was kept back (the capture calls it)."""


def is_masked(mask: torch.Tensor) -> torch.Tensor:
    """Where a mask of transformers forbids a key: False in a boolean one, the dtype's minimum in an additive one."""
    if mask.dtype == torch.bool:
        return ~mask
    return mask < torch.finfo(mask.dtype).min / 2


@dataclass(frozen=True)
class LayerCall:
    """One layer's attention call as transformers makes it, read once for both kernels.

    layer: the module's `layer_idx`; causal: the module is causal and queries and keys are the same positions;
    triangle: its mask is exactly the causal triangle (no sliding window, or none that reaches back past the first
    token: the mask function then gives no mask at all); scaling: of the logits (1/sqrt(d_head) unless the family
    says otherwise); softcap: Gemma 2/3's (logits <- softcap · tanh(logits / softcap)) or None; sinks: gpt-oss's
    learned sink logits (H,) or None; sliding_window: the family's window or None.
    """

    layer: int
    causal: bool
    triangle: bool
    scaling: float
    softcap: float | None
    sinks: torch.Tensor | None
    sliding_window: int | None

    @classmethod
    def of(cls, module: Any, query: torch.Tensor, key: torch.Tensor, attention_mask: Any, scaling: Any, kwargs: dict):
        n, n_keys, d_head = query.shape[-2], key.shape[-2], query.shape[-1]
        causal = getattr(module, "is_causal", False) and n == n_keys
        window = kwargs.get("sliding_window")
        return cls(
            layer=module.layer_idx,
            causal=causal,
            triangle=causal and (window is None or attention_mask is None),
            scaling=d_head**-0.5 if scaling is None else scaling,
            softcap=kwargs.get("softcap"),
            sinks=kwargs.get("s_aux"),
            sliding_window=window,
        )

    def soft_capped(self, logits: torch.Tensor) -> torch.Tensor:
        """Gemma 2/3's soft cap (s <- c · tanh(s / c)), applied before the mask, of logits in base 2 (so is the cap:
        c · log2 e); the logits as they are for other families."""
        if self.softcap is None:
            return logits
        cap = self.softcap * LOG2E
        return torch.tanh(logits / cap).mul_(cap)


@dataclass
class BlockGeometry:
    """What a block of query rows `positions` (b,) needs that no layer changes: the same for every layer of a batch.

    causal_bias: (b, b) the causal triangle of the block's last b keys (triangle layers only); visible: (B, b) the
    keys each row sees in a triangle layer; gather_index: (B, b, m) the keys the reducer gathers (None: none);
    gathered_visible: (B, b, m) whether a triangle layer's rows see them (None: the layer's mask decides). Rows past
    a window's length are padding, never scored: what they see does not matter.
    """

    positions: torch.Tensor
    causal_bias: torch.Tensor | None = None
    visible: torch.Tensor | None = None
    gather_index: torch.Tensor | None = None
    gathered_visible: torch.Tensor | None = None


@dataclass
class CaptureState:
    """What the attention function needs to know about the batch being run; passed through the model's kwargs.

    The run-level fields are shared by every batch of a run (the capture hands the same dicts to each batch's
    state); the batch-level caches are filled by the batch's first layer and read by the others."""

    reducer: Reducer | None
    lengths: torch.Tensor  # (B,) real tokens per window
    keep_layers: frozenset[int] = frozenset()
    keep_row: int | None = None  # which window of the batch to keep full maps of
    kept: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    layers_seen: list[int] = field(default_factory=list)
    kernel: str = "auto"  # the kernel setting (kernels.KERNELS); each device's kernel is kernels.decide's
    # run level: the blocks' geometry that no window changes ((start, stop, device, triangle) -> positions (b,),
    # causal bias (b, b) or None, gathered keys (b, m) or None, whether a triangle row sees them), and why layers
    # left the fused kernel (the run's notes: reason -> layers)
    run_geometry: dict[tuple, tuple] = field(default_factory=dict)
    run_notes: dict[str, set[int]] = field(default_factory=dict)
    # batch level: lengths per device; the block path's geometry per block and budget per device; the fused path's
    # gathered keys per device, mask rule per mask, visible keys per rule
    device_lengths: dict[torch.device, torch.Tensor] = field(default_factory=dict)
    geometries: dict[tuple, BlockGeometry] = field(default_factory=dict)
    block_budgets: dict[torch.device, int] = field(default_factory=dict)
    wanted_keys: dict[torch.device, torch.Tensor | None] = field(default_factory=dict)
    mask_rules: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    visibility: dict[tuple, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)

    def lengths_on(self, device: torch.device) -> torch.Tensor:
        """(B,) the windows' real tokens on `device`."""
        if device not in self.device_lengths:
            self.device_lengths[device] = self.lengths.to(device)
        return self.device_lengths[device]

    def kernel_on(self, device: torch.device) -> str:
        """'fused' or 'blocks': the kernel the layers on `device` take (kernels.decide: decided once)."""
        return kernels.decide(self.kernel, device)

    def keeps(self, layer: int) -> bool:
        """Whether the full maps of `layer` are kept (for pictures) in this batch."""
        return layer in self.keep_layers and self.keep_row is not None

    def note(self, reason: str, layer: int | None = None) -> None:
        """A layer (or, with None, the run) left the fused kernel for `reason`: said once in the run's notes."""
        layers = self.run_notes.setdefault(reason, set())
        if layer is not None:
            layers.add(layer)
