"""The error of `circuit --method gradient` against exact removal, for docs/circuit.md.

For every head B of layer 1 and every per-head score, and every head A of layer 0: the exact change of B's score
when A is removed (A's slice of W_O zeroed in a copy of the model, the heads analysis run again), against the
estimate of attribution patching (steps 0) and of integrated gradients (steps 4). Models: the bundled demo (its
sample texts), the tests' tiny random-weight Llama (grouped-query attention; the tests' texts), and the last
checkpoint of the tests' induction run (tests.support.train_induction_checkpoints: trained ~30-50 s here first;
texts of its words).

    OMP_NUM_THREADS=1 python scripts/measure_circuit_gradient.py
"""

from __future__ import annotations

import copy
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
from attnscope.pipeline.inputs import Text, sample_texts  # noqa: E402
from attnscope.scores import catalog  # noqa: E402
from tests.support import (  # noqa: E402
    FAMILY_TEXTS,
    INDUCTION_WORDS,
    TEXTS,
    build_family_model,
    train_induction_checkpoints,
)


def without(loaded, layer, head):
    removed = copy.deepcopy(loaded)
    projection = removed.family.output_projections(removed.model)[layer]
    part = slice(head * loaded.d_head, (head + 1) * loaded.d_head)
    with torch.no_grad():
        if type(projection).__name__ == "Conv1D":
            projection.weight[part] = 0
        else:
            projection.weight[:, part] = 0
    return removed


def measure(name, loaded, texts):
    settings = Heads()
    scores = [score.name for score in catalog.scores_for(loaded.kind.name) if score.per_head]
    explained = [(1, head, score) for head in range(loaded.n_head) for score in scores]
    timings = {}
    start = time.perf_counter()
    values, linear = gradient_changes(loaded, texts, explained, settings, ablation="zero")
    timings["gradient"] = time.perf_counter() - start
    start = time.perf_counter()
    _, integrated = gradient_changes(loaded, texts, explained, settings, steps=4, ablation="zero")
    timings["gradient, steps 4"] = time.perf_counter() - start
    exact = np.zeros(linear.shape)
    start = time.perf_counter()
    for head in range(loaded.n_head):
        result = settings.run(without(loaded, 0, head), texts)
        by_head = {(record.layer, record.head): record.scores for record in result.heads}
        for k, (layer, b, score) in enumerate(explained):
            exact[k, 0, head] = by_head[layer, b][score] - values[k]
    timings["exact"] = time.perf_counter() - start
    rows = []
    for method, estimate in (("gradient", linear), ("gradient, steps 4", integrated)):
        for score in [*scores, "all"]:
            picked = [k for k, item in enumerate(explained) if score in ("all", item[2])]
            g, x = estimate[picked, 0].ravel(), exact[picked, 0].ravel()
            corr = np.corrcoef(g, x)[0, 1] if g.std() > 0 and x.std() > 0 else float("nan")
            top = [
                set(np.argsort(-np.abs(estimate[k, 0]), kind="stable")[:3])
                == set(np.argsort(-np.abs(exact[k, 0]), kind="stable")[:3])
                for k in picked
            ]
            big = np.abs(x) > 0.05
            sign = f"{np.mean(np.sign(g[big]) == np.sign(x[big])):.2f} of {big.sum()}" if big.any() else "-"
            rows.append(
                f"| {name} | {method} | {score} | {len(g)} | {np.abs(x).mean():.4f} | {np.abs(g - x).mean():.4f} | "
                f"{np.abs(g - x).max():.4f} | {corr:.2f} | {sign} | {np.mean(top):.2f} |"
            )
    inductive = [k for k, item in enumerate(explained) if item[2] == "induction"]
    detail = [
        f"{name} {explained[k][0]}.{explained[k][1]} induction {values[k]:.3f}: exact {np.round(exact[k, 0], 3)}, "
        f"gradient {np.round(linear[k, 0], 3)}, steps 4 {np.round(integrated[k, 0], 3)}"
        for k in inductive
    ]
    return rows, timings, detail


def main() -> None:
    torch.manual_seed(0)
    header = (
        "| model | method | score | pairs | mean abs(exact) | mean abs error | max error | correlation | "
        "sign where abs(exact) > 0.05 | top-3 agree |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    print(header)
    details, costs = [], []
    folder = Path(tempfile.mkdtemp())
    build_family_model("llama", folder / "llama")
    trained = train_induction_checkpoints(folder / "induction")[-1]
    generator = np.random.default_rng(0)
    word_texts = [Text(" ".join(generator.choice(INDUCTION_WORDS, size=40)), f"w{k}") for k in range(4)]
    for name, loaded, texts in (
        ("demo", load_model("demo", "cpu"), sample_texts()),
        ("tiny Llama", load_model(str(folder / "llama"), "cpu"), [*TEXTS, *FAMILY_TEXTS]),
        (f"induction run, {trained.name}", load_model(str(trained), "cpu"), word_texts),
    ):
        rows, timings, detail = measure(name, loaded, texts)
        print("\n".join(rows))
        details += detail
        costs.append(f"{name}: " + ", ".join(f"{method} {seconds:.2f} s" for method, seconds in timings.items()))
    print("\n".join(["", *details, "", *costs]))


if __name__ == "__main__":
    main()
