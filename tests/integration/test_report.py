"""`Report`: the heads analysis, the maps of the layers of each role's characteristic head, and the diversity of all
heads, on both kinds of model."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope.analyses.diversity import analyze_diversity
from attnscope.analyses.heads import Heads, analyze_heads
from attnscope.analyses.report import Report
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from attnscope.scores.catalog import DEFAULT_THRESHOLDS, ROLES
from tests.support import TEXTS, reference_maps

# roles with a deciding score each kind can measure (the probe on): written out by hand
RANKED_ROLES = {
    "decoder": {"previous-token", "self", "first-token", "induction", "duplicate-token", "local", "broad"},
    "encoder": {"previous-token", "self", "first-token", "next-token", "last-token", "local", "broad"},
}
DECIDING = {role.name: role.score for role in ROLES}


def _thresholds(loaded):
    """Thresholds that make exactly one head broad (the broadest of all) and at least one head `self` (the most
    self-attending): a tiny random model's heads are all `mixed` under the defaults, and a report of no
    characteristic head would show no maps at all."""
    records = analyze_heads(loaded, TEXTS, probe=False).heads
    broadest = max(record.scores["entropy_normalized"] for record in records)
    most_self = max(record.scores["self"] for record in records)
    return {**DEFAULT_THRESHOLDS, "broad": broadest - 1e-9, "self": most_self - 1e-9}


@pytest.fixture(scope="module")
def reports(loaded_models):
    return {
        kind: Report(Heads(thresholds=_thresholds(loaded))).run(loaded, TEXTS) for kind, loaded in loaded_models.items()
    }


def _hand_characteristic(records):
    """Per role in the catalog's order (mixed left out), the member with the highest deciding score."""
    chosen = []
    for role in ROLES:
        members = [record for record in records if record.role.role == role.name and role.name != "mixed"]
        if members:
            chosen.append(max(members, key=lambda record: (record.role.score, -record.layer, -record.head)))
    return chosen


def test_characteristic_heads_are_the_best_of_each_role(reports, kind):
    report = reports[kind]
    records = report.heads.heads
    roles = {record.role.role for record in records}
    assert "self" in roles and len(roles - {"mixed"}) >= 1  # the thresholds gave some head a role
    assert report.characteristic == _hand_characteristic(records)
    assert report.characteristic  # not an empty report
    for record in report.characteristic:
        assert record.role.score == record.scores[DECIDING[record.role.role]]


def test_maps_are_those_of_the_characteristic_heads_layers_for_the_first_text(reports, model, kind):
    report = reports[kind]
    layers = {record.layer for record in report.characteristic}
    assert set(report.heads.attention) == layers
    window = tokenize(model, TEXTS[:1]).windows[0]
    reference = reference_maps(model, next(batches([window], 1, model.device, pad_id(model.tokenizer))))
    for layer in layers:
        kept = report.heads.attention[layer]
        assert kept.maps.shape == (model.n_head, len(window.ids), len(window.ids))
        assert float((kept.maps - reference[layer][0]).abs().max()) < 1e-5


def test_a_layer_with_no_characteristic_head_keeps_no_maps(model):
    """One role given (broad, to the broadest head only): one layer of the two is drawn."""
    records = analyze_heads(model, TEXTS, probe=False).heads
    broadest = max(records, key=lambda record: record.scores["entropy_normalized"])
    thresholds = {**DEFAULT_THRESHOLDS, "broad": broadest.scores["entropy_normalized"] - 1e-9}
    report = Report(Heads(thresholds=thresholds, probe=False), diversity=False).run(model, TEXTS)
    assert [record.label for record in report.characteristic] == [broadest.label]
    assert set(report.heads.attention) == {broadest.layer}


def test_the_diversity_covers_every_head_of_the_model(reports, model, kind):
    diversity = reports[kind].diversity
    assert diversity is not None and diversity.layer is None
    assert diversity.labels == [f"{layer}.{head}" for layer in range(2) for head in range(4)]
    assert diversity.js.shape == diversity.cosine.shape == (8, 8)
    assert diversity.settings["top"] == 5
    alone = analyze_diversity(model, TEXTS, None)  # the same pass, run on its own
    np.testing.assert_allclose(diversity.js, alone.js, atol=1e-12)
    np.testing.assert_allclose(diversity.cosine, alone.cosine, atol=1e-12)


def test_top_heads_per_role_against_a_hand_sort(reports, kind):
    report = reports[kind]
    records = report.heads.heads
    assert set(report.top_per_role) == RANKED_ROLES[kind]
    for role, top in report.top_per_role.items():
        score = DECIDING[role]
        expected = sorted(records, key=lambda record: (-record.scores[score], record.layer, record.head))[:3]
        assert top == expected, role


def test_the_report_carries_the_heads_settings_and_model(reports, model, kind):
    report = reports[kind]
    assert report.model == model.info() and report.model["kind"] == kind
    assert report.heads.kind is model.kind
    assert report.notes == report.heads.notes


def test_without_diversity_no_second_pass_runs(tiny, monkeypatch):
    from attnscope.analyses import report as report_module

    monkeypatch.setattr(report_module.Diversity, "run", lambda *a, **k: pytest.fail("diversity ran"))
    report = Report(Heads(probe=False), diversity=False).run(tiny, TEXTS[:2])
    assert report.diversity is None
    assert "induction" not in report.top_per_role  # the probe's roles are left out with the probe off
