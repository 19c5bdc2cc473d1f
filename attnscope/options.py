"""Every option's domain, declared once: its type, its range or its choices, and whether it may be left out (None).

The settings classes of the analyses check their fields against these (`check_fields`), so the Python API, which
builds them from its keywords, refuses what the command line refuses, with the same words; the command line reads
its options' ranges (shown by `--help`) and parsers (`Option.parse`) from the same objects. A value is named as the
caller spells it: `window 0: ...` from Python, `--window 0: ...` from the command line.

Pure Python, at the base of the package: the CLI can declare its options without importing anything heavy.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnscope.errors import AttnscopeError

# Choices shared by the command line, the Python API and the code that acts on them.
DTYPES = ("auto", "float32", "float16", "bfloat16")
KERNELS = ("auto", "fused", "blocks")
DEVICE_MAPS = ("auto", "balanced", "sequential")
PICTURE_FORMATS = ("png", "svg", "pdf")
DEVICE_PATTERN = r"auto|cpu|cuda(?::(\d{1,9}))?"  # a device; its number, if any, is group 1
ABLATION_METHODS = ("loss", "gradient")
CIRCUIT_METHODS = ("removal", "gradient")  # exact removal of each earlier head, or its first-order estimate
BENCH_METHODS = ("floor", "attnscope", "tutorial", "cache")  # bench's default set
BENCH_KERNEL_METHODS = ("fused", "blocks")  # the analysis with one kernel or the other
BENCH_DIVERSITY_METHODS = ("diversity", "diversity-sampled")
BENCH_CIRCUIT_METHODS = ("circuit", "circuit-naive")  # every earlier head removed: replayed, or one forward each
ALL_BENCH_METHODS = BENCH_METHODS + BENCH_KERNEL_METHODS + BENCH_DIVERSITY_METHODS + BENCH_CIRCUIT_METHODS

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
DPI_RANGE = (50, 1200)


@dataclass(frozen=True)
class Option:
    """The domain of one option: `kind` is "count" (a whole number), "number" (a finite real), "flag" (True or
    False), "choice" (one of `choices`) or "text" (a non-empty string); counts and numbers lie from `low` to
    `high`; `optional`: None is allowed too (it means the default that the setting documents)."""

    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False
    excluded: tuple[int, ...] = ()  # values of the range that mean nothing (a sample of 1 row has no spread)
    described: str = ""  # the domain in words, where `domain()` would not say it well

    def or_none(self) -> Option:
        """The same domain, with None allowed."""
        return replace(self, optional=True)

    def domain(self) -> str:
        """What is allowed, in words: `a whole number from 1 to 100,000`."""
        if self.described:
            return self.described
        if self.kind == "count":
            return f"a whole number from {self.low:,} to {self.high:,}"
        if self.kind == "number":
            return f"a number from {self.low:g} to {self.high:g}"
        if self.kind == "flag":
            return "True or False" + (" (or None)" if self.optional else "")
        if self.kind == "choice":
            return f"one of {', '.join(self.choices)}"
        return "a non-empty string"

    def check(self, value: Any, name: str) -> Any:
        """`value` if it lies in the domain (an integer type such as numpy's as an int), else one AttnscopeError
        naming `name` and the value."""
        if value is None and self.optional:
            return None
        problem = self.problem(value)
        if problem is not None:
            raise AttnscopeError(f"{name} {_shown(value)}: {problem}")
        if self.kind == "count":
            return int(value)
        if self.kind == "number":
            return float(value)
        if self.kind == "flag":
            return bool(value)
        return value

    def problem(self, value: Any) -> str | None:
        """Why `value` is not in the domain (None: it is)."""
        if self.kind == "count":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                return f"expected {self.domain()}, not {_type_name(value)}"
            if not self.low <= value <= self.high or value in self.excluded:
                return f"must be {self.domain()}"
        elif self.kind == "number":
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                return f"expected {self.domain()}, not {_type_name(value)}"
            if not (math.isfinite(value) and self.low <= value <= self.high):
                return f"must be {self.domain()}"
        elif self.kind == "flag":
            if not (isinstance(value, bool) or type(value).__name__ == "bool_"):  # numpy's too
                return f"expected {self.domain()}, not {_type_name(value)}"
        elif self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                return f"use {self.domain()}"
        elif not isinstance(value, str) or not value.strip():
            return f"expected {self.domain()}"
        return None

    def parse(self, text: str) -> Any:
        """The value of the command-line text `text`, or one AttnscopeError saying what is allowed (the caller
        names the option)."""
        value: Any = text
        if self.kind in ("count", "number"):
            stripped = text.strip()
            if len(stripped.lstrip("+-")) > 40 and stripped.lstrip("+-").isdigit():  # past any bound; int() of
                return self._refuse(text, f"must be {self.domain()}")  # 5,000 digits would raise
            try:
                value = int(stripped) if self.kind == "count" else float(stripped)
            except ValueError:
                self._refuse(text, f"expected {self.domain()}")
        problem = self.problem(value)
        if problem is not None:
            self._refuse(text, problem)
        return value

    @staticmethod
    def _refuse(text: str, problem: str) -> Any:
        raise AttnscopeError(f"{shown_text(text)}: {problem}")


def count(low: int, high: int) -> Option:
    return Option("count", low, high)


def number(low: float, high: float) -> Option:
    return Option("number", low, high)


def choice(*choices: str) -> Option:
    return Option("choice", choices=choices)


FLAG = Option("flag")
TEXT = Option("text")

# One object per option; where two commands share an option's name and its meaning, they share the object.
WINDOW = count(1, LENGTH_MAX)
BATCH_SIZE = count(1, LENGTH_MAX)
MAX_TOKENS = count(1, 100 * LENGTH_MAX)
PROBE_LEN = count(3, LENGTH_MAX)  # tokens.MIN_PROBE_LEN: a period of 3 tokens is the shortest the probe can score
SEED = count(0, SEED_MAX)
TOP = count(1, ROWS_MAX)
STEPS = count(0, 1_000)  # circuit --method gradient: integration points (each a forward and a backward pass)
TOKENS = count(1, ROWS_MAX)
PRUNE = count(0, ROWS_MAX)
LAYER = count(0, LAYER_MAX)
HEAD = count(0, LAYER_MAX)
INDEX = count(0, INDEX_MAX)
JS_BITS = number(0.0, 1.0)  # a Jensen–Shannon divergence in bits
SAMPLE_ROWS = Option(  # diversity's: a standard error needs two rows
    "count", 0, SAMPLE_ROWS_MAX, excluded=(1,), described=f"0 (every row, exact) or from 2 to {SAMPLE_ROWS_MAX:,}"
)
BENCH_SAMPLE_ROWS = count(2, SAMPLE_ROWS_MAX)
D_MODEL = count(1, D_MODEL_MAX)
HEAD_COUNT = count(1, D_MODEL_MAX)  # each of random-mha's --heads
SEQ_LEN = count(2, 4096)  # random-mha's sequences
BENCH_SEQ_LEN = count(2, LENGTH_MAX)  # each of bench's --seq-lens
BENCH_BATCH = count(1, BATCH_MAX)  # each of bench's --batch-sizes
TRIALS = count(1, TRIALS_MAX)
REPEATS = count(1, REPEATS_MAX)
WARMUP = count(0, WARMUP_MAX)
DPI = count(*DPI_RANGE)
DTYPE = choice(*DTYPES)
KERNEL = choice(*KERNELS)
DEVICE_MAP = choice(*DEVICE_MAPS).or_none()
FORMAT = choice(*PICTURE_FORMATS)
ABLATION_METHOD = choice(*ABLATION_METHODS)
CIRCUIT_METHOD = choice(*CIRCUIT_METHODS)
BOS = FLAG.or_none()  # None: on when the model has the special tokens


def check_fields(settings: Any, fields: dict[str, Option]) -> None:
    """Check the fields of a frozen settings dataclass against their options, storing each value as checked (an
    integer type such as numpy's as an int); one AttnscopeError names the first field that is not in its domain."""
    for name, option in fields.items():
        object.__setattr__(settings, name, option.check(getattr(settings, name), name))


def check_numbers(values: Any, option: Option, name: str) -> tuple[int, ...]:
    """Whole numbers (a list, a tuple, an array: not a string), each in `option`'s domain, at least one."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise AttnscopeError(f"{name} {_shown(values)}: expected a list of whole numbers such as [1, 2, 4]")
    values = tuple(values)
    if not values:
        raise AttnscopeError(f"{name}: give at least one number")
    return tuple(option.check(value, name) for value in values)


def check_names(values: Any, choices: Sequence[str], name: str) -> tuple[str, ...]:
    """A sequence of names (a string alone counts as one), each one of `choices`, at least one, each once."""
    items = (values,) if isinstance(values, str) else values
    if isinstance(items, bytes) or not isinstance(items, Sequence) or not items:
        raise AttnscopeError(f"{name} {_shown(values)}: use some of {', '.join(choices)}")
    unknown = [item for item in items if not isinstance(item, str) or item not in choices]
    if unknown:
        raise AttnscopeError(f"{name} {_shown(unknown[0])}: use some of {', '.join(choices)}")
    return tuple(dict.fromkeys(items))


def check_text(value: Any, name: str, optional: bool = False) -> str | None:
    """A string (None too with `optional`); an empty one is left to the caller, which knows what it would mean."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise AttnscopeError(f"{name} {_shown(value)}: expected a string, not {_type_name(value)}")
    return value


def shown(value: Any) -> str:
    """A value a user gave, as a message repeats it: strings quoted, anything longer than 40 characters cut."""
    return _shown(value)


def shown_text(text: str) -> str:
    """Command-line text as a message shows it: as typed, quoted only where it is empty or holds white space."""
    shown = text if text.strip() and not any(char.isspace() for char in text) else repr(text)
    return shown if len(shown) <= 40 else f"{shown[:37]}..."


def _type_name(value: Any) -> str:
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _shown(value: Any) -> str:
    """A value as a message shows it: strings quoted, long ones cut (a 5,000-digit number is not repeated whole)."""
    text = repr(value) if isinstance(value, str) else str(value) if _printable(value) else f"<{type(value).__name__}>"
    return text if len(text) <= 40 else f"{text[:37]}..."


def _printable(value: Any) -> bool:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return abs(int(value)) < 10**40  # str() of a huge int is slow, and refused past 4,300 digits
    return isinstance(value, (bool, float, numbers.Number, list, tuple, type(None)))


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
