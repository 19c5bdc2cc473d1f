"""The Python API: every command of the CLI as a function, for notebooks and scripts.

    import attnscope
    model = attnscope.load("demo")
    result = attnscope.heads(model, "The cat sat on the mat because it was tired.", window=5)
    result.to_records()   # the rows of --csv; .to_dataframe() with pandas; .to_document(), the --json document
    result                # in a notebook: the role map and the table of heads

Keywords are the CLI's options with underscores (`--batch-size` is `batch_size`), with the same defaults and the
same checks: each function builds the settings dataclass its command builds (`analyses.heads.Heads`, ...), and that
dataclass checks them, so the same options give the same result (and `to_json()` the same bytes as `--json`). Where
Python differs: TEXT is `texts`, `--model` the first argument, the repeatable `--threshold` is `thresholds` and
`--plot` takes a list, `--from`/`--to` are `from_token`/`to_token` (`from` is a Python keyword). Results are the
analyses' own (HeadsResult, ...), with the faces of `analyses.result.Result`. An error a user can cause raises
AttnscopeError, worded as the CLI's one line.

Nothing heavy is imported until a function is called: `import attnscope` stays free of torch.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attnscope import options
from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    from attnscope.analyses.ablate import AblationResult
    from attnscope.analyses.attend import AttendResult
    from attnscope.analyses.bench import BenchResult
    from attnscope.analyses.circuit import CircuitResult
    from attnscope.analyses.compare import CompareResult
    from attnscope.analyses.diversity import DiversityResult
    from attnscope.analyses.heads import HeadsResult
    from attnscope.analyses.info import InfoResult
    from attnscope.analyses.maps import ShowResult
    from attnscope.analyses.random_mha import RandomMhaResult
    from attnscope.analyses.report import ReportResult
    from attnscope.models.loading import LoadedModel
    from attnscope.pipeline.inputs import Text, Texts

    ModelGiven = LoadedModel | str | os.PathLike
    TextsGiven = str | Text | Iterable[str | Text] | Texts | None
    Progress = Callable[[int, int, float], None] | None

DEVICE_MAPS = options.DEVICE_MAPS
KERNELS = options.KERNELS

# The keywords several functions share, described once and appended to each function's docstring (`_keywords`).
SHARED = {
    "texts": """
        texts       a string, a list of strings (or Text), or None: the bundled sample texts (TEXT)
        file        a file of texts instead: separated by blank lines, or .jsonl with a "text" field (--file)
        bos         prepend the BOS token, or wrap an encoder's text in [CLS] … [SEP] (--bos/--no-bos; None: when
                    the model has them)
    """,
    "batching": """
        batch_size  windows per forward pass, padded and length-bucketed (--batch-size)
        max_tokens  padded tokens per batch at most; a long window still runs alone (--max-tokens)
    """,
    "model": """
        model       a model `load` returned, or a name to load for this call: "demo", a Hub id, a folder (--model)
        device      auto (CUDA when available), cpu, cuda or cuda:N, for a model given by name (--device)
        dtype       auto (the checkpoint's own), float32, float16 or bfloat16, for a model given by name (--dtype)
        revision    a Hub branch, tag or commit, for a model given by name (--revision)
        device_map  auto, balanced or sequential: a model given by name spread over every device (--device-map)
        kernel      auto, fused or blocks: what computes attention, for a model given by name (--kernel; see load)
    """,
    "progress": """
        progress    called after every batch with (texts read, tokens run, share of the input read from 0 to 1)
    """,
}


def _keywords(*groups: str) -> Callable[[Callable], Callable]:
    """Append the descriptions of shared keywords (SHARED) to a function's docstring, so `help()` lists them all."""

    def decorate(function: Callable) -> Callable:
        shared = "\n".join(inspect.cleandoc(SHARED[group]) for group in groups)
        function.__doc__ = f"{inspect.cleandoc(function.__doc__ or '')}\n{shared}\n"
        return function

    return decorate


# ------------------------------------------------------------------------------------------- models and texts


def load(
    name: str | os.PathLike,
    device: str = "auto",
    dtype: str = "auto",
    *,
    revision: str | None = None,
    device_map: str | None = None,
    lm_head: bool = False,
    kernel: str = "auto",
) -> LoadedModel:
    """Load a model for analysis: "demo" (bundled), a Hugging Face id ("gpt2"), or a folder saved with
    save_pretrained. Load once and pass the model to every function: a name is loaded again at every call.

    device      auto (CUDA when available), cpu, cuda or cuda:N (--device)
    dtype       auto (the checkpoint's own), float32, float16 or bfloat16 (--dtype)
    revision    a Hub branch, tag or commit (--revision)
    device_map  auto, balanced or sequential: a model too large for one device spread over all of them (--device-map;
                needs accelerate)
    lm_head     load the language-model head too, which `ablate` needs; every other function takes such a model as
                well (it analyses the base model)
    kernel      what computes attention and its statistics when it is captured: auto (fused on a GPU when triton
                imports, else blocks), fused (one Triton kernel) or blocks (--kernel)

    Under torchrun, a CUDA device becomes this process's own GPU and the process joins the group, as in the CLI.
    """
    from attnscope.models import loading
    from attnscope.pipeline import distributed, kernels

    _check_name(name)
    _check_loading(device=device, dtype=dtype, revision=revision, device_map=device_map, kernel=kernel)
    options.FLAG.check(lm_head, "lm_head")
    place = distributed.world()
    if place.size > 1 and loading.resolve_device(device).type == "cuda":
        device = f"cuda:{place.local_rank}"
    # decided now, before the weights (one line where it cannot run: Triton missing, ...); the capture reads it
    kernels.decide(kernel, loading.resolve_device(device))
    loaded = loading.load_model(os.fspath(name), device, dtype, lm_head, revision, device_map)
    loaded.kernel = kernel
    distributed.init(loaded.device)
    return loaded


def _check_name(name: Any) -> None:
    """A model's name: a non-empty string or path."""
    if isinstance(name, bytes) or not isinstance(name, (str, os.PathLike)) or not os.fspath(name).strip():
        raise AttnscopeError(
            f"model {name!r}: expected a model from attnscope.load or a name ('demo', a Hub id, a folder)"
        )


def _check_loading(**loading: Any) -> None:
    """The keywords that say how a model given by name is loaded, each in its domain."""
    domains = {
        "device": options.TEXT,  # its form is checked by loading.resolve_device, against this machine
        "dtype": options.DTYPE,
        "revision": options.TEXT.or_none(),
        "device_map": options.DEVICE_MAP,
        "kernel": options.KERNEL,
    }
    for key, value in loading.items():
        domains[key].check(value, key)


def _check_shape(analysis: Any, model: ModelGiven, revision: str | None) -> None:
    """Settings that depend on the model's shape (`--layer 99`, a head that does not exist), checked from the
    config of a model given by name before its weights load."""
    if isinstance(model, (str, os.PathLike)) and hasattr(analysis, "check_shape"):
        from attnscope.models.facts import config_shape

        _check_name(model)
        shape = config_shape(os.fspath(model), revision)
        if shape is not None:
            analysis.check_shape(shape)


def _model(given: ModelGiven, lm_head: bool = False, **loading: str | None) -> LoadedModel:
    """The model to run on: `given` itself, or loaded by name with `loading` (device, dtype, revision, device_map),
    which a model already loaded cannot take."""
    from attnscope.models.loading import LoadedModel

    if isinstance(given, (str, os.PathLike)):
        _check_loading(**{key: value for key, value in loading.items() if value is not None})
        chosen = {key: value for key, value in loading.items() if value is not None}
        device, dtype = chosen.pop("device", "auto"), chosen.pop("dtype", "auto")
        return load(given, device, dtype, **chosen, lm_head=lm_head)
    if not isinstance(given, LoadedModel):
        raise AttnscopeError(
            f"model: expected a model from attnscope.load or a name ('demo', a Hub id, a folder), not a "
            f"{type(given).__name__}"
        )
    passed = [f"{key}={value!r}" for key, value in loading.items() if value is not None]
    if passed:
        raise AttnscopeError(
            f"{', '.join(passed)}: for a model given by name; this one is already loaded (on {given.device}), so "
            "load it again with attnscope.load(...) to change that"
        )
    if lm_head and given.lm_model is None:
        raise AttnscopeError(
            f"this needs the model's language-model head: load it with attnscope.load({given.name!r}, lm_head=True), "
            "or give the model's name"
        )
    return given


def _texts(texts: TextsGiven, file: str | os.PathLike | None) -> Texts:
    """The texts as the analyses read them, checked (see `pipeline.inputs.Texts.check`): a string, a list of
    strings or Text, a Texts stream, a file, or the bundled samples. A string's source is "argument", as the CLI's
    TEXT; a list's k-th, "argument#k"."""
    from attnscope.pipeline.inputs import Text, TextList, Texts, read_file, sample_texts, valid_text

    def one(item: Any, where: str, source: str) -> Text:
        if isinstance(item, Text):
            return item
        if not isinstance(item, str):
            raise AttnscopeError(f"{where}: expected a string or a Text, not a {type(item).__name__}")
        return Text(valid_text(item, where), source)

    if texts is not None and file is not None:
        raise AttnscopeError("give texts or file, not both")
    if file is not None and (isinstance(file, bytes) or not isinstance(file, (str, os.PathLike))):
        raise AttnscopeError(f"file {file!r}: expected the path of a file of texts (a string or a path)")
    if file is not None:
        gathered: Texts = read_file(os.fspath(file))
    elif texts is None:
        gathered = TextList(sample_texts(), "the bundled samples")
    elif isinstance(texts, Texts):
        gathered = texts
    elif isinstance(texts, (str, Text)):
        gathered = TextList([one(texts, "the text given", "argument")], "the text given")
    elif isinstance(texts, Iterable) and not isinstance(texts, (bytes, Mapping)):
        items = [one(item, f"text {k} of the list", f"argument#{k}") for k, item in enumerate(texts)]
        gathered = TextList(items, "the texts given")
    else:
        raise AttnscopeError(f"texts: expected a string or a list of strings, not a {type(texts).__name__}")
    gathered.check()
    return gathered


def _run(analysis: Any, model: ModelGiven, texts: TextsGiven, file: Any, progress: Progress, **loading: Any) -> Any:
    """The CLI's flow without its printing: settings (checked when `analysis` was built), then the texts, then the
    model, then the analysis. Each step fails with one AttnscopeError before the next, costlier one begins."""
    if progress is not None and not callable(progress):
        raise AttnscopeError(f"progress {progress!r}: expected a function of (texts, tokens, share), or None")
    gathered = _texts(texts, file)
    if isinstance(model, (str, os.PathLike)):
        _check_loading(**{key: value for key, value in loading.items() if value is not None})
    _check_shape(analysis, model, loading.get("revision"))
    loaded = _model(model, getattr(analysis, "needs_lm_head", False), **loading)
    return analysis.run(loaded, gathered, progress)


# ------------------------------------------------------------------------------------------------- commands


@_keywords("texts", "batching", "model", "progress")
def heads(
    model: ModelGiven,
    texts: TextsGiven = None,
    *,
    window: int = 3,
    thresholds: Mapping[str, float] | Sequence[str] | None = None,
    probe: bool = True,
    probe_len: int | None = None,
    probe_seed: int = 0,
    layer: int | None = None,
    sort: str | None = None,
    top: int | None = None,
    plot: Sequence[str] = (),
    words: bool = False,
    file: str | os.PathLike | None = None,
    bos: bool | None = None,
    batch_size: int = 8,
    max_tokens: int | None = 16384,
    device: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    device_map: str | None = None,
    kernel: str | None = None,
    progress: Progress = None,
) -> HeadsResult:
    """Score and classify every attention head (`attnscope heads`). A notebook shows the role map and the table.

    window      the local window: the current token and the `window` tokens before it (--window)
    thresholds  roles' thresholds moved: {"previous-token": 0.6} or ["previous-token=0.6"] (--threshold)
    probe       run the repeated-random-token probe: induction and duplicate-token (--probe/--no-probe)
    probe_len   the probe's period: T random tokens, then again (--probe-len; None: 50, or what the context holds)
    probe_seed  the seed of the probe's random tokens (--probe-seed)
    layer       only this layer's heads in the table and the records (--layer)
    sort        the table and the records sorted by this score, descending: its name or column header (--sort)
    top         rows of the ranked table: the first `top` (--top); here the heads table, which the records are
    plot        heads "L.H" whose attention maps `save` draws (--plot)
    words       the maps of `plot` word by word (--words)
    """
    from attnscope.analyses.heads import Heads

    analysis = Heads(
        window=window,
        thresholds=thresholds,
        bos=bos,
        batch_size=batch_size,
        max_tokens=max_tokens,
        probe=probe,
        probe_len=probe_len,
        probe_seed=probe_seed,
        plot=plot,
        words=words,
        layer=layer,
        sort=sort,
        top=top,
    )
    return _run(
        analysis,
        model,
        texts,
        file,
        progress,
        device=device,
        dtype=dtype,
        revision=revision,
        device_map=device_map,
        kernel=kernel,
    )


@_keywords("texts", "model")
def show(
    model: ModelGiven,
    texts: TextsGiven = None,
    *,
    layer: int,
    head: int | None = None,
    index: int = 0,
    words: bool = False,
    file: str | os.PathLike | None = None,
    bos: bool | None = None,
    device: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    device_map: str | None = None,
    kernel: str | None = None,
) -> ShowResult:
    """One layer's attention maps (or one head's) for one text (`attnscope show`). A notebook shows each map as a
    shaded table; `save(folder)` draws the picture.

    layer       the layer, 0-based (--layer)
    head        only this head (--head)
    index       which text, 0-based (--index)
    words       the maps word by word: to a word, the sum over its tokens; from a word, the mean (--words)
    """
    from attnscope.analyses.maps import Show

    analysis = Show(layer, head, index, bos, words)
    return _run(
        analysis,
        model,
        texts,
        file,
        None,
        device=device,
        dtype=dtype,
        revision=revision,
        device_map=device_map,
        kernel=kernel,
    )


@_keywords("texts", "batching", "model", "progress")
def diversity(
    model: ModelGiven,
    texts: TextsGiven = None,
    *,
    layer: int | str | None,
    redundant: float = 0.1,
    cluster_at: float = 0.3,
    top: int = 5,
    sample_rows: int = 0,
    seed: int = 0,
    file: str | os.PathLike | None = None,
    bos: bool | None = None,
    batch_size: int = 8,
    max_tokens: int | None = 16384,
    device: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    device_map: str | None = None,
    kernel: str | None = None,
    progress: Progress = None,
) -> DiversityResult:
    """How different the heads are: cosine and Jensen–Shannon between every pair (`attnscope diversity`).

    layer       a layer (0-based), or "all" (or None): every head of the model (--layer)
    redundant   JSD (bits) below which two heads are near-duplicates (--redundant)
    cluster_at  JSD (bits) below which average-linkage clusters merge (--cluster-at)
    top         rows of each ranked table: the first `top` (--top): the most redundant pairs, the most distinct
    sample_rows JS estimated on this many random scored rows per window, with standard errors (--sample-rows;
                0: every row, exact)
    seed        the seed of the rows `sample_rows` draws (--seed)
    """
    from attnscope.analyses.diversity import Diversity

    analysis = Diversity(
        layer,
        bos,
        batch_size,
        max_tokens,
        redundant=redundant,
        cluster_at=cluster_at,
        top=top,
        sample_rows=sample_rows,
        seed=seed,
    )
    return _run(
        analysis,
        model,
        texts,
        file,
        progress,
        device=device,
        dtype=dtype,
        revision=revision,
        device_map=device_map,
        kernel=kernel,
    )


@_keywords("texts", "model")
def attend(
    model: ModelGiven,
    texts: TextsGiven = None,
    *,
    from_token: str,
    to_token: str | None = None,
    from_index: int | None = None,
    to_index: int | None = None,
    tokens: int = 3,
    top: int = 10,
    index: int = 0,
    words: bool = False,
    skip_first: bool = False,
    file: str | os.PathLike | None = None,
    bos: bool | None = None,
    device: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    device_map: str | None = None,
    kernel: str | None = None,
) -> AttendResult:
    """Where one token looks, in every layer and head (`attnscope attend`).

    from_token  the word (or token) that looks, without its leading space; WORD@K for its K-th occurrence (--from)
    to_token    the word (or token) looked at, WORD@K as for from_token (--to; None: each head's top keys)
    from_index  which occurrence of from_token, 0-based (--from-index; None: 0, or the K of WORD@K)
    to_index    which occurrence of to_token, 0-based (--to-index; None: every one the query sees, summed)
    tokens      top keys listed per head (--tokens)
    top         rows of the ranked table: the first `top` (--top): the strongest heads
    index       which text, 0-based (--index)
    words       keys ranked as words rather than tokens (--words)
    skip_first  leave the first token (the attention sink) out of the ranking of keys and heads (--skip-first)
    """
    from attnscope.analyses.attend import Attend

    analysis = Attend(from_token, to_token, from_index, to_index, index, bos, tokens, top, words, skip_first)
    return _run(
        analysis,
        model,
        texts,
        file,
        None,
        device=device,
        dtype=dtype,
        revision=revision,
        device_map=device_map,
        kernel=kernel,
    )


@_keywords("texts", "batching", "model", "progress")
def ablate(
    model: ModelGiven,
    texts: TextsGiven = None,
    *,
    method: str = "loss",
    prune: int = 0,
    top: int = 10,
    file: str | os.PathLike | None = None,
    bos: bool | None = None,
    batch_size: int = 8,
    max_tokens: int | None = 16384,
    device: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    device_map: str | None = None,
    progress: Progress = None,
) -> AblationResult:
    """Which heads matter: the language-model loss with each head's output removed (`attnscope ablate`). A model
    already loaded must have been loaded with `load(..., lm_head=True)`; one given by name is loaded so.

    method      loss: remove each head and measure the loss; gradient: |dL/d gate|, one backward pass (--method)
    prune       also remove the `prune` least important heads one after another (--prune)
    top         rows of the ranked table: the first `top` (--top): the most important heads
    """
    from attnscope.analyses.ablate import Ablate

    analysis = Ablate(method, prune, bos, batch_size, max_tokens, top=top)
    return _run(
        analysis, model, texts, file, progress, device=device, dtype=dtype, revision=revision, device_map=device_map
    )


@_keywords("texts", "batching", "model", "progress")
def circuit(
    model: ModelGiven,
    texts: TextsGiven = None,
    *,
    head: Sequence[str] | None = None,
    score: str | None = None,
    top: int = 10,
    method: str = "removal",
    steps: int = 0,
    weights: bool = True,
    window: int = 3,
    thresholds: Mapping[str, float] | Sequence[str] | None = None,
    probe: bool = True,
    probe_len: int | None = None,
    probe_seed: int = 0,
    file: str | os.PathLike | None = None,
    bos: bool | None = None,
    batch_size: int = 8,
    max_tokens: int | None = 16384,
    device: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    device_map: str | None = None,
    kernel: str | None = None,
    progress: Progress = None,
) -> CircuitResult:
    """Which earlier heads each head depends on: its score with and without each of them (`attnscope circuit`).
    With `weights` (the default), a model already loaded must have been loaded with `load(..., lm_head=True)`; one
    given by name is loaded so.

    head        the heads explained, "L.H" labels (--head; None: every head of layer 1 and above)
    score       the score explained, for every head (--score; None: each head's deciding score)
    top         dependencies listed per head, the largest |change| (--top)
    method      removal: each earlier head removed exactly; gradient: attribution patching's estimate (--method)
    steps       gradient only: 0, the gradient at every head kept; N, integrated gradients over N points (--steps)
    weights     also composition and copying from the weights and each head's direct effect (--weights/--no-weights)
    window      the local window: the current token and the `window` tokens before it (--window)
    thresholds  roles' thresholds moved: {"previous-token": 0.6} or ["previous-token=0.6"] (--threshold)
    probe       run the repeated-random-token probe: induction and duplicate-token (--probe/--no-probe)
    probe_len   the probe's period: T random tokens, then again (--probe-len; None: 50, or what the context holds)
    probe_seed  the seed of the probe's random tokens (--probe-seed)
    """
    from attnscope.analyses.circuit import Circuit

    analysis = Circuit(
        score=score,
        head=head,
        top=top,
        method=method,
        steps=steps,
        weights=weights,
        window=window,
        thresholds=thresholds,
        bos=bos,
        batch_size=batch_size,
        max_tokens=max_tokens,
        probe=probe,
        probe_len=probe_len,
        probe_seed=probe_seed,
    )
    return _run(
        analysis,
        model,
        texts,
        file,
        progress,
        device=device,
        dtype=dtype,
        revision=revision,
        device_map=device_map,
        kernel=kernel,
    )


@_keywords("texts", "batching", "model", "progress")
def report(
    model: ModelGiven | Sequence[ModelGiven],
    texts: TextsGiven = None,
    *,
    diversity: bool = True,
    ablate: bool = False,
    circuit: bool = False,
    revisions: Sequence[str] | str | None = None,
    window: int = 3,
    thresholds: Mapping[str, float] | Sequence[str] | None = None,
    probe: bool = True,
    probe_len: int | None = None,
    probe_seed: int = 0,
    file: str | os.PathLike | None = None,
    bos: bool | None = None,
    batch_size: int = 8,
    max_tokens: int | None = 16384,
    device: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    device_map: str | None = None,
    kernel: str | None = None,
    progress: Progress = None,
) -> ReportResult:
    """Everything the report page shows (`attnscope report`): `save(folder)` writes report.html; a notebook shows
    the role map, the heads and the diversity.

    model       one model, or a list of models (loaded or names) to show on one page with a slider over them: the
                same texts through each, one at a time (--model, repeated); they must share layers × heads and the
                tokenizer
    revisions   revisions of one Hub repository (`model` its name), each a model of the page, labelled by its
                revision: a list, or "step0,step512,step1000" (--revisions)
    diversity   include the diversity of all heads: one more pass (--diversity/--no-diversity)
    ablate      also the loss with each head removed, as `ablate` (--ablate); a model already loaded must have been
                loaded with `load(..., lm_head=True)`
    circuit     also which heads each head depends on, as `attnscope circuit` (--circuit; one model)
    window, thresholds, probe, probe_len, probe_seed: as for `heads`
    """
    from attnscope.analyses.heads import Heads
    from attnscope.analyses.report import Report

    settings = Heads(
        window=window,
        thresholds=thresholds,
        bos=bos,
        batch_size=batch_size,
        max_tokens=max_tokens,
        probe=probe,
        probe_len=probe_len,
        probe_seed=probe_seed,
    )
    analysis = Report(settings, diversity, ablate, circuit)
    loading = {"device": device, "dtype": dtype, "device_map": device_map, "kernel": kernel}
    several = _several_models(model, revision, revisions)
    if several is None:
        return _run(analysis, model, texts, file, progress, revision=revision, **loading)
    return _run_several(analysis, several, texts, file, progress, **loading)


def _several_models(
    model: Any, revision: str | None, revisions: Sequence[str] | str | None
) -> list[tuple[str, Any, str | None]] | None:
    """The models of a report of several, `(label, model, revision)` in order, or None for one model."""
    from attnscope.analyses.report import model_labels

    if revisions is not None:
        if isinstance(revisions, str):
            revisions = [part.strip() for part in revisions.split(",")]
        if not isinstance(revisions, Sequence) or not revisions or not all(isinstance(r, str) for r in revisions):
            raise AttnscopeError(f"revisions {revisions!r}: expected revisions of one model, e.g. ['step0', 'step512']")
        if any(not r.strip() for r in revisions):
            raise AttnscopeError(f"revisions {list(revisions)!r}: a revision is empty")
        if revision is not None:
            raise AttnscopeError("revision and revisions (--revision, --revisions): give one or the other")
        if not isinstance(model, (str, os.PathLike)):
            raise AttnscopeError(
                "revisions (--revisions) are revisions of one model given by name (a Hub id): give one model's name"
            )
        return [(label, model, label) for label in model_labels([], [r.strip() for r in revisions])]
    if not isinstance(model, (list, tuple)):
        return None
    if not model:
        raise AttnscopeError("model []: give at least one model")
    names: list[str] = []
    for k, given in enumerate(model):
        if isinstance(given, (str, os.PathLike)):
            names.append(os.fspath(given))
            continue
        if any(given is other for other in model[:k]):
            raise AttnscopeError(f"model {getattr(given, 'name', given)!r} is given twice: give each model once")
        name = os.fspath(getattr(given, "name", type(given).__name__))  # a loaded model: its folder's name
        name = os.path.basename(os.path.normpath(name)) if os.path.isdir(name) else name
        copies = sum(other == name or other.startswith(f"{name} (") for other in names)
        names.append(f"{name} ({copies + 1})" if copies else name)  # copies of one model, changed in memory
    return [(label, given, revision) for label, given in zip(model_labels(names), model, strict=True)]


def _run_several(
    analysis: Any,
    models: list[tuple[str, Any, str | None]],
    texts: TextsGiven,
    file: Any,
    progress: Progress,
    **loading: Any,
) -> Any:
    """`_run` for a report of several models: every setting and every model's config checked first, then each model
    loaded in turn by the analysis (a model given loaded is used as it is)."""
    import functools

    if progress is not None and not callable(progress):
        raise AttnscopeError(f"progress {progress!r}: expected a function of (texts, tokens, share), or None")
    if len(models) == 1:  # one model in a list, or one revision: a report of one model
        label, given, revision = models[0]
        return _run(analysis, given, texts, file, progress, revision=revision, **loading)
    analysis.check_several()
    from attnscope.models.checks import check_same_shapes
    from attnscope.models.facts import config_shape

    gathered = _texts(texts, file)
    sources, shapes = [], []
    for k, (label, given, revision) in enumerate(models):
        lm_head = k == 0 and getattr(analysis, "needs_lm_head", False)  # the ablation is the first model's
        if isinstance(given, (str, os.PathLike)):
            _check_loading(**{key: value for key, value in loading.items() if value is not None}, revision=revision)
            _check_shape(analysis, given, revision)
            shapes.append((label, config_shape(os.fspath(given), revision)))
            sources.append((label, functools.partial(_model, given, lm_head, revision=revision, **loading)))
        else:
            sources.append((label, _model(given, lm_head, revision=revision, **loading)))
    check_same_shapes(shapes)  # before any weight loads
    return analysis.run_models(sources, gathered, progress)


@_keywords("texts", "batching", "progress")
def compare(
    model: ModelGiven | Sequence[ModelGiven],
    texts: TextsGiven = None,
    *,
    revisions: Sequence[str] | str | None = None,
    change: bool | None = None,
    score: str | None = None,
    top: int = 20,
    window: int = 3,
    thresholds: Mapping[str, float] | Sequence[str] | None = None,
    probe: bool = True,
    probe_len: int | None = None,
    probe_seed: int = 0,
    file: str | os.PathLike | None = None,
    bos: bool | None = None,
    batch_size: int = 8,
    max_tokens: int | None = 16384,
    device: str | None = None,
    dtype: str | None = None,
    device_map: str | None = None,
    kernel: str | None = None,
    progress: Progress = None,
) -> CompareResult:
    """Compare the heads of several models on the same texts and probe (`attnscope compare`): each head's scores
    and role in every model, when each role formed, and for two models how much its attention changed. Models given
    by name are loaded one at a time and freed; models already loaded are used as they are.

    model       the models in order (checkpoints from the earliest): names ("demo", a Hub id, a folder) or models
                `load` returned; one name with `revisions` (--model, repeated)
    revisions   Hub revisions of the one model given, in order: ["step0", "step512"] or "step0,step512"
                (--revisions); each model is then labelled by its revision
    change      measure each head's change between two models: the mean JS divergence in bits between their rows
                (--change/--no-change; None: for exactly two models)
    score       the score of the heads × models heatmap (--score; None: induction when measured)
    top         rows of the ranked tables: heads by change, heads whose role changes (--top)
    window      the local window: the current token and the `window` tokens before it (--window)
    thresholds  roles' thresholds moved: {"previous-token": 0.6} or ["previous-token=0.6"] (--threshold)
    probe       run the repeated-random-token probe: induction and duplicate-token (--probe/--no-probe)
    probe_len   the probe's period (--probe-len; None: 50, or what the context holds)
    probe_seed  the seed of the probe's random tokens (--probe-seed)
    device      auto, cpu, cuda or cuda:N, for the models given by name (--device)
    dtype       auto, float32, float16 or bfloat16, for the models given by name (--dtype)
    device_map  auto, balanced or sequential, for the models given by name (--device-map)
    kernel      auto, fused or blocks, for the models given by name (--kernel)
    """
    from attnscope.analyses.compare import Checkpoint, Compare, model_label, unique_labels
    from attnscope.models.loading import LoadedModel

    analysis = Compare(
        window=window,
        thresholds=thresholds,
        bos=bos,
        batch_size=batch_size,
        max_tokens=max_tokens,
        probe=probe,
        probe_len=probe_len,
        probe_seed=probe_seed,
        revisions=revisions,
        change=change,
        score=score,
        top=top,
    )
    if progress is not None and not callable(progress):
        raise AttnscopeError(f"progress {progress!r}: expected a function of (texts, tokens, share), or None")
    gathered = _texts(texts, file)
    given = [model] if isinstance(model, (str, os.PathLike, LoadedModel)) else model
    if isinstance(given, (bytes, Mapping)) or not isinstance(given, Iterable):
        raise AttnscopeError(f"model {model!r}: expected a list of models (names or models from attnscope.load)")
    given = list(given)
    loading = {"device": device, "dtype": dtype, "device_map": device_map, "kernel": kernel}
    names = []
    for item in given:
        if isinstance(item, LoadedModel):
            _model(item, **loading)  # a loaded model takes no loading keyword: refused now, before any run
            names.append(item.name)
        else:
            _check_name(item)
            names.append(os.fspath(item))
    if any(not isinstance(item, LoadedModel) for item in given):
        _check_loading(**{key: value for key, value in loading.items() if value is not None})
    if analysis.revisions is not None and any(isinstance(item, LoadedModel) for item in given):
        raise AttnscopeError("revisions: give the model by name, to be loaded at each revision")
    sources = analysis.sources(names)
    analysis.check_count(len(sources))
    items = given * len(sources) if analysis.revisions is not None else given  # each source's model as given
    labels, note = unique_labels([model_label(name, revision) for name, revision in sources], [n for n, _ in sources])
    known, known_labels = [], []  # the shapes read from the configs of the models given by name, before any load
    for label, (name, revision), item in zip(labels, sources, items, strict=True):
        if not isinstance(item, LoadedModel):
            shapes = _Shapes()
            _check_shape(shapes, name, revision)
            known += shapes.found
            known_labels += [label] * len(shapes.found)
    analysis.check_shapes(known, known_labels)
    checkpoints = []
    for label, (name, revision), item in zip(labels, sources, items, strict=True):
        if isinstance(item, LoadedModel):
            checkpoints.append(Checkpoint(label, name, None, lambda item=item: item, owned=False))
        else:
            chosen = {**loading, "revision": revision}
            load = functools.partial(_model, name, **chosen)
            checkpoints.append(Checkpoint(label, name, revision, load))
    result = analysis.run(checkpoints, gathered, progress)
    if note is not None:
        result.notes.insert(0, note)
    return result


class _Shapes:
    """Collects the shapes `_check_shape` reads from each model's config, for `compare` to set side by side."""

    def __init__(self) -> None:
        self.found: list[Any] = []

    def check_shape(self, shape: Any) -> None:
        self.found.append(shape)


@_keywords("model")
def info(
    model: ModelGiven,
    *,
    device: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    device_map: str | None = None,
) -> InfoResult:
    """The model's shape: layers, heads, d_model, d_head, context, attention parameters, device, dtype
    (`attnscope info`). A model given by name is not loaded: its config.json alone is read, as the CLI does."""
    from attnscope.analyses.info import Info

    if isinstance(model, (str, os.PathLike)):
        _check_name(model)
        if device_map is not None:
            raise AttnscopeError("info reads the config only: device_map is not for info")
        return Info(os.fspath(model), device or "auto", dtype or "auto", revision).run()
    loaded = _model(model, device=device, dtype=dtype, revision=revision, device_map=device_map)
    return Info(loaded.name).run(loaded)


def random_mha(
    *,
    d_model: int = 64,
    heads: Sequence[int] = (1, 2, 4, 8),
    seq_len: int = 32,
    trials: int = 4,
    seed: int = 0,
) -> RandomMhaResult:
    """How different are the heads of a random (untrained) attention layer, by their number (`attnscope
    random-mha`)? No model and no text.

    d_model     the model width (--d-model)
    heads       head counts, each dividing d_model (--heads)
    seq_len     tokens per random sequence (--seq-len)
    trials      random layers averaged per head count (--trials)
    seed        the seed of the random weights and inputs (--seed)
    """
    from attnscope.analyses.random_mha import RandomMha

    return RandomMha(d_model, heads, seq_len, trials, seed).run()


def bench(
    model: str | os.PathLike = "gpt2",
    *,
    random_weights: bool = False,
    device: str = "auto",
    dtype: str = "auto",
    revision: str | None = None,
    seq_lens: Sequence[int] = (128, 512, 1024),
    batch_sizes: Sequence[int] = (1, 8),
    repeats: int = 3,
    warmup: int = 1,
    methods: Sequence[str] = ("floor", "attnscope", "tutorial", "cache"),
    micro: bool = False,
    sample_rows: int = 32,
    kernel: str = "auto",
) -> BenchResult:
    """How fast is the analysis, against a plain SDPA forward and the usual notebook ways (`attnscope bench`)?

    model       the name of the model to time (--model): bench loads it itself, or builds it with random weights
    random_weights  the model's architecture with random weights: nothing to download (--random-weights)
    device      auto, cpu, cuda or cuda:N (--device)
    dtype       auto, float32, float16 or bfloat16 (--dtype)
    revision    a Hub branch, tag or commit (--revision)
    seq_lens    sequence lengths (--seq-lens)
    batch_sizes batch sizes (--batch-sizes)
    repeats     rounds, each running every method once timed and once for memory; medians reported (--repeats)
    warmup      untimed rounds of every method first (--warmup)
    methods     which methods to time: floor, attnscope, tutorial, cache, diversity, diversity-sampled (--methods)
    micro       also the tutorials' micro-benchmark at d_model 512, whatever the model (--micro; off by default: it
                takes minutes on a CPU, longer than a small model's bench)
    sample_rows rows per window on which diversity-sampled estimates JS (--sample-rows)
    kernel      what computes the attnscope method's attention: auto, fused or blocks (--kernel)
    """
    from attnscope.analyses.bench import Bench

    if not isinstance(model, (str, os.PathLike)):
        raise AttnscopeError("bench loads the model itself (or builds it with random weights): give its name")
    _check_name(model)
    analysis = Bench(
        os.fspath(model),
        random_weights,
        device,
        dtype,
        revision,
        seq_lens,
        batch_sizes,
        repeats,
        warmup,
        methods,
        micro,
        sample_rows,
        kernel,
    )
    return analysis.run()
