"""Where a command's result goes on the command line: --json, --csv, --out, --quiet, and for a command that draws,
--format and --dpi; declared once, like every setting (attnscope.settings), so that the CLI builds these options the
way it builds the others. In Python, `result.save(folder, format, dpi)` takes the same two settings of pictures
(output.files.Pictures).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.output.files import Pictures
from attnscope.settings import Declared, optional_setting, setting


@dataclass(frozen=True, kw_only=True)
class Output(Declared):
    """Where a command's result goes (the command line's; in Python, `result.save(folder)`)."""

    pictures: ClassVar[Pictures] = Pictures()  # how a command that draws nothing would draw: never used

    json: bool = setting(
        options.FLAG, False, "Print JSON (schema_version 1) to stdout instead of tables.", negatable=False
    )
    csv: bool = setting(options.FLAG, False, "Print the rows as CSV to stdout instead of tables.", negatable=False)
    out: Path | None = optional_setting(
        options.FOLDER,
        "Write the command's files (JSON, CSV, pictures) here.",
        flags=("--out", "-o"),
        metavar="DIR",
    )
    quiet: bool = setting(
        options.FLAG,
        False,
        "No progress bar or status lines on stderr (notes on the results stay).",
        flags=("--quiet", "-q"),
        negatable=False,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.json and self.csv:
            raise AttnscopeError("give --json or --csv, not both")


@dataclass(frozen=True, kw_only=True)
class Drawing(Output, Pictures):
    """The output of a command that draws: Output's, and how its pictures are written (Pictures: --format, --dpi)."""

    @property
    def pictures(self) -> Pictures:
        return Pictures(format=self.format, dpi=self.dpi)
