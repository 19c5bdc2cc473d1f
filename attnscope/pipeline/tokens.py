"""Texts to token windows, and windows to padded batches.

With `bos` on, every window of a decoder starts with the model's BOS token, so "first token" means the same thing in
every window; every window of an encoder (a tokenizer with no BOS but [CLS] and [SEP], as BERT's) is wrapped as
`[CLS] text [SEP]`, as the model saw in training. A text longer than the context is cut into consecutive windows
of at most `n_ctx` tokens, special tokens included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, groupby
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.pipeline.inputs import Text, Texts, as_texts
from attnscope.scores.catalog import counted
from attnscope.scores.kinds import Kind


@dataclass(frozen=True)
class Window:
    """At most `n_ctx` token ids of one text (`text_index`), special tokens (BOS, or [CLS] and [SEP]) included."""

    text_index: int
    ids: tuple[int, ...]
    start: int  # offset of the window's first text token within the text's tokens


@dataclass(frozen=True)
class Tokenized:
    windows: list[Window]
    bos: bool
    notes: list[str]

    @property
    def n_tokens(self) -> int:
        return sum(len(window.ids) for window in self.windows)


def default_bos(tokenizer: Any, kind: Kind) -> bool:
    """Special tokens are added by default whenever the tokenizer has them: a decoder's BOS (GPT-2:
    `<|endoftext|>`, as TransformerLens), an encoder's [CLS] … [SEP] (BERT)."""
    if kind.special_tokens == "cls_sep":
        return tokenizer.cls_token_id is not None and tokenizer.sep_token_id is not None
    return tokenizer.bos_token_id is not None


def unknown_id(tokenizer: Any) -> int | None:
    """The id of the tokenizer's unknown token, None when it has none or when that token is also its BOS, EOS or PAD
    (GPT-2's `<|endoftext|>` is all four): then it stands for no unknown word."""
    special = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
    unknown = tokenizer.unk_token_id
    return unknown if unknown is not None and unknown not in special else None


def written_special_ids(tokenizer: Any) -> set[int]:
    """The special tokens a text can write (`<|endoftext|>`), read as themselves, as the tokenizer reads them; not
    the unknown token, which stands for words the tokenizer does not know."""
    return set(getattr(tokenizer, "all_special_ids", ()) or ()) - {unknown_id(tokenizer)}


def special_tokens(tokenizer: Any, kind: Kind, bos: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefix, suffix) ids put around every window: (BOS,) and () for a decoder, ([CLS],) and ([SEP],) for an
    encoder, nothing with `bos` off."""
    if not bos:
        return (), ()
    if kind.special_tokens == "cls_sep":
        if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
            raise AttnscopeError(
                "this model's tokenizer has no [CLS] and [SEP] tokens to wrap the text in; turn bos off"
            )
        return (tokenizer.cls_token_id,), (tokenizer.sep_token_id,)
    if tokenizer.bos_token_id is None:
        raise AttnscopeError("this model's tokenizer has no BOS token to prepend; turn bos off")
    return (tokenizer.bos_token_id,), ()


CHUNK_CHARS = 1 << 16  # characters tokenized in one call: a long text is cut into pieces about this long
SOURCES_LISTED = 1000  # sources named in a result's summary; a corpus of millions lists only its first ones
# A tokenizer that does not tokenize a text cut before a space as it tokenizes it whole (one that adds a prefix
# space at every call) gets texts up to this long tokenized whole; longer ones are still cut, with a note.
WHOLE_TEXT_CHARS = 1 << 22


def _safe_cut(text: str, limit: int) -> tuple[int, bool]:
    """Where to cut `text` at or before `limit` so that the two parts tokenize as the whole does: before a single
    space that joins the word after it (GPT-2's and Llama 3's pre-tokenizers, and SentencePiece's `▁`, attach a
    space to the word that follows and never join it to the one before). Returns (cut, exact); when no such space
    is within `limit` (a run of 64K characters without one), (limit, False). Linear in `limit`."""
    cut = text.rfind(" ", 1, limit)
    while cut > 0:
        if not text[cut - 1].isspace() and cut + 1 < len(text) and not text[cut + 1].isspace():
            return cut, True
        cut = text.rfind(" ", 1, cut)
    return limit, False


def _cuts_exactly(tokenizer: Any) -> bool:
    """Whether this tokenizer gives the same ids for a text and for the text cut before a space in two calls."""
    whole = tokenizer("The cat sat on the mat.", add_special_tokens=False)["input_ids"]
    parts = [tokenizer(part, add_special_tokens=False)["input_ids"] for part in ("The cat", " sat on the mat.")]
    return whole == parts[0] + parts[1]


class WindowStream:
    """The windows of `texts` for `model`, made as the texts are read: each text is tokenized in pieces of about
    CHUNK_CHARS characters (cut where the pieces tokenize as the whole does, see `_safe_cut`) and its tokens cut into
    windows of at most `n_ctx` tokens as they come, so that memory does not grow with the input. Iterating again reads
    the texts again. After an iteration, `notes()` and `summary()` describe what was read."""

    def __init__(self, model: LoadedModel, texts: Texts | Sequence[Text], bos: bool | None = None):
        self.tokenizer, self.n_ctx = model.tokenizer, model.n_ctx
        self.texts = as_texts(texts)
        self.bos = default_bos(self.tokenizer, model.kind) if bos is None else bos
        self.prefix, self.suffix = special_tokens(self.tokenizer, model.kind, self.bos)
        self.span = self.n_ctx - len(self.prefix) - len(self.suffix)
        if self.span < 1:
            raise AttnscopeError(
                f"the model's context of {self.n_ctx} tokens leaves no room for text beside the special tokens; "
                "turn bos off"
            )
        embeddings = model.model.get_input_embeddings() if hasattr(model.model, "get_input_embeddings") else None
        self.vocabulary = getattr(embeddings, "num_embeddings", None)
        self.unknown_id = unknown_id(self.tokenizer)
        self.special_ids = written_special_ids(self.tokenizer)
        self.exact_cuts = _cuts_exactly(self.tokenizer)
        self._reset()

    def _reset(self) -> None:
        self.n_texts = self.n_windows = self.n_tokens = self.text_tokens = 0
        self.longest = 0  # tokens of the longest window, special tokens included
        self.split_texts = self.rough_cuts = self.unknown = 0
        self.specials: dict[int, int] = {}  # special token id -> times written in the texts
        self.first_special = ""  # the text it was first written in
        self.sources: list[str] = []
        self.coverage = Coverage()
        self._text = (0, "")  # the text being tokenized: its index and source, for messages

    def share(self) -> float:
        """How much of the input the current iteration has read (0 to 1)."""
        return self.texts.share()

    def __iter__(self) -> Iterator[Window]:
        self._reset()
        for index, pieces in groupby(self.texts.pieces(), key=lambda piece: piece.index):
            first = next(pieces)
            self.n_texts += 1
            if len(self.sources) < SOURCES_LISTED:
                self.sources.append(first.source)
            parts = chain([first.text], (piece.text for piece in pieces))  # noqa: B031 (read once, now)
            windows = 0
            for window in self._windows(index, first.source, parts):
                windows += 1
                yield window
            self.split_texts += windows > 1

    def _windows(self, index: int, source: str, parts: Iterator[str]) -> Iterator[Window]:
        """The windows of one text, from its pieces."""
        self._text = (index, source)
        pending: list[int] = []  # tokens not yet in a window
        start = 0  # offset of pending[0] among the text's tokens
        for ids in self._token_chunks(parts):
            pending.extend(ids)
            while len(pending) > self.span:  # a full window, and more to come: the last one waits for the end
                yield self._window(index, pending[: self.span], start)
                del pending[: self.span]
                start += self.span
        if not pending and start == 0:
            raise AttnscopeError(f"text {index} ({source}) has no tokens")
        if pending:
            yield self._window(index, pending, start)

    def _window(self, index: int, ids: list[int], start: int) -> Window:
        self.n_windows += 1
        window = Window(index, self.prefix + tuple(ids) + self.suffix, start)
        self.n_tokens += len(window.ids)
        self.longest = max(self.longest, len(window.ids))
        return window

    def _token_chunks(self, parts: Iterator[str]) -> Iterator[list[int]]:
        """Token ids of one text given in pieces, a chunk of about CHUNK_CHARS characters at a time."""
        limit = CHUNK_CHARS if self.exact_cuts else WHOLE_TEXT_CHARS
        buffer, size = [], 0
        for part in parts:
            buffer.append(part)
            size += len(part)
            if size <= 2 * limit:
                continue
            text = "".join(buffer)
            done = 0
            while len(text) - done > limit:  # keep at least a chunk back: the next piece may continue its word
                cut, exact = _safe_cut(text[done : done + limit + 1], limit)
                self.rough_cuts += not exact
                yield self._tokens(text[done : done + cut])
                done += cut
            buffer, size = [text[done:]], len(text) - done
        text = "".join(buffer)
        if text:
            yield self._tokens(text)

    def _tokens(self, text: str) -> list[int]:
        fast = getattr(self.tokenizer, "is_fast", False)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=fast)
        ids = encoded["input_ids"]
        if fast:
            self.coverage.count(text, encoded["offset_mapping"], self.tokenizer, ids, *self._text)
        if ids and self.vocabulary is not None and max(ids) >= self.vocabulary:
            bad = max(ids)
            token = self.tokenizer.convert_ids_to_tokens(bad)
            raise AttnscopeError(
                f"the tokenizer gives token {token!r} the id {bad}, but the model has only {self.vocabulary} token "
                "embeddings: this tokenizer does not belong to this model"
            )
        if self.unknown_id is not None:
            self.unknown += ids.count(self.unknown_id)
        for special in self.special_ids.intersection(ids):
            self.specials[special] = self.specials.get(special, 0) + ids.count(special)
            self.first_special = self.first_special or f"text {self._text[0]} ({self._text[1]})"
        self.text_tokens += len(ids)
        return ids

    def notes(self) -> list[str]:
        """What a reader of the results should know about the texts as read."""
        notes = []
        if self.split_texts:
            notes.append(
                f"{counted(self.split_texts, 'text')} longer than the model's context ({self.n_ctx} tokens) "
                f"{'was' if self.split_texts == 1 else 'were'} split into windows; {counted(self.n_windows, 'window')} "
                "in all"
            )
        if self.rough_cuts:
            notes.append(
                f"{counted(self.rough_cuts, 'long stretch', 'long stretches')} of text with no space between words "
                f"{'was' if self.rough_cuts == 1 else 'were'} tokenized in pieces "
                f"of {CHUNK_CHARS if self.exact_cuts else WHOLE_TEXT_CHARS:,} characters; a token at each cut may "
                "differ from the text tokenized whole"
            )
        notes.extend(self.coverage.notes())
        if self.unknown:
            token = self.tokenizer.unk_token
            share = self.unknown / max(self.text_tokens, 1)
            notes.append(
                f"{self.unknown:,} of {self.text_tokens:,} text tokens ({share:.0%}) are the unknown token {token}: "
                "the tokenizer does not know those words, so attention to them says little about the text"
            )
        if self.specials:
            notes.append(self._specials_note())
        return notes

    def _specials_note(self) -> str:
        count = sum(self.specials.values())
        found = ", ".join(
            f"{self.tokenizer.convert_ids_to_tokens(token)} × {times:,} (id {token}"
            f"{', the BOS' if token == self.tokenizer.bos_token_id else ''})"
            for token, times in sorted(self.specials.items())
        )
        return (
            f"the texts write {counted(count, 'special token')} of the tokenizer ({found}; first in "
            f"{self.first_special}): each is read as that token, not as its characters, so the model sees it "
            f"mid-text (a BOS there is a second first token, where attention may sink); remove "
            f"{'it' if count == 1 else 'them'} to analyse the text alone"
        )

    def summary(self) -> dict[str, Any]:
        """The input part of a result: counts, whether special tokens were added, the first SOURCES_LISTED
        sources."""
        summary = {
            "n_texts": self.n_texts,
            "n_windows": self.n_windows,
            "n_tokens": self.n_tokens,
            "bos": self.bos,
            "sources": list(self.sources),
        }
        if self.n_texts > len(self.sources):
            summary["sources_listed"] = len(self.sources)
        return summary


class Coverage:
    """How much of the texts the tokens represent: the characters (other than white space) that no token's span
    covers were dropped by the tokenizer, which has no unknown token and no byte fallback for them (a vocabulary
    without them analyses "The cat sat on the mat." as `a a a`). A text that loses most of its characters is
    refused; fewer are counted for a note. A tokenizer's [UNK] covers the word it replaces (counted apart)."""

    EXAMPLES = 5

    def __init__(self) -> None:
        self.visible = self.dropped = 0
        self.examples: list[str] = []

    def count(
        self, text: str, offsets: Sequence[tuple[int, int]], tokenizer: Any, ids: list[int], index: int, source: str
    ) -> None:
        gaps, covered_to = [], 0
        for start, end in offsets:
            if start > covered_to:
                gaps.append(text[covered_to:start])
            covered_to = max(covered_to, end)
        gaps.append(text[covered_to:])
        gap_chars = "".join("".join(gaps).split())  # the characters of the gaps, white space left out
        dropped = len(gap_chars)
        visible = len("".join(text.split()))
        self.visible += visible
        if not dropped:
            return
        self.dropped += dropped
        seen = tokenizer.decode(ids) if ids else ""
        # the examples: characters of the gaps that the tokens never give back (a tokenizer's offsets can be off
        # where it dropped characters; its decoding can lowercase, or write [UNK], where it dropped none)
        missing = [char for char in dict.fromkeys(gap_chars) if char not in seen]
        self.examples.extend(char for char in missing if char not in self.examples)
        del self.examples[self.EXAMPLES :]
        if 2 * dropped > visible:
            shown = ", ".join(repr(char) for char in missing[: self.EXAMPLES])
            raise AttnscopeError(
                f"the tokenizer cannot represent {dropped:,} of the {visible:,} characters of text {index} "
                f"({source}){f', e.g. {shown}' if shown else ''}: it has no unknown token and no byte fallback for "
                f"them, so the model would see another text ({seen[:60]!r}); use a model whose tokenizer covers it"
            )

    def notes(self) -> list[str]:
        if not self.dropped:
            return []
        share = self.dropped / max(self.visible, 1)
        examples = f", e.g. {', '.join(repr(char) for char in self.examples)}" if self.examples else ""
        return [
            f"{self.dropped:,} of {self.visible:,} characters of the texts ({share:.1%}) are represented by no "
            f"token{examples}: the tokenizer drops them (no unknown token, no byte fallback), so the model never saw "
            "them"
        ]


def tokenize(model: LoadedModel, texts: Texts | Sequence[Text], bos: bool | None = None) -> Tokenized:
    """Every token window of `texts` for `model` (its tokenizer, context and kind), in a list: for inputs known to
    be small (one text, the tests); a corpus goes through `WindowStream`. `bos=None` means the tokenizer's default
    (see `default_bos`)."""
    stream = WindowStream(model, texts, bos)
    windows = list(stream)
    return Tokenized(windows, stream.bos, stream.notes())


def pad_id(tokenizer: Any) -> int:
    """The id padded positions hold: the tokenizer's pad token, else its EOS, else 0 (the mask hides it)."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return token_id
    return 0


def batch_order(
    windows: Sequence[Window],
    batch_size: int,
    max_tokens: int | None = None,
    fits: Callable[[int, int], bool] | None = None,
) -> list[list[int]]:
    """Window indices grouped into batches of similar length (longest first), so padding stays small: at most
    `batch_size` windows, at most `max_tokens` padded tokens (windows × longest), and, with `fits`, only as many
    as `fits(windows, longest)` allows; a window too long for the budgets alone still runs, alone."""
    if batch_size < 1:
        raise AttnscopeError(f"batch size {batch_size}: must be at least 1")
    if max_tokens is not None and max_tokens < 1:
        raise AttnscopeError(f"max tokens {max_tokens}: must be at least 1")
    order = sorted(range(len(windows)), key=lambda i: (-len(windows[i].ids), i))
    groups: list[list[int]] = []
    for index in order:
        group = groups[-1] if groups else None
        # longest first: the group's first window is its longest, so padded size = count × that length
        joins = (
            group is not None
            and len(group) < batch_size
            and (max_tokens is None or (len(group) + 1) * len(windows[group[0]].ids) <= max_tokens)
            and (fits is None or fits(len(group) + 1, len(windows[group[0]].ids)))
        )
        if joins:
            group.append(index)
        else:
            groups.append([index])
    return groups


# Tokens of windows read ahead and sorted by length before they are cut into batches: enough to bucket a corpus's
# windows well, small enough (a few MB of ids) that a corpus of any size streams.
BUFFER_TOKENS = 1 << 18


@dataclass
class Batch:
    """Right-padded ids (B, n) and lengths (B,) of `windows`, the `indices`-th windows of the stream (right padding
    keeps GPT-2's positions exact for every real token; padded rows and keys are excluded by the mask and by the
    statistics)."""

    indices: list[int]
    input_ids: Any  # (B, n) long
    attention_mask: Any  # (B, n) long, 1 = real token
    lengths: Any  # (B,) long
    windows: list[Window] = field(default_factory=list)  # empty for a batch made by hand (bench)


def batches(
    windows: Iterable[Window],
    batch_size: int,
    device: Any,
    pad_id: int = 0,
    max_tokens: int | None = None,
    fits: Callable[[int, int], bool] | None = None,
    buffer_tokens: int = BUFFER_TOKENS,
) -> Iterator[Batch]:
    """Batches of the windows, read `buffer_tokens` tokens ahead at a time and grouped by `batch_order` within that
    (the whole input at once when it is smaller)."""
    buffered: list[Window] = []
    held = offset = 0
    for window in windows:
        buffered.append(window)
        held += len(window.ids)
        if held >= buffer_tokens:
            yield from _padded(buffered, offset, batch_size, device, pad_id, max_tokens, fits)
            offset, buffered, held = offset + len(buffered), [], 0
    if buffered:
        yield from _padded(buffered, offset, batch_size, device, pad_id, max_tokens, fits)


def _padded(
    windows: list[Window],
    offset: int,
    batch_size: int,
    device: Any,
    pad_id: int,
    max_tokens: int | None,
    fits: Callable[[int, int], bool] | None,
) -> Iterator[Batch]:
    import torch

    for indices in batch_order(windows, batch_size, max_tokens, fits):
        longest = max(len(windows[i].ids) for i in indices)
        input_ids = torch.full((len(indices), longest), pad_id, dtype=torch.long)  # (B, n)
        for row, index in enumerate(indices):
            ids = windows[index].ids
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        lengths = torch.tensor([len(windows[i].ids) for i in indices], dtype=torch.long)  # (B,)
        attention_mask = (torch.arange(longest)[None, :] < lengths[:, None]).long()  # (B, n)
        yield Batch(
            [offset + i for i in indices],
            input_ids.to(device),
            attention_mask.to(device),
            lengths.to(device),
            [windows[i] for i in indices],
        )
