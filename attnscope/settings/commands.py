"""Every command's settings, one frozen dataclass each: its own fields, declared once, and the groups it inherits
(attnscope.settings.groups); its contract (attnscope.settings.declare.Settings); the checks across its fields, and
what it asks of a model's shape (`check_shape`, from the config before any weight loads). The analyses
(attnscope.analyses) subclass these classes and add `run`."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape
from attnscope.models.removal import check_destination
from attnscope.scores.catalog import counted
from attnscope.settings.declare import (
    FILE,
    HEAD_SCORE,
    NONE,
    OWN,
    REVISIONS,
    SCORE,
    SEVERAL,
    Settings,
    check_layer,
    check_measured,
    setting,
)  # fmt: skip
from attnscope.settings.groups import (
    Batching,
    DeviceMap,
    Kernel,
    Loading,
    Place,
    Reading,
    Removal,
    Revision,
    Scoring,
    top_setting,
)  # fmt: skip

__all__ = [
    "Ablate",
    "Attend",
    "Bench",
    "Circuit",
    "Compare",
    "Diversity",
    "Heads",
    "Info",
    "Patch",
    "RandomMha",
    "Report",
    "Show",
    "parse_occurrence",
]


@dataclass(frozen=True, kw_only=True)
class Heads(Scoring, Loading, Settings):
    """`attnscope heads`: every head's scores and role."""

    torchrun: ClassVar[bool] = True  # each process scores its share of the windows; the sums are added
    sort: str | None = setting(
        SCORE.or_none(),
        None,
        "Sort the table by this score, descending (a score name or a column header).",
        metavar="SCORE",
    )
    top: int | None = top_setting("the heads table")
    layer: int | None = setting(
        options.LAYER.or_none(), None, "Show only the heads of this layer.", flags=("--layer", "-l"), metavar="L"
    )
    plot: Sequence[str] = setting(
        options.HEADS,
        (),
        "Also draw head L.H's attention map (repeatable; needs --out).",
        flags=("--plot", "-p"),
        metavar="L.H",
        many=True,
        python_help="heads 'L.H' whose attention maps `save` draws",
    )
    words: bool = setting(options.FLAG, False, "Draw the maps of --plot word by word (needs --plot).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.words and not self.plot:
            raise AttnscopeError("words (--words) draws the maps of plot (--plot L.H) word by word: give plot too")

    def check_shape(self, shape: Shape) -> None:
        if self.layer is not None:
            check_layer(self.layer, shape.n_layer)
        for label in self.plot:
            options.head_in(label, shape.n_layer, shape.n_head)
        check_measured(self.sort, shape.kind_name, self.probe, "sort by")


WORDS_HELP = (
    "Words instead of tokens: attention to a word is the sum over its tokens' keys, from a word the mean of its "
    "tokens' rows."
)
INDEX_HELP = "Which input text (0-based)."


@dataclass(frozen=True, kw_only=True)
class Show(Reading, Loading, Settings):
    """`attnscope show`: one layer's attention maps, or one head's."""

    default_out: ClassVar[str | None] = "."
    torchrun: ClassVar[bool] = True  # one window, the same in every process

    layer: int | None = setting(
        options.LAYER.or_none(),
        None,
        "Layer to draw (0-based); with --head, that head's layer.",
        flags=("--layer", "-l"),
        metavar="L",
    )
    head: str | None = setting(
        options.HEAD.or_none(), None, "Draw only this head, larger: L.H (e.g. 5.1).", metavar="L.H"
    )
    index: int = setting(options.INDEX, 0, INDEX_HELP, metavar="I")
    words: bool = setting(options.FLAG, False, WORDS_HELP)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head is None and self.layer is None:
            raise AttnscopeError("layer or head (--layer L, --head L.H): say what to draw")
        if self.head is not None:
            layer = options.head_of(self.head)[0]
            if self.layer is not None and self.layer != layer:
                raise AttnscopeError(f"head {self.head} is in layer {layer}, not layer {self.layer}: give one")
            object.__setattr__(self, "layer", layer)

    def check_shape(self, shape: Shape) -> None:
        check_layer(self.layer, shape.n_layer)
        if self.head is not None:
            options.head_in(self.head, shape.n_layer, shape.n_head)


@dataclass(frozen=True, kw_only=True)
class Diversity(Reading, Batching, Loading, Settings):
    """`attnscope diversity`: cosine and Jensen–Shannon between every pair of heads of a layer, or of all."""

    torchrun: ClassVar[bool] = True  # each process sums its share of the windows; the sums are added
    layer: int | str | None = setting(
        options.LAYER_OR_ALL,
        help="Layer number (0-based) or 'all'.",
        flags=("--layer", "-l"),
        metavar="L|all",
        python_help="a layer (0-based), or 'all' (or None): every head of the model",
    )
    redundant: float = setting(options.JS_BITS, 0.1, "JSD below which two heads are near-duplicates.", metavar="BITS")
    cluster_at: float = setting(options.JS_BITS, 0.3, "JSD below which average-linkage clusters merge.", metavar="BITS")
    top: int | None = top_setting("the most redundant and the most distinct pairs (5 each on the terminal)")
    sample_rows: int = setting(
        options.SAMPLE_ROWS,
        0,
        "Estimate JS on N random scored rows per window, with standard errors (0: every row, exact).",
        metavar="N",
    )
    seed: int = setting(options.SEED, 0, "Seed of the rows --sample-rows draws.", metavar="SEED")

    def check_shape(self, shape: Shape) -> None:
        if self.layer is not None:
            check_layer(self.layer, shape.n_layer)


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
    trials: int = setting(options.TRIALS, 4, "Random layers averaged per head count.", metavar="N")
    seed: int = setting(options.SEED, 0, "Seed of the random weights and inputs.", metavar="SEED")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "head_counts", tuple(sorted(self.head_counts)))  # ascending, like the plot's axis


@dataclass(frozen=True, kw_only=True)
class Attend(Reading, Loading, Settings):
    """`attnscope attend`: where one word looks, in every layer and head."""

    torchrun: ClassVar[bool] = True  # one window, the same in every process
    from_token: str = setting(
        options.TEXT,
        help="The word that looks: its text without the leading space; WORD@K its K-th occurrence (0-based).",
        flags=("--from",),
        metavar="WORD[@K]",
    )
    to_token: str | None = setting(
        options.TEXT.or_none(),
        None,
        "The word looked at (the sum over its tokens); WORD@K its K-th occurrence; omitted: each head's top keys.",
        flags=("--to",),
        metavar="WORD[@K]",
    )
    from_index: int | None = setting(
        options.INDEX.or_none(), None, "Which occurrence of --from (0-based), as WORD@K.", metavar="K"
    )
    to_index: int | None = setting(
        options.INDEX.or_none(),
        None,
        "Which occurrence of --to (0-based), as WORD@K; default: all the query sees, summed.",
        metavar="K",
    )
    tokens: int = setting(options.TOKENS, 3, "Top keys listed per head (tokens, or words).", metavar="K")
    top: int | None = top_setting("the strongest heads (10 on the terminal)")
    index: int = setting(options.INDEX, 0, INDEX_HELP, metavar="I")
    words: bool = setting(options.FLAG, False, WORDS_HELP)
    skip_first: bool = setting(
        options.FLAG,
        False,
        "Leave the first token (the attention sink: BOS, [CLS], or a window's first token) out "
        "of the ranking of keys and heads.",
        negatable=False,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for role in ("from", "to"):
            spec, given = getattr(self, f"{role}_token"), getattr(self, f"{role}_index")
            if spec is None:
                continue
            word, occurrence = parse_occurrence(spec)
            if occurrence is not None and given is not None and occurrence != given:
                raise AttnscopeError(
                    f"{role} word {options.shown(spec)} names occurrence {occurrence}, and {role} occurrence is "
                    f"{given}: give one"
                )
            if not word.strip():
                raise AttnscopeError(f"{role} word {options.shown(spec)}: give a word of the text")
            object.__setattr__(self, f"{role}_token", word)
            object.__setattr__(self, f"{role}_index", occurrence if occurrence is not None else given)
        if self.from_index is None:
            object.__setattr__(self, "from_index", 0)
        options.INDEX.check(self.from_index, "from occurrence")  # the K of WORD@K, checked as --from-index is
        options.INDEX.or_none().check(self.to_index, "to occurrence")
        if self.to_index is not None and self.to_token is None:
            raise AttnscopeError(
                f"to occurrence {self.to_index} picks one occurrence of the to word: give the to word too (--to)"
            )


def parse_occurrence(spec: str) -> tuple[str, int | None]:
    """`WORD@K` -> (WORD, K), the K-th occurrence (0-based); a spec that does not end in `@` and digits is a word as
    it is (`@property`, `a@b`), with no occurrence (None). `user@2@0` is the word `user@2`, occurrence 0."""
    match = re.fullmatch(r"(.+)@(\d+)", spec, re.DOTALL)
    return (match.group(1), int(match.group(2))) if match else (spec, None)


@dataclass(frozen=True, kw_only=True)
class Ablate(Reading, Batching, Removal, Place, Revision, DeviceMap, Settings):
    """`attnscope ablate`: the language-model loss with each head removed; with `remove`, of the model without
    those heads, which `save` writes."""

    method: str = setting(
        options.ABLATION_METHOD, "loss", "loss: remove each head and measure the loss; gradient: |dL/d gate| (fast)."
    )
    prune: int = setting(options.PRUNE, 0, "Also remove the K least important heads one after another.", metavar="K")
    top: int | None = top_setting("the most important heads (10 on the terminal)")
    remove: Sequence[str] = setting(
        options.HEAD_SET,
        (),
        "Remove these heads first (as --ablation says; not resample): the analysis is of the model without them.",
        metavar="L.H,...",
        many=True,
        python_help="heads 'L.H' removed first (a list, or '0.2,1.0'): the analysis is of the model without them",
    )
    save: str | os.PathLike | None = setting(
        options.MODEL_FOLDER.or_none(),
        None,
        "Write the model without the heads of --remove to this new folder (save_pretrained: weights, config, "
        "tokenizer; zero or mean ablation).",
        metavar="DIR",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.remove and self.ablation == "resample":
            raise AttnscopeError(
                "remove (--remove) takes heads out of the model for good, and resample ablation has no fixed value to "
                "put in their place: use ablation mean or zero"
            )
        if self.save is not None:
            if not self.remove:
                raise AttnscopeError("save (--save DIR) writes the model without the heads of remove: give remove too")
            check_destination(self.save)

    @property
    def needs_lm_head(self) -> bool:
        return True

    def check_shape(self, shape: Shape) -> None:
        for label in self.remove:
            options.head_in(label, shape.n_layer, shape.n_head)
        left = shape.n_layer * shape.n_head - len(self.remove)
        if self.prune > left:
            if self.remove:
                raise AttnscopeError(f"prune {self.prune}: {counted(left, 'head')} left once remove's are removed")
            raise AttnscopeError(f"prune {self.prune}: this model has {left} heads")


@dataclass(frozen=True, kw_only=True)
class Circuit(Scoring, Removal, Loading, Settings):
    """`attnscope circuit`: which earlier heads each head depends on."""

    head: Sequence[str] | None = setting(
        options.HEADS,
        None,
        "Explain this head, L.H (repeatable); default: every head of layer 1 and above.",
        metavar="L.H",
        many=True,
        python_help="the heads explained, 'L.H' labels (None: every head of layer 1 and above)",
    )
    score: str | None = setting(
        HEAD_SCORE.or_none(),
        None,
        "Explain this score of every head; default: each head's deciding score (the one that gave it its role).",
        metavar="SCORE",
    )
    top: int | None = top_setting("each explained head's dependencies, the largest |change| (10 on the terminal)")
    method: str = setting(
        options.CIRCUIT_METHOD,
        "removal",
        "removal: remove each earlier head and score again (exact); gradient: "
        "attribution patching, the first-order estimate of every removal from one backward pass per explained head "
        "(for large models).",
    )
    steps: int = setting(
        options.STEPS,
        0,
        "With --method gradient: 0, the gradient with every head kept (attribution patching); N, "
        "integrated gradients over N points (N times the cost; closer to exact removal, see the circuit page).",
        metavar="N",
    )
    weights: bool = setting(
        options.FLAG,
        True,
        "Also the composition and copying scores from the weights and each head's direct effect "
        "on the logits (loads the language-model head).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps and self.method != "gradient":
            raise AttnscopeError("steps (--steps) are the gradient's integration points: give method gradient too")

    @property
    def needs_lm_head(self) -> bool:
        return self.weights  # the unembedding of the copying scores, the logits of the direct effects

    def check_shape(self, shape: Shape) -> None:
        if shape.n_layer < 2:
            raise AttnscopeError("this model has one layer: no head has an earlier head to depend on")
        for label in self.head:
            layer, _ = options.head_in(label, shape.n_layer, shape.n_head)
            if layer == 0:
                raise AttnscopeError(f"head {label}: it is in layer 0, and no head comes before it to depend on")
        check_measured(self.score, shape.kind_name, self.probe)


PAIR_FIELDS = ("clean", "corrupt", "answer", "wrong")  # a pair's fields, as --file's JSON lines name them too


@dataclass(frozen=True, kw_only=True)
class Patch(Reading, Batching, Place, Revision, DeviceMap, Settings):
    """`attnscope patch`: activation patching per head, for clean and corrupted prompts (no TEXT: the pairs come
    from --clean/--corrupt/--answer/--wrong or from --file)."""

    reads_texts: ClassVar[bool] = False

    clean: str | None = setting(
        options.TEXT.or_none(), None, "The clean prompt: the model should continue it with --answer.", metavar="TEXT"
    )
    corrupt: str | None = setting(
        options.TEXT.or_none(),
        None,
        "The corrupted prompt: the clean one with a few tokens changed, as many tokens long.",
        metavar="TEXT",
    )
    answer: str | None = setting(
        options.TEXT.or_none(),
        None,
        "The token the clean prompt predicts, as the next word: Mary means ' Mary' (punctuation as written).",
        metavar="TOKEN",
    )
    wrong: str | None = setting(
        options.TEXT.or_none(), None, "The token it is measured against (written as --answer is).", metavar="TOKEN"
    )
    top: int | None = top_setting("the heads that restore the most (10 on the terminal)")
    file: str | os.PathLike | None = setting(  # Reading's --file, here a file of pairs
        FILE,
        None,
        "Several pairs: a JSON-lines file, one object per line with clean, corrupt, answer and wrong (combined "
        "as a ratio of sums); '-' reads standard input.",
        flags=("--file", "-f"),
        metavar="PATH",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        given = [name for name in PAIR_FIELDS if getattr(self, name) is not None]
        missing = [name for name in PAIR_FIELDS if name not in given]

        def named(names: list[str]) -> str:  # `clean, answer and file (--clean, --answer, --file)`
            listed = ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]
            return f"{listed} ({', '.join(f'--{name}' for name in names)})"

        if given and self.file is not None:
            raise AttnscopeError(
                f"{named([*given, 'file'])}: give one pair with --clean, --corrupt, --answer and --wrong, or pairs "
                "in a file, not both"
            )
        if self.file is None and not given:
            raise AttnscopeError(f"no pair to patch: give one with {named(missing)}, or pairs in a file (--file)")
        if self.file is None and missing:
            raise AttnscopeError(
                f"{named(missing)}: a pair needs clean, corrupt, answer and wrong (or give pairs in a file with --file)"
            )

    @property
    def needs_lm_head(self) -> bool:
        return True  # the logits of the answer and the wrong token

    def check_shape(self, shape: Shape) -> None:
        if shape.kind_name is not None and shape.kind_name != "decoder":
            raise AttnscopeError(
                "patch reads the logits of the token that follows each prompt: it needs a decoder (a causal language "
                f"model); this model is an {shape.kind_name}"
            )


REVISIONS_HELP = (
    "Several revisions of --model (one Hub repository), in order, each a model labelled by its revision (e.g. "
    "Pythia's checkpoints: step0,step512,step1000)."
)


@dataclass(frozen=True, kw_only=True)
class Report(Scoring, Loading, Settings):
    """`attnscope report`: one self-contained HTML page of every head, of one model or several."""

    models: ClassVar[str] = SEVERAL
    draws: ClassVar[bool] = False
    default_out: ClassVar[str | None] = "attnscope-report"

    revisions: Sequence[str] | str | None = setting(REVISIONS, None, REVISIONS_HELP, metavar="REV,REV,...")
    diversity: bool = setting(options.FLAG, True, "Include the diversity of all heads (one more pass).")
    ablate: bool = setting(
        options.FLAG,
        False,
        "Also remove each head in turn and measure the loss (as `ablate`; one pass per head).",
        negatable=False,
    )
    circuit: bool = setting(
        options.FLAG,
        False,
        "Also which heads each head depends on (as `attnscope circuit`): click a head to see "
        "them, marked in the role map. One model.",
        negatable=False,
    )

    @property
    def needs_lm_head(self) -> bool:
        return self.ablate

    def unshared(self, count: int) -> list[str]:  # its heads and diversity are shared among torchrun's processes
        return [name for name in ("ablate", "circuit") if getattr(self, name)]

    def check_models(self, count: int) -> None:
        if count > 1 and self.circuit:
            raise AttnscopeError(
                "circuit (--circuit) explains one model's heads: give one model (a page of several would need a "
                "circuit pass per model, and its arrows would belong to one of them)"
            )


@dataclass(frozen=True, kw_only=True)
class Compare(Scoring, Place, DeviceMap, Kernel, Settings):
    """`attnscope compare`: the heads of several models side by side (one revision for every model would set a
    model beside itself: compare takes --revisions, not --revision)."""

    models: ClassVar[str] = SEVERAL

    revisions: Sequence[str] | str | None = setting(REVISIONS, None, REVISIONS_HELP, metavar="REV,REV,...")
    divergence: bool | None = setting(
        options.FLAG.or_none(),
        None,
        "Measure how much each head's attention moved: the mean JS divergence (bits) "
        "between the two models' rows on the same tokens (default: on for two models; needs exactly two).",
    )
    loss: bool = setting(
        options.FLAG,
        True,
        "Also each model's language-model loss on the texts (nats per predicted token, as `ablate` measures it; "
        "loads each model's language-model head, where it has one).",
    )
    score: str | None = setting(
        HEAD_SCORE.or_none(),
        None,
        "The score drawn as heads × models (default: induction when the probe ran, else previous_token).",
        metavar="SCORE",
    )
    top: int | None = top_setting(
        "the heads ranked by divergence and the heads whose role changes, the most changed first (20 each on the "
        "terminal)"
    )

    def check_models(self, count: int) -> None:
        if count < 2:
            raise AttnscopeError(
                f"compare needs at least two models, {count} given: --model A --model B, or one --model with "
                "--revisions R1,R2"
            )
        if self.divergence and count != 2:
            raise AttnscopeError(f"divergence (--divergence) sets the maps of two models side by side; {count} given")

    def check_shape(self, shape: Shape) -> None:
        check_measured(self.score, shape.kind_name, self.probe)

    def unshared(self, count: int) -> list[str]:
        """Each model's heads are shared among torchrun's processes; its divergence and loss are not yet."""
        divergence = self.divergence if self.divergence is not None else count == 2
        return [name for name, on in (("divergence", divergence), ("loss", self.loss)) if on]


@dataclass(frozen=True, kw_only=True)
class Bench(Place, Revision, Kernel, Settings):
    """`attnscope bench`: how fast the analysis runs, against a plain forward and the notebook ways."""

    models: ClassVar[str] = OWN
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
        "Which methods to time (fused, blocks: the analysis with that kernel, whatever --kernel says).",
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
