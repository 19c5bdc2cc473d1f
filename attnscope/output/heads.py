"""`attnscope heads`, shown: the JSON and CSV of every head, the pictures (role map, a heatmap per score, the maps
of the plotted heads), the terminal's role map and heads table, and the notebook's.

Reads a HeadsResult (analyses.scoring) by duck typing: `model`, `inputs`, `settings`, `notes`, `kind`, `heads` (each
record's `layer`, `head`, `label`, `role` (role, metric, score) and `scores`), `selected`, `selection`, `measured`,
`plotted`, `attention`, `sink_rate` (epsilon, model, layers).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import document, to_csv, to_json
from attnscope.output.views import View, fitted, inputs_read, model_shape, summary
from attnscope.scores.catalog import (
    FRACTION,
    ROLES,
    SCORE,
    SIGNED,
    Score,
    counted,
    roles_for,
    table_columns,
)


def kv_group(model: dict) -> int:
    """Query heads per key/value head: 1, or more with grouped-query attention (query head h reads key/value head
    h // group, as transformers' repeat_kv has it)."""
    return model["n_head"] // model.get("n_kv_head", model["n_head"])


def head_records(heads: Sequence[Any], model: dict) -> list[dict]:
    """One flat record per head (the `heads` list of the JSON and the rows of the CSV): which key/value head it
    reads (grouped-query attention), its role, and every score of the catalog, null where it was not measured."""
    group = kv_group(model)
    return [
        {
            "layer": record.layer,
            "head": record.head,
            "label": record.label,
            "kv_head": record.head // group,
            "role": record.role.role,
            "role_metric": record.role.metric,
            "role_score": record.role.score,
            **record.scores,
        }
        for record in heads
    ]


def sink_rate_record(rate: Any) -> dict:
    """The sink rate in the JSON: `{"epsilon": 0.3, "model": 0.25, "layers": [0.0, 0.5]}`, shares of heads whose
    first_token exceeds epsilon, over the model's heads and over each layer's (Gu et al. 2024)."""
    return {"epsilon": rate.epsilon, "model": rate.model, "layers": list(rate.layers)}


def sink_rate_line(rate: Any) -> str:
    """One line: `sink rate 25 % of heads (first_token > 0.3, Gu et al. 2024); by layer (%): 0 50`."""
    layers = " ".join(f"{100 * share:.0f}" for share in rate.layers)
    return (
        f"sink rate {100 * rate.model:.0f} % of heads (first_token > {rate.epsilon:g}, Gu et al. 2024); "
        f"by layer (%): {layers}"
    )


def heads_document(result: Any, heads: Sequence[Any] | None = None) -> dict:
    """The `heads` JSON: metadata, thresholds, the sink rate (of every head, whatever the selection) and one record
    per head (`heads`: the run's selection when None, every head with the selection set to null when given all of
    them)."""
    selected = result.selected if heads is None else heads
    settings = result.settings if heads is None else {**result.settings, "layer": None, "sort": None, "top": None}
    return document(
        "heads",
        result.model,
        result.inputs,
        settings,
        result.notes,
        sink_rate=sink_rate_record(result.sink_rate),
        heads=head_records(selected, result.model),
    )


class HeadsView(View):
    command = "heads"

    def document(self) -> dict:
        return heads_document(self.result)

    def records(self) -> list[dict]:
        return head_records(self.result.selected, self.result.model)

    def data_files(self, stage: Path) -> list[Path]:
        """heads.json and heads.csv: every head, whatever the selection."""
        result = self.result
        return [
            self.write(stage, "heads.json", to_json(heads_document(result, result.heads))),
            self.write(stage, "heads.csv", to_csv(head_records(result.heads, result.model))),
        ]

    def figures(self) -> dict[str, Any]:
        """role_map, score_<name> per score measured, and attention_<L.H> for each plotted head (by word,
        attention_<L.H>_words, as `show --words` names its picture)."""
        from attnscope.output import attention_maps

        result = self.result
        drawn = {"role_map": heads_role_map(result)}
        for name in drawn_scores(result):
            drawn[f"score_{name}"] = heads_score_heatmap(result, name)
        for layer, head in result.plotted:
            attention = result.attention[layer]
            stem = f"attention_{layer}.{head}" + ("_words" if attention.view == "words" else "")
            drawn[stem] = attention_maps.head_attention(result.model, attention, head)
        return drawn

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result, model, inputs = self.result, self.result.model, self.result.inputs
        read = f"{counted(inputs['n_texts'], 'text')}, {counted(inputs['n_tokens'], 'token')}"
        title = f"Head roles: {model['name']}  ({read})"
        kind, thresholds = result.kind.name, result.settings.get("thresholds")
        return [
            terminal.role_map(result.heads, model["n_layer"], model["n_head"], title, kind),
            sink_rate_line(result.sink_rate),
            HeadsTable(result.selected, "Heads", kind, result.selection.get("sort"), thresholds, kv_group(model)),
        ]

    def notebook(self) -> str:
        """The role map (a grid of cells in the catalog's palette, `Role.colour` with `Role.ink` for the text, as in
        the terminal and the pictures; a legend of the roles present), the sink rate and the table of the selected
        heads."""
        result = self.result
        model = result.model
        title = f"Head roles: {model['name']} ({result.inputs['n_texts']} texts, {result.inputs['n_tokens']} tokens)"
        return notebook.fragment(
            notebook.note_lines(self.notes),
            notebook.role_map(result.heads, model["n_layer"], model["n_head"], title),
            notebook.paragraph(sink_rate_line(result.sink_rate)),
            heads_table_html(result.selected, "Heads", result.kind.name, result.selection.get("sort"), kv_group(model)),
        )

    def summary(self) -> str:
        """The model and what was read, how many heads hold each role, the strongest head of each role, the sink
        rate, the selection and the plotted maps."""
        result = self.result
        lines = [*role_lines(result.heads), sink_rate_line(result.sink_rate)]
        chosen = {name: value for name, value in result.selection.items() if value is not None}
        if chosen:
            words = ", ".join(f"{name} {value}" for name, value in chosen.items())
            lines.append(f"selected ({words}): {len(result.selected)} of {len(result.heads)} heads in .selected")
        if result.plotted:
            lines.append(fitted("maps in .attention: ", [f"{layer}.{head}" for layer, head in result.plotted], ", "))
        headline = f"{model_shape(result.model)}{inputs_read(result.inputs)}"
        return summary(self, headline, lines, [".heads", ".select(layer, sort, top)"])


def role_lines(heads: Sequence[Any]) -> list[str]:
    """Two lines of a summary: how many heads hold each role (the catalog's order), and the strongest head of each
    role but mixed (the highest deciding score), `1.0 induction 0.96`."""
    held = [role.name for role in ROLES if any(record.role.role == role.name for record in heads)]
    counts = [f"{role} {sum(record.role.role == role for record in heads)}" for role in held]
    strongest = []
    for role in held:
        if role != "mixed":
            best = max((record for record in heads if record.role.role == role), key=lambda record: record.role.score)
            strongest.append(f"{best.label} {role} {best.role.score:.2f}")
    return [fitted("roles: ", counts), fitted("strongest: ", strongest)]


# -------------------------------------------------------------------------------------------------------------- figures


def score_matrix(heads: Sequence, name: str, n_layer: int, n_head: int) -> Any:
    """(n_layer, n_head) of one score of every head record."""
    import numpy as np

    matrix = np.full((n_layer, n_head), np.nan)
    for record in heads:
        value = record.scores[name]
        matrix[record.layer, record.head] = np.nan if value is None else value
    return matrix


def heads_role_map(result: Any) -> Any:
    """The layer × head map of roles of a HeadsResult, each cell labelled with the score that decided its role
    (named in a mixed head's cell, where it is only the closest to its threshold)."""
    from attnscope.output import figures, head_grids

    n_layer, n_head = result.model["n_layer"], result.model["n_head"]
    roles = [[""] * n_head for _ in range(n_layer)]
    deciding = [[""] * n_head for _ in range(n_layer)]
    for record in result.heads:
        role = record.role
        roles[record.layer][record.head] = role.role
        named = f"{SCORE[role.metric].short} " if role.role == "mixed" else ""
        deciding[record.layer][record.head] = f"{named}{role.score:.2f}"
    return head_grids.role_map(roles, deciding, "Head roles", figures.describe_input(result.model, result.inputs))


def drawn_scores(result: Any) -> list[str]:
    """The scores of a HeadsResult that have a heatmap: those measured that differ between heads."""
    return [name for name in result.measured if SCORE[name].per_head]


def heads_score_heatmap(result: Any, name: str) -> Any:
    """One score of every head of a HeadsResult, layer × head: fractions on [0, 1], entropy from 0, a signed
    score (local_lift) on a diverging map centred at 0."""
    from attnscope.output import figures, head_grids

    score = SCORE[name]
    matrix = score_matrix(result.heads, name, result.model["n_layer"], result.model["n_head"])
    if score.unit == SIGNED:
        limits = {"vmin": None, "vmax": 1.0, "signed": True}  # a lift is at most 1
    elif score.unit == FRACTION:
        limits = {"vmin": 0.0, "vmax": 1.0}
    else:
        limits = {"vmin": 0.0, "vmax": None}
    title = f"{figures.capital(score.label)} per head"
    subtitle = figures.describe_input(result.model, result.inputs)
    return head_grids.score_heatmap(matrix, title, figures.score_colour_label(score), subtitle, **limits)


# ------------------------------------------------------------------------------------------------------------- terminal

# What each score the heads table can show is, in words, for the key under the table (the catalog's descriptions
# are definitions, with formulas; these are for a reader of the table). `share`: of a row's attention, 0 to 1.
SCORE_KEYS = {
    "previous_token": "share on the token before",
    "first_token": "share on the first token",
    "self": "share on the token itself",
    "next_token": "share on the token after",
    "last_token": "share on the last token",
    "induction": "share on the token after an earlier copy (probe)",
    "duplicate_token": "share on the earlier copy itself (probe)",
    "retrieval": "share of copied needle tokens whose strongest key is that token (needle probe)",
    "local": "share in the local window",
    "local_lift": "local lift: 0 as uniform, 1 all in the window",
    "local_uniform": "share in the local window if attention were uniform",
    "entropy_normalized": "entropy / its maximum: 1 uniform",
    "entropy": "entropy in nats",
    "confidence": "weight of the strongest key",
}


class HeadsTable:
    """One row per head: its label, role, what decided the role, and the catalog's table columns for this kind of
    model (`catalog.table_columns`: sorted by a score that has no column of its own, it takes its sibling's place,
    entropy in nats where Hnorm was, the raw local share where lift was); `-` is a score that was not measured.

    With grouped-query attention (`group` query heads share each key/value head), a `kv` column says which
    key/value head each query head reads; without, there is none.

    Fits the console's width: two spaces between columns where every column fits so, else one (a decoder's eleven
    columns then fit a plain 80-column terminal); where even that is too wide, score columns are left out (the
    sort's last, the others from the right) before the head, the role and what decided it, and the key under the
    table says which; the key names every header in words."""

    def __init__(
        self,
        heads: Sequence[Any],
        title: str,
        kind: str,
        sort: str | None = None,
        thresholds: dict[str, float] | None = None,
        group: int = 1,
    ):
        self.heads, self.title, self.kind, self.sort, self.group = heads, title, kind, sort, group
        self.gap = 1  # padding right of each column, beside the box's own space: set by fitting_columns
        self.thresholds = thresholds or {role.name: role.threshold for role in ROLES if role.threshold is not None}
        self.columns = table_columns(kind, sort)

    def thresholds_in_words(self) -> str:
        """`0.5 (Hnorm 0.8)`: the thresholds of the roles of this kind, the commonest first, the others by score."""
        by_score = {
            SCORE[role.score].short: self.thresholds.get(role.name, role.threshold)
            for role in roles_for(self.kind)
            if role.score is not None
        }
        values = list(by_score.values())
        common = max(values, key=values.count)
        others = ", ".join(f"{short} {value:g}" for short, value in by_score.items() if value != common)
        return f"{common:g}" + (f" ({others})" if others else "")

    def table(self, columns: Sequence[Score]) -> Any:
        from rich import box
        from rich.table import Table

        from attnscope.output.terminal import role_cell

        table = Table(
            title=self.title,
            title_justify="left",
            header_style="bold",
            box=box.SIMPLE_HEAD,
            padding=(0, self.gap, 0, 0),
        )
        table.add_column("head", justify="right", no_wrap=True)
        if self.group > 1:
            table.add_column("kv", justify="right", no_wrap=True)
        table.add_column("role", no_wrap=True)
        table.add_column("decided by", justify="right", no_wrap=True)
        for score in columns:
            table.add_column(score.short, justify="right", no_wrap=True)
        for record in self.heads:
            table.add_row(
                record.label,
                *([str(record.head // self.group)] if self.group > 1 else []),
                role_cell(record.role.role),
                f"{SCORE[record.role.metric].short} {record.role.score:.2f}",
                *("-" if record.scores[s.name] is None else f"{record.scores[s.name]:.2f}" for s in columns),
            )
        return table

    def fitting_columns(self, console: Any, options: Any) -> list[Score]:
        """The score columns that fit in the width: the sort's first, then in table order (and the gap between
        columns: two spaces when every column fits so, else one)."""
        wide = options.update_width(10_000)
        self.gap = 1
        if console.measure(self.table(self.columns), options=wide).maximum > options.max_width:
            self.gap = 0
        wanted = sorted(self.columns, key=lambda score: score.name != self.sort)
        shown: list[Score] = []
        for score in wanted:
            trial = [column for column in self.columns if column in shown or column is score]
            natural = console.measure(self.table(trial), options=options.update_width(10_000)).maximum
            if natural > options.max_width:
                break
            shown = trial
        return shown

    def key(self, shown: Sequence[Score], width: int) -> Any:
        from rich.text import Text

        from attnscope.output.terminal import packed

        def entry(header: str, words: str) -> Text:
            return Text.assemble((header, "bold"), " ", words)

        entries = [
            entry("head", "layer.head, from 0"),
            *(
                [entry("kv", f"the key/value head it reads ({self.group} query heads share each)")]
                if self.group > 1
                else []
            ),
            entry(
                "decided by",
                f"the score that passed its threshold, {self.thresholds_in_words()}; for mixed, the score "
                "closest to its threshold",
            ),
            *(entry(score.short, SCORE_KEYS[score.name]) for score in shown),
            Text("share: of a row's attention, 0 to 1; scores are means over the rows read"),
        ]
        hidden = [score.short for score in self.columns if score not in shown]
        if hidden:
            entries.append(Text(f"left out for want of width: {', '.join(hidden)} (see --json or --csv)", "dim"))
        return packed(entries, width, "  ·  ")

    def __rich_console__(self, console: Any, options: Any) -> Any:
        shown = self.fitting_columns(console, options)
        yield self.table(shown)
        yield self.key(shown, options.max_width)


# ------------------------------------------------------------------------------------------------------------- notebook


def heads_table_html(heads: Sequence[Any], title: str, kind: str, sort: str | None, group: int = 1) -> str:
    """One row per head: the key/value head it reads (grouped-query attention only, as the terminal's `kv`), its
    role (coloured), the score that decided it, and the terminal table's score columns."""
    columns = table_columns(kind, sort)
    kv = group > 1
    rows = [
        [
            notebook.cell(record.label),
            *([notebook.cell(str(record.head // group))] if kv else []),
            notebook.role_cell(record.role.role, record.role.role),
            notebook.cell(f"{SCORE[record.role.metric].short} {record.role.score:.2f}"),
            *(notebook.cell(notebook.number(record.scores[score.name], 2)) for score in columns),
        ]
        for record in heads
    ]
    return notebook.table(
        ["head", *(["kv"] if kv else []), "role", "by", *(score.short for score in columns)], rows, title
    )
