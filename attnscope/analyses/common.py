"""What the analyses share: running a corpus through the capture in batches, naming heads and layers, the input
summary every result carries."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from attnscope import settings
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.pipeline import capture, distributed
from attnscope.pipeline.blocks import Reducer
from attnscope.pipeline.inputs import OneText, Text, Texts, as_texts
from attnscope.pipeline.tokens import Window, WindowStream, batches, pad_id

DEFAULT_BATCH_SIZE = settings.Batching.batch_size  # the settings' defaults (--batch-size, --max-tokens)
DEFAULT_MAX_TOKENS = settings.Batching.max_tokens  # padded tokens per batch: bounds activations whatever the batch

# progress(texts read, tokens run, share of the input read (0 to 1)), called after every batch (under torchrun: the
# tokens of this process's share of the windows)
Progress = Callable[[int, int, float], None]


# Planned work worth announcing before it starts: about a minute of a 2-core CPU (~20 GFLOP/s), counting 2 FLOP per
# parameter per token forwarded (the attention's own cost aside)
LARGE_WORK_FLOP = 1e12


def planned_work(network: Any, forwards: int, tokens: int, what: str, smaller: str) -> str | None:
    """`what` in `forwards` forward passes of `tokens` tokens in all through `network` (a torch module), said with
    how to make it `smaller`, when that is large (LARGE_WORK_FLOP); None otherwise."""
    parameters = sum(parameter.numel() for parameter in network.parameters())
    flop = 2 * parameters * tokens
    if flop < LARGE_WORK_FLOP:
        return None
    return (
        f"{what}: {forwards:,} forward passes, {tokens:,} tokens in all through {parameters / 1e6:,.0f}M parameters "
        f"(about {flop / 1e12:,.0f} TFLOP); {smaller}"
    )


def approximate_tokens(texts: Any) -> int | None:
    """About how many tokens the texts are, before any is read: 4 characters a token (English with a BPE
    tokenizer), from the texts in memory or the size of a file; None where it cannot be told (standard input)."""
    items = getattr(texts, "items", None)
    if items is not None:
        return sum(len(item.text) for item in items) // 4
    size = getattr(texts, "size", None)
    return size // 4 if isinstance(size, int) and size > 0 else None


def check_index(index: int, texts: Texts | Sequence[Text]) -> Texts:
    """The text at `index` (0-based) of the texts given, alone, as a stream."""
    if index < 0:
        raise AttnscopeError(f"text index {index}: must be 0 or more")
    one = OneText(as_texts(texts), index)
    one.check()
    return one


def input_summary(windows: WindowStream, scored_rows: int | None = None) -> dict[str, Any]:
    """What a result says of its input, after `windows` were read: counts, special tokens, sources."""
    summary = windows.summary()
    if scored_rows is not None:
        summary["scored_rows"] = scored_rows
    return summary


def check_finite(model: LoadedModel, what: str, values: Any, layers: Sequence[int] | None = None) -> None:
    """Refuse a result that came out NaN or infinite: its numbers would mean nothing, so no table is made of them.
    `values` holds `what` ("attention", "loss"): with `layers`, one entry per layer along its first dimension, for
    the message to say where it starts. The line names the cause: weights that are not finite (a damaged checkpoint,
    named by its first such tensor, looked for only now so that a sound model pays nothing), or a half precision
    that overflowed."""
    import numpy as np

    values = np.asarray(values.cpu() if hasattr(values, "cpu") else values, dtype=np.float64)
    if np.isfinite(values).all():
        return
    where = ""
    if layers is not None:
        finite = np.isfinite(values.reshape(len(layers), -1)).all(axis=1)
        where = f" from layer {layers[int(np.argmin(finite))]} on"
    lm_model = getattr(model, "lm_model", None)  # its language-model head included, where it was loaded
    weights = first_non_finite_weight(model.model if lm_model is None else lm_model)
    dtype = str(model.dtype).removeprefix("torch.")
    if weights is not None:
        cause = damaged_weights(weights)
    elif dtype in ("float16", "bfloat16"):
        cause = f"{dtype} overflowed: try --dtype float32"
    else:
        cause = "the model's activations overflowed"
    raise AttnscopeError(f"the {what} is not finite (NaN or infinity){where}; nothing is reported: {cause}")


def damaged_weights(name: str) -> str:
    return f"the model's weights hold NaN or infinite values (first in {name}): the checkpoint is damaged"


def check_weights(model: LoadedModel) -> None:
    """Refuse a model whose weights hold NaN or infinity (its language-model head included, where it was loaded),
    naming the first such tensor, before any pass: for what a non-finite result would not reveal (SDPA turns a NaN
    head's output into zeros; an MLP after the last attention leaves every map finite). A scan of GPT-2's 124M
    weights takes 0.03 s on one CPU core, less than one batch's forward pass."""
    lm_model = getattr(model, "lm_model", None)
    damaged = first_non_finite_weight(model.model if lm_model is None else lm_model)
    if damaged is not None:
        raise AttnscopeError(damaged_weights(damaged))


def first_non_finite_weight(network: Any) -> str | None:
    """The name of the first parameter of `network` holding a NaN or an infinity (None: all finite)."""
    import math

    for name, parameter in network.named_parameters():
        if parameter.device.type != "meta" and parameter.numel():
            low, high = (float(value) for value in parameter.detach().reshape(-1).aminmax())
            if not (math.isfinite(low) and math.isfinite(high)):
                return name
    return None


def check_rows(model: LoadedModel, windows: WindowStream) -> None:
    """Refuse texts whose only scored row is each window's first after the first token (one token each, after BOS):
    that row's previous token is the first token, so every head's previous-token and first-token scores are one
    weight, and the role it would be given was made up by the row, not the head (the probe's rows are not enough:
    a role weighs every score)."""
    if windows.n_windows and model.kind.only_first_rows(windows.longest):
        special = len(windows.prefix) + len(windows.suffix)
        needed = model.kind.sinks + 2 - special
        raise AttnscopeError(
            f"every window has one scored row (the longest is {windows.longest} tokens"
            f"{f', {special} of them special' if special else ''}), and that row's previous token is the window's "
            "first token: previous-token and first-token attention are the same weight, so no head's role can be "
            f"told; give texts of at least {needed} tokens"
        )


def too_short(model: LoadedModel, what: str) -> str:
    """The message for a corpus with no scored row."""
    if model.kind.causal:
        return f"every text is a single token once tokenized; give at least two tokens to {what}"
    return (
        f"no text has a token between the first and the last of its window; give at least one token to {what} "
        "(with bos on, [CLS] and [SEP] are added around it)"
    )


@dataclass
class Run:
    """What `run_windows` hands back beside the statistics it fed: the maps kept for pictures and the window they
    are of (the first window of the input), None when no window ran here."""

    maps: dict[int, Any]
    first_window: Window | None
    notes: list[str] = field(default_factory=list)  # the capture's, on its kernels


def run_windows(
    model: LoadedModel,
    windows: WindowStream,
    reducer: Reducer,
    batch_size: int,
    max_tokens: int | None,
    progress: Progress | None,
    keep_layers: Sequence[int] = (),
    flush: Callable[[Any], None] | None = None,
    fits: Callable[[int, int], bool] | None = None,
    select: Callable[[Window], bool] | None = None,
) -> Run:
    """Forward this process's share of the windows (every N-th under torchrun) in batches as they stream in,
    reducing as it goes; the maps of `keep_layers` are kept for the first window. `select`: only the windows it
    accepts run (kvplan's: those long enough to measure), the others are read and counted but never computed."""
    place = distributed.working()
    mine = islice(windows, place.rank, None, place.size)  # window 0, whose maps pictures use, is rank 0's
    if select is not None:
        mine = filter(select, mine)
    tokens, first = 0, []

    def after_batch(batch) -> None:
        nonlocal tokens
        if flush is not None:
            flush(batch)
        if 0 in batch.indices:
            first.append(batch.windows[batch.indices.index(0)])
        tokens += sum(len(window.ids) for window in batch.windows)
        if progress is not None:
            progress(windows.n_texts, tokens, windows.share())

    captured = capture.run(
        model.model,
        batches(mine, batch_size, model.device, pad_id(model.tokenizer), max_tokens, fits),
        reducer,
        keep_layers=keep_layers,
        keep_window=0 if place.rank == 0 else None,
        on_batch=after_batch,
        kernel=model.kernel,
    )
    return Run(captured.maps, first[0] if first else None, captured.notes)
