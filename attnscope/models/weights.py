"""Every head's weights as matrices, read from a loaded model of any family: what the weight-based analyses
(composition and copying, `scores.composition`; direct logit attribution, `analyses.direct_effect`) compute with.

Interface (stable; `attnscope circuit` calls these):

    head_weights(loaded, dtype=torch.float32) -> HeadWeights
        W_Q, W_K, W_V  (L, H, d_model, d_head)  "x @ W" convention, the reading norm's γ folded into the rows
        W_O            (L, H, d_head, d_model)   the output projection's rows of each head, as the model has them
        b_Q, b_K, b_V  (L, H, d_head)  the projections' biases with the reading norm's β folded in (β @ W + b)
        b_O            (L, d_model)
        read_scale     (L, d_model)  the γ folded into W_Q, W_K, W_V (ones where the attention reads no norm)
        write_scale    (L, d_model)  what the residual stream receives per unit of W_O's output: the γ of the
                                      norm the attention's output passes first (Gemma 2/3, OLMo 2, EXAONE 4, the
                                      post-norm encoders), times Granite's residual multiplier; ones elsewhere
        W_O_written    (L, H, d_head, d_model)  W_O · diag(write_scale): the head's write into the stream
        read_norms     list of L strings: which norm each layer reads ("ln_1 (LayerNorm)", "none")
        (grouped-query heads: W_K, W_V, b_K, b_V are their key/value head's, repeated for each query head)
    weight_notes(loaded) -> list[str]: what weight-based scores of this model leave out (rotary, QK-norm, biases, …)
    reading_norms(loaded) -> [Norm | None] per layer: the norm each attention reads (Norm, `models.norms`: .module,
        .gamma, .beta, .centred, .eps, .scale(x) its per-token σ, .normalise(x), .centre(v))
    output_norms(loaded): the norm each attention's output passes first

The embedding and the unembedding (W_E, W_U, the final norm, the masked-LM head, the direct path from a head's output
to the logits) are `models.readout`'s.

Conventions. A head reads x (B, n, d_model) and computes q = x @ W_Q + b_Q (likewise k, v); its output o (B, n,
d_head) enters the output projection as its slice, and o @ W_O is what the projection adds for it. Where a norm
feeds the attention, y = γ ⊙ n(x) + β with n(x) = (x − mean x) / σ (LayerNorm) or x / rms(x) (RMSNorm; Gemma's scales
by 1 + γ), so q = n(x) @ (diag(γ) W_Q) + (β @ W_Q + b_Q): W_Q here is diag(γ) W_Q, the rows times γ (no centring:
the weight scores of Elhage et al. 2021 treat the norm as a diagonal map, its per-token denominator left out).

Which norm feeds layer l, per family (the table is `models.families.WeightPaths`):
- pre-norm decoders (GPT-2, Llama and its layout, GPT-NeoX, Phi, OPT but OPT-350m, ModernBERT): the layer's own norm;
- post-norm encoders (BERT, RoBERTa, ELECTRA, DistilBERT) and OPT-350m: the previous layer's last norm (the
  LayerNorm of its MLP's residual sum); layer 0 reads the embeddings' output, whose LayerNorm is part of W_E;
- OLMo 2 and EXAONE 4 normalise the attention's output, not its input: their layers read the stream itself;
- ModernBERT's layer 0 has no norm of its own (nn.Identity): it reads the embeddings' output (LayerNorm in W_E).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.models.families import WeightPaths, module_at
from attnscope.models.norms import Norm, read_norm

if TYPE_CHECKING:
    import torch

    from attnscope.models.loading import LoadedModel


@dataclass
class HeadWeights:
    """Every head's weight matrices, stacked over layers (see the module docstring for shapes and conventions)."""

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    b_Q: torch.Tensor
    b_K: torch.Tensor
    b_V: torch.Tensor
    b_O: torch.Tensor
    read_scale: torch.Tensor
    write_scale: torch.Tensor
    read_norms: list[str] = field(default_factory=list)

    @property
    def W_O_written(self) -> torch.Tensor:
        """(L, H, d_head, d_model) W_O · diag(write_scale): what each head writes into the residual stream."""
        return self.W_O * self.write_scale[:, None, None, :]

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(n_layer, n_head, d_model, d_head)."""
        L, H, d, k = self.W_Q.shape
        return L, H, d, k


def weight_paths(loaded: LoadedModel) -> WeightPaths:
    return loaded.family.weights.for_config(loaded.config)


def optional_module(root: Any, path: str | None) -> Any:
    """The module at `path`, or None where the family has none there (a missing path, or an attribute set to None:
    OPT's project_in when the widths agree)."""
    if path is None:
        return None
    try:
        return module_at(root, path)
    except AttributeError:
        return None


def xw_weight(module: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The module's weight in the "x @ W" convention (d_in, d_out), and its bias: nn.Linear stores (d_out, d_in),
    GPT-2's Conv1D (d_in, d_out)."""
    weight = module.weight.detach()
    bias = None if module.bias is None else module.bias.detach()
    return (weight if type(module).__name__ == "Conv1D" else weight.T), bias


def _per_head(weight: torch.Tensor, bias: torch.Tensor | None, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, heads·d_head) and (heads·d_head,) -> (heads, d, d_head) and (heads, d_head)."""
    import torch

    d, width = weight.shape
    d_head = width // heads
    if bias is None:
        bias = torch.zeros(width, dtype=weight.dtype, device=weight.device)
    return weight.reshape(d, heads, d_head).permute(1, 0, 2), bias.reshape(heads, d_head)


def _projections(module: Any, paths: WeightPaths, H: int, H_kv: int, d_head: int) -> list[tuple[Any, Any]]:
    """[(W, b)] for Q, K and V of one layer (`module`): W (d, heads·d_head) with heads = H for Q, H_kv for K and V."""
    if len(paths.qkv) == 3:
        return [xw_weight(module_at(module, path)) for path in paths.qkv]
    weight, bias = xw_weight(module_at(module, paths.qkv[0]))  # (d, (H + 2 H_kv)·d_head)
    d = weight.shape[0]
    if paths.fused == "concat":  # q of every head, then k, then v (GPT-2, Phi-3, ModernBERT)
        sizes = [H * d_head, H_kv * d_head, H_kv * d_head]
        weights = weight.split(sizes, dim=1)
        biases = [None] * 3 if bias is None else bias.split(sizes)
        return list(zip(weights, biases, strict=True))
    if paths.fused == "per_head":  # per head [q_h, k_h, v_h] (GPT-NeoX: view (…, H, 3·d_head), then chunk)
        weights = [w.reshape(d, H * d_head) for w in weight.reshape(d, H, 3 * d_head).chunk(3, dim=-1)]
        biases = [None] * 3 if bias is None else [b.reshape(-1) for b in bias.reshape(H, 3 * d_head).chunk(3, dim=-1)]
        return list(zip(weights, biases, strict=True))
    raise AttnscopeError(f"unknown fused projection layout '{paths.fused}'")


def projection_groups(module: Any, paths: WeightPaths, H: int, H_kv: int) -> list[tuple[Any, tuple[int, ...]]]:
    """The modules that compute one layer's queries, keys and values, each with the input its columns read, one
    d_head-wide group of columns at a time, in column order: input h < H is head h's query, H + k key/value head
    k's key, H + H_kv + k its value (the numbering of `models.graph`'s inputs within a layer). Separate projections:
    (q, 0..H-1), (k, H..), (v, H+H_kv..); fused "concat": one module, 0 .. H+2·H_kv-1; fused "per_head" (GPT-NeoX):
    per head its query, key and value."""
    if len(paths.qkv) == 3:
        starts = (0, H, H + H_kv)
        counts = (H, H_kv, H_kv)
        return [
            (module_at(module, path), tuple(range(start, start + count)))
            for path, start, count in zip(paths.qkv, starts, counts, strict=True)
        ]
    fused = module_at(module, paths.qkv[0])
    if paths.fused == "concat":
        return [(fused, tuple(range(H + 2 * H_kv)))]
    if paths.fused == "per_head":
        return [(fused, tuple(index for head in range(H) for index in (head, H + head, 2 * H + head)))]
    raise AttnscopeError(f"unknown fused projection layout '{paths.fused}'")


def out_in(module: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A projection's weight as (d_out, d_in), the form nn.Linear stores (GPT-2's Conv1D transposed), and its bias."""
    weight, bias = xw_weight(module)
    return weight.T, bias


def reading_norms(loaded: LoadedModel) -> list[Norm | None]:
    """Per layer, the norm whose output the attention reads (None: it reads the residual stream itself)."""
    paths = weight_paths(loaded)
    offset = paths.rms_offset
    layers = loaded.family.layers(loaded.model)
    norms: list[Norm | None] = []
    for layer, module in enumerate(layers):
        if paths.post_norms:
            # layer 0 reads the embeddings' output (their norm is in W_E); layer l the previous layer's last norm
            path = paths.post_norms[-1]
            norms.append(None if layer == 0 else read_norm(module_at(layers[layer - 1], path), f"{layer - 1}.{path}"))
        elif paths.read_norm is not None:
            norms.append(read_norm(module_at(module, paths.read_norm), f"{layer}.{paths.read_norm}", offset))
        else:
            norms.append(None)
    return norms


def output_norms(loaded: LoadedModel) -> list[Norm | None]:
    """Per layer, the norm the attention's output passes first: a norm of that output alone (Gemma 2/3, OLMo 2,
    EXAONE 4) or, in a post-norm layer, the norm of the residual sum it joins; None in a pre-norm layer."""
    paths = weight_paths(loaded)
    path = paths.output_norm or (paths.post_norms[0] if paths.post_norms else None)
    if path is None:
        return [None] * loaded.n_layer
    layers = loaded.family.layers(loaded.model)
    return [
        read_norm(module_at(module, path), f"{layer}.{path}", paths.rms_offset) for layer, module in enumerate(layers)
    ]


def residual_multiplier(loaded: LoadedModel) -> float:
    """What each layer's outputs are multiplied by before the residual sum (Granite), else 1."""
    name = weight_paths(loaded).residual_multiplier
    return float(getattr(loaded.config, name)) if name is not None else 1.0


def head_weights(loaded: LoadedModel, dtype: Any = None) -> HeadWeights:
    """Every head's W_Q, W_K, W_V (reading norm's γ folded), W_O and biases, stacked over layers, on the model's
    device in `dtype` (float32 by default). See the module docstring."""
    import torch

    dtype = dtype or torch.float32
    paths = weight_paths(loaded)
    H, H_kv, k = loaded.n_head, loaded.n_kv_head, loaded.d_head
    device = loaded.device
    layers = loaded.family.layers(loaded.model)
    projections = loaded.family.output_projections(loaded.model)
    reads, outputs = reading_norms(loaded), output_norms(loaded)
    multiplier = residual_multiplier(loaded)
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V")}
    W_O, b_O, read_scale, write_scale, names = [], [], [], [], []
    for layer, module in enumerate(layers):
        norm = reads[layer]
        for letter, (weight, bias), heads in zip(
            "QKV", _projections(module, paths, H, H_kv, k), (H, H_kv, H_kv), strict=True
        ):
            weight = weight.to(device, dtype)  # (d, heads·k)
            bias = None if bias is None else bias.to(device, dtype)
            if norm is not None:  # y = γ ⊙ n + β:  y W + b = n (diag(γ) W) + (β W + b)
                folded = norm.beta.to(device, dtype) @ weight  # (heads·k,)
                bias = folded if bias is None else bias + folded
                weight = norm.gamma.to(device, dtype)[:, None] * weight
            w, b = _per_head(weight, bias, heads)  # (heads, d, k), (heads, k)
            if heads != H:  # grouped-query: query head h reads key/value head h // (H / H_kv), as repeat_kv does
                w, b = w.repeat_interleave(H // heads, dim=0), b.repeat_interleave(H // heads, dim=0)
            parts[f"W_{letter}"].append(w)
            parts[f"b_{letter}"].append(b)
        weight, bias = xw_weight(projections[layer])  # (H·k, d)
        d = weight.shape[1]
        W_O.append(weight.to(device, dtype).reshape(H, k, d))
        b_O.append(torch.zeros(d, device=device, dtype=dtype) if bias is None else bias.to(device, dtype))
        gamma = torch.ones(d) if norm is None else norm.gamma
        read_scale.append(gamma.to(device, dtype))
        written = torch.ones(d) if outputs[layer] is None else outputs[layer].gamma
        write_scale.append(written.to(device, dtype) * multiplier)
        names.append("none" if norm is None else f"{norm.name} ({norm.kind})")
    stacked = {name: torch.stack(values) for name, values in parts.items()}
    return HeadWeights(
        **stacked,
        W_O=torch.stack(W_O),
        b_O=torch.stack(b_O),
        read_scale=torch.stack(read_scale),
        write_scale=torch.stack(write_scale),
        read_norms=names,
    )


# ----------------------------------------------------------------------------------------------------- notes


def weight_notes(loaded: LoadedModel) -> list[str]:
    """What weight-based scores (composition, copying) of this model leave out, one line each."""
    config = loaded.config
    paths = weight_paths(loaded)
    attention = loaded.family.attention_modules(loaded.model)[0]
    notes = []
    reads = reading_norms(loaded)
    if all(norm is None for norm in reads):
        notes.append("no norm feeds the attention (it normalises its output instead): W_Q, W_K, W_V are as stored")
    else:
        notes.append(
            "the γ of the norm feeding each attention is folded into W_Q, W_K, W_V (no centring, the per-token "
            "denominator left out)"
        )
    if paths.post_norms:
        notes.append(
            "post-norm layers: a head's write passes the LayerNorm of its residual sum (its γ folded into W_O) and "
            "every later layer's LayerNorms, which composition between distant layers leaves out"
        )
    if paths.output_norm is not None:
        notes.append("the attention's output is normalised before the residual sum: its γ is folded into W_O")
    if loaded.n_kv_head != loaded.n_head:
        notes.append(
            f"grouped-query attention ({loaded.n_kv_head} key/value heads): each query head uses its key/value "
            "head's W_K and W_V"
        )
    if any(hasattr(module, "rotary_emb") for module in (loaded.model, attention)) or "rope" in str(
        getattr(config, "rope_parameters", "") or getattr(config, "rope_scaling", "") or ""
    ):
        notes.append(
            "rotary position embeddings rotate queries and keys by their positions: W_QK ignores them (it is the "
            "logit between two tokens at the same position)"
        )
    qk_names = ("q_norm", "query_layernorm", "q_layernorm")
    qk_norms = [name for name in qk_names if optional_module(attention, name) is not None]
    if qk_norms:
        notes.append(f"QK-norm ({qk_norms[0]}) normalises queries and keys, a nonlinearity W_QK leaves out")
    if any(name.endswith("bias") and "norm" not in name for name, _ in attention.named_parameters(recurse=True)):
        notes.append("the projections' biases are left out of W_QK and W_OV")
    if getattr(config, "attn_logit_softcapping", None):
        notes.append("attention logits are soft-capped (tanh), which W_QK leaves out")
    if getattr(attention, "sinks", None) is not None:
        notes.append("learned attention sinks take a share of each row, which W_QK leaves out")
    return notes
