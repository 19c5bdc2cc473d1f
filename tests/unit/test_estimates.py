"""What a number is, said where it is shown: circuit's gradient changes are estimates (the JSON, the CSV rows, the
terminal, the pictures say so) and a `without` outside the score's range is clipped and marked; the composition
pictures are centred on the random heads' mean, the same half-width in all three; colour bars name their quantity.
Results are made by hand: the numbers are planted, the rules checked against them."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope.analyses.circuit import CircuitResult
from attnscope.scores.catalog import RANGES, SCORE
from attnscope.scores.composition import Composition


def _result(method: str, with_values, changes, scores, composition=None, baseline=None) -> CircuitResult:
    n, L, H = changes.shape
    heads = [
        {"label": f"{layer}.{head}", "layer": layer, "head": head, "role": "mixed", "explained": layer > 0,
         "score": "induction", "value": 0.5, "copying": None, "direct_effect": None}
        for layer in range(L) for head in range(H)
    ]  # fmt: skip
    explained = [(1, head, scores[head]) for head in range(n)]
    return CircuitResult(
        {"name": "hand", "n_layer": L, "n_head": H}, {"n_texts": 1, "n_tokens": 5},
        {"top": None, "method": method, "steps": 0}, explained, np.asarray(with_values, dtype=float), changes, heads,
        composition, baseline,
    )  # fmt: skip


def _planted(method: str) -> CircuitResult:
    """Three explained heads, each with a share, a lift or an entropy whose estimate leaves its range once."""
    changes = np.zeros((3, 2, 3))
    changes[0, 0] = [0.125, -0.95, -0.1]  # induction 0.914: 1.039 (above 1), -0.036 (below 0), 0.814
    changes[1, 0] = [0.3, -2.0, 0.0]  # local lift 0.8: 1.1 (above 1); -1.2 is a lift (no floor)
    changes[2, 0] = [-1.5, 0.5, 0.0]  # entropy 1.2 nats: -0.3 (below 0); 1.7 (no ceiling)
    return _result(method, [0.914, 0.8, 1.2], changes, ["induction", "local_lift", "entropy"])


def test_the_gradients_without_is_clipped_to_the_scores_range_and_marked():
    records = _planted("gradient").dependencies()
    assert all(record["estimate"] for record in records)
    for record in records:
        low, high = RANGES[SCORE[record["score"]].unit]
        raw = record["with"] + record["change"]
        assert record["without"] == pytest.approx(min(high, max(low, raw)))
        assert record["clipped"] == (not low <= raw <= high)
    clipped = {(r["label"], r["on"]): r["without"] for r in records if r["clipped"]}
    assert clipped == {("1.0", "0.0"): 1.0, ("1.0", "0.1"): 0.0, ("1.1", "0.0"): 1.0, ("1.2", "0.0"): 0.0}
    assert RANGES[SCORE["local_lift"].unit] == (float("-inf"), 1.0)  # a lift has no floor: -1.2 is kept
    assert next(r for r in records if (r["label"], r["on"]) == ("1.1", "0.1"))["without"] == pytest.approx(-1.2)


def test_a_removals_scores_are_measured_never_clipped():
    """The same numbers from the removal method: no record is an estimate, and `without` is with + change."""
    for record in _planted("removal").dependencies():
        assert not record["estimate"] and not record["clipped"]
        assert record["without"] == pytest.approx(record["with"] + record["change"])


def test_the_terminal_json_and_pictures_say_the_gradient_estimates():
    from rich.console import Console

    from attnscope.output.views import view_of

    result = _planted("gradient")
    view = view_of(result)
    assert view.document()["estimate"] is True and view_of(_planted("removal")).document()["estimate"] is False
    assert {row["estimate"] for row in view.records()} == {True}
    console = Console(width=200, record=True)
    for item in view.terminal([]):
        console.print(item)
    text = console.export_text()
    assert "ESTIMATES of each earlier head's removal" in text and "confirm with --method removal" in text
    assert "est. change" in text and "1.000 (clipped)" in text and "1.039" not in text
    assert "clipped: with + the estimated change leaves the range" in text
    removal = Console(width=200, record=True)
    for item in view_of(_planted("removal")).terminal([]):
        removal.print(item)
    assert "ESTIMATE" not in removal.export_text() and "clipped" not in removal.export_text()
    assert "explained by gradient, estimates to confirm" in repr(result)
    figures = view.figures()
    for name in ("circuit", "dependencies"):
        texts = " ".join(text.get_text() for text in figures[name].texts)
        assert "(estimated)" in texts and "ESTIMATED by attribution patching" in texts, name


def _colour_bar_label(figure) -> str:
    """The label of a matrix's colour bar (the axes after the matrix's), its lines joined."""
    return figure.axes[1].get_ylabel().replace("\n", " ")


def test_the_composition_pictures_are_centred_on_the_random_baseline_with_one_half_width():
    """Scores 0.07-0.12 against random heads' 0.088 ± 0.003: each picture's colours run from mean - w to mean + w
    (white at the mean), w the same for Q, K and V: the largest distance of any of them from its mean (here K's
    0.121), at least 5 standard deviations; the baseline is in the colour bar's label."""
    from attnscope.output.circuit import composition_matrix

    L, H = 2, 2
    kinds = {}
    rng = np.random.default_rng(0)
    for kind, top in (("q", 0.095), ("k", 0.121), ("v", 0.09)):
        values = np.full((L, H, L, H), np.nan)
        values[0, :, 1, :] = rng.uniform(0.07, top, size=(H, H))
        values[0, 0, 1, 0] = top
        kinds[kind] = values
    baseline = {"q": {"mean": 0.088, "std": 0.0024}, "k": {"mean": 0.0885, "std": 0.0026},
                "v": {"mean": 0.0883, "std": 0.0025}}  # fmt: skip
    result = _result("removal", [0.5, 0.5], np.zeros((2, L, H)), ["induction"] * 2, Composition(**kinds), baseline)
    half = max(np.nanmax(np.abs(kinds[k] - baseline[k]["mean"])) for k in kinds)
    assert half == pytest.approx(0.121 - 0.0885)
    for kind in ("q", "k", "v"):
        figure = composition_matrix(result, kind)
        norm = figure.axes[0].images[0].norm
        mean = baseline[kind]["mean"]
        assert (norm.vmin, norm.vmax) == (pytest.approx(mean - half), pytest.approx(mean + half))
        assert norm(mean) == pytest.approx(0.5)  # white, the middle of the diverging scale, at the random mean
        label = _colour_bar_label(figure)
        assert f"{mean:.3f} ± {baseline[kind]['std']:.3f}" in label and "random heads" in label
    # all at the random level: the half-width is 5 standard deviations, so none of it shows as strong
    flat = {kind: np.where(np.isnan(values), np.nan, baseline[kind]["mean"]) for kind, values in kinds.items()}
    quiet = _result("removal", [0.5, 0.5], np.zeros((2, L, H)), ["induction"] * 2, Composition(**flat), baseline)
    norm = composition_matrix(quiet, "v").axes[0].images[0].norm
    assert norm.vmax - baseline["v"]["mean"] == pytest.approx(5 * 0.0026)


def test_every_score_colour_bar_names_its_score_and_unit():
    from attnscope.output.figures import score_colour_label

    for score in SCORE.values():
        label = score_colour_label(score)
        assert score.label in label, label
    assert score_colour_label(SCORE["entropy"]) == "entropy (nats)"
    assert score_colour_label(SCORE["induction"]) == "induction (fraction of the row's attention)"


def test_the_dependency_pictures_name_the_score_and_its_unit():
    """One score: named with its unit; several: each row names its score, the colour bar each score's unit; with
    the arrows, B and A are the arrow's end and start (no bare `head A`)."""
    from attnscope.output.circuit import change_label, dependency_matrix

    one = _result("removal", [0.5, 0.5], np.zeros((2, 2, 2)), ["induction", "induction"])
    assert change_label(one) == "change of induction, B (row) without A (column); share of attention"
    assert "(arrow A → B)" in change_label(one, arrows=True)
    several = _planted("removal")
    label = change_label(several)
    assert "induc: share of attention" in label and "lift: lift, at most 1" in label and "H: nats" in label
    figure = dependency_matrix(several)
    rows = [tick.get_text() for tick in figure.axes[0].get_yticklabels()]
    assert rows == ["1.0 induc", "1.1 lift", "1.2 H"]
    assert "its units" not in _colour_bar_label(figure)
