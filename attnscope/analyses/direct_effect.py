"""What each head adds directly to the prediction: its mean direct logit attribution to the correct token.

Interface (stable; `attnscope circuit` calls it):

    direct_effects(loaded, texts, bos=None, batch_size=8, max_tokens=16384, progress=None) -> DirectEffects
        .heads        numpy (L, H) float64: each head's mean direct effect on the correct token's centred logit
        .predicted    int: the positions averaged over (decoders: every next token; encoders: the masked ones)
        .mean_logit   float: the mean centred logit of the correct token itself, for scale
        .inputs       the input summary (as every result's `inputs`); .notes: list[str] (what to know)
        .records()    [{"label": "1.0", "direct_effect": 0.42}, ...] in layer.head order
    Needs the model loaded with lm_head=True (an untied decoder, every encoder).

Definition. A head's output o (d_head, at one position) enters the output projection as its slice; o W_O is what the
projection adds for it. On its way to the logits it passes the norms after it, whose per-token denominators σ are
frozen at their values in the forward (so that the path is linear, as is customary): a norm of the attention's
output alone (Gemma 2/3, OLMo 2, EXAONE 4), the LayerNorms of the residual sums in a post-norm layer and every later
one (BERT, RoBERTa, ELECTRA, DistilBERT, OPT-350m), and the final norm: each maps a contribution c to γ ⊙ C c / σ,
with C the centring of a LayerNorm (subtracting the mean across d_model, as the norm does) and the identity for an
RMSNorm (no centring). Then the unembedding: the LM head (tied or not; OPT's project_out before it, Cohere's and
Granite's logit scales after), read at the correct next token. Encoders: the masked-LM head at the masked positions
(ablate's deterministic masking, `pipeline.loss_windows`: 15 % of each window's tokens, seed 0), whose transform
(dense, an activation, a LayerNorm) is made linear the same way: the activation's gate a(z)/z per unit and the
LayerNorm's σ are frozen at their forward values. With everything nonlinear frozen, the direct effects of every
head, MLP, the embeddings and the biases add up exactly to the logit (before Gemma 2's final soft-capping, which is
left out).

    direct_effect(head) = mean over predicted positions of  (o W_O) · u / Π σ
    u = the chain's transposed maps applied to w_t − w̄:  u ← C (γ ⊙ u) for each norm, last first

where w_t is the unembedding's column for the correct token and w̄ the mean column. Subtracting w̄ makes the score
the effect on the logit minus the mean logit over the vocabulary: softmax ignores what raises every logit alike,
so a head that only shifts all logits does not count. TransformerLens loads models with `center_unembed=True`
(W_U's mean over the vocabulary removed), so its direct logit attribution to a token is this same quantity; it
subtracts nothing else by default (logit-difference variants subtract a wrong token's column instead). Positive:
the head pushes the right token up (a copying head copying the right token); negative: it pushes it down (copy
suppression, McDougall et al. 2023: GPT-2 small's 10.7).

Cost: one forward pass per batch (SDPA: no attention weights are needed), with the hooks of a
`pipeline.interventions.DirectPathRecorder`. Decoders: at each layer's output projection the head outputs (B, n,
H·d_head) are dotted with the per-position directions W_O u (the σ's applied after the pass, being scalars), leaving
(B, n, H) per layer; nothing of size n² or of all layers' hidden states is kept. Encoders: the head outputs at the
masked positions only are kept until the pass ends, since the head's frozen gates come last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope.analyses.common import DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS, Progress, check_finite
from attnscope.errors import AttnscopeError
from attnscope.models.families import MASKED_LM
from attnscope.models.loading import LoadedModel, fastest_attention
from attnscope.models.norms import Norm
from attnscope.models.readout import DirectPath, direct_path
from attnscope.pipeline import distributed, interventions
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.loss_windows import IGNORED, batch_labels, loss_windows
from attnscope.pipeline.tokens import batches, pad_id

if TYPE_CHECKING:
    import torch


@dataclass
class DirectEffects:
    """Each head's mean direct effect on the correct token's centred logit (see the module docstring)."""

    heads: np.ndarray  # (L, H) float64
    predicted: int
    mean_logit: float
    inputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def records(self) -> list[dict[str, Any]]:
        L, H = self.heads.shape
        return [
            {"label": f"{layer}.{head}", "direct_effect": float(self.heads[layer, head])}
            for layer in range(L)
            for head in range(H)
        ]


def _reading_direction(norms: Sequence[Norm], u: torch.Tensor) -> torch.Tensor:
    """The direction v with c · v = (the norms applied to c, σ's aside) · u: u ← C(γ ⊙ u) for each norm, the last
    first (each is c ↦ γ ⊙ C c / σ, and C is symmetric)."""
    for norm in reversed(norms):
        u = norm.centre(norm.gamma.to(u) * u)
    return u


def _chains(path: DirectPath) -> list[list[Norm]]:
    """Per layer, the norms between the attention's output and the unembedding (or the masked-LM head), in order."""
    chains = []
    for layer, stream in enumerate(path.stream_norms):
        chain = [] if path.output_norms[layer] is None else [path.output_norms[layer]]
        chain += stream
        if path.final is not None:
            chain.append(path.final)
        chains.append(chain)
    return chains


class _Run:
    """One pass of the model over a batch, with the hooks of `recorder` (a `DirectPathRecorder`, which the caller
    installs); `batch` returns the direct effects at the predicted positions (P, L, H) and the centred logit of the
    correct token there (P,)."""

    def __init__(self, loaded: LoadedModel, path: DirectPath):
        self.loaded, self.path, self.n_head = loaded, path, loaded.n_head
        self.chains = _chains(path)
        norms = [norm for chain in self.chains for norm in chain]
        if path.masked_head is not None:
            norms.append(path.masked_head.norm)
        self.last = self._last_norm()
        outputs = [self.last.module] + ([path.masked_head.dense] if path.masked_head is not None else [])
        self.recorder = interventions.DirectPathRecorder(norms, self._heads, outputs)
        self.per_layer: dict[int, torch.Tensor] = {}

    def _last_norm(self) -> Norm:
        """The norm whose output the unembedding reads (the masked-LM head's own for an encoder)."""
        if self.path.masked_head is not None:
            return self.path.masked_head.norm
        if not self.chains[-1]:
            raise AttnscopeError("this model has no norm before its unembedding: direct effects are not supported")
        return self.chains[-1][-1]

    def _heads(self, layer: int, x: torch.Tensor) -> None:
        raise NotImplementedError

    def _scale(self, layer: int, index: Any = None) -> torch.Tensor:
        """Π 1/σ over layer's chain: (B, n), or at `index` (a boolean mask) (P,)."""
        scale = None
        for norm in self.chains[layer]:
            sigma = self.recorder.scale_of(norm)
            sigma = sigma if index is None else sigma[index]
            scale = 1.0 / sigma if scale is None else scale / sigma
        return scale


class _DecoderRun(_Run):
    """Decoders: the direction each position reads (its next token's centred unembedding column through the chain of
    norms, their σ's aside) is known before the pass, so each layer's head outputs are reduced as they come."""

    def __init__(self, loaded: LoadedModel, path: DirectPath):
        super().__init__(loaded, path)
        self.columns = path.W_unembed.T  # (V, d)
        self.mean_column = self.columns.mean(0)  # (d,)
        self.directions: torch.Tensor | None = None  # (B, n, d)

    def _heads(self, layer: int, x: torch.Tensor) -> None:
        import torch

        B, n, _ = x.shape  # (B, n, H·k) the heads' outputs side by side
        v = _reading_direction(self.chains[layer], self.directions) * self.path.residual_multiplier  # (B, n, d)
        read = torch.einsum("bnd,hkd->bnhk", v, self.path.W_O[layer])  # (B, n, H, k): W_O,h v per head
        heads = x.view(B, n, self.n_head, -1).to(read.device, read.dtype)  # a layer may sit on another device
        self.per_layer[layer] = (heads * read).sum(-1)  # (B, n, H)

    def batch(self, input_ids, attention_mask, labels) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        targets = torch.nn.functional.pad(input_ids[:, 1:], (0, 1))  # (B, n): the next token (0 after the last)
        predicted = torch.nn.functional.pad(attention_mask[:, 1:], (0, 1)).bool()  # (B, n)
        self.directions = self.columns[targets] - self.mean_column  # (B, n, d)
        self.loaded.model(input_ids=input_ids, attention_mask=attention_mask)
        effects = torch.stack(
            [self.per_layer[layer] * self._scale(layer)[..., None] for layer in range(len(self.chains))], dim=2
        )  # (B, n, L, H)
        final = self.recorder.outputs[id(self.last.module)].float()  # (B, n, d) what the unembedding reads
        bias = self.path.b_unembed
        logits = (final * self.directions).sum(-1) + bias[targets] - bias.mean()  # (B, n) centred
        return effects[predicted], logits[predicted]


class _EncoderRun(_Run):
    """Encoders: the masked-LM head's frozen gates come last in the pass, so the head outputs at the masked positions
    are kept (M, H·k) per layer and reduced once the pass is over."""

    def __init__(self, loaded: LoadedModel, path: DirectPath):
        super().__init__(loaded, path)
        head = path.masked_head
        self.mean_column = head.W_decoder.mean(1)  # (d,)
        self.masked: torch.Tensor | None = None  # (B, n) bool

    def _heads(self, layer: int, x: torch.Tensor) -> None:
        self.per_layer[layer] = x[self.masked.to(x.device)].float().to(self.masked.device)  # (M, H·k)

    def batch(self, input_ids, attention_mask, labels) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        head = self.path.masked_head
        self.masked = labels != IGNORED  # (B, n)
        targets = labels[self.masked]  # (M,)
        self.loaded.lm_model(input_ids=input_ids, attention_mask=attention_mask)
        # the transform: y = γ ⊙ C(g ⊙ z) / σ + β with z = h W_dense + b and the gate g = a(z) / z frozen
        z = self.recorder.outputs[id(head.dense)][self.masked].float()  # (M, d)
        gated = self.recorder.inputs[id(head.norm.module)][self.masked].float()  # (M, d) a(z)
        gate = torch.where(z != 0, gated / torch.where(z != 0, z, 1.0), 0.0)  # (M, d)
        column = head.W_decoder[:, targets].T - self.mean_column  # (M, d)
        u = (
            head.norm.centre(head.norm.gamma.to(column) * column)
            / self.recorder.scale_of(head.norm)[self.masked][:, None]
        )
        u = (gate * u) @ head.W_dense.T  # (M, d): c · u is c's share of the centred logit
        effects = []
        for layer in range(len(self.chains)):
            v = _reading_direction(self.chains[layer], u) * self.path.residual_multiplier  # (M, d)
            scale = self._scale(layer, self.masked)
            if scale is not None:
                v = v * scale[:, None]
            read = torch.einsum("md,hkd->mhk", v, self.path.W_O[layer])  # (M, H, k)
            x = self.per_layer[layer]
            effects.append((x.view(len(x), self.n_head, -1) * read).sum(-1))  # (M, H)
        final = self.recorder.outputs[id(head.norm.module)][self.masked].float()  # (M, d)
        logits = (final * column).sum(-1) + head.b_decoder[targets] - head.b_decoder.mean()  # (M,) centred
        return torch.stack(effects, dim=1), logits


def direct_effects(
    loaded: LoadedModel,
    texts: Texts | Sequence[Text],
    bos: bool | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    progress: Progress | None = None,
) -> DirectEffects:
    """Every head's mean direct logit attribution to the correct token over `texts` (see the module docstring)."""
    import torch

    if loaded.lm_model is None and loaded.family.lm_head == MASKED_LM:
        raise AttnscopeError("direct effects of an encoder need its masked-LM head: load the model with lm_head=True")
    path = direct_path(loaded)
    windows, inputs, notes = loss_windows(loaded, texts, bos)
    inputs.update(n_windows=len(windows.windows), predicted_tokens=windows.predicted)
    totals = torch.zeros(loaded.n_layer, loaded.n_head, dtype=torch.float64)
    logit_total, count, tokens = 0.0, 0, 0
    run = _EncoderRun(loaded, path) if path.masked_head is not None else _DecoderRun(loaded, path)
    fastest = fastest_attention(loaded.model)  # no attention weights are needed

    def of_batch(batch: Any) -> tuple[Any, float, int, int]:
        """A batch's sums: (effects (L, H) float64 on the host, correct-token logits, predicted tokens, tokens)."""
        labels = batch_labels(windows, batch)  # (B, n) or None
        effects, logits = run.batch(batch.input_ids, batch.attention_mask, labels)  # (P, L, H), (P,)
        return effects.double().sum(0).cpu(), float(logits.double().sum()), len(logits), int(batch.lengths.sum())

    # under torchrun the batches go round the processes, their sums added in order as one process adds them
    with interventions.attention(loaded, fastest), interventions.hooks(loaded, run.recorder), torch.inference_mode():
        all_batches = batches(windows.windows, batch_size, loaded.device, pad_id(loaded.tokenizer), max_tokens)
        for effects, logits, predicted, length in distributed.in_rounds(all_batches, of_batch):
            totals += effects
            logit_total += logits
            count += predicted
            tokens += length
            if progress is not None:
                progress(inputs["n_texts"], tokens, tokens / max(inputs["n_tokens"], 1))
    heads = (totals / max(count, 1)).numpy()
    check_finite(loaded, "direct effect", heads)
    if getattr(loaded.config, "final_logit_softcapping", None):
        notes.append("the logits' final soft-capping (tanh) is left out: direct effects are on the logits before it")
    return DirectEffects(heads, count, logit_total / max(count, 1), inputs, notes)
