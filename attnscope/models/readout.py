"""The ends of the residual stream as matrices, read from a loaded model of any family: the embedding (W_E) and the
unembedding (W_U), the final norm, the masked-LM head, and the direct path from a head's output to the logits.

Interface (stable; `attnscope circuit` calls these):

    embedding(loaded, dtype) -> W_E (V, d_model): the token embedding as it enters the residual stream
    unembedding(loaded, dtype) -> W_U (d_model, V): the final norm's γ times the language-model head
        (needs the model loaded with lm_head=True unless its head is tied to the embeddings)
    final_norm(loaded), masked_head(loaded): the norm before the unembedding and the masked-LM head
    direct_path(loaded) -> DirectPath: the norms, scales and head that lie between a head's output and the logits
        (for `analyses.direct_effect`)

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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.models.families import MASKED_LM, module_at
from attnscope.models.norms import Norm, read_norm
from attnscope.models.weights import optional_module, output_norms, residual_multiplier, weight_paths, xw_weight

if TYPE_CHECKING:
    import torch

    from attnscope.models.loading import LoadedModel


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
    norm = optional_module(loaded.model, paths.embedding_norm)
    if norm is not None:
        W_E = W_E * read_norm(norm, paths.embedding_norm).gamma.to(loaded.device, dtype)
    projection = optional_module(loaded.model, paths.embedding_projection)
    if projection is not None:
        W_E = W_E @ xw_weight(projection)[0].to(loaded.device, dtype)  # (V, d_embedding) @ (d_embedding, d_model)
    return W_E


def final_norm(loaded: LoadedModel) -> Norm | None:
    """The norm of the last hidden state before the unembedding: the family's final norm, or a post-norm family's
    last layer's last norm; None where there is none."""
    paths = weight_paths(loaded)
    if paths.post_norms:
        path = paths.post_norms[-1]
        return read_norm(module_at(loaded.family.layers(loaded.model)[-1], path), f"{loaded.n_layer - 1}.{path}")
    module = optional_module(loaded.model, paths.final_norm)
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
    projection = optional_module(loaded.model, paths.unembedding_projection)
    if projection is not None:
        W = xw_weight(projection)[0].to(loaded.device, dtype) @ W  # (d, d_proj) @ (d_proj, V)
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
        xw_weight(dense)[0].to(loaded.device, dtype),
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
    W_O = torch.stack([xw_weight(module)[0].to(loaded.device, dtype).reshape(H, k, -1) for module in projections])
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
