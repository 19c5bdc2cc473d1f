"""Parts of the documentation generated from attnscope itself, so that they cannot drift from it.

An MkDocs hook (`hooks:` in mkdocs.yml): before a page's Markdown is rendered, each marker line in it is replaced by
what it names, built from the code as it is now:

    <!-- generated: cli -->            every command of the CLI: its help, usage, arguments and options
    <!-- generated: cli COMMAND -->    one command's usage, arguments and options (a table)
    <!-- generated: scores -->         the catalog's scores (attnscope/scores/catalog.py)
    <!-- generated: roles -->          the catalog's roles, in the order they are tried
    <!-- generated: info MODEL -->      what `attnscope info --model MODEL --device cpu` prints (config only, fast)
    <!-- generated: commands -->       the commands' index: one row per record of attnscope.registry, linked to its page
    <!-- generated: api -->            the API reference's members: `load` and every command's function
    <!-- generated: bounds -->         the bounds of every number option (docs/promises.md), from the declarations

And the site's navigation lists the commands of attnscope.registry, each under its name and page (`on_config`).

A marker may also hold what it generated, up to `<!-- end generated -->`: the page then reads on a code host too
(docs/reference.md does: `python docs/hooks/generate.py` rewrites its block, and tests/unit/test_docs.py fails while
the block differs from what the CLI says); the build replaces the block with what the code says now.

The CLI is read the way `--help` reads it: Typer's click command tree (`typer.main.get_command`), and for each
parameter its help record (`get_help_record`: names, metavar, help, then click's `[default: ...; range; required]`),
so the reference says exactly what `attnscope COMMAND --help` says, and a new command or option appears in it with
no change here. Plain Python, no MkDocs import: tests call these functions directly (tests/unit/test_docs.py).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any

MARKER = re.compile(
    r"^<!-- generated: (\w+)(?: ([\w-]+))? -->$(?:\n(?P<block>.*?)\n<!-- end generated -->$)?", re.MULTILINE | re.DOTALL
)
KEPT = ("reference.md", "promises.md")  # the pages whose generated blocks are kept in the repository


# ------------------------------------------------------------------------------------------------- the CLI


@dataclass(frozen=True)
class Parameter:
    """One argument or option as `--help` shows it."""

    names: str  # the help record's left column: "-m, --model NAME|PATH", "--words / --no-words", "TEXT"
    help: str  # without click's trailing [...]
    default: str | None
    values: str | None  # a range ("1 to 100000", "≥ 0") or choices ("`auto`, `float32`, ...")
    required: bool
    argument: bool


@dataclass(frozen=True)
class Command:
    name: str  # "heads"; "" for the top level
    usage: str  # "attnscope heads [OPTIONS] [TEXT]"
    help: str  # the docstring as --help shows it
    parameters: tuple[Parameter, ...]


def _root() -> Any:
    import typer

    from attnscope.cli import app

    return typer.main.get_command(app)


def _extras(text: str) -> tuple[str, list[str]]:
    """Split click's trailing '  [default: 8; 1<=x<=100000]' off a help text."""
    found = re.search(r"\s{2}\[([^\[\]]*)\]$", text)
    if found is None:
        return text.strip(), []
    return text[: found.start()].strip(), [part.strip() for part in found.group(1).split(";")]


def _range(text: str) -> str | None:
    """click's '1<=x<=100000', 'x>=1', '0.0<=x<=1.0' in words; None if `text` is no range."""
    both = re.fullmatch(r"(-?[\d.]+)<=x<=(-?[\d.]+)", text)
    if both:
        return f"{both.group(1)} to {both.group(2)}"
    one = re.fullmatch(r"x(>=|<=|>|<)(-?[\d.]+)", text)
    if one:
        return {">=": "≥ ", "<=": "≤ ", ">": "> ", "<": "< "}[one.group(1)] + one.group(2)
    return None


def _parameter(param: Any, context: Any) -> Parameter:
    names, text = param.get_help_record(context)
    text, extras = _extras(text or "")
    default, values, required = None, None, False
    for extra in extras:
        if extra.startswith("default: "):
            default = extra.removeprefix("default: ")
            if getattr(param, "secondary_opts", None):  # a --x/--no-x flag: click names the side by its bare word
                default = next(
                    (flag for flag in (*param.opts, *param.secondary_opts) if flag.endswith(default)), default
                )
        elif extra == "required":
            required = True
        elif _range(extra):
            values = _range(extra)
    choices = re.search(r" <([^<>]+\|[^<>]+)>$", names)  # typer shows a Literal's choices as --dtype <a|b|c>
    if choices:
        names = names[: choices.start()]
        values = ", ".join(f"`{choice}`" for choice in choices.group(1).split("|"))
    argument = param.param_type_name == "argument"
    if argument:  # typer adds the type to an argument's metavar: "TEXT <str>"
        names = re.sub(r" <\w+>$", "", names)
    return Parameter(names, text, default, values, required or bool(param.required), argument)


def commands() -> list[Command]:
    """The top level (its options) and every command of the CLI, in the order `attnscope --help` lists them."""
    root = _root()
    top = root.context_class(root, info_name="attnscope")
    found = [_command(root, top, "")]
    for name in root.list_commands(top):
        command = root.get_command(top, name)
        if command is not None and not command.hidden:
            found.append(_command(command, command.context_class(command, info_name=name, parent=top), name))
    return found


def _command(command: Any, context: Any, name: str) -> Command:
    shown = [
        _parameter(param, context)
        for param in command.get_params(context)
        if not getattr(param, "hidden", False) and param.name != "help" and param.get_help_record(context)
    ]
    parameters = tuple(sorted(shown, key=lambda parameter: not parameter.argument))  # arguments first, as in usage
    usage = " ".join(["attnscope", *([name] if name else []), *command.collect_usage_pieces(context)])
    return Command(name, usage, command.help or "", parameters)


def command_named(name: str) -> Command:
    for command in commands():
        if command.name == name:
            return command
    raise ValueError(f"no command '{name}' in the CLI (a marker <!-- generated: cli {name} --> names it)")


def _cell(text: str) -> str:
    """Text for a Markdown table cell: no HTML, no cell break."""
    return html.escape(text, quote=False).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`"  # a pipe inside a code span does not end a table cell (Python-Markdown's tables)


def parameters_table(command: Command) -> str:
    """The command's usage and a table of its arguments and options."""
    rows = ["| argument or option | what it does | default | values |", "|---|---|---|---|"]
    for parameter in command.parameters:
        name = _code(parameter.names) + (" (argument)" if parameter.argument else "")
        default = "required" if parameter.required else _code(parameter.default) if parameter.default else ""
        rows.append(f"| {name} | {_cell(parameter.help)} | {default} | {parameter.values or ''} |")
    return "\n".join([f"```\n{command.usage}\n```", "", *rows])


def _help_markdown(text: str) -> str:
    """A command's docstring as Markdown: paragraphs kept, the 'Example:' paragraph as a code block."""
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        flat = " ".join(line.strip() for line in paragraph.splitlines())
        if flat.startswith("Example: "):
            examples = re.split(r"; (?=attnscope )", flat.removeprefix("Example: "))
            paragraphs.append("Example:\n\n```\n" + "\n".join(examples) + "\n```")
        else:
            paragraphs.append(html.escape(flat, quote=False))
    return "\n\n".join(paragraphs)


def command_markdown(command: Command, level: int = 2) -> str:
    """A command's section of the reference: heading, help, usage and table."""
    title = f"`attnscope {command.name}`" if command.name else "`attnscope` (before any command)"
    return "\n\n".join([f"{'#' * level} {title}", _help_markdown(command.help), parameters_table(command)])


def cli_markdown() -> str:
    """Every command, each with its help and the table of its arguments and options."""
    return "\n\n".join(command_markdown(command) for command in commands())


# ------------------------------------------------------------------------------------------------ catalog


def scores_markdown() -> str:
    """The catalog's scores: JSON/CSV name, table column, unit, the models that measure it, where it comes from."""
    from attnscope.scores import catalog

    rows = [
        "| score (JSON, CSV) | column | in words | unit | models | from | definition |",
        "|---|---|---|---|---|---|---|",
    ]
    for score in catalog.SCORES:
        kinds = " and ".join(f"{kind}s" for kind in sorted(score.kinds))
        rows.append(
            f"| `{score.name}` | `{score.short}` | {score.label} | {score.unit} | {kinds} | {score.source} | "
            f"{_cell(score.description)} |"
        )
    return "\n".join(rows)


def roles_markdown() -> str:
    """The catalog's roles in the order they are tried, with their colour, deciding score and threshold."""
    from attnscope.scores import catalog

    rows = [
        "| role | cell | colour | decided by | threshold | rule | what it means |",
        "|---|---|---|---|---|---|---|",
    ]
    for role in catalog.ROLES:
        swatch = f'<span class="swatch" style="background:{role.colour}" title="{role.colour}"></span>'
        score = f"`{role.score}`" if role.score else "none passes"
        threshold = "" if role.threshold is None else f"{role.threshold:g}"
        rows.append(
            f"| {role.name} | `{role.short}` | {swatch} | {score} | {threshold} | {role.rule} | "
            f"{_cell(role.description)} |"
        )
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------- a command's run


def info_markdown(model: str) -> str:
    """What `attnscope info --model MODEL --device cpu` prints on an 80-column terminal, as a code block. `info`
    reads the config alone (for GPT-2 without torch), so this costs a fraction of a second."""
    import contextlib
    import io

    from attnscope.cli import run

    printed, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
        status = run(["info", "--model", model, "--device", "cpu"])
    if status != 0:
        raise ValueError(f"attnscope info --model {model} failed: {errors.getvalue().strip()}")
    return "```\n" + printed.getvalue().rstrip() + "\n```"


def commands_markdown() -> str:
    """The commands' index (docs/commands/index.md): each record's name linked to its page, what it does, what it
    draws."""
    from attnscope import registry

    rows = ["| command | what it does | picture |", "|---|---|---|"]
    for command in registry.COMMANDS:
        link = command.page.removeprefix("commands/") if command.page.startswith("commands/") else f"../{command.page}"
        rows.append(f"| [`attnscope {command.name}`]({link}) | {command.summary} | {command.picture} |")
    return "\n".join(rows)


def api_markdown() -> str:
    """The API reference (docs/api.md): `load` and every command's function, from their docstrings as `help()` shows
    them (the functions are made at import from the registry, so they are read by inspection, not from the source)."""
    from attnscope import registry

    members = ", ".join(["load", *(command.function for command in registry.COMMANDS)])
    return f"::: attnscope.api\n    options:\n      force_inspection: true\n      members: [{members}]"


def bounds_markdown() -> str:
    """The bounds of every number an option takes (docs/promises.md): one row per option and range, with the commands
    that take it (`every command that draws` where those are all of them), read from the settings' declarations
    (attnscope.options): a count's or number's range, a list's range for each of its numbers, and what else bounds
    it (`Option.also`, a value the range leaves out)."""
    from attnscope import registry
    from attnscope.output.files import Pictures
    from attnscope.settings.declare import declared

    rows: dict[tuple[str, ...], list[str]] = {}
    for command in registry.COMMANDS:
        for setting in declared(command.settings) + (declared(Pictures) if command.settings.draws else []):
            domain = getattr(setting.domain, "item", setting.domain)  # a list's numbers each lie in its item's range
            if setting.argument or not setting.command_line or domain is None or domain.low is None:
                continue
            each = " (each)" if domain is not setting.domain else ""  # a list's
            besides = [*(f"not {value:,}" for value in domain.excluded), *([domain.also] if domain.also else [])]
            key = (f"`{setting.spelled}`{each}", _number(domain.low), _number(domain.high), "; ".join(besides))
            rows.setdefault(key, []).append(command.name)
    drawing = [command.name for command in registry.COMMANDS if command.settings.draws]
    lines = ["| option | commands | from | to | besides |", "|---|---|---|---|---|"]
    for (option, low, high, besides), names in rows.items():
        where = "every command that draws" if names == drawing else ", ".join(names)
        lines.append(f"| {option} | {where} | {low} | {high} | {besides} |")
    return "\n".join(lines)


def _number(value: float) -> str:
    """A bound as the table writes it: 100,000; 0.001; 1."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def navigation(nav: list[Any]) -> list[Any]:
    """The site's navigation with its Commands section made of the registry's records (after its first entry, the
    overview, and before its last, the reference of every option)."""
    from attnscope import registry

    out = []
    for entry in nav:
        if isinstance(entry, dict) and "Commands" in entry:
            first, *_, last = entry["Commands"]
            pages = [{command.name: command.page} for command in registry.COMMANDS]
            entry = {"Commands": [first, *pages, last]}
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------- the hook


def expand(markdown: str) -> str:
    """Replace every marker of `markdown` by what it names; an unknown marker is an error (the build stops)."""

    def replace(found: re.Match) -> str:
        kind, argument = found.group(1), found.group(2)
        if kind == "cli":
            return cli_markdown() if argument is None else parameters_table(command_named(argument))
        if kind == "scores" and argument is None:
            return scores_markdown()
        if kind == "roles" and argument is None:
            return roles_markdown()
        if kind == "info" and argument is not None:
            return info_markdown(argument)
        if kind == "commands" and argument is None:
            return commands_markdown()
        if kind == "api" and argument is None:
            return api_markdown()
        if kind == "bounds" and argument is None:
            return bounds_markdown()
        raise ValueError(f"unknown marker: {found.group(0)}")

    return MARKER.sub(replace, markdown)


def on_config(config: Any) -> Any:
    """MkDocs' hook: the navigation's commands from the registry."""
    config["nav"] = navigation(config["nav"])
    return config


def on_page_markdown(markdown: str, page: Any = None, config: Any = None, files: Any = None) -> str:
    """MkDocs' hook: the page's Markdown with its markers expanded."""
    return expand(markdown)


def with_blocks(markdown: str) -> str:
    """`markdown` with each marker followed by what it generates now, kept between the marker and its end (what a
    page kept in the repository holds)."""

    def replace(found: re.Match) -> str:
        marker = found.group(0).split("\n", 1)[0]
        return f"{marker}\n{expand(marker)}\n<!-- end generated -->"

    return MARKER.sub(replace, markdown)


if __name__ == "__main__":  # python docs/hooks/generate.py: the blocks of the pages in KEPT made current
    from pathlib import Path

    for name in KEPT:
        page = Path(__file__).resolve().parents[1] / name
        page.write_text(with_blocks(page.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"wrote {page}")
