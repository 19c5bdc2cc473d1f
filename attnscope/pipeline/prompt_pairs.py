"""The prompt pairs of `attnscope patch` and `attnscope discover`: one pair from their options, or several from a
JSON-lines file (or standard input), each line an object with the string fields clean, corrupt, answer and wrong
(other fields are ignored); then each pair tokenized and checked for a model, the pairs batched by length, and the
metric both commands read, the logit difference at the last position.

Read whole and checked before any model loads: a pair file is small (a few thousand pairs are far more than a patch
run can take: each pair runs the model twice per head), so it is read at once, up to MAX_PAIR_BYTES, and refused in
one line naming the file and the line where it is not what it should be. Reading is pure Python; torch only in the
functions that make tensors.
"""

from __future__ import annotations

import inspect
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.pipeline.inputs import json_line, valid_text
from attnscope.pipeline.tokens import special_tokens, written_special_ids
from attnscope.scores.catalog import counted

if TYPE_CHECKING:
    from attnscope.models.loading import LoadedModel

FIELDS = ("clean", "corrupt", "answer", "wrong")
MAX_PAIR_BYTES = 64 * 2**20  # far beyond any set of pairs a patch run can take in a day


@dataclass(frozen=True)
class PromptPair:
    """A clean prompt, its corrupted twin, the token the clean one predicts and the one it is measured against, as
    the user wrote them; `source` names the pair in messages and in the JSON (`the pair given`, `pairs.jsonl:3`)."""

    clean: str
    corrupt: str
    answer: str
    wrong: str
    source: str


def given_pair(clean: str, corrupt: str, answer: str, wrong: str) -> list[PromptPair]:
    """The one pair of the options (already checked as non-empty strings by the settings)."""
    where = "the pair given"
    values = (clean, corrupt, answer, wrong)
    return [PromptPair(*(valid_text(value, name) for name, value in zip(FIELDS, values, strict=True)), where)]


def pairs_given(file: str | None, clean: str, corrupt: str, answer: str, wrong: str) -> list[PromptPair]:
    """A command's pairs: those of `file`, or else the one of clean, corrupt, answer and wrong."""
    if file is not None:
        return read_pairs(file)
    return given_pair(clean, corrupt, answer, wrong)


def read_pairs(file: str) -> list[PromptPair]:
    """The pairs of a JSON-lines file ('-': standard input), in order; blank lines are skipped."""
    name = "standard input" if file == "-" else file
    text = _decoded(_raw(file), name)
    pairs = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            pairs.append(_pair(line, f"{name}:{number}"))
    if not pairs:
        raise AttnscopeError(f"{name} holds no pair: give one JSON object per line with clean, corrupt, answer, wrong")
    return pairs


def _raw(file: str) -> bytes:
    """The bytes of `file` (or of standard input), refused past MAX_PAIR_BYTES; a directory, a device or a socket is
    refused, a named pipe read."""
    if file == "-":
        if sys.stdin is None or sys.stdin.closed:
            raise AttnscopeError("standard input is closed: there is no pair to read from '-'")
        return _bounded(sys.stdin.buffer, "standard input")
    try:
        mode = os.stat(file).st_mode
    except FileNotFoundError:
        raise AttnscopeError(f"no such file: {file}") from None
    except OSError as error:
        raise AttnscopeError(f"cannot read {file}: {error.strerror or error}") from None
    if stat.S_ISDIR(mode):
        raise AttnscopeError(f"{file} is a directory, not a file of pairs")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise AttnscopeError(f"{file} is not a regular file (a device or a socket); give a JSON-lines file of pairs")
    try:
        with open(file, "rb") as stream:
            return _bounded(stream, file)
    except OSError as error:
        raise AttnscopeError(f"cannot read {file}: {error.strerror or error}") from None


def _bounded(stream: Any, name: str) -> bytes:
    data = stream.read(MAX_PAIR_BYTES + 1)
    if len(data) > MAX_PAIR_BYTES:
        raise AttnscopeError(
            f"{name} holds more than {MAX_PAIR_BYTES // 2**20} MiB: that is not a file of prompt pairs (each pair runs "
            "the model twice per head)"
        )
    return data


def _decoded(data: bytes, name: str) -> str:
    """UTF-8 text (a byte-order mark at the start is not text), line ends as `\\n`; a NUL byte or a byte that is not
    UTF-8 is refused, named by its offset."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise AttnscopeError(f"{name} looks like a binary file (a NUL byte at byte {nul}), not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise AttnscopeError(f"{name} is not UTF-8 text (byte {error.start} cannot be decoded)") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _pair(line: str, where: str) -> PromptPair:
    record = json_line(line, where)
    expected = 'expected an object with the string fields "clean", "corrupt", "answer" and "wrong"'
    if not isinstance(record, dict):
        raise AttnscopeError(f"{where}: {expected}")
    missing = [field for field in FIELDS if field not in record]
    if missing:
        raise AttnscopeError(f"{where}: {expected}; {' and '.join(repr(field) for field in missing)} missing")
    values = []
    for field in FIELDS:
        value = options.TEXT.check(record[field], f'{where}: the "{field}" field')
        values.append(valid_text(value, f'{where}: the "{field}" field'))
    return PromptPair(*values, where)


# ------------------------------------------------------------------------------------------------- tokens


def continuation(prompt: str, answer: str) -> str:
    """The answer as it is written after the prompt: a word given without its leading space gets one (`Mary` →
    ` Mary`, GPT-2's token for a word that follows another), unless the prompt ends in white space; an answer that
    starts with white space, or with a character that is not a letter or a digit (`.`, `,`, `'s`), is as written."""
    if answer[0].isspace() or not answer[0].isalnum() or prompt[-1:].isspace():
        return answer
    return " " + answer


@dataclass(frozen=True)
class TokenizedPair:
    """A pair's token ids (special tokens included) and its two tokens' ids."""

    clean: tuple[int, ...]
    corrupt: tuple[int, ...]
    answer: int
    wrong: int


def token_after(tokenizer: Any, prompt: str, token: str, name: str, where: str) -> int:
    """The id of `token` (answer or wrong) as the one token that follows `prompt` (see `continuation`)."""
    before = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    after = tokenizer(prompt + continuation(prompt, token), add_special_tokens=False)["input_ids"]
    if len(after) == len(before) + 1 and after[: len(before)] == before:
        return after[-1]
    same = next(
        (k for k, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), min(len(before), len(after))
    )
    shown = [tokenizer.decode([piece]) for piece in after[same:]]
    if any("\ufffd" in piece for piece in shown):  # bytes of one character split among tokens: name them by id
        pieces = f"{len(shown)} pieces of its bytes (ids {', '.join(str(piece) for piece in after[same:])})"
    else:
        pieces = " ".join(repr(piece) for piece in shown)
    merged = " with the prompt's end" if same < len(before) else ""
    fix = (
        "remove the white space that ends the prompt: a word's token holds the space before it"
        if prompt[-1:].isspace()
        else "give a word of one token (the logit difference compares two tokens)"
    )
    raise AttnscopeError(
        f"{where}: {name} {options.shown(token)} is not one token after the prompt: it is tokenized{merged} as "
        f"{pieces}; {fix}"
    )


def tokenized(loaded: LoadedModel, pair: PromptPair, prefix: tuple[int, ...]) -> TokenizedPair:
    """A pair's tokens, checked: the two prompts of one length within the context, answer and wrong one token each
    (as they follow the clean prompt) and not the same."""
    tokenizer = loaded.tokenizer
    clean = (*prefix, *tokenizer(pair.clean, add_special_tokens=False)["input_ids"])
    corrupt = (*prefix, *tokenizer(pair.corrupt, add_special_tokens=False)["input_ids"])
    where = pair.source
    if len(clean) != len(corrupt):
        raise AttnscopeError(
            f"{where}: the clean prompt is {counted(len(clean), 'token')} and the corrupted one {len(corrupt)}: "
            "patching sets each position's output in the other run, so both must have as many tokens (change words "
            "for words of as many tokens)"
        )
    if len(clean) > loaded.n_ctx:
        raise AttnscopeError(
            f"{where}: the prompts are {counted(len(clean), 'token')}, more than the model's context ({loaded.n_ctx})"
        )
    answer = token_after(tokenizer, pair.clean, pair.answer, "answer", where)
    wrong = token_after(tokenizer, pair.clean, pair.wrong, "wrong", where)
    if answer == wrong:
        raise AttnscopeError(
            f"{where}: answer and wrong are the same token {tokenizer.decode([answer])!r}: their logit difference is "
            "0 whatever the prompt"
        )
    return TokenizedPair(clean, corrupt, answer, wrong)


def tokenized_pairs(
    loaded: LoadedModel, pairs: Sequence[PromptPair], bos: bool
) -> tuple[tuple[int, ...], list[TokenizedPair]]:
    """(prefix, tokens): every pair tokenized (`tokenized`) after the special tokens `bos` asks for."""
    prefix, _ = special_tokens(loaded.tokenizer, loaded.kind, bos)
    return prefix, [tokenized(loaded, pair, prefix) for pair in pairs]


def length_groups(
    lengths: Sequence[int], batch_size: int | None, max_tokens: int | None, copies: int = 1
) -> list[list[int]]:
    """Pair indices in batches of one length (no padding: the last position is every row's last token), at most
    `batch_size` pairs and `max_tokens` tokens each (a pair longer than that runs alone); longest first.
    `batch_size` None: as many pairs as let `copies` copies of the batch fill one forward pass of
    `interventions.MAX_COPY_TOKENS` tokens (patch: the heads of a layer patched as copies of the batch, in one pass)."""
    from attnscope.pipeline.interventions import MAX_COPY_TOKENS

    by_length: dict[int, list[int]] = {}
    for index, length in enumerate(lengths):
        by_length.setdefault(length, []).append(index)
    groups = []
    for length, indices in sorted(by_length.items(), reverse=True):
        most = MAX_COPY_TOKENS // (copies * length) if batch_size is None else batch_size
        size = max(1, min(most, (max_tokens or length * most) // length))
        groups += [indices[first : first + size] for first in range(0, len(indices), size)]
    return groups


def batch(tokens: Sequence[TokenizedPair], group: Sequence[int], device: Any) -> tuple[Any, Any, Any, Any]:
    """The clean and corrupted ids (B, n) of the pairs `group` (of one length), their answers and wrong tokens (B,)."""
    import torch

    def column(which: str) -> Any:
        return torch.tensor([getattr(tokens[k], which) for k in group], device=device)

    return column("clean"), column("corrupt"), column("answer"), column("wrong")


def pair_records(
    loaded: LoadedModel, pairs: Sequence[PromptPair], tokens: Sequence[TokenizedPair], clean_ld: Any, corrupt_ld: Any
) -> list[dict[str, Any]]:
    """Each pair as the JSON shows it: where it came from, its prompts, its two tokens (as the tokenizer spells
    them, and their ids), its length in tokens and its baseline logit differences."""
    decode = loaded.tokenizer.decode
    return [
        {
            "index": k,
            "source": pair.source,
            "clean": pair.clean,
            "corrupt": pair.corrupt,
            "answer": decode([ids.answer]),
            "wrong": decode([ids.wrong]),
            "answer_id": ids.answer,
            "wrong_id": ids.wrong,
            "n_tokens": len(ids.clean),
            "clean_logit_diff": float(clean_ld[k]),
            "corrupt_logit_diff": float(corrupt_ld[k]),
        }
        for k, (pair, ids) in enumerate(zip(pairs, tokens, strict=True))
    ]


GAP_MIN = 1e-3  # logits: a mean clean − corrupted difference smaller than this leaves nothing to find


def check_gap(clean_ld: Any, corrupt_ld: Any, what: str) -> None:
    """Refuse, in one line, pairs whose corruption changes nothing: a mean clean − corrupted logit difference under
    GAP_MIN logits leaves nothing for `what` ("a head to restore", "an edge to carry")."""
    import numpy as np

    gaps = clean_ld - corrupt_ld
    if abs(float(np.mean(gaps))) < GAP_MIN and np.abs(gaps).max() >= GAP_MIN:
        raise AttnscopeError(
            f"the pairs' corruptions move the logit difference (answer − wrong) by {np.abs(gaps).max():.4f} at most "
            f"but in opposite directions, and they cancel: {float(np.mean(gaps)):.4f} on average; give pairs whose "
            "corruption moves it the same way (answer and wrong swapped in some?)"
        )
    if abs(float(np.mean(gaps))) < GAP_MIN:
        raise AttnscopeError(
            f"the clean and corrupted prompts give the same logit difference (answer − wrong: clean "
            f"{np.mean(clean_ld):.4f}, corrupted {np.mean(corrupt_ld):.4f} on average): there is no difference for "
            f"{what}; corrupt the prompt where it decides the answer"
        )


def written_specials(
    loaded: LoadedModel, pairs: Sequence[PromptPair], tokens: Sequence[TokenizedPair], prefix: int
) -> list[str]:
    """A note on the tokenizer's special tokens written in the prompts (`<|endoftext|>`), as the texts' readers give
    one (`pipeline.tokens`): each is read as that token, mid-prompt. `prefix`: the tokens put before each prompt."""
    tokenizer = loaded.tokenizer
    special = written_special_ids(tokenizer)
    counts: dict[int, int] = {}
    first = ""
    for pair, tokenized_pair in zip(pairs, tokens, strict=True):
        for ids in (tokenized_pair.clean[prefix:], tokenized_pair.corrupt[prefix:]):
            for token in special.intersection(ids):
                counts[token] = counts.get(token, 0) + ids.count(token)
                first = first or pair.source
    if not counts:
        return []
    count = sum(counts.values())
    found = ", ".join(
        f"{tokenizer.convert_ids_to_tokens(token)} × {times:,} (id {token}"
        f"{', the BOS' if token == tokenizer.bos_token_id else ''})"
        for token, times in sorted(counts.items())
    )
    return [
        f"the prompts write {counted(count, 'special token')} of the tokenizer ({found}; first in {first}): each is "
        "read as that token, not as its characters, so the model sees it mid-prompt (a BOS there is a second first "
        f"token, where attention may sink); remove {'it' if count == 1 else 'them'} to patch the words alone"
    ]


def pair_notes(pairs: Sequence[PromptPair], clean_ld: Any, corrupt_ld: Any, measured: str) -> list[str]:
    """What to know of the pairs' baselines (LD per pair, numpy): a total clean − corrupted difference with the sign
    the user did not expect, and the pairs that pull the other way (they count against the others in `measured`:
    "the shares", "the scores and the faithfulness")."""
    notes = []
    gaps = clean_ld - corrupt_ld
    total = float(gaps.sum())
    if total < 0:
        notes.append(
            f"the corrupted prompts favour the answer more than the clean ones (clean − corrupted = "
            f"{total / len(gaps):.3f} logits on average): answer and wrong may be swapped; {measured} are still "
            "measured against that difference"
        )
    against = [pair.source for pair, gap in zip(pairs, gaps, strict=True) if gap * total < 0]
    if against:
        listed = ", ".join(against[:3]) + (f" and {len(against) - 3:,} more" if len(against) > 3 else "")
        notes.append(
            f"the corruption moves the logit difference the other way in {counted(len(against), 'pair')} "
            f"({listed}): in {measured}, they count against the others"
        )
    return notes


class LogitDifference:
    """The metric of `patch` and `discover`: LD = logit(answer) − logit(wrong) at the last position of each row,
    the logits computed at that position alone where the model takes `logits_to_keep` ((B, 1, V), not (B, n, V))."""

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        takes = inspect.signature(loaded.lm_model.forward).parameters
        self.last_only = {"logits_to_keep": 1} if "logits_to_keep" in takes else {}

    def __call__(self, ids: Any, answer: Any, wrong: Any) -> Any:
        """(B,) float32 (float64 for a float64 model) on the model's device, with its graph where gradients are on:
        LD of each row of `ids`."""
        import torch

        logits = self.loaded.lm_model(input_ids=ids, **self.last_only).logits[:, -1]  # (B, V)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        rows = torch.arange(ids.shape[0], device=logits.device)
        return logits[rows, answer.to(logits.device)] - logits[rows, wrong.to(logits.device)]
