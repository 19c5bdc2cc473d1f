"""The fused path: a layer's attention and its per-row summaries from the fused Triton kernel (`pipeline.fused`), in
one pass over the keys without the logits ever leaving the chip (one of the capture's two kernels; the other is
`block_path`, the choice `kernels`).

`attention` takes the fused kernel for a layer when the reducer wants per-row summaries only, no map of the layer is
kept, and the layer's mask is exactly one the kernel derives from the windows' lengths, causality and a sliding
window (`mask_rule`); otherwise it returns None and the capture runs the block path, with a note saying why.
"""

from __future__ import annotations

import torch

from attnscope.pipeline import kernels
from attnscope.pipeline.blocks import CaptureState, LayerCall, LayerRows, is_masked


def attention(
    state: CaptureState, call: LayerCall, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask
) -> torch.Tensor | None:
    """The layer's output (B, n, H, d_head) from the fused kernel, its per-row summaries handed to the reducer; None
    when the block path must compute it (the reason noted). Shapes as block_path.attention's."""
    reducer = state.reducer
    layer = call.layer
    if (reducer is not None and (reducer.wants_blocks or reducer.summed_keys is not None)) or state.keeps(layer):
        if state.kernel == "fused":  # asked for by name: say why it was not used
            state.note(kernels.BLOCKS_WANTED)
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
    cache_key = id(attention_mask)
    if cache_key not in state.mask_rules:  # one check per mask: the layers of one type share theirs
        rule = mask_rule(attention_mask, lengths, call.causal, call.sliding_window, n, n_keys)
        state.mask_rules[cache_key] = (attention_mask, rule)  # the mask kept alive, so that its id is not reused
    rule = state.mask_rules[cache_key][1]
    if rule is None:
        state.note("an attention mask the fused kernel cannot derive from lengths, causality and a window", layer)
        return None
    limits, left, right = rule
    if device not in state.wanted_keys:
        positions = torch.arange(n, device=device)  # (n,)
        wanted = reducer.keys_to_gather(positions, lengths) if reducer is not None else None
        state.wanted_keys[device] = wanted.int() if wanted is not None else None  # int32, as the kernel reads them
    wanted = state.wanted_keys[device]  # (n, m), (B, n, m) or None
    fused, _ = kernels.import_fused(device)
    if fused.interpreted():
        state.note(kernels.INTERPRETER_NOTE)
    rows = fused.fused_attention(query, key, value, call.scaling, limits, left, right, wanted, call.softcap, call.sinks)
    if reducer is not None:
        visible, gathered_visible = visibility(state, device, lengths, rule, wanted, n)
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


def mask_rule(attention_mask, lengths: torch.Tensor, causal: bool, window: int | None, n: int, n_keys: int):
    """(limits (B,) int32, left, right) such that row i of window b sees key j exactly when j < limits[b], j > i - left
    and j < i + right, for every real row, as `attention_mask` (B or 1, 1, n, n_k) has it; None when no such rule
    is the mask (a pattern the fused kernel does not derive). transformers gives no mask where the layer's own
    pattern needs none: every key then, or the causal triangle."""
    from attnscope.pipeline.fused import UNBOUNDED

    if attention_mask is None:
        return torch.full_like(lengths, n_keys, dtype=torch.int32), UNBOUNDED, 1 if causal else UNBOUNDED
    if attention_mask.dim() != 4 or attention_mask.shape[1] != 1 or tuple(attention_mask.shape[-2:]) != (n, n_keys):
        return None
    allowed = ~is_masked(attention_mask[:, 0])  # (B or 1, n, n_k)
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


def visibility(state: CaptureState, device, lengths, rule, wanted, n: int):
    """(visible (B, n), gathered_visible (B, n, m) or None) under the rule of `mask_rule`: how many keys each row
    sees, and whether it sees each gathered key (a real token: the block path's test too)."""
    limits, left, right = rule
    cache_key = (device, id(limits), left, right)
    if cache_key not in state.visibility:
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
        state.visibility[cache_key] = (visible, gathered_visible)
    return state.visibility[cache_key]
