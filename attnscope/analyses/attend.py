"""Where one token looks: the attention row of one query token in every layer and head (`attnscope attend`).

    from attnscope.analyses.attend import Attend
    result = Attend("she", "doctor").run(model, [Text("The doctor said that she would help the patient.", "argument")])
    result.to_weight[layer, head]  # attention from "she" to "doctor"

Only that one row of each layer's attention is kept (L × H × n numbers), never the maps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.analyses.common import check_index, check_positive
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.pipeline import capture
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.reducers import QueryRowReducer
from attnscope.pipeline.tokens import batches, token_labels, tokenize

DEFAULT_TOKENS = 3  # top tokens listed per head
DEFAULT_TOP = 10  # strongest heads listed


def match_token(labels: Sequence[str], wanted: str, occurrence: int, role: str) -> tuple[int, list[int]]:
    """Position of the `occurrence`-th token (0-based) whose text, stripped of spaces and the BPE space marker, equals
    `wanted`; compared exactly first, then ignoring case. Returns it with all matching positions."""
    texts = [label.replace("Ġ", " ").replace("▁", " ").strip() for label in labels]
    target = wanted.strip()
    positions = [i for i, text in enumerate(texts) if text == target]
    if not positions:
        positions = [i for i, text in enumerate(texts) if text.lower() == target.lower()]
    if not positions:
        shown = " ".join(f"{i}:{text!r}" for i, text in enumerate(texts[:80])) + (" …" if len(texts) > 80 else "")
        raise AttnscopeError(f"{role} token {wanted!r} is not a token of the text; its tokens are {shown}")
    if not 0 <= occurrence < len(positions):
        raise AttnscopeError(
            f"{role} occurrence {occurrence}: {wanted!r} occurs {len(positions)} time(s) (positions {positions})"
        )
    return positions[occurrence], positions


@dataclass
class AttendResult:
    """Attention from the token at `from_position` in every layer and head.

    rows: (n_layer, n_head, n) numpy float64, the attention row of that token (keys after it weigh 0 in a causal
    model); to_weight: (n_layer, n_head) attention summed over `to_positions`, or None without a target.
    """

    model: dict[str, Any]
    settings: dict[str, Any]
    tokens: list[str]
    from_token: str
    from_position: int
    rows: np.ndarray
    to_token: str | None = None
    to_positions: list[int] = field(default_factory=list)
    to_weight: np.ndarray | None = None
    bos: bool = True
    notes: list[str] = field(default_factory=list)

    def top_keys(self, layer: int, head: int, k: int | None = None) -> list[tuple[int, float]]:
        """The `k` (default: the run's `tokens`) keys with the largest weights (ties: the earlier position first),
        as (position, weight)."""
        k = self.settings["tokens"] if k is None else k
        row = self.rows[layer, head]
        order = sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]
        return [(j, float(row[j])) for j in order]

    def strongest(self, k: int | None = None) -> list[tuple[int, int]]:
        """The `k` (default: the run's `top`) heads with the largest weight on the target (or, without one, on their
        top key), as (layer, head); ties in layer.head order."""
        k = self.settings["top"] if k is None else k
        n_layer, n_head = self.rows.shape[:2]
        weight = self.to_weight if self.to_weight is not None else self.rows.max(axis=-1)
        heads = sorted(
            ((layer, head) for layer in range(n_layer) for head in range(n_head)), key=lambda lh: (-weight[lh], lh)
        )
        return heads[:k]


@dataclass(frozen=True)
class Attend:
    """Attention from one token of a text (its `from_index`-th occurrence) in every layer and head; with
    `to_token`, the weight on that token (on all its occurrences the query can see, summed, or on the
    `to_index`-th one). `tokens` top tokens per head and the `top` strongest heads are listed."""

    from_token: str
    to_token: str | None = None
    from_index: int = 0
    to_index: int | None = None
    index: int = 0
    bos: bool | None = None
    tokens: int = DEFAULT_TOKENS
    top: int = DEFAULT_TOP

    def __post_init__(self) -> None:
        check_positive("from occurrence", self.from_index, 0)
        check_positive("to occurrence", self.to_index, 0)
        check_positive("text index", self.index, 0)
        check_positive("tokens", self.tokens)
        check_positive("top", self.top)
        if self.to_index is not None and self.to_token is None:
            raise AttnscopeError("a to occurrence needs a to token")

    def run(self, model: LoadedModel, texts: Sequence[Text], progress: Any = None) -> AttendResult:
        text = check_index(self.index, texts)
        tokenized = tokenize(model, [text], self.bos)
        notes = list(tokenized.notes)
        if len(tokenized.windows) > 1:
            notes.append("looking in the first window only")
        window = tokenized.windows[0]
        labels = token_labels(model.tokenizer, window.ids)
        position, _ = match_token(labels, self.from_token, self.from_index, "from")
        reducer = QueryRowReducer(model.kind, position)
        capture.run(model.model, batches([window], 1, model.device), reducer)
        rows = np.stack([reducer.rows[layer].double().numpy() for layer in range(model.n_layer)])  # (L, H, n)
        settings = {
            "from_index": self.from_index,
            "to_index": self.to_index,
            "tokens": self.tokens,
            "top": self.top,
            "index": self.index,
        }
        result = AttendResult(
            model.info(), settings, labels, self.from_token, position, rows, bos=tokenized.bos, notes=notes
        )
        if self.to_token is not None:
            index = 0 if self.to_index is None else self.to_index
            picked, every = match_token(labels, self.to_token, index, "to")
            chosen = [picked] if self.to_index is not None else every
            if model.kind.causal:  # a later occurrence is out of the query's sight
                chosen = [p for p in chosen if p <= position] or chosen
                if all(p > position for p in chosen):
                    raise AttnscopeError(
                        f"to token {self.to_token!r} (position {chosen[0]}) comes after from token "
                        f"{self.from_token!r} (position {position}): a causal model's token cannot attend to later "
                        "tokens"
                    )
            result.to_token = self.to_token
            result.to_positions = chosen
            result.to_weight = rows[..., chosen].sum(axis=-1)  # (L, H)
        return result
