"""Where one token looks: the attention row of one query token in every layer and head (`attnscope attend`).

    from attnscope.attend import attend
    result = attend(loaded, Text("The doctor said that she would help the patient.", "argument"), "she", "doctor")
    result.to_weight[layer, head]  # attention from "she" to "doctor"

Only that one row of each layer's attention is kept (L × H × n numbers), never the maps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope import capture
from attnscope.errors import AttnscopeError
from attnscope.inputs import Text
from attnscope.model import LoadedModel
from attnscope.tokens import batches, token_labels, tokenize

DEFAULT_TOP_TOKENS = 3


class QueryRowReducer(capture.Reducer):
    """Keeps row `position` of window 0's attention, every layer: rows[layer] is (H, n_keys) float32 on the host.
    In a causal model the keys after the query weigh exactly 0 (the capture leaves masked keys a weight of at most
    1.6e-38, see capture.LOGIT_FLOOR)."""

    wants_blocks = True

    def __init__(self, position: int, causal: bool):
        self.position = position
        self.causal = causal
        self.rows: dict[int, Any] = {}

    def add_block(self, layer: int, block: capture.AttentionBlock) -> None:
        first, last = int(block.positions[0]), int(block.positions[-1])
        if not first <= self.position <= last:
            return
        r = self.position - first
        row = block.exp_logits[0, :, r] / block.normalizer[0, :, r, None]  # (H, k)
        full = row.new_zeros(row.shape[0], block.n_keys)  # (H, n_keys): keys the block did not reach weigh 0
        full[:, : row.shape[1]] = row
        if self.causal:
            full[:, self.position + 1 :] = 0
        self.rows[layer] = full.cpu()


def match_token(labels: Sequence[str], wanted: str, occurrence: int, option: str) -> tuple[int, list[int]]:
    """Position of the `occurrence`-th token (0-based) whose text, stripped of spaces and the BPE space marker, equals
    `wanted`; compared exactly first, then ignoring case. Returns it with all matching positions."""
    texts = [label.replace("Ġ", " ").replace("▁", " ").strip() for label in labels]
    target = wanted.strip()
    positions = [i for i, text in enumerate(texts) if text == target]
    if not positions:
        positions = [i for i, text in enumerate(texts) if text.lower() == target.lower()]
    if not positions:
        shown = " ".join(f"{i}:{text!r}" for i, text in enumerate(texts[:80])) + (" …" if len(texts) > 80 else "")
        raise AttnscopeError(f"{option} {wanted!r} is not a token of the text; its tokens are {shown}")
    if not 0 <= occurrence < len(positions):
        raise AttnscopeError(
            f"{option}-index {occurrence}: {wanted!r} occurs {len(positions)} time(s) (positions {positions})"
        )
    return positions[occurrence], positions


@dataclass
class AttendResult:
    """Attention from the token at `from_position` in every layer and head.

    rows: (n_layer, n_head, n) numpy float64, the attention row of that token (keys after it weigh 0 in a causal
    model); to_weight: (n_layer, n_head) attention summed over `to_positions`, or None without a target.
    """

    model: dict[str, Any]
    tokens: list[str]
    from_token: str
    from_position: int
    rows: np.ndarray
    to_token: str | None = None
    to_positions: list[int] = field(default_factory=list)
    to_weight: np.ndarray | None = None
    bos: bool = True
    notes: list[str] = field(default_factory=list)

    def top_keys(self, layer: int, head: int, k: int = DEFAULT_TOP_TOKENS) -> list[tuple[int, float]]:
        """The `k` keys with the largest weights (ties: the earlier position first), as (position, weight)."""
        row = self.rows[layer, head]
        order = sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]
        return [(j, float(row[j])) for j in order]

    def strongest(self, k: int) -> list[tuple[int, int]]:
        """The `k` heads with the largest weight on the target (or, without one, on their top key), as (layer, head);
        ties in layer.head order."""
        n_layer, n_head = self.rows.shape[:2]
        weight = self.to_weight if self.to_weight is not None else self.rows.max(axis=-1)
        heads = sorted(((layer, head) for layer in range(n_layer) for head in range(n_head)),
                       key=lambda lh: (-weight[lh], lh))
        return heads[:k]


def attend(
    loaded: LoadedModel,
    text: Text,
    from_token: str,
    to_token: str | None = None,
    from_index: int = 0,
    to_index: int | None = None,
    bos: bool | None = None,
) -> AttendResult:
    """Attention from one token of `text` (its `from_index`-th occurrence) in every layer and head; with `to_token`,
    the weight on that token (on all its occurrences the query can see, summed, or on the `to_index`-th one)."""
    tokenized = tokenize(loaded.tokenizer, [text], loaded.n_ctx, bos)
    notes = list(tokenized.notes)
    if len(tokenized.windows) > 1:
        notes.append("looking in the first window only")
    window = tokenized.windows[0]
    labels = token_labels(loaded.tokenizer, window.ids)
    position, _ = match_token(labels, from_token, from_index, "--from")
    reducer = QueryRowReducer(position, loaded.causal)
    capture.run(loaded.model, batches([window], 1, loaded.device), reducer)
    rows = np.stack([reducer.rows[layer].double().numpy() for layer in range(loaded.n_layer)])  # (L, H, n)
    result = AttendResult(loaded.info(), labels, from_token, position, rows, bos=tokenized.bos, notes=notes)
    if to_token is not None:
        picked, every = match_token(labels, to_token, 0 if to_index is None else to_index, "--to")
        chosen = [picked] if to_index is not None else every
        if loaded.causal:  # a later occurrence is out of the query's sight
            chosen = [p for p in chosen if p <= position] or chosen
        if loaded.causal and all(p > position for p in chosen):
            raise AttnscopeError(
                f"--to {to_token!r} (position {chosen[0]}) comes after --from {from_token!r} (position {position}): "
                "a causal model's token cannot attend to later tokens"
            )
        result.to_token = to_token
        result.to_positions = chosen
        result.to_weight = rows[..., chosen].sum(axis=-1)  # (L, H)
    return result
