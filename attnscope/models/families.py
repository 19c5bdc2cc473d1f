"""Model families: where each family keeps its attention, its heads' output projection and its language-model head.

One entry per family in FAMILIES; everything else asks the family. Paths are attribute paths from the base model
(the model without its language-model head): `layers` names the list of blocks, `attention` the module inside a
block that computes the weights, `output_projection` the module whose input is the heads' outputs side by side
(head h in columns h·d_head .. (h+1)·d_head), `attention_parameters` the modules whose parameters are W_Q, W_K,
W_V and W_O with their biases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.scores.kinds import DECODER, ENCODER, Kind

CAUSAL_LM = "causal"  # next-token prediction: AutoModelForCausalLM
MASKED_LM = "masked"  # masked-token prediction: AutoModelForMaskedLM


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.model_type values of this family
    kind: Kind
    layers: str
    attention: str
    output_projection: str
    attention_parameters: tuple[str, ...]
    lm_head: str  # CAUSAL_LM or MASKED_LM

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


FAMILIES: tuple[Family, ...] = (
    Family("GPT-2", ("gpt2",), DECODER, "h", "attn", "attn.c_proj", ("attn",), CAUSAL_LM),
    # BERT keeps W_O, with its LayerNorm, outside the self-attention module: only its dense projection is counted
    Family(
        "BERT",
        ("bert",),
        ENCODER,
        "encoder.layer",
        "attention.self",
        "attention.output.dense",
        ("attention.self", "attention.output.dense"),
        MASKED_LM,
    ),
)
BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}


def supported() -> str:
    """The supported families, for messages: `GPT-2 (gpt2), BERT (bert)`."""
    return ", ".join(f"{family.name} ({', '.join(family.model_types)})" for family in FAMILIES)


def family_of(config: Any) -> Family:
    """The family of a model's config, or one line naming the supported families."""
    family = BY_MODEL_TYPE.get(getattr(config, "model_type", None))
    if family is None:
        raise AttnscopeError(
            f"model type '{getattr(config, 'model_type', None)}' is not supported yet; attnscope reads {supported()}"
        )
    return family
