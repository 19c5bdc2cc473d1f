"""Several processes under PyTorch's launcher (`torchrun --nproc-per-node N -m attnscope ...`).

Two ways of sharing the work, each where it fits:

    windows:  each rank takes every N-th window of the corpus, accumulates its own sums, and the sums are added up
              across ranks with torch.distributed (NCCL between GPUs, gloo on CPU): heads, diversity, one model's
              report. The result equals one process's to float rounding (the sums are added in another order).
    items:    each rank takes every N-th item of a list of independent pieces of work (`share`) and does each
              whole, exactly as one process would; the results are gathered, in the list's order, on every rank
              (`run_shared`, `gather`): circuit's removals, compare's models, the models of a report of several,
              patch's runs. The result is one process's, bit for bit. A stream of items too long to hold
              (circuit's gradient and discover, batch by batch; ablate, pass by pass) goes round by round
              (`in_rounds`): N items at a time, one to each rank, their results handed back in order, so that sums
              over them are added as one process adds them.

Inside `alone()` a process works as if it were the only one (no window split, no sums added, nothing shared): a
piece of work (a model of compare) runs its passes over the texts whole. Only rank 0 prints and writes files.
Commands that do not share their work are refused under torchrun (`settings.Settings.check_processes`).

The place of this process is read from the variables torchrun sets, and trusted only when they are all there and
agree: a stray `RANK=1` in a shell, without WORLD_SIZE, once made every command skip the first window and print
nothing; `WORLD_SIZE=abc` or a WORLD_SIZE without the rest (no torchrun) ended in tracebacks or waited for ever for
processes that would never come.

Light: torch is imported only to join the group, add sums or gather results, so the command line can ask `world()`
before any model.
"""

from __future__ import annotations

import contextvars
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
R = TypeVar("R")

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


_ALONE = contextvars.ContextVar("attnscope_alone", default=False)


@contextmanager
def alone() -> Iterator[None]:
    """Inside, this process works as if it were the only one: its passes over the texts read every window, no sums
    are added across processes, nothing is shared or gathered (`working`). For a piece of work one process does whole
    while the others do theirs (a model of compare)."""
    token = _ALONE.set(True)
    try:
        yield
    finally:
        _ALONE.reset(token)


def working() -> World:
    """The place this process's work is shared by: `world()`, or one process of one inside `alone()`."""
    return World() if _ALONE.get() else world()


def init(device: torch.device) -> World:
    """Join the process group when launched by torchrun; NCCL for CUDA devices (this process's own GPU made the
    current one, where objects gathered travel), gloo otherwise."""
    import torch

    place = world()
    if place.size > 1 and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        try:
            torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        except (RuntimeError, ValueError) as error:  # an address that cannot be reached, a port taken
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise AttnscopeError(f"cannot join torchrun's {place.size} processes: {first}") from None
    return place


def all_reduce_sum(*tensors: torch.Tensor) -> None:
    """Add each tensor up across ranks, in place (nothing to do for one process)."""
    import torch

    if _ALONE.get() or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    for tensor in tensors:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)


def share(items: Sequence[T], rank: int, size: int) -> list[T]:
    """The items of process `rank` of `size`: every `size`-th, from the `rank`-th (items rank, rank + size, ...)."""
    return list(items[rank::size])


def reassemble(parts: Sequence[Sequence[T]]) -> list[T]:
    """The items in their first order, from every process's `share` (`parts[rank]`): item i is the (i // N)-th of
    process i mod N. A part cut short (a process that stopped at an error) ends the list where its first missing
    item would be."""
    size, whole = len(parts), []
    for index in range(sum(len(part) for part in parts)):
        part = parts[index % size]
        if index // size >= len(part):
            break
        whole.append(part[index // size])
    return whole


def gather(mine: Sequence[T]) -> list[T]:
    """Every process's share of a list (`share` of this process's place), put back in order, on every process (one
    process: its own items)."""
    place = working()
    if place.size == 1:
        return list(mine)
    import torch

    parts: list[Any] = [None] * place.size
    torch.distributed.all_gather_object(parts, list(mine))
    return reassemble(parts)


def in_rounds(items: Iterable[T], work: Callable[[T], R]) -> Iterator[R]:
    """`work(item)` for every item of a stream every process reads alike, yielded in the items' order on every
    process, one round of N items at a time: item i is worked on by process i mod N, and each round's results are
    gathered before the next round begins (so only N results are held, however long the stream). An
    AttnscopeError ends the stream as in `run_shared`: raised by every process, the first in order, at the end of
    its round. One process: `work(item)` for each item, as it comes."""
    place = working()
    if place.size == 1:
        for item in items:
            yield work(item)
        return
    iterator = iter(items)
    while True:
        round_items = list(itertools.islice(iterator, place.size))
        if not round_items:
            return
        mine: tuple[bool, Any] | None = None
        if place.rank < len(round_items):
            try:
                mine = (True, work(round_items[place.rank]))
            except AttnscopeError as error:
                mine = (False, str(error))
        for outcome in gather([] if mine is None else [mine]):
            done, value = outcome
            if not done:
                raise AttnscopeError(value)
            yield value


def run_shared(items: Sequence[T], work: Callable[[T], R]) -> list[R]:
    """`work(item)` for every item, each process doing its share (`share`), each item whole; the results in the
    items' order, on every process. An AttnscopeError of one item stops its process's share there and, once every
    process has finished, is raised by every process: the first in the items' order, the one a single process would
    have stopped at (no process waits for ever for one that failed, and all end with the same line)."""
    place = working()
    outcomes: list[tuple[bool, Any]] = []
    for item in share(items, place.rank, place.size):
        try:
            outcomes.append((True, work(item)))
        except AttnscopeError as error:
            outcomes.append((False, str(error)))
            break
    results = []
    for done, value in gather(outcomes):
        if not done:
            raise AttnscopeError(value)
        results.append(value)
    return results
