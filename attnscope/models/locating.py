"""Where a model is, before anything loads: the bundled demo, a folder on this machine (checked for a config.json,
safetensors weights and tokenizer files) or a Hub id (cached, or the Hub reachable); the config.json it holds checked
before transformers builds anything; and the one-line messages for a model that cannot be had (offline, unknown),
which `models.loading` and `models.facts` both say.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.models import checks

DEMO = "demo"  # --model demo: the small GPT-2 trained by scripts/train_demo_model.py, shipped in the package
# Said by every error that means "this model cannot be had": the one model that is always there.
# said from the command line and from Python alike: the model's name, then how the command line spells it
DEMO_HINT = "the model 'demo' (--model demo) is the small GPT-2 bundled with attnscope, with no download"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt")  # the vocabulary: any fast tokenizer, GPT-2, BERT


def looks_like_path(name: str) -> bool:
    # No Hub id ends with a slash: `nope-dir/` is a directory that is missing, not a repository to download.
    return (
        name.startswith(("/", "./", "../", "~", ".\\"))
        or name.endswith(("/", "\\"))
        or name in (".", "..")
        or os.path.exists(name)
    )


def check_revision(name: str, revision: str | None) -> None:
    """A revision is a Hub model's: transformers would ignore it for a folder, silently analysing what is there."""
    if revision is not None and (name == DEMO or looks_like_path(name)):
        raise AttnscopeError(
            f"revision (--revision) {revision}: model '{name}' is {local_kind(name)}, which has no revisions; a "
            "revision picks a branch, tag or commit of a model on the Hugging Face Hub"
        )


def local_kind(name: str) -> str:
    """What a model on this machine is, in words: the bundled demo, or a folder."""
    return "the demo model bundled with attnscope" if name == DEMO else "a folder on this machine"


def expanded_name(name: str) -> Path:
    return options.expanded_path(name, "--model")


def check_config_directory(path: Path) -> list[str]:
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


def check_local_directory(path: Path) -> None:
    """Refuse, in one line, a directory that `from_pretrained` would fail on with a long traceback."""
    files = check_config_directory(path)
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


def hub_reachable(timeout: float = 2.0) -> bool:
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


def is_cached(name: str, revision: str | None = None) -> bool:
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


def _no_folder(name: str) -> str:
    """What a name of the form `a/b` (a Hub id, or a folder relative to here: `runs/step-0000`) adds when neither
    exists: that there is no such folder here either, so a user who meant a folder sees where it was looked for."""
    if "/" not in name.strip("/") or os.path.exists(name):
        return ""
    return f" (nor is there a folder {Path(name).absolute()})"


def _demo_meant(name: str) -> str:
    """`did you mean 'demo'? ` where the name is one letter from it (`demoo`, `Demo`, `dmeo`)."""
    import difflib

    return f"did you mean '{DEMO}'? " if difflib.get_close_matches(name.lower(), [DEMO], cutoff=0.7) else ""


def offline_message(name: str, revision: str | None = None) -> str:
    at = "" if revision is None else f" at revision '{revision}'"
    return (
        f"model '{name}'{at} is not in the local Hugging Face cache and the Hub cannot be reached{_no_folder(name)}; "
        f"{_demo_meant(name)}{DEMO_HINT}; or pass a directory saved with save_pretrained (--model PATH), or point "
        "HF_HOME at a cache that has it (with HF_HUB_OFFLINE=1 to skip the network)"
    )


def unknown_model_message(name: str, revision: str | None = None) -> str:
    at = "" if revision is None else f" at revision '{revision}'"
    return (
        f"model '{name}'{at} is neither a local directory nor a model on the Hugging Face Hub{_no_folder(name)} "
        f"(check the spelling, or log in with `hf auth login` for a private or gated one); {_demo_meant(name)}"
        f"{DEMO_HINT}"
    )


def is_not_found(error: BaseException, first_line: str) -> bool:
    """Whether loading failed because the Hub has no such repository (or revision): huggingface_hub's errors, or
    the OSError transformers makes of them ("... is not a local folder and is not a valid model identifier")."""
    names = {type(cause).__name__ for cause in (error, error.__cause__, error.__context__) if cause is not None}
    return bool(names & {"RepositoryNotFoundError", "RevisionNotFoundError"}) or (
        "not a valid model identifier" in first_line or "is not a valid git identifier" in first_line
    )


def stored_folder(source: str, revision: str | None) -> Path | None:
    """The folder on this machine that holds `source`'s files: the folder itself, or a Hub id's snapshot in the
    cache (None: not cached yet)."""
    folder = Path(source)
    if folder.is_dir():
        return folder
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(source, "config.json", revision=revision)
    except ValueError:  # not a repository name: from_pretrained says so
        return None
    return Path(cached).parent if isinstance(cached, str) else None


def check_stored_config(name: str, source: str, revision: str | None) -> None:
    """Check the config.json that `source` (a folder, or a Hub id whose config is in the cache) holds, before
    transformers builds anything from it (see models.checks); a Hub id not cached yet is checked once loaded."""
    folder = stored_folder(source, revision)
    if folder is not None:
        checks.check_config(checks.read_raw_config(folder, name), name)
