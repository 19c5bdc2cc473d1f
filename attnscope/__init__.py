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

from attnscope.errors import AttnscopeError

__version__ = "0.1.0"

_API = (
    "load", "heads", "show", "diversity", "attend", "ablate", "circuit", "report", "compare", "info", "random_mha",
    "bench", "patch", "discover", "kvplan",
)  # fmt: skip
_LAZY = {**{name: "attnscope.api" for name in _API}, "Text": "attnscope.pipeline.inputs"}

__all__ = ["AttnscopeError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
