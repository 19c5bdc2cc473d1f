"""The command line: a thin shell over the Python API (attnscope.api). Each command is an API function with
options made from the declarations of its settings (`commands`, `declare`); what it returns is rendered by its view
(`display`); every error ends at one boundary (`boundary`). The only package that knows about Typer.
"""

from attnscope.cli.boundary import main, run
from attnscope.cli.commands import app

__all__ = ["app", "main", "run"]
