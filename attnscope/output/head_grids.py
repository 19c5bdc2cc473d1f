"""Layer × head grids: one cell per head, rows the layers and columns the heads. The role map (each head coloured by
its role, labelled with its deciding score) and the heatmap of one value per head (a score, an importance, a
fraction of attention) that heads, attend, ablate and compare draw. Separate from the other families because they
share one layout (cells that shrink on a large model, tick labels thinned alike) and nothing else does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from attnscope.output import figures
from attnscope.scores.catalog import ROLE, ROLE_NAMES

GRID_MARGINS = (0.9, 2.2, figures.TITLE_SPACE, 0.7)  # the right margin holds the role legend or the colour bar
GRID_MAX = (12.0, 12.0)  # inches of a layer × head grid at most: a large model's cells shrink instead


def grid_cell(n_layer: int, n_head: int) -> tuple[float, float]:
    """Inches of a cell of a layer × head grid: 0.6 wide and 0.44 high, smaller when the grid would pass GRID_MAX
    (GPT-2 small's 12 × 12 keeps them; GPT-2 XL's 48 layers × 25 heads get 0.48 × 0.25)."""
    return min(0.6, GRID_MAX[0] / n_head), min(0.44, GRID_MAX[1] / n_layer)


def grid_size(n_layer: int, n_head: int) -> tuple[float, float]:
    """Inches of a layer × head figure (role map, score heatmaps)."""
    width, height = grid_cell(n_layer, n_head)
    return figures.with_margins((width * n_head, height * n_layer + 0.3), GRID_MARGINS)


def _grid_axes(figure: Figure, axes, n_layer: int, n_head: int) -> None:
    """Ticks and titles of a layer × head grid: every layer and head labelled while they fit, else every k-th."""
    width, height = axes.get_position().width, axes.get_position().height
    inches = figure.get_size_inches()
    heads = figures.thinned_ticks(n_head, figures.labels_that_fit(width * inches[0], 7))
    layers = figures.thinned_ticks(n_layer, figures.labels_that_fit(height * inches[1], 7))
    axes.set_xticks(heads)
    axes.set_yticks(layers)
    axes.tick_params(labelsize=7)
    axes.set_xlabel("head", fontsize=figures.LABEL_SIZE)
    axes.set_ylabel("layer", fontsize=figures.LABEL_SIZE)


def role_map(roles: Sequence[Sequence[str]], scores: Sequence[Sequence[str]], title: str, subtitle: str = "") -> Figure:
    """One coloured cell per head (rows = layers, columns = heads), labelled `L.H`, role and `scores` (the deciding
    score, as text); the legend lists the roles drawn, in the catalog's order."""
    n_layer, n_head = len(roles), len(roles[0])
    codes = np.array([[ROLE_NAMES.index(role) for role in row] for row in roles])  # (L, H)
    figure = figures.new_figure(grid_size(n_layer, n_head))
    axes = figures.place_axes(figure, GRID_MARGINS)
    colours = ListedColormap([figures.ROLE_COLOURS[role] for role in ROLE_NAMES])
    axes.imshow(codes, cmap=colours, vmin=-0.5, vmax=len(ROLE_NAMES) - 0.5, aspect="auto", interpolation="none")
    fontsize = 6.5 if n_head <= 12 else 5  # `Hnorm 0.72` fits a 0.6 in cell
    if n_head <= 24 and n_layer <= 26:  # beyond, a cell is too small for its three lines
        for layer in range(n_layer):
            for head in range(n_head):
                role = roles[layer][head]
                text = f"{layer}.{head}\n{ROLE[role].short}\n{scores[layer][head]}"
                axes.text(head, layer, text, ha="center", va="center", fontsize=fontsize, color=ROLE[role].ink)
    _grid_axes(figure, axes, n_layer, n_head)
    figures.add_titles(figure, title, subtitle)
    present = {role for row in roles for role in row}
    handles = [Patch(color=figures.ROLE_COLOURS[role], label=role) for role in ROLE_NAMES if role in present]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    return figure


def score_heatmap(
    matrix: np.ndarray,
    title: str,
    colour_label: str,
    subtitle: str = "",
    vmin: float | None = 0.0,
    vmax: float | None = 1.0,
    signed: bool = False,
    cell_text: Sequence[Sequence[str]] | None = None,
    scale: str | None = None,
) -> Figure:
    """A layer × head heatmap of one value with a colour bar labelled `colour_label` (its unit); values (or
    `cell_text`) written in the cells when they fit. Sequential colours from `vmin` to `vmax` (None: from 0, to the
    largest value), or, `signed`, a diverging map centred at 0 whose limits are ± the largest magnitude (at least
    `vmax`); colours from the scale `scale` of output.scales (default: the sequential or the diverging one). Cells
    without a value (NaN) are light grey."""
    n_layer, n_head = matrix.shape
    figure = figures.new_figure(grid_size(n_layer, n_head))
    axes = figures.place_axes(figure, GRID_MARGINS)
    norm = figures.colour_norm(matrix, vmin, vmax, signed)
    scale = scale or (figures.DIVERGING_SCALE if signed else figures.SEQUENTIAL_SCALE)
    cmap = figures.colour_map(scale).with_extremes(bad=figures.MISSING_COLOUR)
    image = axes.imshow(figures.masked(matrix, None), cmap=cmap, norm=norm, aspect="auto", interpolation="none")
    figures.add_colour_bar(figure, axes, image, colour_label)
    if n_layer <= 16 and n_head <= 16:
        for layer in range(n_layer):
            for head in range(n_head):
                value = matrix[layer, head]
                missing = not np.isfinite(value)
                shown = "n/a" if missing else f"{value:.2f}".replace("-0.00", "0.00")  # no -0.00 for a tiny loss
                text = shown if cell_text is None else cell_text[layer][head]
                colour = "black" if missing else figures.ink(cmap(norm(value)))
                axes.text(head, layer, text, ha="center", va="center", fontsize=7, color=colour)
    _grid_axes(figure, axes, n_layer, n_head)
    figures.add_titles(figure, title, subtitle)
    return figure
