"""The report page itself (`attnscope report`'s room, output/report.py, renders the rest): static HTML — the role
map, the tables, the inputs, the glossary, readable without scripts — plus one inline script, `output/viewer.js`,
that draws every map in the browser from the data embedded as JSON (see the room's docstring). A module of its own
because the page is a document of its own: sections of HTML, built from a ReportResult by duck typing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnscope import __version__
from attnscope.output import viewer
from attnscope.output.heads import kv_group
from attnscope.output.report_sections import (
    ablation_section,
    diversity_section,
    every_head,
    glossary_section,
    inputs_section,
    number_html,
    text_html,
    top_heads,
)
from attnscope.scores.catalog import ROLE, ROLES, SCORE, counted


def several_models(report: Any) -> list[Any]:
    """The models of a report of several (each: label, heads, characteristic, texts); [] for one model."""
    models = list(getattr(report, "models", None) or [])
    return models if len(models) > 1 else []


# ------------------------------------------------------------------------------------------------------------- the page


def _role_map(report: Any) -> str:
    """Layers as rows, heads as columns, each cell in its role's colour with the role's short label; clicking one
    selects the head (the script), a tooltip names it without the script. With grouped-query attention a header
    row above the heads spans the query heads that share each key/value head (`kv 0`, `kv 1`, ...)."""
    model = report.model
    group = kv_group(model)
    records = {(record.layer, record.head): record for record in report.heads.heads}
    header = "".join(f"<th>{head}</th>" for head in range(model["n_head"]))
    shared = ""
    if group > 1:
        spans = "".join(
            f'<th colspan="{group}" class="kv" title="query heads {kv * group}-{kv * group + group - 1} read key/value '
            f'head {kv}">kv {kv}</th>'
            for kv in range(model["n_head"] // group)
        )
        shared = f'<tr><th title="key/value heads (grouped-query attention)">kv</th>{spans}</tr>'
    rows = []
    for layer in range(model["n_layer"]):
        cells = []
        for head in range(model["n_head"]):
            record = records[(layer, head)]
            role = ROLE[record.role.role]
            tip = f"{record.label} {role.name}: {SCORE[record.role.metric].short} {record.role.score:.2f}"
            tip += f"; reads key/value head {head // group}" if group > 1 else ""
            cells.append(
                f'<td class="cell" data-head="{record.label}" data-role="{text_html(role.name)}" '
                f'title="{text_html(tip)}" style="background:{role.colour};color:{role.ink}">'
                f'<span class="asv-label">{text_html(role.short)}</span></td>'
            )
        rows.append(f"<tr><th>{layer}</th>{''.join(cells)}</tr>")
    present = {record.role.role for record in report.heads.heads}
    legend = "".join(
        f'<span class="chip" style="background:{role.colour};color:{role.ink}">{text_html(role.short)}</span> '
        f"{text_html(role.name)}&ensp;"
        for role in ROLES
        if role.name in present
    )
    return (
        f'<div class="wide"><table class="rolemap"><thead>{shared}<tr><th title="layer \\ head">L\\H</th>'
        f"{header}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        f'<p class="legend">{legend}</p>'
    )


def _sink_rate(heads: Any) -> str:
    """`sink rate 25 % (first_token > 0.3)`: the share of a model's heads that sink (Gu et al. 2024)."""
    rate = heads.sink_rate
    return f"sink rate {100 * rate.model:.0f} % (first_token &gt; {rate.epsilon:g})"


def _models_line(several: Sequence[Any]) -> str:
    if not several:
        return ""
    rates = ", ".join(f"{text_html(page.label)} {100 * page.heads.sink_rate.model:.0f} %" for page in several)
    return (
        f"<p>{counted(len(several), 'model')}, the same texts through each: {_labels(several)}. The page opens on "
        "the last; the slider above the role map chooses the model the role map and the head panel show. Sink "
        f"rate of each: {rates}.</p>"
    )


def _labels(several: Sequence[Any]) -> str:
    return ", ".join(text_html(page.label) for page in several)


def _of_shown(several: Sequence[Any]) -> str:
    """What a section of a page of several models is of: the last model, the one the page opens on."""
    return f" ({text_html(several[-1].label)}, the last model)" if several else ""


def page_title(report: Any) -> str:
    """What the page is of: the model's name, or the models' labels (the first and the last of more than three)."""
    several = several_models(report)
    if not several:
        return str(report.heads.model["name"])
    labels = [page.label for page in several]
    shown = ", ".join(labels) if len(labels) <= 3 else f"{labels[0]} … {labels[-1]}"
    return f"{shown} ({counted(len(labels), 'model')})"


def _model_slider(several: Sequence[Any]) -> str:
    """The holder of the slider over the models (drawn by the script); without the script, the models' names."""
    if not several:
        return ""
    return (
        f'<div class="asv-models" data-viewer="models"><p class="fallback">The role map shows the last of '
        f"{len(several)} models ({_labels(several)}); the page's script switches between them.</p></div>"
    )


def _circuit_key(report: Any) -> str:
    if report.dependencies is None:
        return ""
    return (
        '<p class="small asv-circuit-key">With a head chosen, the heads it depends on are outlined (solid) and the '
        "heads that depend on it outlined (dashed), in the colour of the change in the dependent head's score "
        "without the other (blue: it falls; red: it rises); arrows run from a head to the head that depends on it."
        "</p>"
    )


def _circuit(report: Any) -> str:
    """The dependencies of `attnscope circuit` as a table (readable without the script): for each head, the heads
    whose removal changes its deciding score most, the largest changes first."""
    records = report.dependencies
    if records is None:
        return ""
    ordered = sorted(records, key=lambda r: (-abs(r["change"]), r["label"], r["on"]))
    rows = "".join(
        f'<tr data-head="{text_html(r["label"])}"><td>{text_html(r["label"])}</td><td>{text_html(r["on"])}</td>'
        f"<td>{text_html(r['score'])}</td><td>{number_html(r['with'])}</td><td>{number_html(r['without'])}</td>"
        f"<td>{r['change']:+.3f}</td></tr>"
        for r in ordered
    )
    return (
        '<section id="circuit"><h2>Circuit</h2><p>Which heads each head depends on: its deciding score with every '
        "head, and without one earlier head (its output removed, as <code>attnscope ablate</code> removes it), as "
        "<code>attnscope circuit</code> measures it; the largest changes of each head, the largest of all first. Click "
        "a row (or a head in the role map) to see the head's dependencies in both directions.</p>"
        '<div class="wide tall"><table class="pick"><thead><tr><th>head</th><th>without</th><th>score</th>'
        f"<th>with it</th><th>without it</th><th>change</th></tr></thead><tbody>{rows}</tbody></table></div>"
        "</section>"
    )


def render(
    report: Any, heads_doc: dict, diversity_doc: dict | None, ablation_doc: dict | None, viewer_data: dict
) -> str:
    """The report page of a ReportResult; `heads_doc`, `diversity_doc` and `ablation_doc` are the JSON documents
    embedded in the page (the diversity's matrices travel encoded in `viewer_data`, the viewer's data, instead)."""
    heads = report.heads
    model = heads.model
    name = page_title(report)
    inputs = heads.inputs
    several = several_models(report)
    sections = [("explore", "Heads"), ("top-heads", "Top heads per role")]
    sections += [("circuit", "Circuit")] if report.dependencies is not None else []
    sections += [("diversity", "Diversity")] + ([("ablation", "Ablation")] if report.ablation is not None else [])
    sections += [("every-head", "Every head"), ("inputs", "Inputs"), ("glossary", "Roles and scores")]
    nav = " · ".join(f'<a href="#{anchor}">{title}</a>' for anchor, title in sections)
    notes = "".join(f'<p class="note">note: {text_html(note)}</p>' for note in report.notes)
    explore = (
        '<section id="explore"><h2>Heads</h2><p class="hint">Click a head (in the map, the examples or any table) to '
        "see its attention on each text; ← → move between heads, ↑ ↓ between layers; hover a token to see where it "
        "looks and what looks at it.</p>"
        '<div class="explore" tabindex="0"><div class="overview">'
        f"{_model_slider(several)}"
        '<p class="colour-by"></p>'
        f"{_role_map(report)}"
        f"{_circuit_key(report)}"
        '<h3>One head per role</h3><p class="small">The head that fills each role best, on the text that shows '
        "the role: the probe's repeated tokens for copying heads, prose for the others.</p>"
        '<div data-viewer="gallery"></div></div>'
        '<div class="asv-panel" data-viewer="head"><p class="fallback">The maps need the page\'s script; the '
        "tables below read without it.</p></div></div></section>"
    )
    body = (
        f"<header><h1>attnscope report: {text_html(name)}</h1>"
        f"<p>{counted(inputs['n_texts'], 'text')}, {counted(inputs['n_tokens'], 'token')}; "
        f"{counted(model['n_layer'], 'layer')} × {counted(model['n_head'], 'head')}; {_sink_rate(heads)}; attnscope "
        f"{text_html(__version__)}.</p>{_models_line(several)}<nav>{nav}</nav></header>"
        + notes
        + explore
        + f'<section id="top-heads"><h2>Top heads per role{_of_shown(several)}</h2><p>The heads with the highest '
        f"score of each role's rule, whatever role they were given.</p>{top_heads(report)}</section>"
        + _circuit(report)
        + diversity_section(report).replace("<h2>Diversity</h2>", f"<h2>Diversity{_of_shown(several)}</h2>", 1)
        + ablation_section(report).replace("<h2>Ablation</h2>", f"<h2>Ablation{_of_shown(several)}</h2>", 1)
        + f'<section id="every-head"><h2>Every head{_of_shown(several)}</h2>{every_head(report)}</section>'
        + inputs_section(report)
        + glossary_section(report)
    )
    embedded = {"heads": heads_doc, "diversity": diversity_doc, "ablation": ablation_doc}
    if diversity_doc is not None:
        embedded["diversity"] = {key: value for key, value in diversity_doc.items() if key != "matrices"}
    embedded["viewer"] = viewer_data
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>attnscope report: {text_html(name)}</title><style>{viewer.style()}</style></head>"
        f'<body class="asv asv-page">{body}'
        f'<script type="application/json" id="attnscope-data" class="asv-data">{viewer.script_json(embedded)}</script>'
        f"<script>{viewer.code()}</script></body></html>\n"
    )
