"""`Report`: the heads analysis, every head's maps on the first texts and the probe, the diversity of all heads and
the ablation, on both kinds of model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnscope import api
from attnscope.analyses.ablate import Ablate
from attnscope.analyses.report import Report
from attnscope.pipeline.labels import label_window
from attnscope.pipeline.probe import probe_windows
from attnscope.pipeline.tokens import Window, batches, pad_id, tokenize
from attnscope.scores.catalog import DEFAULT_THRESHOLDS, ROLES
from tests.support import TEXTS, given_models, reference_maps

# roles with a deciding score each kind can measure (the probe on): written out by hand
RANKED_ROLES = {
    "decoder": {"previous-token", "self", "first-token", "induction", "duplicate-token", "retrieval", "local", "broad"},
    "encoder": {"previous-token", "self", "first-token", "next-token", "last-token", "local", "broad"},
}
DECIDING = {role.name: role.score for role in ROLES}


def _thresholds(loaded):
    """Thresholds that make exactly one head broad (the broadest of all) and at least one head `self` (the most
    self-attending): a tiny random model's heads are all `mixed` under the defaults, and a report of no
    characteristic head would show no maps at all."""
    records = api.heads(loaded, TEXTS, probe=False).heads
    broadest = max(record.scores["entropy_normalized"] for record in records)
    most_self = max(record.scores["self"] for record in records)
    return {**DEFAULT_THRESHOLDS, "broad": broadest - 1e-9, "self": most_self - 1e-9}


@pytest.fixture(scope="module")
def reports(loaded_models):
    return {kind: Report(thresholds=_thresholds(loaded)).run(loaded, TEXTS) for kind, loaded in loaded_models.items()}


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


def _reference_all_layers(model, ids):
    """(L, H, n, n) from-scratch attention of one window of `ids`."""
    batch = next(batches([Window(0, tuple(ids), 0)], 1, model.device, pad_id(model.tokenizer)))
    reference = reference_maps(model, batch)
    return np.stack([reference[layer][0].numpy() for layer in range(model.n_layer)])


def test_every_head_is_drawn_on_each_text_and_the_probe(reports, model, kind):
    """The maps are every layer's from-scratch attention of each text's first window (and, for a decoder, of the
    probe's first sequence), labelled as `label_window` labels them."""
    report = reports[kind]
    windows = tokenize(model, TEXTS).windows
    texts = [text for text in report.texts if text.kind == "text"]
    assert [text.name for text in texts] == [text.source for text in TEXTS]
    assert [text.ids for text in texts] == [window.ids for window in windows]  # short: nothing cut
    for text in report.texts:
        assert text.maps.shape == (2, model.n_head, len(text.ids), len(text.ids))
        np.testing.assert_allclose(text.maps, _reference_all_layers(model, text.ids), atol=1e-5)
        assert text.labels == label_window(model.tokenizer, text.ids)
    probes = [text for text in report.texts if text.kind == "probe"]
    if kind == "decoder":
        period = report.heads.inputs["probe"]["period"]
        assert [text.ids for text in probes] == [probe_windows(model.tokenizer, period, model.n_ctx, 0)[0].ids]
        assert report.examples["induction"] == len(report.texts) - 1  # the copying roles on the probe
        assert report.examples["previous-token"] == 3  # the longest text (the fox's)
    else:
        assert probes == []


def test_long_texts_are_cut_and_an_encoders_keep_their_sep(model, kind):
    from attnscope.analyses import report as report_module

    shown, notes, cap = report_module.shown_texts(model, TEXTS[:2], None, None, max_tokens=6)
    full = tokenize(model, TEXTS[:2]).windows
    for text, window in zip(shown, full, strict=True):
        assert len(text.ids) == 6 and text.length == len(window.ids) and text.cut
        if kind == "encoder":  # [CLS] the first four text tokens [SEP]
            assert text.ids == window.ids[:5] + window.ids[-1:]
        else:
            assert text.ids == window.ids[:6]
        np.testing.assert_allclose(text.maps, _reference_all_layers(model, text.ids), atol=1e-5)
    assert any("at most 6 tokens" in note for note in notes) and cap == 6


def test_only_the_first_texts_are_drawn(tiny):
    from attnscope.analyses import report as report_module

    shown, notes, _ = report_module.shown_texts(tiny, TEXTS, None, None, max_texts=2)
    assert [text.name for text in shown] == ["a", "b"]
    assert notes == ["the page draws maps of the first 2 texts only"]


def test_one_role_given_one_characteristic_head(model):
    """One role given (broad, to the broadest head only): one characteristic head."""
    records = api.heads(model, TEXTS, probe=False).heads
    broadest = max(records, key=lambda record: record.scores["entropy_normalized"])
    thresholds = {**DEFAULT_THRESHOLDS, "broad": broadest.scores["entropy_normalized"] - 1e-9}
    report = Report(thresholds=thresholds, probe=False, diversity=False).run(model, TEXTS)
    assert [record.label for record in report.characteristic] == [broadest.label]
    assert report.heads.attention == {}  # the page draws from `texts`: no layer kept twice


def test_the_diversity_covers_every_head_of_the_model(reports, model, kind):
    diversity = reports[kind].diversity
    assert diversity is not None and diversity.layer is None
    assert diversity.labels == [f"{layer}.{head}" for layer in range(2) for head in range(4)]
    assert diversity.js.shape == diversity.cosine.shape == (8, 8)
    assert diversity.settings["top"] == 5
    alone = api.diversity(model, TEXTS, layer=None)  # the same pass, run on its own
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
    report = Report(probe=False, diversity=False).run(tiny, TEXTS[:2])
    assert report.diversity is None
    assert "induction" not in report.top_per_role  # the probe's roles are left out with the probe off
    assert [text.kind for text in report.texts] == ["text", "text"]  # no probe drawn either


@pytest.fixture(scope="module")
def tiny_lm(model_dirs):
    from attnscope.models.loading import load_model

    return load_model(str(model_dirs["decoder"]), "cpu", lm_head=True)


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
def test_the_ablation_is_ablates_own(tiny_lm):
    """`ablate` adds the loss ablation, the same as `Ablate` alone (loss method), and asks for the LM head."""
    assert Report(ablate=True).needs_lm_head and not Report().needs_lm_head
    report = Report(probe=False, diversity=False, ablate=True).run(tiny_lm, TEXTS[:2])
    alone = Ablate(method="loss").run(tiny_lm, TEXTS[:2])
    np.testing.assert_allclose(report.ablation.importance, alone.importance, atol=1e-12)
    assert report.ablation.baseline_loss == pytest.approx(alone.baseline_loss)


def test_the_dendrogram_is_scipys_average_linkage_of_the_js_divergence(reports, kind):
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    report = reports[kind]
    expected = linkage(squareform(report.diversity.js, checks=False), method="average", optimal_ordering=True)
    np.testing.assert_allclose(report.linkage, expected, atol=1e-12)


# ------------------------------------------------------------------------------------------ several models


def _without_head(loaded, layer, head):
    """A copy of a loaded tiny GPT-2 with head `layer.head` removed by hand: its rows of the input side of c_proj
    (a Conv1D, weight (in, out)) zeroed."""
    import copy

    import torch

    other = copy.deepcopy(loaded)
    d_head = other.d_model // other.n_head
    with torch.no_grad():
        other.model.h[layer].attn.c_proj.weight[head * d_head : (head + 1) * d_head] = 0.0
    return other


@pytest.fixture(scope="module")
def two_models(tiny):
    settings = Report(thresholds=_thresholds(tiny))
    without = _without_head(tiny, 0, 1)
    return settings, without, settings.run_models(given_models(("tiny", tiny), ("without-0.1", without)), TEXTS)


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
def test_each_model_of_a_report_of_several_is_its_own_report(two_models, tiny):
    """Every model's heads are those of its own one-model report under the same settings, its maps every layer's
    from-scratch attention of the same texts; the last model's are the report's own (the page opens on it), and
    the notes name only the passes that ran (the diversity here, no ablation)."""
    settings, without, report = two_models
    assert [page.label for page in report.models] == ["tiny", "without-0.1"]
    first, second = report.models
    assert second.heads is report.heads and second.texts is report.texts
    alone = settings.run(tiny, TEXTS)
    assert first.heads.heads == alone.heads.heads
    assert first.characteristic == alone.characteristic
    assert [text.ids for text in first.texts] == [text.ids for text in report.texts] == [t.ids for t in alone.texts]
    for text in first.texts:
        np.testing.assert_allclose(text.maps, _reference_all_layers(tiny, text.ids), atol=1e-5)
    assert second.heads.heads == settings.run(without, TEXTS).heads.heads
    note = next(note for note in report.notes if "2 models (tiny, without-0.1)" in note)
    assert "opens on the last, without-0.1" in note and "the tables and the diversity are the last model's" in note
    assert "ablation" not in " ".join(report.notes)


def test_a_head_removed_changes_only_the_maps_of_the_layers_above(two_models):
    """Head 0.1's output removed: layer 0's attention is the same in both models (nothing below the change), layer 1's
    is not, and so at least one of layer 1's scores moves."""
    _, _, report = two_models
    first, second = report.models
    for a, b in zip(first.texts, second.texts, strict=True):
        np.testing.assert_array_equal(a.maps[0], b.maps[0])
    assert any(np.abs(a.maps[1] - b.maps[1]).max() > 1e-4 for a, b in zip(first.texts, second.texts, strict=True))
    scores = [[record.scores["entropy_normalized"] for record in page.heads.heads] for page in report.models]
    assert scores[0][:4] == scores[1][:4] and scores[0][4:] != scores[1][4:]


def test_several_models_share_the_map_budget(tiny, monkeypatch):
    """Three models share MULTI_MAP_CELLS: each model's maps of every text fit a third of it, all cut alike."""
    from attnscope.analyses import report as report_module

    monkeypatch.setattr(report_module, "MULTI_MAP_CELLS", 3 * 8 * 40 * 41 // 2 * 2)  # room for ~2 texts of 40 each
    models = given_models(*[(name, tiny) for name in ("a", "b", "c")])
    report = Report(probe=False, diversity=False).run_models(models, TEXTS)
    budget = report_module.MULTI_MAP_CELLS // 3
    for page in report.models:
        cells = sum(8 * report_module.map_cells(len(text.ids), True) for text in page.texts)
        assert cells <= budget
        assert [text.ids for text in page.texts] == [text.ids for text in report.texts]
    assert any("share" in note for note in report.map_notes)


DAMAGED_MLP = (
    "the model's weights hold NaN or infinite values (first in h.1.mlp.c_fc.weight): the checkpoint is damaged"
)


@pytest.mark.parametrize("damaged_first", [True, False], ids=["damaged first", "damaged second"])
def test_a_model_whose_mlp_holds_nan_is_refused_first_second_or_alone(tiny, mlp_nan_model, damaged_first):
    """Its maps are finite, so its page passed for a sound model's. Its weights are checked as it opens: first (a
    model whose page is read only for its maps), last (the page's own model, `run`), or alone."""
    from attnscope.errors import AttnscopeError

    models = [("tiny", tiny), ("damaged", mlp_nan_model)][:: -1 if damaged_first else 1]
    settings = Report(probe=False, diversity=False)
    with pytest.raises(AttnscopeError) as refused:
        settings.run_models(given_models(*models), TEXTS)
    assert str(refused.value) == f"model 'damaged': {DAMAGED_MLP}"
    with pytest.raises(AttnscopeError) as refused:
        settings.run(mlp_nan_model, TEXTS)
    assert str(refused.value) == DAMAGED_MLP


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_the_api_takes_a_list_of_models_and_refuses_in_one_line(tiny, two_models):
    """`report([a, b])`: loaded models are reported as they are (labelled by their folders, not freed); a list of one
    is a report of one model; what cannot be is refused before any model loads."""
    import attnscope
    from attnscope.errors import AttnscopeError

    settings, without, _ = two_models
    thresholds = dict(settings.thresholds)
    both = attnscope.report([tiny, without], TEXTS, diversity=False, thresholds=thresholds)
    name = Path(tiny.name).name
    assert [page.label for page in both.models] == [name, f"{name}#2"]  # a copy of one folder, changed in memory
    assert both.models[1].heads.heads == two_models[2].models[1].heads.heads
    assert next(tiny.model.parameters()).device.type == "cpu"  # a model given loaded stays loaded
    assert attnscope.report([tiny], TEXTS, diversity=False).models == []
    for given, says in [
        ({"model": tiny, "revisions": ["a", "b"]}, "revisions (--revisions) are revisions of one model given by name"),
        ({"model": "gpt2", "revision": "main", "revisions": "a,b"}, "revision and revisions"),
        ({"model": ["demo", "demo"]}, "model 'demo' is given twice"),
        ({"model": [tiny, tiny]}, f"model {tiny.name!r} is given twice"),
        ({"model": []}, "model []: give at least one model"),
        ({"model": "gpt2", "revisions": [1, 2]}, "revisions [1, 2]: expected revisions such as step0,step512"),
    ]:
        with pytest.raises(AttnscopeError) as raised:
            attnscope.report(**given)
        assert str(raised.value).startswith(says), raised.value


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_report_circuit_holds_the_circuit_commands_records(tiny):
    """`report --circuit` (the real analysis, not a stand-in): the page's dependencies are `attnscope circuit`'s
    records for the same texts and probe, each head's CIRCUIT_TOP largest changes."""
    import attnscope
    from attnscope.analyses.report import CIRCUIT_TOP

    page = attnscope.report(tiny, TEXTS, circuit=True, diversity=False)
    alone = attnscope.circuit(tiny, TEXTS, top=CIRCUIT_TOP, weights=False)
    kept = ("label", "on", "score", "with", "without", "change")  # the keys the page reads: measured, not estimated
    records = alone.dependencies(CIRCUIT_TOP)
    assert not any(record["estimate"] or record["clipped"] for record in records)
    assert page.dependencies == [{key: record[key] for key in kept} for record in records]
    assert {record["label"] for record in page.dependencies} == {f"1.{head}" for head in range(tiny.n_head)}
