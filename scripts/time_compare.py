"""What `attnscope compare` costs against the single `heads` runs it replaces (docs/compare.md, "Cost").

    python scripts/time_compare.py --device cpu --texts 2 --chars 1500
    python scripts/time_compare.py --device cuda

Saves `--checkpoints` "checkpoints" of a random-weight GPT-2-small-sized model (12 layers × 12 heads, width 768, the
GPT-2 vocabulary of tests/data) into a temporary folder: checkpoint k is a random model moved a share k / (N - 1) of
the way to another (so that heads change role along the way, as in training). Then times, in this process, each
run loading its models from disk as a user's would, in `--repeats` interleaved rounds (each measure's least time
is reported: on a shared machine the least is the one least disturbed):

  (a) `compare` over every checkpoint (no change) against the sum of one `heads` run per checkpoint;
  (b) `compare` of the first two checkpoints with the change (the spool written and read back) against two `heads`
      runs (the goal: at most 1.2 times), and against `compare` of the same two without the change.

The texts are the bundled samples, the first `--texts` of them cut to `--chars` characters (the CPU needs a small
input; the defaults take every sample whole). Prints one JSON line: seconds of each and their ratios, the
device. `--keep DIR` saves the checkpoints there instead (to draw the pictures from them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "tests" / "data" / "gpt2-tokenizer"


def save_checkpoints(folder: Path, count: int, seed: int = 0, **config) -> list[Path]:
    """`count` GPT-2 checkpoints in `folder`/step-NN: a random model moved k / (count - 1) of the way to another."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    settings = dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, initializer_range=0.06)
    settings.update(config)
    torch.manual_seed(seed)
    start = GPT2LMHeadModel(GPT2Config(**settings))
    torch.manual_seed(seed + 1)
    end = GPT2LMHeadModel(GPT2Config(**settings)).state_dict()
    first = {name: value.clone() for name, value in start.state_dict().items()}
    tokenizer = GPT2TokenizerFast.from_pretrained(TOKENIZER)
    paths = []
    for k in range(count):
        share = k / max(count - 1, 1)
        start.load_state_dict({name: (1 - share) * value + share * end[name] for name, value in first.items()})
        path = folder / f"step-{k:02d}"
        start.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths


def demo_checkpoints(folder: Path, count: int, seed: int = 0) -> list[Path]:
    """`count` checkpoints of the bundled demo model's "training": a random model of the demo's shape moved
    k / (count - 1) of the way to the trained demo (its heads' roles form along the way, each at its own step)."""
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from attnscope.models.loading import demo_model_dir

    trained = GPT2LMHeadModel.from_pretrained(demo_model_dir())
    end = {name: value.clone() for name, value in trained.state_dict().items()}
    torch.manual_seed(seed)
    start = GPT2LMHeadModel(trained.config).state_dict()
    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir())
    paths = []
    for k in range(count):
        share = k / max(count - 1, 1)
        trained.load_state_dict({name: (1 - share) * start[name] + share * value for name, value in end.items()})
        path = folder / f"step-{k:02d}"
        trained.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths


def texts(count: int | None, chars: int | None) -> list[str]:
    from attnscope.pipeline.inputs import sample_texts

    chosen = sample_texts()[:count]
    return [text.text[:chars] if chars else text.text for text in chosen]


def timed(call) -> tuple[float, object]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--checkpoints", type=int, default=8)
    parser.add_argument("--texts", type=int, default=None, help="the first N sample texts (default: all)")
    parser.add_argument("--chars", type=int, default=None, help="each cut to this many characters")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each measure's least time is reported")
    parser.add_argument("--init", type=float, default=0.06, help="the weights' standard deviation")
    parser.add_argument("--keep", type=Path, default=None, help="save the checkpoints here, and time nothing")
    parser.add_argument("--demo", action="store_true", help="with --keep: checkpoints from random to the demo model")
    args = parser.parse_args(argv)
    import torch
    from transformers.utils import logging

    import attnscope

    logging.disable_progress_bar()

    size = dict(n_layer=args.layers, n_head=args.heads, n_embd=args.d_model, initializer_range=args.init)
    if args.keep is not None:
        if args.demo:
            paths = demo_checkpoints(args.keep, args.checkpoints)
        else:
            paths = save_checkpoints(args.keep, args.checkpoints, **size)
        print(json.dumps({"saved": [str(path) for path in paths]}))
        return 0
    folder = Path(tempfile.mkdtemp(prefix="attnscope-time-compare-"))
    try:
        paths = [str(path) for path in save_checkpoints(folder, args.checkpoints, **size)]
        inputs = texts(args.texts, args.chars)
        common = dict(device=args.device, dtype="float32")
        attnscope.heads(paths[0], inputs[:1], **common)  # warm-up: imports, kernels, caches
        rounds = []  # interleaved, so that a machine shared with other work slows each measure alike; the least kept
        for _ in range(args.repeats):
            singles = [timed(lambda path=path: attnscope.heads(path, inputs, **common))[0] for path in paths]
            many, result = timed(lambda: attnscope.compare(paths, inputs, divergence=False, **common))
            two, _ = timed(lambda: attnscope.compare(paths[:2], inputs, divergence=True, **common))
            plain, _ = timed(lambda: attnscope.compare(paths[:2], inputs, divergence=False, **common))
            rounds.append((singles, many, two, plain))
        singles = [min(r[0][k] for r in rounds) for k in range(len(paths))]
        many, two, plain = (min(r[k] for r in rounds) for k in (1, 2, 3))
        report = {
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "threads": torch.get_num_threads(),
            "model": f"{args.layers} layers × {args.heads} heads, d_model {args.d_model}",
            "checkpoints": len(paths),
            "texts": len(inputs),
            "tokens": result.inputs["n_tokens"],
            "repeats": args.repeats,
            "heads_runs_s": [round(s, 2) for s in singles],
            "compare_s": round(many, 2),
            "compare_over_heads_runs": round(many / sum(singles), 3),
            "change_two_s": round(two, 2),
            "two_heads_runs_s": round(singles[0] + singles[1], 2),
            "change_over_two_heads_runs": round(two / (singles[0] + singles[1]), 3),
            "two_without_change_s": round(plain, 2),
            "change_over_without": round(two / plain, 3),
        }
        print(json.dumps(report))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
