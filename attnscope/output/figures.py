"""Pictures (matplotlib): they render what the library computed and compute nothing themselves.

Every drawing function builds and returns a `matplotlib.figure.Figure` (not registered with pyplot: nothing global
changes, a notebook shows it, and it is freed like any object); `save(figure, path, format, dpi)` writes one, and
`render` gives its bytes. Every figure has a fixed size in inches, its axes placed at fixed margins (no tight bounding
box), so a PNG's pixel size is known in advance: the figure's inches × dpi, rounded. SVG and PDF are byte-identical
for the same figure (no date, fixed ids).

Conventions, the same in every figure: a title in words and a subtitle saying the model and the input; a colour bar
with its unit on every heatmap; sequential colours from 0 for values that cannot be negative, a diverging map
centred at 0 for those that can; keys a query cannot see (a causal or sliding-window mask) drawn in grey, apart
from zero attention; token labels thinned to a readable pitch on long texts, the first and last always kept; value
axes from 0.
"""

from __future__ import annotations

import io
import math
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.colors import LinearSegmentedColormap, ListedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import StrMethodFormatter

from attnscope.output import files
from attnscope.output.files import DPI, PICTURE_FORMATS
from attnscope.output.scales import SCALES
from attnscope.scores.catalog import NATS, PALETTE, ROLE, ROLE_NAMES, ROLES, SIGNED, Score
from attnscope.scores.words import CONTINUED_LEGEND, WORDS

ROLE_COLOURS = {role.name: role.colour for role in ROLES}  # the catalog's palette, shared with the terminal
ATTENTION_CMAP = "Blues"
# The colour scales of values (output.scales, shared with the report page and the notebook): sequential from 0,
# diverging for signed values (blue below 0, red above)
SEQUENTIAL_SCALE = "score"
DIVERGING_SCALE = "signed_score"
HIDDEN_COLOUR = "#bdbdbd"  # a key the query cannot see: neutral grey, unlike any colour of the maps
HIDDEN_LABEL = "grey: key hidden from the query (mask)"
MISSING_COLOUR = "#e0e0e0"  # a cell with no value (NaN)
ATTENTION_LABEL = "attention weight (fraction of the row's attention)"
FRACTION_LABEL = "fraction of the row's attention"
SUBTITLE_COLOUR = "#444444"


# -------------------------------------------------------------------------------------------------------------- writing

# Text in vector files as text: TrueType fonts embedded in a PDF (not Type 3), <text> elements in an SVG; and SVG's
# ids from a fixed salt, so that the same figure gives the same bytes.
VECTOR_TEXT = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none", "svg.hashsalt": "attnscope"}


def render(figure: Figure, format: str = "png", dpi: int = DPI) -> bytes:
    """The bytes of `figure` as PNG (`dpi` dots per inch), SVG or PDF; the same figure gives the same bytes (SVG
    and PDF carry no date, and SVG's ids come from a fixed salt). For a paper: a PDF embeds its fonts as TrueType
    (fonttype 42: text a journal's checks accept and a reader can select, where matplotlib's default Type 3 fonts
    are bitmaps to some), and an SVG keeps its text as <text> (editable in Inkscape or Illustrator)."""
    if format not in PICTURE_FORMATS:
        raise ValueError(f"format {format!r}: use one of {', '.join(PICTURE_FORMATS)}")
    metadata = {"png": {}, "svg": {"Date": None}, "pdf": {"CreationDate": None, "ModDate": None}}[format]
    buffer = io.BytesIO()
    inches = figure.get_size_inches()
    if format == "png":
        # Agg truncates inches × dpi to whole pixels, and 4.35 × 100 is 434.99999999999994 in floating point: a
        # quarter pixel more makes the PNG exactly round(inches × dpi) pixels, as documented.
        figure.set_size_inches([(round(side * dpi) + 0.25) / dpi for side in inches])
    try:
        with warnings.catch_warnings(), matplotlib.rc_context(VECTOR_TEXT):
            # A token the font cannot draw (日, 🙂) shows as a box; matplotlib would also warn once per glyph and
            # figure, a screenful of stderr that tells the user nothing the picture does not.
            warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
            figure.savefig(buffer, format=format, dpi=dpi, metadata=metadata)
    finally:
        figure.set_size_inches(inches)
    return buffer.getvalue()


def save(figure: Figure, path: Path | str, format: str | None = None, dpi: int = DPI) -> Path:
    """Write `figure` to `path` (atomically) as `format`, by default the one its suffix names (.png, .svg, .pdf);
    returns the path."""
    path = Path(path)
    suffix = path.suffix.lstrip(".").lower()
    format = format or suffix
    if suffix != format:
        raise ValueError(f"{path.name}: a {format} file must end in .{format}")
    return files.write_atomic(path, render(figure, format, dpi))


# -------------------------------------------------------------------------------------------------------- shared pieces
# Sizes and margins are in inches; a figure's axes are placed at fixed margins, so nothing depends on how matplotlib
# measures text, and long labels never fall off the picture.

TITLE_SIZE = 11.0  # points
TICK_MIN = 7.0  # the smallest tick label of any figure, at its size in inches (a print's)
SUBTITLE_SIZE = 9.0
LABEL_SIZE = 9.0  # axis labels, colour bar labels
TITLE_SPACE = 0.8  # inches at the top for a title and its subtitle


def _figure(size: tuple[float, float]) -> Figure:
    return Figure(figsize=size, dpi=100)  # the dpi shown in a notebook; files take theirs from `save`


def _with_margins(size: tuple[float, float], margins: tuple[float, float, float, float]) -> tuple[float, float]:
    left, right, top, bottom = margins
    return (size[0] + left + right, size[1] + top + bottom)


def _place_axes(figure: Figure, margins: tuple[float, float, float, float]):
    """Axes filling the figure less fixed margins (left, right, top, bottom) in inches."""
    width, height = figure.get_size_inches()
    left, right, top, bottom = margins
    return figure.add_axes((left / width, bottom / height, 1 - (left + right) / width, 1 - (top + bottom) / height))


def _fitting(text: str, size: float, width_inches: float) -> float:
    """The font size, at most `size` and at least 6 pt, at which `text` fits `width_inches` (a DejaVu Sans
    character is about 0.6 of the font size wide)."""
    longest = max(len(line) for line in text.splitlines()) if text else 1
    return max(6.0, min(size, width_inches * 72 * 0.95 / (0.6 * longest)))


def _titles(figure: Figure, title: str, subtitle: str = "") -> None:
    """The title, centred on the figure, and under it the subtitle (the model and the input), smaller and grey."""
    width, height = figure.get_size_inches()
    figure.text(0.5, 1 - 0.12 / height, title, ha="center", va="top", fontsize=_fitting(title, TITLE_SIZE, width))
    if subtitle:
        figure.text(
            0.5,
            1 - 0.38 / height,
            subtitle,
            ha="center",
            va="top",
            fontsize=_fitting(subtitle, SUBTITLE_SIZE, width),
            color=SUBTITLE_COLOUR,
        )


def _wrapped(text: str, length_inches: float, fontsize: float) -> str:
    """`text` broken into lines that fit `length_inches` at `fontsize`."""
    return "\n".join(textwrap.wrap(text, max(8, int(length_inches * 72 / (0.6 * fontsize)))))


def _colour_bar(figure: Figure, axes, image, label: str, width: float = 0.18, pad: float = 0.15):
    """A colour bar as tall as `axes`, `width` inches wide, `pad` inches to its right, with `label` (its unit),
    broken into lines as long as the bar (in a smaller font when that makes more than three)."""
    box = axes.get_position()
    figure_width, figure_height = figure.get_size_inches()
    bar = figure.add_axes((box.x1 + pad / figure_width, box.y0, width / figure_width, box.height))
    colour_bar = figure.colorbar(image, cax=bar)
    length = box.height * figure_height
    fontsize = LABEL_SIZE if len(_wrapped(label, length, LABEL_SIZE).splitlines()) <= 3 else 7.0
    colour_bar.set_label(_wrapped(label, length, fontsize), fontsize=fontsize)
    colour_bar.ax.tick_params(labelsize=8)
    return colour_bar


def _ink(rgba: Sequence[float]) -> str:
    """Black or white, whichever reads on a cell of colour `rgba` (WCAG 2 relative luminance, as Role.ink)."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3]]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return "black" if luminance > 0.179 else "white"


def _nice_step(at_least: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is at least `at_least`."""
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * 10**exponent >= at_least:
                return mantissa * 10**exponent
        exponent += 1


def thinned_ticks(n: int, fit: int) -> list[int]:
    """Positions 0..n-1 to label when only `fit` labels fit: all of them when they fit, otherwise every k-th (k one
    of 1, 2, 5, 10, 20, 50, ...) from 0, and the last; at most `fit` (at least 2) labels."""
    fit = max(2, fit)
    if n <= fit:
        return list(range(n))
    step = _nice_step((n - 1) / (fit - 1))
    ticks = list(range(0, n - 1, step))  # at most fit - 1 of them
    if len(ticks) > 1 and (n - 1) - ticks[-1] <= step / 2:
        ticks.pop()  # too close to the last to be read apart from it (half a step: two labels in one's room)
    return ticks + [n - 1]


def labels_that_fit(length_inches: float, fontsize: float) -> int:
    """How many labels of `fontsize` points fit side by side along `length_inches` (a line and a quarter each)."""
    return int(length_inches * 72 / (1.25 * fontsize))


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
    ticks = thinned_ticks(n, labels_that_fit(side, fontsize))
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


def _masked(values: np.ndarray, hidden: np.ndarray | None) -> np.ma.MaskedArray:
    """`values` with `hidden` cells (and NaN) masked, so that they take the colour map's 'bad' colour."""
    mask = ~np.isfinite(values) if hidden is None else (hidden | ~np.isfinite(values))
    return np.ma.masked_array(values, mask=mask)


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


def describe_input(
    model: dict, inputs: dict | None = None, text_index: int | None = None, n_tokens: int | None = None
) -> str:
    """The subtitle of a figure: the model and what it read (`demo, 9 texts, 1,234 tokens`, `demo, text 0, 16
    tokens`)."""
    parts = [str(model.get("name", ""))]
    if text_index is not None:
        parts.append(f"text {text_index}")
    elif inputs and "n_texts" in inputs:
        parts.append(f"{inputs['n_texts']:,} text{'s' if inputs['n_texts'] != 1 else ''}")
    tokens = n_tokens if n_tokens is not None else (inputs or {}).get("n_tokens")
    if tokens is not None:
        parts.append(f"{tokens:,} token{'s' if tokens != 1 else ''}")
    return ", ".join(part for part in parts if part)


def capital(text: str) -> str:
    return text[:1].upper() + text[1:]


# --------------------------------------------------------------------------------------------------- layer × head grids

GRID_MARGINS = (0.9, 2.2, TITLE_SPACE, 0.7)  # the right margin holds the role legend or the colour bar


GRID_MAX = (12.0, 12.0)  # inches of a layer × head grid at most: a large model's cells shrink instead


def grid_cell(n_layer: int, n_head: int) -> tuple[float, float]:
    """Inches of a cell of a layer × head grid: 0.6 wide and 0.44 high, smaller when the grid would pass GRID_MAX
    (GPT-2 small's 12 × 12 keeps them; GPT-2 XL's 48 layers × 25 heads get 0.48 × 0.25)."""
    return min(0.6, GRID_MAX[0] / n_head), min(0.44, GRID_MAX[1] / n_layer)


def grid_size(n_layer: int, n_head: int) -> tuple[float, float]:
    """Inches of a layer × head figure (role map, score heatmaps)."""
    width, height = grid_cell(n_layer, n_head)
    return _with_margins((width * n_head, height * n_layer + 0.3), GRID_MARGINS)


def _grid_axes(figure: Figure, axes, n_layer: int, n_head: int) -> None:
    """Ticks and titles of a layer × head grid: every layer and head labelled while they fit, else every k-th."""
    width, height = axes.get_position().width, axes.get_position().height
    inches = figure.get_size_inches()
    heads = thinned_ticks(n_head, labels_that_fit(width * inches[0], 7))
    layers = thinned_ticks(n_layer, labels_that_fit(height * inches[1], 7))
    axes.set_xticks(heads)
    axes.set_yticks(layers)
    axes.tick_params(labelsize=7)
    axes.set_xlabel("head", fontsize=LABEL_SIZE)
    axes.set_ylabel("layer", fontsize=LABEL_SIZE)


def role_map(roles: Sequence[Sequence[str]], scores: Sequence[Sequence[str]], title: str, subtitle: str = "") -> Figure:
    """One coloured cell per head (rows = layers, columns = heads), labelled `L.H`, role and `scores` (the deciding
    score, as text); the legend lists the roles drawn, in the catalog's order."""
    n_layer, n_head = len(roles), len(roles[0])
    codes = np.array([[ROLE_NAMES.index(role) for role in row] for row in roles])  # (L, H)
    figure = _figure(grid_size(n_layer, n_head))
    axes = _place_axes(figure, GRID_MARGINS)
    colours = ListedColormap([ROLE_COLOURS[role] for role in ROLE_NAMES])
    axes.imshow(codes, cmap=colours, vmin=-0.5, vmax=len(ROLE_NAMES) - 0.5, aspect="auto", interpolation="none")
    fontsize = 6.5 if n_head <= 12 else 5  # `Hnorm 0.72` fits a 0.6 in cell
    if n_head <= 24 and n_layer <= 26:  # beyond, a cell is too small for its three lines
        for layer in range(n_layer):
            for head in range(n_head):
                role = roles[layer][head]
                text = f"{layer}.{head}\n{ROLE[role].short}\n{scores[layer][head]}"
                axes.text(head, layer, text, ha="center", va="center", fontsize=fontsize, color=ROLE[role].ink)
    _grid_axes(figure, axes, n_layer, n_head)
    _titles(figure, title, subtitle)
    present = {role for row in roles for role in row}
    handles = [Patch(color=ROLE_COLOURS[role], label=role) for role in ROLE_NAMES if role in present]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    return figure


def score_colour_label(score: Score) -> str:
    """A score's colour bar label: its unit (the title names the score)."""
    if score.name == "entropy_normalized":
        return "entropy / ln(keys seen): 1 = uniform"
    if score.unit == NATS:
        return "nats"
    if score.unit == SIGNED:
        return "lift: 0 = uniform, 1 = all in the window"
    return FRACTION_LABEL


def colour_map(scale: str) -> LinearSegmentedColormap:
    """The matplotlib colour map of a scale of output.scales (its stops, interpolated linearly, as the report page's
    script and the notebook interpolate them), named after it."""
    return LinearSegmentedColormap.from_list(scale, SCALES[scale].stops)


def _norm(values: np.ndarray, vmin: float | None, vmax: float | None, signed: bool) -> Normalize:
    """Sequential: from `vmin` (default 0, or below when a value is) to `vmax` (default the largest value);
    signed: symmetric about 0, to the largest magnitude (at least `vmax` when given)."""
    finite = values[np.isfinite(values)]
    largest = float(np.abs(finite).max()) if finite.size else 1.0
    if signed:
        limit = max(largest, vmax or 0.0) or 1.0
        return Normalize(-limit, limit)
    low = min(0.0, float(finite.min())) if vmin is None and finite.size else (vmin or 0.0)
    high = (float(finite.max()) if finite.size else 1.0) if vmax is None else vmax
    return Normalize(low, high if high > low else low + 1.0)


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
    figure = _figure(grid_size(n_layer, n_head))
    axes = _place_axes(figure, GRID_MARGINS)
    norm = _norm(matrix, vmin, vmax, signed)
    cmap = colour_map(scale or (DIVERGING_SCALE if signed else SEQUENTIAL_SCALE)).with_extremes(bad=MISSING_COLOUR)
    image = axes.imshow(_masked(matrix, None), cmap=cmap, norm=norm, aspect="auto", interpolation="none")
    _colour_bar(figure, axes, image, colour_label)
    if n_layer <= 16 and n_head <= 16:
        for layer in range(n_layer):
            for head in range(n_head):
                value = matrix[layer, head]
                missing = not np.isfinite(value)
                text = ("n/a" if missing else f"{value:.2f}") if cell_text is None else cell_text[layer][head]
                colour = "black" if missing else _ink(cmap(norm(value)))
                axes.text(head, layer, text, ha="center", va="center", fontsize=7, color=colour)
    _grid_axes(figure, axes, n_layer, n_head)
    _titles(figure, title, subtitle)
    return figure


# ------------------------------------------------------------------------------------------------------- attention maps

ATTENTION_MARGINS = (1.5, 1.4, TITLE_SPACE, 1.7)  # token labels left and bottom, colour bar right, note below
ATTENTION_FONT = 8.0  # points, token labels of one head's map
ATTENTION_MAX = 9.0  # inches: a longer text thins its labels rather than the picture growing further


def attention_side(n_tokens: int) -> float:
    """Inches of the square of one head's map: 0.16 in per token (each labelled at 8 pt) from 4 in to 9 in."""
    return min(max(4.0, 0.16 * n_tokens), ATTENTION_MAX)


def attention_size(n_tokens: int) -> tuple[float, float]:
    """Inches of one head's attention figure."""
    side = attention_side(n_tokens)
    return _with_margins((side, side), ATTENTION_MARGINS)


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
    figure = _figure(attention_size(len(tokens)))
    axes = _place_axes(figure, ATTENTION_MARGINS)
    cmap = matplotlib.colormaps[ATTENTION_CMAP].with_extremes(bad=HIDDEN_COLOUR)
    image = axes.imshow(_masked(attention, hidden), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="none")
    thinned, _ = _token_ticks(axes, tokens, attention_side(len(tokens)), ATTENTION_FONT)
    _colour_bar(figure, axes, image, ATTENTION_LABEL)
    where = f"position and {unit}" if thinned else unit
    axes.set_xlabel(f"key: attended to ({where})", fontsize=LABEL_SIZE)
    axes.set_ylabel(f"query: attending ({where})", fontsize=LABEL_SIZE)
    if hidden is not None and hidden.any():
        _hidden_legend(figure)
    _titles(figure, title, subtitle)
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
    height = TITLE_SPACE + GRID_GAP[1] + rows * panel + (rows - 1) * GRID_GAP[1] + GRID_BOTTOM
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
    figure = _figure(layer_grid_size(n_head, n))
    width, height = figure.get_size_inches()
    cmap = matplotlib.colormaps[ATTENTION_CMAP].with_extremes(bad=HIDDEN_COLOUR)
    image, thinned, label_inches, panels = None, False, 0.0, []
    for index in range(n_head):
        row, column = divmod(index, columns)
        left = GRID_LABEL_SPACE + column * (panel + GRID_GAP[0])
        bottom = height - TITLE_SPACE - GRID_GAP[1] - (row + 1) * panel - row * GRID_GAP[1]
        axes = figure.add_axes((left / width, bottom / height, panel / width, panel / height))
        image = axes.imshow(_masked(maps[index], hidden), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="none")
        lowest = index + columns >= n_head  # nothing below it in its column
        thinned, label_inches = _token_ticks(axes, tokens, panel, GRID_FONT, x=lowest, y=column == 0)
        axes.set_title(panel_titles[index] if panel_titles else f"head {index}", fontsize=9, pad=3)
        panels.append(axes)
    right_column = panels[min(columns, n_head) - 1]
    top, low = panels[0].get_position(), panels[-1].get_position()
    bar = figure.add_axes((right_column.get_position().x1 + 0.15 / width, low.y0, 0.18 / width, top.y1 - low.y0))
    colour_bar = figure.colorbar(image, cax=bar)
    colour_bar.set_label(ATTENTION_LABEL, fontsize=LABEL_SIZE)
    colour_bar.ax.tick_params(labelsize=8)
    where = f"position and {unit}" if thinned else unit
    away = label_inches + 0.12  # inches from the panels to the axis titles: past the token labels
    figure.text(
        (GRID_LABEL_SPACE + (columns * panel + (columns - 1) * GRID_GAP[0]) / 2) / width,
        max(0.05, low.y0 * height - away) / height,
        f"key: attended to ({where})",
        ha="center",
        va="top",
        fontsize=LABEL_SIZE,
    )
    figure.text(
        max(0.05, GRID_LABEL_SPACE - away) / width,
        (low.y0 + top.y1) / 2,
        f"query: attending ({where})",
        ha="right",
        va="center",
        rotation=90,
        fontsize=LABEL_SIZE,
    )
    if hidden is not None and hidden.any():
        _hidden_legend(figure)
    _titles(figure, title, subtitle)
    return figure


# ------------------------------------------------------------------------------------------------- heads × heads matrix

MATRIX_MARGINS = (1.0, 1.5, TITLE_SPACE, 1.0)  # the right margin holds the colour bar and its label
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
    scale: str = SEQUENTIAL_SCALE,
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
    figure = _figure(_with_margins((side, side), margins))
    axes = _place_axes(figure, margins)  # a square the size of the matrix: imshow fills it exactly
    colours = colour_map(scale)
    image = axes.imshow(matrix, cmap=colours, vmin=vmin, vmax=vmax, interpolation="none")
    _colour_bar(figure, axes, image, colour_label)
    fitting = 0.75 * side * 72 / n  # points: the largest font whose labels do not overlap
    fontsize = max(TICK_MIN, min(8.0, fitting))
    step = int(np.ceil(fontsize / fitting))  # 1 up to MATRIX_MAX / LABEL_PITCH heads
    axes.set_xticks(range(0, n, step))
    axes.set_yticks(range(0, n, step))
    axes.set_xticklabels(labels[::step], rotation=90, fontsize=fontsize)
    axes.set_yticklabels(labels[::step], fontsize=fontsize)
    axes.set_xlabel("head (layer.head)", fontsize=LABEL_SIZE)
    axes.set_ylabel("head (layer.head)", fontsize=LABEL_SIZE)
    if n <= 16:
        norm = Normalize(vmin, vmax)
        for i in range(n):
            for j in range(n):
                colour = _ink(colours(norm(matrix[i, j])))
                axes.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6, color=colour)
    if clustered:
        _dendrogram(figure, axes, linkage, n, cut, linkage_label)
    _titles(figure, title, subtitle)
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


# --------------------------------------------------------------------------------------------- heads against heads

PAIR_MARGINS = (1.0, 1.4, TITLE_SPACE, 1.0)  # labels left and below, the colour bar right
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
    scale: str = SEQUENTIAL_SCALE,
    signed: bool = False,
    vmin: float | None = 0.0,
    vmax: float | None = None,
    row_title: str = "head (layer.head)",
    column_title: str = "head (layer.head)",
) -> Figure:
    """A heads × heads matrix of any shape (`rows` × `columns`, `L.H` labels), coloured by `scale` (output.scales):
    `signed`, centred at 0 to ± the largest magnitude; else from `vmin` to `vmax` (None: the largest value). Cells
    without a value (NaN: a pair that does not exist) light grey; thin lines between layers; values written in
    when the matrix is small; labels thinned to a readable pitch on a large one."""
    n_rows, n_columns = matrix.shape
    cell = min(0.45, PAIR_MAX / max(n_rows, n_columns, 1))
    figure = _figure(_with_margins((max(cell * n_columns, 2.6), max(cell * n_rows, 1.2)), PAIR_MARGINS))
    axes = _place_axes(figure, PAIR_MARGINS)
    norm = _norm(matrix, vmin, vmax, signed)
    cmap = colour_map(scale).with_extremes(bad=MISSING_COLOUR)
    image = axes.imshow(_masked(matrix, None), cmap=cmap, norm=norm, aspect="auto", interpolation="none")
    _colour_bar(figure, axes, image, colour_label)
    box = axes.get_position()
    inches = figure.get_size_inches()
    for count, labels, set_ticks, set_labels, length in (
        (n_columns, columns, axes.set_xticks, axes.set_xticklabels, box.width * inches[0]),
        (n_rows, rows, axes.set_yticks, axes.set_yticklabels, box.height * inches[1]),
    ):
        fontsize = max(TICK_MIN, min(8.0, 0.75 * length * 72 / max(count, 1)))
        ticks = thinned_ticks(count, labels_that_fit(length, fontsize))
        set_ticks(ticks)
        set_labels([labels[k] for k in ticks], fontsize=fontsize)
    for label in axes.get_xticklabels():
        label.set_rotation(90)
    for k in range(1, n_columns):
        if _layer_of(columns[k]) != _layer_of(columns[k - 1]):
            axes.axvline(k - 0.5, color="#777777", linewidth=0.6)
    for k in range(1, n_rows):
        if _layer_of(rows[k]) != _layer_of(rows[k - 1]):
            axes.axhline(k - 0.5, color="#777777", linewidth=0.6)
    axes.set_xlabel(column_title, fontsize=LABEL_SIZE)
    axes.set_ylabel(row_title, fontsize=LABEL_SIZE)
    if n_rows <= 16 and n_columns <= 16:
        for i in range(n_rows):
            for j in range(n_columns):
                value = matrix[i, j]
                if np.isfinite(value):
                    colour = _ink(cmap(norm(value)))
                    axes.text(
                        j,
                        i,
                        f"{value:.2f}".replace("-0.00", "0.00"),
                        ha="center",
                        va="center",
                        fontsize=6.5,
                        color=colour,
                    )
    _titles(figure, title, subtitle)
    return figure


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
    size = _with_margins((max(column * n_layer, 3.0), max(row * n_head, 2.0)), GRAPH_MARGINS)
    figure = _figure(size)
    axes = _place_axes(figure, GRAPH_MARGINS)
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
    colour_bar.set_label(_wrapped(colour_label, box.height * size[1] * 0.45, 7.0), fontsize=7.0)
    colour_bar.ax.tick_params(labelsize=7)
    present = {role for row in roles for role in row}
    handles = [Patch(color=ROLE_COLOURS[role], label=role) for role in ROLE_NAMES if role in present]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    if note:
        figure.text(0.5, 0.12 / size[1], _wrapped(note, size[0] - 0.4, 7.5), ha="center", va="bottom",
                    fontsize=7.5, color=SUBTITLE_COLOUR)  # fmt: skip
    _titles(figure, title, subtitle)
    return figure


# ----------------------------------------------------------------------------------------------------------- line plots

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
    figure = _figure(line_size(list(series)))
    axes = _place_axes(figure, (LINE_MARGINS[0], LINE_MARGINS[1] + extra, *LINE_MARGINS[2:]))
    lowest, highest = 0.0, 0.0
    for index, (name, values) in enumerate(series.items()):
        dodge = (index - (len(series) - 1) / 2) * 0.025 if spreads else 0.0  # a share of a unit of log2(x), or of x
        shifted = [a * 2**dodge if log_x else a + dodge for a in x]
        points = [(a, b) for a, b in zip(shifted, values, strict=True) if b is not None]
        style = {
            "color": SERIES_COLOURS[index % len(SERIES_COLOURS)],
            "marker": SERIES_MARKERS[index % len(SERIES_MARKERS)],
            **(styles or {}).get(name, {}),
        }
        if points:
            axes.plot([p[0] for p in points], [p[1] for p in points], label=name, **style)
            lowest = min(lowest, *(p[1] for p in points))
            highest = max(highest, *(p[1] for p in points))
        if spreads and name in spreads:
            low, high = spreads[name]
            bars = [
                (a, b, c, d) for a, b, c, d in zip(shifted, values, low, high, strict=True) if None not in (b, c, d)
            ]
            if bars:
                xs, ys, lows, highs = (np.array(column, dtype=float) for column in zip(*bars, strict=True))
                drawn = axes.errorbar(
                    xs, ys, yerr=[ys - lows, highs - ys], fmt="none", ecolor=style["color"], elinewidth=1.0, capsize=3
                )
                drawn.lines[2][0].set_gid(f"spread:{name}")
                highest = max(highest, *highs)
    if log_x:
        axes.set_xscale("log", base=2)
    axes.set_xticks(list(x))
    axes.set_xticklabels([f"{v:,}" if isinstance(v, int) else str(v) for v in x])
    axes.minorticks_off()
    if lowest < 0:
        axes.axhline(0.0, color="#888888", linewidth=0.8)
        axes.set_ylim(bottom=lowest * 1.1)
    else:
        axes.set_ylim(bottom=0.0)
    if y_top is None:  # some room above the highest point, or above 0 when every value is below it
        y_top = highest * 1.08 if highest > 0 else (-0.1 * lowest if lowest < 0 else 1.0)
    axes.set_ylim(top=y_top)
    if highest >= 10_000:
        axes.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    axes.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    axes.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    axes.tick_params(labelsize=8)
    axes.grid(alpha=0.3)
    if len(series) > 1:
        axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=LEGEND_FONT, frameon=False, handlelength=3.5)
    _titles(figure, title, subtitle)
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
    subtitle = describe_input(model, text_index=attention.text_index, n_tokens=len(attention.tokens))
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
