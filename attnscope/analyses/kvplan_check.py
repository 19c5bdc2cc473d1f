"""`kvplan --check`: a plan proven on passkey retrieval and RULER's multi-key needle before anyone serves with it.

Two tasks (`pipeline.passkey.TASKS`), each at every length of `lengths`, the needle asked for at DEPTHS of the
filler, `trials` prompts each: passkey prompts (a five-digit number hidden in repeated filler, Mohtashami & Jaggi
2023, the test DuoAttention's plans are checked on) and multi-key needle prompts (RULER, Hsieh et al. 2024: four
word-number pairs in the same filler, one asked for, so that a plan cannot pass by keeping one head that copies any
number it finds). A prompt is retrieved when greedy decoding gives its answer (one forward: the next-token argmax at
every answer token). Accuracy, the share retrieved, is measured over both tasks' prompts together, and for each task
apart (`summary`'s `tasks`),

- with full attention;
- at each streaming share F of `fractions`, with the plan's floor(F × N) lowest-scored KV heads streaming: every query
  head that reads them sees only the first `sink` keys and the last `recent` (`pipeline.streaming`, the cache
  DuoAttention's streaming heads keep, block by block: no (n × n) map of a head at 16k tokens);
- with RANDOM_PLANS plans of the same budget, their streaming KV heads drawn at random (numpy, seeded `seed`).

A plan that knows which heads retrieve keeps its accuracy where random plans of the same budget lose theirs.

The depths are 25, 50 and 75 % of the filler: a needle at 0 % sits right after the introduction, within a sink of
128 tokens, and one at 100 % right before the question, within a recent window of 256; a streaming head sees both,
and the check would say nothing about the heads that reach back.

The budget curve (`--curve`, and `auto`): the shares 0, 1/8, … 7/8, each also with the uniform-by-layer plan (as
many streaming KV heads in every layer, `analyses.kvplan.uniform_plan`), the per-layer form engines that size caches
per layer can serve. `auto` takes the largest share whose plan's accuracy lies within full attention's 95 % interval
(Wilson's, over the same prompts).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from attnscope.analyses.common import Progress
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.pipeline.passkey import TASKS, PasskeyPrompt, passkey_results, task_prompts

DEPTHS = (0.25, 0.5, 0.75)
RANDOM_PLANS = 3
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
CURVE_FRACTIONS = tuple(k / 8 for k in range(8))  # the budget curve: 0 to 7/8 of the KV heads streaming


WILSON_Z = 1.959963984540054  # the standard normal's 97.5th percentile: a two-sided 95 % interval


def wilson(successes: int, trials: int, z: float = WILSON_Z) -> tuple[float, float]:
    """The Wilson score interval of a share retrieved (Wilson 1927; Brown, Cai & DasGupta 2001 recommend it for small
    counts, where the normal approximation's p ± z·sqrt(p(1 − p)/n) collapses to a point at 0 and 1): with
    p = successes / trials,

        centre = (p + z²/2n) / (1 + z²/n),   half-width = z·sqrt(p(1 − p)/n + z²/4n²) / (1 + z²/n)

    so 12 of 12 prompts is [0.758, 1], not [1, 1]."""
    p = successes / trials
    scale = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / scale
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / scale
    return max(0.0, centre - half), min(1.0, centre + half)


def fractions(streaming: float | str, curve: bool = False) -> list[float]:
    """The shares the check measures: the curve's eighths (0 to 7/8) for auto and --curve, else FRACTIONS; and the
    share asked for."""
    if streaming == "auto":
        return list(CURVE_FRACTIONS)
    return sorted({*(CURVE_FRACTIONS if curve else FRACTIONS), float(streaming)})


def streaming_query_heads(full: np.ndarray, n_head: int) -> dict[int, list[int]]:
    """layer -> the query heads that read a streaming KV head of the plan `full` (L, H_kv) (query head h reads KV
    head h // (H / H_kv))."""
    group = n_head // full.shape[1]
    return {
        layer: [head for head in range(n_head) if not full[layer, head // group]]
        for layer in range(full.shape[0])
        if not full[layer].all()
    }


def random_plan(shape: tuple[int, int], streaming: int, generator: np.random.Generator) -> np.ndarray:
    """(L, H_kv) bool, True where a KV head keeps the full cache: `streaming` KV heads drawn at random stream."""
    full = np.ones(shape, dtype=bool)
    full.flat[generator.choice(full.size, size=streaming, replace=False)] = False
    return full


def testing_prompts(
    tokenizer: Any, lengths: Sequence[int], trials: int, seed: int, sink: int, recent: int
) -> list[PasskeyPrompt]:
    """The check's prompts of every task (at DEPTHS), refused when none of a task's hides its needle (the one asked
    for) from a streaming head: every plan would then retrieve as full attention does, and the check would pass any
    plan."""
    prompts = task_prompts(tokenizer, lengths, DEPTHS, trials, seed)
    for task in TASKS:
        mine = [prompt for prompt in prompts if prompt.task == task]
        if mine and not any(prompt.hidden_from(sink, recent) for prompt in mine):
            raise AttnscopeError(
                f"none of --check's {len(mine)} {task} prompts ({','.join(map(str, lengths))} tokens) hides its "
                f"{'passkey' if task == 'passkey' else 'needle'} from a streaming head: each needle lies within the "
                f"first {sink} or the last {recent} tokens before the question (--sink, --recent), so every plan "
                "would retrieve as full attention does; give longer --check-lengths or a smaller --sink or --recent"
            )
    return prompts


def check_plans(
    loaded: LoadedModel,
    plan_of: Callable[[float], np.ndarray],
    fractions: Sequence[float],
    sink: int,
    recent: int,
    lengths: Sequence[int],
    trials: int,
    seed: int,
    progress: Progress | None = None,
    uniform_of: Callable[[float], np.ndarray] | None = None,
) -> dict[str, Any]:
    """The check's accuracies (module docstring): the prompts, full attention's, and for each share its plan's, its
    random plans' and, given `uniform_of`, the uniform-by-layer plan's (the curve); the per-prompt outcomes of full
    attention and of every share's plan (for the table by length and depth). `plan_of(F)` and `uniform_of(F)` are
    plans at share F, (L, H_kv) bool, True where a KV head keeps the full cache."""
    if loaded.lm_model is None:
        raise AttnscopeError("--check needs the model's language-model head, and this model has none")
    prompts = testing_prompts(loaded.tokenizer, lengths, trials, seed, sink, recent)
    generator = np.random.default_rng(seed)
    plans = {fraction: plan_of(fraction) for fraction in fractions}  # (L, H_kv) each
    uniform = {fraction: uniform_of(fraction) for fraction in fractions} if uniform_of else {}  # (L, H_kv) each
    runs = 1 + sum(
        1 + RANDOM_PLANS + int(fraction in uniform and not np.array_equal(uniform[fraction], full))
        for fraction, full in plans.items()
        if not full.all()
    )
    done = 0

    def accuracy(full: np.ndarray | None) -> list[bool]:
        nonlocal done
        streaming = None if full is None else streaming_query_heads(full, loaded.n_head)
        outcome = passkey_results(loaded, prompts, streaming, sink, recent)
        done += 1
        if progress is not None:
            progress(done * len(prompts), done * sum(len(prompt.ids) for prompt in prompts), done / runs)
        return outcome

    full_attention = accuracy(None)
    shares = []
    for fraction, full in plans.items():
        count = int((~full).sum())
        if count == 0:  # no head streams: full attention itself
            same = full_attention if fraction in uniform else None
            shares.append({"streaming": fraction, "kv_heads": 0, "plan": full_attention, "random": [], "uniform": same})
            continue
        planned = accuracy(full)
        randoms = [accuracy(random_plan(full.shape, count, generator)) for _ in range(RANDOM_PLANS)]
        layered = None
        if fraction in uniform:  # the plan itself where it streams as many KV heads in every layer
            layered = planned if np.array_equal(uniform[fraction], full) else accuracy(uniform[fraction])
        shares.append(
            {"streaming": fraction, "kv_heads": count, "plan": planned, "random": randoms, "uniform": layered}
        )
    total = next(iter(plans.values())).size if plans else 0
    hidden = sum(prompt.hidden_from(sink, recent) for prompt in prompts)
    return {
        "prompts": prompts, "hidden": hidden, "kv_heads": total, "full": full_attention, "shares": shares,
        "sink": sink, "recent": recent,
    }  # fmt: skip


def tells_apart(checked: dict[str, Any]) -> bool:
    """Whether the check can tell plans apart: at some share where some but not all KV heads stream, the plan or a
    random plan retrieves otherwise than full attention. Where none does, streaming costs nothing at any budget on
    these prompts, and a plan that kept the wrong heads would pass as well as the right one."""
    full = sum(checked["full"])
    return any(
        sum(outcome) != full
        for share in checked["shares"]
        if 0 < share["kv_heads"] < checked["kv_heads"]
        for outcome in (share["plan"], *share["random"])
    )


def within_full_interval(full: Sequence[bool], planned: Sequence[bool]) -> bool:
    """Whether a plan's accuracy lies within full attention's 95 % interval (Wilson's, over the same prompts): no
    lower than its lower end (a plan that retrieves more than full attention does is within it too)."""
    return sum(planned) / len(planned) >= wilson(sum(full), len(full))[0]


def chosen_share(checked: dict[str, Any]) -> float:
    """auto: the largest share whose plan lies within full attention's interval (0 always does)."""
    return max(
        share["streaming"] for share in checked["shares"] if within_full_interval(checked["full"], share["plan"])
    )


def _rate(outcome: Sequence[bool]) -> float:
    return sum(outcome) / len(outcome)


def _share_summary(share: dict[str, Any]) -> dict[str, Any]:
    """One share as the JSON gives it: the plan's accuracy and interval, each random plan's and their mean, the
    uniform-by-layer plan's and its interval (None where the curve was not measured)."""
    randoms, uniform = share["random"], share["uniform"]
    return {
        "streaming": share["streaming"],
        "kv_heads": share["kv_heads"],
        "plan": _rate(share["plan"]),
        "plan_interval": list(wilson(sum(share["plan"]), len(share["plan"]))),
        "random": [_rate(outcome) for outcome in randoms],
        "random_mean": float(np.mean([_rate(outcome) for outcome in randoms])) if randoms else None,
        "uniform": None if uniform is None else _rate(uniform),
        "uniform_interval": None if uniform is None else list(wilson(sum(uniform), len(uniform))),
    }


def _by_prompt(checked: dict[str, Any], chosen: dict[str, Any], lengths: Sequence[int]) -> list[dict[str, Any]]:
    """The accuracy of full attention, of the plan `chosen` and of its random plans, by length and depth."""
    prompts, full, rows = checked["prompts"], checked["full"], []
    for length in lengths:
        for depth in DEPTHS:
            picked = [k for k, prompt in enumerate(prompts) if prompt.length == length and prompt.depth == depth]
            randoms = [outcome[k] for outcome in chosen["random"] for k in picked]
            rows.append(
                {
                    "length": length,
                    "depth": depth,
                    "full": _rate([full[k] for k in picked]),
                    "plan": _rate([chosen["plan"][k] for k in picked]),
                    "random": _rate(randoms) if randoms else None,
                }
            )
    return rows


def summary(
    checked: dict[str, Any], fraction: float, lengths: Sequence[int], trials: int, seed: int, auto: bool = False
) -> dict:
    """The check as the JSON gives it: the settings, full attention's accuracy, each share's (the plan's and each
    random plan's, their mean; the uniform-by-layer plan's on the curve), and for the plan at `fraction` the accuracy
    by length and depth beside full attention's."""
    full = checked["full"]
    chosen = next(share for share in checked["shares"] if share["streaming"] == fraction)
    return {
        "task": f"{' and '.join(TASKS.values())}; greedy decoding, one forward a prompt",
        "lengths": list(lengths),
        "depths": list(DEPTHS),
        "trials": trials,
        "prompts": len(checked["prompts"]),
        "prompts_hidden": checked["hidden"],
        "tells_apart": tells_apart(checked),
        "random_plans": RANDOM_PLANS,
        "seed": seed,
        "full": _rate(full),
        "full_interval": list(wilson(sum(full), len(full))),
        "interval": "Wilson's 95 % interval of each share retrieved, over the prompts",
        "shares": [_share_summary(share) for share in checked["shares"]],
        "curve": any(share["uniform"] is not None for share in checked["shares"]),
        "streaming": fraction,
        "auto": auto,
        "by_prompt": _by_prompt(checked, chosen, lengths),
        "tasks": {task: task_summary(checked, task) for task in TASKS},
    }


def task_summary(checked: dict[str, Any], task: str) -> dict[str, Any]:
    """One task's part of the check: its prompts (and those that hide their needle), full attention's accuracy on
    them and each share's (the plan's, each random plan's, their mean), with Wilson's intervals."""
    picked = [k for k, prompt in enumerate(checked["prompts"]) if prompt.task == task]
    if not picked:  # no length of the check holds the task's prompts
        return {"description": TASKS[task], "lengths": [], "prompts": 0}

    def outcome(outcomes: Sequence[bool]) -> list[bool]:
        return [outcomes[k] for k in picked]

    def rate(outcomes: Sequence[bool]) -> float:
        return sum(outcome(outcomes)) / len(picked)

    full = outcome(checked["full"])
    return {
        "description": TASKS[task],
        "lengths": sorted({checked["prompts"][k].length for k in picked}),
        "prompts": len(picked),
        "prompts_hidden": sum(checked["prompts"][k].hidden_from(checked["sink"], checked["recent"]) for k in picked),
        "full": rate(checked["full"]),
        "full_interval": list(wilson(sum(full), len(full))),
        "shares": [
            {
                "streaming": share["streaming"],
                "plan": rate(share["plan"]),
                "plan_interval": list(wilson(sum(outcome(share["plan"])), len(picked))),
                "random": [rate(random) for random in share["random"]],
                "random_mean": (
                    float(np.mean([rate(random) for random in share["random"]])) if share["random"] else None
                ),
            }
            for share in checked["shares"]
        ],
    }
