"""The plan of `attnscope kvplan`, from the KV heads' scores: which KV heads stream, globally (`plan`) or as many in
every layer (`uniform_plan`), and what each plan's KV cache holds (`cache_bytes`). Pure functions of numpy arrays
(analyses.kvplan's docstring gives the rules)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from attnscope.output.documents import DECIMALS


def group_max(scores: np.ndarray, n_kv_head: int) -> np.ndarray:
    """(L, H_kv): each KV head's score, the largest of the scores (L, H) of the query heads that read it (query head
    h reads KV head h // (H / H_kv), as transformers' repeat_kv lays them out)."""
    n_layer, n_head = scores.shape
    return scores.reshape(n_layer, n_kv_head, n_head // n_kv_head).max(axis=-1)


def ranked(kv_scores: np.ndarray) -> list[tuple[int, int]]:
    """Every KV head (layer, kv_head), the lowest score first (as the JSON rounds it), ties by layer, then head."""
    n_layer, n_kv_head = kv_scores.shape
    heads = [(layer, head) for layer in range(n_layer) for head in range(n_kv_head)]
    return sorted(heads, key=lambda lh: (round(float(kv_scores[lh]), DECIMALS), lh))


def streaming_heads(total: int, fraction: float) -> int:
    """floor(F × N), with F as written (its shortest decimal form): 0.29 of 100 is 29, where the float's own
    product, 28.999999999999996, would floor to 28."""
    return math.floor(Fraction(repr(float(fraction))) * total)


def plan(kv_scores: np.ndarray, fraction: float) -> np.ndarray:
    """(L, H_kv) bool, True where a KV head keeps the full cache: all but the floor(F × N) lowest (see `ranked`)."""
    full = np.ones(kv_scores.shape, dtype=bool)
    for layer, head in ranked(kv_scores)[: streaming_heads(kv_scores.size, fraction)]:
        full[layer, head] = False
    return full


def uniform_plan(kv_scores: np.ndarray, fraction: float) -> np.ndarray:
    """(L, H_kv) bool, True where a KV head keeps the full cache: the plan's budget, floor(F × N) streaming KV heads,
    spread as evenly over the layers as it divides (every layer streams floor(count / L), and the count % L layers
    whose next-lowest score is lowest, ties by layer, one more), each layer's lowest scores streaming (ties by KV
    head). The per-layer form of a plan: as many streaming heads in every layer, as engines that size their caches
    per layer keep them."""
    n_layer, n_kv_head = kv_scores.shape
    count = streaming_heads(kv_scores.size, fraction)
    rounded = np.round(kv_scores, DECIMALS)
    order = [
        sorted(range(n_kv_head), key=lambda head, layer=layer: (rounded[layer, head], head)) for layer in range(n_layer)
    ]
    each, extra = divmod(count, n_layer)
    if extra:  # the layers whose next head to stream scores lowest take one more
        after = sorted(range(n_layer), key=lambda layer: (rounded[layer, order[layer][each]], layer))[:extra]
    else:
        after = []
    full = np.ones(kv_scores.shape, dtype=bool)
    for layer in range(n_layer):
        full[layer, order[layer][: each + (layer in after)]] = False
    return full


def cache_bytes(
    full: np.ndarray, windows: Sequence[int | None], d_head: int, element_bytes: int, context: int, kept: int
) -> tuple[int, int]:
    """(full attention's KV cache, the plan's) in bytes at `context` tokens: keys and values (2) of d_head elements
    of `element_bytes` per KV head and position held; a full head holds the `context` positions (or its layer's own
    sliding window, when shorter), a streaming head (`full` False) min(that, `kept` = sink + recent)."""
    every, planned = 0, 0
    for layer, heads in enumerate(full):
        window = windows[layer]
        positions = context if window is None else min(context, window)
        streamed = min(positions, kept)
        per_position = 2 * d_head * element_bytes
        every += per_position * positions * len(heads)
        planned += per_position * (positions * int(heads.sum()) + streamed * int((~heads).sum()))
    return every, planned
