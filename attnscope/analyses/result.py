"""What every analysis result offers in Python: the faces the command line shows, each delegating to the result's
view (`output.views`, the same view `--json`, `--csv` and `--out` use), so a notebook sees what the CLI shows.

    result.to_records()    the rows of --csv: one dict per row (floats unrounded; the CSV rounds to 6 decimals)
    result.to_document()   the --json document, as a dict
    result.to_json()       the same as text, byte for byte what --json prints
    result.to_dataframe()  the records as a pandas DataFrame (pandas is optional: pip install pandas)
    result.save(out)       the files of --out (JSON, CSV, pictures) written into the folder `out`; returns their paths
    result.plot()          the pictures of --out as matplotlib Figures, by file stem
    result                 in a notebook: its tables as HTML (`_repr_html_`, from `output.notebook`); in a plain REPL
                           (`repr`, `print`): a few lines, the headline numbers and where to see more (`View.summary`)

Every result class is a `@dataclass(repr=False)`, so that the dataclass does not write its own `__repr__` (every
field, arrays and all: thousands of characters) over the one here.

Why a result can call its view: rendering is a stage below the analyses (tests/unit/test_layout.py:
... pipeline < output < analyses < api < cli), because that is the way the imports really go: a result hands itself
to its view, and a view never imports a result class. Views read results by duck typing (the attributes their
docstrings name), and a result's class names its view by reference (`view_class`). So every dependency points
one way and there is no cycle, while `result.to_json()` still works on any result. The renderers' modules are light
(matplotlib and rich come inside the functions that draw), so importing an analysis loads no renderer's library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.output import documents, files, notebook
from attnscope.output.views import view_of


@dataclass(frozen=True)
class HeadAt:
    """A head of the model, 0-based, with its `L.H` label: the base of the records a result holds per head."""

    layer: int
    head: int

    @property
    def label(self) -> str:
        return f"{self.layer}.{self.head}"


def heads_by_value(values: Any) -> list[tuple[int, int]]:
    """Every (layer, head) of the (L, H) array `values`, the largest value first, ties in layer.head order."""
    n_layer, n_head = values.shape
    return sorted(
        ((layer, head) for layer in range(n_layer) for head in range(n_head)), key=lambda lh: (-values[lh], lh)
    )


class Result:
    """The base of every analysis result (a dataclass): adds the faces above, no fields."""

    def _view(self) -> Any:
        return view_of(self)

    def to_records(self) -> list[dict[str, Any]]:
        """The rows `--csv` prints: one flat dict per row, the same keys in the same order."""
        return self._view().records()

    def to_document(self) -> dict[str, Any]:
        """The document `--json` prints (schema_version 1), as a dict: floats rounded to 6 decimals, NaN as None."""
        return self._view().document()

    def to_json(self) -> str:
        """The document `--json` prints, as the same text."""
        return documents.to_json(self.to_document())

    def to_dataframe(self) -> Any:
        """The records as a pandas DataFrame, one row per record (the columns of `--csv` even when there is none).
        pandas is not a dependency of attnscope: without it, one AttnscopeError says how to install it."""
        try:
            import pandas
        except ImportError:
            raise AttnscopeError(
                "to_dataframe needs pandas, which attnscope does not install: pip install pandas"
            ) from None
        view = self._view()
        records = view.records()
        return pandas.DataFrame(records) if records else pandas.DataFrame(columns=list(view.columns))

    def save(self, out: str | os.PathLike, format: str = "png", dpi: int | None = None) -> list[Path]:
        """Write the files `--out` writes (JSON, CSV, pictures) into the folder `out`, made if needed, all at once
        (nothing half-written on an error); returns their paths. `format` (png, svg or pdf) and `dpi` are the
        pictures' (--format, --dpi; dpi None: output.files.DPI)."""
        if isinstance(out, bytes) or not isinstance(out, (str, os.PathLike)) or not os.fspath(out).strip():
            raise AttnscopeError(
                f"out {options.shown(out)}: give a folder to write into, e.g. save('results/') ('.': this one)"
            )
        view = view_of(self, files.Pictures(format=format, dpi=files.DPI if dpi is None else dpi))
        return files.write_all(files.prepare_out_dir(out, "out"), view.files, "out")

    def plot(self) -> dict[str, Any]:
        """The pictures `save` writes, as matplotlib Figures by file stem (`role_map`, `score_previous_token`, ...;
        {} for a result that draws none), to show in a notebook or to change before saving (`figure.savefig`)."""
        return self._view().figures()

    def __repr__(self) -> str:
        """What a plain REPL shows (and `print`): a few lines of at most 100 columns with the headline numbers of the
        command's terminal view and the attributes that hold the rest (see output.views.summary). A summary that
        fails says so in its place: a repr that raises breaks the REPL, the debugger and test reports."""
        try:
            return self._view().summary()
        except Exception as error:  # whatever it is, shown in the repr rather than raised
            return f"<{type(self).__name__} (no summary: {type(error).__name__}: {error})>"

    def _repr_html_(self) -> str:
        """What a notebook shows: the result's tables as one self-contained HTML fragment (see output.notebook)."""
        return notebook.html(self._view())
