"""`attnscope report`: one self-contained HTML page of everything attnscope found about a model's heads.

Rendering only (the analysis is done by `analyses.report`): the pictures are drawn by `figures` and embedded as PNG
data, the numbers are embedded as JSON (`<script type="application/json" id="attnscope-data">`), the styles and
the one small script (sortable head table) are inline. Nothing is fetched, so the page reads the same offline.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from typing import Any

from attnscope import __version__
from attnscope.output import figures
from attnscope.scores.catalog import ROLE, SCORE, counted

REPORT_DPI = 100  # the page shows pictures at most 1,100 px wide; more dots would only make it heavier


def _image(figure: Any, alt: str) -> str:
    data = base64.b64encode(figures.render(figure, "png", REPORT_DPI)).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], css: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<div class="wide"><table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.6em; text-align: right; }
th { background: #f4f4f4; } table.sortable th { cursor: pointer; }
td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; height: auto; }
.grid { display: flex; flex-wrap: wrap; gap: 1em; } .grid figure { margin: 0; flex: 1 1 300px; }
.note { color: #8a5a00; } .wide { overflow-x: auto; }
"""

SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (header, column) {
    header.addEventListener("click", function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var descending = header.dataset.order !== "desc";
      header.dataset.order = descending ? "desc" : "asc";
      rows.sort(function (a, b) {
        var x = a.cells[column].textContent, y = b.cells[column].textContent;
        var nx = parseFloat(x), ny = parseFloat(y);
        var order = isNaN(nx) || isNaN(ny) ? x.localeCompare(y) : nx - ny;
        return descending ? -order : order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
document.body.dataset.ready = "yes";
"""


def render(report: Any, heads_doc: dict, diversity_doc: dict | None) -> str:
    """The report page of a ReportResult: its heads analysis (with the full maps of the characteristic heads'
    layers in `heads.attention`) and, optionally, its diversity of all heads; `heads_doc` and `diversity_doc` are
    the JSON documents embedded in the page."""
    heads_result, diversity = report.heads, report.diversity
    model = heads_result.model
    name = model["name"]

    parts = [f"<h1>attnscope report: {html.escape(name)}</h1>"]
    inputs = heads_result.inputs
    parts.append(
        f"<p>{counted(inputs['n_texts'], 'text')}, {counted(inputs['n_windows'], 'window')}, "
        f"{counted(inputs['n_tokens'], 'token')}, {counted(inputs['scored_rows'], 'scored query row')}; "
        f"attnscope {html.escape(__version__)}.</p>"
    )
    parts.extend(f'<p class="note">note: {html.escape(note)}</p>' for note in report.notes)
    facts = [(key, value) for key, value in model.items() if not isinstance(value, (dict, list))]
    parts.append("<h2>Model</h2>" + _table(("what", "value"), facts))

    role_map = figures.heads_role_map(heads_result)
    counts: dict[str, int] = {}
    for record in heads_result.heads:
        counts[record.role.role] = counts.get(record.role.role, 0) + 1
    parts.append('<h2 id="role-map">Role map</h2>' + _image(role_map, "role map"))
    parts.append(_table(("role", "heads"), sorted(counts.items(), key=lambda item: (-item[1], item[0]))))

    rows = []
    for role, records in report.top_per_role.items():
        metric = ROLE[role].score
        rows.extend(
            (role, metric, record.label, _number(record.scores[metric]), record.role.role) for record in records
        )
    parts.append(
        "<h2>Top heads per role</h2><p>The heads with the highest score of each role's rule, whatever role they "
        "were given.</p>" + _table(("role", "score", "head", "value", "assigned role"), rows)
    )

    images = [
        f"<figure>{_image(figures.heads_score_heatmap(heads_result, score), score)}<figcaption>"
        f"{html.escape(SCORE[score].label)} (<code>{html.escape(score)}</code>)</figcaption></figure>"
        for score in figures.drawn_scores(heads_result)
    ]
    parts.append('<h2>Scores per head</h2><div class="grid">' + "".join(images) + "</div>")

    if diversity is not None:
        plot = figures.diversity_per_layer(diversity)

        def pair_rows(pairs):
            return [(f"{p['a']} ~ {p['b']}", _number(p["js"]), _number(p["cosine"])) for p in pairs]

        headers = ("heads", "JSD bits", "cosine")
        parts.append(
            "<h2>Diversity</h2><p>Jensen–Shannon divergence (bits) between the attention rows of every pair of "
            "heads, averaged over the scored rows; 0 = identical heads, 1 = disjoint.</p>"
            + _image(plot, "diversity per layer")
            + "<h3>Most redundant pairs</h3>"
            + _table(headers, pair_rows(diversity.ranked_pairs(True)))
            + "<h3>Most distinct pairs</h3>"
            + _table(headers, pair_rows(diversity.ranked_pairs(False)))
            + f"<p>{counted(len(diversity.groups), 'group')} of near-duplicate heads "
            + f"(JSD &lt; {diversity.redundant} bits): "
            + html.escape("; ".join(", ".join(group) for group in diversity.groups) or "none")
            + "</p>"
        )
    else:
        parts.append("<h2>Diversity</h2><p>Not computed (the diversity pass was off).</p>")

    maps = []
    for record in report.characteristic:
        attention = heads_result.attention.get(record.layer)
        if attention is None:
            continue
        about = f"{record.label} ({record.role.role}, {record.role.metric} {record.role.score:.2f})"
        title = f"Head {about}"
        figure = figures.head_attention(heads_result.model, attention, record.head, f"Attention of head {about}")
        maps.append(f"<figure>{_image(figure, title)}<figcaption>{html.escape(title)}</figcaption></figure>")
    if maps:
        parts.append(
            "<h2>Attention of the most characteristic heads</h2><p>For each role, the head that fills it best, on "
            'the first text.</p><div class="grid">' + "".join(maps) + "</div>"
        )

    columns = ["head", "role", "by", *heads_result.heads[0].scores]
    head_rows = [
        (
            record.label,
            record.role.role,
            f"{record.role.metric} {record.role.score:.2f}",
            *(_number(value) for value in record.scores.values()),
        )
        for record in heads_result.heads
    ]
    parts.append("<h2>Every head</h2><p>Click a column to sort.</p>" + _table(columns, head_rows, "sortable"))
    data = {"heads": heads_doc, "diversity": diversity_doc}
    # "</" cannot end the script element early once escaped; the JSON stays valid
    payload = json.dumps(data, ensure_ascii=False, sort_keys=False).replace("</", "<\\/")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>attnscope report: {html.escape(name)}</title><style>{STYLE}</style></head><body>"
        + "".join(parts)
        + f'<script type="application/json" id="attnscope-data">{payload}</script>'
        + f"<script>{SCRIPT}</script></body></html>\n"
    )
