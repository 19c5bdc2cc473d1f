"""Terminal rendering with rich: tables and the role map. Renders only; computes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from attnscope.scores.catalog import ROLE, ROLES, SCORE, roles_for, table_columns

ROLE_STYLES = {role.name: f"bold {role.ink} on {role.colour}" for role in ROLES}  # the catalog's palette


def role_cell(role: str) -> Text:
    return Text(f"{ROLE[role].short:^5}", style=ROLE_STYLES[role])


def heads_table(heads: Sequence[Any], title: str, kind: str, sort: str | None = None) -> Table:
    """One row per head; fits in 80 columns. The score columns are the catalog's table columns for this kind of
    model (`catalog.table_columns`): sorted by a score that has no column of its own, it takes its sibling's place
    (entropy in nats where Hnorm was, the raw local mass where lift was); `-` is a score that was not measured."""
    columns = table_columns(kind, sort)
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    table.add_column("head", justify="right")
    table.add_column("role")
    table.add_column("by", justify="right", no_wrap=True)
    for score in columns:
        table.add_column(score.short, justify="right")
    for record in heads:
        table.add_row(
            record.label,
            role_cell(record.role.role),
            f"{SCORE[record.role.metric].short} {record.role.score:.2f}",
            *("-" if record.scores[score.name] is None else f"{record.scores[score.name]:.2f}" for score in columns),
        )
    return table


def role_map(heads: Sequence[Any], n_layer: int, n_head: int, title: str, kind: str) -> Group:
    """Layers as rows, heads as columns, one coloured cell per head; GPT-2 small fits in 80 columns."""
    roles = {(record.layer, record.head): record.role.role for record in heads}
    grid = Table(box=None, padding=(0, 1, 0, 0), show_edge=False, header_style="bold")
    grid.add_column("L\\H", justify="right")
    for head in range(n_head):
        grid.add_column(str(head), justify="center", width=5)
    for layer in range(n_layer):
        grid.add_row(str(layer), *(role_cell(roles[(layer, head)]) for head in range(n_head)))
    legend = Text(" ").join(
        Text(f" {role.short}={role.name} ", style=ROLE_STYLES[role.name]) for role in roles_for(kind)
    )
    return Group(Text(title, style="bold"), grid, legend)


def key_value_table(rows: Sequence[tuple[str, str]], title: str) -> Table:
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    for key, value in rows:
        table.add_row(key, value)
    return table


def pairs_table(pairs: Sequence[dict], title: str) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for header in ("heads", "JSD bits", "JS distance", "cosine"):
        table.add_column(header, justify="right")
    for pair in pairs:
        table.add_row(
            f"{pair['a']} ~ {pair['b']}", f"{pair['js']:.3f}", f"{pair['js_distance']:.3f}", f"{pair['cosine']:.3f}"
        )
    return table


def matrix_table(matrix: Any, labels: Sequence[str], title: str) -> Table:
    """A small square matrix (one layer's heads) as a table, two decimals."""
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    table.add_column("", justify="right", style="bold")
    short = [label.split(".")[-1] for label in labels]
    for name in short:
        table.add_column(name, justify="right")
    for i, label in enumerate(labels):
        table.add_row(label, *("" if i == j else f"{matrix[i][j]:.2f}" for j in range(len(labels))))
    return table


def layer_scores_table(scores: dict, title: str) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("layer", justify="right")
    table.add_column("mean pairwise JSD (bits)", justify="right")
    for layer, score in scores.items():
        table.add_row(str(layer), f"{score:.3f}")
    return table


def records_table(rows: Sequence[dict], title: str) -> Table:
    """Any list of flat records with the same keys; floats with three decimals, None as '-'."""
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for key in rows[0]:
        table.add_column(key.removesuffix("_ms").replace("_", " "), justify="right")
    for row in rows:
        table.add_row(*("-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    return table


def bench_table(rows: Sequence[dict], title: str) -> Table:
    """One group of rows per batch size × sequence length (B × n). Fits 80 columns: headers on up to three lines,
    one space between columns; the caption says what the ratios are."""
    table = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=0,
        show_edge=False,
        caption="spread: (max - min) / median time. ×floor: median time (or peak memory) / the floor's. faster than: "
        "the baseline's median time / attnscope's. peak MB: the median of the runs' peaks.",
        caption_justify="left",
    )
    headers = (
        "B × n",
        "method",
        "median\nms",
        "spread",
        "tokens/s",
        "time\n×floor",
        "faster\nthan\ntutorial",
        "faster\nthan\ncache",
        "peak\nMB",
        "memory\n×floor",
    )
    for header in headers:
        table.add_column(header, justify="left" if header == "method" else "right", no_wrap=True)
    for index, row in enumerate(rows):
        config = (row["batch"], row["seq"])
        first = index == 0 or config != (rows[index - 1]["batch"], rows[index - 1]["seq"])
        last = index == len(rows) - 1 or config != (rows[index + 1]["batch"], rows[index + 1]["seq"])
        table.add_row(
            f"{row['batch']} × {row['seq']}" if first else "",
            row["method"],
            f"{row['median_s'] * 1000:,.2f}",  # a small model's forward takes a millisecond or two
            f"{row['spread']:.0%}",
            f"{row['tokens_per_s']:,.0f}",
            _times(row["time_vs_floor"]),
            _times(row["speedup_vs_tutorial"]),
            _times(row["speedup_vs_cache"]),
            f"{row['peak_mb']:.0f}",
            _times(row["memory_vs_floor"]),
            end_section=last,
        )
    return table


def _times(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}×"


def layer_head_grid(matrix: Any, title: str, unit_range: bool = True) -> Group:
    """A layer × head matrix; GPT-2 small (12 × 12) fits in 80 columns. Weights in [0, 1] (`unit_range`) are written
    with two decimals without the leading zero, heavy cells in bold; any other values as a signed percentage of the
    largest magnitude, which the title then states."""
    n_layer, n_head = matrix.shape
    scale = max(float(abs(matrix).max()), 1e-300)
    if not unit_range:
        title = f"{title}, as % of the largest magnitude ({scale:.3g})"
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    table.add_column("L\\H", justify="right", style="bold")
    for head in range(n_head):
        table.add_column(str(head), justify="right")
    for layer in range(n_layer):
        cells = []
        for head in range(n_head):
            value = float(matrix[layer, head])
            share = value if unit_range else value / scale
            if unit_range:
                text = "1.0" if value >= 0.995 else f"{value:.2f}".lstrip("0")
            else:
                text = f"{100 * share:.0f}"
            cells.append(Text(text, style="bold" if share >= 0.5 else "dim" if abs(share) < 0.05 else ""))
        table.add_row(str(layer), *cells)
    return Group(Text(title, style="bold"), table)


def attend_table(
    rows: Sequence[tuple[str, float | None, Sequence[tuple[str, float]]]], header: str, title: str
) -> Table:
    """The strongest heads, one row each: (head label, weight on the target or None, top keys as (name, weight)),
    the names as tables show tokens and words (`do@2`, `##ct@3`, `doctor@2-4`)."""
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
