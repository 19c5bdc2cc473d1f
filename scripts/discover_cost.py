"""What `attnscope discover` costs against the model's own passes, for docs/performance.md and docs/discover.md.

A 30-layer Llama-architecture model of SmolLM2-135M's widths (d_model 576, 9 query heads over 3 key/value heads,
MLP 1,536; 8,370 edges... no: see the printed count) with random weights (seed 0) and the GPT-2 tokenizer of
tests/data, and a batch of 8 IOI-style pairs of one length. In one process, the methods taking turns for --rounds
rounds (the machine's drift falls on all alike), each timed and its peak resident memory above its start measured
(`analyses.harness.PeakRSS`):

    forward            the clean batch, no gradients (SDPA, the logits at the last position)
    forward+backward   the same with the gradient of the summed logit difference taken back to the embeddings (the
                       weights frozen, as discover's are: the leanest backward pass there is)
    training step      the same as training takes it: the weights' gradients too (freed after each round)
    eap-ig scores      one batch's edge scores by EAP-IG, --steps points: the two recording forwards and the steps
    eap scores         the same by EAP (one gradient)
    one circuit        one batch run with a circuit of half the edges (the rest ablated), every input split

    python scripts/discover_cost.py [--rounds 3] [--steps 5] [--layers 30] [--folder DIR]

With --folder, the model is saved there (made once, kept) with the pairs as DIR/pairs.jsonl, for the whole command:
`attnscope discover --model DIR --file DIR/pairs.jsonl --device cpu`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import long_context_model  # noqa: E402  (scripts/, beside this one)

import attnscope  # noqa: E402
from attnscope.analyses.harness import PeakRSS, release_freed_memory  # noqa: E402
from attnscope.pipeline import interventions  # noqa: E402
from attnscope.pipeline.edges import Layout  # noqa: E402
from attnscope.pipeline.pair_batch import PairBatch  # noqa: E402
from attnscope.pipeline.prompt_pairs import PromptPair, tokenized  # noqa: E402

NAMES = [" Mary", " John", " Alice", " Bob", " Tom", " Anna", " James", " Sarah", " David", " Emma"]
PLACES = [" store", " park", " school", " house", " garden", " office", " market", " river"]


def pairs(count: int) -> list[PromptPair]:
    """IOI-style pairs of one length: 'When A and B went to the P, B gave a drink to' -> A, against B."""
    found = []
    for k in range(count):
        a, b, place = NAMES[k % len(NAMES)], NAMES[(k + 3) % len(NAMES)], PLACES[k % len(PLACES)]
        clean = f"When{a} and{b} went to the{place},{b} gave a drink to"
        corrupt = f"When{a} and{b} went to the{place},{a} gave a drink to"
        found.append(PromptPair(clean, corrupt, a, b, f"pair {k}"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--folder", type=Path, default=None)
    options = parser.parse_args()
    folder = options.folder or Path(tempfile.mkdtemp(prefix="discover-cost-"))
    if not (folder / "config.json").exists():
        long_context_model.main(folder, options.layers, context=2048)
    lines = [
        {"clean": p.clean, "corrupt": p.corrupt, "answer": p.answer, "wrong": p.wrong} for p in pairs(options.batch)
    ]
    (folder / "pairs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    loaded = attnscope.load(folder, "cpu", lm_head=True)
    layout = Layout.of(loaded)
    graph = layout.graph
    prompt_pairs = pairs(options.batch)
    tokens = [tokenized(loaded, pair, (50256,)) for pair in prompt_pairs]
    assert len({len(pair.clean) for pair in tokens}) == 1, "the pairs must have one length"
    one = PairBatch(loaded, layout, tokens, list(range(len(tokens))))
    interventions.attention(loaded, "sdpa").__enter__()  # as discover runs (fastest_attention)
    with torch.no_grad():
        ablated = one.ablated(None)
    half = graph.valid & (np.random.default_rng(0).random(graph.valid.shape) < 0.5)
    midpoints = [(j + 0.5) / options.steps for j in range(options.steps)]  # discover's EAP-IG points

    def forward() -> None:
        with torch.no_grad():
            one.logit_differences(one.clean)

    def forward_backward() -> None:
        embeddings = loaded.model.get_input_embeddings()

        def moved(module, args, output):
            return output.detach().requires_grad_(True)

        handle = embeddings.register_forward_hook(moved)
        try:
            with interventions.weights_frozen(loaded), torch.enable_grad():
                one.metric(one.clean, one.answer, one.wrong).sum().backward()
        finally:
            handle.remove()

    def training_step() -> None:
        one.metric(one.clean, one.answer, one.wrong).sum().backward()
        loaded.lm_model.zero_grad(set_to_none=True)

    methods = {
        "forward": forward,
        "forward+backward": forward_backward,
        "training step": training_step,
        f"eap-ig scores (steps {options.steps})": lambda: one.gradient_scores(None, midpoints),
        "eap scores": lambda: one.gradient_scores(None, [1.0]),
        "one circuit (half the edges)": lambda: one.circuits([graph.valid & ~half], ablated),
    }
    for method in methods.values():  # warm-up
        method()
    times = {name: [] for name in methods}
    peaks = {name: [] for name in methods}
    names = list(methods)
    for round_ in range(options.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            release_freed_memory()  # what earlier methods freed goes back to the system: each peak is its own
            with PeakRSS() as peak:
                start = time.perf_counter()
                methods[name]()
                times[name].append(time.perf_counter() - start)
            peaks[name].append(peak.above_start)
    B, n = one.clean.shape
    print(
        f"model: {options.layers} layers x 9 heads (3 KV heads), d_model 576; {graph.n_edges:,} edges; batch {B} x {n} "
        f"tokens; {torch.get_num_threads()} threads; median of {options.rounds} rounds"
    )
    base_time = statistics.median(times["forward+backward"])
    base_peak = statistics.median(peaks["forward+backward"])
    step_peak = statistics.median(peaks["training step"])
    forward_time = statistics.median(times["forward"])
    print(f"{'':32} {'time s':>7} {'x fwd':>6} {'x fwd+bwd':>9} {'peak MB':>8} {'x fwd+bwd':>9} {'x training':>10}")
    for name in names:
        t, p = statistics.median(times[name]), statistics.median(peaks[name])
        print(
            f"{name:32} {t:7.3f} {t / forward_time:6.2f} {t / base_time:9.2f} {p / 2**20:8.1f} {p / base_peak:9.2f} "
            f"{p / step_peak:10.2f}"
        )


if __name__ == "__main__":
    main()
