"""How faithful a circuit is, and the areas of MIB's circuit-localization track (Mueller et al. 2025;
hannamw/MIB-circuit-track, `evaluate_graph.py`'s `evaluate_area_under_curve`). Pure numpy.

A circuit C is the top k edges by score; the model runs with every other edge ablated (its value taken from the
ablated run), and its metric m(C) is set between the model's m(N) and the fully ablated model's m(∅):

    f(C) = (m(C) − m(∅)) / (m(N) − m(∅))                     1: all of the behaviour; 0: none of it

with m the mean over the pairs (a ratio of means, as MIB computes it). Budgets are shares of the graph's edges,
k = ⌊percent / 100 · E⌋ (MIB's `int(pct * n)`): MIB's grid is 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50 and 100 %.

    CPR = Σ_i (x_{i+1} − x_i) (f_i + f_{i+1}) / 2              area under f, edges ranked by signed score
    CMD = Σ_i (x_{i+1} − x_i) (|1 − f_i| + |1 − f_{i+1}|) / 2  area between f and 1, edges ranked by |score|

by the trapezoid rule over the budgets as fractions x = percent / 100, from the first to the last (at most 0.999 on
MIB's grid). Higher CPR is better (the circuit carries the behaviour, its positive edges first); lower CMD is better
(the circuit reproduces the model, neither more nor less).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MIB_PERCENTS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)


def budget_edges(percent: float, n_edges: int) -> int:
    """k = ⌊percent / 100 · E⌋ edges (MIB's int(pct · n)), up to a rounding error of the product."""
    return min(n_edges, math.floor(n_edges * percent / 100 + 1e-9))


def ranked(scores: np.ndarray, absolute: bool) -> np.ndarray:
    """Edge indices from the highest score to the lowest (`absolute`: by |score|), ties in the edges' order."""
    key = np.abs(scores) if absolute else scores
    return np.argsort(-key, kind="stable")


GAP_MIN = 1e-3  # m(N) − m(∅) smaller than this (in the metric's units) leaves f undefined


def faithfulness(circuit: float, full: float, empty: float) -> float:
    """f = (m(C) − m(∅)) / (m(N) − m(∅)); NaN where the model and the empty circuit agree (within GAP_MIN): a ratio
    of two near-zero differences would be a number that means nothing."""
    gap = full - empty
    return (circuit - empty) / gap if abs(gap) >= GAP_MIN else math.nan


def areas(percents: Sequence[float], signed: Sequence[float], absolute: Sequence[float]) -> tuple[float, float]:
    """(CPR, CMD): the area under `signed`'s f and the area between `absolute`'s f and 1, by the trapezoid rule over
    the budgets as fractions (see the module docstring)."""
    x = np.asarray(percents, dtype=np.float64) / 100
    f_signed, f_absolute = np.asarray(signed, dtype=np.float64), np.asarray(absolute, dtype=np.float64)
    widths = np.diff(x)
    cpr = float(np.sum(widths * (f_signed[:-1] + f_signed[1:]) / 2))
    gaps = np.abs(1 - f_absolute)
    cmd = float(np.sum(widths * (gaps[:-1] + gaps[1:]) / 2))
    return cpr, cmd


def smallest_faithful(f: Sequence[float], target: float) -> int:
    """The index of the first budget whose f reaches `target`; the last (the whole graph, f = 1) when none does."""
    for index, value in enumerate(f):
        if value >= target:
            return index
    return len(f) - 1
