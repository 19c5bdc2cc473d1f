"""Every option's domain, written once: what a value may be (its type, its range or its choices, whether None is
allowed), checked on a Python value (`check`: `window 0: must be a whole number from 1 to 100,000`) and read from
command-line text (`parse`), in the same words. The settings (attnscope.settings) declare each option with its
domain, default and help; the checks and the parsers come from here.

The kinds of domain (`Option`, counts, numbers, choices, lists) and their wording are in attnscope.domains, and
re-exported here. A value is named as the caller spells it: `window 0: ...` from Python, `--window 0: ...` from the
command line.
Pure Python, at the base of the package: the CLI declares its options without importing anything heavy.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnscope.domains import (  # noqa: F401  (re-exported: the kinds of domain and their wording live there)
    DEVICE_PATTERN,
    Device,
    Names,
    Numbers,
    Option,
    _shown,
    _type_name,
    choice,
    count,
    list_problem,
    number,
    shown,
    shown_text,
)
from attnscope.errors import AttnscopeError

# Choices shared by the command line, the Python API and the code that acts on them.
DTYPES = ("auto", "float32", "float16", "bfloat16")
KERNELS = ("auto", "fused", "blocks")
DEVICE_MAPS = ("auto", "balanced", "sequential")
PICTURE_FORMATS = ("png", "svg", "pdf")
ABLATION_METHODS = ("loss", "gradient")
# what a removed head's output becomes (ablate, circuit): 0, its mean over the texts' positions, or another text's
ABLATIONS = ("zero", "mean", "resample")
CIRCUIT_METHODS = ("removal", "gradient")  # exact removal of each earlier head, or its first-order estimate
# discover: integrated gradients on the inputs, attribution patching, or each edge patched alone
DISCOVER_METHODS = ("eap-ig", "eap", "exact")
# what an edge outside a circuit carries (discover): the corrupted run's value, or its mean over the pairs
EDGE_ABLATIONS = ("corrupt", "mean")
BENCH_METHODS = ("floor", "attnscope", "tutorial", "cache")  # bench's default set
BENCH_KERNEL_METHODS = ("fused", "blocks")  # the analysis with one kernel or the other
BENCH_DIVERSITY_METHODS = ("diversity", "diversity-sampled")
BENCH_CIRCUIT_METHODS = ("circuit", "circuit-naive")  # every earlier head removed: replayed, or one forward each
BENCH_KVPLAN_METHODS = ("kvplan",)  # kvplan's score: each row's attention outside the sink and the recent window
ALL_BENCH_METHODS = (
    BENCH_METHODS + BENCH_KERNEL_METHODS + BENCH_DIVERSITY_METHODS + BENCH_CIRCUIT_METHODS + BENCH_KVPLAN_METHODS
)

# Bounds of the counts. Each is far beyond any useful value, and small enough that nothing sized by it overflows or
# runs for days: a count no option could mean is refused at once rather than run until killed.
SEED_MAX = 2**32 - 1
LENGTH_MAX = 100_000  # tokens: beyond every model's context
BATCH_MAX = 65_536  # texts in one bench batch: far beyond any memory at any useful length
D_MODEL_MAX = 4096  # random-mha's width, and so its most heads
LAYER_MAX = 9_999  # layers and heads of a model (the largest today have under 200 layers and 128 heads)
INDEX_MAX = 2**31 - 1  # a text, or an occurrence of a word, counted from 0
ROWS_MAX = 1_000_000  # rows shown (--top), keys listed (--tokens), heads pruned
SAMPLE_ROWS_MAX = 2**31 - 1
TRIALS_MAX = 10_000  # random layers per head count in random-mha
REPEATS_MAX = 1_000  # bench's timed rounds
WARMUP_MAX = 100  # bench's untimed rounds
CONTEXT_MAX = 10**9  # tokens a KV cache is sized for (kvplan --context): arithmetic only, nothing allocated
DPI_RANGE = (50, 1200)
DEFAULT_DPI = 150  # dots per inch of a PNG picture: the figures' inches × 150


HEAD_FORMS = (re.compile(r"(\d{1,9})\.(\d{1,9})"), re.compile(r"[Ll](\d{1,9})[Hh](\d{1,9})"))
HEAD_DOMAIN = "LAYER.HEAD such as 4.11 (or L4H11, as TransformerLens writes it; 0-based)"


def head_of(label: str) -> tuple[int, int]:
    """(layer, head) of a head's label: `4.11` as the literature writes it, or `L4H11` as TransformerLens does; its
    range is the model's (`head_in`)."""
    for form in HEAD_FORMS:
        found = form.fullmatch(label.strip()) if isinstance(label, str) else None
        if found is not None:
            return int(found.group(1)), int(found.group(2))
    raise AttnscopeError(f"head {_shown(label)}: expected {HEAD_DOMAIN}")


def head_in(label: str, n_layer: int, n_head: int) -> tuple[int, int]:
    """(layer, head) of `label`, checked against a model of `n_layer` layers of `n_head` heads."""
    layer, head = head_of(label)
    if layer >= n_layer:
        raise AttnscopeError(
            f"head {_shown(label)}: layer {layer} is out of range (this model has layers 0-{n_layer - 1})"
        )
    if head >= n_head:
        raise AttnscopeError(f"head {_shown(label)}: head {head} is out of range (this model has heads 0-{n_head - 1})")
    return layer, head


def head_label(layer: int, head: int) -> str:
    """How attnscope names a head everywhere: `L.H`, 0-based."""
    return f"{layer}.{head}"


@dataclass(frozen=True)
class Head(Option):
    """One head, `L.H` or `LlHh` (see `head_of`), stored as `L.H`."""

    kind: str = "head"
    low: float | None = 0  # its layer's and its head's numbers
    high: float | None = LAYER_MAX
    also: str = "layer and head each; and the model's layers and heads"

    def domain(self) -> str:
        return HEAD_DOMAIN

    def problem(self, value: Any) -> str | None:
        try:
            head_of(value)
        except AttnscopeError:
            return f"expected {HEAD_DOMAIN}"
        return None

    def normal(self, value: Any) -> str:
        return head_label(*head_of(value))


@dataclass(frozen=True)
class HeadList(Head):
    """Heads (`L.H` each), in Python a list or one label, on the command line the option repeated (`parse` reads
    one); a tuple of `L.H` labels once checked, each once in the order given (None and [] alike: none)."""

    kind: str = "heads"

    def check(self, value: Any, name: str) -> tuple[str, ...]:
        items = () if value is None else (value,) if isinstance(value, str) else value
        if isinstance(items, (bytes, Mapping)) or not isinstance(items, Iterable):
            raise AttnscopeError(f"{name} {_shown(value)}: expected heads such as ['4.11', '5.1'] (LAYER.HEAD)")
        checked = [Head().check(item, name) for item in items]
        return tuple(dict.fromkeys(checked))

    def parse(self, text: str) -> str:
        return Head().parse(text)


@dataclass(frozen=True)
class HeadSet(HeadList):
    """Heads as `HeadList` takes them, and also comma-separated (`--remove 0.2,1.0` or repeated on the command line,
    as `--methods` and `--seq-lens` list their values; `"0.2,1.0"` or a list in Python): `parse` reads a tuple."""

    def check(self, value: Any, name: str) -> tuple[str, ...]:
        items = () if value is None else (value,) if isinstance(value, str) else value
        if isinstance(items, Iterable) and not isinstance(items, (bytes, Mapping)):
            items = [part for item in items for part in _parts(item)]
        return super().check(items, name)

    def parse(self, text: str) -> tuple[str, ...]:
        if isinstance(text, tuple):
            return text
        parts = [part for part in text.split(",") if part.strip()]
        if not parts:
            return self._refuse(text, f"expected {HEAD_DOMAIN}, comma-separated")
        return tuple(Head().parse(part.strip()) for part in parts)


def _parts(item: Any) -> tuple[Any, ...]:
    """The heads of one item of a `HeadSet`: a tuple as it is, a string cut at its commas, anything else alone."""
    if isinstance(item, tuple):
        return item
    if isinstance(item, str) and "," in item:
        return tuple(part.strip() for part in item.split(",") if part.strip())
    return (item,)


@dataclass(frozen=True)
class OrWord(Option):
    """A number, or one word `word` (any case), stored as `stored`: the shape that `LayerOrAll` and `ShareOrAuto`
    share. Subclasses say what a number may be (`number_problem`) and its one form (`number_normal`)."""

    word: str = ""
    stored: Any = None

    def is_word(self, value: Any) -> bool:
        return isinstance(value, str) and value.strip().lower() == self.word

    def problem(self, value: Any) -> str | None:
        return None if self.is_word(value) else self.number_problem(value)

    def normal(self, value: Any) -> Any:
        return self.stored if self.is_word(value) else self.number_normal(value)

    def number_problem(self, value: Any) -> str | None:
        raise NotImplementedError

    def number_normal(self, value: Any) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class LayerOrAll(OrWord):
    """A layer (0-based) or every layer: "all" (and None, in Python), stored as None."""

    kind: str = "layer-or-all"
    word: str = "all"

    def domain(self) -> str:
        return "a layer number (0-based) or 'all'"

    def number_problem(self, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 9:
            value = int(value)
        if isinstance(value, str) or LAYER.problem(value) is not None:
            return f"expected {self.domain()}"
        return None

    def number_normal(self, value: Any) -> int | None:
        return None if value is None else int(value)

    def parse(self, text: str) -> int | str:
        """The command line's layer, or "all" as typed (a required option must not read as missing: None)."""
        layer = super().parse(text)
        return "all" if layer is None else layer


@dataclass(frozen=True)
class ShareOrAuto(OrWord):
    """A share from 0 to 1, or "auto" (any case; stored as "auto"): kvplan's --streaming, which --check can choose."""

    kind: str = "share-or-auto"
    word: str = "auto"
    stored: Any = "auto"

    def domain(self) -> str:
        return "a number from 0 to 1, or 'auto'"

    def number_problem(self, value: Any) -> str | None:
        """From Python a number is a number ('0.5' is refused, as sink='16' is)."""
        if isinstance(value, str):
            return f"expected {self.domain()}, not a str"
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not (math.isfinite(value) and 0 <= value <= 1)
        ):
            return f"expected {self.domain()}"
        return None

    def number_normal(self, value: Any) -> float:
        """The share at the six decimals the JSON records (output.documents.DECIMALS): what is applied is what is
        written (0.6999999999999998, or numpy's float32 0.7, of 90 KV heads streamed 62 while the JSON said 0.7,
        whose floor(0.7 × 90) is 63)."""
        return round(float(value), 6)

    def parse(self, text: str) -> float | str:
        if self.is_word(text):
            return self.stored
        try:
            value = float(text)
        except ValueError:
            return self._refuse(text, f"expected {self.domain()}")
        return self._read(text, value)


def _percent_problem(item: Any) -> str | None:
    if isinstance(item, bool) or not isinstance(item, numbers.Real) or not math.isfinite(item):
        return "expected a number"
    if not 0 < item <= 100:
        return "a budget is a percentage of the edges, above 0 and at most 100"
    return None


@dataclass(frozen=True)
class Percents(Option):
    """Shares of a whole in percent, each above 0 and at most 100 (discover's budgets): comma-separated on the command
    line (`0.1,1,10`), a list in Python; a tuple once checked, ascending, each once."""

    kind: str = "percents"
    item: Option = field(default_factory=lambda: number(0, 100))  # each, its 0 excluded (`problem`)

    def domain(self) -> str:
        return "comma-separated percentages, each above 0 and at most 100"

    def problem(self, value: Any) -> str | None:
        return list_problem(value, "percentages such as [0.1, 1, 10, 100]", "percentage", _percent_problem)

    def normal(self, value: Any) -> tuple[float, ...]:
        return tuple(sorted(dict.fromkeys(float(item) for item in value)))

    def parse(self, text: str) -> tuple[float, ...]:
        if isinstance(text, tuple):  # a default, already a value
            return text
        try:
            values = tuple(float(part.strip().rstrip("%")) for part in text.split(",") if part.strip())
        except ValueError:
            return self._refuse(text, f"expected {self.domain()}")
        return self._read(text, values)


@dataclass(frozen=True)
class Folder(Option):
    """A folder to write into: an empty name is refused (it would quietly mean the current folder)."""

    kind: str = "folder"
    example: str = "results/ (or . for this one)"

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
            return f"expected a folder's path, not {_type_name(value)}; give a folder, e.g. {self.example}"
        if not os.fspath(value).strip():
            return f"an empty folder name; give a folder, e.g. {self.example}"
        return None

    def normal(self, value: Any) -> Path:
        return Path(value)


FLAG = Option("flag")
TEXT = Option("text")

# One object per domain; where two settings share a domain, they share the object.
WINDOW = count(1, LENGTH_MAX)
BATCH_SIZE = count(1, LENGTH_MAX)
MAX_TOKENS = count(1, 100 * LENGTH_MAX)
PROBE_LEN = count(3, LENGTH_MAX)  # probe.MIN_PROBE_LEN: a period of 3 tokens is the shortest the probe can score
HAYSTACK_LEN = count(10, LENGTH_MAX)  # needle.MIN_HAYSTACK_LEN: the shortest haystack with three distinct depths
SEED = count(0, SEED_MAX)
TOP = count(1, ROWS_MAX)
# kvplan: the share of key/value heads given a streaming cache, or auto (--check picks)
STREAMING = ShareOrAuto(low=0, high=1, also="a share of the KV heads, or auto")
# kvplan --check: passkey prompts' lengths
CHECK_LENGTHS = Numbers(item=count(16, LENGTH_MAX, also="and the model's context"))
# kvplan: the first tokens a streaming head keeps (none: a window alone)
SINK = count(0, LENGTH_MAX, also="and, with --recent, less than the model's context")
# kvplan: the last tokens a streaming head keeps, the current one among them
RECENT = count(1, LENGTH_MAX, also="and, with --sink, less than the model's context")
CONTEXT = count(1, CONTEXT_MAX)
STEPS = count(0, 1_000)  # circuit --method gradient: integration points (each a forward and a backward pass)
# discover --method eap-ig: integration points (each a forward and a backward pass)
IG_STEPS = count(1, 1_000, also="with --method eap-ig only")
TARGET = number(0.001, 1.0)  # discover: the faithfulness its circuit must reach
BUDGETS = Percents(item=number(0, 100, also="above 0, in percent of the edges; 100 is always run"))
TOKENS = count(1, ROWS_MAX)
PRUNE = count(0, ROWS_MAX, also="and the model's heads")
LAYER = count(0, LAYER_MAX, also="and the model's layers")
INDEX = count(0, INDEX_MAX, also="and the texts given")
OCCURRENCE = count(0, INDEX_MAX, also="and the word's occurrences")  # attend's WORD@K
JS_BITS = number(0.0, 1.0, also="bits")  # a Jensen–Shannon divergence in bits
SAMPLE_ROWS = Option(  # diversity's: a standard error needs two rows
    "count", 0, SAMPLE_ROWS_MAX, excluded=(1,), described=f"0 (every row, exact) or from 2 to {SAMPLE_ROWS_MAX:,}"
)
BENCH_SAMPLE_ROWS = count(2, SAMPLE_ROWS_MAX)
D_MODEL = count(1, D_MODEL_MAX)
HEAD_COUNTS = Numbers(item=count(1, D_MODEL_MAX, also="dividing --d-model"))  # random-mha's numbers of heads
SEQ_LEN = count(2, 4096)  # random-mha's sequences
BENCH_SEQ_LENS = Numbers(item=count(2, LENGTH_MAX, also="and the model's context"))
BENCH_BATCHES = Numbers(item=count(1, BATCH_MAX, also="and the memory available"))
BENCH_METHOD_NAMES = Names(choices=ALL_BENCH_METHODS)
TRIALS = count(1, TRIALS_MAX)
MHA_TRIALS = count(1, TRIALS_MAX, also="and 10^12 comparisons in all")  # random-mha's
REPEATS = count(1, REPEATS_MAX)
WARMUP = count(0, WARMUP_MAX)
DPI = count(*DPI_RANGE)
DTYPE = choice(*DTYPES)
KERNEL = choice(*KERNELS)
DEVICE = Device()
DEVICE_MAP = choice(*DEVICE_MAPS).or_none()
FORMAT = choice(*PICTURE_FORMATS)
ABLATION_METHOD = choice(*ABLATION_METHODS)
ABLATION = choice(*ABLATIONS)
CIRCUIT_METHOD = choice(*CIRCUIT_METHODS)
DISCOVER_METHOD = choice(*DISCOVER_METHODS)
EDGE_ABLATION = choice(*EDGE_ABLATIONS)
BOS = FLAG.or_none()  # None: on when the model has the special tokens
HEAD = Head()
HEADS = HeadList()
HEAD_SET = HeadSet()
LAYER_OR_ALL = LayerOrAll()
FOLDER = Folder()
MODEL_FOLDER = Folder(example="demo-without-0.2/")  # where ablate --save writes a model


def check_text(value: Any, name: str, optional: bool = False) -> str | None:
    """A string (None too with `optional`); an empty one is left to the caller, which knows what it would mean."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise AttnscopeError(f"{name} {_shown(value)}: expected a string, not {_type_name(value)}")
    return value


def expanded_path(path: str | os.PathLike, flag: str) -> Path:
    """`path` with a leading `~` or `~user` expanded, as a shell would; a user that does not exist (or no home
    folder) is one AttnscopeError naming `flag` (`--out`, `--model`), not the RuntimeError of Path.expanduser."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        user = os.fspath(path).split("/", 1)[0]
        raise AttnscopeError(
            f"{flag} {os.fspath(path)}: cannot expand {user} (no such user, or no home folder); give the path in full"
        ) from None
