"""Stage 1: where the texts come from (an argument, a file, stdin, or the bundled samples).

Pure Python, no torch: the CLI can validate inputs before paying for a model load.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from attnscope.errors import AttnscopeError


@dataclass(frozen=True)
class Text:
    """One input text and where it came from (`source` is shown in tables and written to JSON)."""

    text: str
    source: str


def sample_texts() -> list[Text]:
    """The bundled sample texts, one per file of `attnscope/sample_texts/`, in file-name order."""
    folder = resources.files("attnscope") / "sample_texts"
    entries = sorted((entry for entry in folder.iterdir() if entry.name.endswith(".txt")), key=lambda e: e.name)
    return [Text(entry.read_text(encoding="utf-8").strip(), f"sample:{entry.name}") for entry in entries]


def split_blank_lines(content: str) -> list[str]:
    """Texts separated by one or more blank lines; whitespace-only chunks are dropped."""
    chunks, current = [], []
    for line in content.splitlines():
        if line.strip():
            current.append(line)
        elif current:
            chunks.append("\n".join(current))
            current = []
    if current:
        chunks.append("\n".join(current))
    return chunks


def parse_jsonl(content: str, name: str) -> list[str]:
    """The `text` field of every non-empty line of a JSON-lines file."""
    texts = []
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise AttnscopeError(f"{name}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise AttnscopeError(f'{name}:{number}: expected an object with a string "text" field')
        texts.append(record["text"])
    return texts


def _decode(data: bytes, name: str) -> str:
    """UTF-8 text; a byte-order mark (Windows editors write one) is not part of the text."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise AttnscopeError(f"{name} is not UTF-8 text (byte {error.start} cannot be decoded)") from None


def read_file(path: str) -> list[Text]:
    """Texts from a file: `.jsonl` takes each line's `text` field, anything else is split on blank lines."""
    file = Path(path)
    if not file.exists():
        raise AttnscopeError(f"no such file: {path}")
    if file.is_dir():
        raise AttnscopeError(f"{path} is a directory, not a text file")
    try:
        content = _decode(file.read_bytes(), path)
    except OSError as error:
        raise AttnscopeError(f"cannot read {path}: {error.strerror}") from None
    chunks = parse_jsonl(content, path) if file.suffix.lower() == ".jsonl" else split_blank_lines(content)
    return [Text(chunk, f"{path}#{index}") for index, chunk in enumerate(chunks)]


def read_stdin() -> list[Text]:
    """Texts from standard input, split on blank lines like a plain text file."""
    content = _decode(sys.stdin.buffer.read(), "standard input")
    return [Text(chunk, f"stdin#{index}") for index, chunk in enumerate(split_blank_lines(content))]


def gather_texts(text: str | None, file: str | None) -> list[Text]:
    """Resolve the CLI's input options: TEXT, `-` (stdin), `--file`, or the bundled samples when none is given."""
    if text is not None and file is not None:
        raise AttnscopeError("give either a TEXT argument or --file, not both")
    if file is not None:
        texts = read_file(file)
        where = file
    elif text == "-":
        texts = read_stdin()
        where = "standard input"
    elif text is not None:
        texts = [Text(text, "argument")] if text.strip() else []
        where = "the TEXT argument"
    else:
        return sample_texts()
    texts = [item for item in texts if item.text.strip()]
    if not texts:
        raise AttnscopeError(f"{where} holds no text (it is empty or only whitespace)")
    return texts
