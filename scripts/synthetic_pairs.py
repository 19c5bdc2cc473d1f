"""Prompt pairs, and a deep random model, to time `attnscope patch` on many pairs (docs/patch.md#cost).

The pairs are the demo's eight (attnscope/sample_texts/demo-pairs.jsonl), each behind a random prefix of the demo
vocabulary's words (a Random seeded --seed): --words 0-12 gives pairs of some 20 lengths, --words 6 of a few. With
--model DIR, a random-weight GPT-2 with the demo's tokenizer is saved there too (--layers 30, --heads 9, --width 72
by default: a 30-layer model of 9 heads as SmolLM2-135M has, narrow enough for a CPU).

    python scripts/synthetic_pairs.py 1000 pairs.jsonl --words 6 [--model deep/]
    OMP_NUM_THREADS=1 attnscope patch --model demo --file pairs.jsonl --json > /dev/null
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "attnscope"
WORDS = "the path and time hold code number size with text has dict type use see for object run".split()


def pairs(count: int, words: tuple[int, int], seed: int) -> list[dict]:
    base = [json.loads(line) for line in (DEMO / "sample_texts" / "demo-pairs.jsonl").read_text().splitlines()]
    generator = random.Random(seed)
    made = []
    for k in range(count):
        pair = dict(base[k % len(base)])
        prefix = " ".join(generator.choice(WORDS) for _ in range(generator.randint(*words)))
        if prefix:
            pair["clean"], pair["corrupt"] = (f"{prefix.capitalize()}. {pair[key]}" for key in ("clean", "corrupt"))
        made.append(pair)
    return made


def deep_model(folder: Path, layers: int, heads: int, width: int) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=layers, n_head=heads, n_embd=width, vocab_size=4096, n_positions=256,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / "demo_model" / name, folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--words", default="0-12", help="the prefix's words: N, or LOW-HIGH")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", type=Path, help="also save a random deep GPT-2 here")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--width", type=int, default=72)
    arguments = parser.parse_args()
    low, _, high = arguments.words.partition("-")
    made = pairs(arguments.count, (int(low), int(high or low)), arguments.seed)
    arguments.out.write_text("".join(json.dumps(pair) + "\n" for pair in made), encoding="utf-8")
    if arguments.model is not None:
        deep_model(arguments.model, arguments.layers, arguments.heads, arguments.width)


if __name__ == "__main__":
    main()
