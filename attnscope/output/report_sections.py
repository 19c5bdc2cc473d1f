"""The report page's sections that read without scripts (output/report_page.py puts the page together): the top heads
of each role, every head, the diversity, the ablation, the inputs (with the model's facts and the settings) and the
glossary, each a piece of static HTML built from a ReportResult by duck typing; and the HTML helpers they and the page
share (escaped text, numbers, tables).
"""

from __future__ import annotations

import html as escaping
from collections.abc import Sequence
from typing import Any

from attnscope.output.heads import kv_group
from attnscope.scores.catalog import ROLE, ROLES, SCORE, SINK_EPSILON, counted, table_columns


def text_html(value: Any) -> str:
    return escaping.escape(str(value), quote=True)


def number_html(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table_html(headers: Sequence[str], rows: Sequence[Sequence[Any]], css: str = "", titles: Sequence[str] = ()) -> str:
    """A table of plain cells (escaped); `titles`: a tooltip per header."""
    tips = list(titles) + [""] * (len(headers) - len(titles))
    head = "".join(
        f"<th{f' title={chr(34)}{text_html(tip)}{chr(34)}' if tip else ''}>{text_html(h)}</th>"
        for h, tip in zip(headers, tips, strict=True)
    )
    body = "".join("<tr>" + "".join(f"<td>{text_html(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<div class="wide"><table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def facts_html(rows: Sequence[tuple[str, str]]) -> str:
    """A two-column table of what and value, with no header."""
    body = "".join(f"<tr><td>{text_html(what)}</td><td>{text_html(value)}</td></tr>" for what, value in rows)
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


def top_heads(report: Any) -> str:
    rows = []
    for role, records in report.top_per_role.items():
        score = SCORE[ROLE[role].score]
        for rank, record in enumerate(records, start=1):
            given = ROLE[record.role.role]
            rows.append(
                f'<tr data-head="{record.label}"><td>{text_html(role) if rank == 1 else ""}</td><td>{record.label}</td>'
                f"<td>{number_html(record.scores[score.name])}</td>"
                f'<td><span class="chip" style="background:{given.colour};color:{given.ink}">'
                f"{text_html(given.short)}</span></td></tr>"
            )
    return (
        '<div class="wide"><table class="pick"><thead><tr><th>role</th><th>head</th><th>its score</th>'
        f"<th>role given</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def every_head(report: Any) -> str:
    heads = report.heads
    columns = table_columns(heads.kind.name)
    group = kv_group(heads.model)  # grouped-query attention: which key/value head each head reads, in its own column
    kv = f"<th title='the key/value head it reads ({group} query heads share each)'>kv</th>" if group > 1 else ""
    header = f"<th>head</th>{kv}<th>role</th><th title='the score that decided the role'>by</th>" + "".join(
        f'<th title="{text_html(f"{s.label}: {s.description}")}">{text_html(s.short)}</th>' for s in columns
    )
    rows = []
    for record in heads.heads:
        role = ROLE[record.role.role]
        cells = "".join(f"<td>{number_html(record.scores[score.name])}</td>" for score in columns)
        rows.append(
            f'<tr data-head="{record.label}"><td>{record.label}</td>'
            + (f"<td>{record.head // group}</td>" if group > 1 else "")
            + f'<td><span class="chip" style="background:{role.colour};color:{role.ink}">{text_html(role.short)}</span>'
            f"</td><td>{text_html(SCORE[record.role.metric].short)} {record.role.score:.2f}</td>{cells}</tr>"
        )
    return (
        "<p>Click a column to sort, a row to show the head; hover a column name for its definition.</p><div "
        f'class="wide tall"><table class="sortable pick"><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}'
        "</tbody></table></div>"
    )


def diversity_section(report: Any) -> str:
    diversity = report.diversity
    if diversity is None:
        return '<section id="diversity"><h2>Diversity</h2><p>Not computed (the diversity pass was off).</p></section>'

    def pair_rows(pairs: Sequence[dict]) -> str:
        return "".join(
            f'<tr data-pair="{p["a"]} {p["b"]}"><td>{p["a"]} ~ {p["b"]}</td><td>{number_html(p["js"])}</td>'
            f"<td>{number_html(p['cosine'])}</td></tr>"
            for p in pairs
        )

    head = "<thead><tr><th>heads</th><th>JSD (bits)</th><th>cosine</th></tr></thead>"
    layers = table_html(
        ("layer", "mean JSD between its heads (bits)"),
        [(layer, number_html(score)) for layer, score in diversity.layer_scores.items()],
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
        f"{diversity.redundant:g} bits, joined through close pairs)</summary><p>{text_html(groups)}</p></details>"
        f"<details><summary>{counted(len(diversity.clusters), 'cluster')} (average linkage below "
        f"{diversity.cluster_at:g} bits)</summary><p>{text_html(clusters)}</p></details></section>"
    )


def ablation_section(report: Any) -> str:
    ablation = report.ablation
    if ablation is None:
        return ""
    top = [
        (f"{layer}.{head}", number_html(float(ablation.importance[layer, head]), 4))
        for layer, head in ablation.ranked()
    ]
    return (
        '<section id="ablation"><h2>Ablation</h2>'
        f"<p>The loss with each head's output removed ({text_html(ablation.settings.get('ablation', 'zero'))} "
        "ablation), minus the loss of the whole model "
        f"({ablation.baseline_loss:.4f} nats per predicted token over {ablation.inputs['predicted_tokens']:,} "
        "tokens): positive (red) = the model needs the head, negative (blue) = it does better without it, as in "
        "importance.png. The colour scale is centred at 0. Click a head to show it.</p>"
        '<div data-viewer="ablation"><p class="fallback">The grid needs the page\'s script.</p></div>'
        "<h3>Most important heads</h3>" + table_html(("head", "loss increase (nats)"), top[:10], "pick") + "</section>"
    )


def inputs_section(report: Any) -> str:
    heads = report.heads
    inputs = heads.inputs
    sources = inputs.get("sources", [])
    listed = "".join(f"<li>{text_html(source)}</li>" for source in sources)
    more = inputs["n_texts"] - len(sources)
    shown = "".join(
        f"<details><summary>{text_html(text.name)}: {len(text.ids)} tokens"
        f"{f' (of {text.length}, cut)' if text.cut else ''}</summary><pre>"
        f"{text_html(''.join(text.labels.tokens))}</pre></details>"
        for text in report.texts
    )
    notes = "".join(f"<li>{text_html(note)}</li>" for note in report.notes)
    map_notes = "".join(f"<li>{text_html(note)}</li>" for note in report.map_notes)
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
        f"<h3>Model</h3>{facts_html(model_facts(report.model))}<h3>Settings</h3>{facts_html(settings_rows(report))}"
        f"{f'<h3>Notes</h3><ul class=notes>{notes}</ul>' if notes else ''}</section>"
    )


def glossary_section(report: Any) -> str:
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
            f'<tr><td><span class="chip" style="background:{role.colour};color:{role.ink}">{text_html(role.short)}'
            f"</span> {text_html(role.name)}</td><td>{text_html(rule)}</td><td>{text_html(role.description)}</td></tr>"
        )
    scores = "".join(
        f"<tr><td>{text_html(score.label)}</td><td><code>{text_html(score.short)}</code></td><td>{text_html(score.unit)}</td>"
        f"<td>{text_html(score.description)}</td></tr>"
        for score in (SCORE[name] for name in report.heads.measured)
    )
    return (
        '<section id="glossary"><h2>Roles and scores</h2><p>A head gets the first role whose rule it passes: the '
        "patterns (previous-token, self, induction, …) first, highest score winning, then retrieval, the sinks only "
        "when no other pattern passes, then local, then broad; mixed when none passes (its closest score is shown). "
        f"The sink rate is the share of heads whose {text_html(SCORE['first_token'].label)} exceeds "
        f"{SINK_EPSILON:g} (Gu et al. 2024).</p>"
        '<div class="wide"><table class="facts"><thead><tr><th>role</th><th>rule</th><th>what it means</th></tr>'
        f"</thead><tbody>{''.join(roles)}</tbody></table></div>"
        '<div class="wide"><table class="facts"><thead><tr><th>score</th><th>short</th><th>unit</th>'
        f"<th>definition</th></tr></thead><tbody>{scores}</tbody></table></div></section>"
    )
