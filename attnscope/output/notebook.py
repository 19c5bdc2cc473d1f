"""Results in a notebook: the shared builders of the HTML Jupyter shows for a result (`_repr_html_`).

Each command's view makes its fragment (`View.notebook()`, in its room `output/<command>.py`) from these: cells,
tables, grids shaded by value, notes, and the fragment around them. Every fragment is self-contained: inline styles
only, no script, no picture, nothing fetched; every text (tokens, model names, sources, notes) escaped. Renders only;
computes nothing. The one exception is `show`: the report page's viewer (`output.viewer`: one inline script, its
data as JSON, nothing fetched) over static tables, which stay for a notebook that runs no script.
"""

from __future__ import annotations

import html as escaping
import math
from collections.abc import Sequence
from typing import Any

from attnscope.output.scales import SCALES
from attnscope.scores.catalog import ROLE, ROLES

BOX = "font-family:system-ui,sans-serif;font-size:0.85em;margin:0.3em 0"


TABLE = "border-collapse:collapse;margin:0.2em 0 0.8em 0"


CELL = "border:1px solid #ddd;padding:0.1em 0.45em;text-align:right;white-space:nowrap"


HEADER = CELL + ";background:#f4f4f4;font-weight:bold"


SHADED = "border:1px solid #eee;padding:0 0.3em;text-align:right"  # a grid's cells: many, so a shorter style


POSITIVE = (0, 114, 178)  # shading of weights and positive values: the palette's blue


NEGATIVE = (213, 94, 0)  # and of negative values: its vermillion


def escape(value: Any) -> str:
    return escaping.escape(str(value), quote=True)


def number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def cell(content: Any, style: str = "", header: bool = False, title: str | None = None, base: str = CELL) -> str:
    tag = "th" if header else "td"
    tip = "" if title is None else f' title="{escape(title)}"'
    return f'<{tag} style="{HEADER if header else base}{";" + style if style else ""}"{tip}>{escape(content)}</{tag}>'


def heading(text: str) -> str:
    return f'<div style="font-weight:bold;margin:0.6em 0 0.2em 0">{escape(text)}</div>'


def paragraph(text: str, colour: str = "#222") -> str:
    return f'<div style="color:{colour};margin:0.2em 0">{escape(text)}</div>'


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None) -> str:
    """A table of `rows`, each a sequence of cells made by `cell`."""
    head = "<tr>" + "".join(cell(header, header=True) for header in headers) + "</tr>"
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    markup = f'<table style="{TABLE}"><thead>{head}</thead><tbody>{body}</tbody></table>'
    return (heading(title) if title else "") + markup


def records_table(records: Sequence[dict], title: str) -> str:
    """Any flat records with the same keys: one row each, floats with three decimals, None as '-'."""
    if not records:
        return heading(title) + paragraph("(none)")
    return table(list(records[0]), [[cell(number(value)) for value in record.values()] for record in records], title)


def shade(value: float, scale: float, colours: str | None = None) -> str:
    """The background of a value: with `colours`, its colour on that scale of output.scales (the pictures' and the
    report page's) among values whose largest magnitude is `scale`; without, weights and other values in [-1, 1]:
    blue for positive, vermillion for negative, as strong as its share of `scale`. White text where the background
    is dark."""
    if colours is not None:
        red, green, blue = SCALES[colours].rgb(value if math.isfinite(value) else 0.0, scale)
        luminance = sum(
            weight * (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4)
            for weight, c in zip((0.2126, 0.7152, 0.0722), (red / 255, green / 255, blue / 255), strict=True)
        )
        return f"background:rgb({red},{green},{blue})" + (";color:#fff" if luminance <= 0.179 else "")
    share = max(-1.0, min(1.0, value / scale)) if math.isfinite(value) else 0.0
    red, green, blue = POSITIVE if share >= 0 else NEGATIVE
    ink = ";color:#fff" if abs(share) > 0.55 else ""
    return f"background:rgba({red},{green},{blue},{abs(share):.2f}){ink}"


def grid(
    matrix: Any,
    rows: Sequence[str],
    columns: Sequence[str],
    title: str,
    corner: str,
    scale: float = 1.0,
    colours: str | None = None,
) -> str:
    """A matrix as a table, each cell shaded by its value over `scale` (1: weights in [0, 1]; see `shade` for
    `colours`); None leaves a cell blank (a key a causal query does not see)."""
    body = []
    for label, values in zip(rows, matrix, strict=True):
        cells = [
            cell("", base=SHADED)
            if value is None
            else cell(number(float(value), 2), shade(float(value), scale, colours), base=SHADED)
            for value in values
        ]
        body.append([cell(label, header=True), *cells])
    return table([corner, *columns], body, title)


def note_lines(notes: Sequence[str]) -> str:
    return "".join(paragraph(f"note: {note}", "#8a5a00") for note in notes)


def fragment(*parts: str) -> str:
    return f'<div class="attnscope" style="{BOX}">' + "".join(parts) + "</div>"


def layer_head_grid(matrix: Any, title: str, scale: float = 1.0, colours: str | None = None) -> str:
    n_layer, n_head = len(matrix), len(matrix[0])
    layers, heads = [str(layer) for layer in range(n_layer)], [str(head) for head in range(n_head)]
    return grid(matrix, layers, heads, title, "L\\H", scale, colours)


def role_cell(role: str, tip: str) -> str:
    entry = ROLE[role]
    return cell(entry.short, f"background:{entry.colour};color:{entry.ink};text-align:center", title=tip)


def role_map(heads: Sequence[Any], n_layer: int, n_head: int, title: str) -> str:
    """Layers as rows, heads as columns, one cell per head in its role's colour (its role and deciding score in the
    cell's tooltip), and a legend of the roles present, in the catalog's order."""
    records = {(record.layer, record.head): record for record in heads}
    rows = []
    for layer in range(n_layer):
        cells = [cell(str(layer), header=True)]
        for head in range(n_head):
            record = records[(layer, head)]
            tip = f"{record.label} {record.role.role}: {record.role.metric} {record.role.score:.2f}"
            cells.append(role_cell(record.role.role, tip))
        rows.append(cells)
    present = {record.role.role for record in heads}
    legend = " ".join(
        f'<span style="background:{role.colour};color:{role.ink};padding:0.1em 0.4em;white-space:nowrap">'
        f"{escape(role.short)} = {escape(role.name)}</span>"
        for role in ROLES
        if role.name in present
    )
    grid = table(["L\\H", *(str(head) for head in range(n_head))], rows, title)
    return grid + f'<div style="margin:0.2em 0;line-height:1.8">{legend}</div>'


def html(view: Any) -> str:
    """The notebook HTML of a result's view (`output.views.view_of(result)`)."""
    return view.notebook()


# The names these builders had when they were private to this module (before each command's notebook HTML moved to
# its room), for code written against them.
_text, _number, _cell, _title, _paragraph, _table = escape, number, cell, heading, paragraph, table
_role_cell = role_cell
_records_table, _shade, _grid, _notes, _fragment, _layer_head_grid = (
    records_table,
    shade,
    grid,
    note_lines,
    fragment,
    layer_head_grid,
)
