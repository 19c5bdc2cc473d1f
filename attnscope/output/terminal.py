"""Terminal rendering with rich: the shared builders (the catalog's palette as rich styles, role cells and codes,
packed legends, the role map, key-value and record tables, layer × head grids). Each command's own tables live in
its room (`output/<command>.py`). Renders only; computes nothing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from attnscope.scores.catalog import ROLE, ROLES, roles_for

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


class RoleMap:
    """Layers as rows, heads as columns, one coloured cell per head with its role's code, and a legend under it.
    Cells are 5 characters wide (the roles' short labels), or 3 or 2 where the width is short (the labels cut to
    as many letters as still tell the roles apart); the legend breaks between its entries, never inside one."""

    def __init__(self, heads: Sequence[Any], n_layer: int, n_head: int, title: str, kind: str):
        self.roles = {(record.layer, record.head): record.role.role for record in heads}
        self.n_layer, self.n_head, self.title, self.kind = n_layer, n_head, title, kind

    def grid(self, cell: int) -> Table:
        codes = role_codes(roles_for(self.kind), cell)
        grid = Table(box=None, padding=(0, 1, 0, 0), show_edge=False, header_style="bold")
        grid.add_column("L\\H", justify="right", no_wrap=True)
        for head in range(self.n_head):
            grid.add_column(str(head), justify="center", width=cell, no_wrap=True)
        for layer in range(self.n_layer):
            cells = (self.roles[layer, head] for head in range(self.n_head))
            grid.add_row(str(layer), *(Text(f"{codes[role]:^{cell}}", style=ROLE_STYLES[role]) for role in cells))
        return grid

    def legend(self, cell: int, width: int) -> Text:
        codes = role_codes(roles_for(self.kind), cell)
        entries = []
        for role in roles_for(self.kind):
            chip = Text(f" {codes[role.name]} ", style=ROLE_STYLES[role.name])
            entries.append(chip if codes[role.name] == role.name else Text.assemble(chip, " ", role.name))
        return packed(entries, width, "  ")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        label = max(len(str(self.n_layer - 1)), len("L\\H")) + 1  # the layer column and its padding
        cell = next((size for size in (5, 3) if label + (size + 1) * self.n_head <= options.max_width), 2)
        yield Text(self.title, style="bold")
        yield self.grid(cell)
        yield Text("rows: layers, columns: heads (from 0)", style="dim")
        yield self.legend(cell, options.max_width)


def role_map(heads: Sequence[Any], n_layer: int, n_head: int, title: str, kind: str) -> RoleMap:
    """The role map (see `RoleMap`): GPT-2 small's 12 × 12 fits in 80 columns, and in 40 with 2-letter codes."""
    return RoleMap(heads, n_layer, n_head, title, kind)


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


def layer_head_grid(matrix: Any, title: str, unit_range: bool = True, percent: bool = False) -> Group:
    """A layer × head matrix; GPT-2 small (12 × 12) fits in 80 columns. Weights in [0, 1] (`unit_range`) are written
    with two decimals without the leading zero, heavy cells in bold; shares of a whole (`percent`: 1 = all of it,
    signed, past 1 where they overshoot) as signed whole percentages; any other values as a signed percentage of the
    largest magnitude, which the title then states."""
    n_layer, n_head = matrix.shape
    scale = 1.0 if percent else max(float(abs(matrix).max()), 1e-300)
    if not unit_range and not percent:
        title = f"{title}, as % of the largest magnitude ({scale:.3g})"
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    table.add_column("L\\H", justify="right", style="bold")
    for head in range(n_head):
        table.add_column(str(head), justify="right")
    for layer in range(n_layer):
        cells = []
        for head in range(n_head):
            value = float(matrix[layer, head])
            share = value if unit_range or percent else value / scale
            if unit_range and not percent:
                text = "1.0" if value >= 0.995 else f"{value:.2f}".lstrip("0")
            else:
                text = str(round(100 * share))  # round, not a format: -0.1 % is 0, not -0
            cells.append(Text(text, style="bold" if share >= 0.5 else "dim" if abs(share) < 0.05 else ""))
        table.add_row(str(layer), *cells)
    return Group(Text(title, style="bold"), table)
