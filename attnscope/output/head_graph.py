"""The circuit as a graph: every head a node, one column per layer, coloured by its role; each dependency an arrow
from the earlier head to the later, coloured and as wide as its value. Separate from the matrices of the same
numbers because its layout is a drawing of nodes and arcs, not of cells. Drawn by `circuit`.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from attnscope.output.figures import (
    LABEL_SIZE,
    ROLE_COLOURS,
    SUBTITLE_COLOUR,
    TITLE_SPACE,
    add_titles,
    colour_map,
    labels_that_fit,
    new_figure,
    place_axes,
    thinned_ticks,
    with_margins,
    wrapped,
)
from attnscope.scores.catalog import ROLE, ROLE_NAMES

GRAPH_MARGINS = (0.7, 2.4, TITLE_SPACE, 0.9)  # the legend and the colour bar right, the note below


def head_graph(
    roles: Sequence[Sequence[str]],
    edges: Sequence[tuple[int, int, int, int, float]],
    title: str,
    colour_label: str,
    subtitle: str = "",
    note: str = "",
    scale: str = "score_change",
    marked: Sequence[tuple[int, int]] = (),
) -> Figure:
    """Heads as nodes, one column per layer (head 0 at the top), coloured by role (the catalog's palette); `edges`
    (layer A, head A, layer B, head B, value) as arrows A → B, coloured by `scale` at their value (centred at 0) and
    as wide as its share of the largest magnitude, the strongest drawn last; `marked` heads ringed in black (the
    heads explained). `note` (what was left out) under the graph. GPT-2 small's 144 heads fit in 12 × 7 inches."""
    from matplotlib.patches import FancyArrowPatch

    n_layer, n_head = len(roles), len(roles[0])
    column, row = min(1.0, 11.0 / n_layer), min(0.42, 8.0 / n_head)
    size = with_margins((max(column * n_layer, 3.0), max(row * n_head, 2.0)), GRAPH_MARGINS)
    figure = new_figure(size)
    axes = place_axes(figure, GRAPH_MARGINS)
    axes.set_xlim(-0.5, n_layer - 0.5)
    axes.set_ylim(n_head - 0.5, -0.5)
    largest = max((abs(value) for *_, value in edges), default=1.0) or 1.0
    norm = Normalize(-largest, largest)
    cmap = colour_map(scale)
    for la, ha, lb, hb, value in sorted(edges, key=lambda edge: abs(edge[4])):
        bend = 0.2 if (lb - la) == 1 else 0.06  # arc3's bend grows with the span: long arcs stay inside
        arrow = FancyArrowPatch(
            (la, ha), (lb, hb), connectionstyle=f"arc3,rad={bend if hb >= ha else -bend}", arrowstyle="-|>",
            mutation_scale=6 + 6 * abs(value) / largest, linewidth=0.4 + 3.6 * abs(value) / largest,
            color=cmap(norm(value)), alpha=0.85, shrinkA=6, shrinkB=6, zorder=1,
        )  # fmt: skip
        axes.add_patch(arrow)
    node_size = max(40.0, min(260.0, (72 * min(column, row) * 0.8) ** 2))
    ringed = set(marked)
    fontsize = 6.0 if n_head <= 16 and n_layer <= 16 else 4.5
    for layer in range(n_layer):
        for head in range(n_head):
            role = roles[layer][head]
            axes.scatter(
                [layer], [head], s=node_size, color=ROLE_COLOURS[role], zorder=2,
                edgecolors="black" if (layer, head) in ringed else "#999999",
                linewidths=1.0 if (layer, head) in ringed else 0.4,
            )  # fmt: skip
            if n_head <= 32 and n_layer <= 32:
                axes.text(layer, head, f"{layer}.{head}", ha="center", va="center", fontsize=fontsize,
                          color=ROLE[role].ink, zorder=3)  # fmt: skip
    axes.set_xticks(thinned_ticks(n_layer, labels_that_fit(axes.get_position().width * size[0], 7)))
    axes.set_yticks(thinned_ticks(n_head, labels_that_fit(axes.get_position().height * size[1], 7)))
    axes.tick_params(labelsize=7)
    axes.set_xlabel("layer", fontsize=LABEL_SIZE)
    axes.set_ylabel("head", fontsize=LABEL_SIZE)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    image = matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)
    box = axes.get_position()
    bar = figure.add_axes((box.x1 + 0.15 / size[0], box.y0, 0.15 / size[0], box.height * 0.45))
    colour_bar = figure.colorbar(image, cax=bar)
    colour_bar.set_label(wrapped(colour_label, box.height * size[1] * 0.45, 7.0), fontsize=7.0)
    colour_bar.ax.tick_params(labelsize=7)
    present = {role for row in roles for role in row}
    handles = [Patch(color=ROLE_COLOURS[role], label=role) for role in ROLE_NAMES if role in present]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    if note:
        figure.text(0.5, 0.12 / size[1], wrapped(note, size[0] - 0.4, 7.5), ha="center", va="bottom",
                    fontsize=7.5, color=SUBTITLE_COLOUR)  # fmt: skip
    add_titles(figure, title, subtitle)
    return figure
