"""A circuit of edges between a decoder's components as a graph (`discover`): the embeddings on the left, then each
layer's heads in a column with its MLP beside them, the logits on the right; each edge an arrow coloured by the
input it enters (a head's query, key or value, an MLP's input, the logits), as wide as its share of the largest
|score|, dashed where its score is negative (it works against the answer). Separate from `head_graph` (circuit's
head-to-head dependencies): its nodes are components of several kinds and its edges enter inputs, not heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from attnscope.output.figures import (
    LABEL_SIZE,
    SUBTITLE_COLOUR,
    TITLE_SPACE,
    add_titles,
    new_figure,
    place_axes,
    with_margins,
    wrapped,
)

# Okabe & Ito's colours, distinct under colour-vision deficiencies, one per kind of input; dark grey for the logits
INPUT_COLOURS = {"q": "#0072B2", "k": "#D55E00", "v": "#009E73", "mlp": "#CC79A7", "logits": "#444444"}
INPUT_NAMES = {"q": "query", "k": "key", "v": "value", "mlp": "MLP input", "logits": "logits"}
GRAPH_MARGINS = (0.6, 1.5, TITLE_SPACE, 0.8)  # the legend right, the note below
NODE_COLOUR, FADED_COLOUR = "#333333", "#cccccc"


def positions(n_layer: int, n_head: int, n_kv_head: int) -> dict[str, tuple[float, float]]:
    """Where each node (and key/value head, `L.kvK`) is drawn: x by layer (its heads, then its MLP), y by head."""
    middle = (n_head - 1) / 2
    places = {"embed": (0.0, middle), "logits": (2.0 * n_layer + 1, middle)}
    group = n_head // n_kv_head
    for layer in range(n_layer):
        x = 1.0 + 2 * layer
        for head in range(n_head):
            places[f"{layer}.{head}"] = (x, float(head))
        for kv in range(n_kv_head):  # a key/value head left of the query heads that share it, at their middle
            places[f"{layer}.kv{kv}"] = (x - 0.3, kv * group + (group - 1) / 2)
        places[f"mlp {layer}"] = (x + 1.0, middle)
    return places


def edge_graph(
    n_layer: int,
    n_head: int,
    n_kv_head: int,
    edges: Sequence[tuple[str, str, str | None, float]],
    title: str,
    subtitle: str = "",
    note: str = "",
) -> Figure:
    """The graph of `edges` (from, to, input, score): every component a node (those the edges touch dark and
    labelled, the others faint), every edge an arrow from its source to its target (a key or value edge of a
    grouped-query model to its key/value head), its colour the input's kind, its width its |score| over the
    largest, dashed where the score is negative; the strongest drawn last. `note` under the graph."""
    places = positions(n_layer, n_head, n_kv_head)
    columns, rows = 2 * n_layer + 2, max(n_head, 2)
    size = with_margins((max(0.75 * columns, 4.0), max(0.32 * rows, 2.4)), GRAPH_MARGINS)
    figure = new_figure(size)
    axes = place_axes(figure, GRAPH_MARGINS)
    axes.set_xlim(-0.6, columns - 0.4)
    axes.set_ylim(rows - 0.5, -1.3)  # room above the heads for the layers' names
    axes.axis("off")
    touched = _draw_edges(axes, edges, places)
    _draw_nodes(axes, places, touched, grouped=n_kv_head != n_head, fontsize=6.0 if n_head <= 16 else 4.5)
    for layer in range(n_layer):
        axes.text(1.0 + 2 * layer + 0.5, -0.8, f"layer {layer}", ha="center", va="bottom", fontsize=LABEL_SIZE - 1,
                  color=SUBTITLE_COLOUR)  # fmt: skip
    kinds = [kind for kind in INPUT_COLOURS if kind != "logits" or any(edge[1] == "logits" for edge in edges)]
    handles = [Line2D([], [], color=INPUT_COLOURS[kind], linewidth=2, label=INPUT_NAMES[kind]) for kind in kinds]
    handles.append(Line2D([], [], color="#666666", linewidth=1.5, linestyle="--", label="negative score"))
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False,
                title="edge into", title_fontsize=7)  # fmt: skip
    if note:
        figure.text(0.5, 0.1 / size[1], wrapped(note, size[0] - 0.4, 7.5), ha="center", va="bottom",
                    fontsize=7.5, color=SUBTITLE_COLOUR)  # fmt: skip
    add_titles(figure, title, subtitle)
    return figure


def _draw_edges(
    axes: Any, edges: Sequence[tuple[str, str, str | None, float]], places: dict[str, tuple[float, float]]
) -> set[str]:
    """Every edge an arrow, the weakest first (so that the strongest lie on top): coloured by the input it enters,
    as wide as its share of the largest |score|, dashed where its score is negative; the nodes they touch (a
    grouped model's key and value edges end at their key/value head)."""
    from matplotlib.patches import FancyArrowPatch

    largest = max((abs(score) for *_, score in edges), default=1.0) or 1.0
    touched = set()
    for source, target, kind, score in sorted(edges, key=lambda edge: abs(edge[3])):
        touched.update((source, target))
        colour = INPUT_COLOURS[kind or ("logits" if target == "logits" else "mlp")]
        (xa, ya), (xb, yb) = places[source], places[target]
        arrow = FancyArrowPatch(
            (xa, ya), (xb, yb), connectionstyle=f"arc3,rad={0.12 if yb >= ya else -0.12}", arrowstyle="-|>",
            mutation_scale=5 + 5 * abs(score) / largest, linewidth=0.3 + 3.2 * abs(score) / largest, color=colour,
            linestyle="--" if score < 0 else "-", alpha=0.85, shrinkA=5, shrinkB=5, zorder=1,
        )  # fmt: skip
        axes.add_patch(arrow)
    return touched


def _draw_nodes(
    axes: Any, places: dict[str, tuple[float, float]], touched: set[str], grouped: bool, fontsize: float
) -> None:
    """Every component a node (key/value heads only for a `grouped` model): the `touched` ones dark and labelled,
    the others faint; squares for the embeddings, the logits and the MLPs, diamonds for key/value heads."""
    for name, (x, y) in places.items():
        if ".kv" in name and not grouped:
            continue
        on = name in touched
        marker = "D" if ".kv" in name else ("s" if name in ("embed", "logits") or name.startswith("mlp") else "o")
        area = (260 if marker == "s" else 150) if on else 25
        axes.scatter([x], [y], s=area, marker=marker, color=NODE_COLOUR if on else FADED_COLOUR, zorder=2)
        if on:
            label = name.replace("mlp ", "m").replace("embed", "emb").replace("logits", "out")
            axes.text(x, y, label, ha="center", va="center", fontsize=fontsize, color="white", zorder=3)
