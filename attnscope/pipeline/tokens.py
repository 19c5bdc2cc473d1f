"""Texts to token windows, and windows to padded batches.

With `bos` on, every window of a decoder starts with the model's BOS token, so "first token" means the same thing in
every window; every window of an encoder (a tokenizer with no BOS but [CLS] and [SEP], as BERT's) is wrapped as
`[CLS] text [SEP]`, as the model saw in training. A text longer than the context is cut into consecutive windows
of at most `n_ctx` tokens, special tokens included.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.pipeline.inputs import Text
from attnscope.scores.kinds import Kind


@dataclass(frozen=True)
class Window:
    """At most `n_ctx` token ids of one text (`text_index`), special tokens (BOS, or [CLS] and [SEP]) included."""

    text_index: int
    ids: tuple[int, ...]
    start: int  # offset of the window's first text token within the text's tokens


@dataclass(frozen=True)
class Tokenized:
    windows: list[Window]
    bos: bool
    notes: list[str]

    @property
    def n_tokens(self) -> int:
        return sum(len(window.ids) for window in self.windows)


def default_bos(tokenizer: Any, kind: Kind) -> bool:
    """Special tokens are added by default whenever the tokenizer has them: a decoder's BOS (GPT-2:
    `<|endoftext|>`, as TransformerLens), an encoder's [CLS] … [SEP] (BERT)."""
    if kind.special_tokens == "cls_sep":
        return tokenizer.cls_token_id is not None and tokenizer.sep_token_id is not None
    return tokenizer.bos_token_id is not None


def special_tokens(tokenizer: Any, kind: Kind, bos: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefix, suffix) ids put around every window: (BOS,) and () for a decoder, ([CLS],) and ([SEP],) for an
    encoder, nothing with `bos` off."""
    if not bos:
        return (), ()
    if kind.special_tokens == "cls_sep":
        if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
            raise AttnscopeError(
                "this model's tokenizer has no [CLS] and [SEP] tokens to wrap the text in; turn bos off"
            )
        return (tokenizer.cls_token_id,), (tokenizer.sep_token_id,)
    if tokenizer.bos_token_id is None:
        raise AttnscopeError("this model's tokenizer has no BOS token to prepend; turn bos off")
    return (tokenizer.bos_token_id,), ()


def tokenize(model: LoadedModel, texts: Sequence[Text], bos: bool | None = None) -> Tokenized:
    """Token windows of `texts` for `model` (its tokenizer, context and kind); `bos=None` means the tokenizer's
    default (see `default_bos`)."""
    tokenizer, n_ctx = model.tokenizer, model.n_ctx
    use_bos = default_bos(tokenizer, model.kind) if bos is None else bos
    prefix, suffix = special_tokens(tokenizer, model.kind, use_bos)
    span = n_ctx - len(prefix) - len(suffix)
    windows, split_texts = [], 0
    for index, item in enumerate(texts):
        ids = tokenizer(item.text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise AttnscopeError(f"text {index} ({item.source}) has no tokens")
        if len(ids) > span:
            split_texts += 1
        for start in range(0, len(ids), span):
            windows.append(Window(index, prefix + tuple(ids[start : start + span]) + suffix, start))
    notes = []
    if split_texts:
        notes.append(
            f"{split_texts} text(s) longer than the model's context ({n_ctx} tokens) were split into windows; "
            f"{len(windows)} windows in all"
        )
    return Tokenized(windows, use_bos, notes)


def pad_id(tokenizer: Any) -> int:
    """The id padded positions hold: the tokenizer's pad token, else its EOS, else 0 (the mask hides it)."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return token_id
    return 0


def batch_order(windows: Sequence[Window], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Window indices grouped into batches of similar length (longest first), so padding stays small: at most
    `batch_size` windows, and at most `max_tokens` padded tokens (windows × longest) unless one window alone is
    longer."""
    if batch_size < 1:
        raise AttnscopeError(f"batch size {batch_size}: must be at least 1")
    if max_tokens is not None and max_tokens < 1:
        raise AttnscopeError(f"max tokens {max_tokens}: must be at least 1")
    order = sorted(range(len(windows)), key=lambda i: (-len(windows[i].ids), i))
    groups: list[list[int]] = []
    for index in order:
        group = groups[-1] if groups else None
        # longest first: the group's first window is its longest, so padded size = count × that length
        fits = (
            group is not None
            and len(group) < batch_size
            and (max_tokens is None or (len(group) + 1) * len(windows[group[0]].ids) <= max_tokens)
        )
        if fits:
            group.append(index)
        else:
            groups.append([index])
    return groups


@dataclass
class Batch:
    """Right-padded ids (B, n) and lengths (B,) of the windows `indices` (right padding keeps GPT-2's positions
    exact for every real token; padded rows and keys are excluded by the mask and by the statistics)."""

    indices: list[int]
    input_ids: Any  # (B, n) long
    attention_mask: Any  # (B, n) long, 1 = real token
    lengths: Any  # (B,) long


def batches(
    windows: Sequence[Window], batch_size: int, device: Any, pad_id: int = 0, max_tokens: int | None = None
) -> Iterator[Batch]:
    import torch

    for indices in batch_order(windows, batch_size, max_tokens):
        longest = max(len(windows[i].ids) for i in indices)
        input_ids = torch.full((len(indices), longest), pad_id, dtype=torch.long)  # (B, n)
        for row, index in enumerate(indices):
            ids = windows[index].ids
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        lengths = torch.tensor([len(windows[i].ids) for i in indices], dtype=torch.long)  # (B,)
        attention_mask = (torch.arange(longest)[None, :] < lengths[:, None]).long()  # (B, n)
        yield Batch(indices, input_ids.to(device), attention_mask.to(device), lengths.to(device))


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as one printable character (Radford et al. 2019, `encoder.py`):
    character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [byte for byte in range(256) if byte not in printable]
    return {
        **{chr(byte): byte for byte in printable},
        **{chr(256 + index): byte for index, byte in enumerate(shifted)},
    }


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Readable per-token labels for plots: each token decoded alone, newlines and tabs made visible, the BOS
    token shortened to `<bos>` (GPT-2's `<|endoftext|>` would take the room of five words). A byte-level token
    that holds part of a character (one of the 3 bytes of 日) shows its bytes (`\\xe6\\x97`), not `�`."""
    alphabet = _byte_level_alphabet()
    labels = []
    for token_id in ids:
        if token_id == tokenizer.bos_token_id:
            labels.append("<bos>")
            continue
        text = tokenizer.decode([token_id])
        piece = tokenizer.convert_ids_to_tokens(token_id)
        if "\ufffd" in text and isinstance(piece, str) and all(char in alphabet for char in piece):
            text = bytes(alphabet[char] for char in piece).decode("utf-8", errors="backslashreplace")
        labels.append(text.replace("\n", "\\n").replace("\t", "\\t") or repr(text))
    return labels


ORDINARY_TOKEN = re.compile(r"^(Ġ|▁)[a-z]{3,}$")  # a space marker and a lowercase word: " house", " river"
PROBE_SEQUENCES = 4


def ordinary_token_ids(tokenizer: Any) -> list[int]:
    """Vocabulary entries that are a space followed by a lowercase word of 3+ letters, in id order."""
    vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return [token_id for token_id, token in enumerate(vocabulary) if token and ORDINARY_TOKEN.match(token)]


def probe_windows(tokenizer: Any, period: int, n_ctx: int, seed: int = 0, count: int = PROBE_SEQUENCES) -> list[Window]:
    """`count` windows of BOS (when the model has one), T = `period` distinct random ordinary tokens, the same T again.

    Seeded, so the probe is the same on every run; distinct tokens make "the earlier occurrence" unambiguous.
    """
    import numpy as np

    prefix = (tokenizer.bos_token_id,) if tokenizer.bos_token_id is not None else ()
    # T = 2 would put the induction target i-(T-1) on the previous token: the probe could not tell the two apart.
    if period < 3:
        raise AttnscopeError(f"probe period {period}: must be at least 3")
    if len(prefix) + 2 * period > n_ctx:
        bos = "BOS + " if prefix else ""
        raise AttnscopeError(
            f"probe period {period}: {bos}twice the period ({len(prefix) + 2 * period} tokens) must fit the model's "
            f"context of {n_ctx} tokens"
        )
    if seed < 0:
        raise AttnscopeError(f"probe seed {seed}: must be 0 or more")
    candidates = ordinary_token_ids(tokenizer)
    if len(candidates) < period:
        raise AttnscopeError(f"probe period {period}: the vocabulary has only {len(candidates)} ordinary word tokens")
    generator = np.random.default_rng(seed)
    windows = []
    for index in range(count):
        sequence = tuple(int(candidates[k]) for k in generator.choice(len(candidates), size=period, replace=False))
        windows.append(Window(index, prefix + sequence + sequence, 0))
    return windows
