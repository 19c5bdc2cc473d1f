"""attnscope: what every attention head of a transformer does.

Every command of the CLI is a function here (see attnscope.api), with the CLI's options as keywords:

    import attnscope
    model = attnscope.load("demo")
    result = attnscope.heads(model, "The cat sat on the mat because it was tired.", window=5)
    result.to_records()  # the rows of --csv; in a notebook, `result` shows the role map and the table

The package imports without torch: the names below load their modules (and torch) when first used.
"""

from __future__ import annotations

from typing import Any

from attnscope.errors import AttnscopeError as AttnscopeError

__version__ = "0.1.0"


def _public() -> dict[str, str]:
    """Every name the package offers lazily, by the module that holds it: `load`, a function per command of the
    registry (attnscope.registry, read without torch), `Text`."""
    import importlib

    registry = importlib.import_module("attnscope.registry")  # `from attnscope import` would ask __getattr__ again
    functions = ("load", *(command.function for command in registry.COMMANDS))
    return {**{name: "attnscope.api" for name in functions}, "Text": "attnscope.pipeline.inputs"}


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return ["AttnscopeError", "__version__", *_public()]
    if name in _public():
        import importlib

        return getattr(importlib.import_module(_public()[name]), name)
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_public()})
