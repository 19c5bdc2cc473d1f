"""One Triton kernel for a layer's attention and the per-row summaries the statistics need (pipeline.blocks'
LayerRows), in one pass over the keys: the logits never leave the chip.

One program takes a block of BLOCK_M query rows of one query head of one window and walks its keys BLOCK_N at a
time, as flash attention does: with s the scaled (and soft-capped) logits of the keys the row sees, it keeps a
running maximum m, l = Σ_j exp(s_ij − m), t = Σ_j exp(s_ij − m)(s_ij − m) and the output accumulator Σ_j exp(s_ij −
m) v_j, rescaling them by exp(m_old − m_new) when the maximum moves (t also gains (m_old − m_new)·l, so that every
term stays relative to the current maximum and nothing cancels). At the end, with shift = max(m, sink logit) (just
m without a sink) and c = exp(m − shift):

    Z = c·l (+ exp(sink − shift))                  normalizer, as the block path's (A_ij = exp(s_ij − shift) / Z)
    Σ_j A_ij (s_ij − shift) = c·(t + (m − shift)·l) / Z    expected_logit
    output = c · Σ_j exp(s_ij − m) v_j / Z        peak = m − shift, mass = c·l / Z (with a sink)

and the logits at the m keys the reducer gathers for each row are recomputed as q·k at those keys (m·d
multiply-adds a row, against n·d for the row's attention), shifted, and floored at LOGIT_FLOOR like the block
path's (a key the row does not see gets the floor). Which keys a row sees is derived, never read from an (n × n)
mask: key j < limit (the window's real tokens, or every key when the model gave no mask), j > i − left and j < i
+ right (right = 1 for a causal layer; left, right = the sliding window, or unbounded); the capture checks the
model's mask against this before it calls here. Grouped-query attention: query head h reads key/value head h // G
where it lies, never a copy. Logits and every statistic are float32 whatever the input dtype (the matmuls take the
input dtype and accumulate in float32, as tensor cores do); the output has the input's dtype.

On a CUDA device the kernel is compiled by Triton; under Triton's interpreter (TRITON_INTERPRET=1 when triton was
imported: `interpreted()`) it runs on CPU tensors, with numpy, one program after another: exact, very slow, and how
the tests check it without a GPU. Triton decides which when it is imported (it decorates its own functions, tl.sum
and the like, then), so one process runs one or the other; the capture switches the interpreter on for the CPU when
it can (pipeline.kernels.import_fused).

This module imports triton at its top: the capture imports it only when the fused kernel runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# as in pipeline.capture (not imported from there: the capture imports this module); constexpr, as a compiled
# kernel reads globals only as such
MASKED = tl.constexpr(-1e30)  # a logit the row does not see: finite, so that 0 · logit stays 0
LOGIT_FLOOR = tl.constexpr(-87.0)  # shifted logits are floored here, as by the block path (exp(-87) ≈ 1.6e-38)
UNBOUNDED = 2**30  # `left` or `right` of a layer without a window on that side
INTERPRETER_BLOCK = 32  # rows and keys of a tile under the interpreter (see block_sizes)


@triton.jit
def _attention_kernel(
    Q, K, V, Out, Normalizer, Expected, Gathered, Peak, Mass, Wanted, Limits, Sinks,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_wb, stride_wm, stride_wg,
    H, G, n, n_keys, d_head, scaling, softcap, left, right,
    M: tl.constexpr, M_PAD: tl.constexpr, BY_SLOT: tl.constexpr,
    SOFTCAP: tl.constexpr, SINKS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Rows start_m·BLOCK_M … of query head h of window b (program ids (start_m, b·H + h)); see the module."""
    start_m = tl.program_id(0)
    window_head = tl.program_id(1)
    b = (window_head // H).to(tl.int64)  # 64-bit offsets: a large batch's tensors exceed 2^31 elements
    h = window_head % H
    kv = h // G  # the key/value head this query head reads
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    dims = tl.arange(0, BLOCK_D)  # (BLOCK_D,) d_head padded to a power of two
    row_in = rows < n
    dim_in = dims < d_head
    q = tl.load(
        Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qm + dims[None, :] * stride_qd,
        mask=row_in[:, None] & dim_in[None, :],
        other=0.0,
    )  # (BLOCK_M, BLOCK_D) input dtype
    keys_at = K + b * stride_kb + kv * stride_kh
    values_at = V + b * stride_vb + kv * stride_vh
    limit = tl.load(Limits + b)  # keys < limit may be seen: the window's real tokens
    running_max = tl.full([BLOCK_M], MASKED, tl.float32)  # m
    total = tl.full([BLOCK_M], 0.0, tl.float32)  # l = Σ exp(s - m)
    weighted = tl.full([BLOCK_M], 0.0, tl.float32)  # t = Σ exp(s - m)(s - m)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)  # Σ exp(s - m) v
    # the keys some row of the block may see: from the first row's window start to the last row's end
    first = start_m * BLOCK_M
    low = (tl.maximum(first - left + 1, 0) // BLOCK_N) * BLOCK_N
    high = tl.minimum(tl.minimum(limit, n_keys), first + BLOCK_M - 1 + right)
    for start_n in range(low, high, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        k = tl.load(
            keys_at + keys[None, :] * stride_kn + dims[:, None] * stride_kd,
            mask=(keys[None, :] < n_keys) & dim_in[:, None],
            other=0.0,
        )  # (BLOCK_D, BLOCK_N)
        if UPCAST:  # the interpreter multiplies bfloat16 as the integers that store it: float32 operands instead
            s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")  # exact products: the same sums
        else:
            s = tl.dot(q, k, input_precision=PRECISION)
        s = s * scaling  # (BLOCK_M, BLOCK_N) float32
        if SOFTCAP:  # softcap · tanh(s / softcap), tanh(x) = 1 - 2 / (exp(2x) + 1) (exact at both ends)
            s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
        seen = (
            (keys[None, :] < limit) & (keys[None, :] > rows[:, None] - left) & (keys[None, :] < rows[:, None] + right)
        )
        s = tl.where(seen, s, MASKED)  # the mask's last use: a key unseen weighs exp(MASKED - max) = 0 below
        new_max = tl.maximum(running_max, tl.max(s, 1))  # (BLOCK_M,)
        rescale = tl.exp(running_max - new_max)  # 0 while nothing was seen (m = MASKED), then <= 1
        shifted = s - new_max[:, None]
        # exp(0) = 1 for the unseen keys of a row that has seen none yet (its maximum still MASKED): those weigh 0
        p = tl.where(new_max[:, None] > MASKED, tl.exp(shifted), 0.0)  # (BLOCK_M, BLOCK_N)
        weighted = rescale * (weighted + (running_max - new_max) * total) + tl.sum(p * shifted, 1)
        total = rescale * total + tl.sum(p, 1)
        v = tl.load(
            values_at + keys[:, None] * stride_vn + dims[None, :] * stride_vd,
            mask=(keys[:, None] < n_keys) & dim_in[None, :],
            other=0.0,
        )  # (BLOCK_N, BLOCK_D)
        weights = p.to(v.dtype)  # rounded to the values' dtype, as the block path's (and tensor cores take them)
        if UPCAST:
            update = tl.dot(weights.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            update = tl.dot(weights, v, input_precision=PRECISION)
        acc = acc * rescale[:, None] + update
        running_max = new_max
    if SINKS:
        sink = tl.load(Sinks + h)
        shift = tl.maximum(running_max, sink)  # a sink may outweigh every key
    else:
        shift = running_max
    scale = tl.exp(running_max - shift)  # c
    kept = total * scale  # Σ_j exp(s_ij - shift) over the keys
    if SINKS:
        normalizer = kept + tl.exp(tl.maximum(sink - shift, LOGIT_FLOOR))
    else:
        normalizer = kept
    # a row that sees no key at all (a padded row past a sliding window): output 0 and Z = 1, never NaN
    normalizer = tl.where(normalizer > 0.0, normalizer, 1.0)
    out = acc * (scale / normalizer)[:, None]
    tl.store(
        Out + b * stride_ob + h * stride_oh + rows[:, None] * stride_om + dims[None, :] * stride_od,
        out.to(Out.dtype.element_ty),
        mask=row_in[:, None] & dim_in[None, :],
    )
    row_at = (b * H + h) * n + rows  # (BLOCK_M,) into the (B, H, n) summaries
    tl.store(Normalizer + row_at, normalizer, mask=row_in)
    tl.store(Expected + row_at, scale * (weighted + (running_max - shift) * total) / normalizer, mask=row_in)
    if SINKS:
        tl.store(Peak + row_at, running_max - shift, mask=row_in)
        tl.store(Mass + row_at, kept / normalizer, mask=row_in)
    q32 = q.to(tl.float32)
    if BY_SLOT:  # one gathered key of every row at a time: (BLOCK_M, BLOCK_D) tiles, as registers like them
        for slot in tl.static_range(M):
            wanted = tl.load(Wanted + b * stride_wb + rows * stride_wm + slot * stride_wg, mask=row_in, other=0)
            k_wanted = tl.load(
                keys_at + wanted[:, None] * stride_kn + dims[None, :] * stride_kd,
                mask=row_in[:, None] & dim_in[None, :],
                other=0.0,
            )  # (BLOCK_M, BLOCK_D)
            s = tl.sum(q32 * k_wanted.to(tl.float32), 1) * scaling  # (BLOCK_M,)
            if SOFTCAP:
                s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
            seen = (wanted < limit) & (wanted > rows - left) & (wanted < rows + right)
            logit = tl.where(seen, tl.maximum(s - shift, LOGIT_FLOOR), LOGIT_FLOOR)
            tl.store(Gathered + row_at * M + slot, logit, mask=row_in)
    elif M > 0:  # every gathered key at once: (BLOCK_M, M_PAD, BLOCK_D), a few operations for the interpreter
        slots = tl.arange(0, M_PAD)
        wanted_in = row_in[:, None] & (slots[None, :] < M)  # (BLOCK_M, M_PAD)
        wanted = tl.load(
            Wanted + b * stride_wb + rows[:, None] * stride_wm + slots[None, :] * stride_wg, mask=wanted_in, other=0
        )  # (BLOCK_M, M_PAD)
        k_wanted = tl.load(
            keys_at + wanted[:, :, None] * stride_kn + dims[None, None, :] * stride_kd,
            mask=wanted_in[:, :, None] & dim_in[None, None, :],
            other=0.0,
        )  # (BLOCK_M, M_PAD, BLOCK_D)
        s = tl.sum(q32[:, None, :] * k_wanted.to(tl.float32), 2) * scaling  # (BLOCK_M, M_PAD)
        if SOFTCAP:
            s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
        seen = (wanted < limit) & (wanted > rows[:, None] - left) & (wanted < rows[:, None] + right)
        logit = tl.where(seen, tl.maximum(s - shift[:, None], LOGIT_FLOOR), LOGIT_FLOOR)
        tl.store(Gathered + row_at[:, None] * M + slots[None, :], logit, mask=wanted_in)


def interpreted() -> bool:
    """Whether Triton runs its kernels under its interpreter in this process: TRITON_INTERPRET=1 was set when
    triton was imported (its own library functions are decorated then, so it cannot change later)."""
    return not isinstance(_attention_kernel, triton.runtime.JITFunction)


@dataclass
class FusedRows:
    """What the kernel gives for one layer: output (B, n, H, d_head) in the input's dtype, as transformers expects
    it; normalizer, expected_logit (B, H, n), gathered (B, H, n, m) or None, peak, mass (B, H, n) or None, all
    float32 (see LayerRows)."""

    output: torch.Tensor
    normalizer: torch.Tensor
    expected_logit: torch.Tensor
    gathered: torch.Tensor | None
    peak: torch.Tensor | None
    mass: torch.Tensor | None


def block_sizes(d_head: int, interpret: bool, half: bool = True) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, warps). On a GPU, 64 query rows by 64 keys with 8 warps, 32 keys from d_head 128
    on or with float32 inputs (`half` false): compiled for sm_90 without a GPU (Triton's ahead-of-time path), those
    fit the registers without spilling at d_head 64 (bfloat16: 217 registers) and spill a few dozen bytes at 128 (a
    few hundred at 256), where 64 × 64 with 4 warps spilled more; never timed on a GPU. Under the interpreter,
    INTERPRETER_BLOCK square tiles: a tiny model's window is one tile (the tests that cross tile edges shrink it)."""
    block_d = max(16, triton.next_power_of_2(d_head))
    if interpret:
        return INTERPRETER_BLOCK, INTERPRETER_BLOCK, block_d, 1
    return 64, 64 if block_d <= 64 and half else 32, block_d, 8


def fused_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    limits: torch.Tensor,
    left: int,
    right: int,
    wanted: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    by_slot: bool | None = None,
) -> FusedRows:
    """A layer's attention and per-row summaries in one kernel launch.

    query: (B, H, n, d_head); key, value: (B, H_kv, n_k, d_head), any strides (GPT-2's strided views are read as
    they are); limits: (B,) keys < limits[b] may be seen; left, right: row i sees keys i - left < j < i + right
    (UNBOUNDED: no limit on that side); wanted: (n, m) or (B, n, m) the keys whose logits are gathered, each < n_k;
    softcap: logits ← softcap · tanh(logits / softcap); sinks: (H,) learned sink logits. by_slot: gather one key
    of every row at a time (a GPU's registers hold that), or all at once (fewer operations, for the interpreter);
    None: by slot on a GPU.
    """
    B, H, n, d_head = query.shape
    H_kv, n_keys = key.shape[1], key.shape[2]
    device = query.device
    interpret = interpreted()
    block_m, block_n, block_d, warps = block_sizes(d_head, interpret, query.dtype != torch.float32)
    output = torch.empty(B, n, H, d_head, dtype=value.dtype, device=device)  # (B, n, H, d_head)
    normalizer = torch.empty(B, H, n, device=device)  # (B, H, n) float32
    expected = torch.empty(B, H, n, device=device)
    peak = torch.empty(B, H, n, device=device) if sinks is not None else None
    mass = torch.empty(B, H, n, device=device) if sinks is not None else None
    if wanted is None:
        m, gathered = 0, None
        wanted = torch.zeros(1, 1, 1, dtype=torch.int32, device=device)  # never read
    else:
        m = wanted.shape[-1]
        gathered = torch.empty(B, H, n, m, device=device)  # (B, H, n, m)
        wanted = wanted.to(torch.int32).reshape(-1, n, m)  # (B or 1, n, m)
    shared = wanted.shape[0] == 1  # the same keys for every window: a batch stride of 0
    wanted_strides = (0 if shared else wanted.stride(0), wanted.stride(1), wanted.stride(2))
    limits = limits.to(device=device, dtype=torch.int32)
    sink_logits = sinks.float().contiguous() if sinks is not None else normalizer  # never read without sinks
    # float32 inputs: three TF32 products per product on tensor cores (each operand split in a high and a low TF32
    # part), within ~2^-22 of float32's; plain TF32 would be ~1e-3 off, and FMA without tensor cores far slower. The
    # interpreter multiplies in float32 whatever this says.
    precision = "tf32x3" if query.dtype == torch.float32 else "tf32"
    grid = (triton.cdiv(n, block_m), B * H)
    arguments = (
        query, key, value, output, normalizer, expected,
        gathered if gathered is not None else normalizer, peak if peak is not None else normalizer,
        mass if mass is not None else normalizer, wanted, limits, sink_logits,
        *query.stride(), *key.stride(), *value.stride(),
        output.stride(0), output.stride(2), output.stride(1), output.stride(3),  # (b, h, row, d) order
        *wanted_strides,
        H, H // H_kv, n, n_keys, d_head, float(scaling), float(softcap or 1.0), int(left), int(right),
    )  # fmt: skip
    constants = dict(
        M=m, M_PAD=triton.next_power_of_2(max(m, 1)), BY_SLOT=not interpret if by_slot is None else by_slot,
        SOFTCAP=softcap is not None, SINKS=sinks is not None, PRECISION=precision,
        UPCAST=interpret and query.dtype == torch.bfloat16,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
    )  # fmt: skip
    if interpret:
        _attention_kernel[grid](*arguments, **constants)
    else:
        with torch.cuda.device(device):  # Triton launches on the current device: a device map spreads the layers
            _attention_kernel[grid](*arguments, **constants, num_warps=warps, num_stages=2)
    return FusedRows(output, normalizer, expected, gathered, peak, mass)
