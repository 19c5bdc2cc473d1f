"""Where texts come from (pipeline.inputs): argument, file, JSON lines, stdin, bundled samples; and what is
refused."""

from __future__ import annotations

import io
import os
import random
import sys
import threading

import pytest

from attnscope import api
from attnscope.errors import AttnscopeError
from attnscope.pipeline import inputs, reading


def test_blank_lines_separate_texts(tmp_path):
    file = tmp_path / "corpus.txt"
    file.write_text("first text\nstill first\n\n\n  \nsecond text\n", encoding="utf-8")
    texts = api.read_texts(None, str(file))
    assert [t.text for t in texts] == ["first text\nstill first", "second text"]
    assert [t.source for t in texts] == [f"{file}#0", f"{file}#1"]


def test_jsonl_text_field(tmp_path):
    file = tmp_path / "corpus.jsonl"
    file.write_text('{"text": "one", "id": 1}\n\n{"text": "two"}\n', encoding="utf-8")
    assert [t.text for t in api.read_texts(None, str(file))] == ["one", "two"]


def test_a_byte_order_mark_is_not_text_and_the_suffix_ignores_case(tmp_path):
    plain = tmp_path / "notepad.txt"
    plain.write_bytes("\ufefffirst\n\nsecond".encode())
    assert [t.text for t in api.read_texts(None, str(plain))] == ["first", "second"]
    upper = tmp_path / "CORPUS.JSONL"
    upper.write_bytes('\ufeff{"text": "one"}\n{"text": "two"}\n'.encode())
    assert [t.text for t in api.read_texts(None, str(upper))] == ["one", "two"]


@pytest.mark.parametrize(
    "line, message",
    [('{"id": 1}', 'string "text" field'), ("not json", "not valid JSON"), ('["text"]', 'string "text" field')],
)
def test_bad_jsonl_is_a_user_error(tmp_path, line, message):
    file = tmp_path / "bad.jsonl"
    file.write_text('{"text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(AttnscopeError, match="bad.jsonl:2") as raised:
        api.read_texts(None, str(file))
    assert message in str(raised.value)


def test_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a text\n\nanother")))
    texts = api.read_texts(None, "-")
    assert [t.text for t in texts] == ["a text", "another"]
    assert [t.source for t in texts] == ["stdin#0", "stdin#1"]


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_empty_text_is_refused(text):
    with pytest.raises(AttnscopeError, match="no text"):
        api.read_texts(text, None)


def test_an_argument_is_one_text():
    assert list(api.read_texts("one\n\ntwo", None)) == [inputs.Text("one\n\ntwo", "argument")]


def test_missing_and_non_utf8_files_and_folders(tmp_path):
    with pytest.raises(AttnscopeError, match="no such file"):
        api.read_texts(None, str(tmp_path / "missing.txt"))
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(AttnscopeError, match="not UTF-8"):
        api.read_texts(None, str(latin))
    with pytest.raises(AttnscopeError, match="is a directory"):
        api.read_texts(None, str(tmp_path))
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n", encoding="utf-8")
    with pytest.raises(AttnscopeError, match="no text"):
        api.read_texts(None, str(blank))


def test_text_and_file_together_is_refused(tmp_path):
    with pytest.raises(AttnscopeError, match=r"texts and file \(TEXT, --file\): give one or the other"):
        api.read_texts("text", str(tmp_path / "x.txt"))


def test_samples_ship_in_the_package():
    samples = api.read_texts(None, None)
    texts = [sample.text for sample in samples]
    assert "The cat sat on the mat because it was tired." in texts
    assert len(samples) >= 5 and all(sample.source.startswith("sample:") for sample in samples)
    # the passage that repeats itself, for induction heads
    assert any(
        text.count(". ") >= 1 and text[: len(text) // 2].strip() == text[len(text) // 2 :].strip() for text in texts
    )


# ------------------------------------------------------------------------------------------------- streaming


def _split_whole(content: str) -> list[str]:
    """The definition, on a whole string: texts are runs of lines with a non-space character, joined by \\n."""
    texts, current = [], []
    for line in content.split("\n"):
        if line.strip():
            current.append(line)
        elif current:
            texts.append("\n".join(current))
            current = []
    if current:
        texts.append("\n".join(current))
    return texts


def _split_in_blocks(content: str, size: int) -> list[str]:
    pieces: dict[int, list[str]] = {}
    blocks = (content[i : i + size] for i in range(0, len(content), size))
    for index, piece in reading._split_blank_lines(blocks):
        pieces.setdefault(index, []).append(piece)
    assert list(pieces) == list(range(len(pieces)))  # texts numbered in order, pieces of a text together
    return ["".join(parts) for parts in pieces.values()]


def test_splitting_a_stream_of_blocks_agrees_with_the_whole_string_wherever_the_blocks_end():
    rng = random.Random(0)
    alphabet = ["a", "b", " ", "\n", "\t", "  ", "\n\n", "x y", "\n \n"]
    for _ in range(3000):
        content = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        expected = _split_whole(content)
        for size in (1, 2, 3, 5, 64):
            assert _split_in_blocks(content, size) == expected, (content, size)


def test_a_long_white_space_line_is_not_held_back(monkeypatch):
    """Only a line that may still be blank is held; past LONGEST_BLANK_LINE characters it is text."""
    monkeypatch.setattr(reading, "LONGEST_BLANK_LINE", 10)
    assert _split_in_blocks("a\n" + " " * 30 + "\n\nb", 4) == ["a\n" + " " * 30, "b"]
    assert _split_in_blocks("a\n" + " " * 5 + "\n\nb", 4) == ["a", "b"]  # short: still a blank line


def test_a_file_streams_in_blocks_with_the_same_texts(tmp_path, monkeypatch):
    content = "first text\r\nstill first\n\n\n  \nsecond ☕ text\n" + "third " * 50 + "\n"
    file = tmp_path / "corpus.txt"
    file.write_bytes(("\ufeff" + content).encode())  # a byte-order mark, Windows line ends, a 3-byte character
    whole = [t.text for t in api.read_texts(None, str(file))]
    monkeypatch.setattr(reading, "BLOCK_BYTES", 3)  # blocks end inside characters and inside line ends
    assert [t.text for t in api.read_texts(None, str(file))] == whole
    assert whole == ["first text\nstill first", "second ☕ text\n" + "third " * 50]


def test_pieces_of_a_long_line_are_bounded_by_the_block(tmp_path, monkeypatch):
    monkeypatch.setattr(reading, "BLOCK_BYTES", 100)
    file = tmp_path / "line.txt"
    file.write_text("word " * 1000, encoding="utf-8")
    texts = api.read_texts(None, str(file))
    pieces = list(texts.pieces())
    assert {piece.index for piece in pieces} == {0} and len(pieces) >= 50
    assert max(len(piece.text) for piece in pieces) <= 100
    assert "".join(piece.text for piece in pieces) == "word " * 1000


def test_the_share_read_grows_to_one(tmp_path, monkeypatch):
    monkeypatch.setattr(reading, "BLOCK_BYTES", 64)
    file = tmp_path / "corpus.txt"
    file.write_text("\n\n".join(f"text number {k}" for k in range(10_000)), encoding="utf-8")  # 170 KB
    texts = api.read_texts(None, str(file))
    shares = [texts.share() for _ in texts.pieces()]
    assert shares == sorted(shares) and 0 < shares[0] < 0.5 and texts.share() == 1.0


def test_a_bad_byte_is_named_by_its_offset_in_the_file(tmp_path, monkeypatch):
    file = tmp_path / "late.txt"
    data = "\ufeffgood text ☕\n\n".encode() + b"x" * 300 + b"\xff rest"
    file.write_bytes(data)
    monkeypatch.setattr(reading, "BLOCK_BYTES", 7)  # the bad byte, and the 3-byte character, in a later block
    bad = data.index(b"\xff")
    with pytest.raises(AttnscopeError, match=f"byte {bad} cannot be decoded"):
        api.read_texts(None, str(file))


def test_a_binary_file_is_refused_before_anything_runs(tmp_path):
    file = tmp_path / "image.txt"
    file.write_bytes(b"GIF89a\x00\x01\x02")
    with pytest.raises(AttnscopeError, match=r"binary file \(a NUL byte at byte 6\)"):
        api.read_texts(None, str(file))


def test_a_device_is_refused_and_a_named_pipe_is_read_once(tmp_path):
    with pytest.raises(AttnscopeError, match="not a regular file"):
        api.read_texts(None, "/dev/zero")  # endless: it must not be read at all
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    writer = threading.Thread(target=lambda: pipe.write_text("one\n\ntwo\n", encoding="utf-8"))
    writer.start()
    texts = api.read_texts(None, str(pipe))
    writer.join()
    assert [t.text for t in texts] == ["one", "two"] and [t.text for t in texts] == ["one", "two"]  # read again


@pytest.mark.parametrize(
    "record, where",
    [('{"text": "a\\ud800b"}', r"U\+D800"), ('{"text": "fine \\udfff"}', r"U\+DFFF")],
)
def test_a_lone_surrogate_in_json_lines_is_refused(tmp_path, record, where):
    file = tmp_path / "bad.jsonl"
    file.write_text('{"text": "fine"}\n' + record + "\n", encoding="utf-8")
    with pytest.raises(AttnscopeError, match=f'bad.jsonl:2: the "text" field is not valid text.*{where}'):
        api.read_texts(None, str(file))


def test_invalid_utf8_in_the_argument_is_refused():
    argument = b"The cat \xff\xfe sat".decode("utf-8", "surrogateescape")  # what Python makes of such an argv
    with pytest.raises(AttnscopeError, match=r"the text given \(TEXT\) is not valid text: byte 0xff at character 8"):
        api.read_texts(argument, None)


def test_a_closed_stdin_is_a_user_error(monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(AttnscopeError, match="standard input is closed"):
        api.read_texts(None, "-")


def test_one_text_of_a_stream_and_an_index_out_of_range(tmp_path):
    file = tmp_path / "corpus.txt"
    file.write_text("zero\n\none\n\ntwo", encoding="utf-8")
    texts = api.read_texts(None, str(file))
    assert list(inputs.OneText(texts, 1)) == [inputs.Text("one", f"{file}#1")]
    with pytest.raises(AttnscopeError, match=r"text index 3 is out of range \(3 texts given\)"):
        inputs.OneText(texts, 3).check()
