"""How a setting is declared, and what every command's settings share: the declaration (`Setting`, made with
`setting()` on a field), the base classes with the commands' contract (`Declared`, `Settings`), the domains of
values that need the catalog (a score's name, roles' thresholds, revisions, a file of texts), and the inputs that
are not settings (the model, the texts, the callbacks), declared the same way.

A declaration holds a setting's domain (attnscope.options), its default, its help and how the command line spells
it; from it come the field's check (`check_fields`), the Python API's keyword and its line of docstring, and the
CLI's option. Light: the CLI reads every declaration without importing torch.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape
from attnscope.options import Option
from attnscope.scores import catalog, roles

# The contract's `models`: one model; one or several (a page or a comparison of several); a name the analysis loads
# or reads itself (bench, info); no model at all (random-mha).
ONE, SEVERAL, OWN, NONE = "one", "several", "own", "none"
__all__ = [
    "DEFAULT_MODEL",
    "MODEL",
    "MODELS",
    "NONE",
    "ONE",
    "OWN",
    "PROGRESS",
    "Planned",
    "REQUIRED",
    "HEAD_SCORE",
    "SCORE",
    "SEVERAL",
    "STATUS",
    "TEXTS",
    "TOP_HELP",
    "Declared",
    "Setting",
    "Settings",
    "check_fields",
    "check_layer",
    "check_measured",
    "declared",
    "optional_setting",
    "setting",
]

DEFAULT_MODEL = "gpt2"


# ------------------------------------------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Setting:
    """One setting, declared once: its domain (None: the settings class checks it itself), its default, its help
    (one sentence, shown by `--help` and in the Python function's docstring) and how the command line spells it.

    flags: the option's names (default `--name`, underscores as hyphens); `argument`: a positional argument instead;
    `many`: the option repeated on the command line, a list in Python (the domain's `parse` reads one occurrence,
    its `check` the whole list); a flag is `--x/--no-x` unless `negatable` is False; `python_help`: where Python's
    words differ from the command line's (a list where the command line repeats an option). `name` and `default`
    are filled in from the field (see `declared`)."""

    domain: Option | None
    help: str
    flags: tuple[str, ...] = ()
    metavar: str | None = None
    many: bool = False
    argument: bool = False
    negatable: bool = True
    python_help: str | None = None
    command_line: bool = True  # False: Python's alone (a callback)
    name: str = ""
    default: Any = None  # see REQUIRED

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def options(self) -> tuple[str, ...]:
        """The command line's names of the option (`--window`, `-w`)."""
        return self.flags or (f"--{self.name.replace('_', '-')}",)

    @property
    def spelled(self) -> str:
        """The setting as the command line names it in a message or a docstring: `--window`, `TEXT`."""
        return self.metavar if self.argument else max(self.options, key=len).split("/")[0]

    def docstring_line(self, width: int = 116) -> str:
        """The lines of the Python function's docstring: `window      the help (--window)`, wrapped at `width` with
        the text's column kept (as `help()` shows it, and as the docs' table reads it: docs/hooks)."""
        text = (self.python_help or self.help).rstrip(".") + (f" ({self.spelled})" if self.command_line else "")
        name = f"{self.name:<11} " if len(self.name) < 12 else f"{self.name}  "
        return textwrap.fill(text, width, initial_indent=name, subsequent_indent=" " * 12, break_on_hyphens=False)


class _Required:
    """The default of a setting that has none: it must be given."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


def setting(domain: Option | None, default: Any = REQUIRED, help: str = "", **spelling: Any) -> Any:
    """A field of a settings class, declared once (see `Setting`): `window: int = setting(WINDOW, 3, "...")`."""
    declared = Setting(domain, help, **spelling, default=default)
    if default is REQUIRED:
        return dataclasses.field(metadata={"setting": declared})
    return dataclasses.field(default=default, metadata={"setting": declared})


def optional_setting(domain: Option, help: str = "", **spelling: Any) -> Any:
    """A setting left out by default: None, or a value of `domain` (`layer: int | None = optional_setting(LAYER,
    "...")`)."""
    return setting(domain.or_none(), None, help, **spelling)


def declared(cls: type) -> list[Setting]:
    """The settings a settings class declares, each with its name and default: the class's own fields first, then
    those of its bases, nearest first (the order of `--help` and of the docstring)."""
    fields = {field.name: field for field in dataclasses.fields(cls)}
    order: list[str] = []
    for klass in cls.__mro__:
        order += [name for name in inspect.get_annotations(klass) if name in fields and name not in order]
    found = []
    for name in order:
        field = fields[name]
        if "setting" in field.metadata:
            default = REQUIRED if field.default is dataclasses.MISSING else field.default
            found.append(replace(field.metadata["setting"], name=name, default=default))
    return found


def check_fields(settings: Any) -> None:
    """Check every declared field of a frozen settings dataclass against its domain, storing each value in its one
    form (an integer type such as numpy's as an int, `L1H0` as `1.0`); one AttnscopeError names the first field
    that is not in its domain."""
    for declaration in declared(type(settings)):
        if declaration.domain is not None:
            value = getattr(settings, declaration.name)
            object.__setattr__(settings, declaration.name, declaration.domain.check(value, declaration.name))


# ---------------------------------------------------------------------------------------- domains of settings


@dataclass(frozen=True)
class ScoreName(Option):
    """A score of the catalog: its name, its short label or its column header (`prev`, `Hnorm`), stored by name.
    `per_head`: only a score that differs between heads (not local_uniform, a property of the texts), for a setting
    that explains or draws a score head by head."""

    kind: str = "score"
    choices: tuple[str, ...] = catalog.SCORE_NAMES
    per_head: bool = False

    def domain(self) -> str:
        return f"one of {', '.join(self.choices)} (or a column header)"

    def problem(self, value: Any) -> str | None:
        found = catalog.score_named(value) if isinstance(value, str) else None
        if found is None:
            return f"use {self.domain()}"
        if found.name not in self.choices:
            return (
                f"{found.name} is the same for every head (a property of the texts, not of a head), so it tells "
                f"no head from another; use {self.domain()}"
            )
        return None

    def normal(self, value: Any) -> str:
        return catalog.score_named(value).name


@dataclass(frozen=True)
class Thresholds(Option):
    """Roles' thresholds moved: `ROLE=VALUE` (the option repeated on the command line; `parse` reads one), in Python
    a mapping {ROLE: VALUE} or those strings; every role's threshold once checked (the catalog's defaults with
    these changes)."""

    kind: str = "thresholds"

    def check(self, value: Any, name: str) -> dict[str, float]:
        return roles.parse_thresholds(value)

    def parse(self, text: str) -> str:
        roles.parse_thresholds([text])
        return text


@dataclass(frozen=True)
class Revisions(Option):
    """Revisions of one Hub repository, in order: `step0,step512` (one string, comma-separated) or a list; each a
    branch, tag or commit, non-empty, each once."""

    kind: str = "revisions"

    def problem(self, value: Any) -> str | None:
        items = value.split(",") if isinstance(value, str) else value
        if isinstance(items, (bytes, Mapping)) or not isinstance(items, Sequence):
            return "expected revisions such as step0,step512"
        if not items or any(not isinstance(item, str) for item in items):
            return "expected revisions such as step0,step512 (branches, tags or commits of one Hub repository)"
        names = [item.strip() for item in items]
        if not all(names):
            return "a revision is empty (revisions are branches, tags or commits of one Hub repository: step0,step512)"
        twice = next((item for k, item in enumerate(names) if item in names[:k]), None)
        return None if twice is None else f"revision {twice!r} is given twice: give each model once"

    def normal(self, value: Any) -> tuple[str, ...]:
        items = value.split(",") if isinstance(value, str) else value
        return tuple(item.strip() for item in items)


@dataclass(frozen=True)
class File(Option):
    """A file of texts: a path (a string or a path object), '-' for standard input; None: none."""

    kind: str = "file"

    def check(self, value: Any, name: str) -> str | None:
        if value is None:
            return None
        if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)) or not os.fspath(value).strip():
            raise AttnscopeError(f"{name} {options.shown(value)}: expected the path of a file of texts, or '-'")
        return os.fspath(value)

    def parse(self, text: str) -> str:
        return self.check(text, "")


SCORE = ScoreName()
HEAD_SCORE = ScoreName(choices=tuple(score.name for score in catalog.SCORES if score.per_head), per_head=True)
THRESHOLDS = Thresholds()
REVISIONS = Revisions().or_none()
FILE = File()

TOP_HELP = (
    "Rows of each ranked list: the first K, on the terminal, in --json and in --csv (default: every row in --json "
    "and --csv, and on the terminal as many as the command usually shows)."
)


def check_measured(score: str | None, kind_name: str | None, probe: bool, name: str = "score") -> None:
    """Whether `score` is measured for a model of this kind (a Kind's name: decoder, encoder; None: not known yet),
    with the probe on or off: the one rule behind `--sort`, `--score` and the circuit's explained scores."""
    if score is None:
        return
    found = catalog.score_named(score)
    if kind_name is not None and kind_name not in found.kinds:
        measured = " and ".join(f"{kind}s" for kind in sorted(found.kinds))
        raise AttnscopeError(f"{name} {score}: that score is measured for {measured} only")
    if found.source in catalog.PROBES and not probe:
        which = "the needle probe" if found.source == catalog.NEEDLE else "the probe"
        raise AttnscopeError(f"{name} {score}: that score comes from {which}, which is off")


def check_layer(layer: int, n_layer: int) -> int:
    if not 0 <= layer < n_layer:
        raise AttnscopeError(f"layer {layer} is out of range (this model has layers 0-{n_layer - 1})")
    return layer


# ------------------------------------------------------------------------------------------ inputs (not fields)

MODEL = Setting(
    options.TEXT,
    "'demo': the small GPT-2 bundled with attnscope (no download, works offline); or a Hugging Face id (fetched "
    "once into the Hugging Face cache); or a directory saved with save_pretrained.",
    flags=("--model", "-m"),
    metavar="NAME|PATH",
    python_help="a model `load` returned, or a name to load for this call: 'demo', a Hub id, a folder",
    name="model",
    default=DEFAULT_MODEL,
)
MODELS = replace(
    MODEL,
    many=True,
    default=None,  # gpt2, unless --revisions asks for revisions of a model: then the model must be named
    help=MODEL.help + " Repeat it for several models, in order: the same texts through each; they must share "
    f"layers × heads and the tokenizer. Default: {DEFAULT_MODEL} (with --revisions, name the model).",
    python_help="one model, or a list of them in order (names, or models `load` returned): the same texts through "
    f"each; they must share layers × heads and the tokenizer (None: {DEFAULT_MODEL}; with revisions, give its name)",
)
TEXTS = Setting(
    None,
    "Text to analyse; '-' reads stdin; omitted: the bundled sample texts.",
    argument=True,
    metavar="TEXT",
    python_help="a string, a list of strings (or Text), or None: the bundled sample texts",
    name="texts",
    default=None,
)
PROGRESS = Setting(
    None,
    "",
    python_help="called after every batch with (texts read, tokens run, share of the input read from 0 to 1)",
    command_line=False,
    name="progress",
    default=None,
)
STATUS = Setting(
    None,
    "",
    python_help="called with a line saying what is being done ('loading demo …'), and before a large piece of work "
    "how large it is (a `Planned`, a str)",
    command_line=False,
    name="status",
    default=None,
)


class Planned(str):
    """A status line that says, before a large piece of work begins, how large it is and how to make it smaller: the
    command line keeps it on stderr as a note, on a terminal or not, where other status lines come and go."""


# ------------------------------------------------------------------------------------------------- the bases


@dataclass(frozen=True, kw_only=True)
class Declared:
    """A frozen dataclass of declared settings, each checked against its domain when built."""

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def declarations(cls) -> list[Setting]:
        return declared(cls)


@dataclass(frozen=True, kw_only=True)
class Settings(Declared):
    """A command's settings and its contract (see the module docstring). The defaults: one model, texts read, no
    language-model head, pictures drawn, no demand on the model's shape."""

    models: ClassVar[str] = ONE
    takes_loaded: ClassVar[bool] = True  # the model may be one `load` returned (bench's: a name only)
    reads_texts: ClassVar[bool] = True
    draws: ClassVar[bool] = True  # the command has pictures (--format, --dpi)
    default_out: ClassVar[str | None] = None  # a command whose output is its files: where they go without --out
    revisions: ClassVar[tuple[str, ...] | None] = None  # several models: revisions of one repository (a field there)
    # What no TEXT and no --file means: None, the bundled sample texts; else the command's own texts, in words (its
    # TEXT's help says so), which its `run` makes itself when it receives None for the texts (kvplan's passkey probe).
    default_texts: ClassVar[str | None] = None
    # Under torchrun: True where the command's passes over the texts are shared among the processes and their sums
    # added (heads, diversity), where its pieces of work are (circuit's removals, compare's models: see
    # pipeline.distributed), or where it reads one window that every process reads alike (show, attend); a command
    # that would run whole in every process, or report one process's share, is refused there (`check_processes`);
    # where some of its settings decide (one model's report --ablate), `unshared` names them.
    torchrun: ClassVar[bool] = False

    @property
    def needs_lm_head(self) -> bool:
        return False

    def unshared(self, count: int) -> list[str]:
        """What torchrun's processes would not share of this run (of `count` models): each would do it whole, or
        report its own share alone. The whole command unless `torchrun`; a command may name some of its settings."""
        return [] if self.torchrun else [self.command_name]

    def check_processes(self, size: int, count: int = 1) -> None:
        """Refuse to run as one of `size` processes (torchrun) what they would not share (`unshared`)."""
        unshared = self.unshared(count) if size > 1 else []
        if unshared == [self.command_name]:
            raise AttnscopeError(
                f"{self.command_name} does not share its work among torchrun's processes (each of the {size} would "
                "run it whole): run it as one process"
            )
        if unshared:
            one = len(unshared) == 1
            raise AttnscopeError(
                f"{' and '.join(unshared)} ({', '.join(f'--{name}' for name in unshared)}) {'is' if one else 'are'} "
                f"not shared among torchrun's {size} processes yet (each would compute {'it' if one else 'them'} "
                f"on its own): run {self.command_name} as one process, or turn {'it' if one else 'them'} off"
            )

    @property
    def command_name(self) -> str:
        """The command's name on the command line (`random-mha` for RandomMha and its analysis)."""
        return "".join(f"-{char.lower()}" if char.isupper() else char for char in type(self).__name__).lstrip("-")

    def read_inputs(self) -> Any:
        """What a command that reads no TEXT reads itself (patch's prompt pairs), read and checked before any model
        loads, and handed to `run` in place of the texts; None: nothing."""
        return None

    def check_shape(self, shape: Shape) -> None:
        """What these settings ask of the model's shape (`--layer 99`), from its config before any weight loads."""

    def planned_work(self, loaded: Any, texts: Any) -> str | None:
        """Before `run`, how much work it plans and how to make it smaller, when that is large (`Planned`); None:
        nothing worth saying."""
        return None

    def check_models(self, count: int) -> None:
        """How many models these settings take (several: report, compare)."""
        if count != 1 and self.models != SEVERAL:
            raise AttnscopeError(f"this command analyses one model; {count} were given")
