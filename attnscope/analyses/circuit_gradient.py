"""`attnscope circuit --method gradient`: attribution patching, the first-order estimate of every removal at once.

Every head's output is multiplied by a gate ξ (1 = kept) on the input of the output projection, as `ablate` removes
a head (`pipeline.interventions.HeadGates`). An explained score S of head B (previous-token, induction, ...) is
computed differentiably from B's attention probabilities (`pipeline.interventions.AttentionWeightsRecorder`), on the
same texts and the same repeated-token probe as `attnscope heads`, and one backward pass gives its gradient with
respect to every gate. Removing head A sets ξ_A = 0, so to first order (Nanda 2023, "Attribution Patching"; Michel
et al. 2019 for gates):

    change(B, A) = S(ξ_A = 0) - S(ξ = 1)  ≈  -∂S/∂ξ_A  at ξ = 1

exactly 0 for A in B's layer or above (B's attention is computed before A writes anything). With mean or resample
ablation the gate interpolates between the head's output x and its replacement r (`pipeline.ablation`, the same
means and donors as the exact method's): x·ξ + r·(1 − ξ), so −∂S/∂ξ_A estimates the removal that replaces x by r.
Cost: one forward and
one backward per explained score (the backward of a layer-l score runs through layers < l only), against one
forward of the layers above A per removal for the exact method.

Scores are the heads analysis's own definitions (`Kind.row_scores`, `scores.rows`): means over the scored rows of
every window, pooled; the probe's induction and duplicate-token scores over its second copies. Entropy is taken as
-Σ A ln A with masked keys' 0 · ln 0 = 0 on a form whose gradient stays finite there.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope import settings
from attnscope.analyses.common import too_short
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.pipeline import distributed, interventions
from attnscope.pipeline.ablation import Ablation
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.probe import probe_for
from attnscope.pipeline.tokens import Window, WindowStream, batches, pad_id
from attnscope.scores import catalog, rows

# scores whose gradients one backward pass computes together: memory for the activations' gradients grows with it
GRADIENTS_AT_ONCE = 16
# a derived score -> the row score whose mean it is an affine function of (see scores.rows.finish)
_UNDERLYING = {"local_lift": "local", "local_uniform": "local_uniform"}


@dataclass(frozen=True)
class _Explained:
    layer: int
    head: int
    score: str  # catalog name
    source: str  # catalog.ROWS (the texts) or catalog.PROBE


def gradient_changes(
    loaded: LoadedModel,
    texts: Texts | Sequence[Text],
    explained: Sequence[tuple[int, int, str]],
    heads: settings.Scoring,
    *,
    steps: int = 0,
    ablation: str,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Attribution patching of each explained score: (with_values (n,), changes (n, L, H)) float64.

    explained: (layer, head, score name) of each head B and the score explained (a catalog name or spelling, one
    that this kind of model measures: `induction` needs a decoder and the probe). with_values[i] is B's score on the
    intact model, as `heads` (the same settings: texts, BOS, batching, window, probe) reports it; changes[i, a, h]
    the linear estimate of its change when head a.h is removed, -∂S/∂ξ_{a.h} at ξ = 1, 0 where a >= B's layer.

    steps > 0: integrated gradients instead, -∫₀¹ ∂S/∂ξ_{a.h}(α·1) dα by the midpoint rule over `steps` points (every
    gate at α together), `steps` forwards and backwards more: closer to exact removal where a softmax is saturated
    (docs/circuit.md, `--method gradient`, gives both methods' measured errors).

    ablation: what a removed head's output becomes (zero, mean, or resample with `seed`), the gate moving the
    output from itself (ξ = 1) to that (ξ = 0).
    """
    import torch

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise AttnscopeError(f"steps {steps!r}: must be a whole number, 0 or more")
    alphas = [1.0] if steps == 0 else [(j + 0.5) / steps for j in range(steps)]
    wanted = [_check(loaded, heads, *item) for item in explained]
    L, H = loaded.n_layer, loaded.n_head
    n = len(wanted)
    values = torch.zeros(n, dtype=torch.float64)
    gradients = torch.zeros(n, L, H, dtype=torch.float64)
    counts = {catalog.ROWS: 0, catalog.PROBE: 0}
    uniform = dict.fromkeys(range(L), 0.0)  # layer -> local_uniform's sum over the texts' scored rows (a sliding
    # window makes it differ between layers)
    from_texts = [k for k, item in enumerate(wanted) if item.source == catalog.ROWS]
    from_probe = [k for k, item in enumerate(wanted) if item.source == catalog.PROBE]
    pad = pad_id(loaded.tokenizer)
    replacing: dict[str, Ablation] = {}  # source -> what a removed head's output becomes there
    period, windows = None, []  # the probe's
    if from_texts:
        stream = WindowStream(loaded, texts, heads.bos)

        def text_batches() -> Any:
            return batches(stream, heads.batch_size, loaded.device, pad, heads.max_tokens)

        replacing = {catalog.ROWS: Ablation(loaded, ablation, seed).prepare(text_batches)}
    if from_probe:
        period, windows = _probe(loaded, heads)
        replacing[catalog.PROBE] = Ablation(loaded, ablation, seed).prepare(
            lambda: batches(windows, len(windows), loaded.device)
        )
    gates, recorder = interventions.HeadGates(), interventions.AttentionWeightsRecorder()
    slots = {catalog.ROWS: from_texts, catalog.PROBE: from_probe}

    def of_batch(item: tuple[str, Any]) -> tuple:
        """One batch's sums, from the texts or the probe (`source`): (source, values (n,), gradients (n, L, H), rows
        counted, local_uniform's sums by layer)."""
        source, batch = item
        part_values, part_gradients = torch.zeros_like(values), torch.zeros_like(gradients)
        recorder.layers = frozenset()  # the donors of resample run through the intact model, unrecorded
        gates.replacements = replacing[source].for_batch(batch)
        count, batch_uniform = _accumulate(
            loaded, heads, batch, [wanted[k] for k in slots[source]], slots[source], gates, recorder,
            part_values, part_gradients, alphas, period=period if source == catalog.PROBE else None,
        )  # fmt: skip
        return source, part_values, part_gradients, int(count), {layer: float(x) for layer, x in batch_uniform.items()}

    def every_batch() -> Iterator[tuple[str, Any]]:
        if from_texts:
            yield from ((catalog.ROWS, batch) for batch in text_batches())
        if from_probe:
            yield catalog.PROBE, next(batches(windows, len(windows), loaded.device))

    # Under torchrun the batches go round the processes (`distributed.in_rounds`, the probe's after the texts'), each
    # batch's sums added in the batches' order as one process adds them: the same result, bit for bit.
    with (
        interventions.attention(loaded, "eager"),  # the probabilities themselves, differentiable
        interventions.weights_frozen(loaded),  # only the gates' gradients are wanted
        interventions.hooks(loaded, gates, recorder),
    ):
        for source, part_values, part_gradients, count, batch_uniform in distributed.in_rounds(every_batch(), of_batch):
            values += part_values
            gradients += part_gradients
            counts[source] += count
            for layer, share in batch_uniform.items():
                uniform[layer] += share
    if from_texts and counts[catalog.ROWS] == 0:
        raise AttnscopeError(too_short(loaded, "explain"))
    for k, item in enumerate(wanted):
        values[k] /= counts[item.source]
        gradients[k] /= counts[item.source]
        if item.score in _UNDERLYING:  # an affine function of a row score's mean, with the texts' uniform share
            share = uniform[item.layer] / counts[catalog.ROWS]
            if item.score == "local_uniform":
                values[k], gradients[k] = share, 0.0
            else:
                values[k] = (values[k] - share) / (1.0 - share)
                gradients[k] /= 1.0 - share
        gradients[k, item.layer :] = 0.0  # nothing at or above B's layer reaches B's attention
    return values.numpy(), (0.0 - gradients).numpy()  # 0 - x: no -0.0


def _check(loaded: LoadedModel, heads: settings.Scoring, layer: Any, head: Any, name: Any) -> _Explained:
    """One explained (layer, head, score), checked against the model and the settings."""
    score = catalog.score_named(settings.SCORE.check(name, "score"))
    for value, what, size in ((layer, "layer", loaded.n_layer), (head, "head", loaded.n_head)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < size:
            raise AttnscopeError(f"{what} {value!r} is out of range (this model has {what}s 0-{size - 1})")
    settings.check_measured(score.name, loaded.kind.name, heads.probe)
    if not score.differentiable:  # Circuit skips such heads and refuses such a --score before any pass
        raise AttnscopeError(f"score {score.name}: a count of argmax hits has no gradient to estimate its changes by")
    source = catalog.PROBE if score.source == catalog.PROBE else catalog.ROWS
    return _Explained(int(layer), int(head), score.name, source)


def _probe(loaded: LoadedModel, heads: settings.Scoring) -> tuple[int, list[Window]]:
    """The probe's period and windows, as the heads analysis builds them."""
    probe, notes = probe_for(loaded, heads.probe, heads.probe_len, heads.probe_seed)
    if probe is None:
        raise AttnscopeError(notes[0] if notes else "the repeated-token probe is off")
    return probe.period, probe.windows


def _accumulate(
    loaded: LoadedModel,
    heads: settings.Scoring,
    batch: Any,
    wanted: list[_Explained],
    slots: list[int],
    gates: interventions.HeadGates,
    recorder: interventions.AttentionWeightsRecorder,
    values: Any,
    gradients: Any,
    alphas: list[float],
    period: int | None = None,
) -> tuple[int, dict[int, float]]:
    """Adds each explained score's sum over the batch's scored rows at ξ = 1 to values[slot], and the mean over
    `alphas` of its gradient with respect to the gates at ξ = α·1 to gradients[slot]: one forward per α, then one
    backward per score (and a forward at ξ = 1 for the values when 1 is not among the α). Returns the scored rows
    counted, and local_uniform's sum over them in each explained layer (texts only)."""
    import torch

    L, H = loaded.n_layer, loaded.n_head
    B = batch.input_ids.shape[0]
    recorder.layers = frozenset(item.layer for item in wanted)
    count, uniform = 0, {}
    passes = ([] if 1.0 in alphas else [None]) + alphas  # None: the values only, no graph
    try:
        for alpha in passes:
            gate = torch.full((L, H), 1.0 if alpha is None else alpha, device=loaded.device)  # (L, H) ξ
            gate.requires_grad_(alpha is not None)
            gates.values = gate[None].expand(B, L, H)  # (B, L, H): one gate per head, shared by every window
            recorder.probs, recorder.visible = {}, {}
            with torch.set_grad_enabled(alpha is not None):
                loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
                sums = {}
                for layer in sorted(recorder.layers):
                    attn = recorder.probs[layer].float()  # (B, H, n, n_k)
                    positions = torch.arange(attn.shape[-2], device=attn.device)  # (n,)
                    if period is not None:
                        sums[layer], count = _probe_sums(attn, positions, batch.lengths, period)
                    else:
                        visible = recorder.visible[layer]
                        if visible is None:  # no mask: the causal triangle (or every key) and padding
                            visible = loaded.kind.visible_mask(positions, batch.lengths, attn.shape[-1])
                        sums[layer], count, uniform[layer] = _row_sums(loaded, heads, attn, positions, batch, visible)
            totals = [sums[item.layer][_UNDERLYING.get(item.score, item.score)][item.head] for item in wanted]
            if alpha is None or alpha == 1.0:
                for slot, total in zip(slots, totals, strict=True):
                    values[slot] += float(total.detach())
            if alpha is not None:
                reached = [k for k, total in enumerate(totals) if total.requires_grad]  # layer 0 depends on no gate
                for k, gradient in zip(reached, _gradients([totals[k] for k in reached], gate), strict=True):
                    gradients[slots[k]] += gradient.double().cpu() / len(alphas)
    finally:
        gates.values = None
        recorder.probs, recorder.visible = {}, {}
    return count, uniform


def _gradients(totals: list[Any], gate: Any) -> list[Any]:
    """∂total/∂gate (L, H) of each scalar in `totals`, one backward pass each: GRADIENTS_AT_ONCE of them batched
    into one pass over the graph (vmap; 2.4× faster for 12 scores of GPT-2 small's last layer than one after
    another), one after another where the graph holds an operation vmap cannot batch."""
    import torch

    found = []
    for first in range(0, len(totals), GRADIENTS_AT_ONCE):
        chunk = totals[first : first + GRADIENTS_AT_ONCE]
        stacked = torch.stack(chunk)  # (k,)
        try:
            with warnings.catch_warnings():  # vmap's notes on operations it runs one by one
                warnings.simplefilter("ignore", UserWarning)
                (batched,) = torch.autograd.grad(
                    stacked, gate, torch.eye(len(chunk), dtype=stacked.dtype, device=stacked.device),
                    retain_graph=True, is_grads_batched=True,
                )  # fmt: skip
            found += list(batched)  # k × (L, H)
        except (RuntimeError, NotImplementedError):
            found += [torch.autograd.grad(total, gate, retain_graph=True)[0] for total in chunk]
    return found


def _row_sums(
    loaded: LoadedModel, heads: settings.Scoring, attn: Any, positions: Any, batch: Any, visible: Any
) -> tuple[dict[str, Any], int, float]:
    """Every row score of every head summed over the batch's scored rows (name -> (H,) float64, with the graph),
    the scored row count, and local_uniform's sum."""
    import torch

    kind = loaded.kind
    scores = kind.row_scores(attn, positions, batch.lengths, heads.window, visible)  # name -> (B, H, n)
    # -Σ A ln A with a finite gradient at A = 0 (xlogy's is -inf there, and 0 · -inf poisons the backward)
    entropy = -(attn * torch.log(attn.clamp(min=torch.finfo(attn.dtype).tiny))).sum(-1)  # (B, H, n)
    seen = visible.sum(-1).to(attn.dtype)  # (B, n)
    scores["entropy"] = entropy
    scores["entropy_normalized"] = entropy / torch.log(seen[:, None]).clamp(min=1e-12)
    sums, uniform, count = rows.sum_scored_rows(kind, scores, positions, batch.lengths)  # (H, S), (), ()
    named = {name: sums[:, k] for k, name in enumerate(kind.row_score_names)}
    named["local_uniform"] = torch.zeros(attn.shape[1], dtype=torch.float64)  # the same for every head: see finish
    return named, int(count), float(uniform)


def _probe_sums(attn: Any, positions: Any, lengths: Any, period: int) -> tuple[dict[str, Any], int]:
    """Induction and duplicate-token attention of every head summed over the probe's second copies (name -> (H,)
    float64), and the rows counted (see pipeline.reducers.ProbeStatistics)."""
    import torch

    first_query = int(lengths[0]) - period  # BOS (when any) + the first copy
    second_copy = (positions[None, :] >= first_query) & (positions[None, :] < lengths[:, None])  # (B, n)
    offsets = {"induction": -(period - 1), "duplicate_token": -period}
    sums = {
        name: torch.where(second_copy[:, None], rows.offset_attention(attn, positions, offset), 0.0).sum(
            dim=(0, 2), dtype=torch.float64
        )  # (H,)
        for name, offset in offsets.items()
    }
    return sums, int(second_copy.sum())
