"""One window's full attention maps of a layer, as the analyses that draw them keep them (`show`, `heads --plot`),
and their word-by-word view. A module of its own so that each command that keeps maps shares the one type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnscope.pipeline.labels import Labels
from attnscope.scores.words import TOKENS, WORDS, word_map


@dataclass
class AttentionMap:
    """One window's full attention for one layer: maps (H, n, n) float32 on the host, with the window's labels
    (tokens, how tables and pictures show them, words); in the words view also word_maps (H, W, W) float64, each
    row the mean of a word's tokens' rows and each column the sum of its tokens' columns (`scores.words`)."""

    layer: int
    maps: Any
    labels: Labels
    text_index: int
    word_maps: Any = None

    @property
    def tokens(self) -> list[str]:
        return self.labels.tokens

    @property
    def view(self) -> str:
        return WORDS if self.word_maps is not None else TOKENS

    def shown(self, head: int | None = None) -> tuple[Any, list[str]]:
        """The maps of the view (H, K, K) numpy, or one head's (K, K), and their labels: the tokens as tables show
        them (`do`, `##ct`), or the words."""
        maps = self.word_maps if self.word_maps is not None else self.maps.numpy()
        labels = self.labels.word_text if self.word_maps is not None else self.labels.shown
        return (maps if head is None else maps[head]), labels


def with_words(attention: AttentionMap) -> AttentionMap:
    """`attention` with its word maps."""
    attention.word_maps = word_map(attention.maps.numpy(), attention.labels.words)  # (H, W, W)
    return attention
