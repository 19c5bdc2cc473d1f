"""`attnscope show`: full attention maps of a few layers for one text, for pictures (the maps' type is
`analyses.maps`'s, which `heads --plot` shares).

Only the layers asked for are kept, for one window, on the host; the capture reduces nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from attnscope import options, settings
from attnscope.analyses.common import check_finite, check_index
from attnscope.analyses.maps import AttentionMap, with_words
from attnscope.analyses.result import Result
from attnscope.models.loading import LoadedModel
from attnscope.output.show import ShowView
from attnscope.pipeline import capture
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.labels import label_window
from attnscope.pipeline.tokens import WindowStream, batches, pad_id


def attention_maps(
    model: LoadedModel, text: Text | Texts, layers: Sequence[int], bos: bool | None = None, words: bool = False
) -> tuple[dict[int, AttentionMap], list[str]]:
    """Full attention maps of `layers` for one text (its first window when it is longer than the context), from
    one forward pass: layer -> AttentionMap (with its word maps when `words`), and notes. Only the text's first
    window is tokenized."""
    for layer in layers:
        settings.check_layer(layer, model.n_layer)
    windows = WindowStream(model, [text] if isinstance(text, Text) else text, bos)
    first = list(islice(windows, 2))  # a second window only says that there are more
    notes = windows.notes()
    if len(first) > 1:
        notes.append(
            f"the text is longer than the model's context ({model.n_ctx} tokens) and is split into windows: showing "
            "its first window only"
        )
    captured = capture.run(
        model.model,
        batches(first[:1], 1, model.device, pad_id(model.tokenizer)),
        None,
        keep_layers=layers,
        keep_window=0,
        kernel=model.kernel,
    )
    notes += captured.notes
    labels = label_window(model.tokenizer, first[0].ids)
    kept = {layer: AttentionMap(layer, captured.maps[layer], labels, 0) for layer in layers}
    return {layer: with_words(attention) if words else attention for layer, attention in kept.items()}, notes


@dataclass(repr=False)  # the repr is Result's: a summary
class ShowResult(Result):
    """`attnscope show`: one layer's maps (every head, or `head` alone) for the text at `index`, token by token or
    (`attention.view` "words") word by word."""

    view_class = ShowView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    model: dict[str, Any]
    attention: AttentionMap
    head: int | None
    index: int
    bos: bool | None
    notes: list[str] = field(default_factory=list)

    @property
    def head_labels(self) -> list[str]:
        """The heads shown, as `L.H` labels: every head of the layer, or `head` alone."""
        heads = range(self.attention.maps.shape[0]) if self.head is None else [self.head]
        return [f"{self.attention.layer}.{head}" for head in heads]


class Show(settings.Show):
    """The maps of layer `layer` (one head with `head`) of the `index`-th text; with `words`, also word by word."""

    def run(self, model: LoadedModel, texts: Texts | Sequence[Text], progress: Any = None) -> ShowResult:
        self.check_shape(model.shape)
        text = check_index(self.index, texts)
        maps, notes = attention_maps(model, text, [self.layer], self.bos)
        attention = maps[self.layer]
        check_finite(model, "attention", attention.maps[None], [self.layer])
        if self.words:
            with_words(attention)
        attention.text_index = self.index
        head = None if self.head is None else options.head_of(self.head)[1]
        return ShowResult(model.info(), attention, head, self.index, self.bos, notes)
