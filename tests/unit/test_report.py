"""Which heads the report shows (analyses.report): the best head of each role, and the top heads per role's score."""

from __future__ import annotations

import pytest

from attnscope.analyses.report import characteristic_heads, top_heads_per_role
from attnscope.analyses.scoring import HeadRecord
from attnscope.scores.catalog import SCORE_NAMES
from attnscope.scores.roles import Role
from tests.support import DEPENDENCIES, circuit_stand_in, given_models


def _record(layer, head, role, score, **scores) -> HeadRecord:
    values = dict.fromkeys(SCORE_NAMES, None)  # a decoder without the probe: next/last and the probe's unmeasured
    values.update(dict.fromkeys(("previous_token", "first_token", "self", "local_lift", "entropy_normalized"), 0.0))
    values.update(scores)
    return HeadRecord(layer, head, values, Role(role, "x", score))


HEADS = [
    _record(0, 0, "previous-token", 0.6, previous_token=0.6),
    _record(0, 1, "previous-token", 0.9, previous_token=0.9),
    _record(1, 0, "broad", 0.85, entropy_normalized=0.85),
    _record(1, 1, "mixed", 0.3, previous_token=0.3),
]


def test_characteristic_heads_are_the_best_of_each_role_in_role_order():
    assert [r.label for r in characteristic_heads(HEADS)] == ["0.1", "1.0"]  # best per role, mixed left out
    tied = [_record(0, 0, "self", 0.7, self=0.7), _record(1, 2, "self", 0.7, self=0.7)]
    assert [r.label for r in characteristic_heads(tied)] == ["0.0"]  # a tie goes to the first in layer.head order
    # role order of the catalog, not the order of the heads
    shuffled = [HEADS[2], _record(2, 0, "self", 0.8, self=0.8), HEADS[1]]
    assert [r.role.role for r in characteristic_heads(shuffled)] == ["previous-token", "self", "broad"]


def test_top_heads_per_role_rank_every_head_by_the_roles_score():
    top = top_heads_per_role(HEADS, k=2)
    assert "induction" not in top and "next-token" not in top  # not measured
    assert "mixed" not in top  # no score of its own
    assert [r.label for r in top["previous-token"]] == ["0.1", "0.0"]
    assert [r.label for r in top["broad"]] == ["1.0", "0.0"]  # ties (0.0) in layer.head order
    assert [r.label for r in top["self"]] == ["0.0", "0.1"]  # whatever role the heads were given
    assert set(top) == {"previous-token", "self", "first-token", "local", "broad"}
    assert top_heads_per_role([]) == {}


# ------------------------------------------------------------------------------------------ several models


# ------------------------------------------------------------------------------------------------ --circuit
def test_circuit_records_are_the_circuit_analysis_records_top_k_per_head(monkeypatch):
    from attnscope.analyses.report import CIRCUIT_TOP, Report, circuit_records

    built = circuit_stand_in(monkeypatch)
    assert circuit_records(None, [], Report(batch_size=3)) == DEPENDENCIES
    assert built[0]["top"] == CIRCUIT_TOP and built[0]["batch_size"] == 3
    assert Report(circuit=True).circuit  # the settings find the analysis


def test_circuit_explains_one_model(monkeypatch):
    from attnscope.analyses.report import Report
    from attnscope.errors import AttnscopeError

    circuit_stand_in(monkeypatch)
    with pytest.raises(AttnscopeError, match=r"^circuit \(--circuit\) explains one model's heads"):
        Report(circuit=True).run_models(given_models(("a", None), ("b", None)), [])
