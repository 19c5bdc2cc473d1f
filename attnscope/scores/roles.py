"""Head roles from per-head scores, by the thresholds of the catalog (pure Python, no torch).

Rules, in order (`scores.catalog.ROLES` gives each role its deciding score and threshold):
1. Pattern roles: previous-token, self, first-token, next-token and last-token (encoders), induction and
   duplicate-token (the probe, decoders): the deciding score >= its threshold (0.5). A head passing one of these is
   that role even if it also looks local; when several pass, the highest score wins, except that the sinks
   (first-token, last-token) give way to any other pattern that passes: parking attention on the first token is
   what a head does when it has nothing to do (Xiao et al. 2023), so an induction head that sinks on text with
   nothing to copy, or a previous-token head under a lowered threshold, is named by what it does when it acts. A
   previous-token head attends to i-1 and an induction head to i-(T-1) on the probe, so the two never share a high
   score. A rule whose score was not measured (None: the probe's with --no-probe or for an encoder, next/last-token
   for a decoder) is skipped. 0.5 means the head puts most of its weight on one position: the literature calls
   heads positional or [CLS]/[SEP] heads at 0.5-0.6 (Clark et al. 2019, Voita et al. 2019); we take the lower end
   so the role map shows every head that is *mostly* one thing, and print the score beside the role.
2. `local` (local_lift >= 0.5): at least half of the attention uniform would put outside the window moved into it.
   Judged by the lift over uniform, not the raw local mass, so a uniform head on a short text is not "local".
3. `broad` (entropy_normalized >= 0.8): near-uniform attention; 0.8 matches Clark et al.'s "broad" heads
   (> 3.8 nats on ~128-token inputs, and 3.8 / ln 128 ≈ 0.78).
4. `mixed`: nothing passes; the score closest to its threshold (as a fraction of it) is shown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from attnscope.errors import AttnscopeError
from attnscope.options import shown
from attnscope.scores.catalog import DEFAULT_THRESHOLDS, ROLES, role_named

PATTERNS = tuple(role for role in ROLES if role.rule in ("pattern", "sink"))
SHAPES = tuple(role for role in ROLES if role.rule == "shape")


@dataclass(frozen=True)
class Role:
    """The role given to one head: its name, the score that decided it, and that score's value."""

    role: str
    metric: str
    score: float


def parse_thresholds(items: Mapping[str, float] | Sequence[str] | str | None) -> dict[str, float]:
    """Every role's threshold: the catalog's defaults with the overrides of `items`, either `ROLE=VALUE` strings (the
    CLI's, e.g. `previous-token=0.6`) or a mapping `{ROLE: VALUE}` (Python's); a role's short label works too."""
    if isinstance(items, Mapping):
        pairs = [(f"{name}={value}", str(name), value) for name, value in items.items()]
    elif items is not None and (isinstance(items, bytes) or not isinstance(items, (str, Iterable))):
        raise AttnscopeError(
            f"thresholds {shown(items)}: expected {{ROLE: VALUE}} or ROLE=VALUE strings, e.g. {{'previous-token': 0.6}}"
        )
    else:
        strings = [str(item) for item in ([items] if isinstance(items, str) else items or [])]
        pairs = [(item, *item.split("=", 1)) if "=" in item else (item, None, None) for item in strings]
    thresholds = dict(DEFAULT_THRESHOLDS)
    for item, name, value in pairs:
        role = None if name is None else role_named(name)
        if role is None or role.threshold is None:
            raise AttnscopeError(
                f"threshold {shown(item)}: expected ROLE=VALUE with ROLE one of {', '.join(DEFAULT_THRESHOLDS)}"
            )
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise AttnscopeError(f"threshold {shown(item)}: {shown(str(value))} is not a number") from None
        if not 0.0 <= number <= 1.0:
            raise AttnscopeError(f"threshold {shown(item)}: thresholds lie between 0 and 1")
        thresholds[role.name] = number
    return thresholds


def classify(scores: Mapping[str, float | None], thresholds: Mapping[str, float] = DEFAULT_THRESHOLDS) -> Role:
    """The role of one head from its scores (see the module docstring for the rules); None scores are skipped."""
    known = [role for role in ROLES if role.score is not None and scores.get(role.score) is not None]
    passing = [role for role in known if role in PATTERNS and scores[role.score] >= thresholds[role.name]]
    if passing:
        best = max(passing, key=lambda role: (role.rule != "sink", scores[role.score]))
        return Role(best.name, best.score, scores[best.score])
    for role in SHAPES:
        if role in known and scores[role.score] >= thresholds[role.name]:
            return Role(role.name, role.score, scores[role.score])
    closest = max(known, key=lambda role: scores[role.score] / max(thresholds[role.name], 1e-12))
    return Role("mixed", closest.score, scores[closest.score])
