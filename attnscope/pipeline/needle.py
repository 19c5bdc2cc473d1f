"""The needle-in-a-haystack probe (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context
Factuality", arXiv 2404.15574), teacher-forced: the haystack with the needle inside, then the needle again, on which a
retrieval head's strongest key, at each token of the copy, is that token in the haystack's needle (the statistic:
`scores.rows.retrieval_hits`, `pipeline.reducers.RetrievalStatistics`).

One window per depth of DEPTHS, each

    [BOS]  h_0 … h_{d-1}  c  n_0 … n_{N-1}  h_d … h_{H-1}  c  n_0 … n_{N-1}
           └─────── the haystack, H tokens, with the cue and the needle at d ───────┘  └─ the copy ─┘

- the haystack: the first H = `haystack_len` tokens of the bundled sample texts (`attnscope/sample_texts`, in
  file-name order, joined by blank lines, tokenized once and repeated as often as H needs, as Wu et al. loop over
  their essays): natural text, as Wu et al.'s haystack is, so that the needle is the one foreign thing in it;
- the needle n: N = NEEDLE_LEN distinct random ordinary word tokens (a space and a lowercase word, as the
  repeated-token probe draws), and the cue c one more: none of them occurs in the haystack, so each needle token has
  exactly one position before the copy and "the needle token being copied" names one key;
- d = round(depth · H): the needle at 10 %, 50 % and 90 % of the haystack;
- the cue stands for Wu et al.'s question: it comes right before the needle and again right before the copy, so the
  copy's first token has a cue to be retrieved by, as the question gives the answer's first token in theirs.

Scored rows: the N rows whose next token is a needle token of the copy, q_k = (the copy's start) − 1 + k for
k = 0 … N−1 (q_0 is the second cue, q_k for k ≥ 1 the copy's n_{k−1}); the target of q_k is n_k's position in the
haystack's needle. Every window has the same length, so the scored rows are the same in all; only the targets move
with the depth. Seeded (`--probe-seed`), so every run sees the same needles; each window draws its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.pipeline.inputs import sample_texts
from attnscope.pipeline.probe import check_probe, ordinary_token_ids
from attnscope.pipeline.tokens import Batch, Window, batches

NEEDLE_LEN = 16  # needle tokens: 3 depths × 16 = 48 scored rows, so no score equals the threshold 0.1 (4.8 rows)
DEPTHS = (0.1, 0.5, 0.9)  # where the needle sits in the haystack, as a share of its tokens
MIN_HAYSTACK_LEN = 10  # the shortest haystack whose three depths are three different places
# The haystack when none is asked for (--haystack-len), or less where the model's context cannot hold it: a window
# of 1 + 90 + 2 · 17 = 125 tokens, as long as the windows the demo model was trained on (128) allow, so that its
# induction heads are measured where they were trained (at 200, past them, its best retrieval score fell from 0.98 to
# 0.52), and about as long as the repeated-token probe's (101); `attnscope heads --model demo` takes as long as it
# did without this probe (docs/performance.md). A longer haystack is a longer context: --haystack-len.
DEFAULT_HAYSTACK_LEN = 90
SKIPPED = "retrieval was not measured"


def window_length(haystack_len: int, bos: bool) -> int:
    """Tokens of one window: BOS (when the model has one), the haystack, the cue and the needle twice."""
    return int(bos) + haystack_len + 2 * (1 + NEEDLE_LEN)


def haystack_ids(tokenizer: Any, length: int) -> list[int]:
    """The first `length` tokens of the sample texts joined by blank lines, repeated as often as `length` needs."""
    text = "\n\n".join(text.text for text in sample_texts())
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return (ids * (length // len(ids) + 1))[:length]


@dataclass(frozen=True)
class Needle:
    """The needle probe as every analysis runs it: its haystack length, seed, windows (one per depth of DEPTHS) and
    where each window's needle starts (its n_0)."""

    haystack_len: int
    seed: int
    windows: list[Window]
    needle_starts: tuple[int, ...]

    @property
    def first_query(self) -> int:
        """The first row scored: the second cue, whose next token is the copy's first."""
        return len(self.windows[0].ids) - NEEDLE_LEN - 1

    @property
    def scored_rows(self) -> int:
        return NEEDLE_LEN * len(self.windows)

    def batch(self, device: Any) -> tuple[Batch, Any]:
        """The windows as one batch, and the needle start of each of its windows in the batch's order ((B,) long on
        `device`): the targets a RetrievalStatistics of this batch needs."""
        import torch

        (batch,) = batches(self.windows, len(self.windows), device)
        starts = torch.tensor([self.needle_starts[index] for index in batch.indices], device=device)  # (B,)
        return batch, starts

    def summary(self) -> dict[str, Any]:
        """What the JSON says of it (`input.needle`)."""
        return {
            "haystack_len": self.haystack_len,
            "needle_len": NEEDLE_LEN,
            "depths": list(DEPTHS),
            "seed": self.seed,
            "scored_rows": self.scored_rows,
        }


def needle_windows(tokenizer: Any, haystack_len: int, n_ctx: int, seed: int = 0) -> Needle:
    """The probe's windows (see the module docstring); an AttnscopeError for a haystack that is too short, too long
    for the context, or a vocabulary without enough ordinary words outside it."""
    import numpy as np

    prefix = (tokenizer.bos_token_id,) if tokenizer.bos_token_id is not None else ()
    length = window_length(haystack_len, bool(prefix))
    what = f"the haystack + twice a cue and a needle of {NEEDLE_LEN} tokens"
    check_probe("haystack length", haystack_len, MIN_HAYSTACK_LEN, what, length, bool(prefix), n_ctx, seed)
    haystack = haystack_ids(tokenizer, haystack_len)
    present = set(haystack) | set(prefix)
    candidates = [token for token in ordinary_token_ids(tokenizer) if token not in present]
    if len(candidates) < NEEDLE_LEN + 1:
        raise AttnscopeError(
            f"the vocabulary has only {len(candidates)} ordinary word tokens outside the haystack, fewer than a cue "
            f"and a needle of {NEEDLE_LEN}"
        )
    generator = np.random.default_rng(seed)
    windows, starts = [], []
    for index, depth in enumerate(DEPTHS):
        drawn = [int(candidates[k]) for k in generator.choice(len(candidates), size=NEEDLE_LEN + 1, replace=False)]
        cue, needle = drawn[:1], drawn[1:]
        at = round(depth * haystack_len)
        ids = (*prefix, *haystack[:at], *cue, *needle, *haystack[at:], *cue, *needle)
        windows.append(Window(index, ids, 0))
        starts.append(len(prefix) + at + 1)
    return Needle(haystack_len, seed, windows, tuple(starts))


def needle_for(model: Any, on: bool, haystack_len: int | None, seed: int) -> tuple[Needle | None, list[str]]:
    """The needle probe of a run with the probes `on` (--probe), a haystack of `haystack_len` tokens
    (--haystack-len; None: DEFAULT_HAYSTACK_LEN, or what the model's context holds) and `seed` (--probe-seed), and
    notes; None where it does not run (off, an encoder, or a model that cannot hold even the shortest haystack, or
    whose vocabulary cannot make a needle: the notes say which). Built before the texts run, so that a bad length
    stops the command at once."""
    if not on:
        return None, []
    if not model.kind.probe:
        return None, []  # the repeated-token probe's note (probe.ENCODER_NOTE) names both probes
    notes = []
    if haystack_len is None:
        bos = model.tokenizer.bos_token_id is not None
        fits = model.n_ctx - window_length(0, bos)
        haystack_len = min(DEFAULT_HAYSTACK_LEN, fits)
        if haystack_len < MIN_HAYSTACK_LEN:
            why = f"the model's context of {model.n_ctx} tokens cannot hold it"
            return None, [f"the needle probe was skipped: {why}; {SKIPPED}"]
        if haystack_len < DEFAULT_HAYSTACK_LEN:
            notes.append(
                f"needle probe's haystack shortened to {haystack_len} tokens to fit the context of {model.n_ctx} tokens"
            )
        try:
            return needle_windows(model.tokenizer, haystack_len, model.n_ctx, seed), notes
        except AttnscopeError as error:  # a vocabulary too small for a needle: the probe's default is not the user's
            return None, [*notes, f"the needle probe was skipped: {error}; {SKIPPED}"]
    return needle_windows(model.tokenizer, haystack_len, model.n_ctx, seed), notes
