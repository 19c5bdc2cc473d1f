"""`Heads` and its result on both kinds of model: the kind it carries, which scores it measured (and None for the
rest), the selection of heads, sorts checked before any forward pass, canonical sort names."""

from __future__ import annotations

import pytest

from attnscope import api
from attnscope.analyses import scoring as scoring_module
from attnscope.analyses.heads import Heads
from attnscope.errors import AttnscopeError
from attnscope.scores.catalog import SCORE_NAMES
from tests.support import TEXTS

ROW = ("previous_token", "first_token", "self", "local", "entropy", "entropy_normalized", "confidence")
DERIVED = ("local_uniform", "local_lift")
# what each kind of run measures, written out by hand (the catalog's order)
MEASURED = {
    ("decoder", True): (*ROW, *DERIVED, "induction", "duplicate_token", "retrieval"),  # both probes
    ("decoder", False): (*ROW, *DERIVED),
    ("encoder", True): (*ROW, *DERIVED, "next_token", "last_token"),
    ("encoder", False): (*ROW, *DERIVED, "next_token", "last_token"),
}
PROBE_NOTE = "the probes (repeated tokens, needle) measure left-to-right copying; skipped for encoder models"


@pytest.fixture(scope="module")
def results(loaded_models):
    """(kind, probe) -> the heads result of the test texts."""
    return {
        (kind, probe): api.heads(loaded, TEXTS[:2], probe=probe)
        for kind, loaded in loaded_models.items()
        for probe in (True, False)
    }


@pytest.fixture(params=[True, False], ids=["probe", "no-probe"])
def probe(request):
    return request.param


def test_results_carry_the_kind_of_the_model(results, model, kind, probe):
    result = results[kind, probe]
    assert result.kind is model.kind and result.kind.name == model.family.kind.name == kind
    assert result.model["kind"] == kind and result.model == model.info()


def test_measured_lists_exactly_the_scores_measured_and_the_others_are_none(results, kind, probe):
    result = results[kind, probe]
    assert result.measured == MEASURED[kind, probe]
    assert len(result.heads) == 2 * 4
    for record in result.heads:
        assert list(record.scores) == list(SCORE_NAMES)  # every score of the catalog, in order
        for name, value in record.scores.items():
            if name in result.measured:
                assert isinstance(value, float), (record.label, name)
            else:
                assert value is None, (record.label, name)


def test_fraction_scores_lie_between_zero_and_one(results, kind, probe):
    result = results[kind, probe]
    fractions = [
        name for name in result.measured if name not in ("entropy", "local_lift", "local_uniform")
    ]  # entropy is in nats, the lift is signed
    for record in result.heads:
        for name in fractions:
            assert 0.0 <= record.scores[name] <= 1.0 + 1e-9, (record.label, name)


def test_the_probe_is_run_for_decoders_and_skipped_for_encoders(results):
    decoder = results["decoder", True]
    assert decoder.inputs["probe"]["period"] == 50 and decoder.inputs["probe"]["seed"] == 0
    assert decoder.inputs["probe"]["scored_rows"] == 4 * 50  # the second copy of each of the 4 sequences
    assert PROBE_NOTE not in decoder.notes
    # the needle probe at its default: 3 depths × a needle of 16, in a haystack of 90 (the tiny model holds 128)
    assert decoder.inputs["needle"] == {
        "haystack_len": 90, "needle_len": 16, "depths": [0.1, 0.5, 0.9], "seed": 0, "scored_rows": 48,
    }  # fmt: skip
    assert "probe" not in results["decoder", False].inputs and "needle" not in results["decoder", False].inputs
    for probe in (True, False):
        encoder = results["encoder", probe]
        assert "probe" not in encoder.inputs and "needle" not in encoder.inputs
        assert (PROBE_NOTE in encoder.notes) == probe  # only said when the probe was asked for


def test_thresholds_are_those_of_the_roles_the_kind_can_be_given(results):
    decoder, encoder = results["decoder", True].settings["thresholds"], results["encoder", True].settings["thresholds"]
    assert "induction" in decoder and "duplicate-token" in decoder and decoder["retrieval"] == 0.1
    assert "next-token" not in decoder and "last-token" not in decoder
    assert "induction" not in encoder and "duplicate-token" not in encoder and "retrieval" not in encoder
    assert "next-token" in encoder and "last-token" in encoder
    for thresholds in (decoder, encoder):
        assert {"previous-token", "self", "first-token", "local", "broad"} <= set(thresholds)


def _hand_select(records, layer, score, top):
    chosen = [record for record in records if layer is None or record.layer == layer]
    if score is not None:
        chosen = sorted(chosen, key=lambda record: (-record.scores[score], record.layer, record.head))
    return chosen if top is None else chosen[:top]


SELECTIONS = [
    (None, None, None, None),
    (1, None, None, None),
    (None, "prev", "previous_token", None),
    (0, "Hnorm", "entropy_normalized", 2),
    (None, "confidence", "confidence", 3),
    (1, "local-lift", "local_lift", 1),
    (None, None, None, 5),
]


@pytest.mark.parametrize("layer, sort, score, top", SELECTIONS)
def test_select_against_a_hand_sort(results, kind, layer, sort, score, top):
    records = results[kind, True].heads
    got = results[kind, True].select(layer, sort, top)
    assert [record.label for record in got] == [record.label for record in _hand_select(records, layer, score, top)]


def test_select_by_a_kind_specific_score(results):
    decoder, encoder = results["decoder", True], results["encoder", True]
    assert decoder.select(sort="induc") == _hand_select(decoder.heads, None, "induction", None)
    assert encoder.select(sort="last", top=4) == _hand_select(encoder.heads, None, "last_token", 4)
    assert encoder.select(layer=0, sort="next_token") == _hand_select(encoder.heads, 0, "next_token", None)


def test_selected_is_the_runs_own_selection(model):
    result = Heads(layer=1, sort="self", top=2, probe=False).run(model, TEXTS[:2])
    assert result.selection == {"layer": 1, "sort": "self", "top": 2}
    assert result.selected == _hand_select(result.heads, 1, "self", 2)
    assert len(result.selected) == 2 and len(result.heads) == 8  # the records keep every head


@pytest.mark.parametrize(
    "kind_, probe, sort, name, reason",
    [
        ("decoder", True, "next_token", "next_token", "that score is measured for encoders only"),
        ("decoder", True, "last", "last_token", "that score is measured for encoders only"),
        ("encoder", True, "induction", "induction", "that score is measured for decoders only"),
        ("encoder", False, "dup", "duplicate_token", "that score is measured for decoders only"),
        ("decoder", False, "induction", "induction", "that score comes from the probe, which is off"),
        ("decoder", False, "duplicate-token", "duplicate_token", "that score comes from the probe, which is off"),
        ("decoder", False, "retr", "retrieval", "that score comes from the needle probe, which is off"),
        ("encoder", True, "retrieval", "retrieval", "that score is measured for decoders only"),
    ],
)
def test_a_sort_that_cannot_be_satisfied_is_refused_before_any_forward_pass(
    loaded_models, results, monkeypatch, kind_, probe, sort, name, reason
):
    def no_forward_pass(*args, **kwargs):
        raise AssertionError("a forward pass ran before the sort was checked")

    monkeypatch.setattr(scoring_module, "run_windows", no_forward_pass)
    monkeypatch.setattr(scoring_module, "probe_scores", no_forward_pass)
    monkeypatch.setattr(scoring_module, "needle_scores", no_forward_pass)
    with pytest.raises(AttnscopeError, match=f"^sort by {name}: {reason}$"):  # Heads keeps the canonical name
        Heads(sort=sort, probe=probe).run(loaded_models[kind_], TEXTS[:1])
    with pytest.raises(AttnscopeError, match=f"^sort by {sort}: {reason}$"):  # and when selecting from a result
        results[kind_, probe].select(sort=sort)


def test_a_layer_or_head_out_of_range_is_refused_before_any_forward_pass(model, monkeypatch):
    def no_forward_pass(*args, **kwargs):
        raise AssertionError("a forward pass ran before the settings were checked")

    monkeypatch.setattr(scoring_module, "run_windows", no_forward_pass)
    with pytest.raises(AttnscopeError, match=r"^layer 2 is out of range \(this model has layers 0-1\)$"):
        Heads(layer=2).run(model, TEXTS[:1])
    with pytest.raises(AttnscopeError, match=r"^head '1.4': head 4 is out of range \(this model has heads 0-3\)$"):
        Heads(plot=("1.4",)).run(model, TEXTS[:1])


def test_an_unknown_sort_is_refused_on_construction():
    with pytest.raises(AttnscopeError, match=r"^sort 'beauty': use one of previous_token, first_token, .*last_token"):
        Heads(sort="beauty")


@pytest.mark.parametrize(
    "spelling, name",
    [
        ("prev", "previous_token"),
        ("previous-token", "previous_token"),
        ("previous_token", "previous_token"),
        ("Hnorm", "entropy_normalized"),
        ("H", "entropy"),
        ("induc", "induction"),
        ("retr", "retrieval"),
        ("local lift", "local_lift"),
    ],
)
def test_sort_is_stored_under_its_canonical_name(spelling, name):
    assert Heads(sort=spelling).sort == name


def test_the_canonical_sort_name_reaches_the_result(tiny):
    result = Heads(sort="prev", probe=False).run(tiny, TEXTS[:1])
    assert result.settings["sort"] == "previous_token" and result.selection["sort"] == "previous_token"
    assert result.selected == _hand_select(result.heads, None, "previous_token", None)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"window": 0}, "window 0: must be a whole number from 1 to 100,000"),
        ({"batch_size": 0}, "batch_size 0: must be a whole number from 1 to 100,000"),
        ({"probe_len": 2}, "probe_len 2: must be a whole number from 3 to 100,000"),
        ({"probe_seed": -1}, "probe_seed -1: must be a whole number from 0 to 4,294,967,295"),
        ({"haystack_len": 9}, "haystack_len 9: must be a whole number from 10 to 100,000"),
        ({"top": 0}, "top 0: must be a whole number from 1 to 1,000,000"),
        ({"words": True}, "words \\(--words\\) draws the maps of plot \\(--plot L.H\\) word by word: give plot too"),
    ],
)
def test_bad_settings_are_refused_on_construction(settings, message):
    with pytest.raises(AttnscopeError, match=f"^{message}$"):
        Heads(**settings)


def test_a_probe_too_long_for_the_context_is_refused_before_the_texts_run(tiny, monkeypatch):
    monkeypatch.setattr(scoring_module, "run_windows", lambda *a, **k: pytest.fail("the texts ran"))
    with pytest.raises(AttnscopeError, match="must fit the model's context of 128 tokens"):
        Heads(probe_len=64).run(tiny, TEXTS[:1])  # BOS + 2 × 64 = 129 tokens
    with pytest.raises(AttnscopeError, match=r"^haystack length 94: .*\(129 tokens\) must fit the model's context"):
        Heads(haystack_len=94).run(tiny, TEXTS[:1])  # BOS + 94 + 2 × (a cue and 16 needle tokens) = 129


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_the_default_probe_is_shortened_to_fit_a_short_context(short_context_model_dir):
    from attnscope.models.loading import load_model

    loaded = load_model(str(short_context_model_dir), "cpu")  # 16 tokens: BOS + 2 × 7
    result = Heads().run(loaded, TEXTS[:1])
    assert result.inputs["probe"]["period"] == 7 and result.inputs["probe"]["scored_rows"] == 4 * 7
    assert "probe period shortened to 7 tokens to fit the context of 16 tokens" in result.notes
    # the needle probe needs BOS + 2 × 17 + a haystack of 10 = 45 tokens: skipped, and said so
    assert "needle" not in result.inputs and result.heads[0].scores["retrieval"] is None
    assert any(note.startswith("the needle probe was skipped") for note in result.notes)


def test_progress_counts_every_text_and_token(model):
    calls = []
    result = Heads(batch_size=1, probe=False).run(model, TEXTS, progress=lambda *args: calls.append(args))
    total = result.inputs["n_tokens"]
    assert len(calls) == len(TEXTS)  # one call per batch
    assert calls[-1] == (len(TEXTS), total, 1.0)
    assert [c[1] for c in calls] == sorted(c[1] for c in calls)
