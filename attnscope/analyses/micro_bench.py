"""The tutorials' micro-benchmark (`attnscope bench --micro`): multi-head attention written from scratch (numpy,
one head at a time; numpy, all heads at once; torch) against torch's scaled_dot_product_attention, on random
inputs, for several head counts (`scores.reference` holds the from-scratch versions).
"""

from __future__ import annotations

import statistics as stats_module
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attnscope.analyses.harness import available_bytes, measure
from attnscope.errors import AttnscopeError

MICRO_D_MODEL = 512  # the tutorials' width

MICRO_HEADS = (1, 4, 8, 16)

MICRO_METHODS = ("numpy_loop", "numpy_batched", "torch_scratch", "torch_sdpa")


def micro_bytes(batch: int, seq: int, heads: int) -> int:
    """About what the from-scratch torch attention holds at its peak: the scores, the masked scores, the weights
    and a copy of them, each (B, H, n, n) float32. The numpy ways hold the same for one sequence at a time."""
    return 4 * 4 * batch * heads * seq * seq


def micro_benchmark(
    d_model: int = MICRO_D_MODEL,
    heads: Sequence[int] = MICRO_HEADS,
    seqs: Sequence[int] = (256,),
    batches: Sequence[int] = (1,),
    repeats: int = 3,
    device: Any = "cpu",
    warmup: int = 1,
    status: Callable[[str], None] | None = None,
) -> tuple[list[dict], list[str]]:
    """The tutorials' micro-benchmark: from-scratch multi-head attention (numpy, one head at a time; numpy, all
    heads at once; torch) against torch's scaled_dot_product_attention, on random inputs of `batch` sequences of
    `seq` tokens of width `d_model`, for every head count, batch size and sequence length. The numpy ways take one
    sequence at a time, as the tutorials do (a batch is a loop over its sequences); torch takes the batch at once.
    Times are medians of `repeats` runs after `warmup`, in milliseconds per call (one call: the whole batch).

    Returns the rows and notes: a shape whose attention would not fit in the memory available is skipped, and
    named in a note."""
    for count in heads:
        if d_model % count:
            raise AttnscopeError(f"{count} heads do not divide d_model {d_model}")  # never 1 head
    device = torch.device(device)
    rows, notes = [], []
    shapes = [(batch, seq) for batch in batches for seq in seqs]
    for done, (batch, seq) in enumerate(shapes):
        # torch holds the whole batch's attention on `device`, numpy one sequence's on the host
        needs = {device: micro_bytes(batch, seq, max(heads)), torch.device("cpu"): micro_bytes(1, seq, max(heads))}
        short = [(where, need, available_bytes(where)) for where, need in needs.items()]
        short = [(where, need, free) for where, need, free in short if free is not None and need > free]
        if short:
            where, need, free = short[0]
            notes.append(
                f"micro-benchmark skipped at {batch} × {seq}: its attention would take about {need / 2**30:,.1f} GiB "
                f"on {where.type}, more than the {free / 2**30:,.1f} GiB available"
            )
            continue
        if status is not None:
            status(f"micro-benchmark at {batch} × {seq} ({done + 1} of {len(shapes)}) …")
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(batch, seq, d_model, generator=generator)  # (B, n, d)
        w = torch.randn(d_model, 3 * d_model, generator=generator) / d_model**0.5  # (d, 3d)
        b = torch.zeros(3 * d_model)  # (3d,)
        x_np, w_np, b_np = x.numpy(), w.numpy(), b.numpy()
        xd, wd, bd = x.to(device), w.to(device), b.to(device)
        for count in heads:
            runs = _micro_runs(count, d_model, (x_np, w_np, b_np), (xd, wd, bd))
            host = {name: run for name, run in runs.items() if name.startswith("numpy")}
            on_device = {name: run for name, run in runs.items() if name.startswith("torch")}
            with torch.inference_mode():
                measured = measure(host, torch.device("cpu"), warmup, repeats, memory=False)
                measured |= measure(on_device, device, warmup, repeats, memory=False)
            row = {"batch": batch, "seq": seq, "heads": count, "d_head": d_model // count}
            rows.append(row | {f"{name}_ms": stats_module.median(measured[name][0]) * 1000 for name in MICRO_METHODS})
    return rows, notes


def _micro_runs(count: int, d_model: int, host: tuple, on_device: tuple) -> dict[str, Callable[[int], Any]]:
    """The four ways of `micro_benchmark` with `count` heads, each called with how many times to run."""
    from attnscope.scores.reference import multi_head_attention, numpy_mha_batched, numpy_mha_loop, split_heads

    x_np, w_np, b_np = host  # (B, n, d), (d, 3d), (3d,)
    xd, wd, bd = on_device

    def numpy_loop(calls: int = 1) -> None:
        for _ in range(calls):
            for sequence in x_np:  # (n, d)
                numpy_mha_loop(sequence, w_np, b_np, count)

    def numpy_batched(calls: int = 1) -> None:
        for _ in range(calls):
            for sequence in x_np:
                numpy_mha_batched(sequence, w_np, b_np, count)

    def torch_scratch(calls: int = 1) -> None:
        for _ in range(calls):
            multi_head_attention(xd, wd, bd, count)

    def torch_sdpa(calls: int = 1) -> None:
        for _ in range(calls):
            q, k, v = (split_heads(part, count) for part in (xd @ wd + bd).split(d_model, dim=-1))  # (B, H, n, dh)
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    return {
        "numpy_loop": numpy_loop,
        "numpy_batched": numpy_batched,
        "torch_scratch": torch_scratch,
        "torch_sdpa": torch_sdpa,
    }
