"""Head roles from per-head scores, by the thresholds of the catalog (pure Python, no torch); and the model's sink
rate.

Rules, in order (`scores.catalog.ROLES` gives each role its deciding score and threshold):
1. Pattern roles: previous-token, self, next-token (encoders), induction and duplicate-token (the probe, decoders):
   the deciding score >= its threshold (0.5). A head passing one of these is that role even if it also looks local;
   when several pass, the highest score wins. A previous-token head attends to i-1 and an induction head to i-(T-1)
   on the probe, so the two never share a high score. A rule whose score was not measured (None: the probe's with
   --no-probe or for an encoder, next/last-token for a decoder) is skipped. 0.5 means the head puts most of its
   weight on one position: the literature calls heads positional or [CLS]/[SEP] heads at 0.5-0.6 (Clark et al.
   2019, Voita et al. 2019); we take the lower end so the role map shows every head that is *mostly* one thing, and
   print the score beside the role.
2. `retrieval` (retrieval >= 0.1, the needle probe, decoders): Wu et al. 2024's retrieval head, whose strongest key
   is the needle token being copied at more than 10 % of the needle's tokens. After the patterns: on a teacher-forced
   copy the token being copied is the one after the earlier occurrence of the current token, exactly where an
   induction head looks, so most heads that pass it also pass induction; a share of argmax hits over 0.1 is a far
   weaker claim than most of the attention on one position, so a head that passes both is named by the stronger
   (its retrieval score stays in its record), and the role shows what the needle probe adds: heads that copy from a
   long context without being induction heads on the repeated-token probe.
3. Sinks: first-token, and last-token (encoders): the deciding score >= its threshold (0.5), the highest winning,
   only when no rule above passes: parking attention on the first token is what a head does when it has nothing to
   do (Xiao et al. 2023), so an induction or retrieval head that sinks on text with nothing to copy, or a
   previous-token head under a lowered threshold, is named by what it does when it acts.
4. `local` (local_lift >= 0.5): at least half of the attention uniform would put outside the window moved into it.
   Judged by the lift over uniform, not the raw local mass, so a uniform head on a short text is not "local".
5. `broad` (entropy_normalized >= 0.8): near-uniform attention; 0.8 matches Clark et al.'s "broad" heads
   (> 3.8 nats on ~128-token inputs, and 3.8 / ln 128 ≈ 0.78).
6. `mixed`: nothing passes; the score closest to its threshold (as a fraction of it) is shown.

The sink rate (Gu et al. 2024, "When Attention Sink Emerges in Language Models: An Empirical View", ICLR 2025, their
Sink_1^ε): the share of heads whose first_token score exceeds ε = catalog.SINK_EPSILON (0.3), over the model and over
each layer:

    sink_rate = (1 / (L·H)) Σ_l Σ_h 1[first_token(l, h) > ε]        sink_rate(l) = (1 / H) Σ_h 1[first_token(l, h) > ε]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from attnscope.errors import AttnscopeError
from attnscope.options import shown
from attnscope.scores.catalog import DEFAULT_THRESHOLDS, ROLES, SINK_EPSILON, role_named

# The rules' tiers, tried in this order (see the module docstring): the first tier where a role passes gives the
# role; in a tier of several, the highest score wins, except among the shapes, tried in the catalog's order.
TIERS = ("pattern", "copy", "sink", "shape")


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
    passing = [role for role in known if scores[role.score] >= thresholds[role.name]]
    for tier in TIERS:
        here = [role for role in passing if role.rule == tier]
        if here:
            best = here[0] if tier == "shape" else max(here, key=lambda role: scores[role.score])
            return Role(best.name, best.score, scores[best.score])
    closest = max(known, key=lambda role: scores[role.score] / max(thresholds[role.name], 1e-12))
    return Role("mixed", closest.score, scores[closest.score])


@dataclass(frozen=True)
class SinkRate:
    """The sink rate of a model (Gu et al. 2024): the share of its heads whose first_token exceeds `epsilon`,
    `model` over every head and `layers[l]` over layer l's."""

    epsilon: float
    model: float
    layers: tuple[float, ...]


def sink_rate(first_token: Sequence[Sequence[float]], epsilon: float = SINK_EPSILON) -> SinkRate:
    """The sink rate from every head's first_token score, `first_token[layer][head]` (see the module docstring);
    strictly above `epsilon`, as Gu et al. count."""
    sinks = [[value > epsilon for value in layer] for layer in first_token]
    heads = sum(len(layer) for layer in sinks)
    if heads == 0:
        raise ValueError("no head to count")
    return SinkRate(epsilon, sum(map(sum, sinks)) / heads, tuple(sum(layer) / len(layer) for layer in sinks))
