"""Which heads matter: the change in language-model loss when a head's output is removed (`attnscope ablate`).

A head is removed by replacing its slice of the input of the output projection W_O (the concatenated head outputs:
GPT-2's `attn.c_proj`, BERT's `attention.output.dense`) with a forward pre-hook (`pipeline.interventions.HeadGates`;
transformers v5 has no `head_mask`) by what `ablation` says (`pipeline.ablation`): its mean over every position of
the loss windows (the default), 0, or its output at the same position of another window. Every head's output x_h
passes through one gate ξ_h: x_h·ξ_h + r_h·(1 − ξ_h) (1 = kept, 0 = replaced by r_h); Michel et al. 2019 ("Are
Sixteen Heads Really Better than One?") estimate importance without removing anything as |∂L/∂ξ_h| at ξ = 1, one
backward pass for all heads (with zero ablation their gate's; with the others, the same first-order estimate of
their removal).

    loss:     importance_h = L(ξ_h = 0) − L(ξ = 1)             (one forward per head; heads batched together)
    gradient: importance_h = mean over windows of |∂L_w/∂ξ_h|   (L_w: mean loss of window w)

`remove`: those heads are removed first, in every configuration (their gates 0); the analysis is of the model
without them (their own importance is 0), which `save` writes (`models.removal`): what `ablate` then measures on the
saved model, it measures here. With mean ablation the means of the other heads are those of the model without them,
as they would be measured on the saved model; the removed heads' own are the whole model's. Saving needs no scoring:
with `save` alone (`scoring`: unless `score`, `prune` or method gradient asks) the model's loss with and without
the heads is measured, one configuration each, and no head is scored.

Under torchrun the work is shared and the result is one process's, bit for bit: every process prepares the ablation
(the means: one pass over the texts), then the passes of configurations (a batch and the configurations run on it
as copies) go round the processes, pass i on process i mod N, their sums added in order on every process
(`distributed.in_rounds`); for the gradient, the batches; process 0 alone writes the saved model.

Decoders: L is the mean next-token cross-entropy (nats) over every predicted token of every window (a window's first
token is not predicted; with BOS prepended, the text's first token is predicted from BOS).

Encoders: L is the masked-language-model loss, made deterministic (`pipeline.loss_windows`). In each window,
MASK_FRACTION (15 %) of the scored rows (rows 1 .. length-2: the text's tokens between [CLS] and [SEP]), at least
one, are chosen by a numpy generator seeded with MASK_SEED (0) and drawn window after window in input order; they are
replaced by [MASK] (no 80/10/10 mix: the loss measures the model, not trains it). L is the mean cross-entropy (nats)
of the original tokens at the masked positions, pooled over all windows. Windows of fewer than 3 tokens are left out.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope import options, settings
from attnscope.analyses.common import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_TOKENS,
    approximate_tokens,
    check_finite,
    check_weights,
    planned_work,
)
from attnscope.analyses.result import Result, heads_by_value
from attnscope.errors import AttnscopeError
from attnscope.models import removal
from attnscope.models.loading import LoadedModel, fastest_attention
from attnscope.output.ablate import AblateView
from attnscope.pipeline import distributed, interventions
from attnscope.pipeline.ablation import Ablation
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.loss_windows import IGNORED, LossWindows, batch_labels, loss_windows
from attnscope.pipeline.tokens import batches, pad_id
from attnscope.scores.catalog import counted

METHODS = options.ABLATION_METHODS


def _token_losses(loaded: LoadedModel, input_ids, attention_mask, labels=None):
    """Cross-entropy in nats per predicted position (0 elsewhere) and the mask of predicted positions: a decoder's
    next-token losses (B, n-1) (labels None), or an encoder's losses at the positions `labels` (B, n) names."""
    import torch

    logits = loaded.lm_model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, n, V)
    if labels is not None:  # masked LM: predict the original token where labels has one
        valid = labels != IGNORED  # (B, n)
        losses = torch.nn.functional.cross_entropy(
            logits.float().transpose(1, 2), labels.clamp(min=0), reduction="none"
        )  # (B, n)
        return losses * valid, valid
    targets = input_ids[:, 1:]  # (B, n-1)
    valid = attention_mask[:, 1:].bool()  # (B, n-1) right padding: a real target has a real context
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), targets, reduction="none"
    )  # (B, n-1)
    return losses * valid, valid


@dataclass(repr=False)  # the repr is Result's: a summary
class AblationResult(Result):
    """Importance of every head, (n_layer, n_head) numpy float64; with the loss method also the loss with the head
    removed; `prune` lists the loss as the least important heads are removed one after another. With `remove`, the
    baseline is the loss without those heads and `intact_loss` the whole model's. Without scoring (`save` alone, or
    `score` False) `importance` and `ablated_loss` are None and no head is ranked: the baseline is the result."""

    view_class = AblateView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    model: dict[str, Any]
    inputs: dict[str, Any]
    settings: dict[str, Any]
    baseline_loss: float
    importance: np.ndarray | None
    ablated_loss: np.ndarray | None
    prune: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    intact_loss: float | None = None

    @property
    def method(self) -> str:
        return self.settings["method"]

    @property
    def ablation(self) -> str:
        """What a removed head's output became: mean, zero or resample (`pipeline.ablation`)."""
        return self.settings.get("ablation", "zero")

    def ranked(self) -> list[tuple[int, int]]:
        """Heads from the most to the least important, ties in layer.head order (none where none was scored)."""
        if self.importance is None:
            return []
        return heads_by_value(self.importance)

    def ranked_labels(self) -> list[str]:
        """`ranked()` as `L.H` labels: the heads from the most to the least important."""
        return [f"{layer}.{head}" for layer, head in self.ranked()]


def losses_under(
    loaded: LoadedModel,
    windows: LossWindows,
    configurations: Any,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    ablation: Ablation | None = None,
) -> np.ndarray:
    """Mean loss over all windows under each head configuration: configurations (K, L, H) of gates, a removed
    head's output replaced as `ablation` says (None: zero); returns (K,) float64. Each batch of windows is repeated
    once per configuration in as few forward passes as fit the budget.

    Under torchrun the passes are shared (`distributed.in_rounds`): pass i (a batch and the configurations it runs,
    as one process makes them) goes to process i mod N, and the sums are added in the passes' order on every
    process, as one process adds them: one process's losses, bit for bit."""
    import torch

    configurations = torch.as_tensor(configurations, dtype=torch.float32, device=loaded.device)  # (K, L, H)
    K = configurations.shape[0]
    total = np.zeros(K)  # (K,) float64
    count = 0
    gates = interventions.HeadGates()
    held: list[Any] = [None]  # the batch whose replacements the gates hold

    def passes() -> Any:
        for batch in _batches(loaded, windows, batch_size, max_tokens):
            B, n = batch.input_ids.shape
            per_pass = max(1, interventions.MAX_COPY_TOKENS // (B * n))  # configurations per forward pass
            for first in range(0, K, per_pass):
                yield batch, first, min(first + per_pass, K)

    def one_pass(item: tuple[Any, int, int]) -> tuple[int, np.ndarray, int]:
        batch, first, last = item
        if held[0] is not batch:
            gates.values = None  # the donors of resample run through the intact model
            gates.replacements = None if ablation is None else ablation.for_batch(batch)
            held[0] = batch
        B = batch.input_ids.shape[0]
        labels = batch_labels(windows, batch)  # (B, n) or None
        k = last - first
        gates.values = configurations[first:last].repeat_interleave(B, dim=0)  # (k·B, L, H): configuration-major
        losses, valid = _token_losses(
            loaded,
            batch.input_ids.repeat(k, 1),
            batch.attention_mask.repeat(k, 1),
            None if labels is None else labels.repeat(k, 1),
        )  # (k·B, n-1) or (k·B, n)
        sums = losses.view(k, B, -1).sum(dim=(1, 2)).double().cpu().numpy()  # (k,)
        return first, sums, int(valid[:B].sum()) if first == 0 else 0  # a batch's tokens counted once

    with interventions.hooks(loaded, gates), torch.inference_mode():
        for first, sums, predicted in distributed.in_rounds(passes(), one_pass):
            total[first : first + len(sums)] += sums
            count += predicted
    return total / count


def _batches(loaded: LoadedModel, windows: LossWindows, batch_size: int, max_tokens: int | None) -> Any:
    return batches(windows.windows, batch_size, loaded.device, pad_id(loaded.tokenizer), max_tokens)


def _gradient_importance(
    loaded: LoadedModel,
    windows: LossWindows,
    batch_size: int,
    max_tokens: int | None,
    ablation: Ablation | None = None,
    keep: Any = None,
) -> tuple[float, np.ndarray]:
    """Baseline loss and mean over windows of |∂L_w/∂ξ| at ξ = 1 (the heads `keep` (L, H) marks 0 removed for
    good): gates per window, so one backward gives each window's own gradient (∂ of Σ_w L_w with respect to window
    w's gates is ∂L_w/∂ξ). Under torchrun the batches go round the processes (`distributed.in_rounds`), their sums
    added in the batches' order: one process's result, bit for bit."""
    import torch

    L, H = loaded.n_layer, loaded.n_head
    keep = torch.ones(L, H) if keep is None else keep
    total_abs = np.zeros((L, H))  # (L, H) float64
    loss_sum, token_count = 0.0, 0
    head_gates = interventions.HeadGates()

    def of_batch(batch: Any) -> tuple[np.ndarray, float, int]:
        B = batch.input_ids.shape[0]
        head_gates.values = None  # the donors of resample run through the intact model
        head_gates.replacements = None if ablation is None else ablation.for_batch(batch)
        gates = torch.ones(B, L, H, device=loaded.device, requires_grad=True)  # (B, L, H)
        head_gates.values = gates * keep.to(loaded.device)  # (B, L, H)
        labels = batch_labels(windows, batch)
        losses, valid = _token_losses(loaded, batch.input_ids, batch.attention_mask, labels)  # (B, n-1) or (B, n)
        per_window = losses.sum(-1) / valid.sum(-1)  # (B,) mean loss of each window
        (gradient,) = torch.autograd.grad(per_window.sum(), gates)  # (B, L, H)
        return gradient.abs().sum(0).double().cpu().numpy(), float(losses.detach().sum()), int(valid.sum())

    with interventions.hooks(loaded, head_gates):
        for summed, loss, tokens in distributed.in_rounds(_batches(loaded, windows, batch_size, max_tokens), of_batch):
            total_abs += summed
            loss_sum += loss
            token_count += tokens
    return loss_sum / token_count, total_abs / len(windows.windows)


class Ablate(settings.Ablate):
    """Importance of every head over the texts (see the module docstring); `prune` > 0 also reports the loss as the
    `prune` least important heads are removed cumulatively; `remove` removes heads first, `save` writes the model
    without them. Needs the model loaded with its language-model head."""

    @property
    def batching(self) -> tuple[int, int | None]:
        return self.batch_size, self.max_tokens

    def planned_work(self, loaded: LoadedModel, texts: Any) -> str | None:
        """The removals, when large: a pass over the texts with every head, and one with each head removed in turn
        (the loss method's scores), `prune` more; the gradient's few passes are never large."""
        tokens = approximate_tokens(texts)
        if not self.scoring or self.method == "gradient" or tokens is None:
            return None
        heads = loaded.n_layer * loaded.n_head - len(self.remove)
        passes = 1 + heads + self.prune
        return planned_work(
            loaded.model,
            passes,
            passes * tokens,
            f"ablate runs the texts (about {tokens:,} tokens) with every head, then without each of the "
            f"{counted(heads, 'head')} in turn" + (f", then {self.prune} pruning steps" if self.prune else ""),
            "--method gradient (one backward pass for every head), fewer or shorter texts, or --save without --score "
            "(no head scored) make it smaller",
        )

    def run(self, loaded: LoadedModel, texts: Texts | Sequence[Text], progress: Any = None) -> AblationResult:
        import torch

        if loaded.lm_model is None:
            raise AttnscopeError("ablation needs the model's language-model head: load it with lm_head=True")
        L, H = loaded.n_layer, loaded.n_head
        self.check_shape(loaded.shape)
        if self.save is not None:
            removal.check_removable(loaded, self.ablation)  # before any pass
        # SDPA, which the losses run with, turns a NaN head's output into zeros: a damaged head would pass for an
        # ablated one, so the weights are checked first (a scan costs less than one of the forward passes here)
        check_weights(loaded)
        windows, inputs, notes = loss_windows(loaded, texts, self.bos)
        inputs.update(
            n_windows=len(windows.windows),
            n_tokens=sum(len(w.ids) for w in windows.windows),
            predicted_tokens=windows.predicted,
        )
        removed = [options.head_of(label) for label in self.remove]
        keep = torch.ones(L, H)  # (L, H) 0: removed first, in every configuration
        for layer, head in removed:
            keep[layer, head] = 0
        settings = {
            "method": self.method,
            "ablation": self.ablation,
            "resample_seed": self.resample_seed if self.ablation == "resample" else None,
            "remove": list(self.remove),
            "save": None if self.save is None else os.fspath(self.save),
            "score": self.scoring,
            "prune": self.prune,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "top": self.top,
            "loss_unit": "nats per predicted token",
        }
        with interventions.attention(loaded, fastest_attention(loaded.model)):  # no attention weights are needed here
            ablation, whole_means = self._ablation(loaded, windows, keep)
            notes.append(ablation.describe())
            intact = None
            if removed:
                intact = float(losses_under(loaded, windows, torch.ones(1, L, H), *self.batching)[0])
            baseline, importance, ablated = self._scores(loaded, windows, keep, ablation)
            check_finite(loaded, "loss", [baseline, *([] if importance is None else np.asarray(importance).ravel())])
            if removed:
                notes.append(
                    f"{counted(len(removed), 'head')} removed first ({', '.join(self.remove)}, {self.ablation} "
                    f"ablation): the loss is {intact:.4f} with every head, {baseline:.4f} without them (the baseline)"
                )
            result = AblationResult(
                loaded.info(), inputs, settings, baseline, importance, ablated, notes=notes, intact_loss=intact
            )
            if self.prune:
                order = [lh for lh in result.ranked()[::-1] if keep[lh]][: self.prune]  # least important first
                steps = keep.repeat(self.prune, 1, 1)  # (prune, L, H)
                for k, (layer, head) in enumerate(order):
                    steps[k:, layer, head] = 0  # step k has heads order[0..k] removed
                pruned = losses_under(loaded, windows, steps, *self.batching, ablation)
                result.prune = [
                    {"removed": k + 1, "head": f"{layer}.{head}", "loss": float(pruned[k])}
                    for k, (layer, head) in enumerate(order)
                ]
        if self.save is not None:
            notes += self._saved(loaded, removed, whole_means)
        return result

    def _scores(self, loaded: LoadedModel, windows: LossWindows, keep: Any, ablation: Ablation) -> tuple:
        """(baseline loss, importance (L, H), loss without each head (L, H) or None) of the model without the heads
        `keep` marks 0; without scoring (`scoring`), the baseline alone: one configuration, (baseline, None, None)."""
        import torch

        L, H = loaded.n_layer, loaded.n_head
        if not self.scoring:
            return float(losses_under(loaded, windows, keep[None], *self.batching, ablation)[0]), None, None
        if self.method == "gradient":
            baseline, importance = _gradient_importance(loaded, windows, *self.batching, ablation, keep)
            return baseline, importance, None
        free = [(layer, head) for layer in range(L) for head in range(H) if keep[layer, head]]
        one_off = keep.repeat(len(free), 1, 1)  # (F, L, H) configuration k removes free head k as well
        for k, (layer, head) in enumerate(free):
            one_off[k, layer, head] = 0
        losses = losses_under(loaded, windows, torch.cat([keep[None], one_off]), *self.batching, ablation)
        baseline = float(losses[0])
        ablated = np.full((L, H), baseline)  # a head removed first: nothing more to remove
        for k, (layer, head) in enumerate(free):
            ablated[layer, head] = losses[1 + k]
        return baseline, ablated - baseline, ablated

    def _saved(self, loaded: LoadedModel, removed: list[tuple[int, int]], whole_means: Any) -> list[str]:
        """Write the model without `removed` to `save` (under torchrun, process 0 alone writes; an error is every
        process's), and say so."""

        def write(folder: Any) -> tuple[str, str | None]:
            with removal.removed(loaded, removed, whole_means) as held:
                return os.fspath(removal.save(loaded, folder)), held

        [(saved, held)] = distributed.run_shared([self.save], write)
        notes = [
            f"the model without {', '.join(self.remove)} ({self.ablation} ablation) is saved in {saved}: "
            "attnscope.load or transformers' from_pretrained read it"
        ]
        if not self.scoring:
            notes.append(
                "no head was scored: --save writes the model and measures its loss (--score measures every head "
                f"as well; so does attnscope ablate on the saved model, {saved})"
            )
        return notes + ([held] if held else [])

    def _ablation(self, loaded: LoadedModel, windows: LossWindows, keep: Any) -> tuple[Ablation, Any]:
        """What a removed head's output becomes on these windows, and the whole model's means (mean ablation; None
        otherwise). With heads removed first and mean ablation, the other heads' means are those of the model
        without them (a second pass with them replaced by the whole model's means): the saved model's."""
        ablation = Ablation(loaded, self.ablation, self.resample_seed)
        ablation.prepare(lambda: _batches(loaded, windows, *self.batching))
        whole_means = ablation.means if self.ablation == "mean" else None
        if self.ablation == "mean" and not bool(keep.all()):
            gates = interventions.HeadGates()
            gates.values, gates.replacements = keep[None].to(loaded.device), ablation.for_batch(None)  # (1, L, H)
            with interventions.hooks(loaded, gates):
                ablation.prepare(lambda: _batches(loaded, windows, *self.batching))
        return ablation, whole_means
