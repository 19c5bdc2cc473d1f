#!/usr/bin/env python
"""Train the tiny Llama of tests/data/passkey-model: kvplan's passkey prompts, one KV head never streamed, so that
the model's retrieval head is known (tests.support.train_passkey_model says how; issue 31, item 6). Deterministic:
seeded, one thread; the same weights on every run of the same torch.

    python scripts/train_passkey_model.py            # the command that made tests/data/passkey-model
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support, from a checkout

from tests.support import PASSKEY_MODEL, train_passkey_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PASSKEY_MODEL, help="folder to save the model in")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", default="2,4,2", help="layers,query heads,KV heads (d_head 16)")
    parser.add_argument(
        "--retrieval", default="1.0", help="the KV heads never streamed in training, as layer.head, comma-separated"
    )
    arguments = parser.parse_args()
    start = time.perf_counter()
    shape = tuple(int(part) for part in arguments.shape.split(","))
    retrieval = tuple(tuple(int(part) for part in head.split(".")) for head in arguments.retrieval.split(","))
    train_passkey_model(arguments.out, arguments.steps, arguments.seed, report=100, shape=shape, retrieval=retrieval)
    print(f"saved {arguments.out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
