"""The command line's one error boundary and its entry point: every error a user can cause (an AttnscopeError, a
bad option, out of memory, a closed pipe, Ctrl-C, SIGTERM, SIGHUP) ends as one line on stderr and its exit status
(2 for an error); a bug keeps its traceback, for the bug report. Before any command runs, the standard streams are
made usable (closed ones, an ASCII locale) and matplotlib is given a folder it can write.

Heavy imports (torch, transformers, matplotlib) happen inside the commands, so `attnscope --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

try:  # typer >= 0.25 carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # older typer runs on click itself
    from click import exceptions as click_errors

from attnscope.cli.commands import app
from attnscope.cli.declare import OptionError
from attnscope.cli.display import one_line, silence_stdout
from attnscope.errors import AttnscopeError, RendezvousError

# Out-of-memory advice names the options of the command that ran out (bench has no --max-tokens).
_MEMORY_ADVICE = {
    "bench": "try smaller --batch-sizes or --seq-lens, or a smaller --dtype",
    "random-mha": "try a smaller --seq-len, --d-model or fewer --heads",
}
_MEMORY_ADVICE_DEFAULT = "try a smaller --batch-size or --max-tokens, shorter texts, or a smaller --dtype"
# The signal that stopped the run (SIGINT: Ctrl-C; SIGTERM: `kill`; SIGHUP: the terminal closed), 0 while none
# did: whatever a library makes of the interrupt, it was that signal.
_interrupted = 0
# Whether an interrupt a destructor swallowed is still to be sent again (see _on_unraisable).
_resending = False
# Whether the command has finished and shown its result: a stopping signal then changes nothing (it once turned a
# complete run, its files written, into exit status 130 or 143 without a word, in the second the exit takes).
_finished = False
STOPPING_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def _on_interrupt(signum: int, frame: Any) -> None:
    """Ctrl-C, SIGTERM or SIGHUP: remember which, then interrupt as Python does for Ctrl-C, so that every `finally`
    runs (the staging folder of --out and the folders it made are removed). Code that catches the
    KeyboardInterrupt and raises something else (an import cut short turns into an ImportError inside
    transformers) still ends as interrupted."""
    global _interrupted
    if _finished:
        return
    _interrupted = _interrupted or signum
    raise KeyboardInterrupt


def _on_unraisable(unraisable: Any) -> None:
    """An exception Python could not raise (one from a destructor, `__del__`, or a weakref callback) is printed and
    dropped. When it is the KeyboardInterrupt of Ctrl-C, SIGTERM or SIGHUP (the signal landed while a destructor
    ran, as the tokenizer's regex objects are freed between texts), the run would go on to the end and write its
    results: send the signal again a moment later instead, so that it lands outside the destructor, and say
    nothing. Every other exception is printed as Python prints it."""
    global _resending
    if _interrupted and issubclass(unraisable.exc_type, KeyboardInterrupt):
        import threading

        _resending = True
        threading.Timer(0.01, _resend, (_interrupted,)).start()
        return
    sys.__unraisablehook__(unraisable)


def _resend(signum: int) -> None:
    """Send `signum` again, to the main thread, where it interrupts a blocking call (a sleep, a read) at once."""
    import signal
    import threading

    if not _resending:  # the run has stopped meanwhile
        return
    if hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident, signum)
    else:
        signal.raise_signal(signum)


def handle_stopping_signals() -> None:
    """Make Ctrl-C, SIGTERM and SIGHUP end the run through `_on_interrupt` (so every `finally` cleans up), even an
    interrupt a destructor swallowed."""
    import signal

    # Ctrl-C must stop a run even when the parent started us with SIGINT ignored (as shells do for `&` jobs); SIGTERM
    # and SIGHUP stop it the same way, unless they were ignored on purpose (nohup ignores SIGHUP).
    signal.signal(signal.SIGINT, _on_interrupt)
    for name in STOPPING_SIGNALS[1:]:
        if hasattr(signal, name) and signal.getsignal(getattr(signal, name)) is not signal.SIG_IGN:
            signal.signal(getattr(signal, name), _on_interrupt)
    sys.unraisablehook = _on_unraisable


def _stopped() -> int:
    """Say, in one line, that the run was interrupted, and return the exit status of a program killed by that
    signal (128 + its number: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP)."""
    import signal

    from attnscope.api import stopped_waiting

    global _resending
    _resending = False
    signum = _interrupted or signal.SIGINT
    name = "" if signum == signal.SIGINT else f" ({signal.Signals(signum).name})"
    try:
        # torchrun interrupts every process: one line says so; a process stopped while it waited for the others at
        # the rendezvous has met no rank 0 that would, and says it itself
        if _rank() == 0 or stopped_waiting():
            print(f"attnscope: interrupted{name}", file=sys.stderr)
    except (OSError, ValueError):  # SIGHUP: the terminal that stderr was is gone
        pass
    return 128 + signum


def _rank() -> int:
    """This process's rank under torchrun, 0 for the only process (and where torchrun's variables are not whole:
    that error is every process's, and rank 0's line says it)."""
    from attnscope.api import process_rank

    try:
        return process_rank()
    except AttnscopeError:
        return 0


def _checked_spelling(argv: list[str]) -> None:
    """What click would read otherwise than the user meant, refused in one line before it parses: options before the
    command's name (`attnscope --model demo heads`: click says only "No such option"), a long option with one dash
    (`-out x`: click reads `-o ut` and a text `x`), and an option that takes one value given twice (`--file a --file
    b`: click keeps the last and drops the first without a word). Anything else is left to click."""
    import typer

    root = typer.main.get_command(app)
    commands = root.commands
    at = next((k for k, token in enumerate(argv) if token in commands), None)
    if at is None:
        return
    first = argv[0]
    if at > 0 and first.startswith("-") and first not in {name for param in root.params for name in param.opts}:
        raise AttnscopeError(
            f"{first}: options go after the command's name: attnscope {argv[at]} {' '.join(argv[:at])} ..."
        )
    options = {name: param for param in commands[argv[at]].params for name in (*param.opts, *param.secondary_opts)}
    _refuse_repeated(_options_given(argv[at + 1 :], options))


def _options_given(arguments: list[str], options: dict[str, Any]) -> dict[Any, list[str]]:
    """Each option of the command among its `arguments` (up to `--`), with the spellings it was given by, in order
    (a value is skipped, though it may look like an option); a long option with one dash refused in one line."""
    given: dict[Any, list[str]] = {}
    tokens = iter(arguments)
    for token in tokens:
        if token == "--":
            break
        if not token.startswith("-") or token == "-":
            continue
        name, equals, _ = token.partition("=")
        long = token.startswith("--")
        if not long and len(name) > 2 and f"-{name}" in options:
            raise AttnscopeError(f"{name}: an option's long name takes two dashes: -{name}")
        param = options.get(name if long else token[:2])
        if param is None:
            continue  # click says what is wrong with it
        given.setdefault(param, []).append(name if long else token[:2])
        if not param.is_flag and not equals and (long or len(token) == 2):
            next(tokens, None)  # its value, which may look like an option
    return given


def _refuse_repeated(given: dict[Any, list[str]]) -> None:
    """An option that takes one value, given more than once, refused in one line: click would keep the last."""
    for param, spellings in given.items():
        if len(spellings) > 1 and not param.multiple:
            spelled = max(param.opts, key=len)
            raise AttnscopeError(
                f"{spelled} is given {len(spellings)} times ({', '.join(spellings)}): it takes one value, and the "
                "last would win without a word; give it once"
            )


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on `argv` and return its exit status: the one error boundary for every command."""
    global _interrupted, _finished
    _interrupted, _finished = 0, False
    _usable_matplotlib_folder()
    try:
        _checked_spelling(list(argv if argv is not None else sys.argv[1:]))
        # Commands return None; typer returns an exit status instead when one stopped early: 130 for Ctrl-C
        # (it turns KeyboardInterrupt into that itself), 0 after --help.
        status = app(args=argv, prog_name="attnscope", standalone_mode=False)
        if status == 130 or _interrupted:
            return _stopped()
        _finished = True
        return status if isinstance(status, int) else 0
    except BaseException as error:
        if _interrupted or isinstance(error, (typer.Abort, KeyboardInterrupt)):
            return _stopped()
        message, status = _user_error(error, (argv or [""])[0] if argv else "")
        if message is None:
            raise  # a bug keeps its traceback, for the bug report
        rank = _rank()
        # one process's own memory, or its own failure to meet the others: say whose
        if message and rank and (_out_of_memory(error) or isinstance(error, RendezvousError)):
            message = message.replace("attnscope: error:", f"attnscope: error (rank {rank}):", 1)
        elif rank:  # the same error on every process (they read the same options and texts): rank 0 says it
            message = ""
        if message:
            print(one_line(message), file=sys.stderr)
        return status


def _user_error(error: BaseException, command: str) -> tuple[str | None, int]:
    """The line and exit status for an error a user can cause; (None, 0) for a bug."""
    if isinstance(error, AttnscopeError):
        return f"attnscope: error: {error}", 2
    if isinstance(error, click_errors.NoArgsIsHelpError):  # `attnscope` alone prints the help
        error.show()
        return "", 0
    if isinstance(error, OptionError) and error.param is not None:  # `--window 0: must be ...`
        hint = f" (see: attnscope {error.ctx.info_name} --help)" if error.ctx is not None and error.ctx.parent else ""
        return f"attnscope: error: {max(error.param.opts, key=len)} {error.message}{hint}", 2
    if isinstance(error, click_errors.UsageError):
        hint = f" (see: attnscope {error.ctx.info_name} --help)" if error.ctx is not None and error.ctx.parent else ""
        return f"attnscope: error: {error.format_message()}{hint}", 2
    if isinstance(error, click_errors.ClickException):
        return f"attnscope: error: {error.format_message()}", 2
    if isinstance(error, BrokenPipeError):
        # The reader of stdout went away (`attnscope heads | head`): stop quietly. Point stdout at /dev/null so
        # that the interpreter's last flush does not fail again; rich does the same for its own writes (exit 1).
        silence_stdout()
        return "", 1
    if _out_of_memory(error):
        text = str(error).strip()
        first_line = text.splitlines()[0] if text else type(error).__name__
        advice = _MEMORY_ADVICE.get(command, _MEMORY_ADVICE_DEFAULT)
        return f"attnscope: error: out of memory ({first_line}); {advice}", 2
    return None, 0


def _out_of_memory(error: BaseException) -> bool:
    """Whether `error` is running out of host or device memory, which a user causes with the size of the input
    (torch raises RuntimeError on the CPU: "can't allocate memory", and torch.OutOfMemoryError on a GPU; a Rust
    library such as the tokenizer panics when an allocation fails)."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    if not isinstance(error, RuntimeError) and type(error).__name__ != "PanicException":
        return False
    text = str(error).lower()
    return any(
        words in text for words in ("can't allocate memory", "out of memory", "memory allocation", "capacity overflow")
    )


def _usable_matplotlib_folder() -> None:
    """Point MPLCONFIGDIR at a folder of this user's own when matplotlib's would not be usable (MPLCONFIGDIR or HOME
    naming a file, a read-only home): matplotlib would add two warnings to stderr at every run, and build its font
    cache again each time. Nothing is imported; a usable folder is left as it is."""
    if "matplotlib" in sys.modules:
        return
    configured = os.environ.get("MPLCONFIGDIR")
    try:
        home = Path.home()
        folders = (
            [Path(configured)]
            if configured
            else [
                Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config", "matplotlib"),
                Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache", "matplotlib"),
            ]
        )
        if all(_writable_folder(folder) for folder in folders):
            return
    except RuntimeError:  # no home folder at all
        pass
    import tempfile

    fallback = Path(tempfile.gettempdir(), f"attnscope-matplotlib-{os.getuid() if hasattr(os, 'getuid') else 0}")
    try:
        fallback.mkdir(mode=0o700, exist_ok=True)
        owned = fallback.lstat()
        if fallback.is_symlink() or (hasattr(os, "getuid") and owned.st_uid != os.getuid()):
            fallback = Path(tempfile.mkdtemp(prefix="attnscope-matplotlib-"))  # not ours: a private one instead
    except OSError:
        return  # no usable temporary folder either: matplotlib says so itself
    os.environ["MPLCONFIGDIR"] = str(fallback)


def _writable_folder(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def _standard_streams() -> bool:
    """Give each standard stream the program was started without (`2>&-`, `>&-`, `<&-`) /dev/null, so that no file
    opened later takes its number (an error line would be written into a picture); returns whether stdout was
    open. Without this, a closed stderr turned every error into exit status 1 and usage errors went to stdout."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            closed.append(fd)
    if 2 in closed or sys.stderr is None:
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    if 1 in closed or sys.stdout is None:
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    return 1 not in closed


def _unicode_streams() -> None:
    """In an ASCII locale (LC_ALL=C without Python's UTF-8 mode), write stdout and stderr as UTF-8, as the files of
    --out are and as JSON must be: a token or a source with one accented letter would otherwise end the run with a
    traceback."""
    import codecs

    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        if encoding and codecs.lookup(encoding).name == "ascii" and hasattr(stream, "reconfigure"):
            stream.reconfigure(encoding="utf-8", errors="backslashreplace" if stream is sys.stderr else "strict")


def main() -> None:
    """Console-script entry point (`attnscope`, `python -m attnscope`)."""
    import signal

    stdout_open = _standard_streams()
    _unicode_streams()
    handle_stopping_signals()
    if not stdout_open:
        print(
            "attnscope: error: standard output is closed (>&-): attnscope writes its results there; redirect it "
            "to a file, or to /dev/null",
            file=sys.stderr,
        )
        sys.exit(2)
    status = run(sys.argv[1:])
    if status - 128 in {getattr(signal, name) for name in STOPPING_SIGNALS if hasattr(signal, name)}:
        # End the way an interrupted Unix program does, killed by its signal (the shell shows 128 + its number and
        # stops a script's loop). This is also the only deterministic ending: CPython itself re-raises SIGINT at
        # exit when the interrupt landed in an `exec` (e.g. a dataclass being built during an import).
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:
            pass
        signal.signal(status - 128, signal.SIG_DFL)
        os.kill(os.getpid(), status - 128)
    if _finished:  # the result is complete: a signal during the exit (freeing torch takes a second) is too late
        for name in STOPPING_SIGNALS:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)
    sys.exit(status)
