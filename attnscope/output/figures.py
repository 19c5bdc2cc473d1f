"""What every picture shares (matplotlib): writing a figure, its layout at fixed inches, titles, colour bars, tick
thinning and the colour conventions. The pictures are drawn by families of figures built on these pieces, each in a
module of its own, since each has its own layout and its own readers: `head_grids` (layer × head grids: the role map,
one score per head), `attention_maps` (one text's maps: one head's, or a layer's side by side), `head_matrices`
(heads × heads: similarity with its dendrogram, dependencies), `head_graph` (the circuit, heads as nodes) and
`line_plots` (a value against a setting); each command's room (output/<command>.py) calls them.

Pictures render what the library computed and compute nothing themselves. Every drawing function builds and returns
a `matplotlib.figure.Figure` (not registered with pyplot: nothing global changes, a notebook shows it, and it is
freed like any object); `save(figure, path, format, dpi)` writes one, and `render` gives its bytes. Every figure has a
fixed size in inches, its axes placed at fixed margins (no tight bounding box), so a PNG's pixel size is known in
advance: the figure's inches × dpi, rounded. SVG and PDF are byte-identical for the same figure (no date, fixed ids).

Conventions, the same in every figure: a title in words and a subtitle saying the model and the input; a colour bar
with its unit on every heatmap; sequential colours from 0 for values that cannot be negative, a diverging map
centred at 0 for those that can; keys a query cannot see (a causal or sliding-window mask) drawn in grey, apart
from zero attention; token labels thinned to a readable pitch on long texts, the first and last always kept; value
axes from 0.
"""

from __future__ import annotations

import io
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.colors import LinearSegmentedColormap, Normalize
from matplotlib.figure import Figure

from attnscope.output import files
from attnscope.output.files import DPI, PICTURE_FORMATS
from attnscope.output.scales import SCALES
from attnscope.scores.catalog import NATS, ROLES, SIGNED, Score

ROLE_COLOURS = {role.name: role.colour for role in ROLES}  # the catalog's palette, shared with the terminal
# The colour scales of values (output.scales, shared with the report page and the notebook): sequential from 0,
# diverging for signed values (blue below 0, red above)
SEQUENTIAL_SCALE = "score"
DIVERGING_SCALE = "signed_score"
MISSING_COLOUR = "#e0e0e0"  # a cell with no value (NaN)
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


def new_figure(size: tuple[float, float]) -> Figure:
    """A figure `size` inches wide and high, not registered with pyplot."""
    return Figure(figsize=size, dpi=100)  # the dpi shown in a notebook; files take theirs from `save`


def with_margins(size: tuple[float, float], margins: tuple[float, float, float, float]) -> tuple[float, float]:
    """Inches of a figure whose axes are `size` inches, with `margins` (left, right, top, bottom) around them."""
    left, right, top, bottom = margins
    return (size[0] + left + right, size[1] + top + bottom)


def place_axes(figure: Figure, margins: tuple[float, float, float, float]):
    """Axes filling the figure less fixed margins (left, right, top, bottom) in inches."""
    width, height = figure.get_size_inches()
    left, right, top, bottom = margins
    return figure.add_axes((left / width, bottom / height, 1 - (left + right) / width, 1 - (top + bottom) / height))


def _fitting(text: str, size: float, width_inches: float) -> float:
    """The font size, at most `size` and at least 6 pt, at which `text` fits `width_inches` (a DejaVu Sans
    character is about 0.6 of the font size wide)."""
    longest = max(len(line) for line in text.splitlines()) if text else 1
    return max(6.0, min(size, width_inches * 72 * 0.95 / (0.6 * longest)))


def add_titles(figure: Figure, title: str, subtitle: str = "") -> None:
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


def wrapped(text: str, length_inches: float, fontsize: float) -> str:
    """`text` broken into lines that fit `length_inches` at `fontsize`."""
    return "\n".join(textwrap.wrap(text, max(8, int(length_inches * 72 / (0.6 * fontsize)))))


def add_colour_bar(figure: Figure, axes, image, label: str, width: float = 0.18, pad: float = 0.15):
    """A colour bar as tall as `axes`, `width` inches wide, `pad` inches to its right, with `label` (its unit),
    broken into lines as long as the bar (in a smaller font when that makes more than three)."""
    box = axes.get_position()
    figure_width, figure_height = figure.get_size_inches()
    bar = figure.add_axes((box.x1 + pad / figure_width, box.y0, width / figure_width, box.height))
    colour_bar = figure.colorbar(image, cax=bar)
    length = box.height * figure_height
    fontsize = LABEL_SIZE if len(wrapped(label, length, LABEL_SIZE).splitlines()) <= 3 else 7.0
    colour_bar.set_label(wrapped(label, length, fontsize), fontsize=fontsize)
    colour_bar.ax.tick_params(labelsize=8)
    return colour_bar


def ink(rgba: Sequence[float]) -> str:
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


def masked(values: np.ndarray, hidden: np.ndarray | None) -> np.ma.MaskedArray:
    """`values` with `hidden` cells (and NaN) masked, so that they take the colour map's 'bad' colour."""
    mask = ~np.isfinite(values) if hidden is None else (hidden | ~np.isfinite(values))
    return np.ma.masked_array(values, mask=mask)


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
    """`text` with its first letter in capitals and the rest as it is (`JS divergence`, not `Js divergence`)."""
    return text[:1].upper() + text[1:]


# -------------------------------------------------------------------------------------------------------------- colours


def score_colour_label(score: Score) -> str:
    """A score's colour bar label: the score and its unit (a colour bar says what it measures even cut from its
    picture)."""
    if score.name == "entropy_normalized":
        return f"{score.label}: entropy / ln(keys seen); 1 = uniform"
    if score.unit == NATS:
        return f"{score.label} (nats)"
    if score.unit == SIGNED:
        return f"{score.label}: 0 = uniform, 1 = all in the window"
    return f"{score.label} ({FRACTION_LABEL})"


def colour_map(scale: str) -> LinearSegmentedColormap:
    """The matplotlib colour map of a scale of output.scales (its stops, interpolated linearly, as the report page's
    script and the notebook interpolate them), named after it."""
    return LinearSegmentedColormap.from_list(scale, SCALES[scale].stops)


def colour_norm(values: np.ndarray, vmin: float | None, vmax: float | None, signed: bool) -> Normalize:
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
