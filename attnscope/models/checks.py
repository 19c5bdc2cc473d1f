"""What is checked of a model before it is trusted: its config's shape, the weights transformers actually loaded,
and the header of a safetensors file read by hand. Each refusal is one line naming the field or the tensor.

A config that does not describe a model (n_head 0, −4 or "4", a width its heads cannot share, dtype "float99", no
layer) is refused before anything is built from it: `info` would print its nonsense as facts, and a load would fail
deep inside transformers (or, for n_layer 0, analyse nothing and blame the text). A weight that transformers would
start from random numbers, because the checkpoint lacks it, has another shape, or holds weights of a model the config
does not describe, is refused too: the analysis would be of a random model, different at every run, and look fine.

Pure Python: `info` checks a GPT-2 config without importing torch.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnscope.errors import AttnscopeError, NoLanguageModelHead
from attnscope.options import LAYER_MAX

# The shape fields attnscope reads, each under the names config.json files use for it (transformers maps them onto
# num_hidden_layers, num_attention_heads ... through each family's attribute_map).
SHAPE_FIELDS: dict[str, tuple[str, ...]] = {
    "n_layer": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "n_head": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "n_kv_head": ("num_key_value_heads",),
    "d_model": ("hidden_size", "n_embd", "dim", "d_model"),
    "head_dim": ("head_dim",),
    "n_ctx": ("max_position_embeddings", "n_positions", "n_ctx"),
    "vocab_size": ("vocab_size",),
    "d_ffn": ("intermediate_size", "n_inner", "ffn_dim", "hidden_dim"),
}
# Bounds of each field: far beyond any real model, small enough that a count made of them stays a count.
FIELD_BOUNDS = {
    "n_layer": LAYER_MAX,
    "n_head": LAYER_MAX,
    "n_kv_head": LAYER_MAX,
    "d_model": 2**20,
    "head_dim": 2**20,
    "n_ctx": 2**31 - 1,
    "vocab_size": 2**31 - 1,
    "d_ffn": 2**24,
}
# null means: as many key/value heads as query heads; d_model / n_head; the family's default (4 d_model for GPT-2)
OPTIONAL_FIELDS = ("n_kv_head", "head_dim", "d_ffn")
GPT2_DEFAULTS = {"n_layer": 12, "n_head": 12, "d_model": 768, "n_ctx": 1024, "vocab_size": 50257}  # GPT2Config's
# The dtypes a config may name (torch's floating-point types, with torch's aliases): anything else is not a dtype.
CONFIG_DTYPES = (
    "float32", "float", "float16", "half", "bfloat16", "float64", "double", "float8_e4m3fn", "float8_e5m2", "auto",
)  # fmt: skip
SAFETENSORS_HEADER_MAX = 100 * 2**20  # the safetensors format's own limit on its JSON header
CONFIG_MAX_BYTES = 64 * 2**20  # a config.json is kilobytes (megabytes with a large label map); this is not one


@dataclass(frozen=True)
class Shape:
    """What settings are checked against before a model's weights load: its layers, heads and kind of attention
    (`decoder` or `encoder`; None when not known), and its context in tokens (None when the config does not say; not
    compared: models that share layers × heads may differ in context)."""

    n_layer: int
    n_head: int
    kind_name: str | None = None
    n_ctx: int | None = dataclasses.field(default=None, compare=False)


def check_config(raw: Mapping[str, Any], name: str) -> dict[str, int | None]:
    """The shape fields of a config.json (as read, a dict), checked; refused in one line naming the field as the
    file spells it and what it should be. Returns {field: value} for the fields present (see SHAPE_FIELDS)."""
    if not isinstance(raw, Mapping):
        raise AttnscopeError(f"the config.json of model '{name}' is not a JSON object")
    for field, keys in SHAPE_FIELDS.items():  # every spelling present, though the first is the one read
        for key in keys[1:]:
            if key in raw:
                _checked_fields({field: (key, raw[key])}, name)
    found = {field: next((key for key in keys if key in raw), None) for field, keys in SHAPE_FIELDS.items()}
    values = _checked_fields({field: (key, raw[key]) for field, key in found.items() if key is not None}, name)
    dtype = raw.get("dtype", raw.get("torch_dtype"))
    _check_dtype(dtype, name)
    if "model_type" in raw and not isinstance(raw["model_type"], str):
        raise AttnscopeError(_invalid(name, f"model_type is {_shown(raw['model_type'])}, not a name such as 'gpt2'"))
    return values


def check_config_object(config: Any, name: str) -> None:
    """The same checks on a transformers config (its standard attribute names, defaults filled in)."""
    names = {
        "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads",
        "n_kv_head": "num_key_value_heads",
        "d_model": "hidden_size",
        "head_dim": "head_dim",
        "n_ctx": "max_position_embeddings",
        "vocab_size": "vocab_size",
    }
    present = {field: (key, getattr(config, key)) for field, key in names.items() if hasattr(config, key)}
    _checked_fields(present, name)


def _checked_fields(fields: Mapping[str, tuple[str, Any]], name: str) -> dict[str, int | None]:
    """{field: (key as spelled, value)} checked one by one, then together."""
    values: dict[str, int | None] = {}
    for field, (key, value) in fields.items():
        if value is None and field in OPTIONAL_FIELDS:
            values[field] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise AttnscopeError(_invalid(name, f"{key} is {_shown(value)}, not a whole number"))
        if not 1 <= value <= FIELD_BOUNDS[field]:
            raise AttnscopeError(_invalid(name, f"{key} is {_shown(value)}: {_why_at_least_one(field)}"))
        values[field] = value
    heads, width, head_dim, kv = (values.get(field) for field in ("n_head", "d_model", "head_dim", "n_kv_head"))
    if heads and width and head_dim is None and width % heads:
        raise AttnscopeError(
            _invalid(
                name,
                f"{fields['d_model'][0]} {width} is not divisible by {fields['n_head'][0]} {heads}: the heads cannot "
                f"share the width (each would have {width / heads:.4g} dimensions)",
            )
        )
    if heads and kv and heads % kv:
        raise AttnscopeError(
            _invalid(
                name,
                f"{fields['n_head'][0]} {heads} is not a multiple of {fields['n_kv_head'][0]} {kv}: query heads "
                "share key/value heads in equal groups",
            )
        )
    return values


def _why_at_least_one(field: str) -> str:
    what = {
        "n_layer": "a model has at least one layer",
        "n_head": "a layer has at least one attention head",
        "n_kv_head": "a layer has at least one key/value head",
        "d_model": "the width is at least 1",
        "head_dim": "a head has at least one dimension",
        "n_ctx": "the context holds at least one token",
        "vocab_size": "the vocabulary has at least one token",
        "d_ffn": "the feed-forward width is at least 1",
    }[field]
    return f"{what}, and at most {FIELD_BOUNDS[field]:,}"


def _check_dtype(dtype: Any, name: str) -> None:
    if dtype is None:
        return
    if not isinstance(dtype, str) or dtype.removeprefix("torch.") not in CONFIG_DTYPES:
        raise AttnscopeError(
            _invalid(name, f"dtype {_shown(dtype)} is not a floating-point type (float32, float16, bfloat16, ...)")
        )


def _invalid(name: str, problem: str) -> str:
    return f"the config.json of model '{name}' does not describe a model: {problem}"


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return "a number of more than 20 digits"
    text = json.dumps(value) if isinstance(value, (str, list, dict)) else str(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def config_shape(raw: Mapping[str, Any], name: str, kind_name: str | None = None) -> Shape | None:
    """The Shape of a checked config.json; None when it leaves layers or heads to a default it does not name
    (GPT-2's defaults are known)."""
    values = check_config(raw, name)
    if raw.get("model_type") == "gpt2":
        values = {**GPT2_DEFAULTS, **{key: value for key, value in values.items() if value is not None}}
    if values.get("n_layer") is None or values.get("n_head") is None:
        return None
    return Shape(values["n_layer"], values["n_head"], kind_name, values.get("n_ctx"))


# ------------------------------------------------------------------------------------------ loaded weights

# Modules of a base model that no analysis reads: BERT's pooler (for [CLS] classification) is built by AutoModel
# but not saved by BertForMaskedLM, and transformers starts it from random numbers, harmlessly.
UNUSED_MODULES = ("pooler.",)


def check_loaded_weights(name: str, info: Mapping[str, Any], model: Any, lm_head_kind: str | None) -> None:
    """Refuse a model of which transformers initialised a weight it should have loaded, from its loading report
    (`from_pretrained(..., output_loading_info=True)`): a weight missing from the checkpoint (every one, when the
    config names another model type than the weights'), one of another shape (loaded with
    ignore_mismatched_sizes=True so that it is reported, not raised), or a weight of the checkpoint that the model
    has no place for although its name is one of the model's (a layer the config does not have). With
    `lm_head_kind` ("next-token" or "masked"), `model` has its language-model head: a checkpoint without any head
    weight is one saved without its head, told so."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    missing = sorted(key for key in info.get("missing_keys", ()) if not _unused(key, prefix))
    if missing:
        in_base = [key for key in missing if lm_head_kind is None or key.startswith(f"{prefix}.")]
        if lm_head_kind is not None and not in_base:
            electra = " (an ELECTRA generator, not its discriminator)" if lm_head_kind == "masked" else ""
            raise NoLanguageModelHead(
                f"model '{name}' has no {lm_head_kind} language-model head, whose logits this command reads "
                f"({_counted(len(missing), 'weight')} missing, e.g. {missing[0]}); use a checkpoint saved with its "
                f"head{electra}"
            )
        raise AttnscopeError(
            f"model '{name}': the checkpoint lacks {_counted(len(in_base), 'weight')} of the model its config "
            f"describes ({_listed(in_base)}); transformers would start them from random numbers: {_damaged(model)}"
        )
    mismatched = sorted(info.get("mismatched_keys", ()))
    if mismatched:
        key, stored, expected = mismatched[0]
        raise AttnscopeError(
            f"model '{name}': the checkpoint's {key} has shape {_shape(stored)}, but the config makes it "
            f"{_shape(expected)} ({_counted(len(mismatched), 'weight')} differ); transformers would start them from "
            f"random numbers: {_damaged(model)}"
        )
    patterns = {_pattern(key) for key, _ in model.named_parameters()}
    stray = sorted(
        key
        for key in info.get("unexpected_keys", ())
        if _pattern(key) in patterns or _pattern(key.removeprefix(f"{prefix}.")) in patterns
    )
    if stray:
        raise AttnscopeError(
            f"model '{name}': the checkpoint holds {_counted(len(stray), 'weight')} the config does not describe "
            f"({_listed(stray)}), which would be left out: {_damaged(model)}"
        )


def _unused(key: str, prefix: str) -> bool:
    return key.removeprefix(f"{prefix}.").startswith(UNUSED_MODULES)


def _pattern(key: str) -> str:
    """A parameter's name with its layer numbers as `*`: h.3.attn.c_attn.weight -> h.*.attn.c_attn.weight."""
    return ".".join("*" if part.isdigit() else part for part in key.split("."))


def _damaged(model: Any) -> str:
    model_type = getattr(getattr(model, "config", None), "model_type", "?")
    return (
        f"the checkpoint is damaged, or its config.json (model_type '{model_type}', its layers and widths) "
        "belongs to other weights"
    )


def _listed(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3:,} more" if len(keys) > 3 else "")


def _shape(shape: Iterable[int]) -> str:
    return str(tuple(int(size) for size in shape))


def _counted(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


# ------------------------------------------------------------------------------------------ safetensors headers


def safetensors_header(path: Path) -> dict[str, Any] | None:
    """The JSON header of a safetensors file (tensor name -> {dtype, shape, data_offsets}), read by hand: its first 8
    bytes give the header's length (little-endian), then the header. None when the file is missing or is not a
    safetensors file: a length past the file or the format's limit (0xFF… would otherwise be read as 18 EB), a
    header that is not a JSON object of objects."""
    try:
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            size = file.seek(0, 2)
            if length > min(size - 8, SAFETENSORS_HEADER_MAX):
                return None
            file.seek(8)
            header = json.loads(file.read(length))
    except (OSError, ValueError, struct.error, RecursionError):
        return None
    if not isinstance(header, dict) or not all(isinstance(value, dict) for value in header.values()):
        return None
    return header


def first_dtype(header: Mapping[str, Any], dtypes: Mapping[str, str]) -> str | None:
    """The dtype (by torch's name, through `dtypes`) of the first tensor by name whose dtype is one of `dtypes`."""
    for tensor in sorted(key for key in header if key != "__metadata__"):
        stored = header[tensor].get("dtype")
        if isinstance(stored, str) and stored in dtypes:
            return dtypes[stored]
    return None


def read_raw_config(folder: Path, name: str) -> dict[str, Any]:
    """config.json of `folder`, parsed (not yet checked): one line when it cannot be read or is not JSON."""
    try:
        size = (folder / "config.json").stat().st_size
        if size > CONFIG_MAX_BYTES:
            raise AttnscopeError(
                f"the config.json of model '{name}' holds {size:,} bytes: a config is a few kilobytes, this is not one"
            )
        text = (folder / "config.json").read_text(encoding="utf-8")
    except (OSError, ValueError) as error:  # ValueError: not UTF-8
        raise AttnscopeError(f"cannot read the config.json of model '{name}': {_first_line(error)}") from None
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as error:  # a 5,000-digit number is a ValueError too
        raise AttnscopeError(
            f"the config.json of model '{name}' is not a valid JSON file ({_first_line(error)})"
        ) from None
    if not isinstance(raw, dict):
        raise AttnscopeError(f"the config.json of model '{name}' is not a JSON object")
    return raw


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# ------------------------------------------------------------------------------------------ comparable models

# The parts of a fast tokenizer's definition (tokenizer.json) that decide how a text becomes ids, in the order a
# difference is named: the vocabulary and merges (its model), then how a text is prepared and completed.
TOKENIZER_PARTS = ("model", "added_tokens", "normalizer", "pre_tokenizer", "post_processor")
SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "cls_token_id", "sep_token_id", "unk_token_id")


def check_same_shapes(shapes: Sequence[tuple[str, Shape | None]]) -> None:
    """Models set side by side (`compare`, a `report` of several models), each `(label, shape)` as read from its
    config before any weight loads (None: not known): refused in one line where one's layers × heads or kind of
    attention differ from the first's. The rest (context, tokenizer) is checked once they load: `check_comparable`."""
    known = [(label, shape) for label, shape in shapes if shape is not None]
    for label, shape in known[1:]:
        _check_same_shape(*known[0], label, shape)


def _check_same_shape(first_label: str, first: Shape, other_label: str, other: Shape) -> None:
    a, b = f"'{first_label}'", f"'{other_label}'"
    if (first.n_layer, first.n_head) != (other.n_layer, other.n_head):
        raise AttnscopeError(
            f"models {a} and {b} differ in shape: {first.n_layer} layers × {first.n_head} heads against "
            f"{other.n_layer} × {other.n_head}; only models of one shape can be set side by side"
        )
    if first.kind_name and other.kind_name and first.kind_name != other.kind_name:
        raise AttnscopeError(
            f"models {a} and {b} differ in kind: {first.kind_name} against {other.kind_name} (each scores other rows)"
        )


@dataclass(frozen=True)
class Comparable:
    """What `check_comparable` reads of a model, kept once its weights are freed or sent from another process
    (torchrun's, each opening its own models): its shape, kind, context and tokenizer."""

    n_layer: int
    n_head: int
    kind: Any
    n_ctx: int
    tokenizer: Any

    @classmethod
    def of(cls, loaded: Any) -> Comparable:
        return cls(loaded.n_layer, loaded.n_head, loaded.kind, loaded.n_ctx, loaded.tokenizer)


def check_comparable(first: Any, other: Any, first_label: str, other_label: str) -> None:
    """Refuse, in one line naming the first difference, a model `other` whose heads cannot be set beside those of
    `first` (LoadedModel both, read by duck typing: only their config and tokenizer): another layer × head shape,
    another kind of attention, another context (texts would be cut into other windows), or another tokenizer (the
    same texts would become other tokens, so other rows): its vocabulary (the first token that differs), its
    special tokens, or the rest of its definition (merges, normalizer, pre-tokenizer, post-processor)."""
    a, b = f"'{first_label}'", f"'{other_label}'"
    _check_same_shape(
        first_label,
        Shape(first.n_layer, first.n_head, first.kind.name),
        other_label,
        Shape(other.n_layer, other.n_head, other.kind.name),
    )
    if first.n_ctx != other.n_ctx:
        raise AttnscopeError(
            f"models {a} and {b} differ in context: {first.n_ctx:,} tokens against {other.n_ctx:,} (long texts would "
            "be cut into other windows, so the rows would differ)"
        )
    difference = tokenizer_difference(first.tokenizer, other.tokenizer, a, b)
    if difference is not None:
        raise AttnscopeError(
            f"models {a} and {b} have different tokenizers: {difference}; the same texts would give other tokens, "
            "so other rows"
        )


def tokenizer_difference(first: Any, other: Any, a: str = "the first", b: str = "the other") -> str | None:
    """What first differs between two tokenizers (None: they turn every text into the same ids): the vocabulary's
    size, its first differing token (by id), a special token, then a part of the fast tokenizers' definitions."""
    vocab_a, vocab_b = first.get_vocab(), other.get_vocab()
    if len(vocab_a) != len(vocab_b):
        return f"{a} has {len(vocab_a):,} tokens, {b} {len(vocab_b):,}"
    if vocab_a != vocab_b:
        by_id_a = {index: token for token, index in vocab_a.items()}
        by_id_b = {index: token for token, index in vocab_b.items()}
        for index in sorted(set(by_id_a) | set(by_id_b)):
            if by_id_a.get(index) != by_id_b.get(index):
                return f"token {index} is {_shown(by_id_a.get(index))} in {a}, {_shown(by_id_b.get(index))} in {b}"
    for name in SPECIAL_TOKENS:
        id_a, id_b = getattr(first, name, None), getattr(other, name, None)
        if id_a != id_b:
            special = name.removesuffix("_id").replace("_", " ")
            return f"{special} is {_special(first, id_a)} in {a}, {_special(other, id_b)} in {b}"
    backend_a, backend_b = getattr(first, "backend_tokenizer", None), getattr(other, "backend_tokenizer", None)
    if backend_a is not None and backend_b is not None:
        text_a, text_b = backend_a.to_str(), backend_b.to_str()
        if text_a == text_b:  # the same definition (parsing two of GPT-2's takes 0.3 s; comparing them, nothing)
            return None
        defined_a, defined_b = json.loads(text_a), json.loads(text_b)
        for part in TOKENIZER_PARTS:
            if defined_a.get(part) != defined_b.get(part):
                what = "merges or vocabulary" if part == "model" else part.replace("_", "-")
                return f"their {what} differ"
    return None


def _special(tokenizer: Any, token_id: Any) -> str:
    if token_id is None:
        return "none"
    token = tokenizer.convert_ids_to_tokens(token_id)
    return f"{_shown(token)} (id {token_id})"
