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
so patching layer l costs layers l .. L−1, about half a forward pass on average. A batch holds, unless `batch_size`
says otherwise, as many pairs of one length as let the H copies of one layer fill such a pass
(`prompt_pairs.length_groups`). With 8 pairs to a batch (the windows' default, as it was), 1,000 pairs of 15 tokens
on a 30-layer model of 9 heads made 125 batches of 64 passes of 1,080 tokens (8,000 passes); 17 batches of 60 make
1,088 passes of up to 8,100 tokens: the same arithmetic in a seventh of the passes, which saves each pass's fixed
cost (its kernel launches and Python: what a GPU's time goes to at that size; on the CPU the arithmetic dominates).
The fastest attention runs (no attention weights are needed), and the logits are computed at the last position only.
The baselines of every pair are measured first, so a corruption that changes nothing is refused before the patched
runs.

Under torchrun the batches' baselines, then the patched runs (a batch, a direction, a layer and the heads of one
pass, as one process makes them: `_Passes.runs`) are shared, run i on process i mod N (`distributed.run_shared`); a
process records a batch's two runs at its first patched run of that batch. The results are gathered in order: one
process's, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope import settings
from attnscope.analyses.common import check_finite, check_weights
from attnscope.analyses.result import Result, heads_by_value
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel, fastest_attention
from attnscope.output.patch import PatchView
from attnscope.pipeline import distributed, interventions
from attnscope.pipeline.prompt_pairs import (
    LogitDifference,
    PromptPair,
    TokenizedPair,
    batch,
    check_gap,
    length_groups,
    pair_notes,
    pair_records,
    pairs_given,
    tokenized_pairs,
    written_specials,
)
from attnscope.pipeline.tokens import default_bos
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
        return heads_by_value(self.restored)

    def ranked_labels(self) -> list[str]:
        return [f"{layer}.{head}" for layer, head in self.ranked()]


# ------------------------------------------------------------------------------------------------- passes


class _Passes:
    """The forward passes of one model over the batches of pairs `groups` of `tokens`: logit differences at the last
    position, recorded runs and patched runs."""

    def __init__(self, loaded: LoadedModel, tokens: Sequence[TokenizedPair], groups: Sequence[Sequence[int]]):
        self.loaded, self.tokens, self.groups = loaded, tokens, groups
        self.metric = LogitDifference(loaded)
        self.held: tuple[int, Any] | None = None  # (batch, what its patched runs need): one batch's at a time

    def logit_differences(self, ids: Any, answer: Any, wrong: Any) -> Any:
        """(B,) float64: logit(answer) − logit(wrong) at the last position of each row of `ids` (B, n)."""
        return self.metric(ids, answer, wrong).double().cpu()

    def baselines(self, group: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The clean and corrupted logit differences (B,) of the pairs `group`."""
        clean, corrupt, answer, wrong = batch(self.tokens, group, self.loaded.device)
        return self.logit_differences(clean, answer, wrong).numpy(), self.logit_differences(
            corrupt, answer, wrong
        ).numpy()

    def recorded(self, ids: Any, answer: Any, wrong: Any) -> tuple[dict[int, Any], dict[int, Any]]:
        """Every layer's heads' outputs (B, n, H, d_head) in the run of `ids`, and what every layer returned."""
        heads, layers = interventions.HeadOutputsRecorder(), interventions.LayerOutputsRecorder()
        with interventions.hooks(self.loaded, heads, layers):
            self.logit_differences(ids, answer, wrong)
        return heads.outputs, layers.outputs

    def runs(self) -> list[tuple[int, int, int, int, int]]:
        """Every patched run, in order: (batch, direction (0 denoising, 1 noising), layer, first head, last head + 1):
        the heads of one layer as copies of the batch, as many per forward pass as fit in MAX_COPY_TOKENS."""
        L, H = self.loaded.n_layer, self.loaded.n_head
        found = []
        for index, group in enumerate(self.groups):
            per_pass = max(1, interventions.MAX_COPY_TOKENS // (len(group) * len(self.tokens[group[0]].clean)))
            for direction in (0, 1):
                for layer in range(L):
                    found += [
                        (index, direction, layer, first, min(first + per_pass, H)) for first in range(0, H, per_pass)
                    ]
        return found

    def patched(self, run: tuple[int, int, int, int, int]) -> np.ndarray:
        """(k, B) float64: the logit differences of one patched run (`runs`): the corrupted run of the batch with
        heads first .. last − 1 of the layer each given its clean output, one per copy of the batch (denoising), or
        the clean run with their corrupted outputs (noising). The layers below the layer are not computed again:
        they return what they did in the unpatched run. The batch's two recorded runs are made at its first patched
        run, and held until the next batch's."""
        import torch

        index, direction, layer, first, last = run
        if self.held is None or self.held[0] != index:
            self.held = None  # the last batch's records go before this one's are made
            clean, corrupt, answer, wrong = batch(self.tokens, self.groups[index], self.loaded.device)
            clean_heads, clean_layers = self.recorded(clean, answer, wrong)
            corrupt_heads, corrupt_layers = self.recorded(corrupt, answer, wrong)
            self.held = (
                index,
                (
                    (corrupt, answer, wrong, clean_heads, corrupt_layers),  # denoising: into the corrupted run
                    (clean, answer, wrong, corrupt_heads, clean_layers),  # noising: into the clean run
                ),
            )
        ids, answer, wrong, sources, returned = self.held[1][direction]
        loaded = self.loaded
        k, H = last - first, loaded.n_head
        chosen = torch.zeros(k, 1, 1, H, dtype=torch.bool, device=loaded.device)  # (C, B, n, H)
        chosen[torch.arange(k), 0, 0, torch.arange(first, last)] = True  # copy c patches head first + c everywhere
        patches = interventions.PatchedHeads()
        patches.chosen, patches.values = {layer: chosen}, {layer: sources[layer]}
        with interventions.hooks(loaded, patches, interventions.SkippedLayers(returned, layer, k)):
            differences = self.logit_differences(ids.repeat(k, 1), answer.repeat(k), wrong.repeat(k))
        return differences.view(k, ids.shape[0]).numpy()  # (k, B)


# ------------------------------------------------------------------------------------------------- the analysis


class Patch(settings.Patch):
    """Every head's restored and removed shares over the pairs (see the module docstring). Needs the model loaded
    with its language-model head."""

    def read_inputs(self) -> list[PromptPair]:
        """The pairs: the one of clean, corrupt, answer and wrong, or those of the file."""
        return pairs_given(self.file, self.clean, self.corrupt, self.answer, self.wrong)

    def run(self, loaded: LoadedModel, pairs: Sequence[PromptPair] | None = None, progress: Any = None) -> PatchResult:
        import torch

        if loaded.lm_model is None:
            raise AttnscopeError("patch needs the model's language-model head, and this model was loaded without it")
        self.check_shape(loaded.shape)
        pairs = list(self.read_inputs() if pairs is None else pairs)
        # SDPA turns a NaN head's output into zeros: a damaged model would pass for a sound one
        check_weights(loaded)
        bos = default_bos(loaded.tokenizer, loaded.kind) if self.bos is None else self.bos
        prefix, tokens = tokenized_pairs(loaded, pairs, bos)
        L, H, P = loaded.n_layer, loaded.n_head, len(pairs)
        clean_ld, corrupt_ld = np.zeros(P), np.zeros(P)
        denoised, noised = np.zeros((P, L, H)), np.zeros((P, L, H))
        groups = length_groups([len(pair.clean) for pair in tokens], self.batch_size, self.max_tokens, copies=H)
        passes = _Passes(loaded, tokens, groups)

        # Under torchrun the batches' baselines and then the patched runs are shared (`distributed.run_shared`):
        # each process makes every N-th of them, as one process makes it, and the results are gathered in order.
        with interventions.attention(loaded, fastest_attention(loaded.lm_model)), torch.inference_mode():
            # the baselines first: a corruption that changes nothing is refused before the patched runs
            for group, (clean, corrupt) in zip(groups, distributed.run_shared(groups, passes.baselines), strict=True):
                clean_ld[group], corrupt_ld[group] = clean, corrupt
            check_finite(loaded, "logit difference", np.concatenate([clean_ld, corrupt_ld]))
            check_gap(clean_ld, corrupt_ld, "a head to restore")
            runs = passes.runs()
            for (index, direction, layer, first, last), found in zip(
                runs, distributed.run_shared(runs, passes.patched), strict=True
            ):
                (denoised, noised)[direction][groups[index], layer, first:last] = found.T  # (B, k)
            passes.held = None
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
