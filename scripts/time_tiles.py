"""Time the capture's long rows on the CPU against the bare SDPA forward, on one thread, the methods taking turns in
one process (A B C A B C ..., each round starting one further along), by CPU time (`time.process_time`): other jobs
on the machine slow every method alike, so the ratios hold where wall-clock times on a shared machine do not.

Two modes. By default, one layer's attention on random queries, keys and values of a Llama shape (9 query heads over
3 key/value heads, d_head 64, one causal window): `sdpa` (torch's fused CPU kernel, as the floor's forward calls
it), `heads` (the block path in tiles with heads' reducer: pipeline.tiles) and `kvplan` (with kvplan's, sink 128 and
recent 256). With --model, the whole forward of a saved model (scripts/long_context_model.py) as `attnscope bench`
runs it: `floor`, `attnscope` (heads' capture) and `kvplan`. --baseline FILE adds each capture again with
`block_in_tiles` taken from FILE, a copy of an earlier pipeline/tiles.py, as `heads/base` or `attnscope/base`:

    PYTHONPATH=. python scripts/time_tiles.py --tokens 8192,32768 --rounds 3
    git show 30ed48f:attnscope/pipeline/tiles.py > /tmp/tiles_before.py
    PYTHONPATH=. python scripts/time_tiles.py --tokens 8192 --rounds 4 --baseline /tmp/tiles_before.py
    python scripts/long_context_model.py /tmp/llama32k --context 32768 --layers 2
    PYTHONPATH=. python scripts/time_tiles.py --model /tmp/llama32k --tokens 32768 --rounds 2

Prints each round's times and, per method, the median and its ratio to the first method's median (sdpa, floor).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable

import torch


def layer_methods(n: int, seed: int = 0) -> dict[str, Callable[[], object]]:
    """One Llama-shaped layer's attention at `n` tokens: the bare SDPA and the capture's block path with heads' and
    kvplan's reducers (a fresh capture state each call, as a batch's first layer sees it)."""
    import torch.nn.functional as F

    from attnscope.pipeline import block_path
    from attnscope.pipeline.blocks import CaptureState, LayerCall
    from attnscope.pipeline.reducers import DistantAttention, HeadStatistics
    from attnscope.scores.kinds import DECODER

    H, H_kv, d_head = 9, 3, 64
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, H, n, d_head, generator=generator)  # (B, H, n, d_head)
    key = torch.randn(1, H_kv, n, d_head, generator=generator)  # (B, H_kv, n, d_head)
    value = torch.randn(1, H_kv, n, d_head, generator=generator)
    call = LayerCall(
        layer=0, causal=True, triangle=True, scaling=d_head**-0.5, softcap=None, sinks=None, sliding_window=None
    )
    lengths = torch.tensor([n])

    def sdpa() -> object:
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)

    def captured(reducer) -> object:
        state = CaptureState(reducer, lengths)
        output = block_path.attention(state, call, query, key, value, None)
        reducer.end_run()
        return output

    return {
        "sdpa": sdpa,
        "heads": lambda: captured(HeadStatistics(DECODER, 1, H, torch.device("cpu"))),
        "kvplan": lambda: captured(DistantAttention(1, H, torch.device("cpu"), 128, 256)),
    }


def model_methods(folder: str, n: int, seed: int = 0) -> dict[str, Callable[[], object]]:
    """`attnscope bench`'s floor, attnscope and kvplan on the model saved in `folder`, one window of `n` random
    tokens."""
    from transformers import AutoModelForCausalLM

    from attnscope.analyses import bench
    from attnscope.models.families import family_of

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    family_of(model.config).prepare(model.base_model)
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))
    methods = bench._methods(model, ids, torch.device("cpu"))
    return {name: methods[name] for name in ("floor", "attnscope", "kvplan")}


def with_baseline(methods: dict[str, Callable[[], object]], path: str) -> dict[str, Callable[[], object]]:
    """The methods and, for each capture, the same with `block_in_tiles` from the tiles module at `path` (given the
    arguments it takes) and without pipeline.distant (kvplan's long rows then in tiles, as before it)."""
    import inspect

    from attnscope.pipeline import distant, tiles

    spec = importlib.util.spec_from_file_location("tiles_baseline", path)
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    current, kernel = tiles.block_in_tiles, distant.KERNEL
    taken = len(inspect.signature(baseline.block_in_tiles).parameters)

    def swapped(method: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            tiles.block_in_tiles = lambda *job: baseline.block_in_tiles(*job[:taken])
            distant.KERNEL = None
            try:
                return method()
            finally:
                tiles.block_in_tiles, distant.KERNEL = current, kernel

        return run

    first, *captures = methods
    return {**methods, **{f"{name}/base": swapped(methods[name]) for name in captures}}


def alternate(methods: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """CPU seconds of each method, `rounds` times, in turns; each round starts one method further along."""
    names = list(methods)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.process_time()
            methods[name]()
            times[name].append(time.process_time() - start)
        print(round_, {name: round(spent[-1], 3) for name, spent in times.items()}, flush=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="8192,32768", help="comma-separated lengths (default 8192,32768)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", help="a saved model's folder: time whole forwards instead of one layer")
    parser.add_argument("--baseline", help="a copy of an earlier pipeline/tiles.py to time the captures with too")
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    torch.set_flush_denormal(True)  # as the capture does
    for n in (int(tokens) for tokens in arguments.tokens.split(",")):
        with torch.inference_mode():
            methods = model_methods(arguments.model, n) if arguments.model else layer_methods(n)
            if arguments.baseline:
                methods = with_baseline(methods, arguments.baseline)
            times = alternate(methods, arguments.rounds)
        reference = statistics.median(next(iter(times.values())))
        print(f"{n} tokens, {arguments.threads} thread(s), CPU seconds:")
        for name, spent in times.items():
            median = statistics.median(spent)
            print(
                f"  {name:16s} median {median:8.3f} s  ×{median / reference:.3f}  (min ×{min(spent) / reference:.3f})"
            )


if __name__ == "__main__":
    main()
