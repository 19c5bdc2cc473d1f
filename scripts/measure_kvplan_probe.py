#!/usr/bin/env python
"""Which texts make a KV plan hold (docs/kvplan.md, "The probe"): on a model whose retrieval heads are known, the plan
from each source of scores, its KV heads' scores taken as the largest (max) or the mean of their query heads', judged
by kvplan's own check (`analyses.kvplan_check.check_plans`: every task, every share, random plans of the same budget).

Sources:
- probe: kvplan's default, the passkey probe (no TEXT);
- old probe: what kvplan read before, the bundled sample texts joined again and again, one window of the context;
- filler: a text with no needle, the passkey prompts' introduction and filler again and again, one window of the
  context (text that asks no head to retrieve);
- passkey texts: `sample_texts/passkey-texts.jsonl`, given as --file.

    python scripts/train_passkey_model.py --out /tmp/pk-g4 --shape 2,8,2 --retrieval 1.0 --steps 1200   # ~18 min
    python scripts/measure_kvplan_probe.py tests/data/passkey-model /tmp/pk-g4 --trials 2 \
        --retrieval tests/data/passkey-model=1.0 --retrieval /tmp/pk-g4=1.0

(A 3-layer model of 8 query heads over 2 KV heads, `--shape 3,8,2 --retrieval 1.1,2.0`, had not learnt to retrieve
after 800 steps: its answer's loss stayed at ln 10.)
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
from attnscope.analyses.kv_plans import plan, ranked  # noqa: E402
from attnscope.pipeline import capture  # noqa: E402
from attnscope.pipeline.inputs import sample_texts  # noqa: E402
from attnscope.pipeline.passkey import FILLER, INTRODUCTION  # noqa: E402
from attnscope.pipeline.reducers import DistantAttention  # noqa: E402
from attnscope.pipeline.tokens import Window, batches  # noqa: E402


def window_scores(loaded, ids: list[int], sink: int, recent: int) -> np.ndarray:
    """(L, H) the scores of one window of token ids, every row from sink + recent on (kvplan's reducer)."""
    sums = DistantAttention(loaded.n_layer, loaded.n_head, loaded.device, sink, recent)
    capture.run(loaded.model, list(batches([Window(0, tuple(ids), 0)], 1, loaded.device)), sums)
    return sums.means().numpy()


def sources(loaded, sink: int, recent: int) -> dict[str, np.ndarray]:
    """Every source's query-head scores (L, H)."""
    tokenizer = loaded.tokenizer
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]

    def repeated(text: str) -> list[int]:  # BOS, then the text's tokens again and again, to the model's context
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return (bos + ids * (loaded.n_ctx // len(ids) + 1))[: loaded.n_ctx]

    joined = "\n\n".join(text.text for text in sample_texts()) + "\n\n"
    passkey_texts = str(ROOT / "sample_texts" / "passkey-texts.jsonl")
    return {
        "probe": attnscope.kvplan(model=loaded, sink=sink, recent=recent).scores,
        "old probe": window_scores(loaded, repeated(joined), sink, recent),
        "filler": window_scores(loaded, repeated(INTRODUCTION + FILLER), sink, recent),
        "passkey texts": attnscope.kvplan(model=loaded, file=passkey_texts, sink=sink, recent=recent).scores,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--sink", type=int, default=4)
    parser.add_argument("--recent", type=int, default=16)
    parser.add_argument("--lengths", default="192,256")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--sources", default="probe,old probe,filler,passkey texts", help="which, comma-separated")
    parser.add_argument("--retrieval", action="append", default=[], help="MODEL=L.K,L.K: its known retrieval heads")
    arguments = parser.parse_args()
    lengths = [int(length) for length in arguments.lengths.split(",")]
    known = {model: heads.split(",") for model, heads in (given.split("=") for given in arguments.retrieval)}
    for name in arguments.models:
        loaded = attnscope.load(name)
        print(f"## {name}: {loaded.n_layer} layers × {loaded.n_kv_head} KV heads ({loaded.n_head} query heads)")
        shares = [k / 8 for k in range(1, 8)]
        wanted = arguments.sources.split(",")
        for source, scores in sources(loaded, arguments.sink, arguments.recent).items():
            if source not in wanted:
                continue
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
                order = [f"{layer}.{head}" for layer, head in ranked(kv_scores)[::-1]]  # the highest score first
                ranks = ", ".join(f"{head} #{order.index(head) + 1}" for head in known.get(name, []))
                print(f"{source:13s} {how:4s} full {sum(checked['full'])}/{count} | " + " | ".join(cells))
                print(f"{'':18s} ranks (of {len(order)}, highest score first): {ranks or ' '.join(order)}")


if __name__ == "__main__":
    main()
