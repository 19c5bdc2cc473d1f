"""What the analyses share: running a corpus through the capture in batches, naming heads and layers, the input
summary every result carries."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.pipeline import capture, distributed
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.tokens import Tokenized, batches, pad_id

DEFAULT_BATCH_SIZE = 8
DEFAULT_MAX_TOKENS = 16384  # padded tokens per batch: bounds activations whatever the batch size says

# progress(texts done, tokens done, texts in all, tokens in all), called after every batch; a text split into
# windows is done when its last window is (under torchrun: this process's share of the texts)
Progress = Callable[[int, int, int, int], None]


def check_positive(name: str, value: int | None, low: int = 1) -> None:
    """One line naming the setting and the value when an integer setting is below `low` (None passes)."""
    if value is not None and value < low:
        raise AttnscopeError(f"{name} {value}: must be at least {low}")


def check_layer(layer: int, n_layer: int) -> int:
    if not 0 <= layer < n_layer:
        raise AttnscopeError(f"layer {layer} is out of range (this model has layers 0-{n_layer - 1})")
    return layer


def parse_head(label: str, n_layer: int, n_head: int) -> tuple[int, int]:
    """`L.H` (0-based, as in the literature: `4.11`) checked against the model's shape."""
    layer_text, sep, head_text = label.strip().partition(".")
    if not sep or not layer_text.isdigit() or not head_text.isdigit():
        raise AttnscopeError(f"head '{label}': expected LAYER.HEAD such as 4.11 (0-based)")
    layer, head = int(layer_text), int(head_text)
    if layer >= n_layer:
        raise AttnscopeError(f"head '{label}': layer {layer} is out of range (this model has layers 0-{n_layer - 1})")
    if head >= n_head:
        raise AttnscopeError(f"head '{label}': head {head} is out of range (this model has heads 0-{n_head - 1})")
    return layer, head


def check_index(index: int, texts: Sequence[Text]) -> Text:
    """The text at `index` (0-based) of the texts given."""
    if not 0 <= index < len(texts):
        raise AttnscopeError(f"text index {index} is out of range ({len(texts)} text(s) given)")
    return texts[index]


def input_summary(texts: Sequence[Text], tokenized: Tokenized, scored_rows: int | None = None) -> dict[str, Any]:
    summary = {
        "n_texts": len(texts),
        "n_windows": len(tokenized.windows),
        "n_tokens": tokenized.n_tokens,
        "bos": tokenized.bos,
        "sources": [item.source for item in texts],
    }
    if scored_rows is not None:
        summary["scored_rows"] = scored_rows
    return summary


def too_short(model: LoadedModel, what: str) -> str:
    """The message for a corpus with no scored row."""
    if model.kind.causal:
        return f"every text is a single token once tokenized; give at least two tokens to {what}"
    return (
        f"no text has a token between the first and the last of its window; give at least one token to {what} "
        "(with bos on, [CLS] and [SEP] are added around it)"
    )


def run_windows(
    model: LoadedModel,
    tokenized: Tokenized,
    reducer: capture.Reducer,
    batch_size: int,
    max_tokens: int | None,
    progress: Progress | None,
    keep_layers: Sequence[int] = (),
    flush: Callable[[Any], None] | None = None,
) -> capture.Captured:
    """Forward this process's share of the windows (every N-th under torchrun) in batches, reducing as it goes."""
    place = distributed.world()
    mine = tokenized.windows[place.rank :: place.size]  # window 0, whose maps pictures use, is rank 0's
    windows_left = Counter(window.text_index for window in mine)  # text -> its windows not yet run
    total_texts, total_tokens = len(windows_left), sum(len(window.ids) for window in mine)
    done = [0, 0]  # texts, tokens

    def after_batch(batch) -> None:
        if flush is not None:
            flush(batch)
        for index in batch.indices:
            text = mine[index].text_index
            windows_left[text] -= 1
            done[0] += windows_left[text] == 0
        done[1] += sum(len(mine[index].ids) for index in batch.indices)
        if progress is not None:
            progress(done[0], done[1], total_texts, total_tokens)

    return capture.run(
        model.model,
        batches(mine, batch_size, model.device, pad_id(model.tokenizer), max_tokens),
        reducer,
        keep_layers=keep_layers,
        keep_window=0 if place.rank == 0 else None,
        on_batch=after_batch,
    )
