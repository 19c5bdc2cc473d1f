"""The repeated-token probe (Olsson et al. 2022): seeded random sequences of ordinary word tokens, each repeated once,
on which induction heads attend from a token of the second copy to the token after its first occurrence, and
duplicate-token heads to that occurrence itself (`scores.rows`, `pipeline.reducers.ProbeStatistics`).
"""

from __future__ import annotations

import re
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.pipeline.tokens import Window

ORDINARY_TOKEN = re.compile(r"^(Ġ|▁)[a-z]{3,}$")  # a space marker and a lowercase word: " house", " river"
PROBE_SEQUENCES = 4
MIN_PROBE_LEN = 3  # with T = 2 the induction target i-(T-1) is the previous token: the probe could not tell them apart


def ordinary_token_ids(tokenizer: Any) -> list[int]:
    """Vocabulary entries that are a space followed by a lowercase word of 3+ letters, in id order."""
    vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return [token_id for token_id, token in enumerate(vocabulary) if token and ORDINARY_TOKEN.match(token)]


def probe_windows(tokenizer: Any, period: int, n_ctx: int, seed: int = 0, count: int = PROBE_SEQUENCES) -> list[Window]:
    """`count` windows of BOS (when the model has one), T = `period` distinct random ordinary tokens, the same T again.

    Seeded, so the probe is the same on every run; distinct tokens make "the earlier occurrence" unambiguous.
    """
    import numpy as np

    prefix = (tokenizer.bos_token_id,) if tokenizer.bos_token_id is not None else ()
    if period < MIN_PROBE_LEN:
        raise AttnscopeError(f"probe period {period}: must be at least {MIN_PROBE_LEN}")
    if len(prefix) + 2 * period > n_ctx:
        bos = "BOS + " if prefix else ""
        raise AttnscopeError(
            f"probe period {period}: {bos}twice the period ({len(prefix) + 2 * period} tokens) must fit the model's "
            f"context of {n_ctx} tokens"
        )
    if seed < 0:
        raise AttnscopeError(f"probe seed {seed}: must be 0 or more")
    candidates = ordinary_token_ids(tokenizer)
    if len(candidates) < period:
        raise AttnscopeError(f"probe period {period}: the vocabulary has only {len(candidates)} ordinary word tokens")
    generator = np.random.default_rng(seed)
    windows = []
    for index in range(count):
        sequence = tuple(int(candidates[k]) for k in generator.choice(len(candidates), size=period, replace=False))
        windows.append(Window(index, prefix + sequence + sequence, 0))
    return windows
