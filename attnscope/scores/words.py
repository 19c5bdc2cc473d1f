"""Attention between words: token maps summed over a word's keys and averaged over its queries.

A word w is a span of consecutive token positions (pipeline.labels.group_words). For a token map A (rows = queries,
columns = keys, each row a distribution over the keys it sees):

    attention to a word      A[i, w]  = Σ_{j ∈ w} A[i, j]                     (how much of row i lands on w)
    attention from a word    A[w, j]  = (1/|w|) Σ_{i ∈ w} A[i, j]             (the mean of its tokens' rows)
    word map                 A[v, w]  = (1/|v|) Σ_{i ∈ v} Σ_{j ∈ w} A[i, j]

This is inseq's subword aggregation (sum over the attended pieces, mean over the attending ones). Summing keys
keeps a row a distribution: each word row sums to the mean of its tokens' row sums (1 for a softmax; less with
learned sinks). A causal map stays causal by words: a later word's keys all come after every query of an earlier
word. A text of one token per word gives the token map back unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TOKENS, WORDS = "tokens", "words"  # the two views of attention: token by token, or word by word
CONTINUED_LEGEND = "##: a piece that continues the word before it"  # said beside labels that use the mark


def _starts(words: Sequence[range], n: int) -> np.ndarray:
    """The first positions of `words`, checked to be consecutive spans covering 0..n-1 exactly once."""
    expected = 0
    for word in words:
        if word.step != 1 or len(word) == 0 or word.start != expected:
            raise ValueError(f"words must be consecutive, non-empty spans covering positions 0-{n - 1} in order")
        expected = word.stop
    if expected != n:
        raise ValueError(f"the words cover {expected} positions, the map has {n}")
    return np.array([word.start for word in words])


def to_words(rows, words: Sequence[range]) -> np.ndarray:
    """Attention rows (..., n) over token keys -> (..., W) over word keys: each word's keys summed."""
    values = np.asarray(rows, dtype=np.float64)  # (..., n)
    return np.add.reduceat(values, _starts(words, values.shape[-1]), axis=-1)  # (..., W)


def word_map(maps, words: Sequence[range]) -> np.ndarray:
    """A token map (n, n), or a stack of them (..., n, n) such as a layer's heads (H, n, n), as a word map
    (..., W, W): row v is the mean of its tokens' rows, column w the sum of its tokens' columns (float64)."""
    values = np.asarray(maps, dtype=np.float64)  # (..., n, n)
    if values.ndim < 2 or values.shape[-1] != values.shape[-2]:
        raise ValueError(f"a map is square (..., n, n); got shape {values.shape}")
    starts = _starts(words, values.shape[-1])
    sizes = np.array([len(word) for word in words], dtype=np.float64)  # (W,)
    keys = np.add.reduceat(values, starts, axis=-1)  # (..., n, W)
    return np.add.reduceat(keys, starts, axis=-2) / sizes[:, None]  # (..., W, W)
