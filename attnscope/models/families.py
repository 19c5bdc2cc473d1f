"""Model families: where each family keeps its attention, its heads' output projection and its language-model head.

One entry per family in FAMILIES; everything else asks the family. Paths are attribute paths from the base model
(the model without its language-model head): `layers` names the list of blocks, `attention` the module inside a
block that computes the weights, `output_projection` the module whose input is the heads' outputs side by side
(head h in columns h·d_head .. (h+1)·d_head), `attention_parameters` the modules whose parameters are W_Q, W_K,
W_V and W_O with their biases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.scores.catalog import DECODER, ENCODER

if TYPE_CHECKING:
    from attnscope.scores.kinds import Kind

CAUSAL_LM = "causal"  # next-token prediction: AutoModelForCausalLM
MASKED_LM = "masked"  # masked-token prediction: AutoModelForMaskedLM


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.model_type values of this family
    kind_name: str  # catalog.DECODER or catalog.ENCODER: see `kind`
    layers: str
    attention: str
    output_projection: str
    attention_parameters: tuple[str, ...]
    lm_head: str  # CAUSAL_LM or MASKED_LM

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

    def blocks(self, model: Any) -> list[Any]:
        return list(_get(model, self.layers))

    def attention_modules(self, model: Any) -> list[Any]:
        """One module per layer, in layer order: the module that computes the attention weights."""
        return [_get(block, self.attention) for block in self.blocks(model)]

    def output_projections(self, model: Any) -> list[Any]:
        """One module per layer: the heads' outputs side by side enter it (where `ablate` gates a head)."""
        return [_get(block, self.output_projection) for block in self.blocks(model)]

    def attention_parameter_count(self, model: Any) -> int:
        """Parameters of the first layer's W_Q, W_K, W_V, W_O and their biases."""
        block = self.blocks(model)[0]
        return sum(p.numel() for path in self.attention_parameters for p in _get(block, path).parameters())


def _get(root: Any, path: str) -> Any:
    for name in path.split("."):
        root = getattr(root, name)
    return root


# The decoders whose blocks are `layers[i].self_attn` with an output projection `o_proj` (Llama's layout, which most
# recent decoders took over); each differs only in what the attention function receives (see pipeline.capture).
LLAMA_LAYOUT = dict(
    layers="layers",
    attention="self_attn",
    output_projection="self_attn.o_proj",
    attention_parameters=("self_attn",),
    lm_head=CAUSAL_LM,
)
# BERT's layout, shared by the encoders derived from it
BERT_LAYOUT = dict(
    layers="encoder.layer",
    attention="attention.self",
    output_projection="attention.output.dense",
    attention_parameters=("attention.self", "attention.output.dense"),
    lm_head=MASKED_LM,
)

FAMILIES: tuple[Family, ...] = (
    Family("GPT-2", ("gpt2",), DECODER, "h", "attn", "attn.c_proj", ("attn",), CAUSAL_LM),
    Family("Llama", ("llama",), DECODER, **LLAMA_LAYOUT),
    Family("Mistral", ("mistral",), DECODER, **LLAMA_LAYOUT),
    Family("Qwen2", ("qwen2",), DECODER, **LLAMA_LAYOUT),
    Family("Qwen3", ("qwen3",), DECODER, **LLAMA_LAYOUT),
    Family("Gemma", ("gemma",), DECODER, **LLAMA_LAYOUT),
    Family("Gemma 2", ("gemma2",), DECODER, **LLAMA_LAYOUT),
    Family("Gemma 3", ("gemma3_text",), DECODER, **LLAMA_LAYOUT),
    Family("Phi-3", ("phi3",), DECODER, **LLAMA_LAYOUT),
    Family("OLMo", ("olmo",), DECODER, **LLAMA_LAYOUT),
    Family("OLMo 2", ("olmo2",), DECODER, **LLAMA_LAYOUT),
    Family("StarCoder2", ("starcoder2",), DECODER, **LLAMA_LAYOUT),
    Family("SmolLM3", ("smollm3",), DECODER, **LLAMA_LAYOUT),
    Family("gpt-oss", ("gpt_oss",), DECODER, **LLAMA_LAYOUT),
    Family("Mixtral", ("mixtral",), DECODER, **LLAMA_LAYOUT),
    Family("Qwen2-MoE", ("qwen2_moe",), DECODER, **LLAMA_LAYOUT),
    Family("Qwen3-MoE", ("qwen3_moe",), DECODER, **LLAMA_LAYOUT),
    Family("Granite", ("granite", "granitemoe"), DECODER, **LLAMA_LAYOUT),
    Family("Cohere", ("cohere",), DECODER, **LLAMA_LAYOUT),
    Family("OLMoE", ("olmoe",), DECODER, **LLAMA_LAYOUT),
    Family("Helium", ("helium",), DECODER, **LLAMA_LAYOUT),
    Family("GLM", ("glm",), DECODER, **LLAMA_LAYOUT),
    Family("EXAONE 4", ("exaone4",), DECODER, **LLAMA_LAYOUT),
    Family("Seed-OSS", ("seed_oss",), DECODER, **LLAMA_LAYOUT),
    Family("Arcee", ("arcee",), DECODER, **LLAMA_LAYOUT),
    Family("HunYuan", ("hunyuan_v1_dense",), DECODER, **LLAMA_LAYOUT),
    Family("Phi", ("phi",), DECODER, "layers", "self_attn", "self_attn.dense", ("self_attn",), CAUSAL_LM),
    Family("GPT-NeoX", ("gpt_neox",), DECODER, "layers", "attention", "attention.dense", ("attention",), CAUSAL_LM),
    Family("OPT", ("opt",), DECODER, "decoder.layers", "self_attn", "self_attn.out_proj", ("self_attn",), CAUSAL_LM),
    Family("BERT", ("bert",), ENCODER, **BERT_LAYOUT),
    Family("RoBERTa", ("roberta", "xlm-roberta"), ENCODER, **BERT_LAYOUT),
    Family("ELECTRA", ("electra",), ENCODER, **BERT_LAYOUT),
    Family("ModernBERT", ("modernbert",), ENCODER, "layers", "attn", "attn.Wo", ("attn",), MASKED_LM),
    Family(
        "DistilBERT",
        ("distilbert",),
        ENCODER,
        "transformer.layer",
        "attention",
        "attention.out_lin",
        ("attention",),
        MASKED_LM,
    ),
)
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
