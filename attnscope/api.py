"""The Python API, and the only way in: every command is one function here, which resolves its inputs, loads its
model, runs its analysis and returns the result. The command line (attnscope.cli) parses options, calls the same
function and renders what it returns, so the two cannot drift apart.

    import attnscope
    model = attnscope.load("demo")
    result = attnscope.heads(model, "The cat sat on the mat because it was tired.", window=5)
    result.to_records()   # the rows of --csv; .to_dataframe() with pandas; .to_document(), the --json document
    result                # in a notebook: the role map and the table of heads

A function's keywords are its command's settings (attnscope.settings), each declared once: `--batch-size` is
`batch_size`, with the same default and the same check, so the same options give the same result (and `to_json()`
the same bytes as `--json`). Their signatures and the keyword lists of their docstrings are made from those
declarations (`command`), and so are their types for type checkers and IDEs (attnscope/api.pyi, written by
scripts/generate_stubs.py). Where Python differs: TEXT is `texts` (a string, a list, or None for the samples), the
model (`--model`) is the first argument (a name, or a model `load` returned), a repeated option is a list,
`--from`/`--to` are `from_token`/`to_token`. An error a user can cause raises AttnscopeError, worded as the CLI's one
line; a keyword the function does not take raises TypeError, as Python does.

Nothing heavy is imported until a function is called: `import attnscope` stays free of torch.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attnscope import options, registry, settings
from attnscope.errors import AttnscopeError, NoLanguageModelHead
from attnscope.models.loading import DEMO, LoadedModel  # light: no torch until a model loads
from attnscope.models.locating import local_kind
from attnscope.models.sources import ModelSource, check_name, check_once, is_folder, labels, name_notes

Planned = settings.Planned  # a status line announcing a large piece of work (the command line keeps it as a note)

if TYPE_CHECKING:
    from attnscope.pipeline.inputs import Texts

LOADING = tuple(declaration.name for declaration in settings.Loading.declarations())


# ------------------------------------------------------------------------------------------------- declarations


def _inputs(declared: type[settings.Settings]) -> list[settings.Setting]:
    """What a command's function takes besides its settings: the model and the texts first (positional), then the
    callbacks, as its contract says."""
    model = settings.MODELS if declared.models == settings.SEVERAL else settings.MODEL
    if not declared.takes_loaded:  # bench: a name, which it loads (or builds) itself
        model = dataclasses.replace(model, python_help="a name to load: 'demo', a Hub id, a folder")
    first = [] if declared.models == settings.NONE else [model]
    first += [_texts(declared)] if declared.reads_texts else []
    last = [settings.PROGRESS] if declared.reads_texts else []
    last += [settings.STATUS] if declared.models != settings.NONE else []
    return first + last


def _texts(declared: type[settings.Settings]) -> settings.Setting:
    """The TEXT of a command: the bundled samples when none is given, or the command's own texts (`default_texts`)."""
    if declared.default_texts is None:
        return settings.TEXTS
    return dataclasses.replace(
        settings.TEXTS,
        help=f"Text to analyse; '-' reads stdin; omitted: {declared.default_texts}.",
        python_help=f"a string, a list of strings (or Text), or None: {declared.default_texts}",
    )


def keywords(declared: type[settings.Settings]) -> list[settings.Setting]:
    """Every keyword of a command's function, in order: its inputs and its settings (the CLI builds its options from
    the same list)."""
    inputs = _inputs(declared)
    positional = [item for item in inputs if item.name in ("model", "texts")]
    return positional + declared.declarations() + [item for item in inputs if item not in positional]


def _signature(declared: type[settings.Settings], returns: Any) -> inspect.Signature:
    def parameter(item: settings.Setting) -> inspect.Parameter:
        kind = (
            inspect.Parameter.POSITIONAL_OR_KEYWORD
            if item.name in ("model", "texts")
            else inspect.Parameter.KEYWORD_ONLY
        )
        default = inspect.Parameter.empty if item.required else item.default
        return inspect.Parameter(item.name, kind, default=default)

    return inspect.Signature([parameter(item) for item in keywords(declared)], return_annotation=returns)


def command(declared: type[settings.Settings]) -> Callable[[Callable], Callable]:
    """Give a command's function the keywords of its settings: its signature (what `help()`, a notebook and the
    docs show), the keyword list of its docstring, and a call that binds what it is given to them, every default
    applied, as Python binds a function's arguments (an unknown keyword is a TypeError)."""

    def decorate(function: Callable) -> Callable:
        signature = _signature(declared, inspect.signature(function).return_annotation)

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{function.__name__}(): {error}") from None
            bound.apply_defaults()
            return function(**bound.arguments)

        lines = "\n".join(item.docstring_line() for item in keywords(declared))
        call.__doc__ = f"{inspect.cleandoc(function.__doc__ or '')}\n\n{lines}\n"
        call.__signature__ = signature
        call.settings = declared  # what the CLI builds the command's options from
        return call

    return decorate


# ------------------------------------------------------------------------------------------------- models and texts


def load(
    name: str | os.PathLike,
    device: str = settings.Place.device,
    dtype: str = settings.Place.dtype,
    *,
    revision: str | None = settings.Revision.revision,
    device_map: str | None = settings.DeviceMap.device_map,
    lm_head: bool | None = None,
    kernel: str = settings.Kernel.kernel,
) -> LoadedModel:
    """Load a model for analysis: "demo" (bundled), a Hugging Face id ("gpt2"), or a folder saved with
    save_pretrained. Load once and pass the model to every function: a name is loaded again at every call.

    lm_head     the language-model head, which `ablate`, `patch`, `discover` and `kvplan(check=True)` read; every
                other function analyses the base model and takes either. None (the default): with the head where
                the checkpoint has one, so that every function takes the model; True: with it, or refused; False:
                without it (saves its memory: a large vocabulary's head can be a tenth of a model)

    Under torchrun, a CUDA device becomes this process's own GPU and the process joins the group, as in the CLI.
    """
    from attnscope.models import loading
    from attnscope.pipeline import distributed, kernels

    check_name(name)
    chosen = settings.Loading(device=device, dtype=dtype, revision=revision, device_map=device_map, kernel=kernel)
    if lm_head is not None:
        options.FLAG.check(lm_head, "lm_head")
    device = chosen.device
    place = distributed.world()
    if place.size > 1 and loading.resolve_device(device).type == "cuda":
        device = f"cuda:{place.local_rank}"
    # decided now, before the weights (one line where it cannot run: Triton missing, ...); the capture reads it
    kernels.decide(chosen.kernel, loading.resolve_device(device))
    try:
        loaded = loading.load_model(
            os.fspath(name), device, chosen.dtype, lm_head is not False, chosen.revision, chosen.device_map
        )
    except NoLanguageModelHead:
        if lm_head:
            raise
        loaded = loading.load_model(os.fspath(name), device, chosen.dtype, False, chosen.revision, chosen.device_map)
    loaded.kernel = chosen.kernel
    distributed.init(loaded.device)
    return loaded


load.__doc__ = load.__doc__.replace(  # indented as the docstring's own lines, so that help() aligns them
    "    lm_head ",
    "".join(f"    {line}\n" for item in settings.Loading.declarations() for line in item.docstring_line().splitlines())
    + "    lm_head ",
)


def read_texts(texts: Any, file: str | None) -> Texts:
    """The texts as the analyses read them, checked (see `pipeline.inputs.Texts.check`): a string, a list of
    strings or Text, a Texts stream, a file ('-': standard input), or the bundled samples. A string's source is
    "argument", as the CLI's TEXT; a list's k-th, "argument#k"."""
    from attnscope.pipeline.reading import texts_given

    return texts_given(texts, file)


def _loading(analysis: settings.Settings) -> dict[str, Any]:
    """The settings that say how `analysis` loads a model given by name (those its command declares)."""
    declared = {item.name for item in analysis.declarations()}
    return {name: getattr(analysis, name) for name in LOADING if name in declared}


def model_sources(
    given: Any, analysis: settings.Settings, status: Callable[[str], None] | None
) -> tuple[list[ModelSource], str | None]:
    """The models `analysis` runs on, as sources (models.sources): names to load (at each of its `revisions`, where
    it has them) and models already loaded, labelled, each given once; and a note where two labels had to be told
    apart."""
    several = isinstance(given, (list, tuple)) and analysis.models == settings.SEVERAL
    items = list(given) if several else [given]
    if not items:
        raise AttnscopeError("model []: give at least one model")
    for item in items:
        if not isinstance(item, LoadedModel):
            check_name(item)
    loading = _loading(analysis)
    for item in items:
        if isinstance(item, LoadedModel):
            _check_untouched(loading, item)
    revisions: list[str | None] = [loading.pop("revision", None)] * len(items)
    chosen = analysis.revisions
    if chosen is not None:
        if revisions[0] is not None:
            raise AttnscopeError("revision and revisions (--revision, --revisions): give one or the other")
        if len(items) != 1 or isinstance(items[0], LoadedModel):
            raise AttnscopeError(
                f"revisions (--revisions) are revisions of one model given by name (a Hub id), but "
                f"{len(items)} models were given: give one model's name, or each model on its own"
            )
        name = os.fspath(items[0])
        if name == DEMO or is_folder(name):
            raise AttnscopeError(
                f"revisions (--revisions) {','.join(chosen)}: model {name!r} is {local_kind(name)}, which has no "
                "revisions; they pick branches, tags or commits of one model on the Hugging Face Hub"
            )
        items, revisions = items * len(chosen), list(chosen)
    check_once(items, revisions)
    names = [item.name if isinstance(item, LoadedModel) else os.fspath(item) for item in items]
    shown, note = labels(names, revisions)
    sources = []
    for label, name, revision, item in zip(shown, names, revisions, items, strict=True):
        if isinstance(item, LoadedModel):
            sources.append(ModelSource(label, name, None, functools.partial(_given, item), owned=False))
        else:
            there = name != DEMO and os.path.isdir(options.expanded_path(name, "--model"))  # a folder, now
            load_it = functools.partial(_load_named, name, revision, loading, status, there)
            sources.append(ModelSource(label, name, revision, load_it))
    return sources, note


def _check_untouched(loading: dict[str, Any], loaded: LoadedModel) -> None:
    """A model already loaded takes no loading setting but the defaults: it stays where and as it is."""
    defaults = {item.name: item.default for item in settings.Loading.declarations()}
    passed = [f"{name}={value!r}" for name, value in loading.items() if value != defaults[name]]
    if passed:
        raise AttnscopeError(
            f"{', '.join(passed)}: for a model given by name; this one is already loaded (on {loaded.device}), so "
            "load it again with attnscope.load(...) to change that"
        )


def _given(loaded: LoadedModel, lm_head: bool) -> LoadedModel:
    if lm_head and loaded.lm_model is None:
        raise AttnscopeError(
            f"this needs the model's language-model head, and this one was loaded without it: load it with "
            f"attnscope.load({loaded.name!r}) (lm_head=False leaves it out), or give the model's name"
        )
    return loaded


def _load_named(
    name: str,
    revision: str | None,
    loading: dict[str, Any],
    status: Callable[[str], None] | None,
    folder: bool,
    lm_head: bool,
) -> LoadedModel:
    """Load a model given by name, when its turn comes; a `folder` when the run began that is gone by then is said
    to be gone (it would otherwise be taken for a Hub id, and the Hub's library would complain of its spelling)."""
    if folder and not os.path.isdir(os.path.expanduser(name)):
        raise AttnscopeError(
            f"model {name!r}: the folder is gone (it was there when the run began): it was moved or deleted while "
            "attnscope ran; give it again once it is back"
        )
    if status is not None:
        status(f"loading {name}{'' if revision is None else f' at {revision}'} …")
    return load(name, **loading, revision=revision, lm_head=lm_head)


def _shape(source: ModelSource) -> Any:
    """A model's shape before its weights load: from its config (None where it cannot be read yet; loading says
    why), or from the model already loaded."""
    from attnscope.models.facts import config_shape

    if not source.owned:
        return source.open().shape
    return config_shape(source.name, source.revision)


def _callable(value: Any, name: str, takes: str) -> None:
    if value is not None and not callable(value):
        raise AttnscopeError(f"{name} {options.shown(value)}: expected a function of {takes}, or None")


def _run(analysis_class: type[settings.Settings], given: dict[str, Any]) -> Any:
    """The one flow of every command: its settings (checked when built), then its place among torchrun's processes,
    its texts, its models' configs (what the settings ask of their shape, and that several models agree), then each
    model loaded and the analysis run. Each step fails with one AttnscopeError before the next, costlier one begins;
    what a reader should know of the environment and the models' names goes into the result's notes."""
    from attnscope.pipeline.distributed import world

    model, texts = given.pop("model", None), given.pop("texts", None)
    progress, status = given.pop("progress", None), given.pop("status", None)
    analysis = analysis_class(**given)
    _callable(progress, "progress", "(texts, tokens, share)")
    _callable(status, "status", "one line of text")
    place = world()
    notes = [place.note] if place.note else []
    if analysis.models in (settings.NONE, settings.OWN):
        analysis.check_processes(place.size)
    if analysis.models == settings.NONE:
        return _noted(analysis.run(), notes)
    if analysis.models == settings.OWN:
        return _run_own(analysis, model, status, notes)
    gathered = _read_inputs(analysis, texts)
    sources, note = model_sources(_model_named(model, analysis), analysis, status)
    notes += _checked_sources(analysis, sources, place.size)
    if len(sources) > 1:
        _join(analysis, place)
        return _noted(analysis.run_models(sources, gathered, progress), notes + ([note] if note else []))
    loaded = sources[0].open(analysis.needs_lm_head)
    analysis.check_shape(loaded.shape)
    planned = analysis.planned_work(loaded, gathered) if status is not None else None
    if planned:
        status(Planned(planned))
    return _noted(analysis.run(loaded, gathered, progress), notes)


def _run_own(analysis: settings.Settings, model: Any, status: Any, notes: list[str]) -> Any:
    """bench's and info's run: on a name they load or read themselves, or (info) on a model already loaded."""
    if isinstance(model, LoadedModel):
        _check_untouched(_loading(analysis), model)
    else:
        check_name(model)
        model = os.fspath(model)
        notes = notes + name_notes(model)
    return _noted(analysis.run(model, status=status), notes)


def _read_inputs(analysis: settings.Settings, texts: Any) -> Any:
    """What the command reads: its own inputs (`read_inputs`), None where its run makes its own texts for the model
    (kvplan's passkey probe), or the texts given (the samples when none are)."""
    if not analysis.reads_texts:
        return analysis.read_inputs()
    if texts is None and analysis.file is None and analysis.default_texts is not None:
        return None
    return read_texts(texts, analysis.file)


def _model_named(model: Any, analysis: settings.Settings) -> Any:
    """The model given, or the default where none is (only several models' commands leave it out: one model's
    default is the declared gpt2); revisions need a model named."""
    if model is not None:
        return model
    if analysis.revisions is not None:
        raise AttnscopeError(
            "revisions (--revisions) are revisions of a model: name it with --model (e.g. --model "
            "EleutherAI/pythia-160m --revisions step0,step512)"
        )
    return settings.DEFAULT_MODEL


def _checked_sources(analysis: settings.Settings, sources: list[ModelSource], processes: int) -> list[str]:
    """Check, before any weight loads, how many models there are (and torchrun's processes for them) and each one's
    config: what the settings ask of its shape, and that several agree. The first note on a model's name."""
    from attnscope.models.checks import check_same_shapes

    analysis.check_models(len(sources))
    analysis.check_processes(processes, len(sources))
    notes = [text for source in sources if source.owned for text in name_notes(source.name)][:1]
    shapes = [(source.label, _shape(source)) for source in sources]
    for _, shape in shapes:
        if shape is not None:
            analysis.check_shape(shape)
    check_same_shapes(shapes)
    return notes


def _join(analysis: settings.Settings, place: Any) -> None:
    """Under torchrun, join the processes' group before several models are shared among them: a process with no
    model to load (more processes than pieces of work) would otherwise never join (a model's `load` joins it), and
    the others would wait for it for ever. On the device the models load on: NCCL for CUDA, gloo otherwise."""
    if place.size == 1:
        return
    from attnscope.models import loading
    from attnscope.pipeline import distributed

    device = loading.resolve_device(analysis.device)  # report's and compare's --device (settings.Place)
    distributed.init(loading.resolve_device(f"cuda:{place.local_rank}") if device.type == "cuda" else device)


def is_main_process() -> bool:
    """Whether this process shows results and writes files: the only one, or rank 0 of torchrun's (an environment
    torchrun did not make whole is refused in one line: `pipeline.distributed.world`)."""
    from attnscope.pipeline.distributed import world

    return world().is_main


def process_rank() -> int:
    """This process's rank among torchrun's (0 for the only process); raises AttnscopeError as `is_main_process`."""
    from attnscope.pipeline.distributed import world

    return world().rank


def stopped_waiting() -> bool:
    """Whether a stopping signal (Ctrl-C, SIGTERM) ended this process's wait for torchrun's other processes, before
    they met: no rank 0 then says so for it."""
    from attnscope.pipeline.distributed import stopped_waiting

    return stopped_waiting()


def _noted(result: Any, notes: list[str]) -> Any:
    """`result` with `notes` first among its own."""
    if notes:
        result.notes = list(notes) + [text for text in result.notes if text not in notes]
    return result


# ------------------------------------------------------------------------------------------------- commands


def _function(entry: registry.Command) -> Callable[..., Any]:
    """The Python function of a command (its record in `registry`): the analysis the record names, run on what the
    function is given (`_run`), with the keywords and docstring `command` makes from its settings."""

    def run(**given: Any) -> Any:
        module, _, name = entry.analysis.rpartition(".")
        return _run(getattr(importlib.import_module(module), name), given)

    run.__name__ = run.__qualname__ = entry.function
    run.__module__ = __name__
    run.__doc__ = entry.doc
    run.__annotations__ = {"return": entry.result.rpartition(".")[2]}
    function = command(entry.settings)(run)
    function.command = entry  # its record: what the command line shows of it (its help)
    return function


# the command line's name of each function, in the order `attnscope --help` lists them; each is also this module's
# attribute of its Python name (`api.heads`, `api.random_mha`), as `attnscope.heads` is
COMMANDS: dict[str, Callable[..., Any]] = {entry.name: _function(entry) for entry in registry.COMMANDS}
globals().update({function.__name__: function for function in COMMANDS.values()})
