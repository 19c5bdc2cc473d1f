"""`attnscope compare`, shown: the JSON (a value per model for every score of every head, its roles, when each role
formed, the divergence between two models) and the long CSV (one row per head and model), the pictures (score
trajectories, a heads × models heatmap of one score, the divergence grid of two models), the terminal's and notebook's
tables.

Reads a CompareResult (analyses.compare) by duck typing: `model`, `inputs`, `settings`, `notes`, `kind`, `labels`,
`heads` (each with `layer`, `head`, `label`, `scores`, `roles`, `formed`, `divergence`), `measured`, `score`,
`has_divergence`, `ranked_by_divergence()`, `role_changes()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import document
from attnscope.output.views import View, fitted, inputs_read, model_shape, shown_rows, summary
from attnscope.scores.catalog import FRACTION, ROLE, ROLES, SCORE, SIGNED, counted

DIVERGENCE_UNIT = "mean JS divergence between the two models' rows (bits)"


def compare_heads(result: Any) -> list[dict]:
    """The `heads` of the JSON: per head its scores (a value per model), roles, formation and divergence."""
    records = []
    for head in result.heads:
        record: dict[str, Any] = {
            "layer": head.layer,
            "head": head.head,
            "label": head.label,
            "scores": head.scores,
            "roles": head.roles,
            "formed": head.formed,
        }
        if result.has_divergence:
            record["divergence"] = head.divergence
        records.append(record)
    return records


def compare_records(result: Any) -> list[dict]:
    """The long CSV: one row per head and model (head-major, models in the order given)."""
    records = []
    for head in result.heads:
        for index, label in enumerate(result.labels):
            record: dict[str, Any] = {
                "layer": head.layer,
                "head": head.head,
                "label": head.label,
                "model": label,
                "model_index": index,
                "role": head.roles[index],
                **{name: values[index] for name, values in head.scores.items()},
            }
            if result.has_divergence:
                record["divergence"] = head.divergence
            records.append(record)
    return records


def changed_roles(head: Any, labels: Sequence[str]) -> str:
    """A head's roles across the models, each run of one role once: `mixed → induction (s4)`."""
    runs: list[str] = []
    for index, role in enumerate(head.roles):
        if index == 0 or role != head.roles[index - 1]:
            runs.append(role if index == 0 else f"{role} ({labels[index]})")
    return " → ".join(runs)


def formed_text(head: Any) -> str:
    """The roles a head holds to the end, with the model from which it holds them: `induction from s4`."""
    return ", ".join(f"{role} from {label}" for role, label in head.formed.items() if label is not None) or "-"


SHOWN = 20  # rows of each ranked table the terminal and a notebook show without --top


class CompareView(View):
    command = "compare"

    def document(self) -> dict:
        result = self.result
        return document(
            "compare",
            result.model,
            result.inputs,
            result.settings,
            result.notes,
            models=list(result.labels),
            heads=compare_heads(result),
        )

    def records(self) -> list[dict]:
        return compare_records(self.result)

    def figures(self) -> dict[str, Any]:
        """trajectories (the deciding score of each role across the models), score_<name> (heads × models), and
        divergence (layer × head) with two models."""
        result = self.result
        drawn = {"trajectories": trajectories(result), f"score_{result.score}": heads_by_models(result, result.score)}
        if result.has_divergence:
            drawn["divergence"] = divergence_grid(result)
        return drawn

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result = self.result
        top = shown_rows(result, SHOWN)
        shown: list[Any] = [f"Compared {counted(len(result.labels), 'model')}: {', '.join(result.labels)}"]
        if result.has_divergence:
            shown.append(divergence_table(divergence_matrix(result)))
            shown.append(terminal.records_table(divergence_rows(result)[:top], "Heads ranked by divergence"))
        shown.append(terminal.records_table(role_counts(result), "Heads per role in each model"))
        changing = role_change_rows(result)
        if changing:
            more = f" (the first {top} of {len(changing)})" if len(changing) > top else ""
            shown.append(terminal.records_table(changing[:top], f"Heads whose role changes{more}"))
        else:
            shown.append("No head changes its role between the models.")
        return shown

    def notebook(self) -> str:
        result = self.result
        top = shown_rows(result, SHOWN)
        parts = [
            notebook.note_lines(self.notes),
            notebook.paragraph(f"Compared {counted(len(result.labels), 'model')}: {', '.join(result.labels)}"),
        ]
        if result.has_divergence:
            matrix = divergence_matrix(result)
            largest = max(float(matrix.max()), 1e-300)
            parts.append(
                notebook.layer_head_grid(
                    matrix.tolist(), f"Divergence per head, {DIVERGENCE_UNIT}", largest, "divergence"
                )
            )
            parts.append(notebook.records_table(divergence_rows(result)[:top], "Heads ranked by divergence"))
        parts.append(notebook.records_table(role_counts(result), "Heads per role in each model"))
        changing = role_change_rows(result)
        if changing:
            parts.append(notebook.records_table(changing[:top], "Heads whose role changes"))
        return notebook.fragment(*parts)

    def summary(self) -> str:
        """The models compared, the heads per role in the first and the last model, with two models the heads that
        moved most, and the heads whose role changes (how, and from which model it holds)."""
        result = self.result
        labels = list(result.labels)
        models = fitted("", labels, ", ", 40)
        headline = (
            f"of {counted(len(labels), 'model')} ({models}): {model_shape({**result.model, 'name': None})} each"
            f"{inputs_read(result.inputs)}"
        )
        lines = []
        for index in sorted({0, len(labels) - 1}):
            held = [(role.name, sum(head.roles[index] == role.name for head in result.heads)) for role in ROLES]
            lines.append(fitted(f"roles in {labels[index]}: ", [f"{name} {count}" for name, count in held if count]))
        if result.has_divergence:
            moved = [f"{head.label} {head.divergence:.3f}" for head in result.ranked_by_divergence()]
            lines.append(fitted("largest divergence (JSD bits): ", moved))
        changing = [f"{head.label} {changed_roles(head, labels)}" for head in result.role_changes()]
        lines.append(fitted("role changes: ", changing) or "no head changes its role")
        return summary(self, headline, lines, [".heads", ".ranked_by_divergence()", ".role_changes()"])


# ---------------------------------------------------------------------------------------------------------- tables


def divergence_matrix(result: Any) -> Any:
    import numpy as np

    matrix = np.zeros((result.model["n_layer"], result.model["n_head"]))
    for head in result.heads:
        matrix[head.layer, head.head] = head.divergence
    return matrix


def divergence_table(matrix: Any) -> Any:
    """The divergence of every head as a layer × head table of bits (exactly 0 written `0`)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    table.add_column("L\\H", justify="right", style="bold")
    for head in range(matrix.shape[1]):
        table.add_column(str(head), justify="right")
    largest = max(float(matrix.max()), 1e-300)
    for layer, row in enumerate(matrix):
        cells = [
            Text(_divergence_text(float(value)), style="bold" if value >= largest / 2 else "dim" if value == 0 else "")
            for value in row
        ]
        table.add_row(str(layer), *cells)
    return Group(Text(f"Change per head: {DIVERGENCE_UNIT}", style="bold"), table)


def divergence_rows(result: Any) -> list[dict]:
    """Heads by divergence, largest first, with their role in each of the two models."""
    first, second = result.labels
    return [
        {
            "head": head.label,
            "divergence (bits)": head.divergence,
            f"role in {first}": head.roles[0],
            f"role in {second}": head.roles[1],
        }
        for head in result.ranked_by_divergence()
    ]


def role_counts(result: Any) -> list[dict]:
    """How many heads hold each role (the roles held anywhere, in the catalog's order, by their short labels) in
    each model: one row per model."""
    held = [role for role in ROLES if any(role.name in head.roles for head in result.heads)]
    return [
        {"model": label, **{role.short: sum(head.roles[k] == role.name for head in result.heads) for role in held}}
        for k, label in enumerate(result.labels)
    ]


def role_change_rows(result: Any) -> list[dict]:
    return [
        {"head": head.label, "roles": changed_roles(head, result.labels), "formed": formed_text(head)}
        for head in result.role_changes()
    ]


# --------------------------------------------------------------------------------------------------------- figures

PANEL = (3.3, 2.5)  # inches of one trajectory panel
PANEL_MARGINS = (0.75, 0.25, 0.35, 0.75)  # left, right, top (the panel's title), bottom (the models' labels)
FOOTER = 0.55  # inches under the panels for the key
NAMED_LINES = 6  # heads named at their line's end in a panel; the others are drawn without a name


def trajectories(result: Any) -> Any:
    """One small panel per role held by some head in some model (mixed aside): the role's deciding score in each
    model (x: the models in the order given) for every head that ever holds it. Heads that hold it to the end are
    coloured, named at the end of their line (the strongest NAMED_LINES) and marked with a star where the role
    formed; heads that hold it only for a while are grey. The dashed line is the role's threshold."""
    import numpy as np

    from attnscope.output import figures, line_plots

    labels = list(result.labels)
    roles = [role for role in ROLES if role.score is not None and any(role.name in h.roles for h in result.heads)]
    columns = max(1, min(3, len(roles)))
    rows = max(1, -(-len(roles) // columns))  # one row of room for the message when there is no panel
    label_room = max(0.0, 0.06 * max(len(label) for label in labels) - 0.3)  # rotated model labels
    panel_h = PANEL[1] + label_room
    width = max(7.0, columns * PANEL[0])
    size = (width, rows * panel_h + figures.TITLE_SPACE + FOOTER)
    offset = (width - columns * PANEL[0]) / 2  # the panels centred
    figure = figures.new_figure(size)
    x = np.arange(len(labels))
    for index, role in enumerate(roles):
        row, column = divmod(index, columns)
        left = offset + column * PANEL[0] + PANEL_MARGINS[0]
        bottom = size[1] - figures.TITLE_SPACE - (row + 1) * panel_h + PANEL_MARGINS[3] + label_room
        inner = (
            PANEL[0] - PANEL_MARGINS[0] - PANEL_MARGINS[1],
            panel_h - PANEL_MARGINS[2] - PANEL_MARGINS[3] - label_room,
        )
        axes = figure.add_axes((left / size[0], bottom / size[1], inner[0] / size[0], inner[1] / size[1]))
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
            colour = (
                line_plots.SERIES_COLOURS[rank % len(line_plots.SERIES_COLOURS)] if named else ROLE[role.name].colour
            )
            axes.plot(x, values, color=colour, linewidth=1.5 if named else 0.8, alpha=1.0 if named else 0.6, zorder=2)
            start = labels.index(head.formed[role.name])
            axes.plot(  # a head that holds the role from the first model on has no star: it did not form here
                [start] if start > 0 else [],
                [values[start]] if start > 0 else [],
                marker="*",
                markersize=9,
                color=colour,
                markeredgecolor="black",
                markeredgewidth=0.5,
                zorder=3,
                linestyle="none",
            )
            if named:
                names.append((values[-1], head.label, colour))
        threshold = result.settings["thresholds"].get(role.name)
        if threshold is not None:
            axes.axhline(threshold, color="#555555", linestyle="--", linewidth=0.8, zorder=0)
        top = 1.0 if score.unit in (FRACTION, SIGNED) else None
        axes.set_ylim(min(0.0, axes.get_ylim()[0]), top if top is not None else axes.get_ylim()[1])
        _name_line_ends(axes, names, x[-1])
        rotated = bool(label_room) or len(labels) > 4
        span = len(labels) - 0.4 + 0.15 * len(labels)  # the x range, in models
        # a label rotated by 45° needs about 1.9 times its height of room along the axis
        fits = figures.labels_that_fit(inner[0] * len(labels) / span, 7 * (1.9 if rotated else 4))
        shown = figures.thinned_ticks(len(labels), fits)  # every model a grid line, only some named
        axes.set_xticks(x, minor=True)
        axes.set_xticks(x[shown])
        axes.set_xticklabels([labels[k] for k in shown], rotation=45 if rotated else 0, ha="right", fontsize=7)
        axes.set_xlim(-0.3, len(labels) - 0.7 + 0.15 * len(labels))
        axes.tick_params(labelsize=7)
        axes.set_ylabel(score.short if len(score.label) > 24 else score.label, fontsize=8)
        axes.set_title(f"{role.name}: {len(formed)} formed, {len(passing)} for a while", fontsize=9)
        axes.grid(alpha=0.3, which="both")
    if not roles:
        figure.text(
            0.5,
            0.5,
            "No head holds a role other than mixed in any of the models: no score passes its threshold",
            ha="center",
            va="center",
            fontsize=9,
            color=figures.SUBTITLE_COLOUR,
        )
    figures.add_titles(figure, "Each role's deciding score across the models", described(result))
    key = (
        "★ where the role formed: the head holds it from that model to the last (no star: from the first); "
        "coloured: heads that hold the role in the last model (the strongest named); grey: heads that held it only "
        "for a while; dashed: the threshold"
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
    from matplotlib.colors import Normalize

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
    if score.unit == SIGNED:
        limit = max(1e-12, float(np.nanmax(np.abs(matrix))) if np.isfinite(matrix).any() else 1.0)
        norm, scale = Normalize(-max(limit, 1.0), max(limit, 1.0)), figures.DIVERGING_SCALE
    elif score.unit == FRACTION:
        norm, scale = Normalize(0.0, 1.0), figures.SEQUENTIAL_SCALE
    else:
        high = float(np.nanmax(matrix)) if np.isfinite(matrix).any() else 1.0
        norm, scale = Normalize(0.0, high if high > 0 else 1.0), figures.SEQUENTIAL_SCALE
    cmap = figures.colour_map(scale).with_extremes(bad=figures.MISSING_COLOUR)
    image = axes.imshow(np.ma.masked_invalid(matrix), cmap=cmap, norm=norm, aspect="auto", interpolation="none")
    figures.add_colour_bar(figure, axes, image, figures.score_colour_label(score))
    n_head = result.model["n_head"]
    for layer in range(1, result.model["n_layer"]):
        axes.axhline(layer * n_head - 0.5, color="white", linewidth=0.8)
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
    role = next((role.name for role in ROLES if role.score == name), None)
    marked = 0
    if role is not None:
        for k, head in enumerate(heads):
            formed = head.formed.get(role)
            if formed is not None and formed != labels[0]:
                axes.plot(
                    [labels.index(formed)],
                    [k],
                    marker="*",
                    markersize=5 if row < 0.12 else 7,
                    color="white",
                    markeredgecolor="black",
                    markeredgewidth=0.4,
                    linestyle="none",
                )
                marked += 1
    star = f"; ★ where {role} formed" if marked else ""
    subtitle = f"{described(result)}{star}"
    figures.add_titles(figure, f"{figures.capital(score.label)} per head in each model", subtitle)
    return figure


def divergence_grid(result: Any) -> Any:
    """Two models: each head's divergence, layer × head, on a sequential scale from 0 (exactly 0 is written `0`)."""
    from attnscope.output import head_grids

    matrix = divergence_matrix(result)
    cells = [[_divergence_text(value) for value in row] for row in matrix]
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


def _divergence_text(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value:.2f}" if value >= 0.01 else "<.01"
