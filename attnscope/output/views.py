"""What each command shows, from its analysis result: one view per result type, each with the same faces.

    document()       the JSON document (`--json`, and the .json file of `--out`)
    records()        the CSV rows (`--csv`, and the .csv file of `--out`)
    files(stage)     the files of `--out`, written into `stage` (see output.files.write_all); returns their paths
    figures()        the pictures of `--out` as matplotlib Figures, by file stem (`result.plot()`)
    terminal(paths)  rich renderables for the terminal (`paths`: the files just written, for commands that say where)
    notebook()       the HTML a notebook shows for the result (`result._repr_html_()`)
    summary()        the few lines a plain REPL shows for the result (`repr(result)`): the headline numbers of the
                     terminal view and where to see more, never an array

Each command's view lives in its own module of this folder, `output/<command>.py` (its room: the view, its
figures, its terminal tables and its notebook HTML), built from the shared builders: `documents` (the JSON envelope,
JSON and CSV text), `files` (staged, atomic writes), `figures` (matplotlib: writing, layout, colour bars) and the
pictures built on it (`head_grids`, `attention_maps`, `head_matrices`, `head_graph`, `line_plots`), `terminal` (rich:
palette, grids, record tables), `notebook` (inline HTML: cells, tables, grids) and `viewer` (the report page's
interactive viewer).

The output stage sits below the analyses (tests/unit/test_layout.py): an analysis result hands itself to its view
(`analyses.result.Result`), and no module here imports an analysis. A view reads its result by duck typing, the
attributes its docstrings name; a result names its view by reference (`view_class`, a class attribute of its
class), so showing one result loads no other command's room (nor torch, for `attnscope info`). Views render what the
analyses computed and compute nothing themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import files
from attnscope.output.documents import to_csv, to_json
from attnscope.output.files import Pictures
from attnscope.scores.catalog import counted


def shown_rows(result: Any, usual: int) -> int:
    """How many rows of a ranked list the terminal and a notebook show: --top's K, else the command's usual number.
    --top means one thing everywhere: the first K rows of each ranked list, on the terminal, in a notebook, in --json
    and in --csv; left out, --json and --csv hold every row (`result.settings["top"]` is None), the terminal and a
    notebook the usual number. The files of --out keep every row."""
    return result.settings.get("top") or usual


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

    def full_document(self) -> dict:
        """The document of --out's JSON file: every row of every list, whatever --top (`document()` where --top
        cuts nothing)."""
        return self.document()

    def full_records(self) -> list[dict]:
        """The rows of --out's CSV file: every row, whatever --top (`records()` where --top cuts nothing)."""
        return self.records()

    def data_files(self, stage: Path) -> list[Path]:
        """The files of --out that are not pictures: the JSON document and the CSV rows, every row of each."""
        return [
            self.write(stage, f"{self.command}.json", to_json(self.full_document())),
            self.write(stage, f"{self.command}.csv", to_csv(self.full_records(), self.columns)),
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

    def summary(self) -> str:
        """What `repr(result)` shows in a plain REPL (see `summary`): by default the model's name and shape, the
        notes, and the faces that show more; a command's view adds the headline numbers its terminal view leads
        with."""
        return summary(self, model_shape(getattr(self.result, "model", None) or {}))

    @property
    def faces(self) -> list[str]:
        """The faces of every result that show more (a summary's last line); `.plot()` where there are pictures."""
        pictures = [".plot()"] if type(self).figures is not View.figures else []
        return [".to_records()", ".to_json()", ".save(dir)", *pictures]


# ------------------------------------------------------------------------------------------------------------ summaries
# A result's repr: a REPL prints it whole, so it is a few short lines whatever the model's size (a list of heads is
# cut to what fits), and it holds numbers written out, never an array.

SUMMARY_WIDTH = 100  # columns of a summary's line at most
INDENT = "  "  # before each line of a summary after the first


class TopView(View):
    """A view whose ranked lists --top cuts (`shown_rows`): --json and --csv hold their first --top rows, the files
    of --out every row. `document(every)` and `rows(every)` give both; a room that --top cuts defines those two."""

    def document(self, every: bool = False) -> dict:
        raise NotImplementedError

    def rows(self, every: bool) -> list[dict]:
        """The CSV's rows: as --top cuts them, or (`every`) all of them."""
        raise NotImplementedError

    def records(self) -> list[dict]:
        return self.rows(every=False)

    def full_document(self) -> dict:
        return self.document(every=True)

    def full_records(self) -> list[dict]:
        return self.rows(every=True)


def clipped(line: str, width: int = SUMMARY_WIDTH) -> str:
    """`line` cut to `width` columns, ending in `…` where cut."""
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


def fitted(prefix: str, items: Sequence[str], separator: str = " · ", width: int = SUMMARY_WIDTH - len(INDENT)) -> str:
    """`prefix` and as many whole `items` as fit in `width` columns, then `… N more` for those left out
    (`roles: induction 3 · mixed 3 · … 2 more`); "" when there is no item."""
    if not items:
        return ""
    for count in range(len(items), 0, -1):
        rest = len(items) - count
        line = prefix + separator.join(items[:count]) + (f"{separator}… {rest:,} more" if rest else "")
        if len(line) <= width:
            return line
    return clipped(prefix + f"… {len(items):,} more", width)


def summary(view: View, headline: str, lines: Sequence[str] = (), more: Sequence[str] = ()) -> str:
    """A result's repr: `<ResultClass headline`, each of `lines` (those not empty) indented, the result's notes (how
    many, and the first), then `more` (attributes and methods that hold the rest) and the faces every result has,
    closed by `>`; each on one line (a name or a note that holds a line break is joined up) of at most SUMMARY_WIDTH
    columns."""
    notes = list(getattr(view.result, "notes", None) or [])
    if notes:
        lines = [*lines, f"{counted(len(notes), 'note')} (.notes): {notes[0]}"]
    body = [f"<{type(view.result).__name__} {headline}", *lines, "see " + " ".join([*more, *view.faces])]
    body = [" ".join(str(line).split()) for line in body]
    shown = [clipped(body[0]), *(clipped(INDENT + line) for line in body[1:] if line)]
    return "\n".join([*shown[:-1], clipped(shown[-1], SUMMARY_WIDTH - 1) + ">"])


def model_shape(model: dict) -> str:
    """`demo: 2 layers × 4 heads` (what a model dict gives of it)."""
    name = model.get("name")
    shape = []
    if "n_layer" in model:
        shape.append(counted(model["n_layer"], "layer"))
    if "n_head" in model:
        shape.append(counted(model["n_head"], "head"))
    return f"{name}: {' × '.join(shape)}" if name and shape else name or " × ".join(shape)


def inputs_read(inputs: dict, before: str = ", ") -> str:
    """`, 6 texts (324 tokens)`: what an analysis read, from its input summary, after `before`; "" where it does not
    say."""
    if "n_texts" not in inputs:
        return ""
    tokens = f" ({counted(inputs['n_tokens'], 'token')})" if "n_tokens" in inputs else ""
    return before + counted(inputs["n_texts"], "text") + tokens


def picture_paths(written: Sequence[Path]) -> list[Any]:
    """The terminal output of a command whose output is its files: their paths, one per line."""
    return [str(path) for path in written]


def words_field(labels: Any) -> list[dict]:
    """The words of a window for the JSON: each word's text as shown and its token positions (show, attend)."""
    return [{"text": text, "positions": list(word)} for text, word in zip(labels.word_text, labels.words, strict=True)]


def view_of(result: Any, pictures: Pictures | None = None) -> View:
    """The view of an analysis result (the View class its class names, `view_class`); `pictures`: how its files'
    pictures are written (default PNG at output.files.DPI)."""
    return type(result).view_class(result, pictures)
