"""Where texts come from (pipeline.inputs): argument, file, JSON lines, stdin, bundled samples; and what is
refused."""

from __future__ import annotations

import io
import sys

import pytest

from attnscope.errors import AttnscopeError
from attnscope.pipeline import inputs


def test_blank_lines_separate_texts(tmp_path):
    file = tmp_path / "corpus.txt"
    file.write_text("first text\nstill first\n\n\n  \nsecond text\n", encoding="utf-8")
    texts = inputs.gather_texts(None, str(file))
    assert [t.text for t in texts] == ["first text\nstill first", "second text"]
    assert [t.source for t in texts] == [f"{file}#0", f"{file}#1"]


def test_jsonl_text_field(tmp_path):
    file = tmp_path / "corpus.jsonl"
    file.write_text('{"text": "one", "id": 1}\n\n{"text": "two"}\n', encoding="utf-8")
    assert [t.text for t in inputs.gather_texts(None, str(file))] == ["one", "two"]


def test_a_byte_order_mark_is_not_text_and_the_suffix_ignores_case(tmp_path):
    plain = tmp_path / "notepad.txt"
    plain.write_bytes("\ufefffirst\n\nsecond".encode())
    assert [t.text for t in inputs.gather_texts(None, str(plain))] == ["first", "second"]
    upper = tmp_path / "CORPUS.JSONL"
    upper.write_bytes('\ufeff{"text": "one"}\n{"text": "two"}\n'.encode())
    assert [t.text for t in inputs.gather_texts(None, str(upper))] == ["one", "two"]


@pytest.mark.parametrize(
    "line, message",
    [('{"id": 1}', 'string "text" field'), ("not json", "not valid JSON"), ('["text"]', 'string "text" field')],
)
def test_bad_jsonl_is_a_user_error(tmp_path, line, message):
    file = tmp_path / "bad.jsonl"
    file.write_text('{"text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(AttnscopeError, match="bad.jsonl:2") as raised:
        inputs.gather_texts(None, str(file))
    assert message in str(raised.value)


def test_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a text\n\nanother")))
    texts = inputs.gather_texts("-", None)
    assert [t.text for t in texts] == ["a text", "another"]
    assert [t.source for t in texts] == ["stdin#0", "stdin#1"]


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_empty_text_is_refused(text):
    with pytest.raises(AttnscopeError, match="no text"):
        inputs.gather_texts(text, None)


def test_an_argument_is_one_text():
    assert list(inputs.gather_texts("one\n\ntwo", None)) == [inputs.Text("one\n\ntwo", "argument")]


def test_missing_and_non_utf8_files_and_folders(tmp_path):
    with pytest.raises(AttnscopeError, match="no such file"):
        inputs.gather_texts(None, str(tmp_path / "missing.txt"))
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(AttnscopeError, match="not UTF-8"):
        inputs.gather_texts(None, str(latin))
    with pytest.raises(AttnscopeError, match="is a directory"):
        inputs.gather_texts(None, str(tmp_path))
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n", encoding="utf-8")
    with pytest.raises(AttnscopeError, match="no text"):
        inputs.gather_texts(None, str(blank))


def test_text_and_file_together_is_refused(tmp_path):
    with pytest.raises(AttnscopeError, match="not both"):
        inputs.gather_texts("text", str(tmp_path / "x.txt"))


def test_samples_ship_in_the_package():
    samples = inputs.gather_texts(None, None)
    texts = [sample.text for sample in samples]
    assert "The cat sat on the mat because it was tired." in texts
    assert len(samples) >= 5 and all(sample.source.startswith("sample:") for sample in samples)
    # the passage that repeats itself, for induction heads
    assert any(
        text.count(". ") >= 1 and text[: len(text) // 2].strip() == text[len(text) // 2 :].strip() for text in texts
    )
