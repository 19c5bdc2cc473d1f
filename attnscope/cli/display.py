"""What the command line shows: a status line and a progress bar on stderr while a command runs (`Live`), then the
result (`emit`): notes on stderr, the files into --out, then --json, --csv or the terminal view on stdout.

Rendering is the result's view (attnscope.output.views): this module only chooses where each part goes. Lines on
stderr are one line each, control characters escaped; nothing but the result reaches stdout.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from attnscope.errors import AttnscopeError

LINE_MAX = 4000  # characters of one line on stderr; a longer one repeats a value nobody reads whole


def counted(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def one_line(text: str) -> str:
    """`text` as one line of a terminal: control characters (a newline in a file name, an escape sequence in a
    model's name) written as escapes, and at most LINE_MAX characters."""
    line = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    return line if len(line) <= LINE_MAX else f"{line[: LINE_MAX - 1]}…"


def note(message: str) -> None:
    print(one_line(f"note: {message}"), file=sys.stderr)


def console(stderr: bool = False, width: int | None = None) -> Any:
    from rich.console import Console

    # markup off: a model's name, a text or a folder holding `[red]` is shown as it is, not as a style
    return Console(stderr=stderr, highlight=False, markup=False, width=width or _width())


MIN_WIDTH = 40  # columns every view is drawn in at least (GPT-2 small's role map fits in 40)
WIDEST = 200  # columns a view is widened to at most, to keep its cells whole


def needed_width(shown: Any, items: list[Any]) -> int:
    """The columns `items` need on `shown` so that nothing is cut: at least MIN_WIDTH, and where a table would cut
    a cell at that width (rich writes `0…` for 0.396, and narrows a column below its widest word), the narrowest
    width at which it cuts none; the widest word of a title. Lines of text (a file's path) wrap; views that choose
    their own columns by the width (heads' table, which says what it left out; the role map) measure nothing."""
    base = max(shown.width, MIN_WIDTH)
    return max([base, *(_whole_width(shown, item, base) for item in items if not isinstance(item, str))])


def _whole_width(shown: Any, item: Any, base: int) -> int:
    from rich.console import Group
    from rich.measure import Measurement
    from rich.table import Table

    if isinstance(item, Group):
        return max([0, *(_whole_width(shown, part, base) for part in item.renderables)])
    measured = Measurement.get(shown, shown.options.update(max_width=WIDEST), item)
    if not isinstance(item, Table):
        return measured.minimum
    whole = _cut_cells(item, measured.maximum)
    if measured.maximum <= base or _cut_cells(item, base) == whole:
        return base
    low, high = base, measured.maximum  # rich narrows the widest columns first, whatever their words: search
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if _cut_cells(item, middle) == whole else (middle + 1, high)
    return high


def _cut_cells(table: Any, width: int) -> int:
    """The cells of `table` that rich cuts (with `…`) at `width` columns, plus those cut by design."""
    import io

    from rich.console import Console

    probe = Console(width=width, file=io.StringIO(), highlight=False, markup=False, color_system=None)
    with probe.capture() as captured:
        probe.print(table)
    return captured.get().count("…")


def _width() -> int | None:
    """The terminal's width where COLUMNS says nothing usable (0, -5, 'wide', 10^9): rich would take `COLUMNS=0` for
    a width of 0 and print nothing at all. None: rich's own answer (COLUMNS, the terminal's width, or 80)."""
    import shutil

    columns = os.environ.get("COLUMNS")
    if columns is None or (columns.strip().isdigit() and 1 <= int(columns) <= 10_000):
        return None
    return min(max(shutil.get_terminal_size((80, 24)).columns, 20), 10_000)


def is_main() -> bool:
    """Only rank 0 prints and writes under torchrun (RANK is trusted only where torchrun set every variable)."""
    from attnscope.api import is_main_process

    return is_main_process()


# Off a terminal (a pipe, CI, a notebook's subprocess) progress is plain lines: none in a command's first
# PLAIN_FIRST_S seconds (a quick command says nothing), then at most one every PLAIN_EVERY_S seconds
PLAIN_FIRST_S, PLAIN_EVERY_S = 10.0, 30.0
PLAIN_SWITCH = "ATTNSCOPE_PROGRESS"  # `off` in the environment: no such lines (the planned work's note stays)


class Live:
    """What stderr shows while a command runs (not with --quiet, and only on rank 0 under torchrun).

    On a terminal: a status line saying what is being done (`loading demo …`), replaced by the next; then, once the
    texts run, a rich progress bar: the share of the input read (bytes of a file, texts of a list) with the time left
    at this pace, the texts read so far, the tokens forwarded per second (special tokens included, padding not).
    Off a terminal: the same news as plain lines (`progress: heads: 40% of the input, …`), at a modest rate
    (PLAIN_FIRST_S, PLAIN_EVERY_S). Either way, the planned work a command announces before a long run
    (`settings.Planned`) stays, as a note. A context manager; `status` and `progress` are the callbacks the Python
    API takes (None when hidden)."""

    def __init__(self, quiet: bool, label: str):
        main = not quiet and is_main()
        self.shown = main and sys.stderr.isatty()
        plain = main and not self.shown
        self.lines = plain and os.environ.get(PLAIN_SWITCH, "").strip().lower() != "off"  # progress lines
        self.label = label
        self.line_drawn = False
        self.bar: Any = None
        self.began = time.perf_counter()
        self.last_plain: float | None = None
        self.first_progress: tuple[float, int] | None = None  # off a terminal: (when, tokens) at the first batch
        self.news = ""  # off a terminal: the latest status or progress, written when its time comes
        self.status = self._status if self.shown else self._plain_status if plain else None
        self.progress = self._progress if self.shown else self._plain_progress if self.lines else None

    def __enter__(self) -> Live:
        return self

    def _status(self, text: str) -> None:
        import shutil

        from attnscope.api import Planned

        if isinstance(text, Planned):  # kept: a note
            self._clear_line()
            note(text)
            return
        if self.bar is not None:
            return
        width = shutil.get_terminal_size().columns - 1  # a line that wrapped could not be cleared
        text = text if len(text) <= width else text[: max(width - 1, 0)] + "…"
        sys.stderr.write(f"\r\x1b[2K{one_line(text)}")
        sys.stderr.flush()
        self.line_drawn = True

    def _clear_line(self) -> None:
        if self.line_drawn:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self.line_drawn = False

    def _start_bar(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self._clear_line()
        self.bar = Progress(
            TextColumn(self.label),
            BarColumn(),
            TextColumn("{task.fields[share]}"),
            TextColumn("{task.fields[texts]}"),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            console=console(stderr=True),
            transient=True,
            auto_refresh=False,  # a refresh thread competing with torch's threads made runs several times slower
        )
        self.bar.__enter__()
        self.task = self.bar.add_task(self.label, total=None, share="", texts="", rate="")
        self.started = self.refreshed = time.perf_counter()
        self.first_tokens: int | None = None  # tokens run before the bar started: not counted in its rate

    def _progress(self, texts: int, tokens: int, share: float) -> None:
        """`texts` read from the input so far, `tokens` forwarded so far, `share` of the input read (0 to 1)."""
        if self.bar is None:
            self._start_bar()
        if self.first_tokens is None:  # the first batch ran before the bar: a rate from it alone divided by ~0 s
            self.first_tokens = tokens
        elapsed = time.perf_counter() - self.started
        ran = tokens - self.first_tokens
        self.bar.update(
            self.task,
            completed=share,
            total=1.0,
            share=f"{share:.0%} of the input",
            texts=f"{counted(texts, 'text')} read",
            rate=f"{ran / elapsed:,.0f} tokens/s" if ran and elapsed > 0 else "",
        )
        now = time.perf_counter()
        if now - self.refreshed > 0.1 or share >= 1.0:  # at most 10 redraws a second
            self.refreshed = now
            self.bar.refresh()

    def _plain_status(self, text: str) -> None:
        from attnscope.api import Planned

        if isinstance(text, Planned):
            note(text)
            return
        self.news = text.removesuffix(" …")
        self._plain_line()

    def _plain_progress(self, texts: int, tokens: int, share: float) -> None:
        now = time.perf_counter()
        if self.first_progress is None:  # the first batch: the rate counts from here, as the bar's does
            self.first_progress = (now, tokens)
        since, before = self.first_progress
        self.news = f"{share:.0%} of the input, {counted(texts, 'text')} read, {tokens:,} tokens run"
        if now > since and tokens > before:
            self.news += f" ({(tokens - before) / (now - since):,.0f} tokens/s)"
        self._plain_line()

    def _plain_line(self) -> None:
        """The latest news as one line, when the time since the command began and since the last line allow."""
        now = time.perf_counter()
        if (
            not self.lines
            or now - self.began < PLAIN_FIRST_S
            or (self.last_plain is not None and now - self.last_plain < PLAIN_EVERY_S)
        ):
            return
        self.last_plain = now
        sys.stderr.write(one_line(f"progress: {self.label}: {self.news}; {_duration(now - self.began)} so far") + "\n")
        sys.stderr.flush()

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
            self.bar = None
        self._clear_line()


def _duration(seconds: float) -> str:
    """`42 s`, `3 min 05 s`, `1 h 02 min`."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def emit(result: Any, output: Any, folder: Path | None) -> None:
    """The common ending: notes on stderr, the files into `folder`, then --json, --csv or the terminal view."""
    from attnscope.output.documents import to_csv, to_json
    from attnscope.output.files import write_all
    from attnscope.output.views import view_of

    view = view_of(result, output.pictures)
    for message in view.notes:
        note(message)
    written = write_all(folder, view.files) if folder is not None else []
    shown_as_paths = view.names_files and not (output.json or output.csv)  # the paths themselves go to stdout
    if written and not output.quiet and not shown_as_paths:
        note(f"wrote {counted(len(written), 'file')} to {folder}")
    try:
        if output.json:
            sys.stdout.write(to_json(view.document()))
        elif output.csv:
            sys.stdout.write(to_csv(view.records(), view.columns))
        else:
            shown = console()
            items = list(view.terminal(written))
            width = needed_width(shown, items)
            if width > shown.width:  # drawn wider, whole: the terminal wraps the lines, and says nothing was cut
                note(
                    f"the terminal is {shown.width} columns wide and these tables need {width}: they are printed "
                    f"{width} wide (the terminal wraps their lines); widen the terminal, or use --json or --csv"
                )
                shown = console(width=width)
            for item in items:
                # a line of text (a file's path above all) is never cut in two: scripts read it back
                shown.print(item, soft_wrap=isinstance(item, str))
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as error:  # stdout on a full disk (`> /dev/full`), a quota, an I/O error
        silence_stdout()
        raise AttnscopeError(f"cannot write to standard output: {error.strerror or error}") from None


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is left does not fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
