"""Where one word looks: the attention row of one query word in every layer and head (`attnscope attend`).

    result = attnscope.attend(model, "The doctor said that she would help the patient.", from_token="she",
                              to_token="doctor")
    result.to_weight[layer, head]  # attention from "she" to "doctor" (summed over its tokens: do|ct|or)

Words are found as `pipeline.labels.group_words` groups tokens; from a word of several tokens the row is the mean of
its tokens' rows, to a word the sum over its tokens' keys (`scores.words`). Only those rows of each layer's
attention are kept (L × H × tokens of the word × n numbers), never the maps.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope import settings
from attnscope.analyses.common import check_finite, check_index
from attnscope.analyses.result import Result, heads_by_value
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.output.attend import AttendView
from attnscope.pipeline import capture
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.labels import Labels, label_window, vocabulary_style
from attnscope.pipeline.reducers import QueryRowReducer
from attnscope.pipeline.tokens import Window, WindowStream, batches
from attnscope.scores.catalog import counted
from attnscope.scores.words import TOKENS, WORDS, to_words

LISTED = 80  # tokens (or words) an error lists


def find_word(labels: Labels, wanted: str) -> list[range]:
    """Where `wanted` is in a window, as spans of token positions in order: the words whose text (without its
    leading space) equals `wanted` exactly, else ignoring case; else the same without punctuation at the word's ends
    (a vocabulary that holds `▁furiously,` as one piece makes "furiously," one word); when no word does, the single
    tokens whose text or label as tables show it equals it (a piece of a word: `do`, `##ct`), exactly, else ignoring
    case."""
    target = wanted.strip()
    tiers = (
        (labels.words, [text.strip() for text in labels.word_text]),
        (labels.words, [_unpunctuated(text) for text in labels.word_text]),
        ([range(i, i + 1) for i in range(len(labels.tokens))], None),
    )
    for spans, texts in tiers:
        for same in (str.__eq__, lambda a, b: a.casefold() == b.casefold()):
            if texts is not None:
                found = [span for span, text in zip(spans, texts, strict=True) if same(text, target)]
            else:  # a token: its exact text (without spaces and the BPE space marks) or its shown label
                found = [
                    span
                    for span in spans
                    if same(_bare(labels.tokens[span.start]), target) or same(labels.shown[span.start], target)
                ]
            if found:
                return found
    return []


def _unpunctuated(text: str) -> str:
    """A word's text without the punctuation and symbols at its ends; a word of punctuation alone stays itself."""
    start, stop = 0, len(text)
    while start < stop and unicodedata.category(text[start])[0] in "PS":
        start += 1
    while stop > start and unicodedata.category(text[stop - 1])[0] in "PS":
        stop -= 1
    return text[start:stop].strip() or text


def _bare(token: str) -> str:
    return token.replace("Ġ", " ").replace("▁", " ").strip()


def listing(labels: Labels, view: str) -> str:
    """A window's tokens (or words) as tables show them (`<bos>@0 The@1 do@2 ##ct@3 ##or@4`), the first LISTED."""
    spans = labels.words if view == WORDS else [range(i, i + 1) for i in range(len(labels.tokens))]
    shown = " ".join(labels.describe(span) for span in spans[:LISTED])
    return shown + (" …" if len(spans) > LISTED else "")


@dataclass(repr=False)  # the repr is Result's: a summary
class AttendResult(Result):
    """Attention from one word (the tokens `from_positions` of one window) in every layer and head.

    rows: (n_layer, n_head, n) numpy float64, the attention row of the word: the mean of its tokens' rows (keys after
    its last token weigh 0 in a causal model); to_words: the spans of the target word's occurrences that were summed;
    to_weight: (n_layer, n_head) attention summed over their tokens, or None without a target; word_rows: (n_layer,
    n_head, W) the rows summed over each word's keys, in the words view (`view` "words"), else None.
    """

    view_class = AttendView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    model: dict[str, Any]
    settings: dict[str, Any]
    labels: Labels
    from_token: str
    from_positions: list[int]
    rows: np.ndarray
    to_token: str | None = None
    to_words: list[range] = field(default_factory=list)
    to_weight: np.ndarray | None = None
    word_rows: np.ndarray | None = None
    bos: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> list[str]:
        return self.labels.tokens

    @property
    def from_position(self) -> int:
        """The first token of the from word."""
        return self.from_positions[0]

    @property
    def to_positions(self) -> list[int]:
        """Every token whose weight `to_weight` sums."""
        return [position for span in self.to_words for position in span]

    @property
    def view(self) -> str:
        return WORDS if self.word_rows is not None else TOKENS

    @property
    def keys(self) -> np.ndarray:
        """(n_layer, n_head, K): the rows the view ranks, over tokens or over words."""
        return self.word_rows if self.word_rows is not None else self.rows

    def key_span(self, key: int) -> range:
        """The token positions of key `key` of the view (a token, or a word)."""
        return self.labels.words[key] if self.view == WORDS else range(key, key + 1)

    def key_name(self, key: int) -> str:
        """Key `key` as tables show it: `do@2`, or in the words view `doctor@2-4`."""
        return self.labels.describe(self.key_span(key))

    def key_text(self, key: int) -> str:
        """Key `key`'s label alone: `##ct`, or in the words view `doctor`."""
        return self.labels.word_text[key] if self.view == WORDS else self.labels.shown[key]

    @property
    def from_name(self) -> str:
        return self.labels.describe(self.from_positions)

    def _ranked_keys(self) -> range:
        """The keys ranked: all, or all but the first (the sink) with `skip_first`."""
        return range(1 if self.settings.get("skip_first") else 0, self.keys.shape[-1])

    def top_keys(self, layer: int, head: int, k: int | None = None) -> list[tuple[int, float]]:
        """The `k` (default: the run's `tokens`) keys of the view with the largest weights (ties: the earlier first),
        as (key, weight): a key is a token position, or in the words view a word's index; with `skip_first`, the
        first key is left out."""
        k = self.settings["tokens"] if k is None else k
        row = self.keys[layer, head]
        order = sorted(self._ranked_keys(), key=lambda j: (-row[j], j))[:k]
        return [(j, float(row[j])) for j in order]

    def strength(self) -> np.ndarray:
        """(n_layer, n_head): what ranks the heads: the weight on the target, or without one the largest weight on
        a key (the first key left out with `skip_first`)."""
        if self.to_weight is not None:
            return self.to_weight
        ranked = self.keys[..., self._ranked_keys().start :]  # (L, H, K')
        return ranked.max(axis=-1) if ranked.shape[-1] else np.zeros(self.keys.shape[:2])

    def strongest(self, k: int | None = None) -> list[tuple[int, int]]:
        """The `k` (default: the run's `top`) heads with the largest `strength`, as (layer, head); ties in layer.head
        order."""
        k = self.settings["top"] if k is None else k
        return heads_by_value(self.strength())[:k]

    def strongest_labels(self, k: int | None = None) -> list[str]:
        """`strongest(k)` as `L.H` labels."""
        return [f"{layer}.{head}" for layer, head in self.strongest(k)]


@dataclass
class _Found:
    """Where the from word is: its window (numbered from 0), the window's labels, the from word's span, and the to
    word's occurrences in that window and in the windows before it."""

    window: Window
    number: int
    labels: Labels
    source: range
    targets: list[range]
    targets_before: int
    more_windows: bool


class Attend(settings.Attend):
    """Attention from one word of a text in every layer and head; with `to_token`, the weight on that word.

    `from_token` and `to_token` are words (or, where no word matches, single tokens: see `find_word`), each with an
    occurrence: `WORD@K` or `from_index`/`to_index` (0-based, counted over the whole text, window by window).
    Without an occurrence of the to word, all its occurrences the query sees in its window are summed. `words`:
    keys ranked as words rather than tokens (`scores.words`); `skip_first`: the first token (the attention sink:
    BOS, [CLS], or a window's first token) left out of the ranking of keys and heads. `tokens` top keys per head
    and the `top` strongest heads are listed."""

    @property
    def view(self) -> str:
        return WORDS if self.words else TOKENS

    def run(self, model: LoadedModel, texts: Texts | Sequence[Text], progress: Any = None) -> AttendResult:
        windows = WindowStream(model, check_index(self.index, texts), self.bos)
        found = self._find(model, windows)
        notes = windows.notes()
        if found.more_windows:
            notes.append(
                f"the text is longer than the model's context ({model.n_ctx} tokens) and is split into windows; from "
                f"word {self.from_token!r} (occurrence {self.from_index}) is in window {found.number}, which starts at "
                f"text token {found.window.start}: the positions shown are the window's"
            )
        labels, source = found.labels, list(found.source)
        targets = self._targets(found, model.kind.causal)
        reducer = QueryRowReducer(model.kind, source)
        notes += capture.run(model.model, batches([found.window], 1, model.device), reducer, kernel=model.kernel).notes
        kept = reducer.rows
        token_rows = np.stack([kept[layer].double().numpy() for layer in range(model.n_layer)])  # (L, H, P, n)
        check_finite(model, "attention", token_rows, range(model.n_layer))
        rows = token_rows.mean(axis=2)  # (L, H, n): from a word, the mean of its tokens' rows
        settings = {
            "from_index": self.from_index,
            "to_index": self.to_index,
            "tokens": self.tokens,
            "top": self.top,
            "index": self.index,
            "words": self.words,
            "skip_first": self.skip_first,
        }
        result = AttendResult(
            model.info(),
            settings,
            labels,
            self.from_token,
            source,
            rows,
            word_rows=to_words(rows, labels.words) if self.words else None,  # (L, H, W)
            bos=windows.bos,
            notes=notes,
        )
        if self.to_token is not None:
            result.to_token = self.to_token
            result.to_words = targets
            result.to_weight = rows[..., result.to_positions].sum(axis=-1)  # (L, H): to a word, the sum of its keys
        result.notes += sink_notes(result)
        return result

    def _find(self, model: LoadedModel, windows: WindowStream) -> _Found:
        """The window holding the `from_index`-th occurrence of the from word (counted over the whole text, window
        by window), and the to word's occurrences up to it; the windows after it are not tokenized (but one, to
        know whether there are more)."""
        style = vocabulary_style(model.tokenizer)
        seen: list[tuple[int, str]] = []  # (window number, name) of the from word's occurrences in earlier windows
        targets_before = 0
        first_labels = None  # the first window's labels, for the message when the word is nowhere
        stream: Iterator[Window] = iter(windows)
        number = -1
        for number, window in enumerate(stream):
            labels = label_window(model.tokenizer, window.ids, style)
            first_labels = labels if first_labels is None else first_labels
            spans = find_word(labels, self.from_token)
            targets = find_word(labels, self.to_token) if self.to_token is not None else []
            if self.from_index < len(seen) + len(spans):
                more = number > 0 or next(stream, None) is not None
                source = spans[self.from_index - len(seen)]
                return _Found(window, number, labels, source, targets, targets_before, more)
            seen += [(number, labels.describe(span)) for span in spans]
            targets_before += len(targets)
        if not seen:
            where = "its tokens are" if number == 0 else "the tokens of its first window are"
            if self.words:
                where = where.replace("tokens", "words")
            raise AttnscopeError(
                f"from word {self.from_token!r} is not in the text; {where} {listing(first_labels, self.view)}"
            )
        raise AttnscopeError(
            f"from occurrence {self.from_index}: {self.from_token!r} occurs {counted(len(seen), 'time')} "
            f"({_where(seen)})"
        )

    def _targets(self, found: _Found, causal: bool) -> list[range]:
        """The to word's occurrences whose weights are summed: the `to_index`-th, or all the query sees in its
        window."""
        if self.to_token is None:
            return []
        labels, number, before = found.labels, found.number, found.targets_before
        window = f"window {number}, which holds the from word" if found.more_windows else "the text"
        if not found.targets:
            elsewhere = " (it is in earlier windows: a word attends only within its window)" if before else ""
            kind = "words" if self.words else "tokens"
            raise AttnscopeError(
                f"to word {self.to_token!r} is not in {window}{elsewhere}; its {kind} are {listing(labels, self.view)}"
            )
        chosen = found.targets
        if self.to_index is not None:
            k = self.to_index - before
            if k < 0:
                raise AttnscopeError(
                    f"to occurrence {self.to_index}: that {self.to_token!r} is in a window before the from word's "
                    f"(window {number}): a word attends only within its window; occurrences {before}-"
                    f"{before + len(chosen) - 1} are in that window"
                )
            if k >= len(chosen):
                names = ", ".join(labels.describe(span) for span in chosen)
                where = f"up to the end of {window} ({names} in it)" if found.more_windows else f"({names})"
                raise AttnscopeError(
                    f"to occurrence {self.to_index}: {self.to_token!r} occurs "
                    f"{counted(before + len(chosen), 'time')} {where}"
                )
            chosen = [chosen[k]]
        if causal:  # a later occurrence is out of the query's sight
            visible = [span for span in chosen if span.start <= found.source[-1]]
            if not visible:
                raise AttnscopeError(
                    f"to word {self.to_token!r} ({labels.describe(chosen[0])}) comes after from word "
                    f"{self.from_token!r} ({labels.describe(found.source)}): a causal model's token cannot attend to "
                    "later tokens"
                )
            chosen = visible
        return chosen


def _where(seen: Sequence[tuple[int, str]]) -> str:
    """Occurrences as tables name them, with their window when the text has several: `she@5, she@9` or
    `window 0: she@5; window 2: she@3`."""
    if all(number == 0 for number, _ in seen):
        return ", ".join(name for _, name in seen[:20])
    return "; ".join(f"window {number}: {name}" for number, name in seen[:20])


def sink_notes(result: AttendResult) -> list[str]:
    """What a reader should know about the first token (the attention sink, Xiao et al. 2023): how many of the
    strongest heads put their largest weight there, or, with `skip_first`, how much weight the left-out first
    token holds in them."""
    strongest = result.strongest()
    first = result.key_text(0)
    if result.settings.get("skip_first"):
        shares = [float(result.keys[layer, head, 0]) for layer, head in strongest]
        return [
            f"the first {'word' if result.view == WORDS else 'token'} ({first}) is left out of the ranking; the "
            f"{len(strongest)} strongest heads put {min(shares):.2f}-{max(shares):.2f} of their attention on it "
            "(weights are the model's, not renormalised)"
        ]
    on_sink = [
        f"{layer}.{head}"
        for layer, head in strongest
        if result.keys[layer, head].argmax() == 0 and float(result.keys[layer, head, 0]) > 0
    ]
    if not on_sink:
        return []
    return [
        f"{len(on_sink)} of the {len(strongest)} strongest heads ({', '.join(on_sink)}) put their largest weight on "
        f"the first {'word' if result.view == WORDS else 'token'} ({first}), the attention sink where heads park "
        "attention they do not use; --skip-first leaves it out of the ranking"
    ]
