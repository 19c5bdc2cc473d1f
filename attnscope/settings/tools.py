"""The settings of the commands around the analyses: `random-mha` (a random attention layer), `bench`, `info`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from attnscope import options
from attnscope.settings.declare import NONE, OWN, Settings, setting
from attnscope.settings.groups import Kernel, Place, Revision

__all__ = ["Bench", "Info", "RandomMha"]


@dataclass(frozen=True, kw_only=True)
class RandomMha(Settings):
    """`attnscope random-mha`: how different the heads of a random attention layer are, by their number."""

    models: ClassVar[str] = NONE
    reads_texts: ClassVar[bool] = False

    d_model: int = setting(options.D_MODEL, 64, "Model width.", metavar="D")
    head_counts: Sequence[int] = setting(
        options.HEAD_COUNTS,
        (1, 2, 4, 8),
        f"Numbers of heads (1-{options.D_MODEL_MAX:,}), each dividing --d-model.",
        metavar="H,H,...",
    )
    seq_len: int = setting(options.SEQ_LEN, 32, "Tokens per random sequence.", metavar="N")
    trials: int = setting(options.MHA_TRIALS, 4, "Random layers averaged per head count.", metavar="N")
    seed: int = setting(options.SEED, 0, "Seed of the random weights and inputs.", metavar="SEED")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "head_counts", tuple(sorted(self.head_counts)))  # ascending, like the plot's axis


@dataclass(frozen=True, kw_only=True)
class Bench(Place, Revision, Kernel, Settings):
    """`attnscope bench`: how fast the analysis runs, against a plain forward and the notebook ways."""

    models: ClassVar[str] = OWN
    takes_loaded: ClassVar[bool] = False  # it loads (or builds) the model itself
    reads_texts: ClassVar[bool] = False

    random_weights: bool = setting(
        options.FLAG, False, "The model's architecture with random weights (no download).", negatable=False
    )
    seq_lens: Sequence[int] = setting(
        options.BENCH_SEQ_LENS,
        (128, 512, 1024),
        f"Sequence lengths (2-{options.LENGTH_MAX:,}, at most the model's context).",
        metavar="N,N,...",
    )
    batch_sizes: Sequence[int] = setting(
        options.BENCH_BATCHES,
        (1, 8),
        f"Batch sizes (1-{options.BATCH_MAX:,}; a shape that would not fit in memory is refused before it runs).",
        metavar="B,B,...",
    )
    repeats: int = setting(
        options.REPEATS,
        3,
        "Rounds, each running every method once timed and once for memory (medians reported).",
        metavar="N",
    )
    warmup: int = setting(options.WARMUP, 1, "Untimed rounds of every method first.", metavar="N")
    methods: Sequence[str] = setting(
        options.BENCH_METHOD_NAMES,
        options.BENCH_METHODS,
        "Which methods to time (fused, blocks: the analysis with that kernel, whatever --kernel says; kvplan: kvplan's "
        "score with its default sink and recent window).",
        metavar=",".join(options.ALL_BENCH_METHODS),
    )
    micro: bool = setting(
        options.FLAG,
        False,
        "Also the tutorials' micro-benchmark: attention from scratch (numpy, torch) against SDPA at their d_model "
        "512, whatever the model. Off by default: minutes on a CPU, longer than a small model's bench.",
    )
    sample_rows: int = setting(
        options.BENCH_SAMPLE_ROWS,
        32,
        "Rows per window on which the diversity-sampled method estimates JS.",
        metavar="N",
    )


@dataclass(frozen=True, kw_only=True)
class Info(Place, Revision, Settings):
    """`attnscope info`: the model's shape, from its config alone."""

    models: ClassVar[str] = OWN
    torchrun: ClassVar[bool] = True  # a config read, the same in every process
    reads_texts: ClassVar[bool] = False
    draws: ClassVar[bool] = False
