"""The prompt pairs of `patch`: a JSON-lines file (or standard input) read whole and checked before any model
loads, every mistake one line naming the file and the line; the settings' rules between --clean/--corrupt/--answer/
--wrong and --file."""

from __future__ import annotations

import io
import json
import sys

import pytest

from attnscope import settings
from attnscope.errors import AttnscopeError
from attnscope.pipeline import prompt_pairs
from attnscope.pipeline.prompt_pairs import PromptPair, read_pairs

PAIR = {"clean": "a b c", "corrupt": "a x c", "answer": "d", "wrong": "e"}


def _file(tmp_path, data: bytes | str, name: str = "pairs.jsonl"):
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return str(path)


def test_each_line_is_a_pair_in_order_blank_lines_and_other_fields_aside(tmp_path):
    second = PAIR | {"clean": "f g", "id": 7}
    path = _file(tmp_path, "\ufeff" + json.dumps(PAIR) + "\r\n\n  \n" + json.dumps(second))
    assert read_pairs(path) == [
        PromptPair("a b c", "a x c", "d", "e", f"{path}:1"),
        PromptPair("f g", "a x c", "d", "e", f"{path}:4"),
    ]


def test_standard_input_is_read_as_a_file(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(PAIR).encode())))
    assert read_pairs("-") == [PromptPair("a b c", "a x c", "d", "e", "standard input:1")]


@pytest.mark.parametrize(
    "data, message",
    [
        (json.dumps({k: v for k, v in PAIR.items() if k != "wrong"}), ":1: expected an object with the string fields"),
        (json.dumps({"clean": "a"}), "'corrupt' and 'answer' and 'wrong' missing"),
        (json.dumps(PAIR) + "\n" + json.dumps(PAIR | {"answer": 5}), ':2: the "answer" field 5: expected a string'),
        (json.dumps(PAIR | {"answer": "  "}), ":1: the \"answer\" field '  ': expected a non-empty string"),
        (json.dumps(PAIR | {"answer": "\ud800"}), "is not valid text"),
        ("[1, 2]", ":1: expected an object"),
        ("{not json", ":1: not valid JSON"),
        ("\n\n", "holds no pair"),
        (b"\xff\xfe", "is not UTF-8 text (byte 0 cannot be decoded)"),
        (b'{"clean": "a\0"}', "looks like a binary file (a NUL byte at byte 12)"),
    ],
)
def test_a_file_that_is_not_pairs_is_one_line_naming_the_line(tmp_path, data, message):
    with pytest.raises(AttnscopeError) as raised:
        read_pairs(_file(tmp_path, data))
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_what_is_no_file_of_pairs_is_refused(tmp_path, monkeypatch):
    with pytest.raises(AttnscopeError, match="^no such file: "):
        read_pairs(str(tmp_path / "missing.jsonl"))
    with pytest.raises(AttnscopeError, match="is a directory, not a file of pairs$"):
        read_pairs(str(tmp_path))
    monkeypatch.setattr(prompt_pairs, "MAX_PAIR_BYTES", 10)
    with pytest.raises(AttnscopeError, match="holds more than 0 MiB"):
        read_pairs(_file(tmp_path, json.dumps(PAIR)))


@pytest.mark.parametrize(
    "given, message",
    [
        ({"clean": "a", "corrupt": "b", "answer": "c"}, "^wrong \\(--wrong\\): a pair needs clean, corrupt, answer"),
        ({}, "^no pair to patch: give one with clean, corrupt, answer and wrong \\(--clean, .*\\), or pairs in"),
        (PAIR | {"file": "p.jsonl"}, "^clean, .* and file \\(.* --file\\): give one pair with --clean.* or pairs in"),
        (PAIR | {"answer": ""}, "^answer '': expected a non-empty string"),
    ],
)
def test_one_pair_or_a_file_of_them(given, message):
    with pytest.raises(AttnscopeError, match=message):
        settings.Patch(**given)
    assert settings.Patch(file="pairs.jsonl").file == "pairs.jsonl" and settings.Patch(**PAIR).needs_lm_head
