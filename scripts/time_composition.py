"""Time the weight-based scores (`scores.composition`) on random weights of real models' shapes.

    python scripts/time_composition.py                      # GPT-2 small's shape, all of it
    python scripts/time_composition.py --shape llama-7b     # Llama-7B's shape: one layer of readers, extrapolated
    python scripts/time_composition.py --direct-effect      # direct effects on GPT-2 small, against a bare forward

GPT-2 small: 12 layers × 12 heads, d_model 768, d_head 64, vocabulary 50257: composition of every pair, copying of
every head, the random baseline, each timed once in full. Llama-7B: 32 × 32 heads, d_model 4096, d_head 128,
vocabulary 32000: the 507,904 pairs cost 2·10¹⁴ flops, so the script times the factors of one layer and the pairs of
`--writers` writer heads against one layer's 32 readers (× 3 kinds), and extrapolates to every pair (writers of
layer l against readers of every later layer: 32·31/2 · 32 × 32 head pairs). Prints JSON; float32 on the device
given (`--device cuda` for a GPU). With `--direct-effect`: `analyses.direct_effect.direct_effects` on a GPT-2 small
with random weights (GPT-2's tokenizer from tests/data) over 16 texts of 400 tokens, batch 8, against the bare
forward passes of the same batches (SDPA, no hooks).
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
    parser.add_argument("--direct-effect", action="store_true", help="time direct effects instead")
    options = parser.parse_args()
    if options.direct_effect:
        print(json.dumps(time_direct_effects(torch.device(options.device)), indent=2))
        return
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


def time_direct_effects(device: torch.device) -> dict:
    from pathlib import Path

    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    from attnscope.analyses.direct_effect import direct_effects
    from attnscope.models.families import FAMILIES
    from attnscope.models.loading import LoadedModel
    from attnscope.pipeline.inputs import Text
    from attnscope.pipeline.tokens import batches, pad_id

    root = Path(__file__).resolve().parent.parent
    tokenizer = GPT2TokenizerFast.from_pretrained(root / "tests" / "data" / "gpt2-tokenizer")
    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(attn_implementation="eager")).eval().to(device)
    family = next(family for family in FAMILIES if family.name == "GPT-2")
    family.prepare(lm.transformer)
    loaded = LoadedModel("gpt2-random", lm.transformer, tokenizer, device, family, lm_model=lm)
    words = " ".join(path.read_text() for path in sorted((root / "attnscope" / "sample_texts").glob("*.txt"))).split()
    ids = tokenizer(" ".join(words * 60))["input_ids"]
    texts = [Text(tokenizer.decode(ids[400 * i : 400 * (i + 1) - 1]), f"text {i}") for i in range(16)]
    _, direct_s = timed(direct_effects, loaded, texts, batch_size=8)
    result = direct_effects(loaded, texts, batch_size=8)
    from attnscope.pipeline.loss_windows import loss_windows

    windows = loss_windows(loaded, texts, None)[0].windows
    lm.transformer.set_attn_implementation("sdpa")

    def bare():
        with torch.inference_mode():
            for batch in batches(windows, 8, device, pad_id(tokenizer)):
                lm.transformer(input_ids=batch.input_ids, attention_mask=batch.attention_mask)

    _, bare_s = timed(bare)
    return {
        "model": "GPT-2 small, random weights",
        "texts": len(texts),
        "tokens": sum(len(window.ids) for window in windows),
        "predicted": result.predicted,
        "direct_effects_s": direct_s,
        "bare_forward_s": bare_s,
        "threads": torch.get_num_threads(),
        "device": str(device),
    }


if __name__ == "__main__":
    main()
