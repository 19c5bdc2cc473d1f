"""The role rules (scores.roles, thresholds from the catalog) on scores with known answers, and on the scores of
hand-built maps of each kind."""

from __future__ import annotations

import pytest
import torch

from attnscope.errors import AttnscopeError
from attnscope.scores import rows
from attnscope.scores.catalog import DEFAULT_THRESHOLDS
from attnscope.scores.kinds import DECODER, ENCODER
from attnscope.scores.roles import Role, classify, parse_thresholds, sink_rate
from tests.support import band_map, first_token_map, identity_map, previous_token_map, uniform_map

BASE = {
    "previous_token": 0.1,
    "first_token": 0.1,
    "self": 0.1,
    "local": 0.3,
    "local_lift": 0.1,
    "entropy": 1.0,
    "entropy_normalized": 0.5,
    "confidence": 0.4,
    "local_uniform": 0.3,
    "next_token": None,  # a decoder's scores: no next/last-token
    "last_token": None,
    "induction": 0.05,
    "duplicate_token": 0.05,
    "retrieval": 0.02,
}
# an encoder's scores: next/last-token measured, the probes' not
ENCODER_BASE = {
    **BASE, "next_token": 0.1, "last_token": 0.1, "induction": None, "duplicate_token": None, "retrieval": None,
}  # fmt: skip


def with_scores(**changes):
    return {**BASE, **changes}


def _encoder_map(n: int, target) -> torch.Tensor:
    """(1, 1, n, n): row i puts all its weight on key target(i), every key visible."""
    return torch.tensor([[1.0 if j == target(i) else 0.0 for j in range(n)] for i in range(n)])[None, None]


def _role_of(kind, attn, window=3) -> Role:
    n = attn.shape[-1]
    means = rows.head_scores(kind, attn, torch.tensor([n]), window)
    scores = {name: float(value[0]) for name, value in means.items()}
    return classify(scores)


@pytest.mark.parametrize(
    "kind, attn, expected",
    [
        (DECODER, previous_token_map(16), "previous-token"),
        (DECODER, first_token_map(16), "first-token"),
        (DECODER, identity_map(16), "self"),
        (DECODER, uniform_map(16), "broad"),
        (DECODER, band_map(16, 3), "local"),
        (ENCODER, _encoder_map(16, lambda i: max(i - 1, 0)), "previous-token"),
        (ENCODER, _encoder_map(16, lambda i: min(i + 1, 15)), "next-token"),
        (ENCODER, _encoder_map(16, lambda i: 0), "first-token"),
        (ENCODER, _encoder_map(16, lambda i: 15), "last-token"),
        (ENCODER, _encoder_map(16, lambda i: i), "self"),
        (ENCODER, torch.full((1, 1, 16, 16), 1 / 16), "broad"),
    ],
    ids=lambda value: value if isinstance(value, str) else getattr(value, "name", ""),
)
def test_hand_built_maps_get_their_role(kind, attn, expected):
    assert _role_of(kind, attn).role == expected


def test_previous_token_wins_over_local():
    """A previous-token head also has most of its mass in the local window; it must be called previous-token."""
    role = classify(with_scores(previous_token=0.8, local=0.85, local_lift=0.8))
    assert (role.role, role.metric, role.score) == ("previous-token", "previous_token", 0.8)


def test_highest_pattern_score_wins():
    lowered = {**DEFAULT_THRESHOLDS, "previous-token": 0.3, "self": 0.3}
    assert classify(with_scores(previous_token=0.35, self=0.45), lowered).role == "self"
    assert classify(with_scores(previous_token=0.45, self=0.35), lowered).role == "previous-token"
    assert classify(with_scores(induction=0.7, duplicate_token=0.9)).role == "duplicate-token"


def test_a_sink_gives_way_to_any_other_passing_pattern():
    """GPT-2's induction heads park most of their attention on the first token of ordinary text (nothing to copy)
    and score high on the probe: they are induction heads. Only a sink alone makes a sink role."""
    role = classify(with_scores(first_token=0.8, induction=0.6))
    assert (role.role, role.metric, role.score) == ("induction", "induction", 0.6)
    lowered = {**DEFAULT_THRESHOLDS, "previous-token": 0.3}
    assert classify(with_scores(previous_token=0.35, first_token=0.6), lowered).role == "previous-token"
    assert classify(with_scores(first_token=0.8, induction=0.3)).role == "first-token"
    encoder = {**ENCODER_BASE, "next_token": 0.55, "last_token": 0.4, "first_token": 0.05}
    assert classify(encoder, {**DEFAULT_THRESHOLDS, "last-token": 0.3}).role == "next-token"


def test_uniform_head_on_short_text_is_broad_not_local():
    """On a 6-token text uniform attention puts most of its mass in a window of 3: raw local is high, lift is 0."""
    attn = uniform_map(6)
    scores = {name: float(v[0]) for name, v in rows.head_scores(DECODER, attn, torch.tensor([6])).items()}
    assert scores["local"] > 0.5  # a raw-mass rule would call it local
    assert classify(scores).role == "broad"


def test_mixed_reports_the_closest_rule():
    role = classify(with_scores(previous_token=0.45))
    assert role.role == "mixed"
    assert (role.metric, role.score) == ("previous_token", 0.45)  # 0.45 / 0.5 is the closest to its threshold
    # entropy_normalized 0.7 of 0.8 (0.875) is closer than previous_token 0.4 of 0.5 (0.8)
    role = classify(with_scores(previous_token=0.4, entropy_normalized=0.7))
    assert (role.role, role.metric, role.score) == ("mixed", "entropy_normalized", 0.7)


def test_thresholds_are_adjustable():
    scores = with_scores(previous_token=0.55)
    assert classify(scores).role == "previous-token"
    raised = parse_thresholds(["previous-token=0.6"])
    assert raised["previous-token"] == 0.6 and raised["self"] == DEFAULT_THRESHOLDS["self"]
    assert classify(scores, raised).role == "mixed"
    assert parse_thresholds(None) == DEFAULT_THRESHOLDS


@pytest.mark.parametrize(
    "item, role",
    [
        ("prev=0.6", "previous-token"),
        ("induc=0.7", "induction"),
        ("previous_token=0.6", "previous-token"),
        ("retr=0.3", "retrieval"),
    ],
)
def test_a_role_may_be_named_by_its_short_label(item, role):
    thresholds = parse_thresholds([item])
    assert thresholds[role] == float(item.split("=")[1])
    assert {name: value for name, value in thresholds.items() if name != role} == {
        name: value for name, value in DEFAULT_THRESHOLDS.items() if name != role
    }


@pytest.mark.parametrize(
    "item, message",
    [
        ("previous-token", "expected ROLE=VALUE"),
        ("nonsense=0.5", "expected ROLE=VALUE"),
        ("mixed=0.5", "expected ROLE=VALUE"),  # the fallback has no threshold
        ("self=abc", "'abc' is not a number"),
        ("broad=1.5", "between 0 and 1"),
        ("broad=-0.1", "between 0 and 1"),
    ],
)
def test_bad_thresholds_are_user_errors(item, message):
    with pytest.raises(AttnscopeError, match=message) as raised:
        parse_thresholds([item])
    assert str(raised.value).startswith(f"threshold '{item}': ")
    assert "--threshold" not in str(raised.value)  # library messages name no CLI flag


def test_previous_token_head_and_induction_head_are_told_apart():
    previous = classify(with_scores(previous_token=0.9, induction=0.05))
    induction = classify(with_scores(previous_token=0.1, induction=0.7, first_token=0.3))
    assert previous.role == "previous-token" and induction.role == "induction"
    assert classify(with_scores(duplicate_token=0.6)).role == "duplicate-token"


def test_without_the_probe_its_rules_are_skipped():
    scores = with_scores(induction=None, duplicate_token=None, previous_token=0.45)
    role = classify(scores)
    assert role.role == "mixed" and role.metric == "previous_token"


def test_planted_encoder_roles_are_found():
    """The encoder's pattern roles, on scores with next_token / last_token and None probe scores."""
    base = {**ENCODER_BASE, "entropy_normalized": 0.3}
    assert classify({**base, "next_token": 0.7, "last_token": 0.1}).role == "next-token"
    assert classify({**base, "next_token": 0.1, "last_token": 0.6}) == Role("last-token", "last_token", 0.6)
    # a decoder's scores (next/last None, probe low) are none of them
    decoder = {**base, "next_token": None, "last_token": None, "induction": 0.1, "duplicate_token": 0.1}
    assert classify(decoder).role == "mixed"
    # a decoder with a high (but unmeasured for it) next_token cannot be a next-token head: None is skipped
    assert classify({**decoder, "next_token": None, "previous_token": 0.9}).role == "previous-token"
    assert parse_thresholds(["last-token=0.7"])["last-token"] == 0.7
    assert classify({**base, "last_token": 0.6}, parse_thresholds(["last-token=0.7"])).role == "mixed"


# ------------------------------------------------------------------------------------ retrieval (Wu et al. 2024)


def test_a_head_that_retrieves_the_needle_is_a_retrieval_head():
    """Wu et al.'s threshold: a retrieval score of 0.1 makes a retrieval head, below it not (the probe's 48 rows
    never give exactly 0.1, so >= is their > there)."""
    assert classify(with_scores(retrieval=0.15)) == Role("retrieval", "retrieval", 0.15)
    assert classify(with_scores(retrieval=0.1)).role == "retrieval"
    assert classify(with_scores(retrieval=0.09)).role == "mixed"
    assert classify(with_scores(retrieval=0.15), parse_thresholds(["retrieval=0.2"])).role == "mixed"


def test_retrieval_comes_after_the_patterns_and_before_the_sinks_and_shapes():
    """An induction head that also retrieves the needle is named by the stronger claim (most of its attention on
    the copied token, 0.5, against a tenth of argmax hits); a retrieval head that sinks on text, or looks local or
    broad there, is named by what it does when it copies."""
    assert classify(with_scores(induction=0.6, retrieval=0.9)).role == "induction"
    assert classify(with_scores(previous_token=0.6, retrieval=0.9)).role == "previous-token"
    assert classify(with_scores(first_token=0.8, retrieval=0.2)) == Role("retrieval", "retrieval", 0.2)
    assert classify(with_scores(local_lift=0.9, retrieval=0.2)).role == "retrieval"
    assert classify(with_scores(entropy_normalized=0.95, retrieval=0.2)).role == "retrieval"
    # with the needle probe off (or for an encoder) its rule is skipped
    assert classify(with_scores(first_token=0.8, retrieval=None)).role == "first-token"


def test_mixed_may_be_closest_to_retrieval():
    role = classify(with_scores(retrieval=0.08, previous_token=0.3))  # 0.8 of 0.1 against 0.6 of 0.5
    assert (role.role, role.metric, role.score) == ("mixed", "retrieval", 0.08)


# --------------------------------------------------------------------------------- sink rate (Gu et al. 2024)


def test_the_sink_rate_counts_heads_whose_first_token_attention_exceeds_epsilon():
    """ε = 0.3: a head at 0.31 sinks, one at 0.29 does not, and one at exactly 0.3 does not (Gu et al.: > ε)."""
    planted = [[0.29, 0.31, 0.9, 0.0], [0.3, 0.31, 0.31, 0.31]]  # layer 0: 2 of 4; layer 1: 3 of 4
    rate = sink_rate(planted)
    assert rate.epsilon == 0.3
    assert rate.layers == (0.5, 0.75)
    assert rate.model == 5 / 8
    assert sink_rate(planted, epsilon=0.1).layers == (0.75, 1.0)
    assert sink_rate([[0.0] * 3]).model == 0.0 and sink_rate([[1.0] * 3]).model == 1.0
