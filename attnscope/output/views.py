"""What each command shows, from its analysis result: one view per result type, each with the same faces.

    document()       the JSON document (`--json`, and the .json file of `--out`)
    records()        the CSV rows (`--csv`, and the .csv file of `--out`)
    files(stage)     the files of `--out`, written into `stage` (see output.files.write_all); returns their paths
    figures()        the pictures of `--out` as matplotlib Figures, by file stem (`result.plot()`)
    terminal(paths)  rich renderables for the terminal (`paths`: the files just written, for commands that say where)
    notebook()       the HTML a notebook shows for the result (`result._repr_html_()`)

Each command's view lives in its own module of this folder, `output/<command>.py` (its room: the view, its
figures, its terminal tables and its notebook HTML), built from the shared builders: `documents` (the JSON envelope,
JSON and CSV text), `files` (staged, atomic writes), `figures` (matplotlib: writing, layout, colour bars) and the
pictures built on it (`head_grids`, `attention_maps`, `head_matrices`, `head_graph`, `line_plots`), `terminal` (rich:
palette, grids, record tables), `notebook` (inline HTML: cells, tables, grids) and `viewer` (the report page's
interactive viewer). `VIEWS` below registers every room.

The output stage sits below the analyses (tests/unit/test_layout.py): an analysis result hands itself to its view
(`analyses.result.Result`), and no module here imports an analysis. A view reads its result by duck typing, the
attributes its docstrings name; `view_of` finds the view by the result's class name and imports only that room, so
showing one result loads no other command's code (nor torch, for `attnscope info`). Views render what the analyses
computed and compute nothing themselves.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import files
from attnscope.output.documents import to_csv, to_json
from attnscope.output.files import Pictures


class View:
    """The faces every view shares; a command's view overrides what its command has."""

    command = ""
    names_files = False  # True: the terminal face is the paths of the files written (commands whose output they are)
    columns: Sequence[str] = ()  # the CSV's header when there are no records (where records can be none)

    def __init__(self, result: Any, pictures: Pictures | None = None):
        self.result = result
        self.pictures = pictures or Pictures()

    @property
    def notes(self) -> list[str]:
        return list(self.result.notes)

    def document(self) -> dict:
        raise NotImplementedError

    def records(self) -> list[dict]:
        raise NotImplementedError

    def write(self, stage: Path, name: str, data: str | bytes) -> Path:
        """Write one file of --out into `stage`, atomically (output.files.write_atomic)."""
        return files.write_atomic(stage / name, data)

    def picture(self, figure: Any, stage: Path, stem: str) -> Path:
        """Write `figure` into `stage` as `stem` in the chosen format (`role_map` -> role_map.png)."""
        from attnscope.output import figures

        path = stage / self.pictures.file_name(stem)
        return figures.save(figure, path, self.pictures.format, self.pictures.dpi)

    def data_files(self, stage: Path) -> list[Path]:
        """The files of --out that are not pictures: the JSON document and the CSV rows."""
        return [
            self.write(stage, f"{self.command}.json", to_json(self.document())),
            self.write(stage, f"{self.command}.csv", to_csv(self.records(), self.columns)),
        ]

    def figures(self) -> dict[str, Any]:
        """The pictures of --out, file stem -> matplotlib Figure (what `Result.plot()` returns); none by default."""
        return {}

    def files(self, stage: Path) -> list[Path]:
        """Every file of --out written into `stage`: the data files, then each figure in the chosen format."""
        figures = self.figures()
        return [*self.data_files(stage), *(self.picture(figure, stage, stem) for stem, figure in figures.items())]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        raise NotImplementedError

    def notebook(self) -> str:
        """One self-contained HTML fragment (see output.notebook)."""
        raise NotImplementedError


def picture_paths(written: Sequence[Path]) -> list[Any]:
    """The terminal output of a command whose output is its files: their paths, one per line."""
    return [str(path) for path in written]


def words_field(labels: Any) -> list[dict]:
    """The words of a window for the JSON: each word's text as shown and its token positions (show, attend)."""
    return [{"text": text, "positions": list(word)} for text, word in zip(labels.word_text, labels.words, strict=True)]


# The rooms: an analysis result's class name -> its view, by the dotted path of the View class in its room, imported
# when a result of that class is first shown (as transformers' auto classes name their modules). A new command adds
# its line.
VIEWS: dict[str, str] = {
    "HeadsResult": "attnscope.output.heads.HeadsView",
    "ShowResult": "attnscope.output.show.ShowView",
    "DiversityResult": "attnscope.output.diversity.DiversityView",
    "RandomMhaResult": "attnscope.output.random_mha.RandomMhaView",
    "AttendResult": "attnscope.output.attend.AttendView",
    "AblationResult": "attnscope.output.ablate.AblateView",
    "ReportResult": "attnscope.output.report.ReportView",
    "BenchResult": "attnscope.output.bench.BenchView",
    "InfoResult": "attnscope.output.info.InfoView",
    "CircuitResult": "attnscope.output.circuit.CircuitView",
    "CompareResult": "attnscope.output.compare.CompareView",
}


def view_class(result_class: str) -> type[View]:
    """The view of results of class `result_class` (a name of VIEWS), its room imported now."""
    module, _, name = VIEWS[result_class].rpartition(".")
    return getattr(importlib.import_module(module), name)


def view_of(result: Any, pictures: Pictures | None = None) -> View:
    """The view of an analysis result; `pictures`: how its files' pictures are written (default PNG at
    output.files.DPI)."""
    return view_class(type(result).__name__)(result, pictures)
