"""Pictures (matplotlib, Agg backend): they render what the library computed and compute nothing themselves.

Every figure has a fixed size in inches at DPI dots per inch (no tight bounding box), so a PNG's pixel size is
known in advance: `figure_size(...)` × DPI.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from attnscope.output.files import write_atomic  # noqa: E402
from attnscope.scores.catalog import FRACTION, ROLE, ROLE_NAMES, ROLES, Score  # noqa: E402

DPI = 100
ROLE_COLOURS = {role.name: role.colour for role in ROLES}  # the catalog's palette, shared with the terminal


def score_limits(score: Score) -> tuple[float | None, float | None]:
    """The colour range a score is drawn on: [0, 1] for a fraction, the data's own range otherwise."""
    return (0.0, 1.0) if score.unit == FRACTION else (None, None)


def _save(figure, path: Path) -> Path:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # A token the font cannot draw (日, 🙂) shows as a box; matplotlib would also warn once per glyph and
        # figure, a screenful of stderr that tells the user nothing the picture does not.
        warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
        figure.savefig(buffer, format="png", dpi=DPI)
    plt.close(figure)
    return write_atomic(path, buffer.getvalue())


# Margins in inches around the axes of each kind of figure: (left, right, top, bottom).
GRID_MARGINS = (0.9, 2.2, 0.6, 0.7)  # the right margin holds the role legend or the colour bar
ATTENTION_MARGINS = (1.4, 1.3, 0.5, 1.5)  # token labels on the left and bottom, colour bar on the right


def _with_margins(size: tuple[float, float], margins: tuple[float, float, float, float]) -> tuple[float, float]:
    left, right, top, bottom = margins
    return (size[0] + left + right, size[1] + top + bottom)


def _place_axes(figure, margins: tuple[float, float, float, float]):
    """Axes filling the figure less fixed margins in inches, so long labels never fall off the picture."""
    width, height = figure.get_size_inches()
    left, right, top, bottom = margins
    return figure.add_axes((left / width, bottom / height, 1 - (left + right) / width, 1 - (top + bottom) / height))


def _fit_title(figure, axes, title: str) -> None:
    """Title centred on the figure (not the axes, which sit off-centre beside the legend) in a font small enough,
    down to 6 pt, to fit the figure's width: a character of DejaVu Sans is about 0.6 of the font size wide."""
    width_points = figure.get_size_inches()[0] * 72 * 0.95
    longest = max(len(line) for line in title.splitlines())
    figure.suptitle(title, fontsize=max(6.0, min(12.0, width_points / (0.6 * longest))))


def grid_size(n_layer: int, n_head: int) -> tuple[float, float]:
    """Inches of a layer × head figure (role map, score heatmaps)."""
    return _with_margins((0.6 * n_head, 0.45 * n_layer + 0.3), GRID_MARGINS)


def attention_size(n_tokens: int) -> tuple[float, float]:
    """Inches of one head's attention heatmap: grows with the tokens so labels stay readable, within limits."""
    side = min(max(4.0, 0.22 * n_tokens), 22.0)
    return _with_margins((side, side), ATTENTION_MARGINS)


def layer_grid_shape(n_head: int) -> tuple[int, int]:
    columns = int(np.ceil(np.sqrt(n_head)))
    return int(np.ceil(n_head / columns)), columns


def layer_grid_size(n_head: int, n_tokens: int) -> tuple[float, float]:
    rows, columns = layer_grid_shape(n_head)
    panel = min(max(2.5, 0.6 + 0.12 * n_tokens), 8.0)
    return (columns * panel + 0.5, rows * panel + 0.6)


def role_map(
    roles: Sequence[Sequence[str]],
    scores: Sequence[Sequence[str]],
    model_name: str,
    path: Path,
    legend: Sequence[str],
) -> Path:
    """One coloured cell per head (rows = layers, columns = heads), labelled `L.H`, role and `scores` (the deciding
    score, as text); the legend lists `legend` (the roles this kind of model can be given: catalog.roles_for)."""
    n_layer, n_head = len(roles), len(roles[0])
    codes = np.array([[ROLE_NAMES.index(role) for role in row] for row in roles])  # (L, H)
    figure = plt.figure(figsize=grid_size(n_layer, n_head))
    axes = _place_axes(figure, GRID_MARGINS)
    colours = ListedColormap([ROLE_COLOURS[role] for role in ROLE_NAMES])
    axes.imshow(codes, cmap=colours, vmin=-0.5, vmax=len(ROLE_NAMES) - 0.5, aspect="auto")
    fontsize = 7 if n_head <= 12 else 5
    for layer in range(n_layer):
        for head in range(n_head):
            role = roles[layer][head]
            colour = ROLE[role].ink
            text = f"{layer}.{head}\n{ROLE[role].short}\n{scores[layer][head]}"
            axes.text(head, layer, text, ha="center", va="center", fontsize=fontsize, color=colour)
    axes.set_xticks(range(n_head))
    axes.set_yticks(range(n_layer))
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    _fit_title(figure, axes, f"Head roles: {model_name}")
    handles = [Patch(color=ROLE_COLOURS[role], label=role) for role in legend]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return _save(figure, path)


def score_heatmap(
    matrix: np.ndarray,
    title: str,
    path: Path,
    vmin: float | None = 0.0,
    vmax: float | None = 1.0,
    cell_text: Sequence[Sequence[str]] | None = None,
) -> Path:
    """A layer × head heatmap of one score with a colour bar; values (or `cell_text`) written in the cells when they
    fit."""
    n_layer, n_head = matrix.shape
    figure = plt.figure(figsize=grid_size(n_layer, n_head))
    axes = _place_axes(figure, GRID_MARGINS)
    image = axes.imshow(matrix, cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto")
    figure.colorbar(image, ax=axes, fraction=0.08, pad=0.03)
    if n_layer <= 16 and n_head <= 16:
        middle = (np.nanmin(matrix) + np.nanmax(matrix)) / 2 if vmin is None else (vmin + vmax) / 2
        for layer in range(n_layer):
            for head in range(n_head):
                value = matrix[layer, head]
                colour = "black" if value > middle else "white"
                text = f"{value:.2f}" if cell_text is None else cell_text[layer][head]
                axes.text(head, layer, text, ha="center", va="center", fontsize=7, color=colour)
    axes.set_xticks(range(n_head))
    axes.set_yticks(range(n_layer))
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    _fit_title(figure, axes, title)
    return _save(figure, path)


def _attention_axes(axes, attention: np.ndarray, tokens: Sequence[str], fontsize: float) -> object:
    image = axes.imshow(attention, cmap="Blues", vmin=0.0, vmax=1.0)
    ticks = range(len(tokens))
    axes.set_xticks(ticks)
    axes.set_yticks(ticks)
    axes.set_xticklabels(tokens, rotation=90, fontsize=fontsize)
    axes.set_yticklabels(tokens, fontsize=fontsize)
    return image


def attention_heatmap(attention: np.ndarray, tokens: Sequence[str], title: str, path: Path) -> Path:
    """One head's attention map: rows = queries, columns = keys, labelled with the tokens."""
    figure = plt.figure(figsize=attention_size(len(tokens)))
    axes = _place_axes(figure, ATTENTION_MARGINS)
    fontsize = 9 if len(tokens) <= 40 else max(3.0, 9 - len(tokens) / 20)
    image = _attention_axes(axes, attention, tokens, fontsize)
    figure.colorbar(image, ax=axes, fraction=0.05, pad=0.03)
    axes.set_xlabel("key (attended to)")
    axes.set_ylabel("query (attending)")
    axes.set_title(title)
    return _save(figure, path)


def layer_grid(maps: np.ndarray, tokens: Sequence[str], layer: int, path: Path, subtitle: str = "") -> Path:
    """All heads of one layer (maps (H, n, n)) side by side, labelled `L.H`; `subtitle`, a second line under the
    title (what the labels mean)."""
    n_head = maps.shape[0]
    rows, columns = layer_grid_shape(n_head)
    figure, grid = plt.subplots(rows, columns, figsize=layer_grid_size(n_head, len(tokens)), squeeze=False)
    fontsize = 6 if len(tokens) <= 30 else max(2.0, 6 - len(tokens) / 20)
    for index, axes in enumerate(grid.flat):
        if index >= n_head:
            axes.axis("off")
            continue
        _attention_axes(axes, maps[index], tokens, fontsize)
        axes.set_title(f"{layer}.{index}", fontsize=9)
    title = f"Layer {layer}: attention of every head"
    figure.suptitle(f"{title}\n{subtitle}" if subtitle else title, fontsize=10 if subtitle else None)
    figure.tight_layout(rect=(0, 0, 1, 0.95 if subtitle else 0.97))
    return _save(figure, path)


MATRIX_MARGINS = (1.0, 1.4, 0.6, 1.0)  # the right margin holds the colour bar
LABEL_PITCH = 0.1  # inches per head that give each head its own 5.4 pt label
MATRIX_MAX = 40.0  # inches: beyond 400 heads, labels skip heads rather than the picture growing further


def matrix_side(n: int) -> float:
    """Inches of the square of a heads × heads matrix: 0.45 in per head up to 16 heads, then 16 in, or LABEL_PITCH
    per head when that is more (GPT-2 small's 144 heads: 16 in; GPT-2 medium's 384: 38.4 in), at most MATRIX_MAX."""
    return max(3.0, min(0.45 * n, 16.0), min(LABEL_PITCH * n, MATRIX_MAX))


def _colour_bar(figure, axes, image, width: float = 0.2, pad: float = 0.15) -> None:
    """A colour bar exactly as tall as `axes`, `width` inches wide, `pad` inches to its right."""
    box = axes.get_position()
    figure_width = figure.get_size_inches()[0]
    figure.colorbar(image, cax=figure.add_axes((box.x1 + pad / figure_width, box.y0, width / figure_width, box.height)))


def head_matrix(
    matrix: np.ndarray, labels: Sequence[str], title: str, path: Path, vmin: float, vmax: float, cmap: str
) -> Path:
    """A heads × heads matrix (cosine or JS) with `L.H` labels, a colour bar, values written in when it is small."""
    n, side = len(labels), matrix_side(len(labels))
    figure = plt.figure(figsize=_with_margins((side, side), MATRIX_MARGINS))
    axes = _place_axes(figure, MATRIX_MARGINS)  # a square the size of the matrix: imshow fills it exactly
    image = axes.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax)
    _colour_bar(figure, axes, image)
    fitting = 0.75 * side * 72 / n  # points: the largest font whose labels do not overlap
    fontsize = max(5.0, min(8.0, fitting))
    step = int(np.ceil(fontsize / fitting))  # 1 up to MATRIX_MAX / LABEL_PITCH heads
    axes.set_xticks(range(0, n, step))
    axes.set_yticks(range(0, n, step))
    axes.set_xticklabels(labels[::step], rotation=90, fontsize=fontsize)
    axes.set_yticklabels(labels[::step], fontsize=fontsize)
    if n <= 16:
        middle = (vmin + vmax) / 2
        for i in range(n):
            for j in range(n):
                colour = "white" if (matrix[i, j] > middle) == (cmap.endswith("_r")) else "black"
                axes.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6, color=colour)
    axes.set_title(title)
    return _save(figure, path)


LINE_SIZE = (7.0, 4.0)


def line_plot(
    x: Sequence[float],
    series: dict[str, Sequence[float | None]],
    xlabel: str,
    ylabel: str,
    title: str,
    path: Path,
    log_x: bool = False,
    styles: dict[str, dict] | None = None,
) -> Path:
    """One or more lines over the same x, with markers; None values are left out. `styles` gives a line's matplotlib
    keywords (color, linestyle) by series name; lines without one take the next colour of the cycle."""
    figure, axes = plt.subplots(figsize=LINE_SIZE)
    for name, values in series.items():
        points = [(a, b) for a, b in zip(x, values, strict=True) if b is not None]
        if points:
            style = (styles or {}).get(name, {})
            axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name, **style)
    if log_x:
        axes.set_xscale("log", base=2)
    axes.set_xticks(list(x))
    axes.set_xticklabels([str(v) for v in x])
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    if len(series) > 1:
        axes.legend()
    figure.tight_layout()
    return _save(figure, path)


# ---------------------------------------------------------------------------------------------------------------
# Figures of a heads result, shared by `heads --out` and the report page.


def score_matrix(heads: Sequence, name: str, n_layer: int, n_head: int) -> np.ndarray:
    """(n_layer, n_head) of one score of every head record."""
    matrix = np.full((n_layer, n_head), np.nan)
    for record in heads:
        matrix[record.layer, record.head] = record.scores[name]
    return matrix


def heads_role_map(result, path: Path) -> Path:
    """The layer × head map of roles of a HeadsResult, each cell labelled with the score that decided its role
    (named in a mixed head's cell, where it is only the closest to its threshold)."""
    from attnscope.scores.catalog import SCORE, roles_for

    n_layer, n_head = result.model["n_layer"], result.model["n_head"]
    roles = [[""] * n_head for _ in range(n_layer)]
    deciding = [[""] * n_head for _ in range(n_layer)]
    for record in result.heads:
        role = record.role
        roles[record.layer][record.head] = role.role
        named = f"{SCORE[role.metric].short} " if role.role == "mixed" else ""
        deciding[record.layer][record.head] = f"{named}{role.score:.2f}"
    legend = [role.name for role in roles_for(result.kind.name)]
    return role_map(roles, deciding, result.model["name"], path, legend)


def heads_score_heatmaps(result, folder: Path, title: str = "{label} per head: {model}") -> dict[str, Path]:
    """score name -> score_<name>.png, one layer × head heatmap per score the run measured."""
    from attnscope.scores.catalog import SCORE

    n_layer, n_head = result.model["n_layer"], result.model["n_head"]
    written = {}
    for name in result.measured:
        score = SCORE[name]
        if not score.per_head:
            continue
        matrix = score_matrix(result.heads, name, n_layer, n_head)
        heading = title.format(label=score.label, name=name, model=result.model["name"])
        written[name] = score_heatmap(matrix, heading, folder / f"score_{name}.png", *score_limits(score))
    return written


def diversity_per_layer(result, path: Path) -> Path:
    """The mean pairwise JSD of every layer's heads, a line over the layers (a DiversityResult of all layers)."""
    layers = sorted(result.layer_scores)
    return line_plot(
        layers,
        {"mean pairwise JSD": [result.layer_scores[layer] for layer in layers]},
        "layer",
        "mean JS divergence between heads (bits)",
        f"Head diversity per layer: {result.model['name']}",
        path,
    )
