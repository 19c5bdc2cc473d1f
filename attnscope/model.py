"""Loading a model and its tokenizer: the one place that talks to `from_pretrained`.

The model is loaded the way real GPT-2 (or BERT) is, whether it comes from the Hub, the local cache or a directory
saved with `save_pretrained`: the base model (no LM head), eval mode, eager attention, safetensors only, no remote
code. GPT-2-family decoders and BERT-family encoders are read; `LoadedModel.causal` tells them apart.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from attnscope.errors import AttnscopeError

SUPPORTED_MODEL_TYPES = ("gpt2", "bert")
CAUSAL_MODEL_TYPES = ("gpt2",)  # decoders: row i of a map sees keys 0..i
DEMO = "demo"  # --model demo: the small GPT-2 trained by scripts/train_demo_model.py, shipped in the package
DTYPES = ("auto", "float32", "float16", "bfloat16")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


@dataclass
class LoadedModel:
    """A base transformer ready for analysis, with its tokenizer and the facts `info` reports."""

    name: str
    model: Any  # transformers.PreTrainedModel (kept untyped so this module imports without torch)
    tokenizer: Any
    device: Any  # torch.device
    lm_model: Any = None  # the model with its language-model head, loaded only when asked (`ablate`); `model` is its base

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def n_layer(self) -> int:
        return self.config.num_hidden_layers

    @property
    def n_head(self) -> int:
        return self.config.num_attention_heads

    @property
    def d_model(self) -> int:
        return self.config.hidden_size

    @property
    def n_ctx(self) -> int:
        return self.config.max_position_embeddings

    @property
    def causal(self) -> bool:
        """Whether a token sees only itself and earlier tokens (GPT-2), rather than the whole text (BERT)."""
        return self.config.model_type in CAUSAL_MODEL_TYPES

    @property
    def dtype(self) -> Any:
        return next(self.model.parameters()).dtype

    def attention_modules(self) -> list[Any]:
        """One self-attention module per layer, in layer order (`h[i].attn` for GPT-2, `encoder.layer[i].attention.self`
        for BERT: the module that computes the attention weights)."""
        if self.config.model_type == "bert":
            return [layer.attention.self for layer in self.model.encoder.layer]
        return [block.attn for block in self.model.h]

    def head_output_projections(self) -> list[Any]:
        """Per layer, the module whose input is the heads' outputs side by side (head h in columns h·d_head ..
        (h+1)·d_head): GPT-2's `h[i].attn.c_proj`, BERT's `encoder.layer[i].attention.output.dense`."""
        if self.config.model_type == "bert":
            return [layer.attention.output.dense for layer in self.model.encoder.layer]
        return [block.attn.c_proj for block in self.model.h]

    def attention_parameters(self) -> int:
        """Parameters of the first layer's W_Q, W_K, W_V, W_O and their biases (BERT keeps W_O, with its LayerNorm,
        outside the self-attention module: only its dense projection is counted)."""
        if self.config.model_type == "bert":
            attention = self.model.encoder.layer[0].attention
            modules = [attention.self, attention.output.dense]
        else:
            modules = [self.attention_modules()[0]]
        return sum(p.numel() for module in modules for p in module.parameters())

    def info(self) -> dict[str, Any]:
        """Model facts for `attnscope info` and the `model` section of every JSON output.

        `attention_params_formula` is 4·d² (W_Q, W_K, W_V, W_O) plus 4·d biases; `attention_params` is counted
        from the first layer's real attention module, so a mismatch shows an architecture this formula misses.
        """
        d_model = self.d_model
        return {
            "name": self.name,
            "model_type": self.config.model_type,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "d_model": d_model,
            "d_head": d_model // self.n_head,
            "n_ctx": self.n_ctx,
            "vocab_size": self.config.vocab_size,
            "n_params": sum(p.numel() for p in self.model.parameters()),
            "attention_params": self.attention_parameters(),
            "attention_params_formula": 4 * d_model * d_model + 4 * d_model,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
        }


def resolve_device(spec: str) -> Any:
    """`auto` (CUDA when available, else CPU), `cpu`, `cuda` or `cuda:N`, checked against this machine."""
    import torch

    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", spec)
    if match is None:
        raise AttnscopeError(f"unknown device '{spec}': use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else "no CUDA device is visible"
        raise AttnscopeError(f"--device {spec}: CUDA is not available here ({build}); use --device cpu")
    index = int(match.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise AttnscopeError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return torch.device("cuda", index)


def resolve_dtype(spec: str) -> Any:
    """`auto` keeps the checkpoint's own dtype (float32 for GPT-2); the others force it."""
    import torch

    spec = spec.strip().lower()
    if spec not in DTYPES:
        raise AttnscopeError(f"unknown dtype '{spec}': use one of {', '.join(DTYPES)}")
    return "auto" if spec == "auto" else getattr(torch, spec)


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".\\")) or name in (".", "..") or os.path.exists(name)


def _check_local_directory(path: Path) -> None:
    """Refuse, in one line, a directory that `from_pretrained` would fail on with a long traceback."""
    if not path.exists():
        raise AttnscopeError(f"no such model directory: {path}")
    if not path.is_dir():
        raise AttnscopeError(f"{path} is a file; --model takes a Hub id or a directory saved with save_pretrained")
    files = [entry.name for entry in path.iterdir()]
    if "config.json" not in files:
        raise AttnscopeError(f"{path} holds no config.json; save the model there with save_pretrained")
    if not any(name.endswith(".safetensors") or name.endswith(".safetensors.index.json") for name in files):
        pickles = [name for name in files if name.endswith(PICKLE_SUFFIXES)]
        if pickles:
            raise AttnscopeError(
                f"{path} holds only a pickle checkpoint ({pickles[0]}); attnscope loads safetensors only, "
                "since unpickling can run arbitrary code: re-save it with save_pretrained(..., safe_serialization=True)"
            )
        raise AttnscopeError(f"{path} holds no model weights (no .safetensors file)")


def demo_model_dir() -> Path:
    """The bundled demo model's folder (inside the installed package)."""
    from importlib import resources

    return Path(str(resources.files("attnscope") / "demo_model"))


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One quick TCP connection to the Hub, so an offline machine gets an answer now rather than after retries."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _is_cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an id that is not a valid repo name is simply not cached
        return False


def load_config(name: str) -> Any | None:
    """The model's config without its weights, or None when it cannot be had (offline and not cached)."""
    from transformers import AutoConfig

    if name == DEMO:
        name = str(demo_model_dir())
    elif not _looks_like_path(name) and not _is_cached(name) and not _hub_reachable():
        return None
    try:
        return AutoConfig.from_pretrained(name, trust_remote_code=False)
    except (OSError, ValueError):
        return None


def _offline_message(name: str) -> str:
    return (
        f"model '{name}' is not in the local Hugging Face cache and the Hub cannot be reached; "
        "pass a directory saved with save_pretrained (--model PATH), or point HF_HOME at a cache that has it "
        "(with HF_HUB_OFFLINE=1 to skip the network)"
    )


def load_model(name: str, device: str = "auto", dtype: str = "auto", lm_head: bool = False) -> LoadedModel:
    """Load `name` (`demo`, a Hub id or a local directory) for analysis on `device` in `dtype`; with `lm_head`, the
    model with its language-model head (for losses), whose base model is then the one analysed.

    Raises AttnscopeError, with one line saying what to do, for every failure a user can cause.
    """
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    if name == DEMO:
        path = demo_model_dir()
        if not (path / "config.json").exists():
            raise AttnscopeError(
                f"the demo model is not bundled in this installation ({path} has no config.json); reinstall "
                "attnscope, or use --model gpt2 or a directory saved with save_pretrained"
            )
        source = str(path)
    elif _looks_like_path(name):
        path = Path(name).expanduser()
        _check_local_directory(path)
        source = str(path)
    else:
        source = name
        if not _is_cached(name) and not _hub_reachable():
            raise AttnscopeError(_offline_message(name))

    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # a user of the CLI does not need transformers' load reports
    hf_logging.disable_progress_bar()
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise AttnscopeError(
                f"model type '{config.model_type}' is not supported yet; attnscope reads GPT-2-family decoders "
                f"and BERT-family encoders ({', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        # an encoder's language-model head predicts masked tokens, a decoder's the next token
        lm_class = AutoModelForCausalLM if config.model_type in CAUSAL_MODEL_TYPES else AutoModelForMaskedLM
        model_class = lm_class if lm_head else AutoModel
        model = model_class.from_pretrained(
            source,
            attn_implementation="eager",  # SDPA returns no attention weights (see README, "How it works")
            use_safetensors=True,
            trust_remote_code=False,
            dtype=torch_dtype,
        )
    except AttnscopeError:
        raise
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if "couldn't connect" in first_line.lower() or "offline" in first_line.lower():
            raise AttnscopeError(_offline_message(name)) from None
        raise AttnscopeError(f"cannot load model '{name}': {first_line}") from None
    model.eval()
    try:
        model.to(torch_device)
    except RuntimeError as error:  # e.g. CUDA out of memory
        raise AttnscopeError(f"cannot move model '{name}' to {torch_device}: {str(error).splitlines()[0]}") from None
    if lm_head:
        return LoadedModel(name=name, model=model.base_model, tokenizer=tokenizer, device=torch_device, lm_model=model)
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, device=torch_device)
