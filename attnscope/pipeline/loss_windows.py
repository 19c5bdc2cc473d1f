"""The windows a language-model loss is measured on, and their labels: what `ablate` (the loss with heads removed)
and the direct effects (`analyses.direct_effect`: each head's share of the correct token's logit) both predict.

Decoders: every window of two tokens or more, no labels (the next token is the target; a window's first token is
not predicted). Encoders: the masked-language-model loss made deterministic: in each window, MASK_FRACTION (15 %) of
the scored rows (rows 1 .. length-2: the text's tokens between [CLS] and [SEP]), at least one, are chosen by a numpy
generator seeded with MASK_SEED (0) and drawn window after window in input order; they are replaced by [MASK] (no
80/10/10 mix: the loss measures the model, not trains it), and the labels hold the original token there, IGNORED
elsewhere. Windows of fewer than 3 tokens are left out. The windows are held in memory: a loss runs over them once
per pass, each batch once per head configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.models.families import CAUSAL_LM
from attnscope.models.loading import LoadedModel
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.tokens import Window, WindowStream

MASK_FRACTION = 0.15  # of an encoder window's scored rows, replaced by [MASK] for the masked-LM loss
MASK_SEED = 0
IGNORED = -100  # label of a position that is not predicted (transformers' convention)


@dataclass
class LossWindows:
    """The windows the loss runs on; for an encoder, with [MASK] in place and `labels` (one per window, the same
    length: the original token at a masked position, IGNORED elsewhere). Decoders: labels None."""

    windows: list[Window]
    labels: list[tuple[int, ...]] | None = None

    @property
    def predicted(self) -> int:
        if self.labels is None:
            return sum(len(window.ids) - 1 for window in self.windows)
        return sum(sum(label != IGNORED for label in labels) for labels in self.labels)


def masked_windows(windows: Sequence[Window], mask_id: int, seed: int = MASK_SEED) -> LossWindows:
    """Encoder windows (of 3 tokens or more) with MASK_FRACTION of their scored rows 1 .. length-2, at least one,
    replaced by `mask_id`; positions drawn by one numpy generator seeded `seed`, window after window."""
    generator = np.random.default_rng(seed)
    masked, labels = [], []
    for window in windows:
        length = len(window.ids)
        if length < 3:
            continue
        rows = np.arange(1, length - 1)  # the scored rows
        count = max(1, int(round(MASK_FRACTION * len(rows))))
        chosen = set(int(i) for i in generator.choice(rows, size=count, replace=False))
        masked.append(
            Window(
                window.text_index, tuple(mask_id if i in chosen else t for i, t in enumerate(window.ids)), window.start
            )
        )
        labels.append(tuple(t if i in chosen else IGNORED for i, t in enumerate(window.ids)))
    return LossWindows(masked, labels)


def batch_labels(loss_windows: LossWindows, batch) -> Any:
    """(B, n) labels of the batch's windows, right-padded with IGNORED; None for a decoder."""
    import torch

    if loss_windows.labels is None:
        return None
    labels = torch.full(tuple(batch.input_ids.shape), IGNORED, dtype=torch.long)  # (B, n)
    for row, index in enumerate(batch.indices):
        window_labels = loss_windows.labels[index]
        labels[row, : len(window_labels)] = torch.tensor(window_labels, dtype=torch.long)
    return labels.to(batch.input_ids.device)


def loss_windows(
    loaded: LoadedModel, texts: Texts | Sequence[Text], bos: bool | None
) -> tuple[LossWindows, dict[str, Any], list[str]]:
    """The windows the loss is measured on (an encoder's masked), the input summary, and notes."""
    stream = WindowStream(loaded, texts, bos)
    every = list(stream)
    summary, notes = stream.summary(), stream.notes()
    if loaded.family.lm_head == CAUSAL_LM:  # next-token loss
        windows = LossWindows([window for window in every if len(window.ids) >= 2])
        if not windows.windows:
            raise AttnscopeError("every window has a single token: there is no next token to predict")
        return windows, summary, notes
    if loaded.tokenizer.mask_token_id is None:
        raise AttnscopeError("this encoder's tokenizer has no [MASK] token: the masked-LM loss cannot be measured")
    windows = masked_windows(every, loaded.tokenizer.mask_token_id)
    if not windows.windows:
        raise AttnscopeError(
            "no window has a token between its first and last: there is nothing to mask "
            "(with bos on, [CLS] and [SEP] are added around the text)"
        )
    notes.append(
        f"masked-LM loss: {MASK_FRACTION:.0%} of each window's tokens between the first and the last (at least "
        f"one) replaced by [MASK], chosen with seed {MASK_SEED}"
    )
    return windows, summary, notes
