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


def test_pairs_of_one_length_fill_a_pass_of_copies_unless_a_batch_size_is_given():
    """patch ran 8 pairs per batch (the windows' default) whatever their length: 1,000 IOI pairs of 15 tokens made
    125 batches, each 2 × layers passes of 9 copies × 8 pairs × 15 tokens (1,080 of a pass's 8,192). By default a
    batch now holds as many pairs of one length as let `copies` copies of it fill MAX_COPY_TOKENS (8,192 // (9 × 15)
    = 60 of them), within max_tokens; a batch size given still caps it."""
    lengths = [15] * 130 + [16, 15, 200]
    groups = prompt_pairs.length_groups(lengths, None, 16384, copies=9)
    assert groups[0] == [132] and groups[1] == [130]  # longest first; 9 copies of one 200-token pair pass 8,192
    assert [len(group) for group in groups[2:]] == [60, 60, 11]
    assert groups[2][:3] == [0, 1, 2] and groups[-1][-1] == 131  # in the file's order within a length
    assert [len(group) for group in prompt_pairs.length_groups(lengths, 8, 16384, copies=9)[2:5]] == [8, 8, 8]
    assert [len(group) for group in prompt_pairs.length_groups(lengths, None, 300, copies=9)[2:4]] == [20, 20]
