"""Time the weight-based scores (`scores.composition`) on random weights of real models' shapes.

    python scripts/time_composition.py                      # GPT-2 small's shape, all of it
    python scripts/time_composition.py --shape llama-7b     # Llama-7B's shape: one layer of readers, extrapolated

GPT-2 small: 12 layers × 12 heads, d_model 768, d_head 64, vocabulary 50257: composition of every pair, copying of
every head, the random baseline, each timed once in full. Llama-7B: 32 × 32 heads, d_model 4096, d_head 128,
vocabulary 32000: the 507,904 pairs cost 2·10¹⁴ flops, so the script times the factors of one layer and the pairs of
`--writers` writer heads against one layer's 32 readers (× 3 kinds), and extrapolates to every pair (writers of
layer l against readers of every later layer: 32·31/2 · 32 × 32 head pairs). Prints JSON; float32 on the device
given (`--device cuda` for a GPU).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from attnscope.scores.composition import (
    composition_scores,
    copying_scores,
    pair_scores,
    random_baseline,
    reader_factors,
    writer_factors,
)

SHAPES = {"gpt2": (12, 12, 768, 64, 50257), "llama-7b": (32, 32, 4096, 128, 32000)}


def timed(function, *args, **kwargs):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = function(*args, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gpt2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--writers", type=int, default=32, help="llama-7b: writer heads timed against one layer")
    options = parser.parse_args()
    L, H, d, k, vocabulary = SHAPES[options.shape]
    device = torch.device(options.device)
    torch.manual_seed(0)

    def normal(*shape):
        return torch.randn(*shape, device=device) / d**0.5

    report = {"shape": options.shape, "device": str(device), "threads": torch.get_num_threads()}
    if options.shape == "gpt2":
        W_Q, W_K, W_V = (normal(L, H, d, k) for _ in range(3))
        W_O = normal(L, H, k, d)
        _, report["composition_s"] = timed(composition_scores, W_Q, W_K, W_V, W_O)
        W_E, W_U = normal(vocabulary, d), normal(d, vocabulary)
        _, report["copying_s"] = timed(copying_scores, W_E, W_V, W_O, W_U)
        _, report["baseline_s"] = timed(random_baseline, d, k)
    else:
        W_Q, W_K, W_V = (normal(H, d, k) for _ in range(3))
        W_O = normal(H, k, d)
        X, writers_s = timed(writer_factors, W_V, W_O)  # one layer's writers
        readers, readers_s = timed(reader_factors, W_Q, W_K, W_V, W_O)
        Y = torch.cat(readers)  # (3H, d, k)
        sample = X.repeat((options.writers + H - 1) // H, 1, 1)[: options.writers]
        _, pairs_s = timed(pair_scores, sample, Y)
        writer_head_layers = L * (L - 1) // 2 * H  # (writer head, later reader layer) products
        report.update(
            writer_factors_per_layer_s=writers_s,
            reader_factors_per_layer_s=readers_s,
            timed_writers=options.writers,
            pairs_timed_s=pairs_s,
            estimated_composition_s=L * (writers_s + readers_s) + pairs_s / options.writers * writer_head_layers,
            flops=6 * k * k * d * (L * (L - 1) // 2) * H * H,
        )
        _, report["baseline_s"] = timed(random_baseline, d, k)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
