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
    embedding(loaded, dtype) -> W_E (V, d_model): the token embedding as it enters the residual stream
    unembedding(loaded, dtype) -> W_U (d_model, V): the final norm's γ times the language-model head
        (needs the model loaded with lm_head=True unless its head is tied to the embeddings)
    weight_notes(loaded) -> list[str]: what weight-based scores of this model leave out (rotary, QK-norm, biases, …)
    reading_norms(loaded) -> [Norm | None] per layer: the norm each attention reads (Norm: .module, .gamma, .beta,
        .centred, .eps, .scale(x) its per-token σ, .normalise(x), .centre(v))
    output_norms(loaded), final_norm(loaded), masked_head(loaded): the other norms and the masked-LM head
    direct_path(loaded) -> DirectPath: the norms, scales and head that lie between a head's output and the logits
        (for `analyses.direct_effect`)

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

W_E is the token embedding times the family's embedding scale (Gemma's √d_model, Granite's multiplier), times the
γ of the embeddings' own norm (encoders), through the projection into the residual width where there is one (OPT's
project_in, ELECTRA's embeddings_project). W_U is diag(γ_final) times what follows the final norm (OPT's
project_out, then the LM head; Cohere's logit scale, Granite's 1 / logits_scaling); the post-norm families have no
norm after their last layer's, which is their final one. Encoders: the masked-LM head's transform (dense, an
activation, a LayerNorm) comes between, and its activation is not linear: W_U takes the activation as the identity
and the transform's LayerNorm as its γ (diag(γ_final) W_dense diag(γ_transform) W_decoder), for the copying score;
direct logit attribution freezes the activation's gate at its forward value instead (see `analyses.direct_effect`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.models.families import MASKED_LM, WeightPaths, module_at

if TYPE_CHECKING:
    import torch

    from attnscope.models.loading import LoadedModel


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """x in float32, or as it is when wider (float64: a model a test runs in double precision keeps it)."""
    return x if x.dtype.itemsize >= 4 and x.dtype.is_floating_point else x.float()


@dataclass(frozen=True)
class Norm:
    """A norm read from its module: y = γ ⊙ (x − mean x) / √(var x + eps) + β (centred: LayerNorm), or
    y = γ ⊙ x / √(mean x² + eps) + β (RMSNorm, β = 0). γ includes Gemma's 1 +."""

    name: str  # its path, for notes
    module: Any
    centred: bool
    gamma: Any  # (d,) float32
    beta: Any  # (d,) float32
    eps: float

    @property
    def kind(self) -> str:
        return "LayerNorm" if self.centred else "RMSNorm"

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """(…,) the per-token denominator σ the norm divides x (…, d) by, in float32 (or x's float64)."""
        x = at_least_float32(x)
        if self.centred:
            return (x.var(dim=-1, unbiased=False) + self.eps).sqrt()
        return (x.pow(2).mean(dim=-1) + self.eps).sqrt()

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """n(x) (…, d): the norm without its γ and β."""
        x = at_least_float32(x)
        if self.centred:
            x = x - x.mean(dim=-1, keepdim=True)
        return x / self.scale(x)[..., None]

    def centre(self, v: torch.Tensor) -> torch.Tensor:
        """C v: the centring (I − 11ᵀ/d) a LayerNorm applies (symmetric, so the same on a reading direction); an
        RMSNorm's is the identity."""
        return v - v.mean(dim=-1, keepdim=True) if self.centred else v

    def jvp(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """J(x) t (…, d), float32: how the norm's output at x moves along t (x broadcastable to t). With n = n(x)
        and σ its denominator, J t = γ ⊙ (C t − n (n · C t) / d) / σ (the same form for both norms)."""
        x, t = at_least_float32(x), self.centre(at_least_float32(t))
        n, sigma = self.normalise(x), self.scale(x)[..., None]
        d = x.shape[-1]
        return self.gamma.to(t.device) * (t - n * (n * t).sum(-1, keepdim=True) / d) / sigma

    def statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(n(x) (…, d), σ (…, 1)): what `vjp` needs of x, to compute once for several gradients at the same x."""
        x = at_least_float32(x)
        return self.normalise(x), self.scale(x)[..., None]

    def vjp(self, x: torch.Tensor, g: torch.Tensor, statistics: tuple | None = None) -> torch.Tensor:
        """J(x)ᵀ g (…, d), float32: the gradient at the norm's input from the gradient g at its output (x
        broadcastable to g): C (u − n (n · u) / d) / σ with u = γ ⊙ g; `statistics`: x's, already computed."""
        import torch

        u = self.gamma.to(g.device) * at_least_float32(g)  # a new tensor: the steps below work in place
        n, sigma = self.statistics(x) if statistics is None else statistics
        u.addcmul_(n, torch.linalg.vecdot(n, u)[..., None], value=-1.0 / n.shape[-1])
        if self.centred:
            u.sub_(u.mean(dim=-1, keepdim=True))
        return u.div_(sigma)


def read_norm(module: Any, name: str, offset: float = 0.0) -> Norm | None:
    """The norm of `module` (None for nn.Identity): RMSNorm when its class says so, else LayerNorm (torch's, OLMo's
    without parameters, Cohere's without bias). `offset` is added to γ (Gemma's 1 + γ)."""
    import torch

    class_name = type(module).__name__
    if class_name == "Identity":
        return None
    rms = class_name.endswith("RMSNorm")
    if not rms and not class_name.endswith("LayerNorm"):
        raise AttnscopeError(f"cannot read the norm {name} ({class_name}): neither a LayerNorm nor an RMSNorm")
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    size = _norm_size(module, weight)
    gamma = torch.ones(size) if weight is None else weight.detach().float().cpu() + (offset if rms else 0.0)
    beta = torch.zeros(size) if bias is None else bias.detach().float().cpu()
    # OLMo's LayerNorm has no parameters and calls F.layer_norm with eps 1e-5 fixed
    eps = getattr(module, "eps", None) or getattr(module, "variance_epsilon", None) or 1e-5
    return Norm(name, module, not rms, gamma, beta, float(eps))


def _norm_size(module: Any, weight: Any) -> int:
    if weight is not None:
        return weight.numel()
    shape = module.normalized_shape
    return int(shape[-1] if isinstance(shape, tuple | list) else shape)


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


def _optional(root: Any, path: str | None) -> Any:
    """The module at `path`, or None where the family has none there (a missing path, or an attribute set to None:
    OPT's project_in when the widths agree)."""
    if path is None:
        return None
    try:
        return module_at(root, path)
    except AttributeError:
        return None


def _xw(module: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
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
        return [_xw(module_at(module, path)) for path in paths.qkv]
    weight, bias = _xw(module_at(module, paths.qkv[0]))  # (d, (H + 2 H_kv)·d_head)
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
    weight, bias = _xw(module)
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
        weight, bias = _xw(projections[layer])  # (H·k, d)
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


# --------------------------------------------------------------------------------- embedding and unembedding


def embedding_scale(loaded: LoadedModel) -> float:
    """The factor the token embeddings are multiplied by before the first layer: Gemma's √d_model (its embedding
    module's `embed_scale`), Granite's `embedding_multiplier`; 1 elsewhere."""
    module = loaded.model.get_input_embeddings()
    scale = getattr(module, "scalar_embed_scale", None)
    if scale is None:
        buffer = getattr(module, "embed_scale", None)
        scale = float(buffer) if buffer is not None else 1.0
    name = weight_paths(loaded).embedding_multiplier
    return float(scale) * (float(getattr(loaded.config, name)) if name is not None else 1.0)


def embedding(loaded: LoadedModel, dtype: Any = None) -> torch.Tensor:
    """W_E (V, d_model): each token's embedding as it enters the residual stream, biases and denominators aside
    (see the module docstring)."""
    import torch

    dtype = dtype or torch.float32
    paths = weight_paths(loaded)
    W_E = loaded.model.get_input_embeddings().weight.detach().to(loaded.device, dtype) * embedding_scale(loaded)
    norm = _optional(loaded.model, paths.embedding_norm)
    if norm is not None:
        W_E = W_E * read_norm(norm, paths.embedding_norm).gamma.to(loaded.device, dtype)
    projection = _optional(loaded.model, paths.embedding_projection)
    if projection is not None:
        W_E = W_E @ _xw(projection)[0].to(loaded.device, dtype)  # (V, d_embedding) @ (d_embedding, d_model)
    return W_E


def final_norm(loaded: LoadedModel) -> Norm | None:
    """The norm of the last hidden state before the unembedding: the family's final norm, or a post-norm family's
    last layer's last norm; None where there is none."""
    paths = weight_paths(loaded)
    if paths.post_norms:
        path = paths.post_norms[-1]
        return read_norm(module_at(loaded.family.layers(loaded.model)[-1], path), f"{loaded.n_layer - 1}.{path}")
    module = _optional(loaded.model, paths.final_norm)
    return None if module is None else read_norm(module, paths.final_norm, paths.rms_offset)


def logit_scale(loaded: LoadedModel) -> float:
    """What the logits are multiplied by after the LM head (Cohere's logit_scale, Granite's 1 / logits_scaling)."""
    paths = weight_paths(loaded)
    scale = 1.0
    if paths.logit_multiplier is not None:
        scale *= float(getattr(loaded.config, paths.logit_multiplier))
    if paths.logit_divisor is not None:
        scale /= float(getattr(loaded.config, paths.logit_divisor))
    return scale


@dataclass
class MaskedHead:
    """An encoder's masked-LM head: logits = LayerNorm(act(h W_dense + b_dense)) W_decoder + b_decoder."""

    dense: Any  # the modules, for hooks
    norm: Norm
    W_dense: torch.Tensor  # (d, d)
    W_decoder: torch.Tensor  # (d, V)
    b_decoder: torch.Tensor  # (V,)


@dataclass
class DirectPath:
    """What lies between each head's output and the logits (see `analyses.direct_effect`): per layer the norm the
    attention's output passes alone or first (`output_norms`), for post-norm layers every later norm of the residual
    stream (`stream_norms[l]`, in order), the final norm, then the unembedding W (d, V) with its bias, or an
    encoder's masked-LM head."""

    W_O: torch.Tensor  # (L, H, d_head, d)
    residual_multiplier: float
    output_norms: list[Norm | None]
    stream_norms: list[list[Norm]]
    final: Norm | None
    W_unembed: torch.Tensor | None  # (d, V): what follows the final norm, logit scale included (decoders)
    b_unembed: torch.Tensor | None  # (V,)
    masked_head: MaskedHead | None


def _lm_head(loaded: LoadedModel) -> Any:
    """The model's output embedding module (LM head or masked-LM decoder); tied heads need no LM-head model."""
    if loaded.lm_model is not None:
        return loaded.lm_model.get_output_embeddings()
    if getattr(loaded.config, "tie_word_embeddings", False) and loaded.family.lm_head != MASKED_LM:
        return loaded.model.get_input_embeddings()
    raise AttnscopeError(
        "the unembedding needs the model's language-model head (it is not tied to the embeddings): load the model "
        "with lm_head=True"
    )


def _unembed_matrix(loaded: LoadedModel, dtype: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """What follows the final norm of a decoder as (d, V) and its bias (V,): OPT's project_out, the LM head, the logit
    scale."""
    import torch

    paths = weight_paths(loaded)
    head = _lm_head(loaded)
    W = head.weight.detach().to(loaded.device, dtype).T  # (d_head_in, V)
    bias = getattr(head, "bias", None)  # Phi's LM head has one; a tied nn.Embedding has none
    b = torch.zeros(W.shape[1], device=loaded.device, dtype=dtype) if bias is None else bias.detach().to(W)
    projection = _optional(loaded.model, paths.unembedding_projection)
    if projection is not None:
        W = _xw(projection)[0].to(loaded.device, dtype) @ W  # (d, d_proj) @ (d_proj, V)
    scale = logit_scale(loaded)
    return W * scale, b * scale


def masked_head(loaded: LoadedModel, dtype: Any = None) -> MaskedHead:
    """An encoder's masked-LM head: its transform's dense layer and LayerNorm, and its decoder (needs lm_head=True)."""
    import torch

    dtype = dtype or torch.float32
    paths = weight_paths(loaded)
    if loaded.lm_model is None:
        raise AttnscopeError("the masked-LM head is needed: load the model with lm_head=True")
    dense_path, norm_path = paths.masked_head
    dense = module_at(loaded.lm_model, dense_path)
    decoder = loaded.lm_model.get_output_embeddings()
    W_decoder = decoder.weight.detach().to(loaded.device, dtype).T  # (d, V)
    bias = decoder.bias
    b = (
        torch.zeros(W_decoder.shape[1], device=loaded.device, dtype=dtype)
        if bias is None
        else bias.detach().to(W_decoder)
    )
    return MaskedHead(
        dense,
        read_norm(module_at(loaded.lm_model, norm_path), norm_path),
        _xw(dense)[0].to(loaded.device, dtype),
        W_decoder,
        b,
    )


def unembedding(loaded: LoadedModel, dtype: Any = None) -> torch.Tensor:
    """W_U (d_model, V): diag(γ_final) times the unembedding; encoders' masked-LM head with its activation taken as
    the identity and its LayerNorm as its γ (see the module docstring)."""
    import torch

    dtype = dtype or torch.float32
    norm = final_norm(loaded)
    if loaded.family.lm_head == MASKED_LM:
        head = masked_head(loaded, dtype)
        W = head.W_dense @ (head.norm.gamma.to(head.W_decoder)[:, None] * head.W_decoder)  # (d, V)
    else:
        W = _unembed_matrix(loaded, dtype)[0]
    return W if norm is None else norm.gamma.to(W)[:, None] * W


def direct_path(loaded: LoadedModel, dtype: Any = None) -> DirectPath:
    """The direct path from every head's output to the logits (see DirectPath)."""
    import torch

    dtype = dtype or torch.float32
    paths = weight_paths(loaded)
    layers = loaded.family.layers(loaded.model)
    stream: list[list[Norm]] = [[] for _ in layers]
    if paths.post_norms:  # after layer l's attention: its own post norms, then those of every later layer
        every = [
            read_norm(module_at(module, path), f"{layer}.{path}")
            for layer, module in enumerate(layers)
            for path in paths.post_norms
        ]
        per_layer = len(paths.post_norms)
        # the first post norm is the attention output's (output_norms); the chain goes on from the next one
        stream = [every[layer * per_layer + 1 :] for layer in range(len(layers))]
    projections = loaded.family.output_projections(loaded.model)
    H, k = loaded.n_head, loaded.d_head
    W_O = torch.stack([_xw(module)[0].to(loaded.device, dtype).reshape(H, k, -1) for module in projections])
    final = None if paths.post_norms else final_norm(loaded)  # a post-norm family's final norm ends `stream`
    if loaded.family.lm_head == MASKED_LM:
        return DirectPath(
            W_O,
            residual_multiplier(loaded),
            output_norms(loaded),
            stream,
            final,
            None,
            None,
            masked_head(loaded, dtype),
        )
    W, b = _unembed_matrix(loaded, dtype)
    return DirectPath(W_O, residual_multiplier(loaded), output_norms(loaded), stream, final, W, b, None)


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
    qk_norms = [name for name in ("q_norm", "query_layernorm", "q_layernorm") if _optional(attention, name) is not None]
    if qk_norms:
        notes.append(f"QK-norm ({qk_norms[0]}) normalises queries and keys, a nonlinearity W_QK leaves out")
    if any(name.endswith("bias") and "norm" not in name for name, _ in attention.named_parameters(recurse=True)):
        notes.append("the projections' biases are left out of W_QK and W_OV")
    if getattr(config, "attn_logit_softcapping", None):
        notes.append("attention logits are soft-capped (tanh), which W_QK leaves out")
    if getattr(attention, "sinks", None) is not None:
        notes.append("learned attention sinks take a share of each row, which W_QK leaves out")
    return notes
