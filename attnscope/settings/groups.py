"""The settings several commands share, each declared once: what texts are read and how (`Reading`), how a model
given by name is loaded (`Place`, `Revision`, `DeviceMap`, `Kernel`: a command inherits those it takes), how texts
are batched (`Batching`), what decides every head's scores and role (`Scoring`), how a head is removed
(`Removal`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.scores import catalog
from attnscope.settings.declare import FILE, THRESHOLDS, TOP_HELP, Declared, optional_setting, setting

__all__ = [
    "SCORING",
    "Batching",
    "DeviceMap",
    "Kernel",
    "Loading",
    "Place",
    "Reading",
    "Removal",
    "Revision",
    "Scoring",
    "top_setting",
]


@dataclass(frozen=True, kw_only=True)
class Reading(Declared):
    file: str | os.PathLike | None = setting(
        FILE,
        None,
        "Texts separated by blank lines, or .jsonl with a 'text' field; '-' reads standard input.",
        flags=("--file", "-f"),
        metavar="PATH",
    )
    bos: bool | None = setting(
        options.BOS,
        None,
        "Prepend the BOS token, or wrap in [CLS] … [SEP] for an encoder (default: on when the model has them).",
        flags=("--bos/--no-bos",),
    )


@dataclass(frozen=True, kw_only=True)
class Place(Declared):
    device: str = setting(
        options.DEVICE,
        "auto",
        "Where the model runs: auto (CUDA when available), cpu, cuda or cuda:N.",
        metavar="auto|cpu|cuda|cuda:N",
    )
    dtype: str = setting(options.DTYPE, "auto", "The weights' dtype; auto: the checkpoint's own (float32 for GPT-2).")


@dataclass(frozen=True, kw_only=True)
class Revision(Declared):
    revision: str | None = optional_setting(
        options.TEXT,
        "A Hub branch, tag or commit of the model (e.g. Pythia's training checkpoints: step1000).",
        metavar="REV",
    )


@dataclass(frozen=True, kw_only=True)
class DeviceMap(Declared):
    device_map: str | None = setting(
        options.DEVICE_MAP,
        None,
        "Spread a model too large for one device over all of them (needs: pip install 'attnscope[big]').",
    )


@dataclass(frozen=True, kw_only=True)
class Kernel(Declared):
    kernel: str = setting(
        options.KERNEL,
        "auto",
        "What computes attention and its statistics: fused (one Triton kernel on a GPU; needs pip install "
        "'attnscope[gpu]'; on the CPU Triton's interpreter, very slow, for testing), blocks (PyTorch, blocks of "
        "query rows), auto (fused on CUDA when Triton imports, else blocks). Maps, diversity and the probe always "
        "use blocks.",
    )


@dataclass(frozen=True, kw_only=True)
class Loading(Place, Revision, DeviceMap, Kernel):
    """How a model given by name is loaded: every loading setting."""


@dataclass(frozen=True, kw_only=True)
class Batching(Declared):
    batch_size: int = setting(options.BATCH_SIZE, 8, "Windows per forward pass (padded, length-bucketed).", metavar="N")
    max_tokens: int | None = setting(
        options.MAX_TOKENS.or_none(),
        16384,
        "Padded tokens per batch at most (a long window still runs alone).",
        metavar="N",
        python_help="padded tokens per batch at most; a long window still runs alone (None: no cap)",
    )


@dataclass(frozen=True, kw_only=True)
class Scoring(Reading, Batching):
    """What decides every head's scores and role: the settings of `heads` that the commands scoring heads again
    (`circuit`'s replays, `compare`'s models, `report`) share."""

    window: int = setting(
        options.WINDOW,
        catalog.DEFAULT_WINDOW,
        "Local window: the current token and the W before it.",
        flags=("--window", "-w"),
        metavar="W",
    )
    thresholds: Mapping[str, float] | Sequence[str] | None = setting(
        THRESHOLDS,
        None,
        "Move a role's threshold, e.g. previous-token=0.6 (repeatable). Roles: "
        f"{', '.join(catalog.DEFAULT_THRESHOLDS)}.",
        flags=("--threshold", "-t"),
        metavar="ROLE=VALUE",
        many=True,
        python_help='roles\' thresholds moved: {"previous-token": 0.6} or ["previous-token=0.6"]',
    )
    probe: bool = setting(
        options.FLAG,
        True,
        "Run the probes (decoders): repeated random tokens (induction, duplicate-token) and a needle in a haystack "
        "(retrieval).",
    )
    probe_len: int | None = optional_setting(
        options.PROBE_LEN,
        "Period T of the repeated-token probe: T random tokens, then again (default: 50, or what the context holds).",
        metavar="T",
    )
    haystack_len: int | None = optional_setting(
        options.HAYSTACK_LEN,
        "Tokens of text in the needle probe's haystack, the needle and its copy not counted (default: 90, or what "
        "the context holds).",
        metavar="N",
    )
    probe_seed: int = setting(
        options.SEED, 0, "Seed of the probes' random tokens (the repeated sequences, the needles).", metavar="SEED"
    )


@dataclass(frozen=True, kw_only=True)
class Removal(Declared):
    """How `ablate` and `circuit` remove a head (`pipeline.ablation`): what its output is replaced by."""

    ablation: str = setting(
        options.ABLATION,
        "mean",
        "What a removed head's output becomes: mean, its mean over every position of the texts (Wang et al. 2022); "
        "zero; resample, its output at the same position of another window, drawn with --resample-seed (Chan et "
        "al. 2022).",
    )
    resample_seed: int = setting(
        options.SEED, 0, "Seed of the windows --ablation resample takes each head's output from.", metavar="SEED"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.resample_seed and self.ablation != "resample":
            raise AttnscopeError(
                "resample_seed (--resample-seed) seeds the donors of resample ablation: give ablation resample too"
            )


SCORING = tuple(declaration.name for declaration in Scoring.declarations())


def top_setting(what: str) -> Any:
    """--top: the first K rows of each ranked list (one meaning everywhere); `what` names the command's lists."""
    return optional_setting(options.TOP, f"{TOP_HELP} Here: {what}.", metavar="K")
