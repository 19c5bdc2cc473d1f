"""The bench's harness: time and memory of a call, measured fairly across methods.

`measure` runs every method's warm-up, then rounds in which every method is timed once and measured once for its
memory, in an order rotated by one method per round (round-robin), so that drift in the machine's load falls on
every method alike. A timed sample lasts at least `sample_s`: a call shorter than that (a small model's forward
takes a millisecond or two) is repeated and the time of one call reported. On CUDA, events with a synchronisation;
on CPU, perf_counter. Memory: CUDA `max_memory_allocated` above what was allocated before the call; on CPU the
peak resident set size above the size before the call, sampled every millisecond by a thread (`PeakRSS`), after
freed memory is handed back to the OS (glibc malloc_trim) so that the call's own allocations show.
"""

from __future__ import annotations

import math
import statistics as stats_module
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnscope.pipeline import heap

MAX_CALLS = 1000


class PeakRSS:
    """Peak resident set size above the size at entry, sampled by a thread (Linux /proc; 0 elsewhere)."""

    def __init__(self, interval: float = 0.001):
        self.interval = interval
        self.peak = 0

    @staticmethod
    def _rss() -> int:
        try:
            with open("/proc/self/statm") as file:
                return int(file.read().split()[1]) * 4096
        except OSError:
            return 0

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self.start = self._rss()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def above_start(self) -> int:
        return self.peak - self.start


@dataclass
class Measurement:
    method: str
    batch: int
    seq: int
    times: list[float]  # seconds, one per round
    peaks: list[int]  # bytes above the run's start, one per round

    @property
    def median(self) -> float:
        return stats_module.median(self.times)

    @property
    def spread(self) -> float:
        """(max - min) / median of the timed runs."""
        return (max(self.times) - min(self.times)) / self.median

    @property
    def peak_bytes(self) -> float:
        return stats_module.median(self.peaks)

    @property
    def tokens_per_second(self) -> float:
        return self.batch * self.seq / self.median


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(run: Callable[[int], Any], device: torch.device, calls: int = 1) -> float:
    """Seconds one call takes: the time of `run(calls)` over `calls`."""
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run(calls)
        end.record()
        torch.cuda.synchronize(device)
        return begin.elapsed_time(end) / 1000 / calls
    start = time.perf_counter()
    run(calls)
    return (time.perf_counter() - start) / calls


def _peak(run: Callable[[int], Any], device: torch.device) -> int:
    """Bytes one call's memory peaks above what was in use when it started."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run(1)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    release_freed_memory()  # so that the run's allocations show in the resident set size again
    with PeakRSS() as rss:
        run(1)
    return rss.above_start


def measure(
    runs: dict[str, Callable[[int], Any]],
    device: torch.device,
    warmup: int,
    repeats: int,
    memory: bool = True,
    sample_s: float = 0.0,
) -> dict[str, tuple[list[float], list[int]]]:
    """Per run name, the time of one call in each of `repeats` timed samples and (with `memory`) the peaks of as
    many single calls; `runs[name](calls)` makes `calls` calls of a method.

    `warmup` untimed rounds first, each call timed; then each round takes one timed sample of every method, then
    one call for its memory, starting one method later than the round before (round-robin), so that a change in
    the machine's load during the measurement does not fall on one method only. A sample makes as many calls as
    fill `sample_s` by the last warm-up call's time (at least 1, at most MAX_CALLS): a forward of a millisecond or
    two is too short to time alone (timer resolution, and the jitter of a shared machine, are a sizeable part of
    it), so its time is the sample's time over its calls.
    """
    names = list(runs)
    one_call = {name: 0.0 for name in names}  # seconds, from the warm-up
    for _ in range(warmup):
        for name in names:
            one_call[name] = _timed(runs[name], device)
    calls = {name: max(1, min(MAX_CALLS, math.ceil(sample_s / max(one_call[name], 1e-9)))) for name in names}
    if not warmup:
        calls = dict.fromkeys(names, 1)
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    peaks: dict[str, list[int]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        order = names[shift:] + names[:shift]
        for name in order:
            times[name].append(_timed(runs[name], device, calls[name]))
        if memory:
            for name in order:
                peaks[name].append(_peak(runs[name], device))
    return {name: (times[name], peaks[name]) for name in names}


def release_freed_memory() -> None:
    """Give memory freed by earlier runs back to the OS (glibc's malloc_trim), where that is possible: without it
    the allocator reuses cached pages and a run's peak barely moves the resident set size."""
    import gc

    gc.collect()
    heap.trim()


def available_bytes(device: torch.device) -> int | None:
    """Memory that a run could still take: free GPU memory, or the host's MemAvailable (None when unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
