"""Machine-readable output: the JSON envelope every command shares, JSON and CSV text.

Every JSON document has the same top-level shape (schema_version 1):

    {"schema_version": 1, "command": "heads", "attnscope_version": "...",
     "model": {...}, "input": {...}, "settings": {...}, "notes": [...], <command-specific keys>}

Floats are rounded to 6 decimals and keys keep a fixed order, so the same command gives byte-identical output.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from typing import Any

from attnscope import __version__

SCHEMA_VERSION = 1
DECIMALS = 6


def clean(value: Any) -> Any:
    """Round floats (NaN and infinities become null: JSON has no spelling for them), recursively."""
    if isinstance(value, float):
        return round(value, DECIMALS) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(item) for item in value]
    return value


def document(command: str, model: dict, inputs: dict, settings: dict, notes: Sequence[str], **body: Any) -> dict:
    return clean(
        {
            "schema_version": SCHEMA_VERSION,
            "command": command,
            "attnscope_version": __version__,
            "model": model,
            "input": inputs,
            "settings": settings,
            "notes": list(notes),
            **body,
        }
    )


def result_document(command: str, result: Any, **body: Any) -> dict:
    """`document` of a result that holds its `model`, `inputs`, `settings` and `notes` (most commands' do)."""
    return document(command, result.model, result.inputs, result.settings, result.notes, **body)


def to_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def to_csv(records: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """One row per record, columns in the first record's key order; with no records, the header of `columns` alone
    (a CSV reader takes a header with no rows, but not an empty file), or no text when the columns are unknown."""
    buffer = io.StringIO()
    fieldnames = list(records[0]) if records else list(columns or ())
    if fieldnames:
        writer = csv.DictWriter(buffer, fieldnames=fieldnames, lineterminator="\n")
        writer.writeheader()
        writer.writerows(clean(list(records)))
    return buffer.getvalue()
