"""The one table of scores and roles (scores.catalog) is consistent, and everything that names a score or a role
(the kinds, the table columns, the colours and styles, the role maps, the JSON records) reads it."""

from __future__ import annotations

import json

import pytest

from attnscope.scores import catalog, rows
from attnscope.scores.catalog import DECODER, ENCODER, ROLE, ROLE_NAMES, ROLES, SCORE, SCORE_NAMES, SCORES
from attnscope.scores.kinds import KINDS

# The JSON/CSV record of a head, as the schema (version 1) fixes it: written out, not read from the catalog.
RECORD_KEYS = [
    "layer", "head", "label", "kv_head", "role", "role_metric", "role_score",
    "previous_token", "first_token", "self", "local", "entropy", "entropy_normalized", "confidence",
    "local_uniform", "local_lift", "next_token", "last_token", "induction", "duplicate_token", "retrieval",
]  # fmt: skip


def _spellings(score: catalog.Score) -> set[str]:
    """What --sort takes for a score, as a user might type it."""
    return {score.name, score.name.replace("_", "-"), score.short, score.short.upper(), score.label}


def test_score_names_and_short_labels_are_unique():
    assert len(set(SCORE_NAMES)) == len(SCORES)
    assert len({score.short.lower() for score in SCORES}) == len(SCORES)
    assert len({score.label.lower() for score in SCORES}) == len(SCORES)
    assert set(SCORE) == set(SCORE_NAMES)


def test_every_sort_spelling_names_exactly_one_score():
    owners: dict[str, set[str]] = {}
    for score in SCORES:
        for spelling in _spellings(score):
            owners.setdefault(spelling.lower().replace("-", "_").replace(" ", "_"), set()).add(score.name)
            assert catalog.score_named(spelling) is score, spelling
    assert all(len(names) == 1 for names in owners.values()), {k: v for k, v in owners.items() if len(v) > 1}
    assert catalog.score_named("Hnorm") is SCORE["entropy_normalized"]  # a table header
    assert catalog.score_named("previous-token attention") is SCORE["previous_token"]  # the words of a title
    assert catalog.score_named("beauty") is None
    assert catalog.score_named("") is None


def test_role_names_and_short_labels_are_unique_and_each_names_its_role():
    assert len(set(ROLE_NAMES)) == len(ROLES)
    assert len({role.short for role in ROLES}) == len(ROLES)
    for role in ROLES:
        assert catalog.role_named(role.name) is role
        assert catalog.role_named(role.short) is role
        assert catalog.role_named(role.name.replace("-", "_")) is role
        assert len(role.short) <= 5, role.short  # a role-map cell of the terminal is 5 characters wide
    assert catalog.role_named("nonsense") is None


def test_every_role_is_decided_by_a_score_of_the_catalog():
    for role in ROLES:
        if role.rule == "fallback":
            assert role.score is None and role.threshold is None
        else:
            assert role.score in SCORE and 0 < role.threshold <= 1, role.name
            assert SCORE[role.score].per_head, role.name  # a property of the texts cannot tell heads apart
    assert [role.name for role in ROLES if role.rule == "fallback"] == ["mixed"]
    assert catalog.DEFAULT_THRESHOLDS == {role.name: role.threshold for role in ROLES if role.name != "mixed"}
    assert catalog.DEFAULT_THRESHOLDS["broad"] == 0.8
    assert catalog.DEFAULT_THRESHOLDS["retrieval"] == 0.1  # Wu et al. 2024: retrieval score > 0.1
    assert {role.threshold for role in ROLES if role.rule in ("pattern", "sink")} == {0.5}
    assert {role.rule for role in ROLES} == {"pattern", "copy", "sink", "shape", "fallback"}


@pytest.mark.parametrize(
    "kind, expected",
    [
        (
            DECODER,
            [
                "previous-token",
                "self",
                "first-token",
                "induction",
                "duplicate-token",
                "retrieval",
                "local",
                "broad",
                "mixed",
            ],
        ),  # fmt: skip
        (ENCODER, ["previous-token", "self", "first-token", "next-token", "last-token", "local", "broad", "mixed"]),
    ],
)
def test_a_kinds_roles_follow_from_the_scores_it_measures(kind, expected):
    assert [role.name for role in catalog.roles_for(kind)] == expected
    measured = {score.name for score in catalog.scores_for(kind)}
    for role in ROLES:
        assert (role in catalog.roles_for(kind)) == (role.score is None or role.score in measured), role.name


def test_scores_for_each_kind():
    probe = {"induction", "duplicate_token", "retrieval"}  # both probes measure left-to-right copying
    encoder_only = {"next_token", "last_token"}
    assert {s.name for s in catalog.scores_for(DECODER)} == set(SCORE_NAMES) - encoder_only
    assert {s.name for s in catalog.scores_for(ENCODER)} == set(SCORE_NAMES) - probe
    for kind in (DECODER, ENCODER):  # in catalog order
        names = [s.name for s in catalog.scores_for(kind)]
        assert names == [name for name in SCORE_NAMES if name in names]


ROW_SCORES = ["previous_token", "first_token", "self", "local", "entropy", "entropy_normalized", "confidence"]


@pytest.mark.parametrize(
    "name, row_scores, probe, needle",
    [
        (DECODER, ROW_SCORES, ["induction", "duplicate_token"], ["retrieval"]),
        (ENCODER, [*ROW_SCORES, "next_token", "last_token"], [], []),
    ],
)
def test_the_kinds_measure_the_catalogs_scores_by_source(name, row_scores, probe, needle):
    """What a Kind sums per row, what `finish` derives and what the probe measures: the catalog's scores of that
    kind, by source."""
    kind = KINDS[name]
    scores = catalog.scores_for(name)
    assert list(kind.row_score_names) == row_scores
    assert [s.name for s in scores if s.source == catalog.ROWS] == row_scores
    assert [s.name for s in scores if s.source == catalog.DERIVED] == ["local_uniform", "local_lift"]
    assert [s.name for s in scores if s.source == catalog.PROBE] == probe
    assert [s.name for s in scores if s.source == catalog.NEEDLE] == needle
    assert kind.probe == bool(probe) == bool(needle) and set(rows.PROBE_SCORES) == {"induction", "duplicate_token"}
    assert kind.score_names == tuple(s.name for s in scores)


@pytest.mark.parametrize(
    "kind, sort, expected",
    [
        (DECODER, None, ["prev", "first", "self", "induc", "dup", "retr", "lift", "Hnorm", "conf"]),
        (ENCODER, None, ["prev", "first", "self", "next", "last", "lift", "Hnorm", "conf"]),
        (DECODER, "entropy", ["prev", "first", "self", "induc", "dup", "retr", "lift", "H", "conf"]),
        (ENCODER, "entropy", ["prev", "first", "self", "next", "last", "lift", "H", "conf"]),
        (DECODER, "local", ["prev", "first", "self", "induc", "dup", "retr", "local", "Hnorm", "conf"]),
        (ENCODER, "local_uniform", ["prev", "first", "self", "next", "last", "unif", "Hnorm", "conf"]),
        (DECODER, "previous_token", ["prev", "first", "self", "induc", "dup", "retr", "lift", "Hnorm", "conf"]),
    ],
)
def test_table_columns(kind, sort, expected):
    """A decoder's table has no next/last columns, an encoder's no probe columns (the needle probe's retrieval
    after the repeated-token probe's); sorted by a score without a column, that score stands where its sibling was."""
    assert [score.short for score in catalog.table_columns(kind, sort)] == expected


def test_every_score_has_a_unit_and_a_source():
    assert {score.unit for score in SCORES} <= {catalog.FRACTION, catalog.NATS, catalog.SIGNED}
    assert {score.source for score in SCORES} <= {catalog.ROWS, catalog.DERIVED, catalog.PROBE, catalog.NEEDLE}
    assert catalog.PROBES == (catalog.PROBE, catalog.NEEDLE)
    # only an argmax count has no gradient: every other score is a mean of attention weights
    assert [score.name for score in SCORES if not score.differentiable] == ["retrieval"]
    assert all(score.kinds and score.kinds <= catalog.BOTH for score in SCORES)
    assert SCORE["entropy"].unit == catalog.NATS and SCORE["local_lift"].unit == catalog.SIGNED
    columns = [score.column for score in SCORES if score.column is not None]
    assert len(set(columns)) == len(columns)
    for score in SCORES:  # a stand-in takes the place of a column that exists
        assert score.stands_for is None or SCORE[score.stands_for].column is not None


# ------------------------------------------------------------------------------- what reads the catalog


def test_every_role_has_one_colour_and_one_style_and_nothing_else_has():
    from attnscope.output.figures import ROLE_COLOURS
    from attnscope.output.terminal import ROLE_STYLES

    assert set(ROLE_COLOURS) == set(ROLE_NAMES)
    assert set(ROLE_STYLES) == set(ROLE_NAMES)
    assert len(set(ROLE_COLOURS.values())) == len(ROLE_COLOURS)  # roles told apart by colour
    assert len(set(ROLE_STYLES.values())) == len(ROLE_STYLES)


@pytest.mark.parametrize("kind", [DECODER, ENCODER])
def test_the_terminal_role_map_shows_the_catalogs_short_labels(kind):
    from rich.console import Console

    from attnscope.output import terminal

    for role in ROLES:
        assert terminal.role_cell(role.name).plain.strip() == role.short
    heads = [_head_record(0, head, role.name) for head, role in enumerate(catalog.roles_for(kind))]
    console = Console(width=200, record=True, color_system=None)
    console.print(terminal.role_map(heads, 1, len(heads), "Head roles", kind))
    text = console.export_text()
    legend = " ".join(text.splitlines()[4:]).split()  # title, header, layer 0, "rows: layers …", the legend
    for role in catalog.roles_for(kind):  # each code once, and the name beside it where the code is not the name
        assert legend.count(role.short) == 1 and legend.count(role.name) == 1
        if role.short != role.name:
            assert legend[legend.index(role.short) + 1] == role.name
    others = [role for role in ROLES if role not in catalog.roles_for(kind)]
    assert others and all(role.name not in legend for role in others)
    grid = text.splitlines()[2]  # title, header, layer 0
    assert grid.split() == ["0", *(role.short for role in catalog.roles_for(kind))]


def test_the_pictured_role_map_shows_the_catalogs_short_labels():
    """The old bug: the picture said `induct` where the terminal said `induc`. Every cell reads `L.H`, the role's
    short label and its score; the legend lists the roles drawn, in the catalog's order."""
    from attnscope.output import head_grids

    assert len(ROLE_NAMES) == 11  # 2 × 6 cells: every role once, and mixed again to fill the grid
    roles = [list(ROLE_NAMES[:6]), [*ROLE_NAMES[6:], "mixed"]]
    scores = [[f"0.{layer}{head}" for head in range(6)] for layer in range(2)]
    figure = head_grids.role_map(roles, scores, "Head roles", "tiny")
    expected = [
        f"{layer}.{head}\n{ROLE[roles[layer][head]].short}\n0.{layer}{head}" for layer in range(2) for head in range(6)
    ]
    assert [text.get_text() for text in figure.axes[0].texts] == expected
    assert [text.get_text() for text in figure.axes[0].get_legend().get_texts()] == list(ROLE_NAMES)


# ------------------------------------------------------------------------------------- the JSON record


def _head_record(layer, head, role, **scores):
    from attnscope.analyses.scoring import HeadRecord
    from attnscope.scores.roles import Role

    values = {name: scores.get(name) for name in SCORE_NAMES}  # as the analysis builds them: the catalog's order
    return HeadRecord(layer, head, values, Role(role, "previous_token", 0.25))


def test_a_heads_record_holds_every_score_of_the_catalog_in_order():
    from attnscope.output.documents import to_csv, to_json
    from attnscope.output.heads import head_records

    record = _head_record(1, 2, "mixed", previous_token=0.25, entropy=1.5, induction=0.125)
    [written] = head_records([record], {"n_head": 4, "n_kv_head": 2})
    assert list(written) == RECORD_KEYS
    assert list(written)[7:] == list(SCORE_NAMES)
    assert written["kv_head"] == 1  # heads 2 and 3 read key/value head 1 when 4 query heads share 2
    assert (written["label"], written["role"], written["role_metric"], written["role_score"]) == (
        "1.2", "mixed", "previous_token", 0.25,
    )  # fmt: skip
    assert json.loads(to_json(written))["next_token"] is None  # not measured: null
    header, row = to_csv([written]).splitlines()
    assert header.split(",") == RECORD_KEYS
    assert row.split(",")[RECORD_KEYS.index("entropy")] == "1.5"
    assert row.split(",")[RECORD_KEYS.index("next_token")] == ""  # not measured: an empty cell
