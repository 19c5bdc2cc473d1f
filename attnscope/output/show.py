"""`attnscope show`, shown: one layer's maps of one text (every head, or one head larger) as a picture, which is the
command's output; the maps as JSON and CSV; in a notebook, the report page's interactive viewer over static tables.

Reads a ShowResult (analyses.show) by duck typing: `model`, `attention` (an AttentionMap: `layer`, `maps` (H, n, n),
`labels`, `tokens`, `view`, `word_maps`, `shown()`), `head`, `index`, `bos`, `notes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import document
from attnscope.output.views import View, fitted, picture_paths, summary, words_field
from attnscope.pipeline.labels import Labels
from attnscope.scores.catalog import counted
from attnscope.scores.words import CONTINUED_LEGEND

MAX_MAP_TOKENS = 32  # a notebook's static map lists at most this many tokens (its picture, `save`, shows them all)
VIEWER_TOKENS = 256  # and its interactive viewer draws at most this many (one byte per weight in the page)


class ShowView(View):
    command = "show"
    names_files = True

    def document(self) -> dict:
        """The window's tokens (exact text, and labels as pictures show them), the view, and the maps: `maps` token
        by token always, and in the words view `words` (each word's token positions) and `word_maps`."""
        result, attention = self.result, self.result.attention
        chosen = slice(None) if result.head is None else slice(result.head, result.head + 1)
        heads = list(range(attention.maps.shape[0])) if result.head is None else [result.head]
        words = {}
        if attention.view == "words":
            words = {"words": words_field(attention.labels), "word_maps": attention.word_maps[chosen].tolist()}
        return document(
            "show",
            result.model,
            {
                "index": result.index,
                "tokens": attention.tokens,
                "n_tokens": len(attention.tokens),
                "labels": attention.labels.shown,
            },
            {
                "layer": attention.layer,
                "head": result.head,
                "index": result.index,
                "bos": result.bos,
                "words": attention.view == "words",
            },
            result.notes,
            view=attention.view,
            heads=heads,
            maps=attention.maps[chosen].tolist(),
            **words,
        )

    def records(self) -> list[dict]:
        """One row per (head, query, key) the query sees (a decoder's keys after the query are left out): tokens, or
        in the words view words (query and key are word indices, `query_word`/`key_word` their text)."""
        result, attention = self.result, self.result.attention
        heads = range(attention.maps.shape[0]) if result.head is None else [result.head]
        causal = result.model["kind"] == "decoder"
        maps, labels = attention.shown()
        kind = "word" if attention.view == "words" else "token"
        n = len(labels)
        return [
            {
                "layer": attention.layer,
                "head": head,
                "query": i,
                "key": j,
                f"query_{kind}": labels[i] if kind == "word" else attention.tokens[i],
                f"key_{kind}": labels[j] if kind == "word" else attention.tokens[j],
                "weight": float(maps[head, i, j]),
            }
            for head in heads
            for i in range(n)
            for j in range(i + 1 if causal else n)
        ]

    def data_files(self, stage: Path) -> list[Path]:
        return []  # the picture is show's output (--json and --csv print the maps)

    def figures(self) -> dict[str, Any]:
        """attention_L<layer> (every head of the layer) or attention_<L.H> (one head, larger); by word, with
        `_words` after the stem (attention_L1_words), so that a folder keeps both views."""
        return {self.stem: show_figure(self.result)}

    @property
    def stem(self) -> str:
        result, attention = self.result, self.result.attention
        stem = f"attention_L{attention.layer}" if result.head is None else f"attention_{attention.layer}.{result.head}"
        return stem + ("_words" if attention.view == "words" else "")

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        return picture_paths(written)

    def notebook(self) -> str:
        """The interactive viewer of the report page for this layer's heads and this text (`output.viewer`; its first
        VIEWER_TOKENS tokens), over a static fallback of tables (its first MAX_MAP_TOKENS tokens) that a notebook
        which runs no script shows instead."""
        from attnscope.output import viewer

        data, _ = show_viewer(self.result, VIEWER_TOKENS)
        return notebook.fragment(viewer.fragment(data, self.tables()))

    def tables(self) -> str:
        result, attention = self.result, self.result.attention
        heads = range(attention.maps.shape[0]) if result.head is None else [result.head]
        tokens = attention.tokens[:MAX_MAP_TOKENS]
        n = len(tokens)
        causal = result.model["kind"] == "decoder"
        notes = list(self.notes)
        if len(attention.tokens) > n:
            notes.append(
                f"the first {n} of {len(attention.tokens)} tokens are shown; .save(folder) draws the whole map"
            )
        labels = [f"{i} {token}" for i, token in enumerate(tokens)]
        parts = []
        for head in heads:
            weights = attention.maps[head].tolist()
            matrix = [[None if causal and j > i else weights[i][j] for j in range(n)] for i in range(n)]
            title = f"Head {attention.layer}.{head}: {result.model['name']} (rows: queries, columns: keys)"
            parts.append(notebook.grid(matrix, labels, [str(j) for j in range(n)], title, "query"))
        return notebook.note_lines(notes) + "".join(parts)

    def summary(self) -> str:
        """The model, the heads drawn, the text and its tokens (or words), and the shape of the maps."""
        result, attention = self.result, self.result.attention
        layer, n_head = attention.layer, attention.maps.shape[0]
        every = f"layer {layer} (heads {layer}.0-{layer}.{n_head - 1})"
        heads = every if result.head is None else f"head {layer}.{result.head}"
        labels = attention.labels
        words = attention.view == "words"
        counts = counted(len(labels.tokens), "token") + (f", {counted(len(labels.words), 'word')}" if words else "")
        headline = f"{result.model.get('name')}: {heads}, text {result.index} ({counts})"
        shape = " × ".join(str(size) for size in attention.maps.shape)
        by_word = ", by word in .attention.word_maps" if words else ""
        lines = [
            fitted("words: " if words else "tokens: ", labels.word_text if words else labels.shown, " "),
            f"maps ({shape}: heads × queries × keys) in .attention.maps{by_word}",
        ]
        return summary(self, headline, lines, [".attention.shown(head)"])


# -------------------------------------------------------------------------------------------------------------- figures


def show_figure(result: Any) -> Any:
    """A ShowResult: every head of the layer in a grid, or its one head, larger."""
    from attnscope.output import attention_maps

    attention = result.attention
    if result.head is not None:
        return attention_maps.head_attention(result.model, attention, result.head)
    maps, labels, hidden, subtitle = attention_maps.map_view(result.model, attention)
    heads = [f"head {attention.layer}.{head}" for head in range(maps.shape[0])]
    title = f"Attention of every head of layer {attention.layer}"
    return attention_maps.layer_grid(maps, labels, title, subtitle, heads, hidden, attention_maps.map_unit(attention))


# ------------------------------------------------------------------------------------------------------------- notebook


def show_viewer(result: Any, max_tokens: int) -> tuple[dict[str, Any], bool]:
    """The viewer data of a `show` result (one layer, every head or one, one text), its first `max_tokens` tokens;
    and whether the text was cut."""
    from attnscope.output import viewer

    attention = result.attention
    n = min(len(attention.tokens), max_tokens)
    labels = attention.labels
    if n < len(labels.tokens):  # the words wholly inside the first n tokens, then the word cut there (marked …)
        words = [word for word in labels.words if word.stop <= n]
        word_text = labels.word_text[: len(words)]
        start = words[-1].stop if words else 0
        if start < n:
            words.append(range(start, n))
            word_text.append(labels.word_text[len(word_text)] + "…")
        labels = Labels(labels.tokens[:n], labels.shown[:n], words, word_text)
    heads = list(range(attention.maps.shape[0])) if result.head is None else [result.head]
    maps = attention.maps.numpy()[heads][None, :, :n, :n]  # (1, H, n, n)
    causal = result.model["kind"] == "decoder"
    data = {
        "format": viewer.FORMAT,
        "mode": "show",
        "causal": causal,
        "layer_ids": [attention.layer],
        "head_ids": heads,
        "texts": [viewer.text_entry(f"text {result.index}", "text", labels, maps, causal, len(attention.tokens))],
        "examples": {},
        "characteristic": [],
        "continued_legend": CONTINUED_LEGEND,
        "words": attention.view == "words",
        "roles": [],
        "scores": [],
        "map_notes": [],
    }
    return data, n < len(attention.tokens)
