"""The one table of scores and roles: every name, label, unit, threshold and description attnscope shows.

Every table, picture, CSV header, `--sort` alias and help text reads it, so a score or role is named the same way
everywhere. Pure Python: the CLI imports it for its help texts without loading torch.

A score is a per-head number (a mean over scored rows, see `scores.rows`); a role is what a head is called when
its deciding score passes the role's threshold (see `scores.roles` for the order the rules are tried in).
"""

from __future__ import annotations

from dataclasses import dataclass

DECODER = "decoder"  # causal attention: row i sees keys 0..i (GPT-2)
ENCODER = "encoder"  # bidirectional attention: every row sees every real key (BERT)
BOTH = frozenset({DECODER, ENCODER})

# Units a score is measured in; a unit also fixes how a score is drawn (see output.figures).
FRACTION = "fraction"  # a share of a row's attention, or a ratio in [0, 1]
NATS = "nats"
SIGNED = "signed"  # may be negative: a lift over a baseline
# The values a score of each unit can take (what a linear estimate of a score, circuit's gradient, may leave): a
# share in [0, 1]; an entropy from 0 up (at most ln of the keys a row sees); a lift at most 1 (all attention in the
# window), below 0 as far as attention avoids the window.
RANGES = {FRACTION: (0.0, 1.0), NATS: (0.0, float("inf")), SIGNED: (float("-inf"), 1.0)}

# Where a score comes from.
ROWS = "rows"  # the input texts, every scored row
DERIVED = "derived"  # computed from other scores' means
PROBE = "probe"  # the repeated-random-token probe (decoders)
NEEDLE = "needle"  # the needle-in-a-haystack probe (decoders)
PROBES = (PROBE, NEEDLE)  # the synthetic inputs run beside the texts, switched on and off together (--probe)

DEFAULT_WINDOW = 3  # the local window: the current token and the 3 before it (--window)
# The sink rate's ε (Gu et al. 2024, "When Attention Sink Emerges in Language Models: An Empirical View", ICLR 2025):
# a head is a sink head when its mean attention to the first token exceeds it; the share of such heads is the rate.
SINK_EPSILON = 0.3


@dataclass(frozen=True)
class Score:
    name: str  # the JSON/CSV key and the `--sort` name: previous_token
    label: str  # in words, for titles and legends: "previous-token attention"
    short: str  # a table header, also accepted by --sort: prev
    unit: str
    kinds: frozenset[str]  # the kinds of model that measure it
    source: str
    description: str  # one line, with the definition
    column: int | None = None  # position among the terminal table's score columns (None: JSON/CSV only)
    stands_for: str | None = None  # a column the table shows this score in place of, when sorted by it
    per_head: bool = True  # False: the same for every head (a property of the texts), so never drawn per head
    # False: a count of argmax hits, constant between its jumps, so its gradient is 0 wherever it has one and
    # attribution patching (circuit --method gradient) cannot estimate its change
    differentiable: bool = True


@dataclass(frozen=True)
class Role:
    name: str  # previous-token
    short: str  # a role-map cell: prev
    score: str | None  # the score that decides it (None: mixed, the fallback)
    threshold: float | None
    rule: str  # "pattern", "copy", "sink" (a pattern that gives way to any other), "shape" or "fallback"
    description: str
    colour: str  # "#RRGGBB", the same in the terminal, the pictures and the report (see PALETTE)

    @property
    def ink(self) -> str:
        """The text colour that reads on this role's colour: black on light colours, white on dark ones (by the
        relative luminance of WCAG 2, the threshold where black and white contrast equally)."""
        red, green, blue = (int(self.colour[k : k + 2], 16) / 255 for k in (1, 3, 5))
        linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (red, green, blue)]
        luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
        return "#000000" if luminance > 0.179 else "#ffffff"


# Role colours: the Okabe-Ito palette (Okabe & Ito 2008, "Color Universal Design"), which stays distinct under the
# common colour-vision deficiencies, one colour per role; the two sinks in black and dark grey (attention parked,
# not a pattern), mixed in light grey (nothing passed). A decoder's or an encoder's roles are never shown in two
# colours of the same hue. Okabe-Ito has eight colours and a decoder nine roles: retrieval takes a dark brown,
# chosen as the colour farthest from every decoder role's (CIELAB ΔE 1976 ≥ 32 to each, under normal vision and
# simulated protanopia, deuteranopia and tritanopia, Machado et al. 2009; the palette's own closest pair is 17
# apart), and near induction's vermillion in hue, as both copy from context.
PALETTE = {
    "previous-token": "#0072B2",  # blue
    "self": "#E69F00",  # orange
    "first-token": "#000000",  # black
    "next-token": "#56B4E9",  # sky blue
    "last-token": "#5F5F5F",  # dark grey
    "induction": "#D55E00",  # vermillion
    "duplicate-token": "#CC79A7",  # reddish purple
    "retrieval": "#663311",  # dark brown (not Okabe-Ito's: see above)
    "local": "#009E73",  # bluish green
    "broad": "#F0E442",  # yellow
    "mixed": "#D9D9D9",  # light grey
}


SCORES: tuple[Score, ...] = (
    Score(
        "previous_token",
        "previous-token attention",
        "prev",
        FRACTION,
        BOTH,
        ROWS,
        "mean A[i, i-1]: attention to the token just before",
        column=0,
    ),
    Score(
        "first_token",
        "first-token attention",
        "first",
        FRACTION,
        BOTH,
        ROWS,
        "mean A[i, 0]: attention to the first token (BOS or [CLS]), the attention sink",
        column=1,
    ),
    Score(
        "self", "self attention", "self", FRACTION, BOTH, ROWS, "mean A[i, i]: attention to the token itself", column=2
    ),
    Score(
        "local",
        "local attention",
        "local",
        FRACTION,
        BOTH,
        ROWS,
        "mean attention inside the local window (the token and the W before it; the first token excluded)",
        stands_for="local_lift",
    ),
    Score(
        "entropy",
        "entropy",
        "H",
        NATS,
        BOTH,
        ROWS,
        "mean -sum_j A[i, j] ln A[i, j] over a row, in nats",
        stands_for="entropy_normalized",
    ),
    Score(
        "entropy_normalized",
        "normalised entropy",
        "Hnorm",
        FRACTION,
        BOTH,
        ROWS,
        "mean row entropy / ln(visible keys): 1 = uniform over what the row sees",
        column=9,
    ),
    Score(
        "confidence",
        "confidence",
        "conf",
        FRACTION,
        BOTH,
        ROWS,
        "mean max_j A[i, j]: the weight of a row's strongest key (Voita et al. 2019)",
        column=10,
    ),
    Score(
        "local_uniform",
        "local attention if uniform",
        "unif",
        FRACTION,
        BOTH,
        DERIVED,
        "what `local` would be for uniform attention: window size / visible keys",
        stands_for="local_lift",
        per_head=False,
    ),
    Score(
        "local_lift",
        "local lift",
        "lift",
        SIGNED,
        BOTH,
        DERIVED,
        "(local - local_uniform) / (1 - local_uniform): 0 = uniform, 1 = all attention in the window",
        column=8,
    ),
    Score(
        "next_token",
        "next-token attention",
        "next",
        FRACTION,
        frozenset({ENCODER}),
        ROWS,
        "mean A[i, i+1]: attention to the token just after",
        column=3,
    ),
    Score(
        "last_token",
        "last-token attention",
        "last",
        FRACTION,
        frozenset({ENCODER}),
        ROWS,
        "mean A[i, length-1]: attention to the last token ([SEP]), an encoder's second sink",
        column=4,
    ),
    Score(
        "induction",
        "induction",
        "induc",
        FRACTION,
        frozenset({DECODER}),
        PROBE,
        "on the probe, mean A[i, i-(T-1)]: attention to the token after the earlier occurrence",
        column=5,
    ),
    Score(
        "duplicate_token",
        "duplicate-token attention",
        "dup",
        FRACTION,
        frozenset({DECODER}),
        PROBE,
        "on the probe, mean A[i, i-T]: attention to the earlier occurrence itself",
        column=6,
    ),
    Score(
        "retrieval",
        "retrieval",
        "retr",
        FRACTION,
        frozenset({DECODER}),
        NEEDLE,
        "on the needle probe, share of the needle's tokens t at which argmax_j A[i, j] is t's position in the needle, "
        "i the row before t in the copy (Wu et al. 2024); teacher-forced: where the head looks whether or not the "
        "model would copy",
        column=7,
        differentiable=False,
    ),
)

ROLES: tuple[Role, ...] = (
    Role(
        "previous-token",
        "prev",
        "previous_token",
        0.5,
        "pattern",
        "most attention on the token just before",
        PALETTE["previous-token"],
    ),
    Role("self", "self", "self", 0.5, "pattern", "most attention on the token itself", PALETTE["self"]),
    Role(
        "first-token",
        "first",
        "first_token",
        0.5,
        "sink",
        "most attention parked on the first token",
        PALETTE["first-token"],
    ),
    Role(
        "next-token",
        "next",
        "next_token",
        0.5,
        "pattern",
        "most attention on the token just after (encoders)",
        PALETTE["next-token"],
    ),
    Role(
        "last-token",
        "last",
        "last_token",
        0.5,
        "sink",
        "most attention parked on the last token (encoders)",
        PALETTE["last-token"],
    ),
    Role(
        "induction",
        "induc",
        "induction",
        0.5,
        "pattern",
        "copies the token after an earlier occurrence",
        PALETTE["induction"],
    ),
    Role(
        "duplicate-token",
        "dup",
        "duplicate_token",
        0.5,
        "pattern",
        "attends to an earlier occurrence of itself",
        PALETTE["duplicate-token"],
    ),
    Role(
        "retrieval",
        "retr",
        "retrieval",
        0.1,
        "copy",
        "copies the needle of a haystack: its strongest key is the token being copied (Wu et al. 2024)",
        PALETTE["retrieval"],
    ),
    Role("local", "local", "local_lift", 0.5, "shape", "attention stays near the token", PALETTE["local"]),
    Role(
        "broad",
        "broad",
        "entropy_normalized",
        0.8,
        "shape",
        "near-uniform attention over what the row sees",
        PALETTE["broad"],
    ),
    Role("mixed", "mixed", None, None, "fallback", "no rule passes; the closest score is shown", PALETTE["mixed"]),
)

SCORE = {score.name: score for score in SCORES}
ROLE = {role.name: role for role in ROLES}
SCORE_NAMES = tuple(score.name for score in SCORES)
ROLE_NAMES = tuple(role.name for role in ROLES)
DEFAULT_THRESHOLDS = {role.name: role.threshold for role in ROLES if role.threshold is not None}


def scores_for(kind: str) -> tuple[Score, ...]:
    """The scores a kind of model measures, in table order."""
    return tuple(score for score in SCORES if kind in score.kinds)


def roles_for(kind: str) -> tuple[Role, ...]:
    """The roles a kind of model's head can be given, in table order (for legends)."""
    return tuple(role for role in ROLES if role.score is None or kind in SCORE[role.score].kinds)


def table_columns(kind: str, sort: str | None = None) -> list[Score]:
    """The terminal table's score columns for a kind of model; sorted by a score that is not a column, that score
    stands in its sibling's place (sorted by `entropy`, the table shows it where `Hnorm` was)."""
    columns = sorted((score for score in scores_for(kind) if score.column is not None), key=lambda s: s.column)
    sorted_by = SCORE.get(sort or "")
    if sorted_by is not None and sorted_by.stands_for is not None:
        columns = [sorted_by if score.name == sorted_by.stands_for else score for score in columns]
    return columns


def _alias(text: str) -> str:
    return text.strip().lower().replace("-", "_").replace(" ", "_")


# Every spelling --sort takes for a score: its name (dashes or underscores), its short label, its label in words.
SORT_ALIASES = {_alias(spelling): score.name for score in SCORES for spelling in (score.name, score.short, score.label)}


def score_named(text: str) -> Score | None:
    """The score a user's spelling names (`previous_token`, `previous-token`, `prev`, `Hnorm`), or None."""
    name = SORT_ALIASES.get(_alias(text))
    return None if name is None else SCORE[name]


def role_named(text: str) -> Role | None:
    """The role a user's spelling names (`previous-token`, `previous_token`, `prev`), or None."""
    wanted = _alias(text)
    for role in ROLES:
        if wanted in (_alias(role.name), _alias(role.short)):
            return role
    return None


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and its noun, singular or plural as English wants: counted(1, "text") is "1 text", counted(2,
    "text") "2 texts", counted(1200, "window") "1,200 windows"; `plural` for a noun that does not take an s."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
