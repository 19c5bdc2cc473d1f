"""A model's facts from its config.json alone (`attnscope info`): what `LoadedModel.info` reports once the model is
loaded, without reading (or downloading) the weights or the tokenizer, and for GPT-2 (the demo model) without torch.
Finding the config (the demo's, a folder, the Hub's cache or the Hub) follows `models.loading`'s rules and errors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.models import checks
from attnscope.models.families import Family, family_of

# where a model is found and how a missing one is said: the loader's own rules (package-private helpers)
from attnscope.models.loading import DTYPES, LoadedModel, demo_model_dir, resolve_device
from attnscope.models.locating import (
    DEMO,
    check_config_directory,
    check_revision,
    expanded_name,
    hub_reachable,
    is_not_found,
    looks_like_path,
    offline_message,
    unknown_model_message,
)

SAFETENSORS_DTYPES = {  # the floating-point dtypes of the safetensors format, by torch's names
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


def model_facts(name: str, device: str = "auto", dtype: str = "auto", revision: str | None = None) -> dict[str, Any]:
    """What `load_model(name, device, dtype).info()` reports, from the model's config.json alone (see
    `facts_and_layers`)."""
    return facts_and_layers(name, device, dtype, revision)[0]


def facts_and_layers(
    name: str, device: str = "auto", dtype: str = "auto", revision: str | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What `load_model(name, device, dtype)` reports with `info()` and `attention_layers()`, from the model's
    config.json alone: no weights are read (nor downloaded), no tokenizer either. Every fact is the loaded model's:

    - the shape (layers, heads, widths, context, vocabulary) is the config's, as transformers reads it;
    - `n_params` and `attention_params`: for GPT-2 (the demo model, gpt2 …) counted by formula from the config
      (`gpt2_parameter_count`), without torch; for every other family, counted on the architecture built on torch's
      meta device (`AutoModel.from_config`: shapes without memory), exactly as `LoadedModel.info` counts them;
    - `dtype` with `auto`: the config's own (`dtype`, or `torch_dtype` in older files), else that of the first
      floating-point tensor of the weights' safetensors header when the weights are on disk (transformers' rule),
      else float32;
    - `device`: where `load_model` would put the model (asking torch only when CUDA could be there);
    - each layer's attention is read from the config by the family's traits (`AttentionTraits.layers`), as the
      loaded model reads it.
    """
    folder = _config_folder(name, revision)
    raw = checks.read_raw_config(folder, name)
    checks.check_config(raw, name)  # nonsense is refused, not printed as facts
    family = family_of(
        SimpleNamespace(
            model_type=raw.get("model_type"), use_bidirectional_attention=raw.get("use_bidirectional_attention")
        )
    )
    gpt2 = raw.get("model_type") == "gpt2" and not raw.get("add_cross_attention")  # no cross-attention layers
    if gpt2:
        facts = gpt2_facts(raw, name, family)
        layers = family.attention_layers(SimpleNamespace(**raw), facts["n_layer"], facts["n_head"], facts["n_kv_head"])
    else:
        facts, layers = _facts_from_architecture(name, folder, family)
    return {**facts, "device": _device_name(device), "dtype": _dtype_name(dtype, raw, folder)}, layers


def config_shape(name: str, revision: str | None = None) -> checks.Shape:
    """The layers, heads and kind of model `name` from its config.json alone (checked), for the settings to be
    checked against before any weights load: `--layer 99` is refused in a second, not after the load. None when
    the config leaves them to a default it does not name."""
    folder = _config_folder(name, revision)
    raw = checks.read_raw_config(folder, name)
    checks.check_config(raw, name)
    family = family_of(
        SimpleNamespace(
            model_type=raw.get("model_type"), use_bidirectional_attention=raw.get("use_bidirectional_attention")
        )
    )
    return checks.config_shape(raw, name, family.kind_name)


def _config_folder(name: str, revision: str | None) -> Path:
    """The folder that holds `name`'s config.json: the demo's, a local directory, or the Hugging Face cache's
    snapshot (config.json fetched alone when the Hub is reachable and it is not cached)."""
    check_revision(name, revision)
    if name == DEMO:
        path = demo_model_dir()
        if not (path / "config.json").exists():
            raise AttnscopeError(f"the demo model is not bundled in this installation ({path} has no config.json)")
        return path
    if looks_like_path(name):
        path = expanded_name(name)
        check_config_directory(path)
        return path
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json", revision=revision)
    except ValueError:  # not a valid repository name
        raise AttnscopeError(unknown_model_message(name, revision)) from None
    if isinstance(cached, str):
        return Path(cached).parent
    if not hub_reachable():
        raise AttnscopeError(offline_message(name, revision))
    try:
        return Path(hf_hub_download(name, "config.json", revision=revision)).parent
    except Exception as error:  # huggingface_hub's errors for a missing repository, revision or file, or the network
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if is_not_found(error, first_line):
            raise AttnscopeError(unknown_model_message(name, revision)) from error
        if type(error).__name__ == "EntryNotFoundError":
            raise AttnscopeError(f"model '{name}' has no config.json on the Hub") from error
        raise AttnscopeError(offline_message(name, revision)) from error


def gpt2_parameter_count(raw: dict[str, Any]) -> tuple[int, int]:
    """(all parameters of GPT2Model, those of one layer's attention) from a GPT-2 config.json, with GPT2Config's
    defaults for what it leaves out. With d = n_embd, I = n_inner (default 4d), V = vocab_size, P = n_positions:

        attention = 3d² + 3d (c_attn: W_Q, W_K, W_V and biases) + d² + d (c_proj: W_O and bias) = 4d² + 4d
        layer     = attention + I·d + I (mlp.c_fc) + I·d + d (mlp.c_proj) + 2 · 2d (ln_1, ln_2: weight and bias)
        total     = V·d (wte) + P·d (wpe) + n_layer · layer + 2d (ln_f)

    GPT-2 small (d 768, 12 layers, V 50257, P 1024): 124,439,808.
    """
    d = raw.get("n_embd", raw.get("hidden_size", 768))
    inner = raw.get("n_inner") or 4 * d
    vocab, positions = raw.get("vocab_size", 50257), raw.get("n_positions", raw.get("max_position_embeddings", 1024))
    layers = raw.get("n_layer", raw.get("num_hidden_layers", 12))
    attention = 4 * d * d + 4 * d
    per_layer = attention + (d * inner + inner) + (inner * d + d) + 2 * (2 * d)
    return vocab * d + positions * d + layers * per_layer + 2 * d, attention


def gpt2_facts(raw: dict[str, Any], name: str, family: Family) -> dict[str, Any]:
    """`LoadedModel.info` of a GPT-2 config.json (GPT2Config's defaults for what it leaves out), device and dtype
    left to the caller."""
    d = raw.get("n_embd", raw.get("hidden_size", 768))
    heads = raw.get("n_head", raw.get("num_attention_heads", 12))
    n_params, attention = gpt2_parameter_count(raw)
    return {
        "name": name,
        "family": family.name,
        "model_type": "gpt2",
        "kind": family.kind_name,
        "n_layer": raw.get("n_layer", raw.get("num_hidden_layers", 12)),
        "n_head": heads,
        "n_kv_head": heads,
        "d_model": d,
        "d_head": d // heads,
        "n_ctx": raw.get("n_positions", raw.get("max_position_embeddings", 1024)),
        "vocab_size": raw.get("vocab_size", 50257),
        "n_params": n_params,
        "attention_params": attention,
        "attention_params_formula": attention,  # GPT-2's attention is the formula's, biases included
        "device": "",
        "dtype": "",
    }


def _facts_from_architecture(name: str, folder: Path, family: Family) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`LoadedModel.info` and `attention_layers` of the model's architecture built on torch's meta device: every
    parameter has its shape and no memory, so counts are exact and nothing is read but the config."""
    import torch
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
        with torch.device("meta"):
            model = AutoModel.from_config(config, attn_implementation="eager")
    except Exception as error:  # a config transformers cannot build: name it, as loading would
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise AttnscopeError(f"cannot read model '{name}': {type(error).__name__}: {first_line}") from error
    built = LoadedModel(name, model, None, None, family)
    return built.info(), built.attention_layers()


def _device_name(spec: str) -> str:
    """`str(resolve_device(spec))`, without importing torch where the answer is certain: `cpu`, or `auto` where no
    CUDA (or ROCm) device can be visible (a CPU-only build of torch, or no GPU driver loaded)."""
    if spec.strip().lower() == "cpu" or (spec.strip().lower() == "auto" and not _gpu_possible()):
        return "cpu"
    return str(resolve_device(spec))


def _gpu_possible() -> bool:
    """False when torch.cuda.is_available() cannot be true here: torch was built for neither CUDA nor ROCm (read
    from torch/version.py, which holds only constants), or no NVIDIA or AMD GPU driver is loaded (Linux)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return True  # let torch itself say
    try:
        tree = ast.parse((Path(spec.origin).parent / "version.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return True
    built_for = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and isinstance(getattr(node, "value", None), ast.Constant):
            built_for[target.id] = node.value.value
    if built_for.get("cuda") is None and built_for.get("hip") is None:
        return False
    if os.path.isdir("/proc") and not (os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/kfd")):
        return False  # a Linux machine without an NVIDIA or AMD GPU driver
    return True


def _dtype_name(spec: str, raw: dict[str, Any], folder: Path) -> str:
    """The dtype `load_model(dtype=spec)` gives the model (see `model_facts`)."""
    spec = spec.strip().lower()
    if spec not in DTYPES:
        raise AttnscopeError(f"unknown dtype '{spec}': use one of {', '.join(DTYPES)}")
    if spec != "auto":
        return spec
    stored = raw.get("dtype") or raw.get("torch_dtype")
    if isinstance(stored, str):
        return stored.removeprefix("torch.")
    return _weights_dtype(folder) or "float32"


def _weights_dtype(folder: Path) -> str | None:
    """The dtype of the first floating-point tensor (by name) in the folder's safetensors weights, read from the
    file's header (its first 8 bytes give the length of a JSON table of every tensor's dtype and shape), or None
    when there are no weights there."""
    path = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if not path.exists() and index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            path = folder / weight_map[min(weight_map)]
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return None
    header = checks.safetensors_header(path)
    return None if header is None else checks.first_dtype(header, SAFETENSORS_DTYPES)
