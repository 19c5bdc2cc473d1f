"""The kinds of option domain (`Option` and its kinds: counts, numbers, choices, devices, lists of numbers or names)
that attnscope.options declares every option with: what a value may be, checked on a Python value (`check`) and read
from command-line text (`parse`), in the same words. Pure Python, at the base of the package."""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from attnscope.errors import AttnscopeError

DEVICE_PATTERN = r"auto|cpu|cuda(?::(\d{1,9}))?"  # a device; its number, if any, is group 1


# ------------------------------------------------------------------------------------------------------ domains


@dataclass(frozen=True)
class Option:
    """The domain of one option: `kind` is "count" (a whole number), "number" (a finite real), "flag" (True or
    False), "choice" (one of `choices`) or "text" (a non-empty string); counts and numbers lie from `low` to
    `high`; `optional`: None is allowed too (it means the default that the setting documents). Subclasses below
    add the domains of richer values (a device, a head `L.H`, comma-separated numbers)."""

    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False
    excluded: tuple[int, ...] = ()  # values of the range that mean nothing (a sample of 1 row has no spread)
    described: str = ""  # the domain in words, where `domain()` would not say it well
    # What else bounds a value, checked where it can be (the model's layers, the texts given): docs/promises.md's
    # table of bounds says it beside the range
    also: str = ""

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
        return self.normal(value)

    def normal(self, value: Any) -> Any:
        """A value of the domain in its one form (an int, a float, a bool, a stripped name)."""
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
            return self._count_problem(value)
        if self.kind == "number":
            return self._number_problem(value)
        if self.kind == "flag":
            if not (isinstance(value, bool) or type(value).__name__ == "bool_"):  # numpy's too
                return f"expected {self.domain()}, not {_type_name(value)}"
            return None
        if self.kind == "choice":
            return None if isinstance(value, str) and value in self.choices else f"use {self.domain()}"
        return self._text_problem(value)

    def _count_problem(self, value: Any) -> str | None:
        """Why `value` is not a whole number (of any integer type, a bool aside) in the range, not excluded."""
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            return f"expected {self.domain()}, not {_type_name(value)}"
        if not self.low <= value <= self.high or value in self.excluded:
            return f"must be {self.domain()}"
        return None

    def _number_problem(self, value: Any) -> str | None:
        """Why `value` is not a finite real number (of any type, a bool aside) in the range."""
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return f"expected {self.domain()}, not {_type_name(value)}"
        if not (math.isfinite(value) and self.low <= value <= self.high):
            return f"must be {self.domain()}"
        return None

    def _text_problem(self, value: Any) -> str | None:
        """Why `value` is not a non-empty string without NUL bytes."""
        if not isinstance(value, str):
            return f"expected a string, not {_type_name(value)}"
        if not value.strip() or "\0" in value:
            return f"expected {self.domain()}" + (" (without NUL bytes)" if value.strip() else "")
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
        return self._read(text, value)

    @property
    def python_type(self) -> type:
        """The type a command-line parser hands on: what `--help` and shell completion go by."""
        return {"count": int, "number": float, "flag": bool}.get(self.kind, str)

    def _read(self, text: str, value: Any) -> Any:
        """`value`, read from the command-line text `text`, in its one form if it lies in the domain; else one
        AttnscopeError saying why (`_refuse`)."""
        problem = self.problem(value)
        if problem is not None:
            self._refuse(text, problem)
        return self.normal(value)

    @staticmethod
    def _refuse(text: str, problem: str) -> Any:
        raise AttnscopeError(f"{shown_text(text)}: {problem}")


def count(low: int, high: int, also: str = "") -> Option:
    return Option("count", low, high, also=also)


def number(low: float, high: float, also: str = "") -> Option:
    return Option("number", low, high, also=also)


def choice(*choices: str) -> Option:
    return Option("choice", choices=choices)


@dataclass(frozen=True)
class Device(Option):
    """auto, cpu, cuda or cuda:N, in any case (`CUDA:1`), stored in lower case; whether this machine has it is
    checked where the model is loaded (models.loading.resolve_device)."""

    kind: str = "device"

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, str) or re.fullmatch(DEVICE_PATTERN, value.strip().lower()) is None:
            return "use auto, cpu, cuda or cuda:N"
        return None

    def normal(self, value: Any) -> str:
        return value.strip().lower()


@dataclass(frozen=True)
class Numbers(Option):
    """Whole numbers, each in `item`'s domain, at least one: comma-separated on the command line (`128,512`), a
    list or tuple in Python (not a string); a tuple once checked, each number once in the order given."""

    kind: str = "numbers"
    item: Option = dataclasses.field(default_factory=lambda: count(1, 1))

    def domain(self) -> str:
        return f"comma-separated whole numbers, each {self.item.domain()}"

    def problem(self, value: Any) -> str | None:
        return list_problem(value, "whole numbers such as [1, 2, 4]", "number", self.item.problem)

    def normal(self, value: Any) -> tuple[int, ...]:
        return tuple(dict.fromkeys(int(item) for item in value))

    def parse(self, text: str) -> tuple[int, ...]:
        if isinstance(text, tuple):  # a default, already a value
            return text
        try:
            values = tuple(int(part) for part in text.split(",") if part.strip())
        except ValueError:
            return self._refuse(text, "expected comma-separated whole numbers")
        if not values:
            return self._refuse(text, "give at least one number")
        for value in values:
            problem = self.item.problem(value)
            if problem is not None:
                raise AttnscopeError(f"{value}: {problem}")
        return self.normal(values)


@dataclass(frozen=True)
class Names(Option):
    """Names, each one of `choices`, at least one, each once: comma-separated on the command line, a list (or one
    string) in Python."""

    kind: str = "names"

    def domain(self) -> str:
        return f"some of {', '.join(self.choices)}"

    def problem(self, value: Any) -> str | None:
        items = (value,) if isinstance(value, str) else value
        if isinstance(items, bytes) or not isinstance(items, Sequence) or not items:
            return f"use {self.domain()}"
        unknown = [item for item in items if not isinstance(item, str) or item not in self.choices]
        return f"{_shown(unknown[0])}: use {self.domain()}" if unknown else None

    def normal(self, value: Any) -> tuple[str, ...]:
        return tuple(dict.fromkeys((value,) if isinstance(value, str) else value))

    def parse(self, text: str) -> tuple[str, ...]:
        if isinstance(text, tuple):
            return text
        chosen = [name.strip() for name in text.split(",") if name.strip()]
        if not chosen or any(name not in self.choices for name in chosen):
            return self._refuse(text, f"use {self.domain()}, comma-separated")
        return self.normal(chosen)


# ------------------------------------------------------------------------------------------------- wording


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
    """Whether a value's str() is short to make and says what it is: a number, or a short list of them and of
    strings (a list holding a model would print the model's repr, thousands of characters)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return abs(int(value)) < 10**40  # str() of a huge int is slow, and refused past 4,300 digits
    if isinstance(value, (list, tuple)):
        return len(value) <= 40 and all(isinstance(item, str) or _printable(item) for item in value)
    return isinstance(value, (bool, float, numbers.Number, type(None)))


def list_problem(value: Any, expected: str, one: str, item_problem: Any) -> str | None:
    """What is wrong with a list option's value (None: nothing): not a list (a string is not one: "1,2" is the command
    line's form), an empty one, or the first item whose `item_problem` is not None, named."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        return f"expected a list of {expected}"
    values = tuple(value)
    if not values:
        return f"give at least one {one}"
    for item in values:
        problem = item_problem(item)
        if problem is not None:
            return f"{_shown(item)}: {problem}"
    return None
