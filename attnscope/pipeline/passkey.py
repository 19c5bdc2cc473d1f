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


@dataclass(frozen=True)
class PasskeyPrompt:
    ids: tuple[int, ...]  # the whole prompt with its answer, BOS first when the tokenizer has one
    answer: tuple[int, int]  # the answer's tokens are ids[answer[0]:answer[1]]
    key: int
    length: int  # the length asked for (the prompt is at most this long)
    depth: float  # where the needle starts, as a share of the filler before it (0: first, 1: last)
    needle: tuple[int, int] = (0, 0)  # the needle's tokens are ids[needle[0]:needle[1]]

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

    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    introduction, filler, question = ids(INTRODUCTION), ids(FILLER), ids(QUESTION)
    generator = np.random.default_rng(seed)
    prompts = []
    for length in lengths:
        for depth in depths:
            for _ in range(trials):
                key = int(generator.integers(10 ** (DIGITS - 1), 10**DIGITS))
                needle, answer = ids(NEEDLE.format(key=key)), ids(ANSWER.format(key=key))
                fixed = len(bos) + len(introduction) + len(needle) + len(question) + len(answer)
                fillers = (length - fixed) // len(filler)
                if fillers < 1:
                    raise AttnscopeError(
                        f"a passkey prompt of {length} tokens is too short: its fixed parts alone take {fixed} tokens "
                        f"and one filler {len(filler)}"
                    )
                before = round(depth * fillers)
                start = len(bos) + len(introduction) + len(filler) * before
                body = bos + introduction + filler * before + needle + filler * (fillers - before) + question
                span = (len(body), len(body) + len(answer))
                hidden = (start, start + len(needle))
                prompts.append(PasskeyPrompt(tuple(body + answer), span, key, length, depth, hidden))
    return prompts


def passkey_results(
    loaded: Any, prompts: Sequence[PasskeyPrompt], streaming: dict[int, Sequence[int]] | None = None,
    sink: int = 0, recent: int = 0,
) -> list[bool]:  # fmt: skip
    """Whether greedy decoding gives each prompt's passkey, with full attention (`streaming` None) or with the
    query heads in `streaming` (layer -> heads) limited to the first `sink` and the last `recent` keys
    (`interventions.StreamingHeads`). One prompt a forward (a long prompt is a batch of its own on a CPU), SDPA, only
    the answer's logits computed (a 4,096-token prompt's whole logits over GPT-2's vocabulary would take 800 MB)."""
    import torch

    from attnscope.pipeline.interventions import StreamingHeads, attention, hooks

    if loaded.lm_model is None:
        raise AttnscopeError("the passkey check needs the model's language-model head: load it with lm_head=True")
    narrowed = [StreamingHeads(streaming, sink, recent)] if streaming else []
    results = []
    with torch.inference_mode(), attention(loaded, "sdpa"), hooks(loaded, *narrowed):
        for prompt in prompts:
            start, end = prompt.answer
            ids = torch.tensor([prompt.ids[: end - 1]], device=loaded.device)  # (1, n): the last token predicts none
            keep = torch.arange(start - 1, end - 1, device=loaded.device)  # the positions that predict the answer
            logits = loaded.lm_model(input_ids=ids, logits_to_keep=keep).logits[0].float()  # (answer tokens, V)
            predicted = logits.argmax(-1)
            results.append(bool((predicted == torch.tensor(prompt.ids[start:end], device=loaded.device)).all()))
    return results
