"""The interactive attention viewer of the report page and of `show` in a notebook: the data it reads, encoded
compactly, and its code (`viewer.js`, `viewer.css` beside this file: no library, nothing fetched, no `eval`).

Encodings (decoded by viewer.js; the tests decode them independently):

- maps: per text, one byte per cell, layer-major, then head, then the cells of the map row by row: a decoder's lower
  triangle (row i holds keys 0..i; the keys after a query are not stored, so they can never pass for a weight of
  0), an encoder's whole square. A weight a of a map whose largest weight is s (`scale`, one per head and text) is
  stored as q = round(255 · sqrt(a / s)) and read back as s · (q / 255)²: the square root spends the levels on the
  small weights a broad head is made of (a weight of 0.01 is read back within 0.0008, one of 0.25 within 0.004).
- several models (a report of several): each model after the first has, per text, its own `maps` and `scale` in the
  same layout (`models[m].maps[t]`); the first model's are the text's own.
- matrices (diversity): the pairs i < j of a symmetric (K, K) matrix with values in [0, 1], row by row, as
  little-endian uint16 (value · 65535), read back within 1/131070.

Both are base64 text inside the page's `<script type="application/json">`. The data of each page is built in its
command's room: `output.report.report_viewer` (the report page), `output.show.show_viewer` (`show` in a notebook).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.scores.catalog import ROLES, scores_for

HERE = Path(__file__).parent
LEVELS = 255  # a map cell's levels (uint8)
MATRIX_LEVELS = 65535  # a matrix cell's (uint16)
FORMAT = 1  # the viewer data's layout version


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def base64_text(data: bytes) -> str:
    """Bytes as the page's JSON carries them (base64 text)."""
    return _base64(data)


def _scale(value: float) -> float:
    """A map's scale as the JSON carries it (6 significant digits), so that the page decodes with the number the
    cells were encoded with."""
    return float(f"{value:.6g}") if value > 0 else 1.0


def encode_maps(maps: Any, causal: bool) -> tuple[bytes, np.ndarray]:
    """Maps (..., n, n) -> (bytes, scales (...)): each map's cells (a causal map's lower triangle, row by row; an
    encoder's square) as round(255 · sqrt(a / s)), s its largest weight."""
    values = np.asarray(maps, dtype=np.float64)  # (..., n, n)
    n = values.shape[-1]
    scales = np.vectorize(_scale, otypes=[np.float64])(values.max(axis=(-2, -1)))  # (...)
    if causal:
        rows, columns = np.tril_indices(n)  # row-major: (0,0), (1,0), (1,1), (2,0) ...
        cells = values[..., rows, columns]  # (..., n(n+1)/2)
    else:
        cells = values.reshape(*values.shape[:-2], n * n)  # (..., n²)
    share = np.clip(cells / scales[..., None], 0.0, 1.0)
    codes = np.rint(LEVELS * np.sqrt(share)).astype(np.uint8)
    return codes.tobytes(), scales


def encode_matrix(matrix: Any) -> str:
    """The pairs i < j of a symmetric matrix with values in [0, 1], row by row, as base64 of little-endian
    uint16."""
    values = np.asarray(matrix, dtype=np.float64)
    rows, columns = np.triu_indices(values.shape[0], k=1)
    codes = np.rint(np.clip(values[rows, columns], 0.0, 1.0) * MATRIX_LEVELS).astype("<u2")
    return _base64(codes.tobytes())


def text_entry(name: str, kind: str, labels: Any, maps: Any, causal: bool, length: int | None = None) -> dict[str, Any]:
    """One text of the viewer: its labels, words and maps (L, H, n, n) encoded (see the module docstring)."""
    data, scales = encode_maps(maps, causal)
    n = len(labels.tokens)
    return {
        "name": name,
        "kind": kind,
        "n": n,
        "length": n if length is None else length,
        "tokens": labels.tokens,
        "labels": labels.shown,
        "words": [[word.start, word.stop] for word in labels.words],
        "word_text": labels.word_text,
        "scale": scales.tolist(),
        "maps": _base64(data),
    }


def catalog_entries(kind: str, thresholds: dict[str, float]) -> dict[str, Any]:
    """The roles (colour, deciding score, threshold, rule, description) and the scores (label, unit,
    description) of this kind of model, for the page to explain in words."""
    roles = [
        {
            "name": role.name,
            "short": role.short,
            "colour": role.colour,
            "ink": role.ink,
            "score": role.score,
            "threshold": thresholds.get(role.name),
            "rule": role.rule,
            "description": role.description,
        }
        for role in ROLES
        if role.score is None or role.name in thresholds
    ]
    scores = [
        {
            "name": score.name,
            "label": score.label,
            "short": score.short,
            "unit": score.unit,
            "description": score.description,
            "per_head": score.per_head,
        }
        for score in scores_for(kind)
    ]
    return {"roles": roles, "scores": scores}


def script_json(data: Any) -> str:
    """JSON for a `<script type="application/json">` element: `</` escaped so that no text can end the element
    early; the JSON stays valid and the same."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")


def code() -> str:
    """The viewer's script (one function, `attnscopeViewer(root, data)`, then the call for its own root)."""
    return (HERE / "viewer.js").read_text(encoding="utf-8")


def style() -> str:
    """The viewer's style sheet: every rule under `.asv`, so that a notebook's page is left alone."""
    return (HERE / "viewer.css").read_text(encoding="utf-8")


def fragment(viewer: dict[str, Any], fallback: str, documents: dict[str, Any] | None = None) -> str:
    """A self-contained viewer for a notebook: the data, the script that draws it, and `fallback` (static HTML) shown
    until the script runs (a notebook that does not run scripts shows only the fallback)."""
    data = {**(documents or {}), "viewer": viewer}
    return (
        f'<div class="asv asv-fragment"><style>{style()}</style>'
        f'<div class="asv-fallback">{fallback}</div>'
        '<div class="asv-panel" data-viewer="head" tabindex="0"></div>'
        f'<script type="application/json" class="asv-data">{script_json(data)}</script>'
        f"<script>{code()}</script></div>"
    )
