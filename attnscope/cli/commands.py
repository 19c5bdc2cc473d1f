"""The commands: each one is its Python function (attnscope.api) with options. A command's options are made from
the declarations of the function's keywords (`api.keywords`, attnscope.cli.declare) and of where its result goes
(attnscope.output.destination); running it is one flow for all (`_run`): prove --out writable, call the function
with what was given (a status line and a progress bar on a terminal), and show its result (`display.emit`).

Nothing here is written per command: each is its record in attnscope.registry (its help, with a runnable example),
made into a function by the API.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from attnscope import __version__, api
from attnscope.cli.declare import parameter
from attnscope.cli.display import Live, emit, is_main
from attnscope.errors import AttnscopeError
from attnscope.output.destination import Drawing, Output

app = typer.Typer(
    name="attnscope",
    help="What every attention head of a transformer does: roles, scores, pictures.",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

NEEDS_OUT = {"plot"}  # options whose pictures are drawn into the folder of --out


def _run(name: str, function: Any, output: Output, given: dict[str, Any]) -> None:
    """The one flow of every command: --out proven writable (and, for a command whose output is its files, its
    default folder), the function called with the options given, its result shown."""
    from attnscope.output.files import prepare_out_dir

    for option in NEEDS_OUT:
        if given.get(option) and output.out is None:
            raise AttnscopeError(f"--{option} draws into the folder of --out: give --out DIR too")
    _check_apart(given.get("save"), output.out)
    default = function.settings.default_out
    folder = output.out if output.out is not None else None if output.json or output.csv or default is None else default
    folder = None if folder is None else prepare_out_dir(Path(folder))
    takes = inspect.signature(function).parameters
    with Live(output.quiet, name) as live:
        callbacks = {key: getattr(live, key) for key in ("progress", "status") if key in takes}
        result = function(**given, **callbacks)
    if is_main():
        emit(result, output, folder)


def _check_apart(saved: Any, out: Any) -> None:
    """ablate's --save (a model's folder) and --out (the analysis' files) in one folder, or one inside the other,
    would mix the analysis' files into the saved model's folder: refused."""
    if saved is None or out is None:
        return
    model, files = (Path(folder).expanduser().resolve() for folder in (saved, out))
    if model == files or model in files.parents or files in model.parents:
        raise AttnscopeError(
            f"--save {saved} and --out {out}: the saved model's folder and the analysis' files would mix; give "
            "them folders apart"
        )


def _given(values: dict[str, Any]) -> dict[str, Any]:
    """The function's keywords from the options' values: a repeated option left out is the function's default, and
    TEXT '-' reads standard input (the file '-')."""
    given = {key: value for key, value in values.items() if value is not None or key in ("bos", "divergence")}
    if given.get("texts") == "-":
        if given.get("file") is not None:
            raise AttnscopeError("texts and file (TEXT, --file): give one or the other")
        given["file"] = given.pop("texts")
    return given


def _register(name: str, function: Any) -> None:
    output = Drawing if function.settings.draws else Output
    own = [parameter(item) for item in api.keywords(function.settings) if item.command_line]
    shown = [parameter(item) for item in output.declarations()]

    def command(**values: Any) -> None:
        chosen = output(**{item.name: values.pop(item.name) for item in output.declarations()})
        _run(name, function, chosen, _given(values))

    command.__signature__ = inspect.Signature(own + shown)  # what typer reads
    command.__doc__ = function.command.help
    command.__name__ = name.replace("-", "_")
    app.command(name)(command)


def _version(value: bool) -> None:
    if value:
        print(f"attnscope {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """What every attention head of a transformer does: roles, scores, pictures."""


for _name, _function in api.COMMANDS.items():
    _register(_name, _function)
