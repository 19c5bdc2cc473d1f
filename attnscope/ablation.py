"""Which heads matter: the change in language-model loss when a head's output is removed (`attnscope ablate`).

A head is removed by zeroing its slice of the input of `attn.c_proj` (the concatenated head outputs) with a forward
pre-hook: transformers v5 has no `head_mask`. Every head's output passes through one gate ξ_h (1 = kept, 0 =
removed); Michel et al. 2019 ("Are Sixteen Heads Really Better than One?") estimate importance without removing
anything as |∂L/∂ξ_h| at ξ = 1, one backward pass for all heads.

    loss:     importance_h = L(ξ_h = 0) − L(ξ = 1)             (one forward per head; heads batched together)
    gradient: importance_h = mean over windows of |∂L_w/∂ξ_h|   (L_w: mean loss of window w)

L is the mean next-token cross-entropy (nats) over every predicted token of every window (a window's first token is
not predicted; with BOS prepended, the text's first token is predicted from BOS).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.inputs import Text
from attnscope.model import LoadedModel
from attnscope.tokens import Tokenized, Window, batches, tokenize

METHODS = ("loss", "gradient")
# Copies of a batch run at once, one per head configuration: bounds activations at copies × padded tokens.
MAX_COPY_TOKENS = 8192


class HeadGates:
    """Forward pre-hooks on every layer's `attn.c_proj` multiplying each head's output by a gate.

    `gates` is (B, L, H): one row of gates per sequence of the batch, so one forward pass can run the same window
    under many head configurations. None switches the hooks off (the model runs unchanged).
    """

    def __init__(self, loaded: LoadedModel):
        self.n_head = loaded.n_head
        self.gates: Any = None
        self.handles = [
            module.c_proj.register_forward_pre_hook(self._hook(layer))
            for layer, module in enumerate(loaded.attention_modules())
        ]

    def _hook(self, layer: int) -> Callable:
        def gate_heads(module, args):
            if self.gates is None:
                return None
            x = args[0]  # (B, n, d) the heads' outputs side by side, head h in columns h·d_head .. (h+1)·d_head
            B, n, d = x.shape
            gate = self.gates[:, layer].to(x.dtype)  # (B, H)
            gated = x.view(B, n, self.n_head, d // self.n_head) * gate[:, None, :, None]  # (B, n, H, d_head)
            return (gated.view(B, n, d),) + tuple(args[1:])

        return gate_heads

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def __enter__(self) -> "HeadGates":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _token_losses(loaded: LoadedModel, input_ids, attention_mask):
    """(B, n-1) next-token cross-entropy in nats (0 where the target is padding) and the (B, n-1) target mask."""
    import torch

    logits = loaded.lm_model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, n, V)
    targets = input_ids[:, 1:]  # (B, n-1)
    valid = attention_mask[:, 1:].bool()  # (B, n-1) right padding: a real target has a real context
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), targets, reduction="none"
    )  # (B, n-1)
    return losses * valid, valid


@dataclass
class AblationResult:
    """Importance of every head, (n_layer, n_head) numpy float64; with the loss method also the loss with the head
    removed; `prune` lists the loss as the least important heads are removed one after another."""

    model: dict[str, Any]
    inputs: dict[str, Any]
    method: str
    baseline_loss: float
    importance: np.ndarray
    ablated_loss: np.ndarray | None
    prune: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def ranked(self) -> list[tuple[int, int]]:
        """Heads from the most to the least important, ties in layer.head order."""
        n_layer, n_head = self.importance.shape
        return sorted(((l, h) for l in range(n_layer) for h in range(n_head)), key=lambda lh: (-self.importance[lh], lh))


def losses_under(loaded: LoadedModel, windows: Sequence[Window], configurations: Any, batch_size: int = 8) -> np.ndarray:
    """Mean loss over all windows under each head configuration: configurations (K, L, H) of gates; returns (K,)
    float64. Each batch of windows is repeated once per configuration in as few forward passes as fit the budget."""
    import torch

    configurations = torch.as_tensor(configurations, dtype=torch.float32, device=loaded.device)  # (K, L, H)
    K = configurations.shape[0]
    total = torch.zeros(K, dtype=torch.float64)
    count = 0
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else loaded.tokenizer.eos_token_id
    with HeadGates(loaded) as hooks, torch.inference_mode():
        for batch in batches(windows, batch_size, loaded.device, pad or 0):
            B, n = batch.input_ids.shape
            per_pass = max(1, MAX_COPY_TOKENS // (B * n))  # configurations per forward pass
            for first in range(0, K, per_pass):
                chunk = configurations[first : first + per_pass]  # (k, L, H)
                k = chunk.shape[0]
                hooks.gates = chunk.repeat_interleave(B, dim=0)  # (k·B, L, H): configuration-major
                losses, valid = _token_losses(
                    loaded, batch.input_ids.repeat(k, 1), batch.attention_mask.repeat(k, 1)
                )  # (k·B, n-1)
                total[first : first + k] += losses.view(k, B, -1).sum(dim=(1, 2)).double().cpu()
            count += int(valid[:B].sum())
    return (total / count).numpy()


def _gradient_importance(loaded: LoadedModel, windows: Sequence[Window], batch_size: int) -> tuple[float, np.ndarray]:
    """Baseline loss and mean over windows of |∂L_w/∂ξ| at ξ = 1: gates per window, so one backward gives each
    window's own gradient (∂ of Σ_w L_w with respect to window w's gates is ∂L_w/∂ξ)."""
    import torch

    L, H = loaded.n_layer, loaded.n_head
    total_abs = torch.zeros(L, H, dtype=torch.float64)
    loss_sum, token_count = 0.0, 0
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else loaded.tokenizer.eos_token_id
    with HeadGates(loaded) as hooks:
        for batch in batches(windows, batch_size, loaded.device, pad or 0):
            B = batch.input_ids.shape[0]
            gates = torch.ones(B, L, H, device=loaded.device, requires_grad=True)  # (B, L, H)
            hooks.gates = gates
            losses, valid = _token_losses(loaded, batch.input_ids, batch.attention_mask)  # (B, n-1)
            per_window = losses.sum(-1) / valid.sum(-1)  # (B,) mean loss of each window
            (gradient,) = torch.autograd.grad(per_window.sum(), gates)  # (B, L, H)
            total_abs += gradient.abs().sum(0).double().cpu()
            loss_sum += float(losses.detach().sum())
            token_count += int(valid.sum())
    return loss_sum / token_count, (total_abs / len(windows)).numpy()


def ablate(
    loaded: LoadedModel,
    texts: Sequence[Text],
    method: str = "loss",
    prune: int = 0,
    bos: bool | None = None,
    batch_size: int = 8,
) -> AblationResult:
    """Importance of every head over `texts` (see the module docstring); `prune` > 0 also reports the loss as the
    `prune` least important heads are removed cumulatively."""
    import torch

    if loaded.lm_model is None:
        raise AttnscopeError("ablation needs the model's language-model head: load it with lm_head=True")
    if method not in METHODS:
        raise AttnscopeError(f"--method '{method}': use one of {', '.join(METHODS)}")
    L, H = loaded.n_layer, loaded.n_head
    if not 0 <= prune <= L * H:
        raise AttnscopeError(f"--prune {prune}: this model has {L * H} heads")
    tokenized: Tokenized = tokenize(loaded.tokenizer, texts, loaded.n_ctx, bos)
    windows = [window for window in tokenized.windows if len(window.ids) >= 2]
    if not windows:
        raise AttnscopeError("every window has a single token: there is no next token to predict")
    inputs = {
        "n_texts": len(texts), "n_windows": len(windows), "n_tokens": sum(len(w.ids) for w in windows),
        "predicted_tokens": sum(len(w.ids) - 1 for w in windows), "bos": tokenized.bos,
        "sources": [item.source for item in texts],
    }
    previous = loaded.config._attn_implementation
    loaded.model.set_attn_implementation("sdpa")  # no attention weights are needed here: the fastest kernel
    try:
        keep_all = torch.ones(1, L, H)
        if method == "loss":
            one_off = torch.ones(L * H, L, H)  # configuration k removes head k (layer-major)
            one_off.view(L * H, L * H)[torch.arange(L * H), torch.arange(L * H)] = 0
            losses = losses_under(loaded, windows, torch.cat([keep_all, one_off]), batch_size)
            baseline, ablated = float(losses[0]), losses[1:].reshape(L, H)
            importance = ablated - baseline
        else:
            baseline, importance = _gradient_importance(loaded, windows, batch_size)
            ablated = None
        result = AblationResult(loaded.info(), inputs, method, baseline, importance, ablated, notes=list(tokenized.notes))
        if prune:
            order = result.ranked()[::-1][:prune]  # least important first
            steps = torch.ones(prune, L, H)
            for k, (layer, head) in enumerate(order):
                steps[k:, layer, head] = 0  # step k has heads order[0..k] removed
            pruned = losses_under(loaded, windows, steps, batch_size)
            result.prune = [
                {"removed": k + 1, "head": f"{layer}.{head}", "loss": float(pruned[k])}
                for k, (layer, head) in enumerate(order)
            ]
    finally:
        loaded.model.set_attn_implementation(previous)
    return result
