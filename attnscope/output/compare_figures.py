"""`attnscope compare`'s pictures (its room, output/compare.py, holds the rest): the trajectories (each model's
loss and sink rate, and each role's deciding score across the models with where it formed and its transition), a
heads × models heatmap of one score, and the divergence grid of two models. A module of its own because the
trajectories are a layout of panels of their own. Reads a CompareResult by duck typing, as the room does.
"""

from __future__ import annotations

from typing import Any

from attnscope.scores.catalog import FRACTION, ROLE, ROLES, SCORE, SIGNED, Role, counted

PANEL = (3.3, 2.5)  # inches of one trajectory panel
PANEL_MARGINS = (0.75, 0.25, 0.35, 0.75)  # left, right, top (the panel's title), bottom (the models' labels)
FOOTER = 0.55  # inches under the panels for the key
NAMED_LINES = 6  # heads named at their line's end in a panel; the others are drawn without a name
LOSS = "loss"  # the panel of the models' loss, before the roles'
SINKS = "sink rate"  # the panel of the models' sink rates, after the loss


def trajectories(result: Any) -> Any:
    """The models along x (in the order given), one small panel each: the models' loss on the texts (when measured),
    their sink rate (the model's and each layer's), then one per role held by some head in some model (mixed
    aside): the role's deciding score in each model for every head that ever holds it. Heads that hold it to the
    end are coloured, named at the end of their line (the strongest NAMED_LINES), marked with a star where the role
    formed (a threshold held to the end) and a ring at its transition (the model that ends the largest rise of the
    score); heads that hold it only for a while are grey. The dashed line is the role's threshold."""
    import numpy as np

    from attnscope.output import figures

    labels = list(result.labels)
    roles = [role for role in ROLES if role.score is not None and any(role.name in h.roles for h in result.heads)]
    panels: list[Any] = ([LOSS] if result.has_loss else []) + ([SINKS] if result.sink_rates else []) + roles
    columns = max(1, min(3, len(panels)))
    rows = max(1, -(-len(panels) // columns))  # one row of room for the message when there is no panel
    label_room = max(0.0, 0.06 * max(len(label) for label in labels) - 0.3)  # rotated model labels
    panel_h = PANEL[1] + label_room
    width = max(7.0, columns * PANEL[0])
    size = (width, rows * panel_h + figures.TITLE_SPACE + FOOTER)
    offset = (width - columns * PANEL[0]) / 2  # the panels centred
    figure = figures.new_figure(size)
    x = np.arange(len(labels))
    inner = (PANEL[0] - PANEL_MARGINS[0] - PANEL_MARGINS[1], panel_h - PANEL_MARGINS[2] - PANEL_MARGINS[3] - label_room)
    for index, panel in enumerate(panels):
        row, column = divmod(index, columns)
        left = offset + column * PANEL[0] + PANEL_MARGINS[0]
        bottom = size[1] - figures.TITLE_SPACE - (row + 1) * panel_h + PANEL_MARGINS[3] + label_room
        axes = figure.add_axes((left / size[0], bottom / size[1], inner[0] / size[0], inner[1] / size[1]))
        if panel == LOSS:
            _loss_panel(axes, result, x)
        elif panel == SINKS:
            _sink_panel(axes, result, x)
        else:
            _role_panel(axes, result, panel, x)
        _model_ticks(axes, labels, inner[0], bool(label_room))
    if not roles:
        figure.text(
            0.5,
            0.5 if not panels else 0.2,
            "No head holds a role other than mixed in any of the models: no score passes its threshold",
            ha="center",
            va="center",
            fontsize=9,
            color=figures.SUBTITLE_COLOUR,
        )
    title = (
        "The loss, the sink rate and each role's deciding score across the models"
        if result.has_loss
        else ("The sink rate and each role's deciding score across the models")
    )
    figures.add_titles(figure, title, described(result))
    key = (
        "★ where the role formed: the head holds it from that model to the last (no star: from the first); "
        "○ its transition: the model that ends the largest rise of the score; coloured: heads that hold the role in "
        "the last model (the strongest named); grey: heads that held it only for a while; dashed: the threshold"
    )
    figure.text(
        0.5,
        0.1 / size[1],
        figures.wrapped(key, width - 0.4, 7.5),
        ha="center",
        va="bottom",
        fontsize=7.5,
        color=figures.SUBTITLE_COLOUR,
    )
    return figure


def _loss_panel(axes: Any, result: Any, x: Any) -> None:
    """Each model's loss on the texts (a gap where a model has none), from 0."""
    from attnscope.output import line_plots

    values = [float("nan") if loss is None else loss for loss in result.losses]
    axes.plot(x, values, color=line_plots.SERIES_COLOURS[0], linewidth=1.5, marker="o", markersize=3, zorder=2)
    axes.set_ylim(0.0, max([v for v in values if v == v] or [1.0]) * 1.08)
    axes.set_ylabel("loss (nats per predicted token)", fontsize=8)
    axes.set_title("language-model loss on the texts", fontsize=9)


def _sink_panel(axes: Any, result: Any, x: Any) -> None:
    """Each model's sink rate (Gu et al. 2024), the model's in colour and each layer's in grey, on [0, 1]: a training
    run shows when sinks emerge, and in which layers."""
    from attnscope.output import line_plots

    rates = result.sink_rates
    for layer in range(len(rates[0].layers)):
        axes.plot(x, [rate.layers[layer] for rate in rates], color="#b0b0b0", linewidth=0.8, zorder=1)
    axes.plot(x, [rate.model for rate in rates], color=line_plots.SERIES_COLOURS[0], linewidth=1.5, marker="o",
              markersize=3, zorder=2)  # fmt: skip
    axes.set_ylim(0.0, 1.0)
    axes.set_ylabel("share of heads", fontsize=8)
    axes.set_title(f"sink rate: first_token > {rates[0].epsilon:g} (grey: layers)", fontsize=9)


def _role_panel(axes: Any, result: Any, role: Role, x: Any) -> None:
    """One role's deciding score in each model, for every head that holds it in some model (see `trajectories`)."""
    from attnscope.output import line_plots

    labels = list(result.labels)
    score = SCORE[role.score]
    holders = [head for head in result.heads if role.name in head.roles]
    formed = sorted(
        (head for head in holders if head.formed.get(role.name) is not None),
        key=lambda head: -(head.scores[role.score][-1] or 0.0),
    )
    passing = [head for head in holders if head.formed.get(role.name) is None]
    names = []  # (last value, label, colour) of the named lines
    for head in passing:
        axes.plot(x, _values(head, role.score), color="#b0b0b0", linewidth=0.8, zorder=1)
    for rank, head in enumerate(formed):
        values = _values(head, role.score)
        named = rank < NAMED_LINES
        colour = line_plots.SERIES_COLOURS[rank % len(line_plots.SERIES_COLOURS)] if named else ROLE[role.name].colour
        axes.plot(x, values, color=colour, linewidth=1.5 if named else 0.8, alpha=1.0 if named else 0.6, zorder=2)
        start = labels.index(head.formed[role.name])
        if start > 0:  # a head that holds the role from the first model on has no star: it did not form here
            axes.plot([start], [values[start]], marker="*", markersize=9, color=colour, markeredgecolor="black",
                      markeredgewidth=0.5, zorder=3, linestyle="none")  # fmt: skip
        moved = head.transition.get(role.name)
        if moved is not None:
            at = labels.index(moved)
            axes.plot([at], [values[at]], marker="o", markersize=6, markerfacecolor="white", markeredgecolor=colour,
                      markeredgewidth=1.2, zorder=4, linestyle="none")  # fmt: skip
        if named:
            names.append((values[-1], head.label, colour))
    threshold = result.settings["thresholds"].get(role.name)
    if threshold is not None:
        axes.axhline(threshold, color="#555555", linestyle="--", linewidth=0.8, zorder=0)
    top = 1.0 if score.unit in (FRACTION, SIGNED) else None
    axes.set_ylim(min(0.0, axes.get_ylim()[0]), top if top is not None else axes.get_ylim()[1])
    _name_line_ends(axes, names, x[-1])
    axes.set_ylabel(score.short if len(score.label) > 24 else score.label, fontsize=8)
    axes.set_title(f"{role.name}: {len(formed)} formed, {len(passing)} for a while", fontsize=9)


def _model_ticks(axes: Any, labels: list[str], inches: float, long_labels: bool) -> None:
    """The models along x: every model a grid line, as many named as fit (rotated when long or many)."""
    import numpy as np

    from attnscope.output import figures

    x = np.arange(len(labels))
    rotated = long_labels or len(labels) > 4
    span = len(labels) - 0.4 + 0.15 * len(labels)  # the x range, in models
    # a label rotated by 45° needs about 1.9 times its height of room along the axis
    fits = figures.labels_that_fit(inches * len(labels) / span, 7 * (1.9 if rotated else 4))
    shown = figures.thinned_ticks(len(labels), fits)
    axes.set_xticks(x, minor=True)
    axes.set_xticks(x[shown])
    axes.set_xticklabels([labels[k] for k in shown], rotation=45 if rotated else 0, ha="right", fontsize=7)
    axes.set_xlim(-0.3, len(labels) - 0.7 + 0.15 * len(labels))
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3, which="both")


def _name_line_ends(axes: Any, names: list[tuple[float, str, Any]], end: float) -> None:
    """Each named line's label just right of its last point, moved apart vertically (lowest first) where lines end
    close together, so that no two labels print over each other."""
    low, high = axes.get_ylim()
    gap = 0.07 * (high - low)  # a 7-point label's height on a panel of about 1.6 inches
    placed: list[float] = []
    for value, label, colour in sorted(names, key=lambda item: item[0]):
        y = value if not placed else max(value, placed[-1] + gap)
        placed.append(y)
        axes.text(end + 0.12, y, label, fontsize=7, color=colour, va="center", clip_on=False)


def described(result: Any) -> str:
    """The subtitle of a figure: how many models, and the input they read."""
    return figures_describe({"name": counted(len(result.labels), "model")}, result.inputs)


def figures_describe(model: dict, inputs: dict) -> str:
    from attnscope.output import figures

    return figures.describe_input(model, inputs)


def _values(head: Any, score: str) -> list[float]:
    return [float("nan") if value is None else value for value in head.scores[score]]


def heads_by_models(result: Any, name: str) -> Any:
    """One score of every head (rows, in layer.head order, a line between layers) in every model (columns), with
    a colour bar in the score's unit; a star marks where the head's role of this score formed."""
    import numpy as np

    from attnscope.output import figures

    score = SCORE[name]
    heads = result.heads
    labels = list(result.labels)
    matrix = np.array([[np.nan if v is None else v for v in head.scores[name]] for head in heads])  # (heads, models)
    row = 0.16 if len(heads) <= 48 else max(0.085, 12.0 / len(heads))
    column = 0.55
    margins = (0.9, 1.6, figures.TITLE_SPACE, 0.4 + 0.065 * max(len(label) for label in labels))
    size = (max(3.0, column * len(labels)) + margins[0] + margins[1], row * len(heads) + margins[2] + margins[3])
    figure = figures.new_figure(size)
    axes = figures.place_axes(figure, margins)
    norm, scale = _score_norm(score, matrix)
    cmap = figures.colour_map(scale).with_extremes(bad=figures.MISSING_COLOUR)
    image = axes.imshow(np.ma.masked_invalid(matrix), cmap=cmap, norm=norm, aspect="auto", interpolation="none")
    figures.add_colour_bar(figure, axes, image, figures.score_colour_label(score))
    n_head = result.model["n_head"]
    for layer in range(1, result.model["n_layer"]):
        axes.axhline(layer * n_head - 0.5, color="white", linewidth=0.8)
    _head_and_model_ticks(axes, heads, labels, n_head, row)
    role = next((role.name for role in ROLES if role.score == name), None)
    marked = 0 if role is None else _mark_formed(axes, heads, labels, role, 5 if row < 0.12 else 7)
    star = f"; ★ where {role} formed" if marked else ""
    subtitle = f"{described(result)}{star}"
    figures.add_titles(figure, f"{figures.capital(score.label)} per head in each model", subtitle)
    return figure


def _score_norm(score: Any, matrix: Any) -> tuple[Any, str]:
    """The colours of one score's heads × models (NaN where not measured): a signed score diverging around 0 to its
    largest magnitude (1 at least), a fraction from 0 to 1, any other from 0 to its largest value."""
    import numpy as np
    from matplotlib.colors import Normalize

    from attnscope.output import figures

    if score.unit == SIGNED:
        limit = max(1e-12, float(np.nanmax(np.abs(matrix))) if np.isfinite(matrix).any() else 1.0)
        return Normalize(-max(limit, 1.0), max(limit, 1.0)), figures.DIVERGING_SCALE
    if score.unit == FRACTION:
        return Normalize(0.0, 1.0), figures.SEQUENTIAL_SCALE
    high = float(np.nanmax(matrix)) if np.isfinite(matrix).any() else 1.0
    return Normalize(0.0, high if high > 0 else 1.0), figures.SEQUENTIAL_SCALE


def _head_and_model_ticks(axes: Any, heads: list, labels: list[str], n_head: int, row: float) -> None:
    """Every head's label where they fit (else each layer's first head, thinned), every model's label along x
    (slanted past three), and the axes' titles."""
    from attnscope.output import figures

    fits = figures.labels_that_fit(row * len(heads), 6.5)
    if len(heads) <= fits:
        ticks = list(range(len(heads)))
    else:  # each layer's first head, thinned
        ticks = [k for k in range(0, len(heads), n_head)]
        ticks = [ticks[k] for k in figures.thinned_ticks(len(ticks), fits)]
    axes.set_yticks(ticks)
    axes.set_yticklabels([heads[k].label for k in ticks], fontsize=6.5)
    axes.set_xticks(range(len(labels)))
    axes.set_xticklabels(
        labels, rotation=45 if len(labels) > 3 else 0, ha="right" if len(labels) > 3 else "center", fontsize=7
    )
    axes.set_ylabel("head (layer.head)", fontsize=figures.LABEL_SIZE)
    axes.set_xlabel("model", fontsize=figures.LABEL_SIZE)


def _mark_formed(axes: Any, heads: list, labels: list[str], role: str, size: float) -> int:
    """A star at the model where each head's `role` formed (none where it held it from the first model); how many."""
    marked = 0
    for k, head in enumerate(heads):
        formed = head.formed.get(role)
        if formed is not None and formed != labels[0]:
            axes.plot(
                [labels.index(formed)],
                [k],
                marker="*",
                markersize=size,
                color="white",
                markeredgecolor="black",
                markeredgewidth=0.4,
                linestyle="none",
            )
            marked += 1
    return marked


def divergence_grid(result: Any) -> Any:
    """Two models: each head's divergence, layer × head, on a sequential scale from 0 (exactly 0 is written `0`)."""
    from attnscope.output import head_grids

    matrix = divergence_matrix(result)
    cells = [[divergence_text(value) for value in row] for row in matrix]
    first, second = result.labels
    return head_grids.score_heatmap(
        matrix,
        f"How far each head's attention moved from {first} to {second}",
        "mean JS divergence between the models' rows (bits); 0: unchanged",
        described(result),
        vmin=0.0,
        vmax=None,
        cell_text=cells,
        scale="divergence",
    )


def divergence_text(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value:.2f}" if value >= 0.01 else "<.01"


def divergence_matrix(result: Any) -> Any:
    """(L, H) each head's divergence between the two models."""
    import numpy as np

    matrix = np.zeros((result.model["n_layer"], result.model["n_head"]))
    for head in result.heads:
        matrix[head.layer, head.head] = head.divergence
    return matrix
