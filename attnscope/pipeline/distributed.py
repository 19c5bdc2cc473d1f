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

Joining the group (`init`) waits for every process to come to MASTER_ADDR:MASTER_PORT, at most
ATTNSCOPE_RENDEZVOUS_TIMEOUT seconds (120 by default), and a stopping signal ends the wait at once: torch's own
rendezvous waited 30 minutes inside C++, where neither Ctrl-C nor SIGTERM could end it, and printed a C++ stack.

Light: torch is imported only to join the group, add sums or gather results, so the command line can ask `world()`
before any model.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from attnscope.errors import AttnscopeError, RendezvousError

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
R = TypeVar("R")

# What torchrun sets for every process, beside WORLD_SIZE; a process group needs them all.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# How long a process waits at the rendezvous for the others, in seconds: long enough for processes that load a large
# model at different speeds (the wait begins once this process has loaded its own), far shorter than torch's 30
# minutes, which a process launched by hand without the others (RANK=1 alone) spent waiting for nothing.
RENDEZVOUS_TIMEOUT = "ATTNSCOPE_RENDEZVOUS_TIMEOUT"
DEFAULT_RENDEZVOUS_SECONDS = 120.0
# The signals the rendezvous's thread leaves to the main thread, where Python's handlers run (boundary's).
_STOPPING_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    note: str | None = None  # what was ignored of the environment (a stray RANK), said beside the result
    rendezvous_seconds: float = DEFAULT_RENDEZVOUS_SECONDS  # how long `init` waits for the other processes

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


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= 10**7:  # also refuses nan and inf
        raise AttnscopeError(
            f"{name}={text!s:.40}: how long the processes wait for each other, in seconds (a number above 0, at "
            f"most 10,000,000; {default:g} when unset)"
        )
    return seconds


def world() -> World:
    """This process's place, from the variables torchrun sets: one process of one when WORLD_SIZE is unset or 1
    (a RANK or LOCAL_RANK then is ignored, with a note); otherwise every variable torchrun sets must be there, whole
    numbers where they are numbers, the rank below the world's size, and ATTNSCOPE_RENDEZVOUS_TIMEOUT, where set, a
    number of seconds. One AttnscopeError says what is wrong."""
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
    return World(rank, size, local_rank, rendezvous_seconds=_seconds(RENDEZVOUS_TIMEOUT, DEFAULT_RENDEZVOUS_SECONDS))


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
    current one, where objects gathered travel), gloo otherwise. The processes first meet (`_meet`): a
    RendezvousError when they do not all come within the place's `rendezvous_seconds`."""
    import torch

    place = world()
    if place.size > 1 and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store = _meet(place)
        try:
            torch.distributed.init_process_group(
                backend="nccl" if device.type == "cuda" else "gloo", store=store, rank=place.rank, world_size=place.size
            )
        except (RuntimeError, ValueError) as error:
            raise AttnscopeError(f"cannot join torchrun's {place.size} processes: {_first_line(error)}") from None
    return place


# Whether this process was stopped while it waited for the others at the rendezvous: it has met no rank 0 that
# would say so for it (see `stopped_waiting`).
_stopped_waiting = False
# How much longer than the stated timeout the main thread waits for torch's own timeout to end the meeting (its
# client tries again once more after the time is up).
_GRACE_SECONDS = 5.0


def stopped_waiting() -> bool:
    """Whether a stopping signal ended this process's wait at the rendezvous: then it says so itself, whatever its
    rank (under torchrun, rank 0 says it for every process; here no process knows whether the others exist)."""
    return _stopped_waiting


def _meet(place: World) -> Any:
    """The store every process of `place` has come to, torch's rendezvous (`env://`) followed by a barrier on it.
    It runs in a thread of its own while this, the main thread, waits in slices of a tenth of a second: torch waits
    inside C++, where Python's signal handlers cannot run, so a stopping signal (delivered here: the thread blocks
    them) ends the wait at once, as a KeyboardInterrupt. Past the timeout, one RendezvousError says so."""
    import threading

    global _stopped_waiting
    _stopped_waiting = False
    deadline = time.monotonic() + place.rendezvous_seconds
    outcome: dict[str, Any] = {}
    meeting = threading.Thread(target=_meeting, args=(place, deadline, outcome), name="attnscope-rendezvous")
    meeting.daemon = True  # one stopped by a signal goes on until torch's timeout: it must not hold the exit
    meeting.start()
    try:
        while meeting.is_alive() and time.monotonic() < deadline + _GRACE_SECONDS:
            meeting.join(0.1)
    except KeyboardInterrupt:
        _stopped_waiting = True
        raise
    if "store" in outcome:
        return outcome["store"]
    raise RendezvousError(_unmet(place, outcome, deadline))


def _meeting(place: World, deadline: float, outcome: dict[str, Any]) -> None:
    """The rendezvous's thread: torch's rendezvous, then every process's mark on the store, waited for until
    `deadline`; the store (or the error) goes into `outcome`. A process other than rank 0 first waits here, in
    Python, for anything to answer at MASTER_ADDR:MASTER_PORT: torch's client would print a C++ stack at every try
    it gives up. The marks are the launch's own (torchrun's agent keeps its store across restarts)."""
    import signal
    from datetime import timedelta

    if hasattr(signal, "pthread_sigmask"):  # a signal landing here would cut a C++ call short (with a stack)
        signal.pthread_sigmask(signal.SIG_BLOCK, {getattr(signal, name) for name in _STOPPING_SIGNALS})
    try:
        if place.rank and not _answered(os.environ["MASTER_ADDR"].strip(), int(os.environ["MASTER_PORT"]), deadline):
            return
        outcome["answered"] = True
        import torch

        def left() -> timedelta:
            return timedelta(seconds=max(deadline - time.monotonic(), 0.01))

        store, _, _ = next(torch.distributed.rendezvous("env://", place.rank, place.size, timeout=left()))
        came = f"attnscope/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/came"
        store.set(f"{came}/{place.rank}", "1")
        store.wait([f"{came}/{rank}" for rank in range(place.size)], left())
        store.set_timeout(torch.distributed.default_pg_timeout)  # what torch gives the group's own traffic
        outcome["store"] = store
    except Exception as error:  # noqa: BLE001 - said by the main thread, in one line
        outcome["error"] = error


def _answered(host: str, port: int, deadline: float) -> bool:
    """Whether anything answers at host:port before `deadline` (tried every quarter of a second); a host name that
    does not resolve is raised at once."""
    import socket

    while True:
        try:
            socket.create_connection((host, port), timeout=max(min(deadline - time.monotonic(), 1.0), 0.01)).close()
            return True
        except socket.gaierror:
            raise
        except OSError:
            if time.monotonic() + 0.25 >= deadline:
                return False
            time.sleep(0.25)


def _unmet(place: World, outcome: dict[str, Any], deadline: float) -> str:
    """The line for a rendezvous that did not complete: what did not come, and how to give it longer."""
    error = outcome.get("error")
    where = f"{os.environ.get('MASTER_ADDR', '').strip()}:{os.environ.get('MASTER_PORT', '').strip()}"
    seconds = f"{place.rendezvous_seconds:g} s"
    advice = (
        f"start every process (torchrun --nproc-per-node {place.size} -m attnscope ...), or give them longer: "
        f"{RENDEZVOUS_TIMEOUT}=SECONDS"
    )
    if place.rank and "answered" not in outcome and error is None:
        return (
            f"nothing answered at MASTER_ADDR:MASTER_PORT ({where}) within {seconds}, where rank 0 of the "
            f"{place.size} processes waits for the others: {advice}"
        )
    if error is None or time.monotonic() >= deadline - 0.5:  # torch's own timeout, counted from a moment later
        said = f" ({_first_line(error)})" if error is not None else ""
        return f"torchrun's {place.size} processes did not all come to {where} within {seconds}{said}: {advice}"
    return f"cannot join torchrun's {place.size} processes at {where}: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


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
