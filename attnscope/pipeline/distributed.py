"""Several processes under PyTorch's launcher (`torchrun --nproc-per-node N -m attnscope ...`).

Each rank takes every N-th window of the corpus, accumulates its own sums, and the sums are added up across ranks
with torch.distributed (NCCL between GPUs, gloo on CPU). Sums and counts add exactly, so the result equals one
process's. Only rank 0 prints and writes files. Commands that do not split their work this way are refused under
torchrun (`settings.Settings.processes`).

The place of this process is read from the variables torchrun sets, and trusted only when they are all there and
agree: a stray `RANK=1` in a shell, without WORLD_SIZE, once made every command skip the first window and print
nothing; `WORLD_SIZE=abc` or a WORLD_SIZE without the rest (no torchrun) ended in tracebacks or waited for ever for
processes that would never come.

Light: torch is imported only to join the group or add sums, so the command line can ask `world()` before any model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    import torch

# What torchrun sets for every process, beside WORLD_SIZE; a process group needs them all.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    note: str | None = None  # what was ignored of the environment (a stray RANK), said beside the result

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _whole(name: str, at_least: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text.isdigit() or int(text) < at_least:
        raise AttnscopeError(
            f"{name}={os.environ.get(name, '')!s:.40}: torchrun sets it to a whole number (at least {at_least}); "
            f"launch with torchrun, or unset {name}"
        )
    return int(text)


def world() -> World:
    """This process's place, from the variables torchrun sets: one process of one when WORLD_SIZE is unset or 1
    (a RANK or LOCAL_RANK then is ignored, with a note); otherwise every variable torchrun sets must be there, whole
    numbers where they are numbers, the rank below the world's size. One AttnscopeError says what is wrong."""
    stray = [name for name in ("RANK", "LOCAL_RANK") if os.environ.get(name, "").strip() not in ("", "0")]
    if os.environ.get("WORLD_SIZE", "").strip() in ("", "1"):
        if not stray:
            return World()
        given = ", ".join(f"{name}={os.environ[name].strip()!s:.20}" for name in stray)
        return World(
            note=f"{given} ignored: WORLD_SIZE is not set (torchrun sets both), so this is the only process and it "
            "reads every text"
        )
    size = _whole("WORLD_SIZE", 1)
    missing = [name for name in TORCHRUN_VARIABLES if not os.environ.get(name, "").strip()]
    if missing:
        raise AttnscopeError(
            f"WORLD_SIZE={size} says this is one of {size} processes, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: torchrun sets them all (torchrun --nproc-per-node "
            f"{size} -m attnscope ...); to run one process, unset WORLD_SIZE"
        )
    rank, local_rank = _whole("RANK", 0), _whole("LOCAL_RANK", 0)
    if rank >= size:
        raise AttnscopeError(f"RANK={rank} with WORLD_SIZE={size}: a rank is below the number of processes")
    return World(rank, size, local_rank)


def init(device: torch.device) -> World:
    """Join the process group when launched by torchrun; NCCL for CUDA devices, gloo otherwise."""
    import torch

    place = world()
    if place.size > 1 and not torch.distributed.is_initialized():
        try:
            torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        except (RuntimeError, ValueError) as error:  # an address that cannot be reached, a port taken
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise AttnscopeError(f"cannot join torchrun's {place.size} processes: {first}") from None
    return place


def all_reduce_sum(*tensors: torch.Tensor) -> None:
    """Add each tensor up across ranks, in place (nothing to do for one process)."""
    import torch

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    for tensor in tensors:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
