"""Time `attnscope circuit`'s removals against the naive way, side by side in one run, on GPT-2-small-sized random
weights (12 layers × 12 heads, d_model 768): 16 texts × 400 tokens by default, in batches of 8 (the CLI's default).

    python scripts/time_circuit.py --device cuda
    python scripts/time_circuit.py --device cpu --texts 2 --tokens 128 --ablation resample

Both explain every head of layer 1 and above by its row statistics (the probe left out, as bench's methods leave it out)
and remove each head of an earlier layer: 132 removals. `removal` runs each batch once and replays it from each removed
head's layer (`analyses.circuit_replay.removal_pass`); `naive` runs the whole model once per removed head, the head's
output replaced, every layer scored (`analyses.circuit_naive`). `--ablation` (zero, mean: circuit's default, resample)
says what replaces a removed head's output; each way computes its own means and donors, inside its timing (the
replay: one pass for the means, the donors' forward beside each batch; the naive way: every window run alone once).
A small untimed warm-up first; then `--repeats` rounds, each
timing both methods, in alternating order. Prints one JSON line: the median seconds of each, their ratio (the goal is
removal ≤ 0.6 × naive), the ratio of the fastest runs, the ratio of this process's CPU time (on a CPU shared with other
work, steadier than the wall clock: with one thread it counts only this process's work), the largest difference between
their means (they must agree), the device and the shape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def model(device: torch.device, layers: int, heads: int, width: int):
    from transformers import GPT2Config, GPT2Model

    from attnscope.models.families import family_of
    from attnscope.models.loading import LoadedModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, attn_implementation="eager")
    network = GPT2Model(config).to(device).eval()
    family = family_of(config)
    family.prepare(network)
    return LoadedModel("gpt2-small-random", network, None, device, family)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--texts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--ablation", choices=("zero", "mean", "resample"), default="mean")
    parser.add_argument("--seed", type=int, default=0, help="resample's donors")
    args = parser.parse_args()

    from attnscope.analyses.circuit_naive import timed_pass
    from attnscope.pipeline.tokens import Batch

    device = torch.device(args.device)
    loaded = model(device, args.layers, args.heads, args.width)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, loaded.config.vocab_size, (args.texts, args.tokens), generator=generator)
    batches = []
    for start in range(0, args.texts, args.batch_size):
        part = ids[start : start + args.batch_size].to(device)  # (B, n)
        B = part.shape[0]
        lengths = torch.full((B,), args.tokens, device=device)  # (B,) no padding
        batches.append(Batch(list(range(start, start + B)), part, torch.ones_like(part), lengths))

    def timed(naive: bool) -> tuple[float, float, dict]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start, start_cpu = time.perf_counter(), time.process_time()
        means = timed_pass(loaded, batches, naive, args.ablation, args.seed)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, time.process_time() - start_cpu, means

    first = batches[0]  # two windows of 32 tokens: resample needs a donor
    warm = [Batch(first.indices[:2], first.input_ids[:2, :32], first.attention_mask[:2, :32],
                  torch.full((min(2, len(first.indices)),), 32, device=device))]  # fmt: skip
    timed_pass(loaded, warm, False, args.ablation, args.seed)
    timed_pass(loaded, warm, True, args.ablation, args.seed)
    times: dict[str, list[float]] = {"removal": [], "naive": []}
    cpu: dict[str, list[float]] = {"removal": [], "naive": []}  # this process's CPU time: steadier on a shared CPU
    difference = 0.0
    for round_ in range(args.repeats):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        found = {}
        for naive in order:
            seconds, cpu_seconds, means = timed(naive)
            times["naive" if naive else "removal"].append(seconds)
            cpu["naive" if naive else "removal"].append(cpu_seconds)
            found[naive] = means
        for key, removal in found[False].items():
            for name, value in removal.items():  # the layers above the removed head's: the ones a replay scores
                value, other = value[key[0] + 1 :], found[True][key][name][key[0] + 1 :]
                both = torch.isfinite(value) & torch.isfinite(other)
                difference = max(difference, float((value - other)[both].abs().max()) if both.any() else 0.0)
    removal, naive = statistics.median(times["removal"]), statistics.median(times["naive"])
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "threads": torch.get_num_threads(),
                "shape": {"layers": args.layers, "heads": args.heads, "d_model": args.width},
                "texts": args.texts,
                "tokens": args.tokens,
                "batch_size": args.batch_size,
                "repeats": args.repeats,
                "removals": (args.layers - 1) * args.heads,
                "ablation": args.ablation,
                "removal_s": round(removal, 4),
                "naive_s": round(naive, 4),
                "ratio": round(removal / naive, 4),
                "ratio_of_fastest": round(min(times["removal"]) / min(times["naive"]), 4),  # the least disturbed
                "removal_runs_s": [round(t, 4) for t in times["removal"]],
                "naive_runs_s": [round(t, 4) for t in times["naive"]],
                "cpu_time_ratio": round(statistics.median(cpu["removal"]) / statistics.median(cpu["naive"]), 4),
                "largest_difference": difference,
            }
        )
    )


if __name__ == "__main__":
    main()
