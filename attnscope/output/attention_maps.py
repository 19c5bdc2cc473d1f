"""One text's attention maps: one head's map (queries × keys, labelled with the tokens or the words), a layer's heads
side by side on one scale, and the reading of an AttentionMap (analyses.maps; by duck typing) into what they draw.
Separate because only these figures have token axes: labels thinned on a long text, and the keys a query cannot see
(a causal or sliding-window mask) drawn grey apart from zero attention. Drawn by `heads --plot` and `show`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from attnscope.output import figures
from attnscope.scores.words import CONTINUED_LEGEND, WORDS

ATTENTION_CMAP = "Blues"
HIDDEN_COLOUR = "#bdbdbd"  # a key the query cannot see: neutral grey, unlike any colour of the maps
HIDDEN_LABEL = "grey: key hidden from the query (mask)"
ATTENTION_LABEL = "attention weight (fraction of the row's attention)"


# ------------------------------------------------------------------------------------------- token axes and hidden keys

TOKEN_CHARACTERS = 14  # a longer token label is cut, with an ellipsis


def _token_label(token: str) -> str:
    return token if len(token) <= TOKEN_CHARACTERS else token[: TOKEN_CHARACTERS - 1] + "…"


def _token_ticks(
    axes, tokens: Sequence[str], side: float, fontsize: float, x: bool = True, y: bool = True
) -> tuple[bool, float]:
    """Label the token axes of a map `side` inches square: every token when they fit at `fontsize`, else every k-th
    with its position (`40 river`), the first and last kept. Returns whether they were thinned, and how many inches
    the longest label takes."""
    n = len(tokens)
    ticks = figures.thinned_ticks(n, figures.labels_that_fit(side, fontsize))
    thinned = len(ticks) < n
    labels = [f"{i} {_token_label(tokens[i])}" if thinned else _token_label(tokens[i]) for i in ticks]
    axes.set_xticks(ticks)
    axes.set_yticks(ticks)
    axes.set_xticklabels(labels if x else [], rotation=90, fontsize=fontsize)
    axes.set_yticklabels(labels if y else [], fontsize=fontsize)
    axes.tick_params(length=2 if thinned else 0)
    return thinned, max(len(label) for label in labels) * 0.6 * fontsize / 72


def _hidden_legend(figure: Figure) -> None:
    """The note that grey cells are keys the query cannot see, at the figure's bottom right."""
    swatch = Patch(facecolor=HIDDEN_COLOUR, edgecolor="#888888", linewidth=0.5, label=HIDDEN_LABEL)
    figure.legend(
        handles=[swatch], loc="lower right", bbox_to_anchor=(0.99, 0.01), fontsize=8, frameon=False, handlelength=1.2
    )


def hidden_keys(maps: np.ndarray, causal: bool) -> np.ndarray:
    """(n, n) bool of one layer's maps (H, n, n): the keys a query cannot see, drawn apart from zero attention.

    Those after the query in a causal model, and those every head of the layer gives exactly 0: a mask's -inf is
    the same for all heads (a sliding window, Mistral's or Gemma's local layers), while a key a head merely ignores
    keeps a weight above 0 in float32 unless its logit is some 100 below the row's largest, in every head at once.
    """
    n = maps.shape[-1]
    hidden = (np.asarray(maps) == 0).all(axis=0)  # (n, n)
    if causal:
        hidden |= np.triu(np.ones((n, n), dtype=bool), k=1)
    return hidden


# ------------------------------------------------------------------------------------------------------- attention maps

ATTENTION_MARGINS = (1.5, 1.4, figures.TITLE_SPACE, 1.7)  # token labels left and bottom, colour bar right, note below
ATTENTION_FONT = 8.0  # points, token labels of one head's map
ATTENTION_MAX = 9.0  # inches: a longer text thins its labels rather than the picture growing further


def attention_side(n_tokens: int) -> float:
    """Inches of the square of one head's map: 0.16 in per token (each labelled at 8 pt) from 4 in to 9 in."""
    return min(max(4.0, 0.16 * n_tokens), ATTENTION_MAX)


def attention_size(n_tokens: int) -> tuple[float, float]:
    """Inches of one head's attention figure."""
    side = attention_side(n_tokens)
    return figures.with_margins((side, side), ATTENTION_MARGINS)


def attention_heatmap(
    attention: np.ndarray,
    tokens: Sequence[str],
    title: str,
    subtitle: str = "",
    hidden: np.ndarray | None = None,
    unit: str = "token",
) -> Figure:
    """One head's attention map (n, n): rows = queries, columns = keys, labelled with the tokens (thinned on a long
    text), or with the words of a word map (`unit` "word"); `hidden` (n, n) bool marks the keys a query cannot
    see, drawn grey."""
    figure = figures.new_figure(attention_size(len(tokens)))
    axes = figures.place_axes(figure, ATTENTION_MARGINS)
    cmap = matplotlib.colormaps[ATTENTION_CMAP].with_extremes(bad=HIDDEN_COLOUR)
    image = axes.imshow(figures.masked(attention, hidden), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="none")
    thinned, _ = _token_ticks(axes, tokens, attention_side(len(tokens)), ATTENTION_FONT)
    figures.add_colour_bar(figure, axes, image, ATTENTION_LABEL)
    where = f"position and {unit}" if thinned else unit
    axes.set_xlabel(f"key: attended to ({where})", fontsize=figures.LABEL_SIZE)
    axes.set_ylabel(f"query: attending ({where})", fontsize=figures.LABEL_SIZE)
    if hidden is not None and hidden.any():
        _hidden_legend(figure)
    figures.add_titles(figure, title, subtitle)
    return figure


def layer_grid_shape(n_head: int) -> tuple[int, int]:
    columns = int(np.ceil(np.sqrt(n_head)))
    return int(np.ceil(n_head / columns)), columns


GRID_FONT = 7.0  # points, token labels of a layer's grid: as small as a printed label may be (TICK_MIN)
GRID_LABEL_SPACE = 1.1  # inches left of and below the panels: token labels and the axis title
GRID_GAP = (0.2, 0.36)  # inches between panels: across, and down (each panel's title)
GRID_RIGHT = 1.3  # the colour bar and its label
GRID_BOTTOM = GRID_LABEL_SPACE + 0.26  # and the note on grey cells


def layer_grid_panel(n_tokens: int) -> float:
    """Inches of each head's square in a layer's grid: 0.6 + 0.1 per token, from 2.5 to 5."""
    return min(max(2.5, 0.6 + 0.1 * n_tokens), 5.0)


def layer_grid_size(n_head: int, n_tokens: int) -> tuple[float, float]:
    rows, columns = layer_grid_shape(n_head)
    panel = layer_grid_panel(n_tokens)
    width = GRID_LABEL_SPACE + columns * panel + (columns - 1) * GRID_GAP[0] + GRID_RIGHT
    height = figures.TITLE_SPACE + GRID_GAP[1] + rows * panel + (rows - 1) * GRID_GAP[1] + GRID_BOTTOM
    return (width, height)


def layer_grid(
    maps: np.ndarray,
    tokens: Sequence[str],
    title: str,
    subtitle: str = "",
    panel_titles: Sequence[str] | None = None,
    hidden: np.ndarray | None = None,
    unit: str = "token",
) -> Figure:
    """Every head of one layer (maps (H, n, n)) side by side on one colour scale, with one colour bar: tokens label
    the first column (queries) and the lowest panel of each column (keys); `hidden` (n, n) bool marks the keys a
    query cannot see, drawn grey."""
    n_head, n = maps.shape[0], len(tokens)
    rows, columns = layer_grid_shape(n_head)
    panel = layer_grid_panel(n)
    figure = figures.new_figure(layer_grid_size(n_head, n))
    width, height = figure.get_size_inches()
    cmap = matplotlib.colormaps[ATTENTION_CMAP].with_extremes(bad=HIDDEN_COLOUR)
    image, thinned, label_inches, panels = None, False, 0.0, []
    for index in range(n_head):
        row, column = divmod(index, columns)
        left = GRID_LABEL_SPACE + column * (panel + GRID_GAP[0])
        bottom = height - figures.TITLE_SPACE - GRID_GAP[1] - (row + 1) * panel - row * GRID_GAP[1]
        axes = figure.add_axes((left / width, bottom / height, panel / width, panel / height))
        image = axes.imshow(figures.masked(maps[index], hidden), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="none")
        lowest = index + columns >= n_head  # nothing below it in its column
        thinned, label_inches = _token_ticks(axes, tokens, panel, GRID_FONT, x=lowest, y=column == 0)
        axes.set_title(panel_titles[index] if panel_titles else f"head {index}", fontsize=9, pad=3)
        panels.append(axes)
    right_column = panels[min(columns, n_head) - 1]
    top, low = panels[0].get_position(), panels[-1].get_position()
    bar = figure.add_axes((right_column.get_position().x1 + 0.15 / width, low.y0, 0.18 / width, top.y1 - low.y0))
    colour_bar = figure.colorbar(image, cax=bar)
    colour_bar.set_label(ATTENTION_LABEL, fontsize=figures.LABEL_SIZE)
    colour_bar.ax.tick_params(labelsize=8)
    where = f"position and {unit}" if thinned else unit
    away = label_inches + 0.12  # inches from the panels to the axis titles: past the token labels
    figure.text(
        (GRID_LABEL_SPACE + (columns * panel + (columns - 1) * GRID_GAP[0]) / 2) / width,
        max(0.05, low.y0 * height - away) / height,
        f"key: attended to ({where})",
        ha="center",
        va="top",
        fontsize=figures.LABEL_SIZE,
    )
    figure.text(
        max(0.05, GRID_LABEL_SPACE - away) / width,
        (low.y0 + top.y1) / 2,
        f"query: attending ({where})",
        ha="right",
        va="center",
        rotation=90,
        fontsize=figures.LABEL_SIZE,
    )
    if hidden is not None and hidden.any():
        _hidden_legend(figure)
    figures.add_titles(figure, title, subtitle)
    return figure


# ------------------------------------------------------------------------------------------------------ one text's maps
# The maps of an AttentionMap (analyses.maps; read by duck typing), drawn by `heads --plot` and `show`.


def map_view(model: dict, attention: Any) -> tuple[np.ndarray, list[str], np.ndarray, str]:
    """An AttentionMap (a layer's maps of one text) as drawn: the maps of its view (H, K, K: tokens, or words),
    their labels as tables show them, the keys no query sees, and the subtitle (the input; what `##` means where
    a label uses it; that the view is by word). The view's unit ("token" or "word") is `map_unit(attention)`."""
    maps, labels = attention.shown()  # (H, K, K)
    maps = np.asarray(maps, dtype=np.float32)
    hidden = hidden_keys(maps, model.get("kind") == "decoder")
    subtitle = figures.describe_input(model, text_index=attention.text_index, n_tokens=len(attention.tokens))
    if attention.view == WORDS:
        subtitle += f", by word ({len(labels)}): to a word, the sum over its tokens; from a word, their mean"
    elif attention.labels.continued:
        subtitle += f"; {CONTINUED_LEGEND}"
    return maps, labels, hidden, subtitle


def head_attention(model: dict, attention: Any, head: int, title: str | None = None) -> Figure:
    """One head's map from an AttentionMap, in its view (tokens or words)."""
    maps, labels, hidden, subtitle = map_view(model, attention)
    title = title or f"Attention of head {attention.layer}.{head}"
    return attention_heatmap(maps[head], labels, title, subtitle, hidden, map_unit(attention))


def map_unit(attention: Any) -> str:
    return "word" if attention.view == WORDS else "token"
