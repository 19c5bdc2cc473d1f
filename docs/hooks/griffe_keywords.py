"""A griffe extension (mkdocstrings, mkdocs.yml) for the docstrings of attnscope's API: their keyword lists, written
as aligned columns for `help()`,

    window      the local window: the current token and the W before it (--window)
    thresholds  roles' thresholds moved: {"previous-token": 0.6} or ... (--threshold)
                continued on a line indented to the text

become a Markdown table (Markdown would run the lines together into one paragraph). A function's docstring and
signature are taken from the function itself, as `help()` shows them: the API makes each command's keywords, their
defaults and their docstring lines from its settings' declarations at import (`api.command`), which reading the
source alone would miss (it says `heads(**given)`); their types from the API's stub (attnscope/api.pyi, generated
from the same declarations by scripts/generate_stubs.py). Importing the API is cheap (no torch).
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path
from typing import Any

import griffe

KEYWORD = re.compile(r"^(\w+) {2,}(\S.*)$")
CONTINUED = re.compile(r"^ {6,}(\S.*)$")


def keyword_tables(text: str) -> str:
    """`text` with every run of aligned keyword lines turned into a table of keyword and meaning."""
    lines, out, rows = text.splitlines(), [], []

    def flush() -> None:
        if rows:
            out.extend(["", "| keyword | meaning |", "|---|---|"])
            out.extend(f"| `{name}` | {meaning.replace('|', '&#124;')} |" for name, meaning in rows)
            out.append("")
            rows.clear()

    for line in lines:
        keyword, continued = KEYWORD.match(line), CONTINUED.match(line)
        if keyword:
            rows.append([keyword.group(1), keyword.group(2)])
        elif continued and rows:
            rows[-1][1] += " " + continued.group(1)
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out)


def _live(obj: griffe.Object) -> Any:
    """The live object at `obj.path`, or None where it cannot be had."""
    try:
        live: Any = importlib.import_module(obj.module.path)
        for name in obj.path.removeprefix(obj.module.path + ".").split("."):
            live = getattr(live, name)
    except (ImportError, AttributeError):
        return None
    return live


def runtime_docstring(obj: griffe.Object) -> str | None:
    """The docstring of the live object at `obj.path`, cleaned as `help()` cleans it; None where it cannot be had."""
    import inspect

    live = _live(obj)
    return None if live is None else inspect.getdoc(live)


KINDS = {
    "POSITIONAL_ONLY": griffe.ParameterKind.positional_only,
    "POSITIONAL_OR_KEYWORD": griffe.ParameterKind.positional_or_keyword,
    "VAR_POSITIONAL": griffe.ParameterKind.var_positional,
    "KEYWORD_ONLY": griffe.ParameterKind.keyword_only,
    "VAR_KEYWORD": griffe.ParameterKind.var_keyword,
}


@functools.cache
def stub_types(module: str) -> dict[str, dict[str, str]]:
    """{function: {parameter: its type}} as the module's stub (`.pyi` beside it) writes them; {} without one."""
    path = Path(importlib.import_module(module).__file__ or "").with_suffix(".pyi")
    if not path.is_file():
        return {}
    functions = [node for node in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(node, ast.FunctionDef)]
    return {
        function.name: {
            argument.arg: ast.unparse(argument.annotation)
            for argument in function.args.args + function.args.kwonlyargs
            if argument.annotation is not None
        }
        for function in functions
    }


def runtime_parameters(obj: griffe.Object) -> griffe.Parameters | None:
    """The parameters of a live function whose signature was made at import (`__signature__`): each with its kind
    and its default as Python writes it, and its type as the module's stub gives it; None for any other function
    (griffe reads those from the source)."""
    import inspect

    live = _live(obj)
    if live is None or "__signature__" not in vars(live):
        return None
    types = stub_types(obj.module.path).get(obj.name, {})
    parameters = []
    for parameter in inspect.signature(live).parameters.values():
        default = None if parameter.default is inspect.Parameter.empty else repr(parameter.default)
        kind, annotation = KINDS[parameter.kind.name], types.get(parameter.name)
        parameters.append(griffe.Parameter(parameter.name, kind=kind, default=default, annotation=annotation))
    return griffe.Parameters(*parameters)


class KeywordTables(griffe.Extension):
    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        text = runtime_docstring(func) or (func.docstring.value if func.docstring else None)
        if text:
            func.docstring = griffe.Docstring(keyword_tables(text), parent=func)
        parameters = runtime_parameters(func)
        if parameters is not None:
            func.parameters = parameters
