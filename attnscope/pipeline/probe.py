"""The repeated-token probe (Olsson et al. 2022): seeded random sequences of ordinary word tokens, each repeated once,
on which induction heads attend from a token of the second copy to the token after its first occurrence, and
duplicate-token heads to that occurrence itself (`scores.rows`, `pipeline.reducers.ProbeStatistics`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.pipeline.tokens import Window

ORDINARY_TOKEN = re.compile(r"^(Ġ|▁)[a-z]{3,}$")  # a space marker and a lowercase word: " house", " river"
PROBE_SEQUENCES = 4
MIN_PROBE_LEN = 3  # with T = 2 the induction target i-(T-1) is the previous token: the probe could not tell them apart
DEFAULT_PROBE_LEN = 50  # the period when none is asked for (--probe-len), or less where the model cannot hold it
ENCODER_NOTE = "the probes (repeated tokens, needle) measure left-to-right copying; skipped for encoder models"


def ordinary_token_ids(tokenizer: Any) -> list[int]:
    """Vocabulary entries that are a space followed by a lowercase word of 3+ letters, in id order."""
    vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return [token_id for token_id, token in enumerate(vocabulary) if token and ORDINARY_TOKEN.match(token)]


def check_probe(name: str, size: int, minimum: int, what: str, length: int, bos: bool, n_ctx: int, seed: int) -> None:
    """A probe's settings, checked in this order: its `size` (`name`: "probe period", "haystack length") at least
    `minimum`, its window of `length` tokens (BOS, when `bos`, and `what`) within the model's context of `n_ctx`,
    and its seed 0 or more."""
    if size < minimum:
        raise AttnscopeError(f"{name} {size}: must be at least {minimum}")
    if length > n_ctx:
        raise AttnscopeError(
            f"{name} {size}: {'BOS + ' if bos else ''}{what} ({length} tokens) must fit the model's context of "
            f"{n_ctx} tokens"
        )
    if seed < 0:
        raise AttnscopeError(f"probe seed {seed}: must be 0 or more")


def probe_windows(tokenizer: Any, period: int, n_ctx: int, seed: int = 0, count: int = PROBE_SEQUENCES) -> list[Window]:
    """`count` windows of BOS (when the model has one), T = `period` distinct random ordinary tokens, the same T again.

    Seeded, so the probe is the same on every run; distinct tokens make "the earlier occurrence" unambiguous.
    """
    import numpy as np

    prefix = (tokenizer.bos_token_id,) if tokenizer.bos_token_id is not None else ()
    length = len(prefix) + 2 * period
    check_probe("probe period", period, MIN_PROBE_LEN, "twice the period", length, bool(prefix), n_ctx, seed)
    candidates = ordinary_token_ids(tokenizer)
    if len(candidates) < period:
        raise AttnscopeError(f"probe period {period}: the vocabulary has only {len(candidates)} ordinary word tokens")
    generator = np.random.default_rng(seed)
    windows = []
    for index in range(count):
        sequence = tuple(int(candidates[k]) for k in generator.choice(len(candidates), size=period, replace=False))
        windows.append(Window(index, prefix + sequence + sequence, 0))
    return windows


@dataclass(frozen=True)
class Probe:
    """The probe as every analysis runs it (`heads`, `circuit`'s replays and gradient, `report`): its period T, its
    seed and its windows (BOS, T random tokens, the same T again)."""

    period: int
    seed: int
    windows: list[Window]

    @property
    def first_query(self) -> int:
        """The first row scored: the first token of the second copy (after BOS, when any, and the first copy)."""
        return len(self.windows[0].ids) - self.period


def probe_for(model: Any, on: bool, period: int | None, seed: int) -> tuple[Probe | None, list[str]]:
    """The probe of a run with the probe `on` (--probe), at `period` (--probe-len; None: DEFAULT_PROBE_LEN, or what
    the model can hold) and `seed` (--probe-seed), and notes; None where it does not run (off, an encoder, or a model
    that cannot hold even the shortest probe: the notes say which). Built before the texts run, so that a bad period
    or seed stops the command at once."""
    if not on:
        return None, []
    if not model.kind.probe:
        return None, [ENCODER_NOTE]
    notes = []
    if period is None:
        period, note = default_period(model)
        notes += [note] if note else []
        if period is None:
            return None, notes
    return Probe(period, seed, probe_windows(model.tokenizer, period, model.n_ctx, seed)), notes


def default_period(model: Any) -> tuple[int | None, str | None]:
    """The probe's period when none was asked for: DEFAULT_PROBE_LEN, or less where the model's context or its
    vocabulary of ordinary words holds fewer, with a note; None (and why) when not even the shortest probe fits."""
    prefix = 1 if model.tokenizer.bos_token_id is not None else 0
    fits = (model.n_ctx - prefix) // 2
    words = len(ordinary_token_ids(model.tokenizer))
    period = min(DEFAULT_PROBE_LEN, fits, words)
    if period < MIN_PROBE_LEN:
        why = (
            f"the model's context of {model.n_ctx} tokens cannot hold {'BOS + ' if prefix else ''}two copies of "
            f"{MIN_PROBE_LEN} tokens"
            if fits < MIN_PROBE_LEN
            else f"the vocabulary has only {words} ordinary word tokens (a space and a lowercase word), fewer than "
            f"{MIN_PROBE_LEN}"
        )
        return None, f"the repeated-token probe was skipped: {why}; induction and duplicate_token were not measured"
    limit = f"the context of {model.n_ctx} tokens" if fits <= words else f"the {words} ordinary word tokens"
    if period < DEFAULT_PROBE_LEN:
        return period, f"probe period shortened to {period} tokens to fit {limit}"
    return period, None
