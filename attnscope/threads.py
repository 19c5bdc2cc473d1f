"""The process's worker threads, for the CPU kernels that share their own work out (`pipeline.tiles`' blocks,
`scores.pairs`' pair terms): torch's intra-op threads split each operation, and some operations are too small for
that to pay, so these kernels hand whole pieces of work to threads instead (torch and numpy release the GIL inside
their operations)."""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor

PREFIX = "attnscope-workers"


@functools.cache
def pool(workers: int, process: int) -> ThreadPoolExecutor:
    """`workers` threads kept for the process (`process`, its id: a process forked from this one has none of these
    threads, and builds its own pool). Each thread runs torch on one intra-op thread."""
    import torch

    return ThreadPoolExecutor(workers, thread_name_prefix=PREFIX, initializer=torch.set_num_threads, initargs=(1,))


def in_worker() -> bool:
    """Whether this thread is one of the pools': work it handed to a pool would wait for threads that may all be
    waiting likewise, so it does the work in place. (torch's thread count cannot tell: a thread takes the count
    torch has at its first use, whatever was set in it before.)"""
    return threading.current_thread().name.startswith(PREFIX)
