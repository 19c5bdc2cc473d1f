"""Which heads carry what two prompts differ in: activation patching per head (`attnscope patch`).

A pair is a clean prompt, a corrupted one of as many tokens (a few tokens changed), the token the clean prompt
predicts (`answer`) and the one it is measured against (`wrong`, what the corrupted prompt pushes instead). The
metric is the logit difference at the last position, LD = logit(answer) − logit(wrong) (Wang et al. 2022;
Heimersheim & Nanda 2024): two logits of one forward pass, in logits, free of the softmax's normalisation over the
vocabulary.

A head's output is its slice of the output projection's input (what `HeadGates` gates), at every position of the
prompt; positions correspond because the two prompts have the same length. For each head h and pair p:

    denoising:  LD_p(corrupt | h ← clean)    the corrupted run with h's output replaced by its clean output
    noising:    LD_p(clean | h ← corrupt)    the clean run with h's output replaced by its corrupted output

Everything after the head recomputes on the patched output (later heads, MLPs): a share is the head's total effect,
through every path downstream, not its direct effect on the logits.

Pairs combine as a ratio of sums, D_p = LD_p(clean) − LD_p(corrupt) being a pair's difference:

    restored_h = Σ_p (LD_p(corrupt | h ← clean) − LD_p(corrupt)) / Σ_p D_p
    removed_h  = Σ_p (LD_p(clean) − LD_p(clean | h ← corrupt))   / Σ_p D_p

the normalised effect on the mean logit difference, as Wang et al. (2022) and Heimersheim & Nanda (2024) report it;
it is also the mean of the per-pair shares weighted by D_p, so a pair whose corruption barely moves the logits
weighs little instead of dividing by nearly zero. 1 = all of the difference, 0 = none; below 0 or above 1 when
patching moves the logit difference the other way, or past the other run's. A mean |D| under GAP_MIN logits leaves
no difference to share: the run is refused. A pair whose D has the other sign than the sum is named in the notes.

The answer is read as the word that follows the prompt (`continuation`): `Mary` and ` Mary` both mean the token
` Mary` after "… gave a drink to"; punctuation is taken as written. It must be one token (refused otherwise).

Cost: for each batch of pairs of one length (no padding), two forward passes recording every head's output and
every layer's output (clean, corrupted), then 2·L·H patched runs: the heads of one layer run as copies of the batch,
as many per forward pass as fit in MAX_COPY_TOKENS tokens (`interventions.PatchedHeads`), and the layers below
theirs are not computed again (`interventions.SkippedLayers`: they return what they returned in the unpatched run),
so patching layer l costs layers l .. L−1, about half a forward pass on average. The fastest attention runs (no
attention weights are needed), and the logits are computed at the last position only. The baselines of every pair
are measured first, so a corruption that changes nothing is refused before the patched runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope import settings
from attnscope.analyses.common import check_finite, check_weights
from attnscope.analyses.result import Result
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel, fastest_attention
from attnscope.output.patch import PatchView
from attnscope.pipeline import interventions
from attnscope.pipeline.prompt_pairs import (
    LogitDifference,
    PromptPair,
    batch,
    check_gap,
    given_pair,
    length_groups,
    pair_notes,
    pair_records,
    read_pairs,
    tokenized,
    written_specials,
)
from attnscope.pipeline.tokens import default_bos, special_tokens
from attnscope.scores.catalog import counted

OVERSHOOT, BACKWARDS = 1.05, -0.1  # shares above the one or below the other are counted in the notes


@dataclass(repr=False)  # the repr is Result's: a summary
class PatchResult(Result):
    """Every head's restored and removed shares (L, H) numpy float64 (see the module docstring), the pairs with their
    baseline logit differences, and each pair's patched logit differences (P, L, H): `denoised` (the corrupted run
    with the head's clean output), `noised` (the clean run with the head's corrupted output)."""

    view_class = PatchView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    model: dict[str, Any]
    inputs: dict[str, Any]
    settings: dict[str, Any]
    pairs: list[dict[str, Any]]
    clean_logit_diff: float  # mean over pairs
    corrupt_logit_diff: float
    restored: np.ndarray
    removed: np.ndarray
    denoised: np.ndarray
    noised: np.ndarray
    notes: list[str] = field(default_factory=list)

    def ranked(self) -> list[tuple[int, int]]:
        """Heads from the largest restored share to the smallest, ties in layer.head order."""
        n_layer, n_head = self.restored.shape
        return sorted(
            ((layer, head) for layer in range(n_layer) for head in range(n_head)),
            key=lambda lh: (-self.restored[lh], lh),
        )

    def ranked_labels(self) -> list[str]:
        return [f"{layer}.{head}" for layer, head in self.ranked()]


# ------------------------------------------------------------------------------------------------- passes


class _Passes:
    """The forward passes of one model: logit differences at the last position, recorded runs and patched runs."""

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.metric = LogitDifference(loaded)

    def logit_differences(self, ids: Any, answer: Any, wrong: Any) -> Any:
        """(B,) float64: logit(answer) − logit(wrong) at the last position of each row of `ids` (B, n)."""
        return self.metric(ids, answer, wrong).double().cpu()

    def recorded(self, ids: Any, answer: Any, wrong: Any) -> tuple[dict[int, Any], dict[int, Any]]:
        """Every layer's heads' outputs (B, n, H, d_head) in the run of `ids`, and what every layer returned."""
        heads, layers = interventions.HeadOutputsRecorder(), interventions.LayerOutputsRecorder()
        with interventions.hooks(self.loaded, heads, layers):
            self.logit_differences(ids, answer, wrong)
        return heads.outputs, layers.outputs

    def patched(self, ids: Any, answer: Any, wrong: Any, sources: dict[int, Any], returned: dict[int, Any]) -> Any:
        """(L·H, B) float64: the logit differences of the run of `ids` (B, n) with head k's output (layer-major)
        replaced by its output in `sources` (layer -> (B, n, H, d_head)), one head at a time. The heads of a layer
        run as copies of the batch, as many per pass as fit in MAX_COPY_TOKENS; the layers below theirs are not
        computed again: they return what they did in the run of `ids` (`returned`)."""
        import torch

        loaded = self.loaded
        L, H = loaded.n_layer, loaded.n_head
        B, n = ids.shape
        per_pass = max(1, interventions.MAX_COPY_TOKENS // (B * n))  # copies of the batch per forward pass
        patches = interventions.PatchedHeads()
        found = torch.empty(L * H, B, dtype=torch.float64)
        with interventions.hooks(loaded, patches):
            for layer in range(L):
                for first in range(0, H, per_pass):
                    heads = torch.arange(first, min(first + per_pass, H))
                    k = len(heads)
                    chosen = torch.zeros(k, 1, 1, H, dtype=torch.bool, device=loaded.device)  # (C, B, n, H)
                    chosen[torch.arange(k), 0, 0, heads] = True  # copy c patches head heads[c] at every position
                    patches.chosen, patches.values = {layer: chosen}, {layer: sources[layer]}
                    with interventions.hooks(loaded, interventions.SkippedLayers(returned, layer, k)):
                        differences = self.logit_differences(ids.repeat(k, 1), answer.repeat(k), wrong.repeat(k))
                    found[layer * H + first : layer * H + first + k] = differences.view(k, B)  # (k, B)
        return found


# ------------------------------------------------------------------------------------------------- the analysis


class Patch(settings.Patch):
    """Every head's restored and removed shares over the pairs (see the module docstring). Needs the model loaded
    with its language-model head."""

    def read_inputs(self) -> list[PromptPair]:
        """The pairs: the one of clean, corrupt, answer and wrong, or those of the file."""
        if self.file is not None:
            return read_pairs(self.file)
        return given_pair(self.clean, self.corrupt, self.answer, self.wrong)

    def run(self, loaded: LoadedModel, pairs: Sequence[PromptPair] | None = None, progress: Any = None) -> PatchResult:
        import torch

        if loaded.lm_model is None:
            raise AttnscopeError("patch needs the model's language-model head, and this model was loaded without it")
        self.check_shape(loaded.shape)
        pairs = list(self.read_inputs() if pairs is None else pairs)
        # SDPA turns a NaN head's output into zeros: a damaged model would pass for a sound one
        check_weights(loaded)
        bos = default_bos(loaded.tokenizer, loaded.kind) if self.bos is None else self.bos
        prefix, _ = special_tokens(loaded.tokenizer, loaded.kind, bos)
        tokens = [tokenized(loaded, pair, prefix) for pair in pairs]
        L, H, P = loaded.n_layer, loaded.n_head, len(pairs)
        clean_ld, corrupt_ld = np.zeros(P), np.zeros(P)
        denoised, noised = np.zeros((P, L, H)), np.zeros((P, L, H))
        passes = _Passes(loaded)
        groups = length_groups([len(pair.clean) for pair in tokens], self.batch_size, self.max_tokens)

        with interventions.attention(loaded, fastest_attention(loaded.lm_model)), torch.inference_mode():
            for group in groups:  # the baselines first: a corruption that changes nothing is refused before the rest
                clean, corrupt, answer, wrong = batch(tokens, group, loaded.device)
                clean_ld[group] = passes.logit_differences(clean, answer, wrong).numpy()
                corrupt_ld[group] = passes.logit_differences(corrupt, answer, wrong).numpy()
            check_finite(loaded, "logit difference", np.concatenate([clean_ld, corrupt_ld]))
            check_gap(clean_ld, corrupt_ld, "a head to restore")
            for group in groups:
                clean, corrupt, answer, wrong = batch(tokens, group, loaded.device)
                clean_heads, clean_layers = passes.recorded(clean, answer, wrong)
                corrupt_heads, corrupt_layers = passes.recorded(corrupt, answer, wrong)
                found = passes.patched(corrupt, answer, wrong, clean_heads, corrupt_layers)  # (L·H, B)
                denoised[group] = found.T.reshape(len(group), L, H).numpy()
                found = passes.patched(clean, answer, wrong, corrupt_heads, clean_layers)
                noised[group] = found.T.reshape(len(group), L, H).numpy()
        check_finite(loaded, "patched logit difference", np.concatenate([denoised.ravel(), noised.ravel()]))
        total = float(np.sum(clean_ld - corrupt_ld))
        restored = (denoised - corrupt_ld[:, None, None]).sum(axis=0) / total  # (L, H)
        removed = (clean_ld[:, None, None] - noised).sum(axis=0) / total  # (L, H)
        source = pairs[0].source if self.file is None else "standard input" if self.file == "-" else self.file
        return PatchResult(
            loaded.info(),
            {
                "source": source,
                "n_pairs": P,
                "n_tokens": sum(len(pair.clean) for pair in tokens),
                "bos": bos,
            },
            {"top": self.top, "batch_size": self.batch_size, "max_tokens": self.max_tokens},
            pair_records(loaded, pairs, tokens, clean_ld, corrupt_ld),
            float(np.mean(clean_ld)),
            float(np.mean(corrupt_ld)),
            restored,
            removed,
            denoised,
            noised,
            notes=_notes(pairs, clean_ld, corrupt_ld, restored, removed)
            + written_specials(loaded, pairs, tokens, len(prefix)),
        )


def _notes(pairs: Sequence[PromptPair], clean_ld: Any, corrupt_ld: Any, restored: Any, removed: Any) -> list[str]:
    """What to know: a total difference with the sign the user did not expect, pairs that pull the other way,
    shares past 1 or below 0."""
    notes = pair_notes(pairs, clean_ld, corrupt_ld, "the shares")
    for name, shares in (("restored", restored), ("removed", removed)):
        above, below = int((shares > OVERSHOOT).sum()), int((shares < BACKWARDS).sum())
        if above:
            notes.append(
                f"the {name} share of {counted(above, 'head')} is above 1 (up to {shares.max():.2f}): patching each "
                "overshoots, moving the logit difference past the other run's"
            )
        if below:
            notes.append(
                f"the {name} share of {counted(below, 'head')} is below {BACKWARDS:g} (down to {shares.min():.2f}): "
                "patching each moves the logit difference the other way"
            )
    return notes
