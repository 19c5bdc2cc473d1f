"""Stage 1: where the texts come from (an argument, a file, stdin, or the bundled samples), read as a stream.

Texts reach the tokenizer as a stream of pieces, so that no input, however large (a 1 GB corpus, a 50 MB line), is
ever held whole in memory: a file is read in blocks of `BLOCK_BYTES`, decoded incrementally, and split into texts
on blank lines as it goes; a long text arrives in pieces (see `tokens.WindowStream`, which cuts and tokenizes it
incrementally). Standard input and a named pipe are spooled to an anonymous temporary file first, so that they can
be checked, then read.

`check()` reads the whole input once before any model is loaded (UTF-8, NUL bytes, JSON lines) and fails with one
line naming the file and the byte or line: a bad byte at the end of a 1 GB file costs a second, not a model load
and an hour of work. The types of texts are `pipeline.inputs`'.

Pure Python, no torch: the CLI can validate inputs before paying for a model load.
"""

from __future__ import annotations

import codecs
import io
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from attnscope.errors import AttnscopeError
from attnscope.pipeline.inputs import Piece, Text, TextList, Texts, json_line, sample_texts, valid_text

BLOCK_BYTES = 1 << 20  # bytes read, decoded and split at a time
# A line of nothing but white space longer than this is not waited on to tell whether it is blank: it is text.
# (Without a bound, a file of 1 GB of spaces would be held whole while deciding.)
LONGEST_BLANK_LINE = 1 << 16
LONGEST_JSON_LINE = 1 << 26  # characters of one line of a .jsonl file, which is parsed whole


class TextFile(Texts):
    """Texts from a file, read in blocks: `.jsonl` takes each line's `text` field (a line is parsed whole), any
    other file is split into texts on blank lines (lines of nothing but white space) and streamed in pieces of at
    most a block. `name` is how messages name the file, `label` how sources do (`label#k`: the k-th text)."""

    def __init__(self, open_binary: Callable[[], BinaryIO], size: int, name: str, label: str, jsonl: bool):
        self.open_binary, self.size, self.name, self.label, self.jsonl = open_binary, size, name, label, jsonl
        self._file: BinaryIO | None = None

    def share(self) -> float:
        if self._file is None or self._file.closed or self.size <= 0:
            return 1.0 if self._file is None or self._file.closed else 0.0
        return min(self._file.tell() / self.size, 1.0)

    def _blocks(self) -> Iterator[str]:
        """The file decoded, a block at a time: UTF-8 (a byte-order mark at the start is not text), line ends
        written as `\\n` (as Python's universal newlines: `\\r\\n` and `\\r` too)."""
        with self.open_binary() as raw:
            self._file = raw
            # the bytes that were checked, no more: a file that grows while it is read (a log being written) ends
            reader = io.TextIOWrapper(io.BufferedReader(_Bounded(raw, self.size)), encoding="utf-8-sig", newline=None)
            try:
                while block := reader.read(BLOCK_BYTES):
                    yield block
            except UnicodeDecodeError:  # check() found none: the file changed under us
                raise AttnscopeError(f"{self.name} changed while it was read: it is no longer UTF-8") from None
            except OSError as error:
                raise AttnscopeError(f"cannot read {self.name}: {error.strerror or error}") from None
            finally:
                reader.detach()

    def pieces(self) -> Iterator[Piece]:
        if self.jsonl:
            for index, (_, text) in enumerate(self._records()):
                if text.strip():
                    yield Piece(index, f"{self.label}#{index}", text)
            return
        for index, text in _split_blank_lines(self._blocks()):
            yield Piece(index, f"{self.label}#{index}", text)

    def _records(self) -> Iterator[tuple[int, str]]:
        """(line number, text) of every non-empty line of a JSON-lines file, each checked. A line is parsed whole,
        so one longer than LONGEST_JSON_LINE characters is refused rather than held in memory however long."""
        parts: list[str] = []  # the line being read, in pieces
        held, number = 0, 0
        for block in self._blocks():
            lines = block.split("\n")
            for end in lines[:-1]:
                line = "".join([*parts, end])
                parts, held = [], 0
                number += 1
                if line.strip():
                    yield number, self._record(line, number)
            parts.append(lines[-1])
            held += len(lines[-1])
            if held > LONGEST_JSON_LINE:
                raise AttnscopeError(
                    f"{self.name}:{number + 1}: a line longer than {LONGEST_JSON_LINE:,} characters; a JSON line is "
                    "read whole: split the text over several records, or give it as a plain text file"
                )
        line = "".join(parts)
        if line.strip():
            yield number + 1, self._record(line, number + 1)

    def _record(self, line: str, number: int) -> str:
        where = f"{self.name}:{number}"
        record = json_line(line, where)
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise AttnscopeError(f'{where}: expected an object with a string "text" field')
        return valid_text(record["text"], f'{where}: the "text" field')

    def check(self) -> None:
        """One pass over the raw bytes: UTF-8 throughout (the first bad byte named by its offset), no NUL byte
        (a binary file), and at least one text; a JSON-lines file has every line parsed and checked."""
        checked = _ByteCheck(self.name)
        with self.open_binary() as raw:
            for _ in _checked_blocks(raw, checked):
                pass
        self.size = checked.offset  # what is read from now on: the bytes checked
        has_text = checked.has_text
        if self.jsonl:  # every line parsed, not only those up to the first text
            has_text = False
            for _, text in self._records():
                has_text = has_text or bool(text.strip())
        if not has_text:
            raise AttnscopeError(f"{self.name} holds no text (it is empty or only whitespace)")


class _Bounded(io.RawIOBase):
    """The first `limit` bytes of a binary file, as a raw stream."""

    def __init__(self, raw: BinaryIO, limit: int):
        self.raw, self.left = raw, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(min(len(buffer), self.left)) if self.left > 0 else b""
        buffer[: len(data)] = data
        self.left -= len(data)
        return len(data)


class _ByteCheck:
    """The checks of raw input bytes, fed a block at a time: no NUL byte (a binary file), UTF-8 throughout (the
    first bad byte named by its offset); `has_text` once a character that is not white space was seen. Feed b""
    at the end."""

    def __init__(self, name: str):
        self.name, self.offset, self.has_text = name, 0, False
        self.decoder = codecs.getincrementaldecoder("utf-8")()

    def feed(self, data: bytes) -> None:
        nul = data.find(b"\0")
        if nul >= 0:
            raise AttnscopeError(
                f"{self.name} looks like a binary file (a NUL byte at byte {self.offset + nul}), not text"
            )
        buffered = len(self.decoder.getstate()[0])
        try:
            text = self.decoder.decode(data, final=not data)
        except UnicodeDecodeError as error:
            bad = self.offset - buffered + error.start
            raise AttnscopeError(f"{self.name} is not UTF-8 text (byte {bad} cannot be decoded)") from None
        if not self.has_text:
            visible = text.replace("\ufeff", "")  # a byte-order mark is not text
            self.has_text = bool(visible) and not visible.isspace()
        self.offset += len(data)


def _checked_blocks(source: BinaryIO, checked: _ByteCheck) -> Iterator[bytes]:
    """The blocks of `source` (BLOCK_BYTES each) until its end, each fed to `checked` first; a read that fails is one
    AttnscopeError naming the input."""
    while True:
        try:
            data = source.read(BLOCK_BYTES)
        except OSError as error:
            raise AttnscopeError(f"cannot read {checked.name}: {error.strerror or error}") from None
        checked.feed(data)
        if not data:
            return
        yield data


def _split_blank_lines(blocks: Iterator[str]) -> Iterator[tuple[int, str]]:
    """(k, piece) of the k-th text, for texts separated by blank lines, in order.

    A text is its lines joined by `\\n`, as they were, from its first line with a non-space character to the last
    line before a blank one (a line of only white space) or the end. Only a line that may still turn out blank is
    held back while deciding (at most LONGEST_BLANK_LINE characters; a longer one counts as text); everything else
    is passed on as it arrives.
    """
    index, inside = -1, False
    held = ""  # the current line so far while it is only white space (inside a text: with the "\n" before it)
    for block in blocks:
        parts = block.split("\n")
        for number, part in enumerate(parts):
            ends_line = number < len(parts) - 1
            if not inside or held:  # the current line may still be blank
                if not part or part.isspace():
                    if ends_line:  # a blank line: it ends the open text, if any
                        inside, held = False, ""
                        continue
                    held, part = held + part, ""
                    if len(held) <= LONGEST_BLANK_LINE:
                        continue
                if not inside:
                    index, inside = index + 1, True
                part, held = held + part, ""
            if part:
                yield index, part
            if ends_line:
                held = "\n"


def _open_path(path: str) -> BinaryIO:
    try:
        return open(path, "rb")  # noqa: SIM115 (the caller closes it)
    except OSError as error:
        raise AttnscopeError(f"cannot read {path}: {error.strerror or error}") from None


# Standard input and named pipes are copied to a temporary file before they are read (they can be read only once);
# past this size the copy stops, and a file given with --file (read in place) is the way.
SPOOL_MAX_BYTES = 16 * 2**30


def _spool(source: BinaryIO, name: str) -> tuple[Callable[[], BinaryIO], int]:
    """Copy a stream that can be read only once (stdin, a pipe) to an anonymous temporary file, a block at a time,
    checking each block as it comes (a NUL byte or a byte that is not UTF-8 stops the copy at once: `< /dev/zero`
    is refused at its first block, not after filling the disk) and stopping at SPOOL_MAX_BYTES; returns how to open
    the copy (each open reads it from the start) and its size."""
    spool = tempfile.TemporaryFile(prefix="attnscope-input-")  # noqa: SIM115 (lives as long as the process)
    checked = _ByteCheck(name)
    try:
        for data in _checked_blocks(source, checked):
            if checked.offset > SPOOL_MAX_BYTES:
                raise AttnscopeError(
                    f"{name} holds more than {SPOOL_MAX_BYTES / 2**30:g} GiB, the most attnscope copies from a stream; "
                    "save it to a file and give that with --file, which is read in place"
                )
            try:
                spool.write(data)
            except OSError as error:
                raise AttnscopeError(
                    f"cannot copy {name} to a temporary file ({tempfile.gettempdir()}): {error.strerror or error}"
                ) from None
        spool.flush()
    except BaseException:
        spool.close()
        raise
    size = spool.tell()

    def reopen() -> BinaryIO:
        copy = os.dup(spool.fileno())
        os.lseek(copy, 0, os.SEEK_SET)
        return open(copy, "rb")  # noqa: SIM115

    reopen.spool = spool  # keeps the temporary file open as long as the opener lives
    return reopen, size


def read_file(path: str) -> TextFile:
    """Texts from a file: `.jsonl` takes each line's `text` field, anything else is split on blank lines. A named
    pipe is read once into a temporary file; a device or socket is refused."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        raise AttnscopeError(f"no such file: {path}") from None
    except OSError as error:
        raise AttnscopeError(f"cannot read {path}: {error.strerror or error}") from None
    jsonl = file.suffix.lower() == ".jsonl"
    if stat.S_ISDIR(mode):
        raise AttnscopeError(f"{path} is a directory, not a text file")
    if stat.S_ISREG(mode):
        return TextFile(lambda: _open_path(path), file.stat().st_size, path, path, jsonl)
    if stat.S_ISFIFO(mode):
        with _open_path(path) as pipe:
            opener, size = _spool(pipe, path)
        return TextFile(opener, size, path, path, jsonl)
    raise AttnscopeError(f"{path} is not a regular file (a device or a socket); give a text file")


def read_stdin() -> TextFile:
    """Texts from standard input, split on blank lines like a plain text file."""
    if sys.stdin is None or sys.stdin.closed:
        raise AttnscopeError("standard input is closed: there is no text to read from '-'")
    opener, size = _spool(sys.stdin.buffer, "standard input")
    return TextFile(opener, size, "standard input", "stdin", jsonl=False)


def texts_given(texts: Any, file: str | None) -> Texts:
    """The texts as the analyses read them, checked (see `Texts.check`): a string, a list of strings or Text, a
    Texts stream, a file ('-': standard input), or the bundled samples. A string's source is "argument", as the
    CLI's TEXT; a list's k-th, "argument#k" (`attnscope.api.read_texts`)."""

    def one(item: Any, where: str, source: str) -> Text:
        if isinstance(item, Text) and isinstance(item.text, str):
            return Text(valid_text(item.text, where), item.source)
        if not isinstance(item, str):
            what = type(item.text if isinstance(item, Text) else item).__name__
            article = "an" if what[0] in "aeiou" else "a"
            raise AttnscopeError(f"{where}: expected a string or a Text of a string, not {article} {what}")
        return Text(valid_text(item, where), source)

    if texts is not None and file is not None:
        raise AttnscopeError("texts and file (TEXT, --file): give one or the other")
    if file == "-":
        gathered: Texts = read_stdin()
    elif file is not None:
        gathered = read_file(file)
    elif texts is None:
        gathered = TextList(sample_texts(), "the bundled samples")
    elif isinstance(texts, Texts):
        gathered = texts
    elif isinstance(texts, (str, Text)):
        gathered = TextList([one(texts, "the text given (TEXT)", "argument")], "the text given (TEXT)")
    elif isinstance(texts, Iterable) and not isinstance(texts, (bytes, Mapping)):
        items = [one(item, f"text {k} of the list", f"argument#{k}") for k, item in enumerate(texts)]
        gathered = TextList(items, "the texts given")
    else:
        raise AttnscopeError(f"texts: expected a string or a list of strings, not a {type(texts).__name__}")
    gathered.check()
    return gathered
