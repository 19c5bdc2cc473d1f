"""Head roles from per-head scores, by documented thresholds (pure Python, no torch).

Rules, in order:
1. Pattern roles: `previous-token` (previous_token >= 0.5), `self` (self >= 0.5), `first-token`
   (first_token >= 0.5), for encoders `next-token` (next_token >= 0.5) and `last-token` (last_token >= 0.5, the
   [SEP] sink), and from the repeated-random-token probe (decoders) `induction` (induction >= 0.5) and
   `duplicate-token` (duplicate_token >= 0.5). A head passing one of these is that role even if it also looks
   local; when several pass, the highest score wins, except that the sinks (first-token, last-token) give way to
   any other pattern that passes: parking attention on the first token is what a head does when it has nothing
   to do (Xiao et al. 2023), so an induction head that sinks on text with nothing to copy, or a previous-token
   head under a lowered threshold, is named by what it does when it acts. A previous-token head attends to i-1 and an induction head to
   i-(T-1) on the probe, so the two never share a high score. A rule whose score was not measured (None: the probe's
   with `--no-probe` or for an encoder, next/last-token for a decoder) is skipped. 0.5 means the head puts most of its weight on one position: the literature calls heads
   positional or [CLS]/[SEP] heads at 0.5-0.6 (Clark et al. 2019, Voita et al. 2019); we take the lower end so
   the role map shows every head that is *mostly* one thing, and print the score beside the role.
2. `local` (local_lift >= 0.5): at least half of the attention uniform would put outside the window moved into it.
   Judged by the lift over uniform, not the raw local mass, so a uniform head on a short text is not "local".
3. `broad` (entropy_normalized >= 0.8): near-uniform attention; 0.8 matches Clark et al.'s "broad" heads
   (> 3.8 nats on ~128-token inputs, and 3.8 / ln 128 ≈ 0.78).
4. `mixed`: nothing passes; the score closest to its threshold (as a fraction of it) is shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from attnscope.errors import AttnscopeError

# role -> the score that decides it
PATTERN_RULES = {
    "previous-token": "previous_token",
    "self": "self",
    "first-token": "first_token",
    "next-token": "next_token",
    "last-token": "last_token",
    "induction": "induction",
    "duplicate-token": "duplicate_token",
}
SHAPE_RULES = {"local": "local_lift", "broad": "entropy_normalized"}
RULES = {**PATTERN_RULES, **SHAPE_RULES}
ROLES = (*PATTERN_RULES, *SHAPE_RULES, "mixed")
ENCODER_ROLES = ("next-token", "last-token")  # scores measured for encoders only
PROBE_ROLES = ("induction", "duplicate-token")  # from the probe, which runs for decoders only
SINK_ROLES = ("first-token", "last-token")  # a head's resting place: any other passing pattern comes first
# score -> its short name, in the order tables show them (the terminal's columns, the role map's `mix` cells)
SHORT_NAMES = {
    "previous_token": "prev",
    "first_token": "first",
    "self": "self",
    "next_token": "next",
    "last_token": "last",
    "induction": "induc",
    "duplicate_token": "dup",
    "local_lift": "lift",
    "entropy_normalized": "Hnorm",
    "confidence": "conf",
}


def roles_for(encoder: bool) -> tuple[str, ...]:
    """The roles a decoder's or an encoder's head can be given, in ROLES order (for legends)."""
    left_out = PROBE_ROLES if encoder else ENCODER_ROLES
    return tuple(role for role in ROLES if role not in left_out)
DEFAULT_THRESHOLDS = {
    "previous-token": 0.5,
    "self": 0.5,
    "first-token": 0.5,
    "next-token": 0.5,
    "last-token": 0.5,
    "induction": 0.5,
    "duplicate-token": 0.5,
    "local": 0.5,
    "broad": 0.8,
}


@dataclass(frozen=True)
class Role:
    role: str
    metric: str  # the score that decided the role
    score: float


def parse_thresholds(items: list[str] | None) -> dict[str, float]:
    """`ROLE=VALUE` overrides (e.g. `previous-token=0.6`) on top of DEFAULT_THRESHOLDS."""
    thresholds = dict(DEFAULT_THRESHOLDS)
    for item in items or []:
        role, sep, value = item.partition("=")
        role = role.strip().replace("_", "-")
        if not sep or role not in thresholds:
            raise AttnscopeError(
                f"--threshold '{item}': expected ROLE=VALUE with ROLE one of {', '.join(DEFAULT_THRESHOLDS)}"
            )
        try:
            number = float(value)
        except ValueError:
            raise AttnscopeError(f"--threshold '{item}': '{value}' is not a number") from None
        if not 0.0 <= number <= 1.0:
            raise AttnscopeError(f"--threshold '{item}': thresholds lie between 0 and 1")
        thresholds[role] = number
    return thresholds


def classify(scores: Mapping[str, float | None], thresholds: Mapping[str, float] = DEFAULT_THRESHOLDS) -> Role:
    """The role of one head from its scores (see the module docstring for the rules); None scores are skipped."""
    known = {role: metric for role, metric in RULES.items() if scores.get(metric) is not None}
    passing = [
        (scores[metric], role, metric)
        for role, metric in PATTERN_RULES.items()
        if role in known and scores[metric] >= thresholds[role]
    ]
    if passing:
        score, role, metric = max(passing, key=lambda rule: (rule[1] not in SINK_ROLES, rule[0]))
        return Role(role, metric, score)
    for role, metric in SHAPE_RULES.items():
        if scores[metric] >= thresholds[role]:
            return Role(role, metric, scores[metric])
    closest = max(known.items(), key=lambda rule: scores[rule[1]] / max(thresholds[rule[0]], 1e-12))
    return Role("mixed", closest[1], scores[closest[1]])
