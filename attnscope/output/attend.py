"""`attnscope attend`, shown: where one word looks in every layer and head: the JSON (every head's full row and top
keys), the CSV of every head, the layer × head picture, the terminal's and notebook's grid and table.

Reads an AttendResult (analyses.attend) by duck typing: `model`, `settings`, `notes`, `tokens`, `labels`, `bos`,
`view`, `rows` (L, H, n), `word_rows`, `from_position(s)`, `from_name`, `to_token`, `to_positions`, `to_words`,
`to_weight`, `top_keys()`, `strongest()`, `strength()`, `key_name()`, `key_text()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import document
from attnscope.output.views import TopView, fitted, shown_rows, summary, words_field
from attnscope.scores.catalog import counted
from attnscope.scores.words import CONTINUED_LEGEND, WORDS

SHOWN = 10  # the strongest heads the terminal and a notebook list without --top


def attend_records(result: Any, ranked: bool = False) -> list[dict]:
    """One flat record per head, layer.head order (`ranked`: the strongest first, the first --top): the weight on
    the target (when one was given) and the head's top keys: tokens (position, exact token text, weight), or in the
    words view words (word index, word text, weight)."""
    n_layer, n_head = result.rows.shape[:2]
    heads = [(layer, head) for layer in range(n_layer) for head in range(n_head)]
    if ranked:
        heads = result.strongest(result.settings["top"] or n_layer * n_head)
    return [_attend_record(result, layer, head) for layer, head in heads]


def _attend_record(result: Any, layer: int, head: int) -> dict[str, Any]:
    record: dict[str, Any] = {"layer": layer, "head": head, "label": f"{layer}.{head}"}
    if result.to_weight is not None:
        record["to_weight"] = float(result.to_weight[layer, head])
    for rank, (key, weight) in enumerate(result.top_keys(layer, head), start=1):
        if result.view == "words":
            record[f"top{rank}_word"] = key
            record[f"top{rank}_text"] = result.labels.word_text[key]
        else:
            record[f"top{rank}_position"] = key
            record[f"top{rank}_token"] = result.tokens[key]
        record[f"top{rank}_weight"] = weight
    return record


class AttendView(TopView):
    command = "attend"

    def document(self, every: bool = False) -> dict:
        """The query word, the target, one record per head, the strongest heads (the first --top, or all) and the
        full attention row of every head (`rows[layer][head][key]`, over tokens); in the words view also `words`
        (each word's token positions) and `word_rows[layer][head][word]`."""
        result = self.result
        every_head = result.rows.shape[0] * result.rows.shape[1]
        top = every_head if every else result.settings["top"] or every_head
        source = {
            "token": "".join(result.tokens[p] for p in result.from_positions),
            "position": result.from_position,
            "positions": result.from_positions,
            "word": result.labels.text(result.from_positions),
        }
        target = None
        if result.to_token is not None:
            target = {
                "token": result.to_token,
                "positions": result.to_positions,
                "words": [list(span) for span in result.to_words],
            }
        words = {}
        if result.view == "words":
            words = {"words": words_field(result.labels), "word_rows": result.word_rows.tolist()}
        return document(
            "attend",
            result.model,
            {
                "tokens": result.tokens,
                "n_tokens": len(result.tokens),
                "bos": result.bos,
                "labels": result.labels.shown,
            },
            result.settings,
            result.notes,
            **{"from": source},
            to=target,
            view=result.view,
            heads=attend_records(result),
            strongest=[f"{layer}.{head}" for layer, head in result.strongest(top)],
            rows=result.rows.tolist(),
            **words,
        )

    def rows(self, every: bool) -> list[dict]:
        """--csv's rows: the heads, the strongest first (the first --top); `every` (attend.csv): every head,
        layer.head order."""
        return attend_records(self.result, ranked=not every)

    def figures(self) -> dict[str, Any]:
        """attend: a layer × head heatmap of the weight on the target, or, without one, of each head's largest
        weight with the token (or word) it falls on written in the cell."""
        return {"attend": attend_figure(self.result)}

    def shown(self) -> AttendShown:
        """What the terminal and a notebook show, one computation for both."""
        result = self.result
        source = result.from_name
        if result.to_weight is not None:
            targets = ", ".join(result.labels.describe(span) for span in result.to_words)
            grid, grid_title = result.to_weight, f"Attention from {source} to {targets}"
        else:
            skipped = " (the first key left out)" if result.settings.get("skip_first") else ""
            grid, grid_title = result.strength(), f"Largest weight of each head from {source}{skipped}"
        rows = [
            (
                f"{layer}.{head}",
                None if result.to_weight is None else float(result.to_weight[layer, head]),
                [(result.key_name(key), weight) for key, weight in result.top_keys(layer, head)],
            )
            for layer, head in result.strongest(shown_rows(result, SHOWN))
        ]
        kind = "word" if result.view == "words" else "token"
        header = f"top {result.settings['tokens']} {kind}s ({kind}@position: weight)"
        return AttendShown(grid, grid_title, rows, header, f"Strongest heads from {source}")

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        shown = self.shown()
        return [
            terminal.layer_head_grid(shown.grid, shown.grid_title),
            attend_table(shown.rows, shown.header, shown.table_title),
        ]

    def notebook(self) -> str:
        shown = self.shown()  # the terminal's grid and table
        targeted = any(weight is not None for _, weight, _ in shown.rows)
        rows = [
            [
                notebook.cell(label),
                *([notebook.cell(notebook.number(weight))] if targeted else []),
                notebook.cell(", ".join(f"{name}: {value:.2f}" for name, value in tops), "text-align:left"),
            ]
            for label, weight, tops in shown.rows
        ]
        headers = ["head", *(["to target"] if targeted else []), shown.header]
        grid = notebook.layer_head_grid(shown.grid.tolist(), shown.grid_title)
        return notebook.fragment(
            notebook.note_lines(self.notes), grid, notebook.table(headers, rows, shown.table_title)
        )

    def summary(self) -> str:
        """The model, the query word (and the target), the text read, and the strongest heads as the terminal's
        table ranks them: each head's weight on the target, or without one its strongest key and weight."""
        result = self.result
        target = ""
        if result.to_token is not None:
            target = " to " + ", ".join(result.labels.describe(span) for span in result.to_words)
        text = f"text {result.settings.get('index', 0)} ({counted(len(result.tokens), 'token')})"
        headline = f"{result.model.get('name')}: from {result.from_name}{target}, {text}"
        if result.to_weight is not None:
            heads = [f"{layer}.{head} {result.to_weight[layer, head]:.3f}" for layer, head in result.strongest()]
            strongest = fitted("strongest heads (weight on the target): ", heads)
        else:
            heads = []
            for layer, head in result.strongest():
                key, weight = result.top_keys(layer, head, 1)[0]
                heads.append(f"{layer}.{head} → {result.key_name(key)} {weight:.2f}")
            strongest = fitted("strongest heads (strongest key): ", heads)
        return summary(self, headline, [strongest], [".strongest()", ".top_keys(layer, head)", ".rows"])


@dataclass
class AttendShown:
    """attend's face for people: a layer × head grid and the strongest heads, each with (head label, weight on the
    target or None, top keys as (name, weight))."""

    grid: Any
    grid_title: str
    rows: list[tuple[str, float | None, list[tuple[str, float]]]]
    header: str
    table_title: str


# -------------------------------------------------------------------------------------------------------------- figures


def attend_figure(result: Any) -> Any:
    """An AttendResult, layer × head: the weight on the target or, without one, each head's largest weight with
    the token it falls on written in the cell."""
    from attnscope.output import figures, head_grids

    source = result.from_name  # as tables name it: she@5, doctor@2-4
    subtitle = figures.describe_input(result.model, n_tokens=len(result.tokens))
    if result.to_weight is not None:
        targets = ", ".join(result.labels.describe(span) for span in result.to_words)
        return head_grids.score_heatmap(
            result.to_weight,
            f"Attention from {source} to {targets}",
            f"attention weight ({figures.FRACTION_LABEL})",
            subtitle,
        )
    n_layer, n_head = result.rows.shape[:2]
    matrix = result.strength()
    cells = [
        [
            f"{result.key_text(result.top_keys(layer, head, 1)[0][0])[:8]}\n{matrix[layer, head]:.2f}"
            for head in range(n_head)
        ]
        for layer in range(n_layer)
    ]
    kind = "word" if result.view == WORDS else "token"
    skipped = ", the first left out" if result.settings.get("skip_first") else ""
    if result.view != WORDS and result.labels.continued:
        subtitle += f"; {CONTINUED_LEGEND}"
    title = f"Where {source} looks: each head's strongest {kind}{skipped} and its weight"
    label = f"weight of the strongest {kind} ({figures.FRACTION_LABEL})"
    return head_grids.score_heatmap(matrix, title, label, subtitle, cell_text=cells)


# ------------------------------------------------------------------------------------------------------------- terminal


def attend_table(rows: Sequence[tuple[str, float | None, Sequence[tuple[str, float]]]], header: str, title: str) -> Any:
    """The strongest heads, one row each: (head label, weight on the target or None, top keys as (name, weight)),
    the names as tables show tokens and words (`do@2`, `##ct@3`, `doctor@2-4`)."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("head", justify="right")
    targeted = any(weight is not None for _, weight, _ in rows)
    if targeted:
        table.add_column("to target", justify="right")
    table.add_column(header)
    for label, weight, tops in rows:
        shown = ", ".join(f"{name}: {value:.2f}" for name, value in tops)
        table.add_row(label, *([f"{weight:.3f}"] if targeted else []), shown)
    return table
