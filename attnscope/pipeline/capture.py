"""Run the model and hand each layer's attention, a block of query rows at a time, to a reducer.

Attention weights are computed inside a registered attention function (`transformers.AttentionInterface`), one
block of query rows at a time, on the device the model runs on. The reducer turns each block into statistics right
there, so no more than one block of one layer's attention exists at any moment; full maps are kept (on the host)
only for the layers a picture needs, and only for one window.

Two kernels compute a layer (`kernel`, see `resolve_kernel`): the block path here, in PyTorch, which every reducer
can use; and the fused Triton kernel of `pipeline.fused`, which computes the output and the per-row summaries
(LayerRows) in one pass over the keys without the logits ever leaving the chip. The dispatcher (`_fused_layer`)
takes the fused kernel for a layer when it was chosen, the reducer wants per-row summaries only, no map of the layer
is kept, and the layer's mask is exactly one the kernel derives from the windows' lengths, causality and a sliding
window; otherwise the block path, with a note saying why.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.pipeline.tokens import Batch

IMPLEMENTATION = "attnscope"
# Float32 logits per window in one block (H, rows, keys): the block is this times the batch size. Small enough to
# stay cache-friendly, large enough that per-operation overhead and tiny matmuls do not dominate. Measured on the
# 2-core CPU (one GPT-2 small layer, 12 heads, time over SDPA's, /tmp script interleaving the settings): at batch
# 8 × 1024 tokens 0.5, 1, 2 and 4 MiB gave 2.39, 1.86, 1.86 and 2.17×; at 1 × 1024 1.82, 1.56, 1.86 and 1.75×; at
# 8 × 512 1.45, 1.22, 1.44 and 1.92×.
BLOCK_BYTES = 1 * 2**20
# On a GPU the block holds up to this share of the free memory (the block path keeps about four times its logits
# alive at once: logits, their exponentials, a copy in the values' dtype, masks), up to GPU_BLOCK_MAX for the whole
# batch, so that a layer is one block or a few (GPT-2 small at 8 × 1024 tokens: 400 MB of logits a layer) and the
# launches of many small blocks (~15 kernels each) do not dominate.
GPU_BLOCK_SHARE = 8
GPU_BLOCK_MAX = 4 * 2**30
KERNELS = options.KERNELS
MASKED = -1e30  # a masked logit: finite, so 0 · logit stays 0 (no NaN)
# Shifted logits are clamped here before exp: torch's exp takes a slow path for results that underflow (14x slower
# on the CPU this was measured on), which masked keys and peaked heads hit constantly. exp(-87) = 1.6e-38 is the
# smallest normal float32, so a masked key or a negligible one weighs at most 1.6e-38 / Z instead of 0.
LOGIT_FLOOR = -87.0


@dataclass
class AttentionBlock:
    """Attention of query rows `positions` of one layer, as the capture computed it (all float32).

    exp_logits: (B, H, b, k) exp(s) with s the scaled logits shifted so that each row's maximum is 0; k = keys up
             to the block's last row in a causal layer (later keys are masked), all keys in an encoder's;
    normalizer: (B, H, b) Σ_j exp(s), so A = exp_logits / normalizer.
    lengths: (B,) real tokens per window;  n_keys: all keys of the layer (the padded window length).
    """

    exp_logits: torch.Tensor
    normalizer: torch.Tensor
    positions: torch.Tensor
    lengths: torch.Tensor
    n_keys: int

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
        weights; expected_logit: (B, H, n) Σ_j A_ij s_ij over the keys;
    gathered: (B, H, n, m) s_ij at the keys the reducer's `keys_to_gather` named for each row (of each window);
    visible: (B, n) the keys each row sees (real tokens the model's mask allows: the causal triangle, a sliding
        window, padding); gathered_visible: (B, n, m) whether each gathered key is one of them;
    peak: (B, H, n) max_j s_ij (0 unless a sink outweighs every key), mass: (B, H, n) Σ_j A_ij (1 unless the
        family has a sink); None when the family has no sink.
    """

    normalizer: torch.Tensor
    expected_logit: torch.Tensor
    gathered: torch.Tensor | None
    lengths: torch.Tensor
    visible: torch.Tensor
    gathered_visible: torch.Tensor | None
    peak: torch.Tensor | None = None
    mass: torch.Tensor | None = None

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
        )


class Reducer:
    """What the capture hands attention to. A reducer overrides one or both methods; `wants_blocks` says whether
    `add_block` must be called (the capture then keeps no more than one block alive at a time either way)."""

    wants_blocks = False

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
    """What the attention function needs to know about the batch being run; passed through the model's kwargs."""

    reducer: Reducer | None
    lengths: torch.Tensor  # (B,) real tokens per window
    keep_layers: frozenset[int] = frozenset()
    keep_row: int | None = None  # which window of the batch to keep full maps of
    kept: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    layers_seen: list[int] = field(default_factory=list)
    # blocks' geometry that no window changes, shared by every batch of a run: (start, stop, device, triangle) ->
    # positions (b,), causal bias (b, b) or None, gathered keys (b, m) or None, whether a triangle row sees them
    run_geometry: dict[tuple, tuple] = field(default_factory=dict)
    kernel: str = "auto"  # which kernel computes a layer (KERNELS; see resolve_kernel)
    # also shared by every batch of a run: the kernel each device runs, and why layers left the fused kernel (the
    # run's notes: reason -> layers)
    run_kernels: dict[torch.device, str] = field(default_factory=dict)
    run_notes: dict[str, set[int]] = field(default_factory=dict)
    # computed by the batch's first layer, reused by the others: lengths per device, geometry per block, the block
    # path's budget per device, the fused kernel's gathered keys per device and visible keys per mask
    _lengths: dict[torch.device, torch.Tensor] = field(default_factory=dict)
    _geometry: dict[tuple, BlockGeometry] = field(default_factory=dict)
    _block_bytes: dict[torch.device, int] = field(default_factory=dict)
    _wanted: dict[torch.device, torch.Tensor | None] = field(default_factory=dict)
    _masks: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    _visible: dict[tuple, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)

    def lengths_on(self, device: torch.device) -> torch.Tensor:
        """(B,) the windows' real tokens on `device`."""
        if device not in self._lengths:
            self._lengths[device] = self.lengths.to(device)
        return self._lengths[device]

    def block_bytes(self, device: torch.device) -> int:
        """Float32 logits per window in one block of the block path on `device` (see block_bytes)."""
        if device not in self._block_bytes:
            self._block_bytes[device] = block_bytes(device, int(self.lengths.shape[0]))
        return self._block_bytes[device]

    def kernel_on(self, device: torch.device) -> str:
        """'fused' or 'blocks': the kernel this run's layers on `device` take (once per run and device)."""
        if device not in self.run_kernels:
            self.run_kernels[device] = resolve_kernel(self.kernel, device)
        return self.run_kernels[device]

    def note(self, reason: str, layer: int | None = None) -> None:
        """A layer (or, with None, the run) left the fused kernel for `reason`: said once in the run's notes."""
        layers = self.run_notes.setdefault(reason, set())
        if layer is not None:
            layers.add(layer)

    def geometry(self, start: int, stop: int, device: torch.device, triangle: bool, gather_keys) -> BlockGeometry:
        """Block `start:stop`'s geometry on `device` (`triangle`: a causal layer masked by the plain causal
        triangle); `gather_keys` is the reducer's `keys_to_gather`, or None."""
        cache_key = (start, stop, device, triangle)
        geometry = self._geometry.get(cache_key)
        if geometry is not None:
            return geometry
        lengths = self.lengths_on(device)  # (B,)
        B, b = lengths.shape[0], stop - start
        fixed = self.run_geometry.get(cache_key)
        if fixed is None:
            positions = torch.arange(start, stop, device=device)  # (b,)
            bias = _causal_bias(b, device) if triangle else None  # (b, b)
            wanted = None if gather_keys is None else gather_keys(positions, lengths)  # (b, m), (B, b, m) or None
            if wanted is not None and wanted.dim() == 3:  # the keys depend on the windows: not for other batches
                fixed = (positions, bias, None, None)
            else:
                in_sight = None if wanted is None or not triangle else wanted <= positions[:, None]  # (b, m)
                fixed = self.run_geometry[cache_key] = (positions, bias, wanted, in_sight)
        else:
            wanted = fixed[2]
        positions, bias, _, in_sight = fixed
        geometry = BlockGeometry(positions, bias)
        if triangle:
            geometry.visible = (positions + 1).expand(B, b)  # (B, b): keys 0..i
        if wanted is not None:
            m = wanted.shape[-1]
            geometry.gather_index = wanted.view(-1, b, m).expand(B, b, m)  # (B, b, m)
            if triangle:  # keys up to the row's own
                if in_sight is None:
                    in_sight = geometry.gather_index <= positions[None, :, None]  # (B, b, m)
                geometry.gathered_visible = in_sight.expand(B, b, m)
        self._geometry[cache_key] = geometry
        return geometry


def _causal_bias(size: int, device: torch.device) -> torch.Tensor:
    """(size, size) float32, MASKED above the diagonal (keys after the query), 0 elsewhere: added, not filled in,
    because a broadcast add runs twice as fast as a broadcast masked fill on the CPU."""
    return torch.full((size, size), MASKED, device=device).triu(diagonal=1)


def _block_rows(start: int, n: int, per_entry: int, budget: int, causal: bool) -> int:
    """Rows for the block starting at `start` so that rows × keys × per_entry ≈ budget, where keys grow with the
    block when causal (rows · (start + rows) = budget / per_entry, solved for rows)."""
    entries = max(1, budget // per_entry)
    if not causal:
        return max(1, entries // n)
    return max(1, int((-start + math.sqrt(start * start + 4 * entries)) / 2))


def block_bytes(device: torch.device, windows: int) -> int:
    """Float32 logits per window in one block of the block path: BLOCK_BYTES on the CPU (sized for its caches, and
    measured there); on a GPU, sized from its memory: a GPU_BLOCK_SHARE share of what is free (torch's cached but
    unused memory included), at most GPU_BLOCK_MAX for the batch, at least BLOCK_BYTES."""
    if device.type != "cuda":
        return BLOCK_BYTES
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return max(BLOCK_BYTES, min(free // GPU_BLOCK_SHARE, GPU_BLOCK_MAX) // max(1, windows))


# ------------------------------------------------------------------------------------------- the fused kernel
# Notes: why the run's layers left the fused kernel (reasons said only when the fused kernel was asked for by name
# are marked so), and the interpreter's slowness.
INTERPRETER_NOTE = (
    "the fused kernel ran under Triton's interpreter (on the CPU, or with TRITON_INTERPRET=1): exact but very slow, "
    "meant for testing; the block path (kernel blocks, the default there) is the fast one"
)
BLOCKS_WANTED = (
    "full attention weights (maps, diversity, one query's row, the induction probe) come from the block path: the "
    "fused kernel gives per-row summaries only"
)


def _import_fused(device: torch.device) -> tuple[Any, str | None]:
    """(pipeline.fused, None), or (None, why the fused kernel cannot run on `device` in this process).

    On the CPU the kernel runs under Triton's interpreter, which Triton reads from TRITON_INTERPRET when it is
    imported (triton.language decorates its own functions, tl.sum and the like, as compiled or interpreted then):
    it is set here when Triton is not imported yet, and a process that imported Triton without it cannot run the
    kernel on the CPU."""
    if device.type not in ("cpu", "cuda"):
        return None, f"it runs on CUDA GPUs (and on the CPU under Triton's interpreter), not on {device.type}"
    if device.type == "cpu" and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        from attnscope.pipeline import fused
    except Exception as error:  # ImportError, or a broken install failing in its own way
        return None, f"Triton cannot be imported ({error}); install it with: pip install 'attnscope[gpu]'"
    if device.type == "cpu" and not fused.interpreted():
        return None, (
            "on the CPU it runs under Triton's interpreter, which must be switched on before Triton is imported, and "
            "this process imported it without (transformers does, at its own import): set TRITON_INTERPRET=1 before "
            "importing transformers"
        )
    return fused, None


def resolve_kernel(kernel: str, device: torch.device) -> str:
    """The kernel that computes attention on `device`, 'fused' or 'blocks', for the setting `kernel`: 'blocks'; 'fused'
    (an error where it cannot run: no Triton, a device it does not run on); 'auto': fused on a CUDA device when
    Triton imports, blocks otherwise."""
    if kernel not in KERNELS:
        raise AttnscopeError(f"kernel '{kernel}': use one of {', '.join(KERNELS)}")
    if kernel == "blocks" or (kernel == "auto" and device.type != "cuda"):
        return "blocks"
    _, why = _import_fused(device)
    if why is None:
        return "fused"
    if kernel == "auto":
        return "blocks"
    raise AttnscopeError(f"kernel fused: {why}")


def _mask_rule(attention_mask, lengths: torch.Tensor, causal: bool, window: int | None, n: int, n_keys: int):
    """(limits (B,) int32, left, right) such that row i of window b sees key j exactly when j < limits[b], j > i - left
    and j < i + right, for every real row, as `attention_mask` (B or 1, 1, n, n_k) has it; None when no such rule
    is the mask (a pattern the fused kernel does not derive). transformers gives no mask where the layer's own
    pattern needs none: every key then, or the causal triangle."""
    from attnscope.pipeline.fused import UNBOUNDED

    if attention_mask is None:
        return torch.full_like(lengths, n_keys, dtype=torch.int32), UNBOUNDED, 1 if causal else UNBOUNDED
    if attention_mask.dim() != 4 or attention_mask.shape[1] != 1 or tuple(attention_mask.shape[-2:]) != (n, n_keys):
        return None
    allowed = ~_is_masked(attention_mask[:, 0])  # (B or 1, n, n_k)
    rows = torch.arange(n, device=lengths.device)[:, None]  # (n, 1)
    keys = torch.arange(n_keys, device=lengths.device)[None, :]  # (1, n_k)
    real = (rows[None, :, 0] < lengths[:, None])[:, :, None]  # (B, n, 1)
    # a window's layer may also be handed the window without sliding: try the window, then none
    for size in dict.fromkeys([window, None]):
        left = UNBOUNDED if size is None else size
        right = 1 if causal else left
        rule = (keys[None] < lengths[:, None, None]) & (keys > rows - left) & (keys < rows + right)  # (B, n, n_k)
        if not bool(((rule != allowed) & real).any()):
            return lengths.int(), left, right  # int32, as the kernel reads them
    return None


def _fused_layer(state: CaptureState, layer: int, query, key, value, attention_mask, causal: bool, **kwargs):
    """The layer's output (B, n, H, d_head) from the fused kernel, its per-row summaries handed to the reducer; None
    when the block path must compute it (the reason noted)."""
    reducer = state.reducer
    explicit = state.kernel == "fused"
    if (reducer is not None and reducer.wants_blocks) or (layer in state.keep_layers and state.keep_row is not None):
        if explicit:
            state.note(BLOCKS_WANTED)
        return None
    B, H, n, d_head = query.shape
    n_keys = key.shape[-2]
    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        state.note(f"{str(query.dtype).removeprefix('torch.')} attention is not covered by the fused kernel", layer)
        return None
    if d_head > 256 or n != n_keys:
        state.note("heads wider than 256 or queries and keys of different lengths are not covered", layer)
        return None
    if max(tensor.stride(0) for tensor in (query, key, value)) >= 2**31 or n * H * d_head >= 2**31:
        state.note("a window too long for the kernel's 32-bit offsets within a window", layer)  # ~170k tokens
        return None
    device = query.device
    lengths = state.lengths_on(device)  # (B,)
    window = kwargs.get("sliding_window")
    cache_key = id(attention_mask)
    if cache_key not in state._masks:  # one check per mask: the layers of one type share theirs
        rule = _mask_rule(attention_mask, lengths, causal, window, n, n_keys)
        state._masks[cache_key] = (attention_mask, rule)  # the mask kept alive, so that its id is not reused
    rule = state._masks[cache_key][1]
    if rule is None:
        state.note("an attention mask the fused kernel cannot derive from lengths, causality and a window", layer)
        return None
    limits, left, right = rule
    if device not in state._wanted:
        positions = torch.arange(n, device=device)  # (n,)
        wanted = reducer.keys_to_gather(positions, lengths) if reducer is not None else None
        state._wanted[device] = wanted.int() if wanted is not None else None  # int32, as the kernel reads them
    wanted = state._wanted[device]  # (n, m), (B, n, m) or None
    fused, _ = _import_fused(device)
    if fused.interpreted():
        state.note(INTERPRETER_NOTE)
    sinks = kwargs.get("s_aux")
    rows = fused.fused_attention(
        query, key, value, kwargs["scaling"], limits, left, right, wanted, kwargs.get("softcap"), sinks
    )
    if reducer is not None:
        visible, gathered_visible = _fused_visibility(state, device, lengths, rule, wanted, n)
        reducer.add_layer(
            layer,
            LayerRows(
                normalizer=rows.normalizer,
                expected_logit=rows.expected_logit,
                gathered=rows.gathered,
                lengths=lengths,
                visible=visible,
                gathered_visible=gathered_visible,
                peak=rows.peak,
                mass=rows.mass,
            ),
        )
    return rows.output


def _fused_visibility(state: CaptureState, device, lengths, rule, wanted, n: int):
    """(visible (B, n), gathered_visible (B, n, m) or None) under the rule of `_mask_rule`: how many keys each row
    sees, and whether it sees each gathered key (a real token: the block path's test too)."""
    limits, left, right = rule
    cache_key = (device, id(limits), left, right)
    if cache_key not in state._visible:
        rows = torch.arange(n, device=device)  # (n,)
        high = torch.minimum(limits[:, None], rows[None, :] + right)  # (B, n) one past the last key seen
        low = (rows - left + 1).clamp(min=0)  # (n,)
        visible = (high - low[None, :]).clamp(min=0)  # (B, n)
        gathered_visible = None
        if wanted is not None:
            keys = wanted.view(-1, n, wanted.shape[-1])  # (B or 1, n, m)
            gathered_visible = (
                (keys < limits[:, None, None])
                & (keys > (rows - left)[None, :, None])
                & (keys < (rows + right)[None, :, None])
                & (keys < lengths[:, None, None])
            )  # (B, n, m)
        state._visible[cache_key] = (visible, gathered_visible)
    return state._visible[cache_key]


def _eager_fallback(module, query, key, value, attention_mask, **kwargs):
    """The family's own eager attention (every modeling module of transformers defines one), given the additive mask
    it expects: the mask function registered with the capture gives a boolean one, or none at all for a causal layer
    without padding."""
    import importlib

    if attention_mask is None and getattr(module, "is_causal", False):
        n, n_keys = query.shape[-2], key.shape[-2]
        attention_mask = torch.ones(n, n_keys, dtype=torch.bool, device=query.device).tril(n_keys - n)  # (n, n_k)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        lowest = torch.finfo(query.dtype).min
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
            ~attention_mask, lowest
        )  # (B, 1, n, n_k) or (n, n_k)
    eager = importlib.import_module(type(module).__module__).eager_attention_forward
    return eager(module, query, key, value, attention_mask, **kwargs)


def _is_masked(mask: torch.Tensor) -> torch.Tensor:
    """Where a mask of transformers forbids a key: False in a boolean one, the dtype's minimum in an additive one."""
    if mask.dtype == torch.bool:
        return ~mask
    return mask < torch.finfo(mask.dtype).min / 2


def _joined(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The blocks' pieces of one layer side by side along `dim` (no copy when one block held every row)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def reducing_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention computed one block of query rows at a time; blocks go to the reducer before they are freed.

    query: (B, H, n, d_head) after the family's rotary embedding and norms; key/value: (B, H_kv, n_k, d_head),
    the key/value heads only (grouped-query attention: query head h reads key/value head h // (H / H_kv), as
    transformers' repeat_kv does, without copying them); attention_mask: (B, 1, n, n_k) additive (0 or the
    dtype's minimum) with the causal triangle, sliding window and padding of this layer, or None. The family's
    specifics come as keyword arguments: `scaling`, `softcap` (logits ← softcap · tanh(logits / softcap), before
    the mask), `s_aux` (learned sink logits, one per head: a softmax over the keys and the sink, whose share is
    then dropped), `sliding_window`.

    Returns (output (B, n, H, d_head), None), as transformers expects. The output equals eager attention's; softmax
    runs in float32 whatever the model's dtype, and the output is (exp(s - max) V) / Z, which spares a pass
    normalising the block. A causal layer without a sliding window, on right-padded windows, masks with a small
    triangle per block instead of adding the model's whole mask (the same keys, half the passes).

    On a small model every tensor operation here costs more in Python and dispatch than in arithmetic, so a layer
    does as few as it can: what depends only on the batch's geometry (positions, the causal triangle, the keys the
    reducer gathers and whether rows see them) is computed by the first layer and reused by the others
    (`CaptureState.geometry`), and one block's pieces are used as they are rather than copied into whole-layer
    buffers.
    """
    state: CaptureState | None = kwargs.get("attnscope_state")
    if state is None:  # the model was called outside a capture: behave exactly like eager attention
        return _eager_fallback(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    layer = module.layer_idx
    state.layers_seen.append(layer)
    device = query.device
    lengths = state.lengths_on(device)  # (B,) on this layer's device (a device map spreads the layers)
    reducer = state.reducer
    B, H, n, d_head = query.shape
    H_kv, n_keys = key.shape[1], key.shape[-2]
    G = H // H_kv  # query heads per key/value head
    causal = getattr(module, "is_causal", False) and n == n_keys
    # the layer's mask is the causal triangle: no sliding window, or none that reaches back past the first token (the
    # mask function then gives no mask at all: see _register)
    triangle = causal and (kwargs.get("sliding_window") is None or attention_mask is None)
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    sink_logits = None if sinks is None else sinks.float().view(1, H, 1)  # (1, H, 1)
    scaling = d_head**-0.5 if scaling is None else scaling
    if state.kernel_on(device) == "fused":
        output = _fused_layer(
            state, layer, query, key, value, attention_mask, causal,
            scaling=scaling, softcap=softcap, s_aux=sinks, sliding_window=kwargs.get("sliding_window"),
        )  # fmt: skip
        if output is not None:
            return output, None
    gather_keys = reducer.keys_to_gather if reducer is not None else None
    budget = state.block_bytes(device)  # float32 logits per window in one block
    # GPT-2's key and value are strided views into one (B, n, 3d) tensor; a matmul given such a view copies the whole
    # of it first, so every block of rows would copy all keys and values again. One copy per layer instead (none
    # asked for when one block holds every row: its matmuls copy them once anyway).
    if _block_rows(0, n_keys, H * 4, budget, causal) < n:
        key, value = key.contiguous(), value.contiguous()  # (B, H_kv, n_k, d_head)
    query = query.reshape(B, H_kv, G, n, d_head)  # query heads grouped by the key/value head they read (a view)
    keys_t = key.transpose(-1, -2)  # (B, H_kv, d_head, n_k), a transposed view a matmul reads as it is
    keep = layer in state.keep_layers and state.keep_row is not None
    blocks_wanted = reducer is not None and reducer.wants_blocks
    # each block's pieces of the layer's outputs and per-row summaries, joined along the rows at the end
    outputs, normalizers, expected_logits, visibles = [], [], [], []
    gathereds, gathered_visibles, peaks, masses = [], [], [], []
    start = 0
    while start < n:
        stop = min(n, start + _block_rows(start, n_keys, H * 4, budget, causal))
        b = stop - start
        keys = stop if causal else n_keys  # a causal row never sees a key after itself
        # the G query heads of a key/value head are stacked as G·b rows of one matmul over their shared keys: a
        # broadcast over G instead would copy the keys once per query head and block
        block_queries = (query[:, :, :, start:stop] * scaling).reshape(B, H_kv, G * b, d_head)  # (B, H_kv, G·b, d_head)
        logits = torch.matmul(block_queries, keys_t[..., :keys]).float().view(B, H, b, keys)  # (B, H, b, k)
        if softcap is not None:
            logits = torch.tanh(logits / softcap).mul_(softcap)
        geometry = state.geometry(start, stop, device, triangle, gather_keys)
        positions = geometry.positions  # (b,)
        if triangle:
            # Batches are right-padded, so a real row's keys 0..i are all real: the causal triangle of the block's
            # last b keys is the whole mask (padded rows see padded keys, and are never scored). One small
            # in-place add instead of a pass over the block adding the model's mask.
            logits[..., start:stop].add_(geometry.causal_bias)  # (b, b) broadcast
            masked = None
            visibles.append(geometry.visible)  # (B, b)
        elif attention_mask is not None:
            block_mask = attention_mask[:, :, start:stop, :keys]  # (B, 1, b, k)
            masked = _is_masked(block_mask)  # (B, 1, b, k)
            if block_mask.dtype == torch.bool:
                logits.masked_fill_(masked, MASKED)  # broadcast over heads
            else:
                logits.add_(block_mask)
            visibles.append(keys - masked[:, 0].sum(-1))  # (B, b)
        else:  # an encoder's full, unpadded batch
            masked = None
            visibles.append(torch.full((B, b), keys, device=device))  # (B, b)
        row_max = logits.amax(dim=-1)  # (B, H, b)
        shift = row_max if sinks is None else torch.maximum(row_max, sink_logits)  # a sink may outweigh every key
        logits.sub_(shift[..., None]).clamp_(min=LOGIT_FLOOR)  # each row's maximum is now 0 (or below the sink's)
        exp_logits = torch.exp(logits)  # (B, H, b, k)
        block_z = exp_logits.sum(dim=-1)  # (B, H, b)
        if sinks is not None:
            sink_weight = torch.exp((sink_logits - shift).clamp(min=LOGIT_FLOOR))  # (B, H, b)
            block_z = block_z + sink_weight
            peaks.append(row_max - shift)
            masses.append(1.0 - sink_weight / block_z)
        grouped = exp_logits.to(value.dtype).view(B, H_kv, G * b, keys)  # (B, H_kv, G·b, k)
        values = torch.matmul(grouped, value[:, :, :keys]).view(B, H, b, d_head)  # (B, H, b, d_head)
        outputs.append(values / block_z[..., None].to(value.dtype))
        normalizers.append(block_z)
        if geometry.gather_index is not None:
            index = geometry.gather_index  # (B, b, m)
            m = index.shape[-1]
            gathereds.append(logits.gather(-1, index[:, None].expand(B, H, b, m)))  # (B, H, b, m)
            if geometry.gathered_visible is not None:  # the triangle's: the same in every layer
                gathered_visibles.append(geometry.gathered_visible)
            else:  # this layer's mask says which gathered keys its rows see
                if masked is None:
                    in_sight = index <= (positions[None, :, None] if causal else keys - 1)  # (B, b, m)
                else:
                    in_sight = ~masked[:, 0].gather(-1, index)  # (B, b, m)
                gathered_visibles.append(in_sight & (index < lengths[:, None, None]))
        if blocks_wanted or keep:
            block = AttentionBlock(exp_logits, block_z, positions, lengths, n_keys)
            if blocks_wanted:
                reducer.add_block(layer, block)
            if keep:
                kept = torch.zeros(H, b, n_keys)  # (H, b, n_k) on the host
                kept[..., :keys] = block.probs[state.keep_row].cpu()
                state.kept.setdefault(layer, []).append(kept)
        # Σ_j exp(s_ij) s_ij, multiplying in place: the logits are not needed after this
        expected_logits.append(logits.mul_(exp_logits).sum(dim=-1) / block_z)
        start = stop
    if reducer is not None:
        rows = LayerRows(
            normalizer=_joined(normalizers, -1),  # (B, H, n)
            expected_logit=_joined(expected_logits, -1),  # (B, H, n)
            gathered=_joined(gathereds, -2) if gathereds else None,  # (B, H, n, m)
            lengths=lengths,
            visible=_joined(visibles, -1),  # (B, n)
            gathered_visible=_joined(gathered_visibles, -2) if gathered_visibles else None,  # (B, n, m)
            peak=_joined(peaks, -1) if peaks else None,
            mass=_joined(masses, -1) if masses else None,
        )
        reducer.add_layer(layer, rows)
    return _joined(outputs, -2).transpose(1, 2), None  # (B, n, H, d_head)


@functools.cache
def _register() -> None:
    """Register the capture with transformers, once per process."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, reducing_attention)
    # Without a mask function for our name, transformers silently drops the padding mask. SDPA's, not eager's: it
    # gives a boolean mask, and none at all where the layer's own pattern needs none (a causal or full layer without
    # padding, a sliding window longer than the windows), which the capture then applies itself; eager's builds an
    # additive (B, 1, n, n) mask on every forward pass (~0.02 ms of the demo model's ~0.75 ms at 32 tokens).
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


# model -> the configs its modules read their attention implementation from, noted at the model's first switch
_SWITCHED_CONFIGS: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def _switch_attention(model: Any, name: str) -> Callable[[], None]:
    """Make `model` compute attention with implementation `name`; returns what switches it back.

    A model's first switch goes through transformers' `set_attn_implementation`, which checks that the model can
    take `name`; the configs it pointed at `name` are noted, and later switches set their implementation and do
    nothing else. `set_attn_implementation` walks every module and checks the name each time: on the demo model the
    two switches of a run took ~0.08 ms, a tenth of its forward pass at 32 tokens.
    """
    configs = _SWITCHED_CONFIGS.get(model)
    if configs is None:
        previous = model.config._attn_implementation
        model.set_attn_implementation(name)
        noted = {}  # id -> config: several modules share one
        for module in model.modules():
            config = getattr(module, "config", None)
            if getattr(config, "_attn_implementation", None) == name:
                noted[id(config)] = config
        configs = list(noted.values())
        if all(hasattr(config, "_attn_implementation_internal") for config in configs):
            _SWITCHED_CONFIGS[model] = configs
        return lambda: model.set_attn_implementation(previous)
    before = [config._attn_implementation_internal for config in configs]
    for config in configs:
        config._attn_implementation_internal = name

    def switch_back() -> None:
        for config, implementation in zip(configs, before, strict=True):
            config._attn_implementation_internal = implementation

    return switch_back


@dataclass
class Captured:
    """Full maps kept for pictures: layer -> (H, n, n) float32 on the host, for window `window_index`; notes on the
    kernels that computed the layers (why some left the fused kernel)."""

    window_index: int | None
    maps: dict[int, torch.Tensor]
    notes: list[str] = field(default_factory=list)


def run(
    model: Any,
    batches: Iterable[Batch],
    reducer: Reducer | None,
    keep_layers: Iterable[int] = (),
    keep_window: int | None = None,
    on_batch: Callable[[Batch], None] | None = None,
    kernel: str = "auto",
) -> Captured:
    """Forward every batch through `model` with attention going to `reducer`; keep the maps of `keep_layers`
    for window `keep_window` (an index into the windows the batches were made from). `kernel` (KERNELS) chooses
    what computes attention: see resolve_kernel; the notes of the result say where the fused kernel was left."""
    if kernel not in KERNELS:
        raise AttnscopeError(f"kernel '{kernel}': use one of {', '.join(KERNELS)}")
    _register()
    n_layer = model.config.num_hidden_layers
    switch_back = _switch_attention(model, IMPLEMENTATION)
    keep = frozenset(keep_layers)
    maps: dict[int, torch.Tensor] = {}
    run_geometry: dict[tuple, tuple] = {}  # the blocks' geometry that no window changes: for every batch
    run_kernels: dict[torch.device, str] = {}  # the kernel of each device
    run_notes: dict[str, set[int]] = {}  # why layers left the fused kernel
    # Flush denormals to zero on the CPU while attention is captured: the clamped logits leave weights of ~1.6e-38
    # (see LOGIT_FLOOR) whose products with the values are denormal, and x86 computes those dozens of times slower
    # (A·V took 2.2 s instead of 0.16 s for one GPT-2 layer at batch 8 × 1024 on one core). Numbers below 1.2e-38
    # become 0, far below anything a statistic resolves. torch has no getter: the flag is switched off afterwards.
    torch.set_flush_denormal(True)
    try:
        with torch.inference_mode():
            for batch in batches:
                keep_row = batch.indices.index(keep_window) if keep_window in batch.indices else None
                state = CaptureState(
                    reducer,
                    batch.lengths,
                    keep if keep_row is not None else frozenset(),
                    keep_row,
                    run_geometry=run_geometry,
                    kernel=kernel,
                    run_kernels=run_kernels,
                    run_notes=run_notes,
                )
                # no key/value cache: nothing is generated, and a cache would keep every layer's keys and values
                model(
                    input_ids=batch.input_ids,
                    attention_mask=batch.attention_mask,
                    use_cache=False,
                    attnscope_state=state,
                )
                if sorted(state.layers_seen) != list(range(n_layer)):
                    missed = sorted(set(range(n_layer)) - set(state.layers_seen))
                    raise AttnscopeError(
                        f"the attention of {'layer' if len(missed) == 1 else 'layers'} "
                        f"{', '.join(map(str, missed))} did not go through transformers' attention interface, "
                        "so attnscope cannot see it; this model cannot be analysed exactly"
                    )
                if keep_row is not None:
                    length = int(batch.lengths[keep_row])
                    for layer, blocks in state.kept.items():
                        maps[layer] = torch.cat(blocks, dim=1)[:, :length, :length]  # (H, n, n)
                if on_batch is not None:
                    on_batch(batch)
        if reducer is not None:
            reducer.end_run()
    finally:
        torch.set_flush_denormal(False)
        switch_back()
    return Captured(keep_window, maps, kernel_notes(run_notes))


def kernel_notes(reasons: dict[str, set[int]]) -> list[str]:
    """The run's notes on its kernels: each reason once, with the layers it concerned."""
    notes = []
    for reason, layers in reasons.items():
        if layers:
            listed = ", ".join(str(layer) for layer in sorted(layers))
            notes.append(f"layer{'s' if len(layers) > 1 else ''} {listed}: {reason}; computed by the block path")
        else:
            notes.append(reason)
    return notes
