"""Model families: where each family keeps its attention, its heads' output projection and its language-model head.

One entry per family in FAMILIES; everything else asks the family. Paths are attribute paths from the base model
(the model without its language-model head): `layer_list` names the list of the transformer's layers (GPT-2's `h`:
`Family.layers` returns them), `attention` the module inside a layer that computes the weights, `output_projection`
the module whose input is the heads' outputs side by side (head h in columns h·d_head .. (h+1)·d_head),
`attention_parameters` the modules whose parameters are W_Q, W_K, W_V and W_O with their biases; `weights` (a
`WeightPaths`) where the weight-based analyses (`models.weights`) find each head's W_Q, W_K, W_V, the norms around
the attention, the embedding and the unembedding; `mlp` (an `MlpPaths`, decoders) where a layer's MLP reads the
residual stream (`attnscope discover`'s MLP nodes); `traits` (an `AttentionTraits`) what its attention does besides
a softmax over every key (sliding windows, soft-capping, QK-norm, sinks), which `Family.attention_layers` reads from
a config for `attnscope info`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.scores.catalog import DECODER, ENCODER

if TYPE_CHECKING:
    from attnscope.scores.kinds import Kind

CAUSAL_LM = "causal"  # next-token prediction: AutoModelForCausalLM
MASKED_LM = "masked"  # masked-token prediction: AutoModelForMaskedLM


@dataclass(frozen=True)
class WeightPaths:
    """Where a family keeps what `models.weights` reads, as attribute paths: from a layer (one entry of
    `layer_list`) unless said otherwise. Checked against transformers 5.x's modeling code of every family.

    qkv: the three projections W_Q, W_K, W_V (nn.Linear), or one fused module whose output holds all three;
    fused: how a fused module's outputs are laid out: "concat" (all heads' queries, then the keys, then the values:
        GPT-2's Conv1D `c_attn`, Phi-3's `qkv_proj`, ModernBERT's `Wqkv`) or "per_head" (per head its query, key and
        value side by side: GPT-NeoX's `query_key_value`, viewed (…, H, 3·d_head) and chunked);
    read_norm: the norm whose output the attention reads in a pre-norm layer (its γ is folded into W_Q, W_K, W_V);
        None where the attention reads the residual stream itself (OLMo 2, EXAONE 4) or in a post-norm layer;
    post_norms: post-norm layers (BERT and the encoders derived from it, DistilBERT, OPT-350m): the norms of the
        residual sums in order (after the attention, after the MLP); layer l > 0 reads the previous layer's last one,
        layer 0 the embedding norm;
    output_norm: a norm of the attention's output alone, before it joins the residual stream (Gemma 2/3's and
        OLMo 2's `post_attention_layernorm`: in Llama's layout that name is the MLP's input norm instead);
    embedding_norm, embedding_projection: from the base model, what the token embeddings pass before the first layer
        (the embeddings' LayerNorm of the encoders; OPT's `project_in`, ELECTRA's `embeddings_project`);
    final_norm, unembedding_projection: from the base model, what the last hidden state passes before the
        unembedding (post-norm families: none, their last layer's last norm is the final one; OPT's `project_out`);
    masked_head: from the masked-LM model, the prediction head's transform before its decoder: (dense, norm), with
        an activation between them;
    pre_norm_flag: a config attribute that chooses between the two (OPT's `do_layer_norm_before`: true, pre-norm with
        `read_norm`; false, post-norm with `post_norms`), resolved by `for_config`;
    rms_offset: Gemma's RMSNorms scale by 1 + γ;
    embedding_multiplier, residual_multiplier, logit_multiplier, logit_divisor: names of config attributes that
        scale the embeddings (Granite), each layer's outputs before the residual sum (Granite), the logits (Cohere)
        or divide them (Granite).
    """

    qkv: tuple[str, ...]
    fused: str = ""
    read_norm: str | None = None
    post_norms: tuple[str, ...] = ()
    output_norm: str | None = None
    embedding_norm: str | None = None
    embedding_projection: str | None = None
    final_norm: str | None = None
    unembedding_projection: str | None = None
    masked_head: tuple[str, str] | None = None
    rms_offset: float = 0.0
    embedding_multiplier: str | None = None
    residual_multiplier: str | None = None
    logit_multiplier: str | None = None
    logit_divisor: str | None = None
    pre_norm_flag: str | None = None

    def for_config(self, config: Any) -> WeightPaths:
        """The paths of a model with this config: one of pre-norm or post-norm where `pre_norm_flag` chooses."""
        if self.pre_norm_flag is None:
            return self
        if getattr(config, self.pre_norm_flag, True):
            return replace(self, post_norms=(), pre_norm_flag=None)
        return replace(self, read_norm=None, final_norm=None, pre_norm_flag=None)


@dataclass(frozen=True)
class MlpPaths:
    """Where a decoder layer's MLP reads the residual stream, from the layer (checked against transformers 5.x's
    decoder layers, 2026-12-03): what `attnscope discover` gives an MLP its own input through.

    reads: the module whose first input is the stream the MLP reads: the MLP's input norm (Llama's
        `post_attention_layernorm`, GPT-2's `ln_2`, Gemma 2/3's `pre_feedforward_layernorm`, OPT's `final_layer_norm`,
        which takes the stream flattened to (B·n, d)), or the MLP itself where it reads the stream unnormalised
        (OLMo 2, EXAONE 4) or through the attention's norm (`shared_norm`);
    shared_norm: parallel blocks whose MLP takes the attention's normalised input (Phi, Cohere: one
        `input_layernorm` for both): that norm, applied to the MLP's own stream;
    parallel: the MLP reads the layer's input, as the attention does, not the stream after the attention (Phi,
        Cohere; GPT-NeoX when the config attribute named here, `use_parallel_residual`, is true).
    """

    reads: str
    shared_norm: str | None = None
    parallel: bool | str = False

    def is_parallel(self, config: Any) -> bool:
        if isinstance(self.parallel, str):
            return bool(getattr(config, self.parallel, False))
        return self.parallel


LLAMA_MLP = MlpPaths("post_attention_layernorm")
EVERY_LAYER = "every_layer"  # AttentionTraits.windows: config.sliding_window on every layer
LAYER_TYPES = "layer_types"  # AttentionTraits.windows: config.sliding_window on the layers config.layer_types names


@dataclass(frozen=True)
class AttentionTraits:
    """What a family's attention does besides a softmax over every key its kind lets a query see, as the config
    switches it on (checked against transformers 5.24's modeling code of every family, 2026-12-03): what the
    attention function receives as `sliding_window`, `softcap` and `s_aux`, and the masks the model builds.

    windows: where a layer's sliding window comes from: "" none (the family's mask ignores `sliding_window`, even
        when a config.json holds one); EVERY_LAYER `config.sliding_window` on every layer, when set (Mistral,
        Mixtral, Phi-3, StarCoder2, Qwen3-MoE); LAYER_TYPES `config.sliding_window` on the layers whose entry of
        `config.layer_types` is "sliding_attention", the others full (Qwen2, Gemma 2 and 3, gpt-oss, ModernBERT …);
    softcap: the config attribute of the logits' soft cap (Gemma 2/3's `attn_logit_softcapping`: s ← c · tanh(s / c)
        before the mask; unset, None, no cap), None where the family has none;
    qk_norm: True where every layer normalises its queries and keys before their dot product (Qwen3, Gemma 3,
        OLMo 2, …), or the config attribute that switches it (Cohere's `use_qk_norm`, Phi's `qk_layernorm`);
    sinks: one learned logit per head joins each row's softmax as an extra key, its share dropped (gpt-oss).
    """

    windows: str = ""
    softcap: str | None = None
    qk_norm: bool | str = False
    sinks: bool = False

    def layers(self, config: Any, n_layer: int, n_head: int, n_kv_head: int) -> list[dict[str, Any]]:
        """One record per layer, in layer order, of the attention a model with this config computes:

        - `attention`: "sliding" (a decoder's query i sees keys i − W < j <= i, itself and the W − 1 before it; an
          encoder's, ModernBERT's local layers, |i − j| <= W) or "full" (every earlier key, or every key);
        - `window`: W, transformers' `sliding_window` (None where the layer is full);
        - `softcap`: c where the logits are soft-capped (s ← c · tanh(s / c)), else None;
        - `qk_norm`: whether queries and keys are normalised before their dot product;
        - `sinks`: whether a learned sink logit per head takes a share of each row's softmax (the weights on the keys
          then sum to less than 1);
        - `kv_heads`, `query_heads_per_kv_head`: the key/value heads and how many query heads read each (1 without
          grouped-query attention).

        `config` is a transformers config or anything with its attributes (GPT-2's config.json read as a namespace:
        its family reads none of them).
        """
        window = getattr(config, "sliding_window", None) if self.windows else None
        types = getattr(config, "layer_types", None) if self.windows == LAYER_TYPES else None
        cap = getattr(config, self.softcap, None) if self.softcap else None
        qk_norm = bool(getattr(config, self.qk_norm, False)) if isinstance(self.qk_norm, str) else self.qk_norm
        records = []
        for layer in range(n_layer):
            slides = window is not None and (
                self.windows == EVERY_LAYER or (types is not None and types[layer] == "sliding_attention")
            )
            records.append(
                {
                    "layer": layer,
                    "attention": "sliding" if slides else "full",
                    "window": int(window) if slides else None,
                    "softcap": None if cap is None else float(cap),
                    "qk_norm": qk_norm,
                    "sinks": self.sinks,
                    "kv_heads": n_kv_head,
                    "query_heads_per_kv_head": n_head // n_kv_head,
                }
            )
        return records


PLAIN = AttentionTraits()
WINDOWS_EVERY_LAYER = AttentionTraits(windows=EVERY_LAYER)
WINDOWS_BY_LAYER_TYPE = AttentionTraits(windows=LAYER_TYPES)
QK_NORM = AttentionTraits(qk_norm=True)
NORMED_OUTPUT_MLP = MlpPaths("mlp")  # OLMo 2, EXAONE 4: the MLP reads the stream itself, its output is normalised


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.model_type values of this family
    kind_name: str  # catalog.DECODER or catalog.ENCODER: see `kind`
    layer_list: str  # the attribute path of the list of layers
    attention: str
    output_projection: str
    attention_parameters: tuple[str, ...]
    lm_head: str  # CAUSAL_LM or MASKED_LM
    weights: WeightPaths
    mlp: MlpPaths | None = None  # decoders: where each layer's MLP reads the stream (None: encoders)
    traits: AttentionTraits = PLAIN  # what its attention does besides a softmax over every key

    def attention_layers(self, config: Any, n_layer: int, n_head: int, n_kv_head: int) -> list[dict[str, Any]]:
        """Each layer's attention, as a model of this family with `config` computes it (`AttentionTraits.layers`):
        what `attnscope info` shows, from the config alone or from a loaded model alike."""
        return self.traits.layers(config, n_layer, n_head, n_kv_head)

    @property
    def kind(self) -> Kind:
        """The kind of attention map (decoder or encoder). Looked up when asked: the kinds compute with torch, and
        what needs only a model's config (`attnscope info`) runs without importing it."""
        from attnscope.scores.kinds import KINDS

        return KINDS[self.kind_name]

    def prepare(self, model: Any) -> None:
        """Name each attention module's layer (`layer_idx`), which the capture reads; most families set it."""
        for layer, module in enumerate(self.attention_modules(model)):
            if getattr(module, "layer_idx", None) is None:
                module.layer_idx = layer

    def layers(self, model: Any) -> list[Any]:
        """The transformer's layers (GPT-2's `model.h`), in order: what the other paths start from."""
        return list(module_at(model, self.layer_list))

    def attention_modules(self, model: Any) -> list[Any]:
        """One module per layer, in layer order: the module that computes the attention weights."""
        return [module_at(layer, self.attention) for layer in self.layers(model)]

    def output_projections(self, model: Any) -> list[Any]:
        """One module per layer: the heads' outputs side by side enter it (where `ablate` gates a head)."""
        return [module_at(layer, self.output_projection) for layer in self.layers(model)]

    def attention_parameter_count(self, model: Any) -> int:
        """Parameters of the first layer's W_Q, W_K, W_V, W_O and their biases."""
        first = self.layers(model)[0]
        return sum(p.numel() for path in self.attention_parameters for p in module_at(first, path).parameters())


def module_at(root: Any, path: str) -> Any:
    """The attribute at a dotted `path` from `root` (`"attn.c_proj"` of a GPT-2 layer)."""
    for name in path.split("."):
        root = getattr(root, name)
    return root


# The decoders whose layers are `layers[i].self_attn` with an output projection `o_proj` (Llama's layout, which most
# recent decoders took over); each differs only in what the attention function receives (see pipeline.capture).
LLAMA_WEIGHTS = WeightPaths(
    qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), read_norm="input_layernorm", final_norm="norm"
)
LLAMA_LAYOUT = dict(
    layer_list="layers",
    attention="self_attn",
    output_projection="self_attn.o_proj",
    attention_parameters=("self_attn",),
    lm_head=CAUSAL_LM,
    weights=LLAMA_WEIGHTS,
    mlp=LLAMA_MLP,
)
# Gemma: RMSNorms scale by 1 + γ; Gemma 2 and 3 also normalise the attention's output before the residual sum
GEMMA_WEIGHTS = replace(LLAMA_WEIGHTS, rms_offset=1.0)
GEMMA2_WEIGHTS = replace(GEMMA_WEIGHTS, output_norm="post_attention_layernorm")
# Gemma 2 and 3: the MLP has a norm of its own before it (and one after it, part of its output)
GEMMA2_MLP = MlpPaths("pre_feedforward_layernorm")
# Phi and Cohere: parallel blocks, the MLP fed the attention's normalised input
SHARED_NORM_MLP = MlpPaths("mlp", shared_norm="input_layernorm", parallel=True)
# OLMo 2 and EXAONE 4: no norm before the attention, one on its output
OUTPUT_NORM_WEIGHTS = replace(LLAMA_WEIGHTS, read_norm=None, output_norm="post_attention_layernorm")
GRANITE_WEIGHTS = replace(
    LLAMA_WEIGHTS,
    embedding_multiplier="embedding_multiplier",
    residual_multiplier="residual_multiplier",
    logit_divisor="logits_scaling",
)
# BERT's layout, shared by the encoders derived from it: post-norm, the embeddings' LayerNorm before layer 0
BERT_WEIGHTS = WeightPaths(
    qkv=("attention.self.query", "attention.self.key", "attention.self.value"),
    post_norms=("attention.output.LayerNorm", "output.LayerNorm"),
    embedding_norm="embeddings.LayerNorm",
)
BERT_LAYOUT = dict(
    layer_list="encoder.layer",
    attention="attention.self",
    output_projection="attention.output.dense",
    attention_parameters=("attention.self", "attention.output.dense"),
    lm_head=MASKED_LM,
)
ROBERTA_WEIGHTS = replace(BERT_WEIGHTS, masked_head=("lm_head.dense", "lm_head.layer_norm"))

FAMILIES: tuple[Family, ...] = (
    Family(
        "GPT-2", ("gpt2",), DECODER, "h", "attn", "attn.c_proj", ("attn",), CAUSAL_LM,
        WeightPaths(qkv=("attn.c_attn",), fused="concat", read_norm="ln_1", final_norm="ln_f"), MlpPaths("ln_2"),
    ),
    Family("Llama", ("llama",), DECODER, **LLAMA_LAYOUT),
    Family("Mistral", ("mistral",), DECODER, **LLAMA_LAYOUT, traits=WINDOWS_EVERY_LAYER),
    Family("Qwen2", ("qwen2",), DECODER, **LLAMA_LAYOUT, traits=WINDOWS_BY_LAYER_TYPE),
    Family("Qwen3", ("qwen3",), DECODER, **LLAMA_LAYOUT, traits=AttentionTraits(LAYER_TYPES, qk_norm=True)),
    Family("Gemma", ("gemma",), DECODER, **{**LLAMA_LAYOUT, "weights": GEMMA_WEIGHTS}),
    Family(
        "Gemma 2", ("gemma2",), DECODER, **{**LLAMA_LAYOUT, "weights": GEMMA2_WEIGHTS, "mlp": GEMMA2_MLP},
        traits=AttentionTraits(LAYER_TYPES, softcap="attn_logit_softcapping"),
    ),
    Family(
        "Gemma 3", ("gemma3_text",), DECODER, **{**LLAMA_LAYOUT, "weights": GEMMA2_WEIGHTS, "mlp": GEMMA2_MLP},
        traits=AttentionTraits(LAYER_TYPES, softcap="attn_logit_softcapping", qk_norm=True),
    ),
    Family(
        "Phi-3", ("phi3",), DECODER,
        **{**LLAMA_LAYOUT, "weights": replace(LLAMA_WEIGHTS, qkv=("self_attn.qkv_proj",), fused="concat")},
        traits=WINDOWS_EVERY_LAYER,
    ),
    Family("OLMo", ("olmo",), DECODER, **LLAMA_LAYOUT),
    Family(
        "OLMo 2", ("olmo2",), DECODER, **{**LLAMA_LAYOUT, "weights": OUTPUT_NORM_WEIGHTS, "mlp": NORMED_OUTPUT_MLP},
        traits=QK_NORM,
    ),
    Family("StarCoder2", ("starcoder2",), DECODER, **LLAMA_LAYOUT, traits=WINDOWS_EVERY_LAYER),
    Family("SmolLM3", ("smollm3",), DECODER, **LLAMA_LAYOUT, traits=WINDOWS_BY_LAYER_TYPE),
    Family("gpt-oss", ("gpt_oss",), DECODER, **LLAMA_LAYOUT, traits=AttentionTraits(LAYER_TYPES, sinks=True)),
    Family("Mixtral", ("mixtral",), DECODER, **LLAMA_LAYOUT, traits=WINDOWS_EVERY_LAYER),
    Family("Qwen2-MoE", ("qwen2_moe",), DECODER, **LLAMA_LAYOUT, traits=WINDOWS_BY_LAYER_TYPE),
    Family("Qwen3-MoE", ("qwen3_moe",), DECODER, **LLAMA_LAYOUT, traits=AttentionTraits(EVERY_LAYER, qk_norm=True)),
    Family("Granite", ("granite", "granitemoe"), DECODER, **{**LLAMA_LAYOUT, "weights": GRANITE_WEIGHTS}),
    Family(
        "Cohere", ("cohere",), DECODER,
        **{**LLAMA_LAYOUT, "weights": replace(LLAMA_WEIGHTS, logit_multiplier="logit_scale"), "mlp": SHARED_NORM_MLP},
        traits=AttentionTraits(qk_norm="use_qk_norm"),
    ),
    Family("OLMoE", ("olmoe",), DECODER, **LLAMA_LAYOUT, traits=QK_NORM),
    Family("Helium", ("helium",), DECODER, **LLAMA_LAYOUT),
    Family("GLM", ("glm",), DECODER, **LLAMA_LAYOUT),
    Family(
        "EXAONE 4", ("exaone4",), DECODER, **{**LLAMA_LAYOUT, "weights": OUTPUT_NORM_WEIGHTS, "mlp": NORMED_OUTPUT_MLP},
        traits=AttentionTraits(LAYER_TYPES, qk_norm=True),
    ),
    Family("Seed-OSS", ("seed_oss",), DECODER, **LLAMA_LAYOUT),
    Family("Arcee", ("arcee",), DECODER, **LLAMA_LAYOUT),
    Family("HunYuan", ("hunyuan_v1_dense",), DECODER, **LLAMA_LAYOUT, traits=QK_NORM),
    Family(
        "Phi", ("phi",), DECODER, "layers", "self_attn", "self_attn.dense", ("self_attn",), CAUSAL_LM,
        replace(LLAMA_WEIGHTS, final_norm="final_layernorm"), SHARED_NORM_MLP, AttentionTraits(qk_norm="qk_layernorm"),
    ),
    Family(
        "GPT-NeoX", ("gpt_neox",), DECODER, "layers", "attention", "attention.dense", ("attention",), CAUSAL_LM,
        WeightPaths(
            qkv=("attention.query_key_value",), fused="per_head", read_norm="input_layernorm",
            final_norm="final_layer_norm",
        ),
        MlpPaths("post_attention_layernorm", parallel="use_parallel_residual"),
    ),
    Family(
        "OPT", ("opt",), DECODER, "decoder.layers", "self_attn", "self_attn.out_proj", ("self_attn",), CAUSAL_LM,
        WeightPaths(
            qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), read_norm="self_attn_layer_norm",
            post_norms=("self_attn_layer_norm", "final_layer_norm"), embedding_projection="decoder.project_in",
            final_norm="decoder.final_layer_norm", unembedding_projection="decoder.project_out",
            pre_norm_flag="do_layer_norm_before",
        ),
        MlpPaths("final_layer_norm"),
    ),
    Family(
        "BERT", ("bert",), ENCODER, **BERT_LAYOUT,
        weights=replace(
            BERT_WEIGHTS, masked_head=("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm")
        ),
    ),
    Family("RoBERTa", ("roberta", "xlm-roberta"), ENCODER, **BERT_LAYOUT, weights=ROBERTA_WEIGHTS),
    Family(
        "ELECTRA", ("electra",), ENCODER, **BERT_LAYOUT,
        weights=replace(
            BERT_WEIGHTS, embedding_projection="embeddings_project",
            masked_head=("generator_predictions.dense", "generator_predictions.LayerNorm"),
        ),
    ),
    Family(
        "ModernBERT", ("modernbert",), ENCODER, "layers", "attn", "attn.Wo", ("attn",), MASKED_LM,
        WeightPaths(
            qkv=("attn.Wqkv",), fused="concat", read_norm="attn_norm", embedding_norm="embeddings.norm",
            final_norm="final_norm", masked_head=("head.dense", "head.norm"),
        ),
        traits=WINDOWS_BY_LAYER_TYPE,
    ),
    Family(
        "DistilBERT", ("distilbert",), ENCODER, "transformer.layer", "attention", "attention.out_lin", ("attention",),
        MASKED_LM,
        WeightPaths(
            qkv=("attention.q_lin", "attention.k_lin", "attention.v_lin"),
            post_norms=("sa_layer_norm", "output_layer_norm"), embedding_norm="embeddings.LayerNorm",
            masked_head=("vocab_transform", "vocab_layer_norm"),
        ),
    ),
)  # fmt: skip
# Families whose attention does not go through transformers' AttentionInterface (their own attention code): a
# capture could not see it, so they are refused by name rather than guessed at.
UNCAPTURABLE = ("gptj", "gpt_neo", "falcon", "bloom", "stablelm")
BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}


def supported() -> str:
    """The supported families, for messages: `GPT-2 (gpt2), BERT (bert)`."""
    return ", ".join(f"{family.name} ({', '.join(family.model_types)})" for family in FAMILIES)


def family_of(config: Any) -> Family:
    """The family of a model's config, or one line naming the supported families."""
    model_type = getattr(config, "model_type", None)
    family = BY_MODEL_TYPE.get(model_type)
    if family is None:
        why = (
            "its attention does not go through transformers' attention interface, so it cannot be captured exactly"
            if model_type in UNCAPTURABLE
            else "it is not supported yet"
        )
        raise AttnscopeError(f"model type '{model_type}': {why}; attnscope reads {supported()}")
    if getattr(config, "use_bidirectional_attention", False) and family.kind_name == DECODER:
        raise AttnscopeError(f"model type '{model_type}' with bidirectional attention is not supported yet")
    return family
