"""Loading a model and its tokenizer: the one place that talks to `from_pretrained`.

The model is loaded the way real GPT-2 (or BERT) is, whether it comes from the Hub, the local cache or a directory
saved with `save_pretrained`: the base model (no LM head), eval mode, eager attention, safetensors only, no remote
code. The families read are those of `models.families`; `LoadedModel.family` says which one a model is.

`model_facts` gives what `LoadedModel.info` gives from the model's config.json alone (`attnscope info`): no weights,
no tokenizer, and for GPT-2 (the demo model) not even torch.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from attnscope.errors import AttnscopeError
from attnscope.models.families import CAUSAL_LM, Family, family_of

if TYPE_CHECKING:
    from attnscope.scores.kinds import Kind

DEMO = "demo"  # --model demo: the small GPT-2 trained by scripts/train_demo_model.py, shipped in the package
# Said by every error that means "this model cannot be had": the one model that is always there.
DEMO_HINT = "--model demo runs the small GPT-2 bundled with attnscope, with no download"
DTYPES = ("auto", "float32", "float16", "bfloat16")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt")  # the vocabulary: any fast tokenizer, GPT-2, BERT


@dataclass
class LoadedModel:
    """A base transformer ready for analysis, with its tokenizer, its family and the facts `info` reports."""

    name: str
    model: Any  # transformers.PreTrainedModel (kept untyped so this module imports without torch)
    tokenizer: Any
    device: Any  # torch.device
    family: Family
    lm_model: Any = (
        None  # the model with its language-model head, loaded only when asked (`ablate`); `model` is its base
    )
    kernel: str = "auto"  # what computes attention when an analysis captures it: auto, fused or blocks (capture.run)

    @property
    def kind(self) -> Kind:
        """The kind of attention map (decoder or encoder): which rows are scored, which keys a row sees."""
        return self.family.kind

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
    def n_kv_head(self) -> int:
        """Key/value heads (fewer than query heads with grouped- or multi-query attention)."""
        return getattr(self.config, "num_key_value_heads", None) or self.n_head

    @property
    def d_model(self) -> int:
        return self.config.hidden_size

    @property
    def d_head(self) -> int:
        return getattr(self.config, "head_dim", None) or self.d_model // self.n_head

    @property
    def n_ctx(self) -> int:
        return self.config.max_position_embeddings

    @property
    def dtype(self) -> Any:
        return next(self.model.parameters()).dtype

    def info(self) -> dict[str, Any]:
        """Model facts for `attnscope info` and the `model` section of every JSON output.

        `attention_params_formula` counts W_Q (d × H·d_head), W_K and W_V (d × H_kv·d_head each), W_O (H·d_head × d)
        and, where the model has them, their biases (4·d² + 4·d for GPT-2); `attention_params` is counted from the
        first layer's real attention modules, so a mismatch shows what the formula leaves out (QK-norms, sinks).
        """
        d, H, H_kv, d_head = self.d_model, self.n_head, self.n_kv_head, self.d_head
        weights = d * d_head * (2 * H + 2 * H_kv)
        has_biases = any(
            name.endswith("bias")
            for module in self.family.attention_modules(self.model)[:1]
            for name, _ in module.named_parameters()
        )
        return {
            "name": self.name,
            "family": self.family.name,
            "model_type": self.config.model_type,
            "kind": self.kind.name,
            "n_layer": self.n_layer,
            "n_head": H,
            "n_kv_head": H_kv,
            "d_model": d,
            "d_head": d_head,
            "n_ctx": self.n_ctx,
            "vocab_size": self.config.vocab_size,
            "n_params": sum(p.numel() for p in self.model.parameters()),
            "attention_params": self.family.attention_parameter_count(self.model),
            "attention_params_formula": weights + (d_head * (H + 2 * H_kv) + d if has_biases else 0),
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
        }


def fastest_attention(model: Any) -> str:
    """The fastest attention a model's family has, for passes that need no weights (a loss, the bench's floor):
    SDPA, or eager for a family without it (Gemma 2's soft-capping)."""
    return "sdpa" if getattr(model, "_supports_sdpa", False) else "eager"


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
        count = torch.cuda.device_count()
        raise AttnscopeError(f"--device {spec}: only {count} CUDA device{'s are' if count != 1 else ' is'} visible")
    return torch.device("cuda", index)


def resolve_dtype(spec: str) -> Any:
    """`auto` keeps the checkpoint's own dtype (float32 for GPT-2); the others force it."""
    import torch

    spec = spec.strip().lower()
    if spec not in DTYPES:
        raise AttnscopeError(f"unknown dtype '{spec}': use one of {', '.join(DTYPES)}")
    return "auto" if spec == "auto" else getattr(torch, spec)


def _looks_like_path(name: str) -> bool:
    # No Hub id ends with a slash: `nope-dir/` is a directory that is missing, not a repository to download.
    return (
        name.startswith(("/", "./", "../", "~", ".\\"))
        or name.endswith(("/", "\\"))
        or name in (".", "..")
        or os.path.exists(name)
    )


def _check_config_directory(path: Path) -> list[str]:
    """The names of the files in `path`, a directory with a config.json; else one line saying what is wrong."""
    if not path.exists():  # Path("./x") prints as x
        raise AttnscopeError(
            f"no such model directory: {path.absolute()}; --model takes 'demo', a Hugging Face id or a directory "
            f"saved with save_pretrained ({DEMO_HINT})"
        )
    if not path.is_dir():
        raise AttnscopeError(
            f"{path} is a file; --model takes 'demo', a Hugging Face id or a directory saved with save_pretrained"
        )
    files = [entry.name for entry in path.iterdir()]
    if "config.json" not in files:
        raise AttnscopeError(f"{path} holds no config.json; save the model there with save_pretrained")
    return files


def _check_local_directory(path: Path) -> None:
    """Refuse, in one line, a directory that `from_pretrained` would fail on with a long traceback."""
    files = _check_config_directory(path)
    if not any(name.endswith(".safetensors") or name.endswith(".safetensors.index.json") for name in files):
        pickles = [name for name in files if name.endswith(PICKLE_SUFFIXES)]
        if pickles:
            raise AttnscopeError(
                f"{path} holds only a pickle checkpoint ({pickles[0]}); attnscope loads safetensors only, "
                "since unpickling can run arbitrary code: re-save it with save_pretrained(..., safe_serialization=True)"
            )
        raise AttnscopeError(f"{path} holds no model weights (no .safetensors file)")
    # Without these transformers builds an empty tokenizer, and every text would later have "no tokens".
    if not any(name in files for name in TOKENIZER_FILES):
        raise AttnscopeError(
            f"{path} holds no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); "
            "save the tokenizer there too with tokenizer.save_pretrained"
        )


def demo_model_dir() -> Path:
    """The bundled demo model's folder (inside the installed package)."""
    from importlib import resources

    return Path(str(resources.files("attnscope") / "demo_model"))


def _hub_reachable(timeout: float = 2.0) -> bool:
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


def _is_cached(name: str, revision: str | None = None) -> bool:
    """Whether the Hugging Face cache holds what loading `name` offline needs: config.json and the safetensors
    weights (one file, or the index and every shard it lists). A cached config alone (left by `AutoConfig` or an
    interrupted download) is not enough. Tokenizer files are checked once loaded, by the tokenizer's length."""
    from huggingface_hub import try_to_load_from_cache

    def cached(filename: str) -> bool:
        return isinstance(try_to_load_from_cache(name, filename, revision=revision), str)

    try:
        if not cached("config.json"):
            return False
        if cached("model.safetensors"):
            return True
        index = try_to_load_from_cache(name, "model.safetensors.index.json", revision=revision)
        if not isinstance(index, str):
            return False
        shards = set(json.loads(Path(index).read_text(encoding="utf-8"))["weight_map"].values())
        return all(cached(shard) for shard in shards)
    except (ValueError, OSError, KeyError, AttributeError):  # an invalid repo name, an unreadable index: unusable
        return False


def load_config(name: str, revision: str | None = None) -> Any | None:
    """The model's config without its weights, or None when it cannot be had (offline and not cached)."""
    from transformers import AutoConfig

    if name == DEMO:
        name = str(demo_model_dir())
    local_only = not _looks_like_path(name) and not _hub_reachable()  # offline: the cache answers at once
    try:
        return AutoConfig.from_pretrained(name, trust_remote_code=False, local_files_only=local_only, revision=revision)
    except (OSError, ValueError):
        return None


def _check_accelerate() -> None:
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise AttnscopeError("a device map needs accelerate: pip install 'attnscope[big]' (or pip install accelerate)")


def _offline_message(name: str, revision: str | None = None) -> str:
    at = "" if revision is None else f" at revision '{revision}'"
    return (
        f"model '{name}'{at} is not in the local Hugging Face cache and the Hub cannot be reached; {DEMO_HINT}; "
        "or pass a directory saved with save_pretrained (--model PATH), or point HF_HOME at a cache that has it "
        "(with HF_HUB_OFFLINE=1 to skip the network)"
    )


def _unknown_model_message(name: str, revision: str | None = None) -> str:
    at = "" if revision is None else f" at revision '{revision}'"
    return (
        f"model '{name}'{at} is neither a local directory nor a model on the Hugging Face Hub (check the spelling, "
        f"or log in with `hf auth login` for a private or gated one); {DEMO_HINT}"
    )


def _is_not_found(error: BaseException, first_line: str) -> bool:
    """Whether loading failed because the Hub has no such repository (or revision): huggingface_hub's errors, or
    the OSError transformers makes of them ("... is not a local folder and is not a valid model identifier")."""
    names = {type(cause).__name__ for cause in (error, error.__cause__, error.__context__) if cause is not None}
    return bool(names & {"RepositoryNotFoundError", "RevisionNotFoundError"}) or (
        "not a valid model identifier" in first_line or "is not a valid git identifier" in first_line
    )


def _from_pretrained(name: str, loader: Any, source: str, local_only: bool, **options: Any) -> Any:
    """`loader.from_pretrained(source)`, with every failure turned into one line naming the model and the cause."""
    try:
        return loader.from_pretrained(source, trust_remote_code=False, local_files_only=local_only, **options)
    except Exception as error:  # only transformers runs here, and a damaged file makes it raise almost anything
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if "couldn't connect" in first_line.lower() or "offline" in first_line.lower():
            raise AttnscopeError(_offline_message(name, options.get("revision"))) from error
        if _is_not_found(error, first_line):
            raise AttnscopeError(_unknown_model_message(name, options.get("revision"))) from error
        # transformers' OSErrors are sentences; anything else (SafetensorError, ...) is known by its type
        cause = first_line if isinstance(error, OSError) else f"{type(error).__name__}: {first_line}"
        raise AttnscopeError(f"cannot load model '{name}': {cause}") from error


def load_model(
    name: str,
    device: str = "auto",
    dtype: str = "auto",
    lm_head: bool = False,
    revision: str | None = None,
    device_map: str | None = None,
) -> LoadedModel:
    """Load `name` (`demo`, a Hub id or a local directory; at a Hub `revision`: a branch, tag or commit) for
    analysis on `device` in `dtype`; with `lm_head`, the model with its language-model head (for losses), whose base
    model is then the one analysed. `device_map="auto"` spreads a model too large for one device over all of them
    (through accelerate, the optional extra `attnscope[big]`); `device` then names where inputs start.

    Raises AttnscopeError, with one line saying what to do, for every failure a user can cause.
    """
    if device_map is not None:
        _check_accelerate()
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    local_only = False
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
        # Without a route to the Hub, read the cache only: asked for a file it lacks, huggingface_hub would retry
        # for minutes, then fail on a file the user never named.
        local_only = not _hub_reachable()
        if local_only and not _is_cached(name, revision):
            raise AttnscopeError(_offline_message(name, revision))

    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # a user of the CLI does not need transformers' load reports
    hf_logging.disable_progress_bar()
    at_revision = {} if revision is None else {"revision": revision}
    config = _from_pretrained(name, AutoConfig, source, local_only, **at_revision)
    family = family_of(config)
    tokenizer = _from_pretrained(name, AutoTokenizer, source, local_only, **at_revision)
    # Finding no tokenizer file, transformers builds an empty tokenizer (one special token at most) instead of failing.
    if len(tokenizer) <= 1:
        raise AttnscopeError(
            _offline_message(name, revision)
            if local_only
            else f"model '{name}' has no usable tokenizer: transformers read no vocabulary from it "
            f"({', '.join(TOKENIZER_FILES)})"
        )
    # an encoder's language-model head predicts masked tokens, a decoder's the next token
    lm_class = AutoModelForCausalLM if family.lm_head == CAUSAL_LM else AutoModelForMaskedLM
    loaded = _from_pretrained(
        name,
        lm_class if lm_head else AutoModel,
        source,
        local_only,
        attn_implementation="eager",  # SDPA returns no attention weights (see docs/capture.md)
        use_safetensors=True,
        dtype=torch_dtype,
        output_loading_info=lm_head,
        **at_revision,
        **({} if device_map is None else {"device_map": device_map}),
    )
    model = loaded[0] if lm_head else loaded
    if lm_head and loaded[1]["missing_keys"]:
        # transformers would start the missing head from random weights: every loss would be noise
        missing = sorted(loaded[1]["missing_keys"])
        raise AttnscopeError(
            f"model '{name}' has no {'masked' if family.lm_head != CAUSAL_LM else 'next-token'} language-model head "
            f"to measure a loss with ({len(missing)} weight{'s' if len(missing) != 1 else ''} missing, e.g. "
            f"{missing[0]}); use a checkpoint saved with "
            "its head (an ELECTRA generator, not its discriminator)"
        )
    model.eval()
    family.prepare(model.base_model)
    if device_map is None:
        try:
            model.to(torch_device)
        except RuntimeError as error:  # e.g. CUDA out of memory
            raise AttnscopeError(
                f"cannot move model '{name}' to {torch_device}: {str(error).splitlines()[0]}"
            ) from None
    else:  # inputs go where the embeddings are
        torch_device = model.get_input_embeddings().weight.device
    if lm_head:
        return LoadedModel(name, model.base_model, tokenizer, torch_device, family, lm_model=model)
    return LoadedModel(name, model, tokenizer, torch_device, family)


# ------------------------------------------------------------------------------------ facts from the config alone

SAFETENSORS_DTYPES = {  # the floating-point dtypes of the safetensors format, by torch's names
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


def model_facts(name: str, device: str = "auto", dtype: str = "auto", revision: str | None = None) -> dict[str, Any]:
    """What `load_model(name, device, dtype).info()` reports, from the model's config.json alone: no weights are
    read (nor downloaded), no tokenizer either. Every fact is the loaded model's:

    - the shape (layers, heads, widths, context, vocabulary) is the config's, as transformers reads it;
    - `n_params` and `attention_params`: for GPT-2 (the demo model, gpt2 …) counted by formula from the config
      (`gpt2_parameter_count`), without torch; for every other family, counted on the architecture built on torch's
      meta device (`AutoModel.from_config`: shapes without memory), exactly as `LoadedModel.info` counts them;
    - `dtype` with `auto`: the config's own (`dtype`, or `torch_dtype` in older files), else that of the first
      floating-point tensor of the weights' safetensors header when the weights are on disk (transformers' rule),
      else float32;
    - `device`: where `load_model` would put the model (asking torch only when CUDA could be there).
    """
    folder = _config_folder(name, revision)
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise AttnscopeError(f"cannot read the config.json of model '{name}': {error}") from None
    if not isinstance(raw, dict):
        raise AttnscopeError(f"the config.json of model '{name}' is not a JSON object")
    family = family_of(
        SimpleNamespace(
            model_type=raw.get("model_type"), use_bidirectional_attention=raw.get("use_bidirectional_attention")
        )
    )
    gpt2 = raw.get("model_type") == "gpt2" and not raw.get("add_cross_attention")  # no cross-attention blocks
    facts = gpt2_facts(raw, name, family) if gpt2 else _facts_from_architecture(name, folder, family)
    return {**facts, "device": _device_name(device), "dtype": _dtype_name(dtype, raw, folder)}


def _config_folder(name: str, revision: str | None) -> Path:
    """The folder that holds `name`'s config.json: the demo's, a local directory, or the Hugging Face cache's
    snapshot (config.json fetched alone when the Hub is reachable and it is not cached)."""
    if name == DEMO:
        path = demo_model_dir()
        if not (path / "config.json").exists():
            raise AttnscopeError(f"the demo model is not bundled in this installation ({path} has no config.json)")
        return path
    if _looks_like_path(name):
        path = Path(name).expanduser()
        _check_config_directory(path)
        return path
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json", revision=revision)
    except ValueError:  # not a valid repository name
        raise AttnscopeError(_unknown_model_message(name, revision)) from None
    if isinstance(cached, str):
        return Path(cached).parent
    if not _hub_reachable():
        raise AttnscopeError(_offline_message(name, revision))
    try:
        return Path(hf_hub_download(name, "config.json", revision=revision)).parent
    except Exception as error:  # huggingface_hub's errors for a missing repository, revision or file, or the network
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if _is_not_found(error, first_line):
            raise AttnscopeError(_unknown_model_message(name, revision)) from error
        if type(error).__name__ == "EntryNotFoundError":
            raise AttnscopeError(f"model '{name}' has no config.json on the Hub") from error
        raise AttnscopeError(_offline_message(name, revision)) from error


def gpt2_parameter_count(raw: dict[str, Any]) -> tuple[int, int]:
    """(all parameters of GPT2Model, those of one attention block) from a GPT-2 config.json, with GPT2Config's
    defaults for what it leaves out. With d = n_embd, I = n_inner (default 4d), V = vocab_size, P = n_positions:

        attention = 3d² + 3d (c_attn: W_Q, W_K, W_V and biases) + d² + d (c_proj: W_O and bias) = 4d² + 4d
        block     = attention + I·d + I (mlp.c_fc) + I·d + d (mlp.c_proj) + 2 · 2d (ln_1, ln_2: weight and bias)
        total     = V·d (wte) + P·d (wpe) + n_layer · block + 2d (ln_f)

    GPT-2 small (d 768, 12 layers, V 50257, P 1024): 124,439,808.
    """
    d = raw.get("n_embd", raw.get("hidden_size", 768))
    inner = raw.get("n_inner") or 4 * d
    vocab, positions = raw.get("vocab_size", 50257), raw.get("n_positions", raw.get("max_position_embeddings", 1024))
    layers = raw.get("n_layer", raw.get("num_hidden_layers", 12))
    attention = 4 * d * d + 4 * d
    block = attention + (d * inner + inner) + (inner * d + d) + 2 * (2 * d)
    return vocab * d + positions * d + layers * block + 2 * d, attention


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


def _facts_from_architecture(name: str, folder: Path, family: Family) -> dict[str, Any]:
    """`LoadedModel.info` of the model's architecture built on torch's meta device: every parameter has its shape
    and no memory, so counts are exact and nothing is read but the config."""
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
    return LoadedModel(name, model, None, None, family).info()


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
    try:
        if not path.exists() and index.exists():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            path = folder / weight_map[min(weight_map)]
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
    except (OSError, ValueError, KeyError, struct.error):
        return None
    for tensor in sorted(key for key in header if key != "__metadata__"):
        if header[tensor].get("dtype") in SAFETENSORS_DTYPES:
            return SAFETENSORS_DTYPES[header[tensor]["dtype"]]
    return None
