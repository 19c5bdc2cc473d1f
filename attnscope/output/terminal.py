"""Terminal rendering with rich: the shared builders (the catalog's palette as rich styles, role cells and codes,
packed legends, key-value and record tables, layer × head grids). Each command's own tables live in its room
(`output/<command>.py`). Renders only; computes nothing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from attnscope.scores.catalog import ROLE, ROLES

ROLE_STYLES = {role.name: f"bold {role.ink} on {role.colour}" for role in ROLES}  # the catalog's palette


def role_cell(role: str) -> Text:
    return Text(f"{ROLE[role].short:^5}", style=ROLE_STYLES[role])


def role_codes(roles: Iterable[Any], width: int) -> dict[str, str]:
    """Each role's code in a cell `width` characters wide: its short label cut to `width` letters (prev, pre, pr).
    Cut to 2 or 3 letters, the labels of the catalog's roles still differ (tests/unit/test_terminal.py checks it)."""
    return {role.name: role.short[:width] for role in roles}


def packed(entries: Sequence[Text], width: int, separator: str = "   ") -> Text:
    """`entries` laid out in lines of at most `width` cells, broken only between entries (an entry longer than a
    line gets a line of its own, and is wrapped by rich there)."""
    lines: list[Text] = []
    line = Text()
    for entry in entries:
        if line.cell_len and line.cell_len + len(separator) + entry.cell_len > width:
            lines.append(line)
            line = Text()
        if line.cell_len:
            line.append(separator)
        line.append_text(entry)
    if line.cell_len:
        lines.append(line)
    return Text("\n").join(lines)


def key_value_table(rows: Sequence[tuple[str, str]], title: str) -> Table:
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, value)
    return table


def records_table(rows: Sequence[dict], title: str) -> Table:
    """Any list of flat records with the same keys; floats with three decimals, None as '-'."""
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for key in rows[0]:
        table.add_column(key.removesuffix("_ms").replace("_", " "), justify="right")
    for row in rows:
        table.add_row(*("-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    return table


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
