"""Loading a model and its tokenizer: the one place that talks to `from_pretrained`.

The model is loaded the way real GPT-2 (or BERT) is, whether it comes from the Hub, the local cache or a directory
saved with `save_pretrained`: the base model (no LM head), eval mode, eager attention, safetensors only, no remote
code. The families read are those of `models.families`; `LoadedModel.family` says which one a model is.

What `LoadedModel.info` gives, `models.facts.model_facts` gives from the model's config.json alone (`attnscope
info`): no weights, no tokenizer, and for GPT-2 (the demo model) not even torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.models import checks
from attnscope.models.families import CAUSAL_LM, Family, family_of
from attnscope.models.locating import (
    DEMO,
    TOKENIZER_FILES,
    check_local_directory,
    check_revision,
    check_stored_config,
    expanded_name,
    hub_reachable,
    is_cached,
    is_not_found,
    looks_like_path,
    offline_message,
    stored_folder,
    unknown_model_message,
)
from attnscope.models.stored import check_stored_shapes, check_tokenizer_files

if TYPE_CHECKING:
    from attnscope.scores.kinds import Kind

DTYPES = options.DTYPES


@dataclass
class LoadedModel:
    """A base transformer ready for analysis, with its tokenizer, its family and the facts `info` reports."""

    name: str
    model: Any  # transformers.PreTrainedModel (kept untyped so this module imports without torch)
    tokenizer: Any
    device: Any  # torch.device
    family: Family
    lm_model: Any = None  # the model with its language-model head, loaded only when asked (`ablate`); `model`: its base
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

    @property
    def shape(self) -> checks.Shape:
        """What settings are checked against (layers, heads, kind, context), as `config_shape` gives before a load."""
        return checks.Shape(self.n_layer, self.n_head, self.kind.name, self.n_ctx)

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

    def attention_layers(self) -> list[dict[str, Any]]:
        """Each layer's attention (`attnscope info`'s `layers`): full or a sliding window, soft-capping, QK-norm,
        sinks, key/value heads, read from the config by the family's traits (`AttentionTraits.layers`)."""
        return self.family.attention_layers(self.config, self.n_layer, self.n_head, self.n_kv_head)


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
    match = re.fullmatch(options.DEVICE_PATTERN, spec)
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


def demo_model_dir() -> Path:
    """The bundled demo model's folder (inside the installed package)."""
    from importlib import resources

    return Path(str(resources.files("attnscope") / "demo_model"))


def load_config(name: str, revision: str | None = None) -> Any | None:
    """The model's config without its weights, or None when it cannot be had (offline and not cached)."""
    from transformers import AutoConfig

    shown = name
    check_revision(name, revision)
    if name == DEMO:
        name = str(demo_model_dir())
    check_stored_config(shown, str(expanded_name(name)) if looks_like_path(name) else name, revision)
    local_only = not looks_like_path(name) and not hub_reachable()  # offline: the cache answers at once
    try:
        config = AutoConfig.from_pretrained(
            name, trust_remote_code=False, local_files_only=local_only, revision=revision
        )
    except (OSError, ValueError):
        return None
    checks.check_config_object(config, shown)
    return config


def _check_accelerate() -> None:
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise AttnscopeError("a device map needs accelerate: pip install 'attnscope[big]' (or pip install accelerate)")


def _from_pretrained(name: str, loader: Any, source: str, local_only: bool, part: str = "", **options: Any) -> Any:
    """`loader.from_pretrained(source)`, with every failure turned into one line naming the model, the `part` of it
    being loaded (`the tokenizer (tokenizer.json) of `) and the cause."""
    try:
        return loader.from_pretrained(source, trust_remote_code=False, local_files_only=local_only, **options)
    except Exception as error:  # only transformers runs here, and a damaged file makes it raise almost anything
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if "couldn't connect" in first_line.lower() or "offline" in first_line.lower():
            raise AttnscopeError(offline_message(name, options.get("revision"))) from error
        if is_not_found(error, first_line):
            raise AttnscopeError(unknown_model_message(name, options.get("revision"))) from error
        # transformers' OSErrors are sentences; anything else (SafetensorError, ...) is known by its type
        cause = first_line if isinstance(error, OSError) else f"{type(error).__name__}: {first_line}"
        raise AttnscopeError(f"cannot load {part}model '{name}': {cause}") from error


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
    check_revision(name, revision)
    if device_map is not None:
        _check_accelerate()
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    source, local_only = _source(name, revision)
    check_stored_config(name, source, revision)
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # a user of the CLI does not need transformers' load reports
    hf_logging.disable_progress_bar()
    at_revision = {} if revision is None else {"revision": revision}
    config = _from_pretrained(name, AutoConfig, source, local_only, **at_revision)
    checks.check_config_object(config, name)
    family = family_of(config)
    # an encoder's language-model head predicts masked tokens, a decoder's the next token
    lm_class = AutoModelForCausalLM if family.lm_head == CAUSAL_LM else AutoModelForMaskedLM
    folder = stored_folder(source, revision)
    if folder is not None:  # a config claiming more than the weights hold is refused before it is built
        check_stored_shapes(name, folder, config, family, lm_class if lm_head else AutoModel)
    tokenizer = _tokenizer(name, source, local_only, folder, revision)
    loaded = _from_pretrained(
        name,
        lm_class if lm_head else AutoModel,
        source,
        local_only,
        attn_implementation="eager",  # SDPA returns no attention weights (see docs/capture.md)
        use_safetensors=True,
        dtype=torch_dtype,
        output_loading_info=True,  # what transformers could not load, it would start from random numbers
        ignore_mismatched_sizes=True,  # a weight of another shape is reported in the loading info, and refused
        **at_revision,
        **({} if device_map is None else {"device_map": device_map}),
    )
    model, loading_info = loaded
    head = ("next-token" if family.lm_head == CAUSAL_LM else "masked") if lm_head else None
    checks.check_loaded_weights(name, loading_info, model, head)
    model.eval()
    family.prepare(model.base_model)
    torch_device = _placed(name, model, torch_device, device_map)
    if lm_head:
        return LoadedModel(name, model.base_model, tokenizer, torch_device, family, lm_model=model)
    return LoadedModel(name, model, tokenizer, torch_device, family)


def _source(name: str, revision: str | None) -> tuple[str, bool]:
    """Where `name`'s files are read from (the bundled demo's folder, a local folder, or a Hub id), and whether from
    the local cache only: without a route to the Hub, asked for a file it lacks, huggingface_hub would retry for
    minutes, then fail on a file the user never named."""
    if name == DEMO:
        path = demo_model_dir()
        if not (path / "config.json").exists():
            raise AttnscopeError(
                f"the demo model is not bundled in this installation ({path} has no config.json); reinstall "
                "attnscope, or use --model gpt2 or a directory saved with save_pretrained"
            )
        return str(path), False
    if looks_like_path(name):
        path = expanded_name(name)
        check_local_directory(path)
        return str(path), False
    local_only = not hub_reachable()
    if local_only and not is_cached(name, revision):
        raise AttnscopeError(offline_message(name, revision))
    return name, local_only


def _tokenizer(name: str, source: str, local_only: bool, folder: Path | None, revision: str | None) -> Any:
    """The model's tokenizer, its stored files checked first; refused where transformers read no vocabulary: finding
    no tokenizer file, it builds an empty tokenizer (one special token at most) instead of failing."""
    from transformers import AutoTokenizer

    files = [] if folder is None else check_tokenizer_files(folder, name)
    part = f"the tokenizer ({', '.join(files)}) of " if files else "the tokenizer of "
    at_revision = {} if revision is None else {"revision": revision}
    tokenizer = _from_pretrained(name, AutoTokenizer, source, local_only, part, **at_revision)
    if len(tokenizer) <= 1:
        raise AttnscopeError(
            offline_message(name, revision)
            if local_only
            else f"model '{name}' has no usable tokenizer: transformers read no vocabulary from it "
            f"({', '.join(TOKENIZER_FILES)})"
        )
    return tokenizer


def _placed(name: str, model: Any, device: Any, device_map: str | None) -> Any:
    """The device the model's inputs go to: `device`, the model moved there (one line where it does not fit), or,
    spread by a device map, where its embeddings are."""
    if device_map is not None:
        return model.get_input_embeddings().weight.device
    try:
        model.to(device)
    except RuntimeError as error:  # e.g. CUDA out of memory
        raise AttnscopeError(f"cannot move model '{name}' to {device}: {str(error).splitlines()[0]}") from None
    return device
