"""The report page itself (`attnscope report`'s room, output/report.py, renders the rest): static HTML — the role
map, the tables, the inputs, the glossary, readable without scripts — plus one inline script, `output/viewer.js`,
that draws every map in the browser from the data embedded as JSON (see the room's docstring). A module of its own
because the page is a document of its own: sections of HTML, built from a ReportResult by duck typing.
"""

from __future__ import annotations

import html as escaping
from collections.abc import Sequence
from typing import Any

from attnscope import __version__
from attnscope.output import viewer
from attnscope.output.heads import kv_group
from attnscope.scores.catalog import ROLE, ROLES, SCORE, SINK_EPSILON, counted, table_columns


def several_models(report: Any) -> list[Any]:
    """The models of a report of several (each: label, heads, characteristic, texts); [] for one model."""
    models = list(getattr(report, "models", None) or [])
    return models if len(models) > 1 else []


# ------------------------------------------------------------------------------------------------------------- the page


def _text(value: Any) -> str:
    return escaping.escape(str(value), quote=True)


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], css: str = "", titles: Sequence[str] = ()) -> str:
    """A table of plain cells (escaped); `titles`: a tooltip per header."""
    tips = list(titles) + [""] * (len(headers) - len(titles))
    head = "".join(
        f"<th{f' title={chr(34)}{_text(tip)}{chr(34)}' if tip else ''}>{_text(h)}</th>"
        for h, tip in zip(headers, tips, strict=True)
    )
    body = "".join("<tr>" + "".join(f"<td>{_text(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<div class="wide"><table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _facts(rows: Sequence[tuple[str, str]]) -> str:
    """A two-column table of what and value, with no header."""
    body = "".join(f"<tr><td>{_text(what)}</td><td>{_text(value)}</td></tr>" for what, value in rows)
    return f'<div class="wide"><table class="facts"><tbody>{body}</tbody></table></div>'


def model_facts(model: dict[str, Any]) -> list[tuple[str, str]]:
    """The model's facts in words, as `attnscope info` shows them."""
    matches = "matches" if model["attention_params"] == model["attention_params_formula"] else "differs from"
    facts = [
        ("model", model["name"]),
        ("family", f"{model['family']} ({model['model_type']}, {model['kind']})"),
        ("layers", str(model["n_layer"])),
        ("heads per layer", str(model["n_head"])),
    ]
    if model.get("n_kv_head", model["n_head"]) != model["n_head"]:
        facts.append(("key/value heads per layer", str(model["n_kv_head"])))
    facts += [
        ("model width (d_model)", str(model["d_model"])),
        ("head width (d_head)", str(model["d_head"])),
        ("context", f"{model['n_ctx']:,} tokens"),
        ("vocabulary", f"{model['vocab_size']:,} tokens"),
        ("parameters", f"{model['n_params']:,}"),
        (
            "attention parameters per layer",
            f"{model['attention_params']:,} ({matches} the formula's {model['attention_params_formula']:,})",
        ),
        ("device", model["device"]),
        ("number format", model["dtype"]),
    ]
    return facts


def settings_rows(report: Any) -> list[tuple[str, str]]:
    """The settings the numbers depend on, in words."""
    heads = report.heads
    settings, inputs = heads.settings, heads.inputs
    rows = [
        ("special tokens", "added (BOS, or [CLS] … [SEP])" if inputs.get("bos") else "none added"),
        ("local window", f"the token and the {settings['window']} before it"),
    ]
    rows += [
        (f"threshold: {role}", f"{SCORE[ROLE[role].score].label} ≥ {value:g}")
        for role, value in settings["thresholds"].items()
    ]
    probe = inputs.get("probe")
    if probe is not None:
        rows.append(
            (
                "repeated-token probe",
                f"{probe['sequences']} sequences of {probe['period']} random tokens, each repeated once (seed "
                f"{probe['seed']})",
            )
        )
    else:
        rows.append(("repeated-token probe", "off"))
    needle = inputs.get("needle")
    if needle is not None:
        depths = ", ".join(f"{100 * depth:.0f} %" for depth in needle["depths"])
        rows.append(
            (
                "needle probe",
                f"a needle of {needle['needle_len']} random tokens in {needle['haystack_len']} tokens of the sample "
                f"texts, at {depths} of it, then copied (seed {needle['seed']})",
            )
        )
    else:
        rows.append(("needle probe", "off"))
    rows += [
        ("batch size", f"{settings['batch_size']} windows"),
        ("tokens per batch", "no limit" if settings["max_tokens"] is None else f"at most {settings['max_tokens']:,}"),
    ]
    if report.diversity is not None:
        diversity = report.diversity.settings
        rows += [
            ("near-duplicate heads", f"JS divergence below {diversity['redundant']:g} bits"),
            ("clusters", f"average linkage below {diversity['cluster_at']:g} bits"),
        ]
    if report.ablation is not None:
        rows.append(("ablation", "each head's output removed in turn; the change in loss (nats per predicted token)"))
    return rows


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
                f'<td class="cell" data-head="{record.label}" data-role="{_text(role.name)}" title="{_text(tip)}" '
                f'style="background:{role.colour};color:{role.ink}"><span class="asv-label">{_text(role.short)}</span>'
                "</td>"
            )
        rows.append(f"<tr><th>{layer}</th>{''.join(cells)}</tr>")
    present = {record.role.role for record in report.heads.heads}
    legend = "".join(
        f'<span class="chip" style="background:{role.colour};color:{role.ink}">{_text(role.short)}</span> '
        f"{_text(role.name)}&ensp;"
        for role in ROLES
        if role.name in present
    )
    return (
        f'<div class="wide"><table class="rolemap"><thead>{shared}<tr><th title="layer \\ head">L\\H</th>'
        f"{header}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        f'<p class="legend">{legend}</p>'
    )


def _top_heads(report: Any) -> str:
    rows = []
    for role, records in report.top_per_role.items():
        score = SCORE[ROLE[role].score]
        for rank, record in enumerate(records, start=1):
            given = ROLE[record.role.role]
            rows.append(
                f'<tr data-head="{record.label}"><td>{_text(role) if rank == 1 else ""}</td><td>{record.label}</td>'
                f"<td>{_number(record.scores[score.name])}</td>"
                f'<td><span class="chip" style="background:{given.colour};color:{given.ink}">'
                f"{_text(given.short)}</span></td></tr>"
            )
    return (
        '<div class="wide"><table class="pick"><thead><tr><th>role</th><th>head</th><th>its score</th>'
        f"<th>role given</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _every_head(report: Any) -> str:
    heads = report.heads
    columns = table_columns(heads.kind.name)
    group = kv_group(heads.model)  # grouped-query attention: which key/value head each head reads, in its own column
    kv = f"<th title='the key/value head it reads ({group} query heads share each)'>kv</th>" if group > 1 else ""
    header = f"<th>head</th>{kv}<th>role</th><th title='the score that decided the role'>by</th>" + "".join(
        f'<th title="{_text(f"{s.label}: {s.description}")}">{_text(s.short)}</th>' for s in columns
    )
    rows = []
    for record in heads.heads:
        role = ROLE[record.role.role]
        cells = "".join(f"<td>{_number(record.scores[score.name])}</td>" for score in columns)
        rows.append(
            f'<tr data-head="{record.label}"><td>{record.label}</td>'
            + (f"<td>{record.head // group}</td>" if group > 1 else "")
            + f'<td><span class="chip" style="background:{role.colour};color:{role.ink}">{_text(role.short)}</span>'
            f"</td><td>{_text(SCORE[record.role.metric].short)} {record.role.score:.2f}</td>{cells}</tr>"
        )
    return (
        "<p>Click a column to sort, a row to show the head; hover a column name for its definition.</p><div "
        f'class="wide tall"><table class="sortable pick"><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}'
        "</tbody></table></div>"
    )


def _diversity(report: Any) -> str:
    diversity = report.diversity
    if diversity is None:
        return '<section id="diversity"><h2>Diversity</h2><p>Not computed (the diversity pass was off).</p></section>'

    def pair_rows(pairs: Sequence[dict]) -> str:
        return "".join(
            f'<tr data-pair="{p["a"]} {p["b"]}"><td>{p["a"]} ~ {p["b"]}</td><td>{_number(p["js"])}</td>'
            f"<td>{_number(p['cosine'])}</td></tr>"
            for p in pairs
        )

    head = "<thead><tr><th>heads</th><th>JSD (bits)</th><th>cosine</th></tr></thead>"
    layers = _table(
        ("layer", "mean JSD between its heads (bits)"),
        [(layer, _number(score)) for layer, score in diversity.layer_scores.items()],
    )
    groups = "; ".join(", ".join(group) for group in diversity.groups) or "none"
    clusters = "; ".join(", ".join(group) for group in diversity.clusters) or "none"
    return (
        '<section id="diversity"><h2>Diversity</h2><p>How differently the heads attend: the Jensen–Shannon divergence '
        "between two heads' attention rows (bits; 0 = the same rows, 1 = disjoint), averaged over every scored row of "
        "every text, and the cosine similarity of their maps. Heads are ordered by average-linkage clustering, with "
        "its dendrogram; the strips beside the matrix give each head's role. Hover a cell to name the two heads, "
        "click it to see their maps side by side.</p>"
        '<div data-viewer="matrix"><p class="fallback">The matrix needs the page\'s script.</p></div>'
        '<div data-viewer="compare"></div>'
        f'<div class="columns"><div><h3>Most redundant pairs</h3><div class="wide"><table class="pick">{head}<tbody>'
        f"{pair_rows(diversity.ranked_pairs(True))}</tbody></table></div></div>"
        f'<div><h3>Most distinct pairs</h3><div class="wide"><table class="pick">{head}<tbody>'
        f"{pair_rows(diversity.ranked_pairs(False))}</tbody></table></div></div>"
        f"<div><h3>Per layer</h3>{layers}</div></div>"
        f"<details><summary>{counted(len(diversity.groups), 'group')} of near-duplicate heads (JSD &lt; "
        f"{diversity.redundant:g} bits, joined through close pairs)</summary><p>{_text(groups)}</p></details>"
        f"<details><summary>{counted(len(diversity.clusters), 'cluster')} (average linkage below "
        f"{diversity.cluster_at:g} bits)</summary><p>{_text(clusters)}</p></details></section>"
    )


def _ablation(report: Any) -> str:
    ablation = report.ablation
    if ablation is None:
        return ""
    top = [
        (f"{layer}.{head}", _number(float(ablation.importance[layer, head]), 4)) for layer, head in ablation.ranked()
    ]
    return (
        '<section id="ablation"><h2>Ablation</h2>'
        f"<p>The loss with each head's output removed ({_text(ablation.settings.get('ablation', 'zero'))} "
        "ablation), minus the loss of the whole model "
        f"({ablation.baseline_loss:.4f} nats per predicted token over {ablation.inputs['predicted_tokens']:,} "
        "tokens): positive (red) = the model needs the head, negative (blue) = it does better without it, as in "
        "importance.png. The colour scale is centred at 0. Click a head to show it.</p>"
        '<div data-viewer="ablation"><p class="fallback">The grid needs the page\'s script.</p></div>'
        "<h3>Most important heads</h3>" + _table(("head", "loss increase (nats)"), top[:10], "pick") + "</section>"
    )


def _inputs(report: Any) -> str:
    heads = report.heads
    inputs = heads.inputs
    sources = inputs.get("sources", [])
    listed = "".join(f"<li>{_text(source)}</li>" for source in sources)
    more = inputs["n_texts"] - len(sources)
    shown = "".join(
        f"<details><summary>{_text(text.name)}: {len(text.ids)} tokens"
        f"{f' (of {text.length}, cut)' if text.cut else ''}</summary><pre>"
        f"{_text(''.join(text.labels.tokens))}</pre></details>"
        for text in report.texts
    )
    notes = "".join(f"<li>{_text(note)}</li>" for note in report.notes)
    map_notes = "".join(f"<li>{_text(note)}</li>" for note in report.map_notes)
    return (
        '<section id="inputs"><h2>Inputs</h2>'
        f"<p>{counted(inputs['n_texts'], 'text')}, {counted(inputs['n_windows'], 'window')}, "
        f"{counted(inputs['n_tokens'], 'token')}, {counted(inputs['scored_rows'], 'scored query row')}.</p>"
        f"<details><summary>Sources ({inputs['n_texts']:,})</summary><ul>{listed}"
        f"{f'<li>… and {more:,} more</li>' if more > 0 else ''}</ul></details>"
        "<h3>Texts the maps are drawn on</h3>"
        f"<p>Every head's attention is drawn on the first "
        f"{counted(len([t for t in report.texts if t.kind == 'text']), 'input text')}, each cut to at most "
        f"{report.token_cap} tokens, and, for a decoder with the probe on, on "
        "the probe's first repeated sequence. The maps are stored with one byte per weight (see the "
        "report's page in the documentation, docs/commands/report.md); the scores and roles use every token of "
        "every text.</p>"
        f"{f'<ul class=notes>{map_notes}</ul>' if map_notes else ''}{shown}"
        f"<h3>Model</h3>{_facts(model_facts(report.model))}<h3>Settings</h3>{_facts(settings_rows(report))}"
        f"{f'<h3>Notes</h3><ul class=notes>{notes}</ul>' if notes else ''}</section>"
    )


def _glossary(report: Any) -> str:
    thresholds = report.heads.settings["thresholds"]
    roles = []
    for role in ROLES:
        if role.score is not None and role.name not in thresholds:
            continue
        rule = (
            "no rule passes"
            if role.score is None
            else f"{SCORE[role.score].label} ({SCORE[role.score].short}) ≥ {thresholds[role.name]:g}"
        )
        roles.append(
            f'<tr><td><span class="chip" style="background:{role.colour};color:{role.ink}">{_text(role.short)}'
            f"</span> {_text(role.name)}</td><td>{_text(rule)}</td><td>{_text(role.description)}</td></tr>"
        )
    scores = "".join(
        f"<tr><td>{_text(score.label)}</td><td><code>{_text(score.short)}</code></td><td>{_text(score.unit)}</td>"
        f"<td>{_text(score.description)}</td></tr>"
        for score in (SCORE[name] for name in report.heads.measured)
    )
    return (
        '<section id="glossary"><h2>Roles and scores</h2><p>A head gets the first role whose rule it passes: the '
        "patterns (previous-token, self, induction, …) first, highest score winning, then retrieval, the sinks only "
        "when no other pattern passes, then local, then broad; mixed when none passes (its closest score is shown). "
        f"The sink rate is the share of heads whose {_text(SCORE['first_token'].label)} exceeds "
        f"{SINK_EPSILON:g} (Gu et al. 2024).</p>"
        '<div class="wide"><table class="facts"><thead><tr><th>role</th><th>rule</th><th>what it means</th></tr>'
        f"</thead><tbody>{''.join(roles)}</tbody></table></div>"
        '<div class="wide"><table class="facts"><thead><tr><th>score</th><th>short</th><th>unit</th>'
        f"<th>definition</th></tr></thead><tbody>{scores}</tbody></table></div></section>"
    )


def _sink_rate(heads: Any) -> str:
    """`sink rate 25 % (first_token > 0.3)`: the share of a model's heads that sink (Gu et al. 2024)."""
    rate = heads.sink_rate
    return f"sink rate {100 * rate.model:.0f} % (first_token &gt; {rate.epsilon:g})"


def _models_line(several: Sequence[Any]) -> str:
    if not several:
        return ""
    rates = ", ".join(f"{_text(page.label)} {100 * page.heads.sink_rate.model:.0f} %" for page in several)
    return (
        f"<p>{counted(len(several), 'model')}, the same texts through each: {_labels(several)}. The page opens on "
        "the last; the slider above the role map chooses the model the role map and the head panel show. Sink "
        f"rate of each: {rates}.</p>"
    )


def _labels(several: Sequence[Any]) -> str:
    return ", ".join(_text(page.label) for page in several)


def _of_shown(several: Sequence[Any]) -> str:
    """What a section of a page of several models is of: the last model, the one the page opens on."""
    return f" ({_text(several[-1].label)}, the last model)" if several else ""


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
        f'<tr data-head="{_text(r["label"])}"><td>{_text(r["label"])}</td><td>{_text(r["on"])}</td>'
        f"<td>{_text(r['score'])}</td><td>{_number(r['with'])}</td><td>{_number(r['without'])}</td>"
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
    notes = "".join(f'<p class="note">note: {_text(note)}</p>' for note in report.notes)
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
        f"<header><h1>attnscope report: {_text(name)}</h1>"
        f"<p>{counted(inputs['n_texts'], 'text')}, {counted(inputs['n_tokens'], 'token')}; "
        f"{counted(model['n_layer'], 'layer')} × {counted(model['n_head'], 'head')}; {_sink_rate(heads)}; attnscope "
        f"{_text(__version__)}.</p>{_models_line(several)}<nav>{nav}</nav></header>"
        + notes
        + explore
        + f'<section id="top-heads"><h2>Top heads per role{_of_shown(several)}</h2><p>The heads with the highest '
        f"score of each role's rule, whatever role they were given.</p>{_top_heads(report)}</section>"
        + _circuit(report)
        + _diversity(report).replace("<h2>Diversity</h2>", f"<h2>Diversity{_of_shown(several)}</h2>", 1)
        + _ablation(report).replace("<h2>Ablation</h2>", f"<h2>Ablation{_of_shown(several)}</h2>", 1)
        + f'<section id="every-head"><h2>Every head{_of_shown(several)}</h2>{_every_head(report)}</section>'
        + _inputs(report)
        + _glossary(report)
    )
    embedded = {"heads": heads_doc, "diversity": diversity_doc, "ablation": ablation_doc}
    if diversity_doc is not None:
        embedded["diversity"] = {key: value for key, value in diversity_doc.items() if key != "matrices"}
    embedded["viewer"] = viewer_data
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>attnscope report: {_text(name)}</title><style>{viewer.style()}</style></head>"
        f'<body class="asv asv-page">{body}'
        f'<script type="application/json" id="attnscope-data" class="asv-data">{viewer.script_json(embedded)}</script>'
        f"<script>{viewer.code()}</script></body></html>\n"
    )
