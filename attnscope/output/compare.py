"""`attnscope compare`, shown: the JSON (each model's loss; a value per model for every score of every head, its
roles, when each role formed and its transition, its largest change, the divergence between two models) and the long
CSV (one row per head and model), the pictures (the loss and the score trajectories, a heads × models heatmap of one
score, the divergence grid of two models), the terminal's and notebook's tables.

Reads a CompareResult (analyses.compare) by duck typing: `model`, `inputs`, `settings`, `notes`, `kind`, `labels`,
`losses`, `has_loss`, `heads` (each with `layer`, `head`, `label`, `scores`, `roles`, `formed`, `transition`,
`change` (score, value, model, or None), `divergence`), `measured`, `score`, `has_divergence`,
`ranked_by_divergence()`, `role_changes()` (the most changed first), `sink_rates` (each model's: epsilon, model,
layers).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.compare_figures import divergence_matrix, divergence_text
from attnscope.output.documents import result_document
from attnscope.output.views import View, fitted, inputs_read, model_shape, shown_rows, summary
from attnscope.scores.catalog import ROLES, SCORE, SINK_EPSILON, counted

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
            "transition": head.transition,
            "change": None if head.change is None else vars(head.change),
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


def sink_rates_record(result: Any) -> dict | None:
    """The sink rate of each model in the JSON: `{"epsilon": 0.3, "models": [0.0, 0.75], "layers": [[0.0, 0.0],
    [0.5, 1.0]]}`, `models[k]` over model k's heads and `layers[k][l]` over its layer l's (Gu et al. 2024)."""
    rates = result.sink_rates
    if not rates:
        return None
    return {
        "epsilon": rates[0].epsilon,
        "models": [rate.model for rate in rates],
        "layers": [list(rate.layers) for rate in rates],
    }


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


def transition_text(head: Any) -> str:
    """The transition of each role a head holds to the end (those `formed_text` names): `induction at s2`."""
    formed = [role for role, label in head.formed.items() if label is not None]
    shown = [f"{role} at {head.transition[role]}" for role in formed if head.transition.get(role) is not None]
    return ", ".join(shown) or "-"


def change_text(head: Any) -> str:
    """A head's largest step of a deciding score: `+0.170 induc (s3)`."""
    change = head.change
    return "-" if change is None else f"{change.value:+.3f} {SCORE[change.score].short} ({change.model})"


LOSS_UNIT = "nats per predicted token"


SHOWN = 20  # rows of each ranked table the terminal and a notebook show without --top


class CompareView(View):
    command = "compare"

    def document(self) -> dict:
        result = self.result
        return result_document(
            "compare",
            result,
            models=list(result.labels),
            loss=list(result.losses) if result.losses else None,
            sink_rate=sink_rates_record(result),
            heads=compare_heads(result),
        )

    def records(self) -> list[dict]:
        return compare_records(self.result)

    def figures(self) -> dict[str, Any]:
        """trajectories (the loss and the deciding score of each role across the models), score_<name> (heads ×
        models), and divergence (layer × head) with two models."""
        from attnscope.output.compare_figures import divergence_grid, heads_by_models, trajectories

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
        shown.append(terminal.records_table(role_counts(result), role_counts_title(result)))
        changing = role_change_rows(result)
        if changing:
            more = f" (the {top} that changed most of {len(changing)})" if len(changing) > top else ""
            shown.append(
                terminal.records_table(changing[:top], f"Heads whose role changes, the most changed first{more}")
            )
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
        parts.append(notebook.records_table(role_counts(result), role_counts_title(result)))
        changing = role_change_rows(result)
        if changing:
            parts.append(notebook.records_table(changing[:top], "Heads whose role changes, the most changed first"))
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
        if result.has_loss:
            ends = [(labels[k], result.losses[k]) for k in sorted({0, len(labels) - 1})]
            shown = [f"{label} {'-' if loss is None else f'{loss:.3f}'}" for label, loss in ends]
            lines.append(f"loss ({LOSS_UNIT}): {' → '.join(shown)}")
        if result.sink_rates:
            epsilon = result.sink_rates[0].epsilon
            shown = [f"{labels[k]} {100 * result.sink_rates[k].model:.0f} %" for k in sorted({0, len(labels) - 1})]
            lines.append(f"sink rate (first_token > {epsilon:g}): {' → '.join(shown)}")
        if result.has_divergence:
            moved = [f"{head.label} {head.divergence:.3f}" for head in result.ranked_by_divergence()]
            lines.append(fitted("largest divergence (JSD bits): ", moved))
        changing = [f"{head.label} {changed_roles(head, labels)}" for head in result.role_changes()]
        lines.append(fitted("role changes: ", changing) or "no head changes its role")
        return summary(self, headline, lines, [".heads", ".ranked_by_divergence()", ".role_changes()"])


# ---------------------------------------------------------------------------------------------------------- tables


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
            Text(divergence_text(float(value)), style="bold" if value >= largest / 2 else "dim" if value == 0 else "")
            for value in row
        ]
        table.add_row(str(layer), *cells)
    return Group(Text(f"Divergence per head: {DIVERGENCE_UNIT}", style="bold"), table)


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
    each model, its sink rate (the share of heads with first_token > SINK_EPSILON, a percentage) and its loss when
    measured:
    one row per model."""
    held = [role for role in ROLES if any(role.name in head.roles for head in result.heads)]
    rows = []
    for k, label in enumerate(result.labels):
        row: dict[str, Any] = {"model": label}
        if result.has_loss:
            row["loss (nats)"] = result.losses[k]
        if result.sink_rates:
            row["sink rate %"] = f"{100 * result.sink_rates[k].model:.1f}"  # a share of heads: 74.4, not 74.400
        row.update({role.short: sum(head.roles[k] == role.name for head in result.heads) for role in held})
        rows.append(row)
    return rows


def role_counts_title(result: Any) -> str:
    loss = f", and its loss ({LOSS_UNIT})" if result.has_loss else ""
    sinks = f", its sink rate (heads with first_token > {SINK_EPSILON:g}, Gu et al. 2024)" if result.sink_rates else ""
    return f"Heads per role in each model{sinks}{loss}"


def role_change_rows(result: Any) -> list[dict]:
    """The heads whose role changes, the most changed first: their roles, where each role formed (a threshold held
    to the end), its transition (the end of the largest rise of its score) and the largest step of a score."""
    return [
        {
            "head": head.label,
            "roles": changed_roles(head, result.labels),
            "formed": formed_text(head),
            "transition": transition_text(head),
            "largest step": change_text(head),
        }
        for head in result.role_changes()
    ]
