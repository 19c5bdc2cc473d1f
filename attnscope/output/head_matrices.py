"""Heads × heads matrices, `L.H` on both axes: how alike two heads are (cosine or JS divergence, diversity's), with
the dendrogram of their clustering above it, and any rows × columns of heads (circuit's dependencies and
composition), with missing pairs in grey and lines between layers. Separate because their axes are heads, not
layers or tokens: the matrix grows with the number of heads and its labels thin to a readable pitch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from attnscope.output import figures

MATRIX_MARGINS = (1.0, 1.5, figures.TITLE_SPACE, 1.0)  # the right margin holds the colour bar and its label
DENDROGRAM_HEIGHT = 1.0  # inches above the matrix, when it is drawn in clustered order
DENDROGRAM_GAP = 0.16  # inches between the dendrogram and the matrix
LABEL_PITCH = 0.13  # inches per head that give each head its own label of TICK_MIN (7 pt)
MATRIX_MAX = 40.0  # inches: beyond 307 heads, labels skip heads rather than the picture growing further


def matrix_side(n: int) -> float:
    """Inches of the square of a heads × heads matrix: 0.44 in per head up to 16 in, or LABEL_PITCH per head when
    that is more (GPT-2 small's 144 heads: 18.7 in; GPT-2 medium's 384: 40 in), at most MATRIX_MAX."""
    return max(3.0, min(0.44 * n, 16.0), min(LABEL_PITCH * n, MATRIX_MAX))


def matrix_margins(clustered: bool) -> tuple[float, float, float, float]:
    left, right, top, bottom = MATRIX_MARGINS
    return (left, right, top + (DENDROGRAM_HEIGHT + DENDROGRAM_GAP if clustered else 0.0), bottom)


def head_matrix(
    matrix: np.ndarray,
    labels: Sequence[str],
    title: str,
    colour_label: str,
    subtitle: str = "",
    vmin: float = 0.0,
    vmax: float = 1.0,
    scale: str = figures.SEQUENTIAL_SCALE,
    linkage: np.ndarray | None = None,
    cut: float | None = None,
    linkage_label: str = "",
) -> Figure:
    """A heads × heads matrix (cosine or JS) with `L.H` labels, coloured by `scale` (output.scales) from `vmin` to
    `vmax`, a colour bar labelled `colour_label`, values written in when it is small. With `linkage` (scipy's
    linkage matrix; `matrix` and `labels` in its leaf order), the dendrogram above it, its height axis titled
    `linkage_label`, with a dashed line at `cut` (where clusters are cut)."""
    n, side = len(labels), matrix_side(len(labels))
    clustered = linkage is not None and len(linkage) > 0
    margins = matrix_margins(clustered)
    figure = figures.new_figure(figures.with_margins((side, side), margins))
    axes = figures.place_axes(figure, margins)  # a square the size of the matrix: imshow fills it exactly
    colours = figures.colour_map(scale)
    image = axes.imshow(matrix, cmap=colours, vmin=vmin, vmax=vmax, interpolation="none")
    figures.add_colour_bar(figure, axes, image, colour_label)
    fitting = 0.75 * side * 72 / n  # points: the largest font whose labels do not overlap
    fontsize = max(figures.TICK_MIN, min(8.0, fitting))
    step = int(np.ceil(fontsize / fitting))  # 1 up to MATRIX_MAX / LABEL_PITCH heads
    axes.set_xticks(range(0, n, step))
    axes.set_yticks(range(0, n, step))
    axes.set_xticklabels(labels[::step], rotation=90, fontsize=fontsize)
    axes.set_yticklabels(labels[::step], fontsize=fontsize)
    axes.set_xlabel("head (layer.head)", fontsize=figures.LABEL_SIZE)
    axes.set_ylabel("head (layer.head)", fontsize=figures.LABEL_SIZE)
    if n <= 16:
        norm = Normalize(vmin, vmax)
        for i in range(n):
            for j in range(n):
                colour = figures.ink(colours(norm(matrix[i, j])))
                axes.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6, color=colour)
    if clustered:
        _dendrogram(figure, axes, linkage, n, cut, linkage_label)
    figures.add_titles(figure, title, subtitle)
    return figure


def _dendrogram(figure: Figure, matrix_axes, linkage: np.ndarray, n: int, cut: float | None, label: str) -> None:
    """scipy's dendrogram of `linkage` over the columns of `matrix_axes` (its leaves in the matrix's order)."""
    from scipy.cluster.hierarchy import dendrogram

    box = matrix_axes.get_position()
    height = figure.get_size_inches()[1]
    axes = figure.add_axes((box.x0, box.y1 + 0.1 / height, box.width, (DENDROGRAM_HEIGHT - 0.05) / height))
    dendrogram(linkage, ax=axes, no_labels=True, color_threshold=0, above_threshold_color="#555555", orientation="top")
    axes.set_xlim(0, 10 * n)  # scipy puts leaf k at 10k + 5: the matrix's column k
    axes.set_ylim(0, max(float(np.max(linkage[:, 2])), cut or 0.0) * 1.05 or 1.0)
    axes.set_xticks([])
    axes.tick_params(labelsize=7)
    axes.set_ylabel(label, fontsize=7)
    for side in ("top", "right", "bottom"):
        axes.spines[side].set_visible(False)
    if cut is not None:
        axes.axhline(cut, color="#D55E00", linestyle="--", linewidth=0.8)
        axes.text(10 * n, cut, f"clusters below {cut:g} ", color="#D55E00", fontsize=7, va="bottom", ha="right")
    axes.set_gid("dendrogram")


# -------------------------------------------------------------------------------------------------- heads against heads

PAIR_MARGINS = (1.0, 1.4, figures.TITLE_SPACE, 1.0)  # labels left and below, the colour bar right
PAIR_MAX = 9.0  # inches of a side at most: a large model's cells shrink and its labels thin


def _layer_of(label: str) -> str:
    return label.partition(".")[0]


def pair_matrix(
    matrix: np.ndarray,
    rows: Sequence[str],
    columns: Sequence[str],
    title: str,
    colour_label: str,
    subtitle: str = "",
    scale: str = figures.SEQUENTIAL_SCALE,
    signed: bool = False,
    vmin: float | None = 0.0,
    vmax: float | None = None,
    row_title: str = "head (layer.head)",
    column_title: str = "head (layer.head)",
    centre: float | None = None,
    half_width: float | None = None,
    band: tuple[float, float] | None = None,
    digits: int | None = None,
) -> Figure:
    """A heads × heads matrix of any shape (`rows` × `columns`, `L.H` labels), coloured by `scale` (output.scales):
    with `centre`, from centre − `half_width` to centre + `half_width` (a reference value, such as a random
    baseline, in the middle of a diverging scale); `signed`, centred at 0 to ± the largest magnitude; else from
    `vmin` to `vmax` (None: the largest value). `band` (low, high): a hatched span on the colour bar (the reference's
    spread). Cells without a value (NaN: a pair that does not exist) light grey; thin lines between layers; values
    written in (with `digits` decimals; default 2, 3 around a `centre`) when the matrix is small; labels thinned to
    a readable pitch on a large one."""
    n_rows, n_columns = matrix.shape
    cell = min(0.45, PAIR_MAX / max(n_rows, n_columns, 1))
    figure = figures.new_figure(
        figures.with_margins((max(cell * n_columns, 2.6), max(cell * n_rows, 1.2)), PAIR_MARGINS)
    )
    axes = figures.place_axes(figure, PAIR_MARGINS)
    if centre is not None:
        half = half_width or float(np.nanmax(np.abs(matrix - centre))) or 1.0
        norm = Normalize(centre - half, centre + half)
    else:
        norm = figures.colour_norm(matrix, vmin, vmax, signed)
    digits = digits if digits is not None else 3 if centre is not None else 2
    cmap = figures.colour_map(scale).with_extremes(bad=figures.MISSING_COLOUR)
    image = axes.imshow(figures.masked(matrix, None), cmap=cmap, norm=norm, aspect="auto", interpolation="none")
    colour_bar = figures.add_colour_bar(figure, axes, image, colour_label)
    if centre is not None:
        colour_bar.ax.axhline(centre, color="black", linewidth=0.8)
    if band is not None:
        colour_bar.ax.axhspan(*band, facecolor="none", edgecolor="#333333", hatch="////", linewidth=0.5)
    _head_ticks(figure, axes, rows, columns)
    _layer_lines(axes, rows, columns)
    axes.set_xlabel(column_title, fontsize=figures.LABEL_SIZE)
    axes.set_ylabel(row_title, fontsize=figures.LABEL_SIZE)
    if n_rows <= 16 and n_columns <= 16:
        _write_values(axes, matrix, cmap, norm, digits)
    figures.add_titles(figure, title, subtitle)
    return figure


def _head_ticks(figure: Figure, axes, rows: Sequence[str], columns: Sequence[str]) -> None:
    """The heads' labels on both axes (the columns' upright), as large as the axis's length allows (8 pt at most,
    TICK_MIN at least) and thinned to what fits."""
    box = axes.get_position()
    inches = figure.get_size_inches()
    for count, labels, set_ticks, set_labels, length in (
        (len(columns), columns, axes.set_xticks, axes.set_xticklabels, box.width * inches[0]),
        (len(rows), rows, axes.set_yticks, axes.set_yticklabels, box.height * inches[1]),
    ):
        fontsize = max(figures.TICK_MIN, min(8.0, 0.75 * length * 72 / max(count, 1)))
        ticks = figures.thinned_ticks(count, figures.labels_that_fit(length, fontsize))
        set_ticks(ticks)
        set_labels([labels[k] for k in ticks], fontsize=fontsize)
    for label in axes.get_xticklabels():
        label.set_rotation(90)


def _layer_lines(axes, rows: Sequence[str], columns: Sequence[str]) -> None:
    """A thin line between two columns, or two rows, of heads of different layers."""
    for k in range(1, len(columns)):
        if _layer_of(columns[k]) != _layer_of(columns[k - 1]):
            axes.axvline(k - 0.5, color="#777777", linewidth=0.6)
    for k in range(1, len(rows)):
        if _layer_of(rows[k]) != _layer_of(rows[k - 1]):
            axes.axhline(k - 0.5, color="#777777", linewidth=0.6)


def _write_values(axes, matrix: np.ndarray, cmap, norm: Normalize, digits: int) -> None:
    """Each finite value written in its cell with `digits` decimals (no `-0.00`), in the ink that reads on its
    colour."""
    n_rows, n_columns = matrix.shape
    for i in range(n_rows):
        for j in range(n_columns):
            value = matrix[i, j]
            if np.isfinite(value):
                axes.text(
                    j,
                    i,
                    f"{value:.{digits}f}".replace("-0.00", "0.00"),
                    ha="center",
                    va="center",
                    fontsize=6.5 if digits <= 2 else 6.0,
                    color=figures.ink(cmap(norm(value))),
                )
