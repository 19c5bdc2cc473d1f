"""The settings of the commands that describe heads: `heads`, `show`, `diversity`, `attend`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape
from attnscope.settings.declare import SCORE, Settings, check_layer, check_measured, optional_setting, setting
from attnscope.settings.groups import Batching, Loading, Reading, Scoring, top_setting

__all__ = ["Attend", "Diversity", "Heads", "Show", "parse_occurrence"]


@dataclass(frozen=True, kw_only=True)
class Heads(Scoring, Loading, Settings):
    """`attnscope heads`: every head's scores and role."""

    torchrun: ClassVar[bool] = True  # each process scores its share of the windows; the sums are added
    sort: str | None = optional_setting(
        SCORE,
        "Sort the table by this score, descending (a score name or a column header).",
        metavar="SCORE",
    )
    top: int | None = top_setting("the heads table")
    layer: int | None = optional_setting(
        options.LAYER, "Show only the heads of this layer.", flags=("--layer", "-l"), metavar="L"
    )
    plot: Sequence[str] = setting(
        options.HEADS,
        (),
        "Also draw head L.H's attention map (repeatable; needs --out).",
        flags=("--plot", "-p"),
        metavar="L.H",
        many=True,
        python_help="heads 'L.H' whose attention maps `save` draws",
    )
    words: bool = setting(options.FLAG, False, "Draw the maps of --plot word by word (needs --plot).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.words and not self.plot:
            raise AttnscopeError("words (--words) draws the maps of plot (--plot L.H) word by word: give plot too")

    def check_shape(self, shape: Shape) -> None:
        if self.layer is not None:
            check_layer(self.layer, shape.n_layer)
        for label in self.plot:
            options.head_in(label, shape.n_layer, shape.n_head)
        check_measured(self.sort, shape.kind_name, self.probe, "sort by")


WORDS_HELP = (
    "Words instead of tokens: attention to a word is the sum over its tokens' keys, from a word the mean of its "
    "tokens' rows."
)
INDEX_HELP = "Which input text (0-based)."


@dataclass(frozen=True, kw_only=True)
class Show(Reading, Loading, Settings):
    """`attnscope show`: one layer's attention maps, or one head's."""

    default_out: ClassVar[str | None] = "."
    torchrun: ClassVar[bool] = True  # one window, the same in every process

    layer: int | None = optional_setting(
        options.LAYER,
        "Layer to draw (0-based); with --head, that head's layer.",
        flags=("--layer", "-l"),
        metavar="L",
    )
    head: str | None = optional_setting(options.HEAD, "Draw only this head, larger: L.H (e.g. 5.1).", metavar="L.H")
    index: int = setting(options.INDEX, 0, INDEX_HELP, metavar="I")
    words: bool = setting(options.FLAG, False, WORDS_HELP)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head is None and self.layer is None:
            raise AttnscopeError("layer or head (--layer L, --head L.H): say what to draw")
        if self.head is not None:
            layer = options.head_of(self.head)[0]
            if self.layer is not None and self.layer != layer:
                raise AttnscopeError(f"head {self.head} is in layer {layer}, not layer {self.layer}: give one")
            object.__setattr__(self, "layer", layer)

    def check_shape(self, shape: Shape) -> None:
        check_layer(self.layer, shape.n_layer)
        if self.head is not None:
            options.head_in(self.head, shape.n_layer, shape.n_head)


@dataclass(frozen=True, kw_only=True)
class Diversity(Reading, Batching, Loading, Settings):
    """`attnscope diversity`: cosine and Jensen–Shannon between every pair of heads of a layer, or of all."""

    torchrun: ClassVar[bool] = True  # each process sums its share of the windows; the sums are added
    layer: int | str | None = setting(
        options.LAYER_OR_ALL,
        help="Layer number (0-based) or 'all'.",
        flags=("--layer", "-l"),
        metavar="L|all",
        python_help="a layer (0-based), or 'all' (or None): every head of the model",
    )
    redundant: float = setting(options.JS_BITS, 0.1, "JSD below which two heads are near-duplicates.", metavar="BITS")
    cluster_at: float = setting(options.JS_BITS, 0.3, "JSD below which average-linkage clusters merge.", metavar="BITS")
    top: int | None = top_setting("the most redundant and the most distinct pairs (5 each on the terminal)")
    sample_rows: int = setting(
        options.SAMPLE_ROWS,
        0,
        "Estimate JS on N random scored rows per window, with standard errors (0: every row, exact).",
        metavar="N",
    )
    seed: int = setting(options.SEED, 0, "Seed of the rows --sample-rows draws.", metavar="SEED")

    def check_shape(self, shape: Shape) -> None:
        if self.layer is not None:
            check_layer(self.layer, shape.n_layer)


@dataclass(frozen=True, kw_only=True)
class Attend(Reading, Loading, Settings):
    """`attnscope attend`: where one word looks, in every layer and head."""

    torchrun: ClassVar[bool] = True  # one window, the same in every process
    from_token: str = setting(
        options.TEXT,
        help="The word that looks: its text without the leading space; WORD@K its K-th occurrence (0-based).",
        flags=("--from",),
        metavar="WORD[@K]",
    )
    to_token: str | None = optional_setting(
        options.TEXT,
        "The word looked at (the sum over its tokens); WORD@K its K-th occurrence; omitted: each head's top keys.",
        flags=("--to",),
        metavar="WORD[@K]",
    )
    from_index: int | None = optional_setting(
        options.OCCURRENCE, "Which occurrence of --from (0-based), as WORD@K.", metavar="K"
    )
    to_index: int | None = optional_setting(
        options.OCCURRENCE,
        "Which occurrence of --to (0-based), as WORD@K; default: all the query sees, summed.",
        metavar="K",
    )
    tokens: int = setting(options.TOKENS, 3, "Top keys listed per head (tokens, or words).", metavar="K")
    top: int | None = top_setting("the strongest heads (10 on the terminal)")
    index: int = setting(options.INDEX, 0, INDEX_HELP, metavar="I")
    words: bool = setting(options.FLAG, False, WORDS_HELP)
    skip_first: bool = setting(
        options.FLAG,
        False,
        "Leave the first token (the attention sink: BOS, [CLS], or a window's first token) out "
        "of the ranking of keys and heads.",
        negatable=False,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for role in ("from", "to"):
            spec, given = getattr(self, f"{role}_token"), getattr(self, f"{role}_index")
            if spec is None:
                continue
            word, occurrence = parse_occurrence(spec)
            if occurrence is not None and given is not None and occurrence != given:
                raise AttnscopeError(
                    f"{role} word {options.shown(spec)} names occurrence {occurrence}, and {role} occurrence is "
                    f"{given}: give one"
                )
            if not word.strip():
                raise AttnscopeError(f"{role} word {options.shown(spec)}: give a word of the text")
            object.__setattr__(self, f"{role}_token", word)
            object.__setattr__(self, f"{role}_index", occurrence if occurrence is not None else given)
        if self.from_index is None:
            object.__setattr__(self, "from_index", 0)
        options.OCCURRENCE.check(self.from_index, "from occurrence")  # the K of WORD@K, checked as --from-index is
        options.OCCURRENCE.or_none().check(self.to_index, "to occurrence")
        if self.to_index is not None and self.to_token is None:
            raise AttnscopeError(
                f"to occurrence {self.to_index} picks one occurrence of the to word: give the to word too (--to)"
            )


def parse_occurrence(spec: str) -> tuple[str, int | None]:
    """`WORD@K` -> (WORD, K), the K-th occurrence (0-based); a spec that does not end in `@` and digits is a word as
    it is (`@property`, `a@b`), with no occurrence (None). `user@2@0` is the word `user@2`, occurrence 0."""
    match = re.fullmatch(r"(.+)@(\d+)", spec, re.DOTALL)
    return (match.group(1), int(match.group(2))) if match else (spec, None)
