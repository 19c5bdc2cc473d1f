"""The prompt pairs of `attnscope patch`: one pair from its options, or several from a JSON-lines file (or standard
input), each line an object with the string fields clean, corrupt, answer and wrong (other fields are ignored).

Read whole and checked before any model loads: a pair file is small (a few thousand pairs are far more than a patch
run can take: each pair runs the model twice per head), so it is read at once, up to MAX_PAIR_BYTES, and refused in
one line naming the file and the line where it is not what it should be. Pure Python, no torch.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from typing import Any

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.pipeline.inputs import json_line, valid_text

FIELDS = ("clean", "corrupt", "answer", "wrong")
MAX_PAIR_BYTES = 64 * 2**20  # far beyond any set of pairs a patch run can take in a day


@dataclass(frozen=True)
class PromptPair:
    """A clean prompt, its corrupted twin, the token the clean one predicts and the one it is measured against, as
    the user wrote them; `source` names the pair in messages and in the JSON (`the pair given`, `pairs.jsonl:3`)."""

    clean: str
    corrupt: str
    answer: str
    wrong: str
    source: str


def given_pair(clean: str, corrupt: str, answer: str, wrong: str) -> list[PromptPair]:
    """The one pair of the options (already checked as non-empty strings by the settings)."""
    where = "the pair given"
    values = (clean, corrupt, answer, wrong)
    return [PromptPair(*(valid_text(value, name) for name, value in zip(FIELDS, values, strict=True)), where)]


def read_pairs(file: str) -> list[PromptPair]:
    """The pairs of a JSON-lines file ('-': standard input), in order; blank lines are skipped."""
    name = "standard input" if file == "-" else file
    text = _decoded(_raw(file), name)
    pairs = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            pairs.append(_pair(line, f"{name}:{number}"))
    if not pairs:
        raise AttnscopeError(f"{name} holds no pair: give one JSON object per line with clean, corrupt, answer, wrong")
    return pairs


def _raw(file: str) -> bytes:
    """The bytes of `file` (or of standard input), refused past MAX_PAIR_BYTES; a directory, a device or a socket is
    refused, a named pipe read."""
    if file == "-":
        if sys.stdin is None or sys.stdin.closed:
            raise AttnscopeError("standard input is closed: there is no pair to read from '-'")
        return _bounded(sys.stdin.buffer, "standard input")
    try:
        mode = os.stat(file).st_mode
    except FileNotFoundError:
        raise AttnscopeError(f"no such file: {file}") from None
    except OSError as error:
        raise AttnscopeError(f"cannot read {file}: {error.strerror or error}") from None
    if stat.S_ISDIR(mode):
        raise AttnscopeError(f"{file} is a directory, not a file of pairs")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise AttnscopeError(f"{file} is not a regular file (a device or a socket); give a JSON-lines file of pairs")
    try:
        with open(file, "rb") as stream:
            return _bounded(stream, file)
    except OSError as error:
        raise AttnscopeError(f"cannot read {file}: {error.strerror or error}") from None


def _bounded(stream: Any, name: str) -> bytes:
    data = stream.read(MAX_PAIR_BYTES + 1)
    if len(data) > MAX_PAIR_BYTES:
        raise AttnscopeError(
            f"{name} holds more than {MAX_PAIR_BYTES // 2**20} MiB: that is not a file of prompt pairs (each pair runs "
            "the model twice per head)"
        )
    return data


def _decoded(data: bytes, name: str) -> str:
    """UTF-8 text (a byte-order mark at the start is not text), line ends as `\\n`; a NUL byte or a byte that is not
    UTF-8 is refused, named by its offset."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise AttnscopeError(f"{name} looks like a binary file (a NUL byte at byte {nul}), not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise AttnscopeError(f"{name} is not UTF-8 text (byte {error.start} cannot be decoded)") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _pair(line: str, where: str) -> PromptPair:
    record = json_line(line, where)
    expected = 'expected an object with the string fields "clean", "corrupt", "answer" and "wrong"'
    if not isinstance(record, dict):
        raise AttnscopeError(f"{where}: {expected}")
    missing = [field for field in FIELDS if field not in record]
    if missing:
        raise AttnscopeError(f"{where}: {expected}; {' and '.join(repr(field) for field in missing)} missing")
    values = []
    for field in FIELDS:
        value = options.TEXT.check(record[field], f'{where}: the "{field}" field')
        values.append(valid_text(value, f'{where}: the "{field}" field'))
    return PromptPair(*values, where)
