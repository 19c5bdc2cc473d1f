"""attnscope: what every attention head of a transformer does.

The package is importable without torch being loaded; the heavy modules (`capture`, `analysis`, `plots`) import
torch, transformers and matplotlib themselves.
"""

__version__ = "0.1.0"

from attnscope.errors import AttnscopeError

__all__ = ["AttnscopeError", "__version__"]
