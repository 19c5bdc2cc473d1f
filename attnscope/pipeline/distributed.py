"""Several processes under PyTorch's launcher (`torchrun --nproc-per-node N -m attnscope ...`).

Each rank takes every N-th window of the corpus, accumulates its own sums, and the sums are added up across ranks
with torch.distributed (NCCL between GPUs, gloo on CPU). Sums and counts add exactly, so the result equals one
process's. Only rank 0 prints and writes files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world() -> World:
    """This process's place, from the variables torchrun sets (one process of one when there are none)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    return World(int(os.environ.get("RANK", "0")), size, int(os.environ.get("LOCAL_RANK", "0")))


def init(device: torch.device) -> World:
    """Join the process group when launched by torchrun; NCCL for CUDA devices, gloo otherwise."""
    place = world()
    if place.size > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return place


def all_reduce_sum(*tensors: torch.Tensor) -> None:
    """Add each tensor up across ranks, in place (nothing to do for one process)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    for tensor in tensors:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
