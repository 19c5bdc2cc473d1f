"""Which key/value heads need the whole past, and which a streaming cache serves (`attnscope kvplan`).

DuoAttention (Xiao et al. 2024, mit-han-lab/duo-attention) keeps a full KV cache for some heads ("retrieval heads")
and gives every other head ("streaming heads") the first S tokens (the attention sink) and the last R tokens (the
recent window) alone; kvpress's `DuoAttentionPress` (NVIDIA/kvpress) applies the same plans. DuoAttention finds its
heads by training a gate per KV head; this command measures instead what a streaming head would lose.

**The score** of query head h of layer l is its mean attention on the keys a streaming cache drops: for a causal
row i, the keys S <= j <= i - R (after the sink, before the recent window),

    score[l, h] = mean over scored rows i of  Σ_{S <= j <= i - R} A[l, h, i, j]

over the rows with i >= S + R (the rows that have such keys, in every window of the texts; shorter windows are not
run at all): 0 for a head that never looks past its sink and recent window, 1 for one that never looks inside them
(`pipeline.reducers.DistantAttention`: exact sums of the capture's per-row sums, `Reducer.summed_keys`, block by
block or tile by tile, no (n × n) map held).

**A KV head's score** is the largest of its query heads' (grouped-query attention: query head h reads KV head
h // (H / H_kv)): the cache is shared, so if any query head of the group needs the distant past, the group's cache
must keep it.

**The plan**: the floor(F × N) KV heads of the N with the lowest scores become streaming (F = --streaming, as
written: 0.29 of 100 heads is 29), ties broken by layer, then KV head; the others keep the full cache. Scores are
ranked as the JSON writes them (6 decimals), so the plan follows from kvplan.json alone.

**The memory** at T = --context tokens, with b bytes per element of the model's dtype and d_head per head:

    full = Σ_layers 2 · H_kv · d_head · P_full · b          plan = Σ_layers 2 · d_head · b · (full heads · P_full
                                                                                           + streaming heads · P_stream)

with P_full = T (min(T, W) in a layer that already slides with its own window W) and P_stream = min(P_full, S + R).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope import settings
from attnscope.analyses.common import Progress, check_finite, input_summary, planned_work, run_windows
from attnscope.analyses.kv_plans import cache_bytes, group_max, plan, ranked, uniform_plan
from attnscope.analyses.result import Result
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.output.kvplan import KvplanView
from attnscope.pipeline import capture
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.passkey import PasskeyPrompt, passkey_prompts
from attnscope.pipeline.reducers import DistantAttention
from attnscope.pipeline.tokens import Window, WindowStream, batches, default_bos, pad_id
from attnscope.scores.catalog import counted

PROBE_SOURCE = "probe: passkey prompts"
# The probe kvplan reads when it is given no text (docs/kvplan.md, "The probe", measured the choice): DuoAttention's
# kind of data, synthetic passkey retrieval, scored where retrieval happens, at the rows that predict the passkey.
PROBE_PROMPTS = 8
PROBE_SEED = 1  # the probe's passkeys: not those of --check's default seed (0)


@dataclass(repr=False)  # the repr is Result's: a summary
class KvplanResult(Result):
    """Every query head's score (L, H) and every KV head's (L, H_kv), numpy float64 (see the module docstring); the
    plan, `full` (L, H_kv) bool (True: the full cache; False: streaming); each layer's own sliding window (None: it
    sees every earlier key); the memory at the context asked for (bytes, full and with the plan)."""

    view_class = KvplanView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    model: dict[str, Any]
    inputs: dict[str, Any]
    settings: dict[str, Any]
    scores: np.ndarray
    kv_scores: np.ndarray
    full: np.ndarray
    sliding_windows: list[int | None]
    memory: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    fraction: float = 0.5  # the share that streams: --streaming, or the one --check picked for auto
    check: dict[str, Any] | None = None  # --check's accuracies (analyses.kvplan_check.summary), None without it

    @property
    def streaming_count(self) -> int:
        return int((~self.full).sum())

    def ranked(self) -> list[tuple[int, int]]:
        """KV heads (layer, kv_head) in the plan's order: the lowest score first, ties by layer, then KV head; the
        first `streaming_count` are the streaming ones."""
        return ranked(self.kv_scores)


# ------------------------------------------------------------------------------------------------- the texts


def probe_tokens(n_ctx: int, sink: int, recent: int) -> int:
    """The probe's prompt length: PROBE_TOKENS, or twice sink + recent when that is more (so that the needle can lie
    well outside both), at most the model's context."""
    return min(n_ctx, max(settings.PROBE_TOKENS, 2 * (sink + recent)))


def probe_prompts(tokenizer: Any, length: int) -> list[PasskeyPrompt]:
    """The probe: PROBE_PROMPTS passkey prompts of `length` tokens (`pipeline.passkey`), the needle at 1/9, 2/9, …
    8/9 of the filler, passkeys drawn with PROBE_SEED."""
    depths = [k / (PROBE_PROMPTS + 1) for k in range(1, PROBE_PROMPTS + 1)]
    return passkey_prompts(tokenizer, [length], depths, 1, PROBE_SEED)


def probe_windows(prompts: Sequence[PasskeyPrompt], bos: bool, bos_id: int | None) -> list[tuple[Window, range]]:
    """Each prompt as a window, up to the answer's last token but one (the last predicts nothing that is scored),
    without its BOS where `bos` is off; and the rows that predict the answer's tokens."""
    drop = int(not bos and bos_id is not None and prompts[0].ids[0] == bos_id)
    return [
        (Window(index, prompt.ids[drop : prompt.answer[1] - 1], 0),
         range(prompt.answer[0] - 1 - drop, prompt.answer[1] - 1 - drop))
        for index, prompt in enumerate(prompts)
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------------- the analysis


@dataclass
class _Measured:
    """What the texts gave: the capture's notes and the texts' own, the input summary, the longest window."""

    notes: list[str]
    inputs: dict[str, Any]
    longest: int


class Kvplan(settings.Kvplan):
    """Every head's attention outside the sink and the recent window, and the plan (see the module docstring)."""

    def run(
        self, loaded: LoadedModel, texts: Texts | Sequence[Text] | None = None, progress: Progress | None = None
    ) -> KvplanResult:
        """The scores over `texts` (None: the passkey probe), the plan and its memory."""
        self.check_shape(loaded.shape)
        if self.check:  # prompts that test nothing are refused before the scores are measured
            from attnscope.analyses import kvplan_check

            lengths = self.lengths_for(loaded.n_ctx)
            kvplan_check.testing_prompts(
                loaded.tokenizer, lengths, self.trials, self.check_seed, self.sink, self.recent
            )
        kept = self.sink + self.recent
        bos = default_bos(loaded.tokenizer, loaded.kind) if self.bos is None else self.bos
        sums = DistantAttention(loaded.n_layer, loaded.n_head, loaded.device, self.sink, self.recent)
        if texts is None:
            measured = self._probe(loaded, bos, sums, progress)
        else:
            measured = self._texts(loaded, texts, bos, sums, progress)
        if int(sums.row_count) == 0:
            raise AttnscopeError(
                f"no text is longer than sink + recent ({self.sink} + {self.recent} = {kept:,} tokens, --sink and "
                f"--recent; the longest window is {measured.longest:,} tokens, the model's context "
                f"{loaded.n_ctx:,}): no row sees a key a streaming head would drop, so nothing is measured; give "
                "longer texts or a smaller --sink or --recent"
            )
        scores = sums.means().numpy()  # (L, H)
        check_finite(loaded, "attention", scores, range(loaded.n_layer))
        kv_scores = group_max(scores, loaded.n_kv_head)  # (L, H_kv)
        windows = [sums.sliding_windows.get(layer) for layer in range(loaded.n_layer)]
        element_bytes = loaded.dtype.itemsize

        def memory_of(full: np.ndarray) -> tuple[int, int]:  # (full attention's bytes, the plan's) at --context
            return cache_bytes(full, windows, loaded.d_head, element_bytes, self.context, kept)

        fraction, check = self._checked(loaded, kv_scores, memory_of, progress)
        full = plan(kv_scores, fraction)  # (L, H_kv)
        every, planned = memory_of(full)
        memory = {
            "context": self.context,
            "dtype": str(loaded.dtype).removeprefix("torch."),
            "bytes_per_element": element_bytes,
            "full_bytes": every,
            "plan_bytes": planned,
            "ratio": planned / every,
        }
        return KvplanResult(
            model=loaded.info(),
            inputs=measured.inputs,
            settings={
                "streaming": self.streaming,
                "check": self.check,
                "check_lengths": list(self.check_lengths) if self.check_lengths else None,
                "trials": self.trials,
                "check_seed": self.check_seed,
                "curve": self.curve,
                "sink": self.sink,
                "recent": self.recent,
                "context": self.context,
                "batch_size": self.batch_size,
                "max_tokens": self.max_tokens,
            },
            scores=scores,
            kv_scores=kv_scores,
            full=full,
            sliding_windows=windows,
            memory=memory,
            notes=measured.notes + _notes(self, loaded, full, windows, fraction) + _check_notes(check),
            fraction=fraction,
            check=check,
        )

    def planned_work(self, loaded: LoadedModel, texts: Any) -> str | None:
        """--check's passes, when large: each prompt of each task through full attention, then, at every share that
        streams some KV head, through the plan and its random plans."""
        if not self.check:
            return None
        from attnscope.analyses import kvplan_check

        lengths, total = self.lengths_for(loaded.n_ctx), loaded.n_layer * loaded.n_kv_head
        fractions = kvplan_check.fractions(self.streaming, self.curve)
        streaming = sum(math.floor(fraction * total + 1e-9) > 0 for fraction in fractions)
        per_share = 1 + kvplan_check.RANDOM_PLANS + int(self.curve)  # at most: a uniform plan the plan is costs none
        runs = 1 + streaming * per_share
        made = kvplan_check.testing_prompts(
            loaded.tokenizer, lengths, self.trials, self.check_seed, self.sink, self.recent
        )  # what the check will run: the multi-key needle's only at the lengths that hold it
        per_task = ", ".join(f"{sum(p.task == task for p in made)} {task}" for task in kvplan_check.TASKS)
        auto = " instead of auto" if self.streaming == "auto" else ""
        return planned_work(
            loaded.model,
            runs * len(made),
            runs * sum(prompt.length for prompt in made),
            f"--check runs {counted(len(made), 'prompt')} ({counted(len(lengths), 'length')} × "
            f"{counted(len(kvplan_check.DEPTHS), 'depth')} × {counted(self.trials, 'trial')} per task: {per_task}) "
            f"{runs} times (full attention, then "
            f"{counted(streaming, 'share')} × (the plan + {kvplan_check.RANDOM_PLANS} random plans"
            f"{' + the uniform-by-layer plan' if self.curve else ''}))",
            f"shorter --check-lengths (now {','.join(map(str, lengths))}), fewer --trials, or one --streaming "
            f"share{auto} make it smaller",
        )

    def _checked(
        self, loaded: LoadedModel, kv_scores: np.ndarray, memory_of: Any, progress: Progress | None
    ) -> tuple[float, dict[str, Any] | None]:
        """The share that streams (--streaming, or the one --check's auto picks) and the check's summary (None
        without --check), each share with the KV cache its plans hold at --context (`memory_of(full)`: full
        attention's bytes and the plan's), as a share of full attention's."""
        if not self.check:
            return float(self.streaming), None
        from attnscope.analyses import kvplan_check

        lengths = self.lengths_for(loaded.n_ctx)
        auto = self.streaming == "auto"
        fractions = kvplan_check.fractions(self.streaming, self.curve)
        checked = kvplan_check.check_plans(
            loaded,
            lambda share: plan(kv_scores, share),
            fractions,
            self.sink,
            self.recent,
            lengths,
            self.trials,
            self.check_seed,
            progress,
            uniform_of=(lambda share: uniform_plan(kv_scores, share)) if self.curve else None,
        )
        fraction = kvplan_check.chosen_share(checked) if auto else float(self.streaming)
        summary = kvplan_check.summary(checked, fraction, lengths, self.trials, self.check_seed, auto)
        for share in summary["shares"]:
            every, planned = memory_of(plan(kv_scores, share["streaming"]))
            share["memory"] = planned / every
            if share["uniform"] is not None:
                share["uniform_memory"] = memory_of(uniform_plan(kv_scores, share["streaming"]))[1] / every
        return fraction, summary

    def _probe(self, loaded: LoadedModel, bos: bool, sums: DistantAttention, progress: Progress | None) -> _Measured:
        """The passkey probe through the capture, a batch at a time, each prompt scored at its answer's rows."""
        import torch

        length = probe_tokens(loaded.n_ctx, self.sink, self.recent)
        try:
            prompts = probe_prompts(loaded.tokenizer, length)
        except AttnscopeError as error:  # a context too short for one passkey prompt
            raise AttnscopeError(
                f"kvplan's passkey probe (no TEXT or --file) cannot fit the model's context of {loaded.n_ctx:,} "
                f"tokens ({error}); give TEXT or --file"
            ) from None
        windows = probe_windows(prompts, bos, loaded.tokenizer.bos_token_id)
        notes: list[str] = []
        tokens = done = 0
        for batch in batches([window for window, _ in windows], self.batch_size, loaded.device,
                             pad_id(loaded.tokenizer), self.max_tokens):  # fmt: skip
            spans = [(windows[index][1].start, windows[index][1].stop) for index in batch.indices]
            sums.spans = torch.tensor(spans, device=loaded.device)  # (B, 2)
            captured = capture.run(loaded.model, [batch], sums, kernel=loaded.kernel)
            notes += [note for note in captured.notes if note not in notes]
            done += len(batch.indices)
            tokens += sum(len(windows[index][0].ids) for index in batch.indices)
            if progress is not None:
                progress(done, tokens, done / len(windows))
        sums.spans = None
        inputs = {
            "n_texts": len(windows),
            "n_windows": len(windows),
            "n_tokens": tokens,
            "bos": bos,
            "sources": [PROBE_SOURCE],
            "probe": {
                "task": "passkey retrieval (pipeline.passkey), scored at the rows that predict the passkey",
                "prompts": len(prompts),
                "length": length,
                "depths": [prompt.depth for prompt in prompts],
                "seed": PROBE_SEED,
            },
            "scored_rows": int(sums.row_count),
        }
        note = (
            f"no text was given: the scores are from the passkey probe, {counted(len(prompts), 'prompt')} of "
            f"{length:,} tokens, each head's attention beyond the sink and the recent window at the rows that "
            "predict the passkey (DuoAttention's kind of data); for a plan to serve with, measure on long texts of "
            "the kind it will serve (TEXT or --file)"
        )
        return _Measured([note, *notes], inputs, max(len(window.ids) for window, _ in windows))

    def _texts(
        self, loaded: LoadedModel, texts: Texts | Sequence[Text], bos: bool, sums: DistantAttention, progress: Any
    ) -> _Measured:
        """The texts' windows through the capture, but those no longer than sink + recent (nothing to measure)."""
        kept = self.sink + self.recent
        windows = WindowStream(loaded, texts, bos)
        short = 0

        def long_enough(window: Window) -> bool:
            nonlocal short
            short += len(window.ids) <= kept
            return len(window.ids) > kept

        captured = run_windows(loaded, windows, sums, self.batch_size, self.max_tokens, progress, select=long_enough)
        notes = windows.notes() + captured.notes
        if short and int(sums.row_count):
            notes.append(
                f"{counted(short, 'window')} of {windows.n_windows:,} no longer than sink + recent ({kept:,} tokens) "
                f"{'was' if short == 1 else 'were'} not run: a streaming cache holds every token of "
                f"{'it' if short == 1 else 'them'}, so there is nothing to measure"
            )
        return _Measured(notes, input_summary(windows, int(sums.row_count)), windows.longest)


def _check_notes(check: dict[str, Any] | None) -> list[str]:
    """What --check found, in one line: full attention's accuracy against the plan's and random plans'."""
    if check is None:
        return []
    share = next(share for share in check["shares"] if share["streaming"] == check["streaming"])
    random = "" if share["random_mean"] is None else f", random plans of the same budget {share['random_mean']:.0%}"
    picked = " (auto: the largest share within full attention's 95 % interval)" if check.get("auto") else ""
    position = check["shares"].index(share)
    by_task = "; ".join(
        f"{task} {part['full']:.0%}, {part['shares'][position]['plan']:.0%}"
        for task, part in check["tasks"].items()
        if part["prompts"]
    )
    note = (
        f"check on {counted(check['prompts'], 'prompt')} ({' and '.join(check['tasks'])}): full attention retrieves "
        f"{check['full']:.0%}, this plan ({share['streaming']:g} streaming{picked}) {share['plan']:.0%}{random} "
        f"(full attention, this plan, by task: {by_task})"
    )
    if check["full"] == 0:
        note += "; full attention retrieves none, so the check cannot tell plans apart on this model"
    elif not check["tells_apart"]:
        note += (
            "; every plan, random ones included, retrieves as full attention does at every share short of all KV "
            "heads, so the check cannot tell plans apart here: give longer --check-lengths or a smaller --sink or "
            "--recent"
        )
    notes = [note]
    for task, part in check["tasks"].items():
        left_out = [length for length in check["lengths"] if length not in part["lengths"]]
        if left_out:
            notes.append(
                f"the {task} task's prompts do not fit in {', '.join(f'{n:,}' for n in left_out)} tokens (its fixed "
                f"parts and one filler take more): it is measured at {', '.join(f'{n:,}' for n in part['lengths'])} "
                "tokens only"
                if part["lengths"]
                else f"the {task} task's prompts fit in no length of --check-lengths"
            )
    if check["prompts_hidden"] < check["prompts"]:
        missed = check["prompts"] - check["prompts_hidden"]
        notes.append(
            f"{counted(missed, 'prompt')} of {check['prompts']} {'holds its' if missed == 1 else 'hold their'} "
            "needle within the sink or the recent window, where a streaming head sees it: "
            f"{'it tests' if missed == 1 else 'they test'} no plan (longer --check-lengths hide every needle)"
        )
    return notes


def _notes(
    analysis: Kvplan, loaded: LoadedModel, full: np.ndarray, windows: list[int | None], fraction: float
) -> list[str]:
    """What to know of the plan: the layers that already slide (and the streaming heads that save nothing there), a
    context the model cannot read, a share that rounds down to no head."""
    notes = []
    kept = analysis.sink + analysis.recent
    sliding = {layer: window for layer, window in enumerate(windows) if window is not None}
    if sliding:
        listed = ", ".join(f"{layer} ({window:,})" for layer, window in sliding.items())
        notes.append(
            f"{counted(len(sliding), 'layer')} already {'slides' if len(sliding) == 1 else 'slide'} with the model's "
            f"own window (layer (tokens): {listed}): keys outside it carry no attention, and a full cache there "
            "holds the window alone"
        )
        useless = sum(int((~full[layer]).sum()) for layer, window in sliding.items() if window <= kept)
        if useless:
            notes.append(
                f"{counted(useless, 'streaming KV head')} {'is' if useless == 1 else 'are'} in layers whose own window "
                f"is no longer than sink + recent ({kept:,} tokens): {'its' if useless == 1 else 'their'} cache is "
                "no smaller for streaming"
            )
    if analysis.context > loaded.n_ctx:
        notes.append(
            f"the memory is at --context {analysis.context:,} tokens, more than the model's context "
            f"({loaded.n_ctx:,} tokens)"
        )
    total = full.size
    if fraction > 0 and full.all():
        notes.append(
            f"streaming {fraction:g} of {counted(total, 'KV head')} rounds down to none (floor): every "
            "head keeps the full cache"
        )
    return notes
