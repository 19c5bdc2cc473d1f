"""The cost of `circuit --method gradient` against the naive exact way, for docs/circuit.md.

A GPT-2-small-sized model with random weights (12 layers × 12 heads, d_model 768) and the real GPT-2 tokenizer,
16 texts × 400 tokens of random words. Timed side by side in one run:

- heads: one `attnscope heads` run (texts and probe);
- exact, naive: for every head A of layers 0-10, A's slice of W_O zeroed and `heads` run again (132 runs: every
  head B's every score with A removed);
- gradient: `gradient_changes` for one score (previous_token) of every head (144 scores), and of the 12 heads of
  the last layer only; with steps 4 for the last layer.

    python scripts/time_circuit_gradient.py [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnscope.analyses.circuit_gradient import gradient_changes  # noqa: E402
from attnscope.analyses.heads import Heads  # noqa: E402
from attnscope.models.loading import load_model  # noqa: E402
from attnscope.pipeline.inputs import Text  # noqa: E402
from attnscope.pipeline.probe import ordinary_token_ids  # noqa: E402

TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpt2-tokenizer"


def synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device, function, *args, **kwargs):
    synchronize(device)
    start = time.perf_counter()
    result = function(*args, **kwargs)
    synchronize(device)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--texts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--removals", type=int, default=None, help="time only this many exact removals")
    args = parser.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    folder = Path(tempfile.mkdtemp()) / "gpt2-small-random"
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).save_pretrained(folder)
    tokenizer = GPT2TokenizerFast.from_pretrained(TOKENIZER)
    tokenizer.save_pretrained(folder)
    loaded = load_model(str(folder), args.device)
    device = loaded.device
    words = ordinary_token_ids(tokenizer)
    generator = np.random.default_rng(0)
    texts = [Text(tokenizer.decode(generator.choice(words, size=args.tokens - 1)), f"t{k}") for k in range(args.texts)]
    settings = Heads()
    L, H = loaded.n_layer, loaded.n_head
    result, seconds = timed(device, settings.run, loaded, texts)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'})")
    print(f"heads, one run: {seconds:.2f} s ({result.inputs['n_tokens']} tokens)")
    timed(device, settings.run, loaded, texts)  # warm
    projections = loaded.family.output_projections(loaded.model)
    removals = [(layer, head) for layer in range(L - 1) for head in range(H)][: args.removals]
    start = time.perf_counter()
    for layer, head in removals:
        weight = projections[layer].weight  # Conv1D (in, out): a head owns rows
        kept = weight.data[head * loaded.d_head : (head + 1) * loaded.d_head].clone()
        weight.data[head * loaded.d_head : (head + 1) * loaded.d_head] = 0
        settings.run(loaded, texts)
        weight.data[head * loaded.d_head : (head + 1) * loaded.d_head] = kept
    synchronize(device)
    exact = time.perf_counter() - start
    print(f"exact, naive: {len(removals)} removals, one heads run each: {exact:.2f} s")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    every = [(layer, head, "previous_token") for layer in range(L) for head in range(H)]
    _, seconds = timed(device, gradient_changes, loaded, texts, every, settings, ablation="zero")
    peak = f", peak {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB" if device.type == "cuda" else ""
    print(f"gradient: previous_token of all {len(every)} heads: {seconds:.2f} s{peak}")
    last = [(L - 1, head, "previous_token") for head in range(H)]
    _, seconds = timed(device, gradient_changes, loaded, texts, last, settings, ablation="zero")
    print(f"gradient: previous_token of the {len(last)} heads of layer {L - 1}: {seconds:.2f} s")
    _, seconds = timed(device, gradient_changes, loaded, texts, last, settings, steps=4, ablation="zero")
    print(f"gradient, steps 4: the {len(last)} heads of layer {L - 1}: {seconds:.2f} s")
    inductive = [(L - 1, head, "induction") for head in range(H)]
    _, seconds = timed(device, gradient_changes, loaded, texts, inductive, settings, ablation="zero")
    print(f"gradient: induction (the probe) of the {len(inductive)} heads of layer {L - 1}: {seconds:.2f} s")
    # the machine may be shared: the same things again, interleaved, and their medians
    rounds = {
        "heads run": [],
        "gradient, 144 scores": [],
        "gradient, 12 scores of the last layer": [],
        "gradient, 1 score of the last layer": [],
    }
    for _ in range(3):
        rounds["heads run"].append(timed(device, settings.run, loaded, texts)[1])
        rounds["gradient, 144 scores"].append(
            timed(device, gradient_changes, loaded, texts, every, settings, ablation="zero")[1]
        )
        rounds["gradient, 12 scores of the last layer"].append(
            timed(device, gradient_changes, loaded, texts, last, settings, ablation="zero")[1]
        )
        rounds["gradient, 1 score of the last layer"].append(
            timed(device, gradient_changes, loaded, texts, last[:1], settings, ablation="zero")[1]
        )
    for what, times in rounds.items():
        print(f"interleaved, median of 3: {what}: {np.median(times):.2f} s ({', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
