"""Files for `--out`: staged in a hidden folder, then moved into place together, so that a run that fails or is
interrupted leaves nothing half-written behind."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.settings import Declared, setting

# How pictures are written (`--format`, `--dpi`). Here, not in output.figures, so that the CLI can declare the
# options without importing matplotlib.
PICTURE_FORMATS = options.PICTURE_FORMATS
# 150 dots per inch: sharp on a high-density screen and in a draft print, at 2.25 times the pixels of 100 dpi
# (which print showed blocky); a journal's 300 is --dpi 300, or --format pdf/svg, which do not depend on it.
DPI = options.DEFAULT_DPI
DPI_RANGE = options.DPI_RANGE


@dataclass(frozen=True, kw_only=True)
class Pictures(Declared):
    """How `--out` writes a command's pictures: the file format (`png`, or the vector `svg` and `pdf`) and the
    dots per inch of a PNG (a figure's pixels are its size in inches times `dpi`); declared once, for --format and
    --dpi and for `result.save(folder, format, dpi)`."""

    format: str = setting(
        options.FORMAT, "png", "File format of the pictures of --out (svg and pdf: vector, for print)."
    )
    dpi: int = setting(
        options.DPI,
        DPI,
        "Dots per inch of PNG pictures: pixels = the figure's inches × N (300 for print).",
        metavar="N",
    )

    def file_name(self, stem: str) -> str:
        """`stem` with this format's suffix: attention_0.1 -> attention_0.1.svg."""
        return f"{stem}.{self.format}"


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first."""
    return [path for path in (folder, *folder.parents) if not path.exists()]


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders a run created (deepest first) as long as they are empty."""
    for made in folders:
        try:
            made.rmdir()
        except OSError:
            return


# The endings of the files a user may take --out for: a new folder named so is refused (`heads --out results.json`
# made a folder results.json/, `report --out report.html` wrote report.html/report.html)
FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".tsv", ".txt", ".png", ".svg", ".pdf", ".html", ".htm")


def prepare_out_dir(path: str | os.PathLike, named: str = "--out") -> Path:
    """Prove that `path` can be created and written to before any work is done, and leave the disk as it was: the
    folder is made when the files are written (`write_all`), so a run that fails leaves no empty folder behind. A
    new folder named like a file (FILE_SUFFIXES) and a link to nothing are refused, saying what they are. Messages
    name the folder as `named` (the CLI's `--out`, a Python keyword)."""
    folder = options.expanded_path(path, named)
    if folder.exists() and not folder.is_dir():
        raise AttnscopeError(f"cannot write to {named} {path}: it is a file, not a folder")
    if folder.is_symlink() and not folder.exists():
        raise AttnscopeError(
            f"cannot write to {named} {path}: it is a link to {os.readlink(folder)}, which does not exist; make that "
            "folder, or give another"
        )
    if not folder.exists() and folder.suffix.lower() in FILE_SUFFIXES:
        raise AttnscopeError(
            f"{named} {path} is named like a file ({folder.suffix.lower()}), but {named} is a folder that the "
            f"command writes its files into (JSON, CSV, pictures); give a folder, e.g. {folder.with_suffix('')}/"
        )
    missing = _missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".attnscope-probe-"):
            pass
    except OSError as error:
        raise AttnscopeError(f"cannot write to {named} {path}: {error.strerror or error}") from None
    finally:
        _remove_empty(missing)
    return folder


# Signals that stop a run (Ctrl-C, `kill`, a closed terminal): held back while the files land, so that they land
# together (the CLI turns each into one line and the exit status of a program killed by it).
STOPPING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def write_all(folder: Path, write: Callable[[Path], Sequence[Path]], named: str = "--out") -> list[Path]:
    """Run `write(stage)`, which writes its files into `stage`, a hidden folder inside `folder`, then move them
    all into `folder`: all of them or none. Every destination is checked before the first move (a folder in the
    way is refused), and a move that still fails (a file another user owns in a sticky folder, ...) puts back what
    the earlier ones replaced. An error, Ctrl-C, SIGTERM or SIGHUP while writing leaves nothing behind (no file, no
    folder this created); the moves are renames on one file system, with those signals held back until the last is
    done, so the files land together. Returns the paths in `folder`."""
    import shutil

    missing = _missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=folder, prefix=".attnscope-"))
    except OSError as error:
        _remove_empty(missing)
        raise AttnscopeError(f"cannot write to {named} {folder}: {error.strerror or error}") from None
    landed = False
    try:
        try:
            written = list(write(stage))
        except OSError as error:  # a full disk, a quota, a folder that went read-only: nothing is left behind
            raise AttnscopeError(f"cannot write to {named} {folder}: {error.strerror or error}") from None
        _check_destinations(folder, written, named)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, set(STOPPING_SIGNALS))
        try:
            _move_all(folder, stage, written, named)
            landed = True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if not landed:
            _remove_empty(missing)
    return [folder / path.name for path in written]


def _check_destinations(folder: Path, written: Sequence[Path], named: str) -> None:
    """Refuse, before anything is moved, a destination that a file cannot replace: a folder of that name."""
    for path in written:
        destination = folder / path.name
        if destination.is_dir() and not destination.is_symlink():
            raise AttnscopeError(
                f"cannot write to {named} {folder}: {destination} is a folder, and {path.name} would replace it; move "
                f"it away or choose another {named} (nothing was written)"
            )


def _move_all(folder: Path, stage: Path, written: Sequence[Path], named: str) -> None:
    """Move every staged file into `folder`, keeping what each replaces in `stage` until all have moved; on a
    failure, undo the moves made (the replaced files back in place) and refuse in one line."""
    done: list[tuple[Path, Path | None]] = []  # (destination, the file it replaced, kept in the stage)
    destination = folder
    try:
        for number, path in enumerate(written):
            destination = folder / path.name
            kept = None
            if os.path.lexists(destination):
                kept = stage / f".replaced-{number}"
                os.replace(destination, kept)
            done.append((destination, kept))
            os.replace(path, destination)
    except OSError as error:
        for moved, kept in reversed(done):
            try:
                if kept is not None:
                    os.replace(kept, moved)
                elif os.path.lexists(moved):
                    os.unlink(moved)
            except OSError:
                pass  # best effort: the first error is the one to report
        raise AttnscopeError(
            f"cannot write to {named} {folder}: {destination.name}: {error.strerror or error}; nothing was changed"
        ) from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write to a temporary name in the same folder, then rename: a reader never sees half a file."""
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if isinstance(data, bytes) else {"encoding": "utf-8", "newline": ""})) as file:
            file.write(data)
        os.chmod(temp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the permissions open() would
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path
