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

from attnscope.analyses.common import check_finite, check_index, check_positive
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.pipeline import capture
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.reducers import QueryRowReducer
from attnscope.pipeline.tokens import WindowStream, batches, token_labels

DEFAULT_TOKENS = 3  # top tokens listed per head
DEFAULT_TOP = 10  # strongest heads listed


def token_positions(labels: Sequence[str], wanted: str) -> list[int]:
    """Positions of the tokens whose text, stripped of spaces and the BPE space marker, equals `wanted`; compared
    exactly, or when nothing matches exactly, ignoring case."""
    texts = [label.replace("Ġ", " ").replace("▁", " ").strip() for label in labels]
    target = wanted.strip()
    positions = [i for i, text in enumerate(texts) if text == target]
    return positions or [i for i, text in enumerate(texts) if text.lower() == target.lower()]


def match_token(labels: Sequence[str], wanted: str, occurrence: int, role: str) -> tuple[int, list[int]]:
    """Position of the `occurrence`-th token (0-based) matching `wanted` (see `token_positions`), with all
    matching positions."""
    positions = token_positions(labels, wanted)
    if not positions:
        texts = [label.replace("Ġ", " ").replace("▁", " ").strip() for label in labels]
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
            raise AttnscopeError(
                f"to occurrence {self.to_index} picks one occurrence of the to token: give the to token too (--to)"
            )

    def run(self, model: LoadedModel, texts: Texts | Sequence[Text], progress: Any = None) -> AttendResult:
        windows = WindowStream(model, check_index(self.index, texts), self.bos)
        window, labels, position, notes = self._find_from_token(model, windows)
        reducer = QueryRowReducer(model.kind, position)
        notes += capture.run(model.model, batches([window], 1, model.device), reducer, kernel=model.kernel).notes
        rows = np.stack([reducer.rows[layer].double().numpy() for layer in range(model.n_layer)])  # (L, H, n)
        check_finite(model, "attention", rows, range(model.n_layer))
        settings = {
            "from_index": self.from_index,
            "to_index": self.to_index,
            "tokens": self.tokens,
            "top": self.top,
            "index": self.index,
        }
        result = AttendResult(
            model.info(), settings, labels, self.from_token, position, rows, bos=windows.bos, notes=notes
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

    def _find_from_token(self, model: LoadedModel, windows: WindowStream) -> tuple[Any, list[str], int, list[str]]:
        """The window holding the `from_index`-th occurrence of the from token (counted over the whole text, window
        by window), its labels, the token's position in it, and notes; the windows after it are not tokenized."""
        seen = []  # (window number, position) of the occurrences in the windows before
        first_labels = None  # the first window's labels, for the message when the token is nowhere
        stream = iter(windows)
        for number, window in enumerate(stream):
            labels = token_labels(model.tokenizer, window.ids)
            first_labels = labels if first_labels is None else first_labels
            positions = token_positions(labels, self.from_token)
            if self.from_index < len(seen) + len(positions):
                notes = windows.notes()
                if number > 0 or next(stream, None) is not None:
                    notes.append(
                        f"the text is longer than the model's context ({model.n_ctx} tokens) and is split into "
                        f"windows; from token {self.from_token!r} (occurrence {self.from_index}) is in window "
                        f"{number}, which starts at text token {window.start}: the positions shown are the window's"
                    )
                return window, labels, positions[self.from_index - len(seen)], notes
            seen += [(number, position) for position in positions]
        if not seen:
            match_token(first_labels or [], self.from_token, 0, "from")  # raises, listing the first window's tokens
        where = (
            f"positions {[position for _, position in seen]}"
            if all(number == 0 for number, _ in seen)
            else "window.position " + ", ".join(f"{number}.{position}" for number, position in seen[:20])
        )
        raise AttnscopeError(
            f"from occurrence {self.from_index}: {self.from_token!r} occurs {len(seen)} time(s) ({where})"
        )
