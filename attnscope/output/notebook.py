"""Results in a notebook: the HTML Jupyter shows for a result (`_repr_html_`), one fragment per command.

`heads` shows the role map (a grid of cells in the catalog's palette, `Role.colour` with `Role.ink` for the text,
as in the terminal and the pictures; a title; a legend of the roles present) and the table of heads; the other
commands show the tables their terminal view shows, with layer × head grids shaded by value. Every fragment is
self-contained: inline styles only, no script, no picture, nothing fetched; every text (tokens, model names,
sources, notes) escaped. Renders only; computes nothing. The one exception is `show`: the report page's viewer
(`output.viewer`: one inline script, its data as JSON, nothing fetched) for that layer's heads, over the static
tables, which stay for a notebook that runs no script.
"""

from __future__ import annotations

import html as escaping
import math
from collections.abc import Callable, Sequence
from typing import Any

from attnscope.output.views import view_of
from attnscope.scores.catalog import ROLE, ROLES, SCORE, table_columns

MAX_MAP_TOKENS = 32  # a `show` map lists at most this many tokens (its picture, `save`, shows them all)
VIEWER_TOKENS = 256  # and its interactive viewer draws at most this many (one byte per weight in the page)
BOX = "font-family:system-ui,sans-serif;font-size:0.85em;margin:0.3em 0"
TABLE = "border-collapse:collapse;margin:0.2em 0 0.8em 0"
CELL = "border:1px solid #ddd;padding:0.1em 0.45em;text-align:right;white-space:nowrap"
HEADER = CELL + ";background:#f4f4f4;font-weight:bold"
SHADED = "border:1px solid #eee;padding:0 0.3em;text-align:right"  # a grid's cells: many, so a shorter style
POSITIVE = (0, 114, 178)  # shading of weights and positive values: the palette's blue
NEGATIVE = (213, 94, 0)  # and of negative values: its vermillion


def _text(value: Any) -> str:
    return escaping.escape(str(value), quote=True)


def _number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _cell(content: Any, style: str = "", header: bool = False, title: str | None = None, base: str = CELL) -> str:
    tag = "th" if header else "td"
    tip = "" if title is None else f' title="{_text(title)}"'
    return f'<{tag} style="{HEADER if header else base}{";" + style if style else ""}"{tip}>{_text(content)}</{tag}>'


def _title(text: str) -> str:
    return f'<div style="font-weight:bold;margin:0.6em 0 0.2em 0">{_text(text)}</div>'


def _paragraph(text: str, colour: str = "#222") -> str:
    return f'<div style="color:{colour};margin:0.2em 0">{_text(text)}</div>'


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None) -> str:
    """A table of `rows`, each a sequence of cells made by `_cell`."""
    head = "<tr>" + "".join(_cell(header, header=True) for header in headers) + "</tr>"
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    table = f'<table style="{TABLE}"><thead>{head}</thead><tbody>{body}</tbody></table>'
    return (_title(title) if title else "") + table


def _records_table(records: Sequence[dict], title: str) -> str:
    """Any flat records with the same keys: one row each, floats with three decimals, None as '-'."""
    if not records:
        return _title(title) + _paragraph("(none)")
    return _table(list(records[0]), [[_cell(_number(value)) for value in record.values()] for record in records], title)


def _shade(value: float, scale: float) -> str:
    """The background of a value on a scale: blue for positive, vermillion for negative, as strong as its share
    of `scale`; white text where the background is dark."""
    share = max(-1.0, min(1.0, value / scale)) if math.isfinite(value) else 0.0
    red, green, blue = POSITIVE if share >= 0 else NEGATIVE
    ink = ";color:#fff" if abs(share) > 0.55 else ""
    return f"background:rgba({red},{green},{blue},{abs(share):.2f}){ink}"


def _grid(matrix: Any, rows: Sequence[str], columns: Sequence[str], title: str, corner: str, scale: float = 1.0) -> str:
    """A matrix as a table, each cell shaded by its value over `scale` (1: weights in [0, 1]); None leaves a cell
    blank (a key a causal query does not see)."""
    body = []
    for label, values in zip(rows, matrix, strict=True):
        cells = [
            _cell("", base=SHADED)
            if value is None
            else _cell(_number(float(value), 2), _shade(float(value), scale), base=SHADED)
            for value in values
        ]
        body.append([_cell(label, header=True), *cells])
    return _table([corner, *columns], body, title)


def _notes(notes: Sequence[str]) -> str:
    return "".join(_paragraph(f"note: {note}", "#8a5a00") for note in notes)


def _fragment(*parts: str) -> str:
    return f'<div class="attnscope" style="{BOX}">' + "".join(parts) + "</div>"


# ---------------------------------------------------------------------------------------------------------- heads


def _role_cell(role: str, tip: str) -> str:
    entry = ROLE[role]
    return _cell(entry.short, f"background:{entry.colour};color:{entry.ink};text-align:center", title=tip)


def role_map(heads: Sequence[Any], n_layer: int, n_head: int, title: str) -> str:
    """Layers as rows, heads as columns, one cell per head in its role's colour (its role and deciding score in the
    cell's tooltip), and a legend of the roles present, in the catalog's order."""
    records = {(record.layer, record.head): record for record in heads}
    rows = []
    for layer in range(n_layer):
        cells = [_cell(str(layer), header=True)]
        for head in range(n_head):
            record = records[(layer, head)]
            tip = f"{record.label} {record.role.role}: {record.role.metric} {record.role.score:.2f}"
            cells.append(_role_cell(record.role.role, tip))
        rows.append(cells)
    present = {record.role.role for record in heads}
    legend = " ".join(
        f'<span style="background:{role.colour};color:{role.ink};padding:0.1em 0.4em;white-space:nowrap">'
        f"{_text(role.short)} = {_text(role.name)}</span>"
        for role in ROLES
        if role.name in present
    )
    table = _table(["L\\H", *(str(head) for head in range(n_head))], rows, title)
    return table + f'<div style="margin:0.2em 0;line-height:1.8">{legend}</div>'


def heads_table(heads: Sequence[Any], title: str, kind: str, sort: str | None) -> str:
    """One row per head: its role (coloured), the score that decided it, and the terminal table's score columns."""
    columns = table_columns(kind, sort)
    rows = [
        [
            _cell(record.label),
            _role_cell(record.role.role, record.role.role),
            _cell(f"{SCORE[record.role.metric].short} {record.role.score:.2f}"),
            *(_cell(_number(record.scores[score.name], 2)) for score in columns),
        ]
        for record in heads
    ]
    return _table(["head", "role", "by", *(score.short for score in columns)], rows, title)


def _heads(view: Any) -> str:
    result = view.result
    model = result.model
    title = f"Head roles: {model['name']} ({result.inputs['n_texts']} texts, {result.inputs['n_tokens']} tokens)"
    return _fragment(
        _notes(view.notes),
        role_map(result.heads, model["n_layer"], model["n_head"], title),
        heads_table(result.selected, "Heads", result.kind.name, result.selection.get("sort")),
    )


# ----------------------------------------------------------------------------------------------------------- show


def _show(view: Any) -> str:
    """The interactive viewer of the report page for this layer's heads and this text (`output.viewer`; its first
    VIEWER_TOKENS tokens), over a static fallback of tables (its first MAX_MAP_TOKENS tokens) that a notebook which
    runs no script shows instead."""
    from attnscope.output import viewer

    data, _ = viewer.show_viewer(view.result, VIEWER_TOKENS)
    return _fragment(viewer.fragment(data, _show_tables(view)))


def _show_tables(view: Any) -> str:
    result, attention = view.result, view.result.attention
    heads = range(attention.maps.shape[0]) if result.head is None else [result.head]
    tokens = attention.tokens[:MAX_MAP_TOKENS]
    n = len(tokens)
    causal = result.model["kind"] == "decoder"
    notes = list(view.notes)
    if len(attention.tokens) > n:
        notes.append(f"the first {n} of {len(attention.tokens)} tokens are shown; .save(folder) draws the whole map")
    labels = [f"{i} {token}" for i, token in enumerate(tokens)]
    parts = []
    for head in heads:
        weights = attention.maps[head].tolist()
        matrix = [[None if causal and j > i else weights[i][j] for j in range(n)] for i in range(n)]
        title = f"Head {attention.layer}.{head}: {result.model['name']} (rows: queries, columns: keys)"
        parts.append(_grid(matrix, labels, [str(j) for j in range(n)], title, "query"))
    return _notes(notes) + "".join(parts)


# ------------------------------------------------------------------------------------------------------ diversity


def _pairs_table(pairs: Sequence[dict], title: str) -> str:
    errors = bool(pairs) and "js_se" in pairs[0]
    headers = ["heads", "JSD bits", "JS distance", "cosine", *(["JSD s.e."] if errors else [])]
    rows = [
        [
            _cell(f"{pair['a']} ~ {pair['b']}"),
            *(_cell(_number(pair[key])) for key in ("js", "js_distance", "cosine")),
            *([_cell(_number(pair["js_se"]))] if errors else []),
        ]
        for pair in pairs
    ]
    return _table(headers, rows, title)


def _diversity(view: Any) -> str:
    result = view.result
    scope = "all heads" if result.layer is None else f"layer {result.layer}"
    layer_rows = [[_cell(str(layer)), _cell(_number(score))] for layer, score in result.layer_scores.items()]
    parts = [
        _notes(view.notes),
        _table(["layer", "mean pairwise JSD (bits)"], layer_rows, f"Head diversity: {result.model['name']}, {scope}"),
    ]
    if result.layer is not None and len(result.labels) <= 16:
        matrix = [
            [None if i == j else result.js[i][j] for j in range(len(result.labels))] for i in range(len(result.labels))
        ]
        parts.append(_grid(matrix, result.labels, result.labels, "JS divergence between heads (bits)", "head"))
    parts.append(_pairs_table(result.ranked_pairs(True), "Most redundant pairs (lowest JSD)"))
    parts.append(_pairs_table(result.ranked_pairs(False), "Most distinct pairs (highest JSD)"))
    groups = "; ".join(", ".join(group) for group in result.groups) or "none"
    parts.append(_paragraph(f"Near-duplicate groups (JSD < {result.redundant} bits): {groups}"))
    if result.layer is None:
        clusters = "; ".join(", ".join(group) for group in result.clusters) or "none"
        parts.append(_paragraph(f"Clusters (average linkage below {result.cluster_at} bits): {clusters}"))
    return _fragment(*parts)


# --------------------------------------------------------------------------------------------------------- attend


def _layer_head_grid(matrix: Any, title: str, scale: float = 1.0) -> str:
    n_layer, n_head = len(matrix), len(matrix[0])
    return _grid(
        matrix, [str(layer) for layer in range(n_layer)], [str(head) for head in range(n_head)], title, "L\\H", scale
    )


def _attend(view: Any) -> str:
    shown = view.shown()  # the terminal's grid and table (views.AttendView.shown)
    targeted = any(weight is not None for _, weight, _ in shown.rows)
    rows = [
        [
            _cell(label),
            *([_cell(_number(weight))] if targeted else []),
            _cell(", ".join(f"{name}: {value:.2f}" for name, value in tops), "text-align:left"),
        ]
        for label, weight, tops in shown.rows
    ]
    headers = ["head", *(["to target"] if targeted else []), shown.header]
    grid = _layer_head_grid(shown.grid.tolist(), shown.grid_title)
    return _fragment(_notes(view.notes), grid, _table(headers, rows, shown.table_title))


# --------------------------------------------------------------------------------------------------------- ablate


def _ablate(view: Any) -> str:
    result = view.result
    unit = "loss increase (nats)" if result.method == "loss" else "|dL/d gate|"
    scale = max(float(abs(result.importance).max()), 1e-300)
    by_label = {record["label"]: record for record in view.records()}
    ranked = [by_label[f"{layer}.{head}"] for layer, head in result.ranked()[: result.settings["top"]]]
    parts = [
        _notes(view.notes),
        _paragraph(
            f"baseline loss {result.baseline_loss:.4f} nats/token over {result.inputs['predicted_tokens']} predicted "
            "tokens"
        ),
        _layer_head_grid(result.importance.tolist(), f"Head importance, {unit}", scale),
        _records_table(ranked, f"Most important heads ({result.method})"),
    ]
    if result.prune:
        parts.append(_records_table(result.prune, "Loss as the least important heads are removed"))
    return _fragment(*parts)


# ------------------------------------------------------------------------------------------------ everything else


def _report(view: Any) -> str:
    result = view.result
    parts = [_heads(view_of(result.heads))]
    if result.diversity is not None:
        parts.append(_diversity(view_of(result.diversity)))
    return _fragment(*parts)


def _info(view: Any) -> str:
    rows = [[_cell(key, "text-align:left;font-weight:bold"), _cell(value)] for key, value in view.result.model.items()]
    return _fragment(_table(["what", "value"], rows, "Model"))


def _random_mha(view: Any) -> str:
    return _fragment(
        _notes(view.notes), _records_table(view.records(), "Random multi-head attention: diversity by heads")
    )


def _bench(view: Any) -> str:
    return _fragment(
        _notes(view.notes), _records_table(view.records(), f"attnscope bench: {view.result.model['name']}")
    )


RENDERERS: dict[str, Callable[[Any], str]] = {
    "heads": _heads,
    "show": _show,
    "diversity": _diversity,
    "attend": _attend,
    "ablate": _ablate,
    "report": _report,
    "info": _info,
    "random-mha": _random_mha,
    "bench": _bench,
}


def html(view: Any) -> str:
    """The notebook HTML of a result's view (`output.views.view_of(result)`)."""
    return RENDERERS[view.command](view)
