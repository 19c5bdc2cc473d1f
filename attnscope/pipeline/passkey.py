"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", the test DuoAttention's plans are checked on):
a number hidden at some depth of repeated filler text, then asked for. Each prompt's token ids, and where its answer
is, so that one forward pass says whether greedy decoding would give the passkey: it does exactly when, at every
answer token, the model's most likely next token (its logits' argmax at the position before) is that token, the
answer's earlier tokens given (teacher forcing on the right answer is greedy decoding as long as it is right).

The text, after their prompt:

    There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about
    the important information there. | The grass is green. The sky is blue. The sun is yellow. Here we go. There and
    back again. (repeated) | The pass key is 71432. Remember it. 71432 is the pass key. | (filler again) | What is the
    pass key? The pass key is| 71432

Pieces are tokenized apart and joined as ids, so that the passkey's tokens are the same at every depth and length.

The second task, RULER's multi-key needle (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your
Long-Context Language Models?", niah_multikey_1: several needles in the same repeated filler, one asked for), so that
a plan cannot pass by keeping the one head that copies any number it finds:

    Some special magic numbers are hidden in the following text. Memorize them: I will ask for one. | (filler)
    One of the special magic numbers for {word} is: {number}. (filler) ... |
    What is the special magic number for {word}? The special magic number for {word} is| {number}

MULTIKEY_KEYS needles, each a word of WORDS and a number of NUMBER_DIGITS digits (RULER's: 7), all distinct in a
prompt; the needle asked for at the depth asked, the others at depths drawn uniformly (several may share a place
between two fillers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError

INTRODUCTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
    "about the important information there."
)
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
ANSWER = " {key}"
DIGITS = 5  # passkeys of five digits, 10000 .. 99999

# RULER's introduction, shorter by 6 tokens (GPT-2's), so that a prompt of 128 tokens holds a filler
MULTIKEY_INTRODUCTION = (
    "Some special magic numbers are hidden in the following text. Memorize them: I will ask for one."
)
MULTIKEY_NEEDLE = " One of the special magic numbers for {word} is: {number}."
MULTIKEY_QUESTION = " What is the special magic number for {word}? The special magic number for {word} is"
MULTIKEY_KEYS = 4  # needles in a prompt, one asked for (RULER's niah_multikey_1 has 4)
NUMBER_DIGITS = 7  # RULER's: 1000000 .. 9999999
WORDS = (
    "apple", "river", "garden", "window", "candle", "mountain", "pencil", "rabbit", "engine", "harbor", "violin",
    "blanket", "castle", "desert", "feather", "helmet", "island", "jacket", "kettle", "lantern", "mirror", "needle",
    "orange", "pepper", "rocket", "saddle", "ticket", "tunnel", "wallet", "wizard", "anchor", "bridge",
)  # fmt: skip
TASKS = {
    "passkey": "passkey retrieval (Mohtashami & Jaggi 2023)",
    "multikey": f"multi-key needle (RULER, Hsieh et al. 2024): {MULTIKEY_KEYS} keys in the haystack, one asked for",
}


@dataclass(frozen=True)
class PasskeyPrompt:
    ids: tuple[int, ...]  # the whole prompt with its answer, BOS first when the tokenizer has one
    answer: tuple[int, int]  # the answer's tokens are ids[answer[0]:answer[1]]
    key: int
    length: int  # the length asked for (the prompt is at most this long)
    depth: float  # where the needle starts, as a share of the filler before it (0: first, 1: last)
    needle: tuple[int, int] = (0, 0)  # the needle's tokens are ids[needle[0]:needle[1]] (the one asked for)
    task: str = "passkey"  # a key of TASKS

    def hidden_from(self, sink: int, recent: int) -> bool:
        """Whether a streaming head (the first `sink` keys and the last `recent` before each query) sees none of
        the needle from the position that predicts the answer's first token: only then does the prompt test the
        heads that reach back."""
        query = self.answer[0] - 1  # keys query - recent + 1 .. query are the recent window
        return self.needle[0] >= sink and self.needle[1] <= query - recent + 1


def passkey_prompts(
    tokenizer: Any, lengths: Sequence[int], depths: Sequence[float], trials: int, seed: int = 0
) -> list[PasskeyPrompt]:
    """`trials` prompts for every length and depth (in that order: length, depth, trial), each with its own passkey
    drawn by a numpy generator seeded `seed`; each prompt as long as its length allows with whole fillers."""

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    bos = _bos(tokenizer)
    introduction, filler, question = ids(INTRODUCTION), ids(FILLER), ids(QUESTION)
    generator = np.random.default_rng(seed)
    prompts = []
    for length in lengths:
        for depth in depths:
            for _ in range(trials):
                key = int(generator.integers(10 ** (DIGITS - 1), 10**DIGITS))
                needle, answer = ids(NEEDLE.format(key=key)), ids(ANSWER.format(key=key))
                fixed = len(bos) + len(introduction) + len(needle) + len(question) + len(answer)
                fillers = _fillers(length, fixed, len(filler), "passkey")
                before = round(depth * fillers)
                start = len(bos) + len(introduction) + len(filler) * before
                body = bos + introduction + filler * before + needle + filler * (fillers - before) + question
                span = (len(body), len(body) + len(answer))
                hidden = (start, start + len(needle))
                prompts.append(PasskeyPrompt(tuple(body + answer), span, key, length, depth, hidden))
    return prompts


def multikey_prompts(
    tokenizer: Any, lengths: Sequence[int], depths: Sequence[float], trials: int, seed: int = 0, fitting: bool = False
) -> list[PasskeyPrompt]:
    """RULER's multi-key needle: `trials` prompts for every length and depth (length, depth, trial), each with
    MULTIKEY_KEYS distinct words and numbers drawn by a numpy generator seeded (`seed`, 1) (not the passkeys'
    draws); the needle asked for at `depth` of the filler, the others at uniform depths; `needle` is the span of
    the one asked for, `key` its number. A length too short for a prompt is refused, or with `fitting` left out
    (all its prompts; the other lengths' prompts are the same)."""

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    parts = (_bos(tokenizer) + ids(MULTIKEY_INTRODUCTION), ids(FILLER))
    generator = np.random.default_rng([seed, 1])
    prompts = []
    for length in lengths:
        drawn = [_multikey_draw(generator) for _ in depths for _ in range(trials)]
        made = [_multikey_prompt(ids, parts, length, depth, *draw) for depth, draw in zip(
            [depth for depth in depths for _ in range(trials)], drawn, strict=True)]  # fmt: skip
        if any(prompt is None for prompt in made):
            if fitting:
                continue
            raise AttnscopeError(
                f"a multi-key prompt of {length} tokens is too short: its introduction, {MULTIKEY_KEYS} needles, "
                "question and one filler do not fit"
            )
        prompts += made
    return prompts


def _multikey_draw(generator: np.random.Generator) -> tuple[list[str], list[int], list[float]]:
    """A prompt's words, numbers and the other needles' depths (the first word is the one asked for)."""
    words = [WORDS[k] for k in generator.choice(len(WORDS), MULTIKEY_KEYS, replace=False)]
    numbers = generator.choice(9 * 10 ** (NUMBER_DIGITS - 1), MULTIKEY_KEYS, replace=False)
    depths = [float(generator.uniform()) for _ in range(MULTIKEY_KEYS - 1)]
    return words, [int(number) + 10 ** (NUMBER_DIGITS - 1) for number in numbers], depths


def _multikey_prompt(
    ids: Any, parts: tuple[list[int], list[int]], length: int, depth: float, words: list[str], numbers: list[int],
    others: list[float],
) -> PasskeyPrompt | None:  # fmt: skip
    """One multi-key prompt of at most `length` tokens (None where its fixed parts and one filler do not fit): the
    needle of words[0] at `depth`, the others at `others`, then the question for words[0]."""
    opening, filler = parts
    needles = [ids(MULTIKEY_NEEDLE.format(word=w, number=k)) for w, k in zip(words, numbers, strict=True)]
    question, answer = ids(MULTIKEY_QUESTION.format(word=words[0])), ids(ANSWER.format(key=numbers[0]))
    fixed = len(opening) + sum(map(len, needles)) + len(question) + len(answer)
    fillers = (length - fixed) // len(filler)
    if fillers < 1:
        return None
    places = [round(depth * fillers)] + [round(other * fillers) for other in others]
    body, hidden = list(opening), (0, 0)
    for place in range(fillers + 1):
        for k in (k for k, at in enumerate(places) if at == place):  # the asked needle first
            if k == 0:
                hidden = (len(body), len(body) + len(needles[0]))
            body += needles[k]
        body += filler if place < fillers else question
    span = (len(body), len(body) + len(answer))
    return PasskeyPrompt(tuple(body + answer), span, numbers[0], length, depth, hidden, task="multikey")


def task_prompts(
    tokenizer: Any, lengths: Sequence[int], depths: Sequence[float], trials: int, seed: int = 0
) -> list[PasskeyPrompt]:
    """Every task's prompts (TASKS, in order), each task's in `passkey_prompts`' order; the multi-key needle's at the
    lengths that hold them (its fixed parts are about twice the passkey's: 148 tokens with the demo's tokenizer)."""
    return passkey_prompts(tokenizer, lengths, depths, trials, seed) + multikey_prompts(
        tokenizer, lengths, depths, trials, seed, fitting=True
    )


def _bos(tokenizer: Any) -> list[int]:
    return [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]


def _fillers(length: int, fixed: int, filler: int, task: str) -> int:
    """How many whole fillers a prompt of `length` tokens holds beside its `fixed` tokens; at least one."""
    fillers = (length - fixed) // filler
    if fillers < 1:
        raise AttnscopeError(
            f"a {task} prompt of {length} tokens is too short: its fixed parts alone take {fixed} tokens and one "
            f"filler {filler}"
        )
    return fillers


def passkey_results(
    loaded: Any, prompts: Sequence[PasskeyPrompt], streaming: dict[int, Sequence[int]] | None = None,
    sink: int = 0, recent: int = 0,
) -> list[bool]:  # fmt: skip
    """Whether greedy decoding gives each prompt's answer (either task), with full attention (`streaming` None) or
    with the query heads in `streaming` (layer -> heads) limited to the first `sink` and the last `recent` keys
    (`pipeline.streaming`: tile by tile, no (n × n) map of a head). One prompt a forward (a long prompt is a batch of
    its own on a CPU), no KV cache, only the answer's logits computed (a 4,096-token prompt's whole logits over
    GPT-2's vocabulary would take 800 MB)."""
    import torch

    from attnscope.pipeline.streaming import StreamingPlan, forward
    from attnscope.pipeline.streaming import streaming as streaming_attention

    if loaded.lm_model is None:
        raise AttnscopeError("the passkey check needs the model's language-model head: load it with lm_head=True")
    plan = StreamingPlan.of(streaming, sink, recent)
    results = []
    with torch.inference_mode(), streaming_attention(loaded):
        for prompt in prompts:
            start, end = prompt.answer
            ids = torch.tensor([prompt.ids[: end - 1]], device=loaded.device)  # (1, n): the last token predicts none
            keep = torch.arange(start - 1, end - 1, device=loaded.device)  # the positions that predict the answer
            output = forward(loaded.lm_model, plan, loaded.n_layer, input_ids=ids, logits_to_keep=keep)
            logits = output.logits[0].float()  # (answer tokens, V)
            predicted = logits.argmax(-1)
            results.append(bool((predicted == torch.tensor(prompt.ids[start:end], device=loaded.device)).all()))
    return results
