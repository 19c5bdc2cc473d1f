"""Where texts come from: argument, file, JSON lines, stdin, bundled samples; and what is refused."""

import io
import sys

import pytest

from attnscope import inputs
from attnscope.errors import AttnscopeError


def test_blank_lines_separate_texts(tmp_path):
    file = tmp_path / "corpus.txt"
    file.write_text("first text\nstill first\n\n\n  \nsecond text\n", encoding="utf-8")
    texts = inputs.gather_texts(None, str(file))
    assert [t.text for t in texts] == ["first text\nstill first", "second text"]


def test_jsonl_text_field(tmp_path):
    file = tmp_path / "corpus.jsonl"
    file.write_text('{"text": "one", "id": 1}\n\n{"text": "two"}\n', encoding="utf-8")
    assert [t.text for t in inputs.gather_texts(None, str(file))] == ["one", "two"]


def test_a_byte_order_mark_is_not_text_and_the_suffix_ignores_case(tmp_path):
    plain = tmp_path / "notepad.txt"
    plain.write_bytes("\ufefffirst\n\nsecond".encode("utf-8"))
    assert [t.text for t in inputs.gather_texts(None, str(plain))] == ["first", "second"]
    upper = tmp_path / "CORPUS.JSONL"
    upper.write_bytes('\ufeff{"text": "one"}\n{"text": "two"}\n'.encode("utf-8"))
    assert [t.text for t in inputs.gather_texts(None, str(upper))] == ["one", "two"]


@pytest.mark.parametrize("line", ['{"id": 1}', "not json", '["text"]'])
def test_bad_jsonl_is_a_user_error(tmp_path, line):
    file = tmp_path / "bad.jsonl"
    file.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(AttnscopeError, match="bad.jsonl:1"):
        inputs.gather_texts(None, str(file))


def test_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("a text\n\nanother".encode())))
    assert [t.text for t in inputs.gather_texts("-", None)] == ["a text", "another"]


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_empty_text_is_refused(text):
    with pytest.raises(AttnscopeError, match="no text"):
        inputs.gather_texts(text, None)


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(AttnscopeError, match="no such file"):
        inputs.gather_texts(None, str(tmp_path / "missing.txt"))
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(AttnscopeError, match="not UTF-8"):
        inputs.gather_texts(None, str(latin))


def test_text_and_file_together_is_refused(tmp_path):
    with pytest.raises(AttnscopeError, match="not both"):
        inputs.gather_texts("text", str(tmp_path / "x.txt"))


def test_samples_ship_in_the_package():
    samples = inputs.gather_texts(None, None)
    texts = [sample.text for sample in samples]
    assert "The cat sat on the mat because it was tired." in texts
    assert len(samples) >= 5 and all(sample.source.startswith("sample:") for sample in samples)
    repeated = next(text for text in texts if text.count(". ") >= 1 and text[: len(text) // 2].strip() == text[len(text) // 2 :].strip())
    assert repeated  # the passage that repeats itself, for induction heads
