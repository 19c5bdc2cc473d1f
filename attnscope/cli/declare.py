"""A command's options, made from the declarations of its settings (attnscope.settings): one typer parameter per
setting, with its names, help, default, range or choices and parser, so that `--help`, shell completion and the
checks say what the declaration says. Nothing here is written per option.

A value outside its domain ends as one line naming the option as the command line spells it:
`--window 0: must be a whole number from 1 to 100,000` (see `OptionError`, turned into that line by the error
boundary in attnscope.cli.boundary).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from attnscope.errors import AttnscopeError


class OptionError(typer.BadParameter):
    """A value outside its option's domain: shown as `--window 0: must be a whole number from 1 to 100,000`."""


def _parser(domain: Any) -> Callable[[Any], Any]:
    """The domain's reader of command-line text, its refusal as an OptionError; a default passes as it is."""

    def parse(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        try:
            return domain.parse(text)
        except AttnscopeError as error:
            raise OptionError(str(error)) from None

    parse.domain = domain  # what reads it (tests, docs) finds the declaration's domain
    return parse


def _shown_default(value: Any) -> Any:
    """A default as `--help` shows it: a tuple of numbers or names comma-separated, as it is typed."""
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return value


def _flag_names(item: Any) -> tuple[str, ...]:
    """A flag's names: `--probe/--no-probe` unless it is not negatable or its declaration spells it."""
    names = item.options
    if not item.negatable or any("/" in name for name in names):
        return names
    long, *short = names
    return (f"{long}/--no-{long.removeprefix('--')}", *short)


def parameter(item: Any) -> inspect.Parameter:
    """The typer parameter of one declared setting (attnscope.settings.Setting)."""
    domain = item.domain
    optional = item.required is False and item.default is None
    if item.argument:
        annotation: Any = Annotated[
            str | None, typer.Argument(metavar=item.metavar, help=item.help, show_default=False)
        ]
        return inspect.Parameter(item.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
    keywords: dict[str, Any] = {"help": item.help}
    if item.metavar:
        keywords["metavar"] = item.metavar
    if domain is not None and domain.kind == "flag":
        names = _flag_names(item)
        keywords.pop("metavar", None)
        kind: Any = bool | None if domain.optional else bool
        keywords["show_default"] = not domain.optional
        annotation = Annotated[kind, typer.Option(*names, **keywords)]
        return inspect.Parameter(item.name, inspect.Parameter.KEYWORD_ONLY, default=item.default, annotation=annotation)
    python_type = domain.python_type if domain is not None else str
    if domain is not None:
        keywords["parser"] = _parser(domain)
        if domain.kind in ("count", "number"):
            keywords.update(min=domain.low, max=domain.high)
        elif domain.choices:
            if not item.metavar:
                keywords["metavar"] = f"<{'|'.join(domain.choices)}>"  # as typer shows a Literal (docs/hooks reads it)
            choices = list(domain.choices)
            keywords["autocompletion"] = lambda incomplete="": [name for name in choices if name.startswith(incomplete)]
    if item.many:
        annotation = Annotated[list[python_type] | None, typer.Option(*item.options, **keywords)]
        # left out: None, so the function's own default applies (and it can tell the option was not given)
        return inspect.Parameter(item.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
    annotation = Annotated[python_type | None if optional else python_type, typer.Option(*item.options, **keywords)]
    default = ... if item.required else _shown_default(item.default)  # as typed: the parser reads it
    return inspect.Parameter(item.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
