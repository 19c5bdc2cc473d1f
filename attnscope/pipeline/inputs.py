"""Stage 1: the texts, whatever they come from: `Text` (a text and its source), the `Texts` streams the tokenizer
reads in pieces (`TextList`, `OneText`; `pipeline.reading` reads files and stdin), a text's checks (`valid_text`,
`json_line`), and the bundled samples.

A `Texts` source yields pieces (`Piece`: a long text arrives in several, see `tokens.WindowStream`), can be read
again from the start (ablation reads it once per pass), and is checked whole (`check()`) before any model loads.

Pure Python, no torch: the CLI can validate inputs before paying for a model load.
"""

from __future__ import annotations

import codecs
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.scores.catalog import counted


@dataclass(frozen=True)
class Text:
    """One input text and where it came from (`source` is shown in tables and written to JSON)."""

    text: str
    source: str


@dataclass(frozen=True)
class Piece:
    """Part of the `index`-th text (0-based, counting the texts this source gives) from `source`; the pieces of a
    text come one after the other, and every text has at least one character that is not white space."""

    index: int
    source: str
    text: str


def valid_text(text: str, where: str) -> str:
    """`text` if it is text: valid Unicode without a NUL character. A lone surrogate (from invalid UTF-8 in a
    command-line argument, which Python keeps as `\\udcff`, or a `\\ud800` escape in JSON) is refused, naming `where`
    and the character; so is NUL, as a file holding one is (a string from Python, a `\\u0000` in a JSON line: no
    byte of the file is NUL there)."""
    if "\0" in text:
        raise AttnscopeError(f"{where} holds a NUL byte (character {text.index(chr(0))}): it is not text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        char = text[error.start]
        if 0xDC80 <= ord(char) <= 0xDCFF and _ascii_locale() and _utf8_bytes(text):
            raise AttnscopeError(
                f"{where} holds bytes that are not ASCII (0x{ord(char) - 0xDC00:02x} at character {error.start}), "
                f"and the locale's encoding is ASCII ({_locale_name()}), so Python could not read them as text: use "
                "a UTF-8 locale (e.g. LC_ALL=C.UTF-8) or PYTHONUTF8=1"
            ) from None
        if 0xDC80 <= ord(char) <= 0xDCFF:  # surrogateescape: the byte the operating system passed
            what = f"byte 0x{ord(char) - 0xDC00:02x} at character {error.start} is not UTF-8"
        else:
            what = f"character {error.start} is a lone surrogate (U+{ord(char):04X}), not a character"
        raise AttnscopeError(f"{where} is not valid text: {what}") from None
    return text


def json_line(line: str, where: str) -> Any:
    """One line of a JSON-lines file, parsed; anything it cannot be read as is one line naming `where` (FILE:LINE)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise AttnscopeError(f"{where}: not valid JSON ({error.msg})") from None
    except RecursionError:
        raise AttnscopeError(f"{where}: JSON nested too deeply") from None
    except ValueError as error:  # a number of more than 4,300 digits (Python's limit on int conversion)
        raise AttnscopeError(f"{where}: cannot read its JSON ({str(error).split(':')[0]})") from None


def _ascii_locale() -> bool:
    """Whether Python reads command-line arguments as ASCII (LC_ALL=C or POSIX without Python's UTF-8 mode)."""

    return codecs.lookup(sys.getfilesystemencoding()).name == "ascii"


def _utf8_bytes(text: str) -> bool:
    """Whether the bytes an argument was given as (its undecodable bytes kept as lone surrogates) are UTF-8."""
    try:
        os.fsencode(text).decode("utf-8")
    except (UnicodeError, ValueError):
        return False
    return True


def _locale_name() -> str:
    for variable in ("LC_ALL", "LC_CTYPE", "LANG"):
        if os.environ.get(variable):
            return f"{variable}={os.environ[variable]}"
    return "no LANG or LC_ALL set"


class Texts:
    """A stream of texts that can be read again from the start. `pieces()` gives every text in order, in one or
    more `Piece`s; `share()` how much of the input the current read has consumed (0 to 1, for progress); `check()`
    validates everything up front."""

    def pieces(self) -> Iterator[Piece]:
        raise NotImplementedError

    def share(self) -> float:
        raise NotImplementedError

    def check(self) -> None:
        """Refuse, with one line, an input that would fail later or has no text at all."""

    def __iter__(self) -> Iterator[Text]:
        """Whole texts, each joined from its pieces: for inputs known to be small (a corpus streams by `pieces`)."""
        current: list[str] = []
        source, index = "", -1
        for piece in self.pieces():
            if piece.index != index and current:
                yield Text("".join(current), source)
                current = []
            index, source = piece.index, piece.source
            current.append(piece.text)
        if current:
            yield Text("".join(current), source)


class TextList(Texts):
    """Texts in memory (the TEXT argument, the bundled samples, a list from Python), each one piece."""

    def __init__(self, texts: Sequence[Text], where: str = "the texts given"):
        self.items = [Text(valid_text(item.text, item.source), item.source) for item in texts]
        self.where = where
        self._done = 0

    def pieces(self) -> Iterator[Piece]:
        for index, item in enumerate(self.items):
            self._done = index
            yield Piece(index, item.source, item.text)
        self._done = len(self.items)

    def share(self) -> float:
        return self._done / len(self.items) if self.items else 1.0

    def check(self) -> None:
        if not any(item.text.strip() for item in self.items):
            raise AttnscopeError(f"{self.where} holds no text (it is empty or only whitespace)")

    def __len__(self) -> int:
        return len(self.items)


AnyTexts = Texts | Sequence[Text]  # what an analysis reads: a stream, or texts in memory (`as_texts`)


def as_texts(texts: Texts | Sequence[Text]) -> Texts:
    """A `Texts` stream of `texts` (a list of `Text` from Python is wrapped as it is)."""
    return texts if isinstance(texts, Texts) else TextList(list(texts))


class OneText(Texts):
    """The `index`-th text (0-based) of `texts` alone, streamed as it is; `check()` says when there is none."""

    def __init__(self, texts: Texts, index: int):
        self.texts, self.index = texts, index

    def pieces(self) -> Iterator[Piece]:
        for piece in self.texts.pieces():
            if piece.index == self.index:
                yield Piece(0, piece.source, piece.text)
            elif piece.index > self.index:
                return

    def share(self) -> float:
        return self.texts.share()

    def check(self) -> None:
        if next(self.pieces(), None) is None:
            count = len({piece.index for piece in self.texts.pieces()})
            raise AttnscopeError(f"text index {self.index} is out of range ({counted(count, 'text')} given)")


def sample_texts() -> list[Text]:
    """The bundled sample texts, one per file of `attnscope/sample_texts/`, in file-name order."""
    folder = resources.files("attnscope") / "sample_texts"
    entries = sorted((entry for entry in folder.iterdir() if entry.name.endswith(".txt")), key=lambda e: e.name)
    return [Text(entry.read_text(encoding="utf-8").strip(), f"sample:{entry.name}") for entry in entries]
