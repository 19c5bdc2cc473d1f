"""Estimated cost of a forward pass on an H100 SXM: the bare model (SDPA, no statistics), attnscope's block path and
its fused kernel, for GPT-2 small and a ~1B Llama-style model (Llama 3.2 1B's shape), in bfloat16. Prints the
table of docs/gpu.md. Estimates, not measurements: a roofline from published figures, each path's time the
largest of its compute time, its memory traffic over the bandwidth, and its kernel launches one after another.

    python scripts/gpu_estimates.py

What is counted, per forward (T = B·n tokens, L layers, E = B·H·n² logits a layer):
- bare: linear layers 2·P·T FLOPs (P the layer's weights, tensor cores); flash attention 2·B·H·n²·d_head FLOPs (QKᵀ
  and A·V over the causal half) plus ~5 FP32 operations per visible logit (max, exp, sums); memory: the weights
  once and ~40 activation values per token and d_model a layer (norms, projections, residuals, the MLP's 4d); the
  logits never leave the chip. Launches: ~12 kernels a layer (GPT-2), ~30 (Llama: unfused RMSNorm and rotary).
- blocks: the same without SDPA, plus what the block path does to the logits of each block (capture.py): QKᵀ and
  A·V over every key up to the block's last row, and ~72 bytes of memory traffic per logit (the bf16 product
  written, copied to float32, the causal triangle added, max, shift, clamp, exp, sum, a bf16 copy for A·V, the
  product with s and its sum: ~12 passes), ~12 FP32 operations per logit; ~18 kernels a block; blocks sized as on a
  GPU (block_path.block_bytes: an eighth of 70 GiB free, at most 4 GiB of logits a batch).
- fused: the bare forward with its attention replaced by the fused kernel (the same FLOPs, ~10 FP32 operations per
  visible logit), plus its per-row summaries (Z, Σ A·s and 5 gathered logits: 28 bytes per row and head) written
  and read back by scoring (~40 small kernels per pass over them, one pass per 64 MiB of summaries).
Scoring's reads of the summaries are counted at 40 passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BANDWIDTH = 3.35e12  # bytes/s, HBM3
TENSOR = 989e12  # FLOP/s, dense BF16 tensor cores
FP32 = 67e12  # FLOP/s, FP32 without tensor cores
LAUNCH = 5e-6  # s per kernel launch (4-6 µs)
ELEMENT = 2  # bytes: bfloat16
ACTIVATIONS = 40  # values per token and d_model moved by a layer of the bare forward
BLOCK_BYTES_PER_LOGIT = 72
SUMMARY_BYTES = (2 + 5) * 4  # Z, Σ A·s and 5 gathered logits per row and head, float32
SCORING_KERNELS, SCORING_PASSES_OVER_SUMMARIES = 40, 40
PENDING = 64 * 2**20  # summaries scored in one pass on a GPU (HeadStatistics.PENDING_BYTES_GPU)
FREE = 70 * 2**30  # free GPU memory when attention runs


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    d_head: int
    ffn: int
    gated: bool  # SwiGLU (three MLP matrices) rather than two
    bare_kernels: int  # kernels a layer of the bare forward launches

    @property
    def layer_weights(self) -> int:
        attention = self.d_model * self.d_head * (2 * self.heads + 2 * self.kv_heads)
        return attention + (3 if self.gated else 2) * self.d_model * self.ffn


GPT2 = Shape("GPT-2 small", 12, 768, 12, 12, 64, 3072, False, 12)
LLAMA_1B = Shape("Llama-style 1B", 16, 2048, 32, 8, 64, 8192, True, 30)


def _block_rows(start: int, n: int, per_entry: int, budget: int) -> int:
    """capture._block_rows for a causal layer."""
    entries = max(1, budget // per_entry)
    return max(1, int((-start + math.sqrt(start * start + 4 * entries)) / 2))


def _blocks(shape: Shape, batch: int, n: int) -> tuple[int, int]:
    """(blocks a layer, logits a layer) of the block path on a GPU with FREE bytes free."""
    budget = max(2**20, min(FREE // 8, 4 * 2**30) // batch)  # block_path.block_bytes
    start, blocks, logits = 0, 0, 0
    while start < n:
        stop = min(n, start + _block_rows(start, n, shape.heads * 4, budget))
        blocks += 1
        logits += batch * shape.heads * (stop - start) * stop  # keys up to the block's last row
        start = stop
    return blocks, logits


def estimate(shape: Shape, batch: int, n: int) -> dict[str, dict[str, float]]:
    L, T = shape.layers, batch * n
    visible = batch * shape.heads * n * (n + 1) / 2  # causal logits a layer
    linear = 2 * shape.layer_weights * T
    attention = 2 * 2 * visible * shape.d_head  # QKᵀ and A·V over the visible logits
    weights = ELEMENT * shape.layer_weights
    activations = ACTIVATIONS * T * shape.d_model * ELEMENT
    rows = batch * shape.heads * n
    summaries = rows * SUMMARY_BYTES
    passes = max(1, math.ceil(L * summaries / PENDING))
    scoring_bytes = SCORING_PASSES_OVER_SUMMARIES * summaries * L
    blocks, logits = _blocks(shape, batch, n)
    paths = {
        "bare": dict(
            tensor=L * (linear + attention), fp32=L * 5 * visible, memory=L * (weights + activations),
            launches=L * shape.bare_kernels,
        ),
        "blocks": dict(
            tensor=L * (linear + 2 * 2 * logits * shape.d_head), fp32=L * 12 * logits,
            memory=L * (weights + activations + BLOCK_BYTES_PER_LOGIT * logits) + scoring_bytes,
            launches=L * (shape.bare_kernels - 1 + 18 * blocks) + passes * SCORING_KERNELS,
        ),
        "fused": dict(
            tensor=L * (linear + attention), fp32=L * 10 * visible,
            memory=L * (weights + activations + summaries) + scoring_bytes,
            launches=L * shape.bare_kernels + passes * SCORING_KERNELS,
        ),
    }  # fmt: skip
    for path in paths.values():
        compute = path["tensor"] / TENSOR + path["fp32"] / FP32
        path["seconds"] = max(compute, path["memory"] / BANDWIDTH, path["launches"] * LAUNCH)
        path["bound"] = max(
            ("compute", compute), ("memory", path["memory"] / BANDWIDTH), ("launches", path["launches"] * LAUNCH),
            key=lambda item: item[1],
        )[0]  # fmt: skip
    return paths


def table() -> str:
    lines = [
        "| model | B × n | path | TFLOP | GB moved | launches | est. ms | bound by | × bare |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, points in ((GPT2, [(1, 1024), (8, 1024), (32, 1024)]), (LLAMA_1B, [(1, 1024), (8, 1024), (8, 4096)])):
        for batch, n in points:
            paths = estimate(shape, batch, n)
            for name, path in paths.items():
                flops = (path["tensor"] + path["fp32"]) / 1e12
                ratio = path["seconds"] / paths["bare"]["seconds"]
                lines.append(
                    f"| {shape.name} | {batch} × {n} | {name} | {flops:.2f} | {path['memory'] / 1e9:.1f} | "
                    f"{path['launches']:,.0f} | {path['seconds'] * 1e3:.2f} | {path['bound']} | {ratio:.2f} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
