"""The command line: parse options, run one analysis, hand its result to one shared ending. The only module that
knows about Typer.

Options are declared once (below) and shared; their domains (choices, ranges) are declared on the option, so
`--help` lists them and shell completion offers them. Every command builds its analysis's settings (which checks
them): the same dataclass, from the same values, as its function in the Python API (`attnscope.api`), which loads
models for both. Then `_run` gathers the texts, proves `--out` writable, loads the model, runs the analysis and ends
through `_emit`: notes on stderr, files into `--out`, then `--json`, `--csv` or the terminal view on stdout.

Heavy imports (torch, transformers, matplotlib) happen inside the commands, so `attnscope --help` stays fast.
Every AttnscopeError and usage error ends as one line on stderr with exit status 2 (see `run`).
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

try:  # typer >= 0.25 carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # older typer runs on click itself
    from click import exceptions as click_errors

from attnscope import __version__, options
from attnscope.errors import AttnscopeError
from attnscope.output.files import DPI, Pictures
from attnscope.scores import catalog

app = typer.Typer(
    name="attnscope",
    help="What every attention head of a transformer does: roles, scores, pictures.",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


# ------------------------------------------------------------------------------------------ option domains
# Each option's domain is declared once, in attnscope.options, which the settings classes check their fields
# against too; here an option reads its parser (the domain's check, in attnscope's words) and, for --help, its range
# or choices from there.


class _OptionError(typer.BadParameter):
    """A value outside its option's domain: shown as `--window 0: must be a whole number from 1 to 100,000`."""


def _domain(option: options.Option) -> dict[str, Any]:
    """The typer.Option keywords of an option whose domain is `option`: its parser and its range or choices."""

    def parse(text: Any) -> Any:
        if not isinstance(text, str):  # a default, already a value
            return text
        try:
            return option.parse(text)
        except AttnscopeError as error:
            raise _OptionError(str(error)) from None

    parse.option = option  # what tests/unit/test_api.py ties to the API's checks
    if option.kind in ("count", "number"):
        return {"parser": parse, "min": option.low, "max": option.high}
    if option.kind == "choice":
        metavar = f"<{'|'.join(option.choices)}>"  # as typer shows a Literal, which docs/hooks/generate.py reads
        return {"parser": parse, "metavar": metavar, "autocompletion": lambda: list(option.choices)}
    return {"parser": parse}


def _device(text: str) -> str:
    spec = text.strip().lower()
    if re.fullmatch(options.DEVICE_PATTERN, spec) is None:
        raise _OptionError(f"{options.shown_text(text)}: use auto, cpu, cuda or cuda:N")
    return spec


class Numbers(tuple):
    """Comma-separated whole numbers (`128,512,1024`) as one option value. A class of its own: typer would read a
    plain `tuple[int, ...]` annotation as an option taking several arguments."""


class Names(tuple):
    """Comma-separated names (`floor,attnscope`) as one option value."""


def _numbers(option: options.Option) -> Callable[[str | tuple], Numbers]:
    """A parser of comma-separated whole numbers (`128,512,1024`), each in `option`'s domain."""

    def parse(text: str | tuple) -> Numbers:
        if isinstance(text, tuple):  # a default given as a tuple
            return Numbers(text)
        try:
            values = Numbers(int(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise _OptionError(f"{options.shown_text(text)}: expected comma-separated whole numbers") from None
        if not values:
            raise _OptionError(f"{options.shown_text(text)}: give at least one number")
        for value in values:
            problem = option.problem(value)
            if problem is not None:
                raise _OptionError(f"{value}: {problem}")
        return values

    parse.option = option
    return parse


def _methods(text: str | tuple) -> Names:
    if isinstance(text, tuple):
        return Names(text)
    chosen = Names(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in chosen if name not in options.ALL_BENCH_METHODS]
    if unknown or not chosen:
        raise _OptionError(
            f"{options.shown_text(text)}: use some of {', '.join(options.ALL_BENCH_METHODS)}, comma-separated"
        )
    return chosen


def _folder(text: str | Path) -> Path:
    """A folder to write into: an empty name is refused (it would quietly mean the current folder)."""
    if isinstance(text, Path):
        return text
    if not text.strip():
        raise _OptionError(f"{text!r}: an empty folder name; give a folder, e.g. --out results/ (or . for this one)")
    return Path(text)


def _sort(text: str) -> str:
    score = catalog.score_named(text)
    if score is None:
        raise _OptionError(
            f"{options.shown_text(text)}: use one of {', '.join(catalog.SCORE_NAMES)} (or a column header)"
        )
    return score.name


def _layer_or_all(text: str) -> str:
    chosen = text.strip().lower()
    if chosen != "all":
        try:
            options.LAYER.parse(chosen)
        except AttnscopeError:
            raise _OptionError(f"{options.shown_text(text)}: expected a layer number (0-based) or 'all'") from None
    return chosen


def _sort_names(incomplete: str) -> list[str]:
    return [name for name in catalog.SCORE_NAMES if name.startswith(incomplete)]


SEED_MAX = options.SEED_MAX
LENGTH_MAX = options.LENGTH_MAX
BATCH_MAX = options.BATCH_MAX
D_MODEL_MAX = options.D_MODEL_MAX

# ------------------------------------------------------------------------------------------ shared options
# Options shared by several commands are declared once, in groups; `_options` adds a group's options to a command
# and hands the command one object built from them (a Texts, a Model, an Output, or a dict of settings).


@dataclass(frozen=True)
class Group:
    """Options declared once: their typer parameters, and `build`, which turns their values into one object."""

    parameters: tuple[inspect.Parameter, ...]
    build: Callable[..., Any]


def _group(build: Callable[..., Any], **options: tuple[Any, Any]) -> Group:
    """A group of options `name=(Annotated type, default)`, built into one object by `build(**values)`."""
    kind = inspect.Parameter.KEYWORD_ONLY
    return Group(
        tuple(inspect.Parameter(name, kind, default=d, annotation=a) for name, (a, d) in options.items()), build
    )


def _options(**groups: Group) -> Callable:
    """Give a command the options of `groups`: the command declares a parameter of each group's name (first, no
    annotation) and receives the group's object there; its own options follow, and the groups' come after them."""

    def decorate(function: Callable) -> Callable:
        hints = typing.get_type_hints(function, include_extras=True)
        own = [
            parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[parameter.name])
            for parameter in inspect.signature(function).parameters.values()
            if parameter.name not in groups
        ]
        parameters = own + [parameter for group in groups.values() for parameter in group.parameters]

        @functools.wraps(function)
        def command(**values: Any) -> Any:
            for name, group in groups.items():
                values[name] = group.build(**{p.name: values.pop(p.name) for p in group.parameters})
            return function(**values)

        command.__signature__ = inspect.Signature(parameters)  # what typer reads
        command.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
        return command

    return decorate


@dataclass(frozen=True)
class Texts:
    """Where the texts come from (TEXT, '-', --file, or the bundled samples) and whether to add special tokens."""

    text: str | None
    file: str | None
    bos: bool | None

    def gather(self):
        """The texts as a checked stream (pipeline.inputs.Texts): nothing is read whole."""
        from attnscope.pipeline.inputs import gather_texts

        return gather_texts(self.text, self.file)


@dataclass(frozen=True)
class Model:
    name: str
    device: str
    dtype: str
    revision: str | None = None
    device_map: str | None = None
    kernel: str = "auto"

    def __post_init__(self) -> None:
        if self.kernel == "fused":  # decided now, before any model: one line where it cannot run (Triton missing, ...)
            from attnscope.models.loading import resolve_device
            from attnscope.pipeline.kernels import decide

            decide(self.kernel, resolve_device(self.device))


@dataclass(frozen=True)
class Output:
    """Where a command's result goes: --json, --csv, --out and --quiet; and, for a command that draws, how its
    pictures are written (--format, --dpi)."""

    json: bool = False
    csv: bool = False
    out: Path | None = None
    quiet: bool = False
    pictures: Pictures = Pictures()

    def __post_init__(self) -> None:
        if self.json and self.csv:
            raise AttnscopeError("give --json or --csv, not both")

    def folder(self, default: Path | None) -> Path | None:
        """The folder files go to: --out, else `default` for a command whose output is its files (shown without
        --json/--csv); checked writable now, before any work."""
        from attnscope.output.files import prepare_out_dir

        chosen = self.out if self.out is not None else None if (self.json or self.csv) else default
        return None if chosen is None else prepare_out_dir(chosen)


TEXTS = _group(
    Texts,
    text=(
        Annotated[
            str | None,
            typer.Argument(
                metavar="TEXT",
                help="Text to analyse; '-' reads stdin; omitted: the bundled sample texts.",
                show_default=False,
            ),
        ],
        None,
    ),
    file=(
        Annotated[
            str | None,
            typer.Option(
                "--file", "-f", metavar="PATH", help="Texts separated by blank lines, or .jsonl with a 'text' field."
            ),
        ],
        None,
    ),
    bos=(
        Annotated[
            bool | None,
            typer.Option(
                "--bos/--no-bos",
                show_default=False,
                help="Prepend the BOS token, or wrap in [CLS] … [SEP] for an encoder (default: on when the model has "
                "them).",
            ),
        ],
        None,
    ),
)
MODEL = _group(
    Model,
    name=(
        Annotated[
            str,
            typer.Option(
                "--model",
                "-m",
                **_domain(options.TEXT),
                metavar="NAME|PATH",
                help="'demo': the small GPT-2 bundled with attnscope (no download, works offline); or a Hugging "
                "Face id (fetched once into the Hugging Face cache); or a directory saved with save_pretrained.",
            ),
        ],
        "gpt2",
    ),
    device=(
        Annotated[
            str,
            typer.Option(
                "--device",
                parser=_device,
                metavar="auto|cpu|cuda|cuda:N",
                autocompletion=lambda: ["auto", "cpu", "cuda"],
                help="auto: CUDA when available.",
            ),
        ],
        "auto",
    ),
    dtype=(
        Annotated[
            str,
            typer.Option("--dtype", **_domain(options.DTYPE), help="auto: the checkpoint's own (float32 for GPT-2)."),
        ],
        "auto",
    ),
    revision=(
        Annotated[
            str | None,
            typer.Option(
                "--revision",
                **_domain(options.TEXT),
                metavar="REV",
                help="A Hub branch, tag or commit of --model (e.g. Pythia's training checkpoints: step1000).",
            ),
        ],
        None,
    ),
    device_map=(
        Annotated[
            str | None,
            typer.Option(
                "--device-map",
                **_domain(options.DEVICE_MAP),
                help="Spread a model too large for one device over all of them (needs: pip install 'attnscope[big]').",
            ),
        ],
        None,
    ),
    kernel=(
        Annotated[
            str,
            typer.Option(
                "--kernel",
                **_domain(options.KERNEL),
                help="What computes attention and its statistics: fused (one Triton kernel on a GPU; needs pip install "
                "'attnscope[gpu]'; on the CPU Triton's interpreter, very slow, for testing), blocks (PyTorch, blocks "
                "of query rows), auto (fused on CUDA when Triton imports, else blocks). Maps, diversity and the probe "
                "always use blocks.",
            ),
        ],
        "auto",
    ),
)


@dataclass(frozen=True)
class Models:
    """`report`'s models: --model given once or more, or --revisions of one model; each model is loaded as MODEL's
    options say (`each`: (label, Model) in order)."""

    names: tuple[str, ...]
    device: str
    dtype: str
    revision: str | None = None
    revisions: str | None = None
    device_map: str | None = None
    kernel: str = "auto"

    def each(self) -> list[tuple[str, Model]]:
        from attnscope.analyses.report import model_labels

        loading = {"device": self.device, "dtype": self.dtype, "device_map": self.device_map, "kernel": self.kernel}
        if self.revisions is not None:
            if len(self.names) > 1:
                raise AttnscopeError("--revisions are revisions of one model: give --model once (a Hub id)")
            if self.revision is not None:
                raise AttnscopeError("give --revision or --revisions, not both")
            revisions = [part.strip() for part in self.revisions.split(",")]
            if any(not part for part in revisions):
                raise AttnscopeError(f"--revisions {options.shown_text(self.revisions)}: a revision is empty")
            labels = model_labels([], revisions)
            return [(label, Model(self.names[0], revision=label, **loading)) for label in labels]
        labels = model_labels(self.names)
        return [
            (label, Model(name, revision=self.revision, **loading))
            for label, name in zip(labels, self.names, strict=True)
        ]


def _models(name: list[str], revisions: str | None, **model: Any) -> Models:
    names = tuple(name or ["gpt2"])
    for given in names:
        try:
            options.TEXT.parse(given)
        except AttnscopeError as error:
            raise _OptionError(f"--model {error}") from None
    return Models(names, revisions=revisions, **model)


MODELS = Group(  # MODEL's options, --model repeatable, and --revisions: the models of report and compare
    tuple(
        parameter.replace(
            annotation=Annotated[
                list[str],
                typer.Option(
                    "--model",
                    "-m",
                    metavar="NAME|PATH",
                    help="'demo': the small GPT-2 bundled with attnscope (no download, works offline); or a Hugging "
                    "Face id (fetched once into the Hugging Face cache); or a directory saved with save_pretrained. "
                    "Repeat it for several models, in order (report: one page with a slider; compare: side by side): "
                    "the same texts through each; they must share layers × heads and the tokenizer.",
                ),
            ],
            default=["gpt2"],
        )
        if parameter.name == "name"
        else parameter
        for parameter in MODEL.parameters
    )
    + (
        inspect.Parameter(
            "revisions",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                str | None,
                typer.Option(
                    "--revisions",
                    **_domain(options.TEXT),
                    metavar="REV,REV,...",
                    help="Several revisions of --model (one Hub repository), in order, each a model labelled by its "
                    "revision (e.g. Pythia's checkpoints: step0,step512,step1000).",
                ),
            ],
        ),
    ),
    _models,
)
# compare's models: MODELS without --revision (one revision for every model would set a model beside itself)
COMPARED = Group(tuple(parameter for parameter in MODELS.parameters if parameter.name != "revision"), _models)
BATCHING = _group(
    dict,
    batch_size=(
        Annotated[
            int,
            typer.Option(
                "--batch-size",
                **_domain(options.BATCH_SIZE),
                metavar="N",
                help="Windows per forward pass (padded, length-bucketed).",
            ),
        ],
        8,
    ),
    max_tokens=(
        Annotated[
            int,
            typer.Option(
                "--max-tokens",
                **_domain(options.MAX_TOKENS),
                metavar="N",
                help="Padded tokens per batch at most (a long window still runs alone).",
            ),
        ],
        16384,
    ),
)
ROLES = _group(  # the settings of `heads` that decide scores and roles, shared with `report`
    dict,
    window=(
        Annotated[
            int,
            typer.Option(
                "--window",
                "-w",
                **_domain(options.WINDOW),
                metavar="W",
                help="Local window: the current token and the W before it.",
            ),
        ],
        3,
    ),
    thresholds=(
        Annotated[
            list[str] | None,
            typer.Option(
                "--threshold",
                "-t",
                metavar="ROLE=VALUE",
                help="Move a role's threshold, e.g. previous-token=0.6 (repeatable). Roles: "
                f"{', '.join(catalog.DEFAULT_THRESHOLDS)}.",
            ),
        ],
        None,
    ),
    probe=(
        Annotated[
            bool,
            typer.Option(
                "--probe/--no-probe", help="Run the repeated-random-token probe (induction, duplicate-token)."
            ),
        ],
        True,
    ),
    probe_len=(
        Annotated[
            int | None,
            typer.Option(
                "--probe-len",
                **_domain(options.PROBE_LEN),
                metavar="T",
                help="Period T of the probe: T random tokens, then again. [default: 50]",
            ),
        ],
        None,
    ),
    probe_seed=(
        Annotated[
            int,
            typer.Option(
                "--probe-seed", **_domain(options.SEED), metavar="SEED", help="Seed of the probe's random tokens."
            ),
        ],
        0,
    ),
)
OUTPUT_OPTIONS = dict(
    json=(
        Annotated[bool, typer.Option("--json", help="Print JSON (schema_version 1) to stdout instead of tables.")],
        False,
    ),
    csv=(Annotated[bool, typer.Option("--csv", help="Print the rows as CSV to stdout instead of tables.")], False),
    out=(
        Annotated[
            Path | None,
            typer.Option(
                "--out",
                "-o",
                parser=_folder,
                metavar="DIR",
                help="Write the command's files (JSON, CSV, pictures) here.",
            ),
        ],
        None,
    ),
    quiet=(
        Annotated[
            bool,
            typer.Option(
                "--quiet", "-q", help="No progress bar or status lines on stderr (notes on the results stay)."
            ),
        ],
        False,
    ),
)
OUTPUT = _group(Output, **OUTPUT_OPTIONS)


def _drawing_output(format: str, dpi: int, **options: Any) -> Output:
    return Output(**options, pictures=Pictures(format, dpi))


DRAWING_OUTPUT = _group(  # the output options of a command that draws pictures: OUTPUT's, --format and --dpi
    _drawing_output,
    **OUTPUT_OPTIONS,
    format=(
        Annotated[
            str,
            typer.Option(
                "--format",
                **_domain(options.FORMAT),
                help="File format of the pictures of --out (svg and pdf: vector, for print).",
            ),
        ],
        "png",
    ),
    dpi=(
        Annotated[
            int,
            typer.Option(
                "--dpi",
                **_domain(options.DPI),
                metavar="N",
                help="Dots per inch of PNG pictures: pixels = the figure's inches × N (300 for print).",
            ),
        ],
        DPI,
    ),
)
IndexOpt = Annotated[
    int, typer.Option("--index", **_domain(options.INDEX), metavar="I", help="Which input text (0-based).")
]
# --top means one thing in every command that has it: how many rows each ranked table shows (heads: the heads table;
# diversity: the most redundant and the most distinct pairs; attend: the strongest heads; ablate: the most important
# heads), wherever it is shown (the terminal, a notebook, the ranked lists of --json); grids with a cell per head,
# maps and the files of --out show every head.
TOP_HELP = "Rows of each ranked table: the first K (grids, maps and the files of --out keep every head)."


def _score_option(help: str) -> Any:
    """--score: one score of the catalog (a name, or a column header), the one the command looks at; what it does
    with it is the command's `help`."""
    return Annotated[
        str | None,
        typer.Option("--score", parser=_sort, metavar="SCORE", autocompletion=_sort_names, help=help),
    ]


TopOpt = Annotated[int, typer.Option("--top", **_domain(options.TOP), metavar="K", help=TOP_HELP)]
WordsOpt = Annotated[
    bool,
    typer.Option(
        "--words/--no-words",
        help="Words instead of tokens: attention to a word is the sum over its tokens' keys, from a word the mean "
        "of its tokens' rows.",
    ),
]
SkipFirstOpt = Annotated[
    bool,
    typer.Option(
        "--skip-first",
        help="Leave the first token (the attention sink: BOS, [CLS], or a window's first token) out of the ranking "
        "of keys and heads.",
    ),
]


def _note(message: str) -> None:
    print(_one_line(f"note: {message}"), file=sys.stderr)


LINE_MAX = 4000  # characters of one line on stderr; a longer one repeats a value nobody reads whole


def _one_line(text: str) -> str:
    """`text` as one line of a terminal: control characters (a newline in a file name, an escape sequence in a
    model's name) written as escapes, and at most LINE_MAX characters."""
    line = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    return line if len(line) <= LINE_MAX else f"{line[: LINE_MAX - 1]}…"


def _console(stderr: bool = False):
    from rich.console import Console

    # markup off: a model's name, a text or a folder holding `[red]` is shown as it is, not as a style
    return Console(stderr=stderr, highlight=False, markup=False, width=_width())


def _width() -> int | None:
    """The terminal's width where COLUMNS says nothing usable (0, -5, 'wide', 10^9): rich would take `COLUMNS=0` for
    a width of 0 and print nothing at all. None: rich's own answer (COLUMNS, the terminal's width, or 80)."""
    import shutil

    columns = os.environ.get("COLUMNS")
    if columns is None or (columns.strip().isdigit() and 1 <= int(columns) <= 10_000):
        return None
    return min(max(shutil.get_terminal_size((80, 24)).columns, 20), 10_000)


def _on_terminal(quiet: bool) -> bool:
    """Whether to draw progress and status lines: stderr (where they go) is a terminal, no --quiet, and this is
    rank 0 under torchrun."""
    return not quiet and sys.stderr.isatty() and _is_main()


class _Status:
    """One line on stderr saying what is being done while nothing else shows (`loading demo …`), replaced by the
    next and cleared at the end; drawn only on a terminal (see `_on_terminal`). A context manager."""

    def __init__(self, quiet: bool):
        self.shown = _on_terminal(quiet)
        self.drawn = False

    def __call__(self, text: str) -> None:
        if self.shown:
            import shutil

            width = shutil.get_terminal_size().columns - 1  # a line that wrapped could not be cleared
            text = text if len(text) <= width else text[: max(width - 1, 0)] + "…"
            sys.stderr.write(f"\r\x1b[2K{text}")
            sys.stderr.flush()
            self.drawn = True

    def __enter__(self) -> _Status:
        return self

    def __exit__(self, *exc) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self.drawn = False


class _ProgressBar:
    """A rich progress bar on stderr, drawn only on a terminal (see `_on_terminal`): the share of the input read
    (bytes of a file, texts of a list), which streams in as it runs, with the time left at this pace; the texts
    read so far (taken from the input, their windows forwarded or about to be); the tokens forwarded per second
    (the windows' tokens, special tokens included, padding not). Use as a context manager; `callback` is None when
    hidden."""

    def __init__(self, quiet: bool, label: str):
        self.shown = _on_terminal(quiet)
        self.label = label
        self.callback = self._update if self.shown else None

    def __enter__(self) -> _ProgressBar:
        if self.shown:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn(self.label),
                BarColumn(),
                TextColumn("{task.fields[share]}"),
                TextColumn("{task.fields[texts]}"),
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
                console=_console(stderr=True),
                transient=True,
                auto_refresh=False,  # a refresh thread competing with torch's threads made runs several times slower
            )
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=None, share="", texts="", rate="")
            self.started = self.refreshed = time.perf_counter()
        return self

    def _update(self, texts: int, tokens: int, share: float) -> None:
        """`texts` read from the input so far, `tokens` forwarded so far, `share` of the input read (0 to 1)."""
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        self.bar.update(
            self.task,
            completed=share,
            total=1.0,
            share=f"{share:.0%} of the input",
            texts=f"{catalog.counted(texts, 'text')} read",
            rate=f"{tokens / elapsed:,.0f} tokens/s",
        )
        now = time.perf_counter()
        if now - self.refreshed > 0.1 or share >= 1.0:  # at most 10 redraws a second
            self.refreshed = now
            self.bar.refresh()

    def __exit__(self, *exc) -> None:
        if self.shown:
            self.bar.__exit__(*exc)


def _is_main() -> bool:
    """Only rank 0 prints and writes under torchrun."""
    return int(os.environ.get("RANK", "0")) == 0


def _load(model: Model, lm_head: bool = False, status: Callable[[str], None] | None = None):
    """Load the model as the Python API does, saying so on `status` (under torchrun: join the process group, take
    this rank's GPU)."""
    if status is not None:
        status(f"loading {model.name} …")
    from attnscope import api

    return api.load(
        model.name,
        model.device,
        model.dtype,
        revision=model.revision,
        device_map=model.device_map,
        lm_head=lm_head,
        kernel=model.kernel,
    )


def _run(
    analysis: Any,
    output: Output,
    texts: Texts | None = None,
    model: Model | None = None,
    default_out: Path | None = None,
) -> None:
    """The one flow of every command: its texts (when it reads any), the output folder, the model (when it needs
    one), the analysis, and the shared ending. Each step can fail only with one line, before the next begins."""
    gathered = texts.gather() if texts is not None else None
    folder = output.folder(default_out)
    own_model = getattr(analysis, "loads_its_model", False)  # bench loads (or builds) its own, and says what it does
    if model is not None and hasattr(analysis, "check_shape"):  # `--layer 99`: from the config, before the weights
        from attnscope.models.facts import config_shape

        shape = config_shape(model.name, model.revision)
        if shape is not None:
            analysis.check_shape(shape)
    with _Status(output.quiet) as status:
        loaded = None if model is None else _load(model, getattr(analysis, "needs_lm_head", False), status)
        if own_model:
            result = analysis.run(None, gathered, status=status)
    if not own_model:
        with _ProgressBar(output.quiet, type(analysis).__name__.lower()) as bar:
            result = analysis.run(loaded, gathered, bar.callback)
    if _is_main():
        _emit(result, output, folder)


def _run_several(
    analysis: Any, output: Output, texts: Texts, models: list[tuple[str, Model]], default_out: Path | None = None
) -> None:
    """`_run` for an analysis of several models (`report --model A --model B`): every model's config checked before
    any weight loads, then the analysis loads each model in turn (`run_models`), and the same ending."""
    from attnscope.models.facts import config_shape

    analysis.check_several()
    gathered = texts.gather()
    folder = output.folder(default_out)
    from attnscope.models.checks import check_same_shapes

    shapes = [(label, config_shape(model.name, model.revision)) for label, model in models]
    for _, shape in shapes:
        if shape is not None:
            analysis.check_shape(shape)
    check_same_shapes(shapes)  # before any weight loads
    lm_head = getattr(analysis, "needs_lm_head", False)  # the first model's (its ablation)
    sources = [(label, functools.partial(_load, model, lm_head and k == 0)) for k, (label, model) in enumerate(models)]
    with _ProgressBar(output.quiet, type(analysis).__name__.lower()) as bar:
        result = analysis.run_models(sources, gathered, bar.callback)
    if _is_main():
        _emit(result, output, folder)


def _emit(result: Any, output: Output, folder: Path | None) -> None:
    """The common ending: notes on stderr, the files into `folder`, then --json, --csv or the terminal view."""
    from attnscope.output.documents import to_csv, to_json
    from attnscope.output.files import write_all
    from attnscope.output.views import view_of

    view = view_of(result, output.pictures)
    for message in view.notes:
        _note(message)
    written = write_all(folder, view.files) if folder is not None else []
    shown_as_paths = view.names_files and not (output.json or output.csv)  # the paths themselves go to stdout
    if written and not output.quiet and not shown_as_paths:
        _note(f"wrote {catalog.counted(len(written), 'file')} to {folder}")
    try:
        if output.json:
            sys.stdout.write(to_json(view.document()))
        elif output.csv:
            sys.stdout.write(to_csv(view.records(), view.columns))
        else:
            console = _console()
            for item in view.terminal(written):
                # a line of text (a file's path above all) is never cut in two: scripts read it back
                console.print(item, soft_wrap=isinstance(item, str))
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as error:  # stdout on a full disk (`> /dev/full`), a quota, an I/O error
        _silence_stdout()
        raise AttnscopeError(f"cannot write to standard output: {error.strerror or error}") from None


def _version(value: bool) -> None:
    if value:
        print(f"attnscope {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """What every attention head of a transformer does: roles, scores, pictures."""


# ------------------------------------------------------------------------------------------------- commands


@app.command()
@_options(texts=TEXTS, model=MODEL, batching=BATCHING, roles=ROLES, output=DRAWING_OUTPUT)
def heads(
    texts,
    model,
    batching,
    roles,
    output,
    sort: Annotated[
        str | None,
        typer.Option(
            "--sort",
            parser=_sort,
            metavar="SCORE",
            autocompletion=_sort_names,
            help="Sort the table by this score, descending (a score name or a column header).",
        ),
    ] = None,
    top: Annotated[int | None, typer.Option("--top", **_domain(options.TOP), metavar="K", help=TOP_HELP)] = None,
    layer: Annotated[
        int | None,
        typer.Option("--layer", "-l", **_domain(options.LAYER), metavar="L", help="Show only the heads of this layer."),
    ] = None,
    plot: Annotated[
        list[str] | None,
        typer.Option(
            "--plot", "-p", metavar="L.H", help="Also draw head L.H's attention map (repeatable; needs --out)."
        ),
    ] = None,
    words: WordsOpt = False,
) -> None:
    """Score and classify every attention head.

    --sort, --top and --layer pick the table's rows (and those of --json and --csv); the role map and the files
    of --out always show every head.

    Example: attnscope heads "The cat sat on the mat because it was tired." --sort prev --top 10
    """
    from attnscope.analyses.heads import Heads

    if plot and output.out is None:
        raise AttnscopeError("--plot draws into the folder of --out: give --out DIR too")
    analysis = Heads(**roles, bos=texts.bos, **batching, plot=plot, words=words, layer=layer, sort=sort, top=top)
    _run(analysis, output, texts, model)


@app.command()
@_options(texts=TEXTS, model=MODEL, output=DRAWING_OUTPUT)
def show(
    texts,
    model,
    output,
    layer: Annotated[
        int, typer.Option("--layer", "-l", **_domain(options.LAYER), metavar="L", help="Layer to draw (0-based).")
    ] = ...,
    head: Annotated[
        int | None, typer.Option("--head", **_domain(options.HEAD), metavar="H", help="Draw only this head, larger.")
    ] = None,
    index: IndexOpt = 0,
    words: WordsOpt = False,
) -> None:
    """Draw one layer's attention maps (or one head's) with token labels, as PNG.

    The picture goes to --out (default: the current folder) and its path is printed; with --json or --csv the
    maps are printed instead (every weight a query gives a key it sees), and a picture is drawn only with --out.
    Labels mark a piece that continues a word with ##; --words draws (and prints) words instead of tokens.

    Example: attnscope show "The doctor said that she would help the patient." --layer 5 --words --out pictures/
    """
    from attnscope.analyses.maps import Show

    _run(Show(layer, head, index, texts.bos, words), output, texts, model, default_out=Path("."))


@app.command()
@_options(texts=TEXTS, model=MODEL, batching=BATCHING, output=DRAWING_OUTPUT)
def diversity(
    texts,
    model,
    batching,
    output,
    layer: Annotated[
        str,
        typer.Option("--layer", "-l", parser=_layer_or_all, metavar="L|all", help="Layer number (0-based) or 'all'."),
    ] = ...,
    redundant: Annotated[
        float,
        typer.Option(
            "--redundant",
            **_domain(options.JS_BITS),
            metavar="BITS",
            help="JSD below which two heads are near-duplicates.",
        ),
    ] = 0.1,
    cluster_at: Annotated[
        float,
        typer.Option(
            "--cluster-at",
            **_domain(options.JS_BITS),
            metavar="BITS",
            help="JSD below which average-linkage clusters merge.",
        ),
    ] = 0.3,
    top: TopOpt = 5,
    sample_rows: Annotated[
        int,
        typer.Option(
            "--sample-rows",
            **_domain(options.SAMPLE_ROWS),
            metavar="N",
            help="Estimate JS on N random scored rows per window, with standard errors (0: every row, exact).",
        ),
    ] = 0,
    seed: Annotated[
        int,
        typer.Option("--seed", **_domain(options.SEED), metavar="SEED", help="Seed of the rows --sample-rows draws."),
    ] = 0,
) -> None:
    """How different are the heads? Cosine and Jensen–Shannon between every pair of heads of a layer (or all).

    --top K lists the K most redundant and the K most distinct pairs; --csv prints every pair of heads. Exact by
    default; --sample-rows N estimates JS on N seeded random rows per window (cosine stays exact) and reports each
    pair's standard error.

    Example: attnscope diversity --layer 5 --top 10; attnscope diversity --layer all --sample-rows 32 --out results/
    """
    from attnscope.analyses.diversity import Diversity

    analysis = Diversity(
        layer,
        texts.bos,
        **batching,
        redundant=redundant,
        cluster_at=cluster_at,
        top=top,
        sample_rows=sample_rows,
        seed=seed,
    )
    _run(analysis, output, texts, model)


@app.command("random-mha")
@_options(output=DRAWING_OUTPUT)
def random_mha(
    output,
    d_model: Annotated[
        int, typer.Option("--d-model", **_domain(options.D_MODEL), metavar="D", help="Model width.")
    ] = 64,
    heads: Annotated[
        Numbers,
        typer.Option(
            "--heads",
            parser=_numbers(options.HEAD_COUNT),
            metavar="H,H,...",
            help=f"Head counts (1-{D_MODEL_MAX}), each dividing --d-model.",
        ),
    ] = "1,2,4,8",
    seq_len: Annotated[
        int, typer.Option("--seq-len", **_domain(options.SEQ_LEN), metavar="N", help="Tokens per random sequence.")
    ] = 32,
    trials: Annotated[
        int,
        typer.Option("--trials", **_domain(options.TRIALS), metavar="N", help="Random layers averaged per head count."),
    ] = 4,
    seed: Annotated[
        int,
        typer.Option("--seed", **_domain(options.SEED), metavar="SEED", help="Seed of the random weights and inputs."),
    ] = 0,
) -> None:
    """The tutorials' experiment: how different are the heads of a random (untrained) attention layer, by their
    number? No model and no text: random weights on random inputs.

    Example: attnscope random-mha --d-model 64 --heads 1,2,4,8
    """
    from attnscope.analyses.random_mha import RandomMha

    _run(RandomMha(d_model, heads, seq_len, trials, seed), output)


@app.command()
@_options(texts=TEXTS, model=MODEL, output=DRAWING_OUTPUT)
def attend(
    texts,
    model,
    output,
    from_token: Annotated[
        str,
        typer.Option(
            "--from",
            metavar="WORD[@K]",
            help="The word that looks: its text without the leading space; WORD@K its K-th occurrence (0-based).",
        ),
    ] = ...,
    to_token: Annotated[
        str | None,
        typer.Option(
            "--to",
            metavar="WORD[@K]",
            help="The word looked at (the sum over its tokens); WORD@K its K-th occurrence; omitted: each head's top "
            "keys.",
        ),
    ] = None,
    from_index: Annotated[
        int | None,
        typer.Option(
            "--from-index",
            **_domain(options.INDEX),
            metavar="K",
            help="Which occurrence of --from (0-based), as WORD@K.",
        ),
    ] = None,
    to_index: Annotated[
        int | None,
        typer.Option(
            "--to-index",
            **_domain(options.INDEX),
            metavar="K",
            help="Which occurrence of --to (0-based), as WORD@K; default: all the query sees, summed.",
        ),
    ] = None,
    tokens: Annotated[
        int,
        typer.Option(
            "--tokens", **_domain(options.TOKENS), metavar="K", help="Top keys listed per head (tokens, or words)."
        ),
    ] = 3,
    top: TopOpt = 10,
    index: IndexOpt = 0,
    words: WordsOpt = False,
    skip_first: SkipFirstOpt = False,
) -> None:
    """Where one word looks, in every layer and head.

    A word of several tokens (doctor = do|ct|or) looks with the mean of its tokens' rows and is looked at with the
    sum over its tokens; --words ranks the keys as words too. --top K lists the K strongest heads.

    Example: attnscope attend "The doctor said that she would help the patient." --from she --to doctor
    """
    from attnscope.analyses.attend import Attend

    analysis = Attend(from_token, to_token, from_index, to_index, index, texts.bos, tokens, top, words, skip_first)
    _run(analysis, output, texts, model)


@app.command()
@_options(texts=TEXTS, model=MODEL, batching=BATCHING, output=DRAWING_OUTPUT)
def ablate(
    texts,
    model,
    batching,
    output,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            **_domain(options.ABLATION_METHOD),
            help="loss: remove each head and measure the loss; gradient: |dL/d gate| (fast).",
        ),
    ] = "loss",
    prune: Annotated[
        int,
        typer.Option(
            "--prune",
            **_domain(options.PRUNE),
            metavar="K",
            help="Also remove the K least important heads one after another.",
        ),
    ] = 0,
    top: TopOpt = 10,
) -> None:
    """Which heads matter: the language-model loss when each head's output is removed.

    --top K lists the K most important heads; the grid and --csv show every head.

    Example: attnscope ablate "The cat sat on the mat because it was tired." --prune 20
    """
    from attnscope.analyses.ablate import Ablate

    _no_kernel("ablate", model)
    _run(Ablate(method, prune, texts.bos, **batching, top=top), output, texts, model)


@app.command()
@_options(texts=TEXTS, model=MODEL, batching=BATCHING, roles=ROLES, output=DRAWING_OUTPUT)
def circuit(
    texts,
    model,
    batching,
    roles,
    output,
    head: Annotated[
        list[str] | None,
        typer.Option(
            "--head", metavar="L.H", help="Explain this head (repeatable); default: every head of layer 1 and above."
        ),
    ] = None,
    score: _score_option(
        "Explain this score of every head; default: each head's deciding score (the one that gave it its role)."
    ) = None,
    top: TopOpt = 10,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            **_domain(options.CIRCUIT_METHOD),
            help="removal: remove each earlier head and score again (exact); gradient: attribution patching, the "
            "first-order estimate of every removal from one backward pass per explained head (for large models).",
        ),
    ] = "removal",
    steps: Annotated[
        int,
        typer.Option(
            "--steps",
            **_domain(options.STEPS),
            metavar="N",
            help="With --method gradient: 0, the gradient with every head kept (attribution patching); N, integrated "
            "gradients over N points (N times the cost; closer to exact removal, see the circuit page).",
        ),
    ] = 0,
    weights: Annotated[
        bool,
        typer.Option(
            "--weights/--no-weights",
            help="Also the composition and copying scores from the weights and each head's direct effect on the "
            "logits (loads the language-model head).",
        ),
    ] = True,
) -> None:
    """Which earlier heads each head depends on: its score with and without each of them.

    Every head of an earlier layer is removed in turn (its slice of the output projection zeroed, as ablate removes
    a head) and the explained heads are scored again on the same texts and probe. --head L.H explains only those
    heads; --top K lists each one's K largest changes, most negative first.

    Example: attnscope circuit --model demo --head 1.0 --top 3
    """
    from attnscope.analyses.circuit import Circuit

    analysis = Circuit(
        score=score, head=head, top=top, method=method, steps=steps, weights=weights, **roles, bos=texts.bos,
        **batching,
    )  # fmt: skip
    _run(analysis, output, texts, model)


@app.command()
@_options(texts=TEXTS, model=MODELS, batching=BATCHING, roles=ROLES, output=OUTPUT)
def report(
    texts,
    model,
    batching,
    roles,
    output,
    with_diversity: Annotated[
        bool, typer.Option("--diversity/--no-diversity", help="Include the diversity of all heads (one more pass).")
    ] = True,
    ablate: Annotated[
        bool,
        typer.Option(
            "--ablate", help="Also remove each head in turn and measure the loss (as `ablate`; one pass per head)."
        ),
    ] = False,
    circuit: Annotated[
        bool,
        typer.Option(
            "--circuit",
            help="Also which heads each head depends on (as `attnscope circuit`): click a head to see them, marked "
            "in the role map. One model.",
        ),
    ] = False,
) -> None:
    """Write one self-contained HTML page to explore every head, offline: roles, maps, diversity, ablation.

    Click a head to see its attention on each text, hover a token to see where it looks; the page needs no network
    and no other file. It is report.html in --out (default: attnscope-report/), and its path is printed; with
    --json or --csv the numbers are printed instead, and the page is written only with --out. Several models
    (--model repeated, or --revisions): a slider on the page switches the role map and the head's maps between them.

    Example: attnscope report --model demo --out report/
    """
    from attnscope.analyses.heads import Heads
    from attnscope.analyses.report import Report

    settings = Heads(**roles, bos=texts.bos, **batching)
    analysis = Report(settings, with_diversity, ablate, circuit)
    models = model.each()
    if len(models) == 1:
        _run(analysis, output, texts, models[0][1], default_out=Path("attnscope-report"))
    else:
        _run_several(analysis, output, texts, models, default_out=Path("attnscope-report"))


@app.command()
@_options(texts=TEXTS, models=COMPARED, batching=BATCHING, roles=ROLES, output=DRAWING_OUTPUT)
def compare(
    texts,
    models,
    batching,
    roles,
    output,
    change: Annotated[
        bool | None,
        typer.Option(
            "--change/--no-change",
            show_default=False,
            help="Measure how much each head's attention changed: the mean JS divergence (bits) between the two "
            "models' rows on the same tokens (default: on for two models; needs exactly two).",
        ),
    ] = None,
    score: _score_option(
        "The score drawn as heads × models (default: induction when the probe ran, else previous_token)."
    ) = None,
    top: TopOpt = 20,
) -> None:
    """Compare the heads of several models: checkpoints of one training run, a model and its fine-tune.

    The same texts and probe go through every model, loaded one at a time. For each head: its scores and role in
    every model, the model from which it holds each role to the end (when it formed); for two models, how much its
    attention changed. Models must share their layers × heads and their tokenizer.

    Example: attnscope compare --model EleutherAI/pythia-160m --revisions step0,step512,step1000 --out pythia/
    """
    from attnscope import api

    gathered = texts.gather()
    folder = output.folder(None)
    with _ProgressBar(output.quiet, "compare") as bar:
        result = api.compare(
            list(models.names),
            gathered,
            revisions=models.revisions,
            change=change,
            score=score,
            top=top,
            **roles,
            bos=texts.bos,
            **batching,
            device=models.device,
            dtype=models.dtype,
            device_map=models.device_map,
            kernel=models.kernel,
            progress=bar.callback,
        )
    if _is_main():
        _emit(result, output, folder)


@app.command()
@_options(model=MODEL, output=DRAWING_OUTPUT)
def bench(
    model,
    output,
    random_weights: Annotated[
        bool, typer.Option("--random-weights", help="The model's architecture with random weights (no download).")
    ] = False,
    seq_lens: Annotated[
        Numbers,
        typer.Option(
            "--seq-lens",
            parser=_numbers(options.BENCH_SEQ_LEN),
            metavar="N,N,...",
            help=f"Sequence lengths (2-{LENGTH_MAX:,}, at most the model's context).",
        ),
    ] = "128,512,1024",
    batch_sizes: Annotated[
        Numbers,
        typer.Option(
            "--batch-sizes",
            parser=_numbers(options.BENCH_BATCH),
            metavar="B,B,...",
            help=f"Batch sizes (1-{BATCH_MAX:,}; a shape that would not fit in memory is refused before it runs).",
        ),
    ] = "1,8",
    repeats: Annotated[
        int,
        typer.Option(
            "--repeats",
            **_domain(options.REPEATS),
            metavar="N",
            help="Rounds, each running every method once timed and once for memory (medians reported).",
        ),
    ] = 3,
    warmup: Annotated[
        int,
        typer.Option("--warmup", **_domain(options.WARMUP), metavar="N", help="Untimed rounds of every method first."),
    ] = 1,
    methods: Annotated[
        Names,
        typer.Option(
            "--methods",
            parser=_methods,
            metavar="floor,attnscope,tutorial,cache,fused,blocks,diversity,diversity-sampled",
            help="Which methods to time (fused, blocks: the analysis with that kernel, whatever --kernel says).",
        ),
    ] = "floor,attnscope,tutorial,cache",
    micro: Annotated[
        bool,
        typer.Option(
            "--micro/--no-micro",
            help="Also the tutorials' micro-benchmark: attention from scratch (numpy, torch) against SDPA at their "
            "d_model 512, whatever the model. Off by default: minutes on a CPU, longer than a small model's bench.",
        ),
    ] = False,
    sample_rows: Annotated[
        int,
        typer.Option(
            "--sample-rows",
            **_domain(options.BENCH_SAMPLE_ROWS),
            metavar="N",
            help="Rows per window on which the diversity-sampled method estimates JS.",
        ),
    ] = 32,
) -> None:
    """How fast is the analysis? Against a plain SDPA forward (the floor) and the usual notebook ways; with
    --methods floor,diversity,diversity-sampled, `diversity --layer all` exact and with --sample-rows; with
    --methods floor,fused,blocks, the analysis with either kernel (on a GPU; the attnscope row uses --kernel's).

    Example: attnscope bench --device cpu --random-weights --seq-lens 128,512 --batch-sizes 1
    """
    from attnscope.analyses.bench import Bench

    if model.device_map is not None:
        raise AttnscopeError("bench times a model on one device: --device-map is not for bench")
    analysis = Bench(
        model.name,
        random_weights,
        model.device,
        model.dtype,
        model.revision,
        seq_lens,
        batch_sizes,
        repeats,
        warmup,
        methods,
        micro,
        sample_rows,
        model.kernel,
    )
    _run(analysis, output)


@app.command()
@_options(model=MODEL, output=OUTPUT)
def info(model, output) -> None:
    """The model's shape: layers, heads, d_model, d_head, context, parameters, device and dtype.

    Reads the model's config.json only: no weights are loaded or downloaded.

    Example: attnscope info --model gpt2-medium
    """
    from attnscope.analyses.info import Info

    if model.device_map is not None:
        raise AttnscopeError("info reads the config only: --device-map is not for info")
    _no_kernel("info", model)
    _run(Info(model.name, model.device, model.dtype, model.revision), output)


def _no_kernel(command: str, model: Model) -> None:
    """--kernel chooses what computes attention for the commands that capture it; `command` captures none."""
    if model.kernel != "auto":
        raise AttnscopeError(
            f"{command} captures no attention: --kernel is for heads, show, diversity, attend, report and bench"
        )


# ------------------------------------------------------------------------------------------ error boundary


# Out-of-memory advice names the options of the command that ran out (bench has no --max-tokens).
_MEMORY_ADVICE = {
    "bench": "try smaller --batch-sizes or --seq-lens, or a smaller --dtype",
    "random-mha": "try a smaller --seq-len, --d-model or fewer --heads",
}
_MEMORY_ADVICE_DEFAULT = "try a smaller --batch-size or --max-tokens, shorter texts, or a smaller --dtype"
# The signal that stopped the run (SIGINT: Ctrl-C; SIGTERM: `kill`; SIGHUP: the terminal closed), 0 while none
# did: whatever a library makes of the interrupt, it was that signal.
_interrupted = 0
STOPPING_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def _on_interrupt(signum: int, frame: Any) -> None:
    """Ctrl-C, SIGTERM or SIGHUP: remember which, then interrupt as Python does for Ctrl-C, so that every `finally`
    runs (the staging folder of --out and the folders it made are removed). Code that catches the
    KeyboardInterrupt and raises something else (an import cut short turns into an ImportError inside
    transformers) still ends as interrupted."""
    global _interrupted
    _interrupted = _interrupted or signum
    raise KeyboardInterrupt


def _stopped() -> int:
    """Say, in one line, that the run was interrupted, and return the exit status of a program killed by that
    signal (128 + its number: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP)."""
    import signal

    signum = _interrupted or signal.SIGINT
    name = "" if signum == signal.SIGINT else f" ({signal.Signals(signum).name})"
    try:
        print(f"attnscope: interrupted{name}", file=sys.stderr)
    except (OSError, ValueError):  # SIGHUP: the terminal that stderr was is gone
        pass
    return 128 + signum


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on `argv` and return its exit status: the one error boundary for every command."""
    global _interrupted
    _interrupted = 0
    _usable_matplotlib_folder()
    try:
        # Commands return None; typer returns an exit status instead when one stopped early: 130 for Ctrl-C
        # (it turns KeyboardInterrupt into that itself), 0 after --help.
        status = app(args=argv, prog_name="attnscope", standalone_mode=False)
        if status == 130 or _interrupted:
            return _stopped()
        return status if isinstance(status, int) else 0
    except BaseException as error:
        if _interrupted or isinstance(error, (typer.Abort, KeyboardInterrupt)):
            return _stopped()
        message, status = _user_error(error, (argv or [""])[0] if argv else "")
        if message is None:
            raise  # a bug keeps its traceback, for the bug report
        if message:
            print(_one_line(message), file=sys.stderr)
        return status


def _user_error(error: BaseException, command: str) -> tuple[str | None, int]:
    """The line and exit status for an error a user can cause; (None, 0) for a bug."""
    if isinstance(error, AttnscopeError):
        return f"attnscope: error: {error}", 2
    if isinstance(error, click_errors.NoArgsIsHelpError):  # `attnscope` alone prints the help
        error.show()
        return "", 0
    if isinstance(error, _OptionError) and error.param is not None:  # `--window 0: must be ...`
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
        _silence_stdout()
        return "", 1
    if _out_of_memory(error):
        text = str(error).strip()
        first_line = text.splitlines()[0] if text else type(error).__name__
        advice = _MEMORY_ADVICE.get(command, _MEMORY_ADVICE_DEFAULT)
        return f"attnscope: error: out of memory ({first_line}); {advice}", 2
    return None, 0


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is left does not fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


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
    # Ctrl-C must stop a run even when the parent started us with SIGINT ignored (as shells do for `&` jobs); SIGTERM
    # and SIGHUP stop it the same way, unless they were ignored on purpose (nohup ignores SIGHUP).
    signal.signal(signal.SIGINT, _on_interrupt)
    for name in STOPPING_SIGNALS[1:]:
        if hasattr(signal, name) and signal.getsignal(getattr(signal, name)) is not signal.SIG_IGN:
            signal.signal(getattr(signal, name), _on_interrupt)
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
    sys.exit(status)
