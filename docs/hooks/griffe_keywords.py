"""A griffe extension (mkdocstrings, mkdocs.yml) for the docstrings of attnscope's API: their keyword lists, written
as aligned columns for `help()`,

    window      the local window: the current token and the W before it (--window)
    thresholds  roles' thresholds moved: {"previous-token": 0.6} or ... (--threshold)
                continued on a line indented to the text

become a Markdown table (Markdown would run the lines together into one paragraph). A function's docstring is taken
from the function itself, as `help()` shows it: the API appends the keywords several functions share at import
(`api._keywords`), which reading the source alone would miss. Importing the API is cheap (no torch).
"""

from __future__ import annotations

import importlib
import re
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


def runtime_docstring(obj: griffe.Object) -> str | None:
    """The docstring of the live object at `obj.path`, cleaned as `help()` cleans it; None where it cannot be had."""
    import inspect

    try:
        live: Any = importlib.import_module(obj.module.path)
        for name in obj.path.removeprefix(obj.module.path + ".").split("."):
            live = getattr(live, name)
    except (ImportError, AttributeError):
        return None
    return inspect.getdoc(live)


class KeywordTables(griffe.Extension):
    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        text = runtime_docstring(func) or (func.docstring.value if func.docstring else None)
        if text:
            func.docstring = griffe.Docstring(keyword_tables(text), parent=func)
