"""The settings of the commands that plan how a model is served: `kvplan` (which key/value heads keep a full cache,
in DuoAttention's format)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape
from attnscope.settings.declare import Settings, optional_setting, setting
from attnscope.settings.groups import Batching, DeviceMap, Place, Reading, Revision

__all__ = ["PROBE_TOKENS", "Kvplan"]

# The length of the passkey prompts kvplan's probe reads when it is given no text (or the model's context, when
# shorter; twice sink + recent when that is longer): the needle at 1/9 … 8/9 of the filler lies well past
# DuoAttention's sink and recent window (128 + 256 tokens); eight such prompts run in minutes on a CPU.
PROBE_TOKENS = 4096
LONGEST_CHECK = 4096  # --check's default longest prompt: a CPU runs it in seconds a prompt on a 1B model


@dataclass(frozen=True, kw_only=True)
class Kvplan(Reading, Batching, Place, Revision, DeviceMap, Settings):
    """`attnscope kvplan`: which key/value heads need the whole past (a full KV cache) and which can keep the first
    `sink` and the last `recent` tokens alone (a streaming cache), as DuoAttention's plan files say it."""

    default_texts: ClassVar[str] = (
        f"a passkey probe, 8 passkey prompts of {PROBE_TOKENS:,} tokens (twice --sink + --recent where that is more; "
        "at most the model's context), scored at the rows that predict the passkey"
    )

    streaming: float | str = setting(
        options.STREAMING,
        0.5,
        "Share of the key/value heads given a streaming cache: those with the least attention outside the sink and "
        "the recent window (floor(F × KV heads) of them); auto: the largest share in eighths whose --check accuracy "
        "lies within full attention's 95 % interval (runs --check and --curve).",
        metavar="F|auto",
    )
    sink: int = setting(
        options.SINK,
        128,
        "First tokens a streaming head keeps (DuoAttention's sink_size; 128 in its published plans).",
        metavar="S",
    )
    recent: int = setting(
        options.RECENT,
        256,
        "Last tokens a streaming head keeps, its own among them (DuoAttention's recent_size; 256 in its published "
        "plans).",
        metavar="R",
    )
    context: int = setting(
        options.CONTEXT,
        32768,
        "Tokens the KV cache is sized for in the memory it reports (full and with the plan).",
        metavar="T",
    )

    check: bool = setting(
        options.FLAG,
        False,
        "Prove the plan before anyone serves with it: passkey retrieval (a number hidden in filler text, at depths "
        "25, 50 and 75 %) and RULER's multi-key needle (4 word-number pairs, one asked for) with full attention, "
        "with this plan's streaming heads narrowed to the sink and the recent window, and with random plans of the "
        "same budget, at streaming shares from 0 to 1 (needs the language-model head).",
    )
    check_lengths: tuple[int, ...] | None = optional_setting(
        options.CHECK_LENGTHS,
        "--check's prompt lengths in tokens (default: the model's context up to 4,096, and half of it).",
        metavar="N,N,...",
    )
    trials: int = setting(options.TRIALS, 2, "--check's prompts per task, length and depth.", metavar="N")
    check_seed: int = setting(options.SEED, 0, "Seed of --check's passkeys, keys and random plans.", metavar="SEED")
    curve: bool = setting(
        options.FLAG,
        False,
        "The budget curve (runs --check): accuracy at every streaming share from 0 to 7/8 for this plan, random plans "
        "and the uniform-by-layer plan (as many streaming KV heads in every layer), drawn against the KV cache's "
        "memory with --out (--streaming auto draws it too).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.streaming == "auto":
            object.__setattr__(self, "curve", True)  # auto is chosen on the curve
        if self.curve:
            object.__setattr__(self, "check", True)  # the curve is the check's

    @property
    def needs_lm_head(self) -> bool:
        return self.check  # the passkey check reads the model's next-token predictions

    def lengths_for(self, n_ctx: int) -> tuple[int, ...]:
        """--check's prompt lengths: --check-lengths, or the model's context up to LONGEST_CHECK tokens and half of
        it."""
        if self.check_lengths:
            return tuple(self.check_lengths)
        longest = min(n_ctx, LONGEST_CHECK)
        return tuple(sorted({longest // 2, longest}))

    def _check_check_lengths(self, n_ctx: int) -> None:
        """--check's prompts must fit the model and be longer than what a streaming head keeps: a prompt no longer
        than sink + recent is whole in every cache, every plan retrieves it as full attention does, and a check of
        such prompts would pass any plan."""
        lengths, kept = self.lengths_for(n_ctx), self.sink + self.recent
        given = "--check-lengths" if self.check_lengths else f"--check-lengths (default {','.join(map(str, lengths))})"
        too_long = [length for length in lengths if length > n_ctx]
        if too_long:
            raise AttnscopeError(
                f"--check-lengths {','.join(map(str, too_long))}: longer than the model's context ({n_ctx:,} tokens)"
            )
        short = [length for length in lengths if length <= kept]
        if short:
            raise AttnscopeError(
                f"{given} {','.join(map(str, short))}: no longer than sink {self.sink} + recent {self.recent} "
                f"(--sink, --recent) = {kept:,} tokens, so a streaming cache keeps every token of such a prompt and "
                f"every plan passes it as full attention does; give --check-lengths above {kept:,} (the model reads "
                f"{n_ctx:,}) or a smaller --sink or --recent"
            )

    def check_shape(self, shape: Shape) -> None:
        if shape.kind_name is not None and shape.kind_name != "decoder":
            raise AttnscopeError(
                f"kvplan plans the KV cache a decoder keeps while it generates; this model is an {shape.kind_name}, "
                "which reads its whole text at once and keeps no KV cache"
            )
        kept = self.sink + self.recent
        if shape.n_ctx is not None and shape.n_ctx <= kept:
            raise AttnscopeError(
                f"sink {self.sink} + recent {self.recent} (--sink, --recent) = {kept:,} tokens hold the model's whole "
                f"context ({shape.n_ctx:,} tokens): a streaming head would keep every token it can see, so there is "
                "nothing to plan; give a smaller --sink or --recent"
            )
        if self.check and shape.n_ctx is not None:
            self._check_check_lengths(shape.n_ctx)
