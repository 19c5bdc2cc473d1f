"""attnscope: what every attention head of a transformer does.

The package imports without torch; the names below load their modules (and torch) when first used:

    import attnscope
    model = attnscope.load_model("demo")
    result = attnscope.analyze_heads(model, [attnscope.Text("The cat sat on the mat.", "argument")])
"""

from __future__ import annotations

from typing import Any

from attnscope.errors import AttnscopeError

__version__ = "0.1.0"

_LAZY = {
    "load_model": "attnscope.models.loading",
    "Text": "attnscope.pipeline.inputs",
    "analyze_heads": "attnscope.analyses.heads",
    "analyze_diversity": "attnscope.analyses.diversity",
}

__all__ = ["AttnscopeError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")
