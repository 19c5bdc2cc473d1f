"""The role rules on scores with known answers, and on the scores of hand-built maps."""

import pytest
import torch

from attnscope import metrics, roles
from attnscope.errors import AttnscopeError
from tests.test_metrics import band_map, first_token_map, identity_map, previous_token_map, uniform_map

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
    "induction": 0.05,
    "duplicate_token": 0.05,
}


def with_scores(**changes):
    return {**BASE, **changes}


def role_of(attn, window=3):
    n = attn.shape[-1]
    scores = {name: float(value[0]) for name, value in metrics.head_scores(attn, torch.tensor([n]), window).items()}
    return roles.classify(scores)


@pytest.mark.parametrize(
    "attn, expected",
    [
        (previous_token_map(16), "previous-token"),
        (first_token_map(16), "first-token"),
        (identity_map(16), "self"),
        (uniform_map(16), "broad"),
        (band_map(16, 3), "local"),
    ],
)
def test_hand_built_maps_get_their_role(attn, expected):
    assert role_of(attn).role == expected


def test_previous_token_wins_over_local():
    """A previous-token head also has most of its mass in the local window; it must be called previous-token."""
    role = roles.classify(with_scores(previous_token=0.8, local=0.85, local_lift=0.8))
    assert (role.role, role.metric, role.score) == ("previous-token", "previous_token", 0.8)


def test_highest_pattern_score_wins():
    lowered = {**roles.DEFAULT_THRESHOLDS, "previous-token": 0.3, "self": 0.3}
    assert roles.classify(with_scores(previous_token=0.35, self=0.45), lowered).role == "self"
    assert roles.classify(with_scores(induction=0.7, duplicate_token=0.9)).role == "duplicate-token"


def test_a_sink_gives_way_to_any_other_passing_pattern():
    """GPT-2's induction heads park most of their attention on the first token of ordinary text (nothing to copy)
    and score high on the probe: they are induction heads. Only a sink alone makes a sink role."""
    role = roles.classify(with_scores(first_token=0.8, induction=0.6))
    assert (role.role, role.metric, role.score) == ("induction", "induction", 0.6)
    lowered = {**roles.DEFAULT_THRESHOLDS, "previous-token": 0.3}
    assert roles.classify(with_scores(previous_token=0.35, first_token=0.6), lowered).role == "previous-token"
    assert roles.classify(with_scores(first_token=0.8, induction=0.3)).role == "first-token"
    encoder = with_scores(next_token=0.55, last_token=0.4, first_token=0.05)
    assert roles.classify(encoder, {**roles.DEFAULT_THRESHOLDS, "last-token": 0.3}).role == "next-token"


def test_uniform_head_on_short_text_is_broad_not_local():
    """On a 6-token text uniform attention puts most of its mass in a window of 3: raw local is high, lift is 0."""
    attn = uniform_map(6)
    n = attn.shape[-1]
    scores = {name: float(v[0]) for name, v in metrics.head_scores(attn, torch.tensor([n])).items()}
    assert scores["local"] > 0.5  # a raw-mass rule would call it local
    assert roles.classify(scores).role == "broad"


def test_mixed_reports_the_closest_rule():
    role = roles.classify(with_scores(previous_token=0.45))
    assert role.role == "mixed"
    assert (role.metric, role.score) == ("previous_token", 0.45)  # 0.45 / 0.5 is the closest to its threshold


def test_thresholds_are_adjustable():
    scores = with_scores(previous_token=0.55)
    assert roles.classify(scores).role == "previous-token"
    raised = roles.parse_thresholds(["previous-token=0.6"])
    assert raised["previous-token"] == 0.6 and raised["self"] == roles.DEFAULT_THRESHOLDS["self"]
    assert roles.classify(scores, raised).role == "mixed"


@pytest.mark.parametrize("item", ["previous-token", "nonsense=0.5", "self=abc", "broad=1.5"])
def test_bad_thresholds_are_user_errors(item):
    with pytest.raises(AttnscopeError):
        roles.parse_thresholds([item])


def test_previous_token_head_and_induction_head_are_told_apart():
    previous = roles.classify(with_scores(previous_token=0.9, induction=0.05))
    induction = roles.classify(with_scores(previous_token=0.1, induction=0.7, first_token=0.3))
    assert previous.role == "previous-token" and induction.role == "induction"
    assert roles.classify(with_scores(duplicate_token=0.6)).role == "duplicate-token"


def test_without_the_probe_its_rules_are_skipped():
    scores = with_scores(induction=None, duplicate_token=None, previous_token=0.45)
    role = roles.classify(scores)
    assert role.role == "mixed" and role.metric == "previous_token"
