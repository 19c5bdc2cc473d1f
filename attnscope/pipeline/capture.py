"""Run the model and hand each layer's attention, a block of query rows at a time, to a reducer.

Attention weights are computed inside a registered attention function (`transformers.AttentionInterface`),
`reducing_attention`, on the device the model runs on. The reducer (`pipeline.blocks.Reducer`) turns each block into
statistics right there, so no more than one block of one layer's attention exists at any moment; full maps are kept
(on the host) only for the layers a picture needs, and only for one window.

The capture is the loop; the layer's arithmetic is one of two kernels, peers with one interface: the block path
(`pipeline.block_path`, PyTorch, which every reducer can use) and the fused Triton kernel (`pipeline.fused_path`,
which computes the output and the per-row summaries in one pass over the keys). Which one is the one decision of
`pipeline.kernels` (`--kernel`); a layer the fused kernel does not cover (full maps wanted, a mask it cannot
derive) goes through the block path, and the run's notes say why.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from attnscope.errors import AttnscopeError
from attnscope.pipeline import block_path, fused_path, kernels
from attnscope.pipeline.blocks import CaptureState, LayerCall, Reducer
from attnscope.pipeline.tokens import Batch

IMPLEMENTATION = "attnscope"


def reducing_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention with the kernel decided for the layer's device; the reducer gets the blocks (block path) and the
    layer's per-row summaries (both paths) before they are freed.

    transformers' signature for every attention implementation: query (B, H, n, d_head) after the family's rotary
    embedding and norms; key/value (B, H_kv, n_k, d_head), the key/value heads only (grouped-query attention: query
    head h reads key/value head h // (H / H_kv)); attention_mask (B, 1, n, n_k) with this layer's causal triangle,
    sliding window and padding, or None. The family's specifics come as keyword arguments (`scaling`, `softcap`,
    `s_aux`: learned sink logits, `sliding_window`: see blocks.LayerCall). Returns (output (B, n, H, d_head), None),
    as transformers expects; the output equals eager attention's.
    """
    state: CaptureState | None = kwargs.get("attnscope_state")
    if state is None:  # the model was called outside a capture: behave exactly like eager attention
        return _eager_fallback(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    call = LayerCall.of(module, query, key, attention_mask, scaling, kwargs)
    state.layers_seen.append(call.layer)
    if state.kernel_on(query.device) == "fused":
        output = fused_path.attention(state, call, query, key, value, attention_mask)
        if output is not None:
            return output, None
    return block_path.attention(state, call, query, key, value, attention_mask), None


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
    for window `keep_window` (an index into the windows the batches were made from). `kernel` (kernels.KERNELS) chooses
    what computes attention: see pipeline.kernels; the notes of the result say where the fused kernel was left."""
    kernels.check_setting(kernel)
    _register()
    n_layer = model.config.num_hidden_layers
    switch_back = _switch_attention(model, IMPLEMENTATION)
    keep = frozenset(keep_layers)
    maps: dict[int, torch.Tensor] = {}
    run_geometry: dict[tuple, tuple] = {}  # the blocks' geometry that no window changes: for every batch
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
                    kernel=kernel,
                    run_geometry=run_geometry,
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


@contextlib.contextmanager
def capturing(model: Any) -> Iterator[None]:
    """`model` computing attention with the capture for the length of the block, as `run` sets it up (registered,
    switched, denormals flushed, no gradients), for callers that drive the model's blocks themselves: the circuit's
    replays (`analyses.circuit`) run one batch, then some of its layers again, each with its own `CaptureState`."""
    _register()
    switch_back = _switch_attention(model, IMPLEMENTATION)
    torch.set_flush_denormal(True)
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.set_flush_denormal(False)
        switch_back()


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
