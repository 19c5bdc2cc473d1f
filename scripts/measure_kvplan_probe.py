#!/usr/bin/env python
"""Which texts make a KV plan hold (docs/kvplan.md, "The probe"): on a model whose retrieval heads are known, the plan
from each source of scores, its KV heads' scores taken as the largest (max) or the mean of their query heads', judged
by kvplan's own check (`analyses.kvplan_check.check_plans`: every task, every share, random plans of the same budget).

Sources:
- probe: kvplan's default, the passkey probe (no TEXT);
- old probe: what kvplan read before, the bundled sample texts joined again and again to the context;
- filler: a long text with no needle, the passkey prompts' filler alone (text that asks no head to retrieve);
- passkey texts: `sample_texts/passkey-texts.jsonl`, given as --file.

    python scripts/train_passkey_model.py --out /tmp/pk-wide --shape 4,8,2 --retrieval 2.1,3.0
    python scripts/measure_kvplan_probe.py tests/data/passkey-model /tmp/pk-wide
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import attnscope  # noqa: E402
from attnscope.analyses import kvplan_check  # noqa: E402
from attnscope.analyses.kvplan import plan  # noqa: E402
from attnscope.pipeline.inputs import sample_texts  # noqa: E402
from attnscope.pipeline.passkey import FILLER, INTRODUCTION  # noqa: E402


def sources(loaded, sink: int, recent: int) -> dict[str, np.ndarray]:
    """Every source's query-head scores (L, H)."""
    joined = "\n\n".join(text.text for text in sample_texts())
    old = "\n\n".join([joined] * (4 * loaded.n_ctx // max(1, len(joined.split())) + 2))
    filler = INTRODUCTION + FILLER * (loaded.n_ctx // 16)
    given = {"probe": None, "old probe": old, "filler": filler, "passkey texts": None}
    scores = {}
    for name, text in given.items():
        keywords = {"file": str(ROOT / "sample_texts" / "passkey-texts.jsonl")} if name == "passkey texts" else {}
        if text is not None:
            keywords["texts"] = text
        result = attnscope.kvplan(model=loaded, sink=sink, recent=recent, max_tokens=None, **keywords)
        scores[name] = result.scores
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--sink", type=int, default=4)
    parser.add_argument("--recent", type=int, default=16)
    parser.add_argument("--lengths", default="192,256")
    parser.add_argument("--trials", type=int, default=4)
    arguments = parser.parse_args()
    lengths = [int(length) for length in arguments.lengths.split(",")]
    for name in arguments.models:
        loaded = attnscope.load(name)
        print(f"## {name}: {loaded.n_layer} layers × {loaded.n_kv_head} KV heads ({loaded.n_head} query heads)")
        shares = [k / 8 for k in range(1, 8)]
        for source, scores in sources(loaded, arguments.sink, arguments.recent).items():
            grouped = scores.reshape(loaded.n_layer, loaded.n_kv_head, -1)  # (L, H_kv, H / H_kv)
            for how, kv_scores in (("max", grouped.max(-1)), ("mean", grouped.mean(-1))):
                checked = kvplan_check.check_plans(
                    loaded, lambda share, kv=kv_scores: plan(kv, share), shares, arguments.sink, arguments.recent,
                    lengths, arguments.trials, 0,
                )  # fmt: skip
                count = len(checked["full"])
                cells = []
                for share in checked["shares"]:
                    if not share["random"]:
                        continue  # a share that rounds down to no KV head: full attention itself
                    randoms = np.mean([sum(outcome) for outcome in share["random"]])
                    cells.append(f"{share['streaming']:.3g}: {sum(share['plan'])}/{count} (random {randoms:.1f})")
                print(f"{source:13s} {how:4s} full {sum(checked['full'])}/{count} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
