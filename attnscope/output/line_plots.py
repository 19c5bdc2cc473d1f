"""Line plots: one or more series of a value against a setting (a layer, a number of heads removed, a head count, a
sequence length), each in its own colour and marker, with the spread of repeated runs as error bars. Separate because
their axes are values, not heads or tokens. Drawn by diversity, ablate, random-mha and bench; bench styles its lines
with the series' colours and markers, and compare's trajectories colour their heads with the same series.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from attnscope.output.figures import LABEL_SIZE, TITLE_SPACE, add_titles, new_figure, place_axes
from attnscope.scores.catalog import PALETTE

LINE_SIZE = (7.0, 4.2)
# The lines of a plot, k-th series: the catalog's role palette (Okabe & Ito's, distinct under colour-vision
# deficiencies; yellow, faint on white, last) and a distinct marker each, so that lines are told apart in grey too.
SERIES_ROLES = ("previous-token", "induction", "local", "duplicate-token", "self", "next-token", "first-token", "broad")
SERIES_COLOURS = tuple(PALETTE[role] for role in SERIES_ROLES)
SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINE_MARGINS = (0.9, 0.3, TITLE_SPACE, 0.65)
LEGEND_FONT = 8.0


def legend_width(names: Sequence[str]) -> float:
    """Inches to the right of a line plot's axes for its legend (none for a single line): the handle and the
    longest name, rounded up to a tenth of an inch."""
    if len(names) < 2:
        return 0.0
    return math.ceil(10 * (0.95 + max(len(name) for name in names) * 0.6 * LEGEND_FONT / 72)) / 10


def line_size(names: Sequence[str]) -> tuple[float, float]:
    """Inches of a line plot of the series `names`."""
    return (LINE_SIZE[0] + legend_width(names), LINE_SIZE[1])


def line_plot(
    x: Sequence[float],
    series: dict[str, Sequence[float | None]],
    xlabel: str,
    ylabel: str,
    title: str,
    subtitle: str = "",
    log_x: bool = False,
    styles: dict[str, dict] | None = None,
    y_top: float | None = None,
    spreads: dict[str, tuple[Sequence[float | None], Sequence[float | None]]] | None = None,
) -> Figure:
    """One or more lines over the same x, with markers; None values are left out. The k-th line takes the k-th of
    SERIES_COLOURS and SERIES_MARKERS unless `styles` gives its matplotlib keywords (color, linestyle, marker) by
    series name. `spreads` gives, by series name, a (low, high) range at each point (the spread of the runs behind
    it), drawn as an error bar in the line's colour; the lines are then moved apart a little along x (each by a
    few percent, on a log axis), so that their bars do not hide one another. The y axis starts at 0 (below it, with
    a line at 0, when a value is negative) and ends at `y_top` when given. The legend (of two lines or more) sits to
    the right of the axes, where it hides no line."""
    extra = legend_width(list(series))
    figure = new_figure(line_size(list(series)))
    axes = place_axes(figure, (LINE_MARGINS[0], LINE_MARGINS[1] + extra, *LINE_MARGINS[2:]))
    lowest, highest = 0.0, 0.0
    for index, (name, values) in enumerate(series.items()):
        dodge = (index - (len(series) - 1) / 2) * 0.025 if spreads else 0.0  # a share of a unit of log2(x), or of x
        shifted = [a * 2**dodge if log_x else a + dodge for a in x]
        style = {
            "color": SERIES_COLOURS[index % len(SERIES_COLOURS)],
            "marker": SERIES_MARKERS[index % len(SERIES_MARKERS)],
            **(styles or {}).get(name, {}),
        }
        drawn = _draw_line(axes, name, shifted, values, style)
        lowest, highest = min([lowest, *drawn]), max([highest, *drawn])
        if spreads and name in spreads:
            highest = max([highest, *_draw_spread(axes, name, shifted, values, spreads[name], style["color"])])
    _x_axis(axes, x, log_x)
    _y_axis(axes, lowest, highest, y_top)
    axes.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    axes.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    axes.tick_params(labelsize=8)
    axes.grid(alpha=0.3)
    if len(series) > 1:
        axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=LEGEND_FONT, frameon=False, handlelength=3.5)
    add_titles(figure, title, subtitle)
    return figure


def _draw_line(axes: Any, name: str, x: Sequence[float], values: Sequence[float | None], style: dict) -> list[float]:
    """One series' line through its points (None values left out); the values drawn."""
    points = [(a, b) for a, b in zip(x, values, strict=True) if b is not None]
    if points:
        axes.plot([p[0] for p in points], [p[1] for p in points], label=name, **style)
    return [p[1] for p in points]


def _draw_spread(
    axes: Any,
    name: str,
    x: Sequence[float],
    values: Sequence[float | None],
    spread: tuple[Sequence[float | None], Sequence[float | None]],
    colour: str,
) -> list[float]:
    """One series' spread, a (low, high) range at each point where it and the value are known, as error bars in
    the line's colour (the bars' lines named `spread:<name>` in an SVG); the highs drawn."""
    low, high = spread
    bars = [(a, b, c, d) for a, b, c, d in zip(x, values, low, high, strict=True) if None not in (b, c, d)]
    if not bars:
        return []
    xs, ys, lows, highs = (np.array(column, dtype=float) for column in zip(*bars, strict=True))
    drawn = axes.errorbar(xs, ys, yerr=[ys - lows, highs - ys], fmt="none", ecolor=colour, elinewidth=1.0, capsize=3)
    drawn.lines[2][0].set_gid(f"spread:{name}")
    return list(highs)


def _x_axis(axes: Any, x: Sequence[float], log_x: bool) -> None:
    """A tick at each x (on a log2 scale with `log_x`), labelled as given (thousands separated)."""
    if log_x:
        axes.set_xscale("log", base=2)
    axes.set_xticks(list(x))
    axes.set_xticklabels([f"{v:,}" if isinstance(v, int) else str(v) for v in x])
    axes.minorticks_off()


def _y_axis(axes: Any, lowest: float, highest: float, y_top: float | None) -> None:
    """The y axis from 0 (from below it, with a line at 0, when a value is negative) to `y_top`, or to some room
    above the highest point (above 0 when every value is below it); thousands separated from 10,000."""
    if lowest < 0:
        axes.axhline(0.0, color="#888888", linewidth=0.8)
        axes.set_ylim(bottom=lowest * 1.1)
    else:
        axes.set_ylim(bottom=0.0)
    if y_top is None:
        y_top = highest * 1.08 if highest > 0 else (-0.1 * lowest if lowest < 0 else 1.0)
    axes.set_ylim(top=y_top)
    if highest >= 10_000:
        axes.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
