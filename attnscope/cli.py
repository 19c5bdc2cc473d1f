"""The command line: parse options, call the library, render. The only module that knows about Typer.

Heavy imports (torch, transformers, matplotlib) happen inside the commands, so `attnscope --help` stays fast.
Every AttnscopeError and usage error ends as one line on stderr with exit status 2 (see `main`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

try:  # typer >= 0.25 carries its own copy of click
    from typer._click import exceptions as click_errors
    from typer._click.core import ParameterSource
except ImportError:  # older typer runs on click itself
    from click import exceptions as click_errors
    from click.core import ParameterSource

from attnscope.errors import AttnscopeError

app = typer.Typer(
    name="attnscope",
    help="What every attention head of a transformer does: roles, scores, pictures.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Options shared by the commands, defined once.
TextArg = Annotated[
    Optional[str], typer.Argument(help="Text to analyse; '-' reads stdin; omitted: the bundled sample texts.", show_default=False)
]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Hugging Face id or a directory saved with save_pretrained.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N (auto: CUDA when available).")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="auto (the checkpoint's), float32, float16 or bfloat16.")]
FileOpt = Annotated[
    Optional[str], typer.Option("--file", "-f", help="Texts separated by blank lines, or .jsonl with a 'text' field.")
]
BosOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--bos/--no-bos",
        help="Prepend the BOS token, or wrap in [CLS] … [SEP] for an encoder (default: on when the model has them).",
        show_default=False,
    ),
]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Windows per forward pass (padded, length-bucketed).")]
MaxTokensOpt = Annotated[
    int, typer.Option("--max-tokens", help="Padded tokens per batch at most (a long window still runs alone).")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (schema_version 1) to stdout instead of tables.")]
CsvOpt = Annotated[bool, typer.Option("--csv", help="Print CSV (one row per head) to stdout instead of tables.")]


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def _is_main() -> bool:
    """Only rank 0 prints and writes under torchrun."""
    from attnscope import distributed

    return distributed.world().is_main


def _check_output_flags(json_out: bool, csv_out: bool) -> None:
    if json_out and csv_out:
        raise AttnscopeError("give --json or --csv, not both")


def _emit(notes, doc: dict, records: list[dict], folder, write_files, json_out: bool, csv_out: bool) -> bool:
    """The common ending of a command: notes on stderr, `write_files(folder)` for --out, then --json or --csv on
    stdout. Returns False when neither was asked for, and the command renders its tables."""
    from attnscope import export

    for message in notes:
        _note(message)
    if folder is not None:
        written = export.write_all(folder, write_files)
        _note(f"wrote {len(written)} files to {folder}")
    if json_out:
        sys.stdout.write(export.to_json(doc))
    elif csv_out:
        sys.stdout.write(export.to_csv(records))
    return json_out or csv_out


def _load(model: str, device: str, dtype: str, lm_head: bool = False):
    """Load the model; under torchrun, join the process group and take this rank's GPU."""
    from attnscope import distributed
    from attnscope.model import load_model, resolve_device

    place = distributed.world()
    if place.size > 1 and resolve_device(device).type == "cuda":
        device = f"cuda:{place.local_rank}"
    loaded = load_model(model, device, dtype, lm_head=lm_head)
    distributed.init(loaded.device)
    return loaded


class _ProgressBar:
    """A rich progress bar on stderr (texts, tokens/s, ETA), shown only when stdout is a terminal and not --quiet;
    rank 0 only under torchrun. Use as a context manager; `callback` is None when hidden. The bar and its ETA follow
    tokens, not texts: batches run longest first, so texts are done slowly at first and quickly at the end."""

    def __init__(self, quiet: bool, label: str):
        from attnscope import distributed

        self.shown = not quiet and sys.stdout.isatty() and distributed.world().is_main
        self.label = label
        self.callback = self._update if self.shown else None

    def __enter__(self) -> "_ProgressBar":
        if self.shown:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn(self.label), BarColumn(), TextColumn("{task.fields[texts]}"),
                TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=_console(stderr=True), transient=True,
                auto_refresh=False,  # a refresh thread competing with torch's threads made runs several times slower
            )
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=None, texts="", rate="")
            self.started = self.refreshed = time.perf_counter()
        return self

    def _update(self, texts: int, tokens: int, total_texts: int, total_tokens: int) -> None:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        self.bar.update(
            self.task, completed=tokens, total=total_tokens, texts=f"{texts:,}/{total_texts:,} texts",
            rate=f"{tokens / elapsed:,.0f} tokens/s",
        )
        now = time.perf_counter()
        if now - self.refreshed > 0.1 or tokens == total_tokens:  # at most 10 redraws a second
            self.refreshed = now
            self.bar.refresh()

    def __exit__(self, *exc) -> None:
        if self.shown:
            self.bar.__exit__(*exc)


@app.command()
def heads(
    text: TextArg = None,
    model: ModelOpt = "gpt2",
    file: FileOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    bos: BosOpt = None,
    batch_size: BatchOpt = 8,
    window: Annotated[int, typer.Option("--window", "-w", help="Local window: the current token and the W before it.")] = 3,
    threshold: Annotated[
        Optional[list[str]], typer.Option("--threshold", "-t", help="ROLE=VALUE, e.g. previous-token=0.6 (repeatable).")
    ] = None,
    sort: Annotated[Optional[str], typer.Option("--sort", help="Sort the table by this score, descending.")] = None,
    top: Annotated[Optional[int], typer.Option("--top", help="Show only the first K heads.")] = None,
    layer: Annotated[Optional[int], typer.Option("--layer", "-l", help="Show only the heads of this layer.")] = None,
    json_out: JsonOpt = False,
    csv_out: CsvOpt = False,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write heads.json, heads.csv and PNG pictures here.")] = None,
    plot: Annotated[
        Optional[list[str]], typer.Option("--plot", "-p", help="Also draw the attention map of head L.H (repeatable).")
    ] = None,
    probe: Annotated[
        bool, typer.Option("--probe/--no-probe", help="Run the repeated-random-token probe (induction, duplicate-token).")
    ] = True,
    probe_len: Annotated[
        Optional[int], typer.Option("--probe-len", help="Period T of the probe: T random tokens, then again. [default: 50]")
    ] = None,
    probe_seed: Annotated[int, typer.Option("--probe-seed", help="Seed of the probe's random tokens.")] = 0,
    max_tokens: MaxTokensOpt = 16384,
    quiet: QuietOpt = False,
) -> None:
    """Score and classify every attention head.

    Example: attnscope heads "The cat sat on the mat because it was tired." --sort previous_token --top 10
    """
    from attnscope import analysis, export, inputs, roles

    _check_output_flags(json_out, csv_out)
    thresholds = roles.parse_thresholds(threshold)
    analysis.check_selection(sort, top)
    if plot and out is None:
        raise AttnscopeError("--plot draws into the folder of --out: give --out DIR too")
    texts = inputs.gather_texts(text, file)
    folder = export.prepare_out_dir(out) if out is not None else None
    loaded = _load(model, device, dtype)
    sort_name = analysis.check_selection(sort, top, loaded.causal, probe)
    if layer is not None:
        analysis.check_layer(layer, loaded.n_layer)
    # each head drawn once, in the order first asked for
    plotted = list(dict.fromkeys(analysis.parse_head(label, loaded.n_layer, loaded.n_head) for label in plot or []))
    with _ProgressBar(quiet, "heads") as bar:
        result = analysis.analyze_heads(
            loaded, texts, window=window, bos=bos, batch_size=batch_size, thresholds=thresholds,
            keep_layers=sorted({layer_ for layer_, _ in plotted}), probe=probe, probe_len=probe_len,
            probe_seed=probe_seed, max_tokens=max_tokens, progress=bar.callback,
        )
    if not _is_main():
        return
    selected = analysis.select_heads(result.heads, layer, sort, top)
    settings = {"batch_size": batch_size, "max_tokens": max_tokens, "layer": layer, "sort": sort, "top": top, "probe": probe}
    doc = export.heads_document(result, selected, settings)

    def write_files(folder):
        from attnscope import render_files

        return render_files.heads_files(result, plotted, folder, settings)

    if not _emit(result.notes, doc, doc["heads"], folder, write_files, json_out, csv_out):
        from attnscope import terminal

        console = _console()
        info = result.model
        console.print(
            terminal.role_map(result.heads, info["n_layer"], info["n_head"], f"Head roles: {info['name']}  "
            f"({result.inputs['n_texts']} texts, {result.inputs['n_tokens']} tokens)")
        )
        console.print(terminal.heads_table(selected, "Heads", sort_name))


@app.command()
def show(
    text: TextArg = None,
    layer: Annotated[int, typer.Option("--layer", "-l", help="Layer to draw (0-based).")] = ...,
    head: Annotated[Optional[int], typer.Option("--head", help="Draw only this head, larger.")] = None,
    index: Annotated[int, typer.Option("--index", help="Which input text to draw (0-based).")] = 0,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the PNG.")] = Path("."),
    model: ModelOpt = "gpt2",
    file: FileOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    bos: BosOpt = None,
) -> None:
    """Draw one layer's attention maps (or one head's) with token labels, as PNG.

    Example: attnscope show "The doctor said that she would help the patient." --layer 5 --out pictures/
    """
    from attnscope import analysis, export, inputs

    texts = inputs.gather_texts(text, file)
    if not 0 <= index < len(texts):
        raise AttnscopeError(f"--index {index} is out of range ({len(texts)} text(s) given)")
    folder = export.prepare_out_dir(out)
    loaded = _load(model, device, dtype)
    if head is not None:
        analysis.parse_head(f"{layer}.{head}", loaded.n_layer, loaded.n_head)
    attention, notes = analysis.layer_attention(loaded, texts[index], layer, bos)
    for message in notes:
        _note(message)
    from attnscope import render_files

    (path,) = export.write_all(folder, lambda stage: [render_files.show_file(attention, head, stage, loaded.name)])
    print(path)


@app.command()
def attend(
    text: TextArg = None,
    from_token: Annotated[str, typer.Option("--from", help="The token that looks (its text, without the leading space).")] = ...,
    to_token: Annotated[
        Optional[str], typer.Option("--to", help="The token looked at; omitted: each head's top tokens.")
    ] = None,
    from_index: Annotated[int, typer.Option("--from-index", help="Which occurrence of --from (0-based).")] = 0,
    to_index: Annotated[
        Optional[int], typer.Option("--to-index", help="Which occurrence of --to (0-based); default: all, summed.")
    ] = None,
    top: Annotated[int, typer.Option("--top", help="Top tokens listed per head.")] = 3,
    n_heads: Annotated[int, typer.Option("--heads", help="Strongest heads shown in the table.")] = 10,
    index: Annotated[int, typer.Option("--index", help="Which input text to use (0-based).")] = 0,
    model: ModelOpt = "gpt2",
    file: FileOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    bos: BosOpt = None,
    json_out: JsonOpt = False,
    csv_out: CsvOpt = False,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write attend.json, attend.csv and attend.png here.")] = None,
) -> None:
    """Where one token looks, in every layer and head.

    Example: attnscope attend "The doctor said that she would help the patient." --from she --to doctor
    """
    from attnscope import export, inputs
    from attnscope.attend import attend as attend_token

    _check_output_flags(json_out, csv_out)
    if top < 1 or n_heads < 1:
        raise AttnscopeError("--top and --heads must be at least 1")
    if from_index < 0 or (to_index is not None and to_index < 0):
        raise AttnscopeError("--from-index and --to-index count occurrences from 0")
    texts = inputs.gather_texts(text, file)
    if not 0 <= index < len(texts):
        raise AttnscopeError(f"--index {index} is out of range ({len(texts)} text(s) given)")
    folder = export.prepare_out_dir(out) if out is not None else None
    loaded = _load(model, device, dtype)
    result = attend_token(loaded, texts[index], from_token, to_token, from_index, to_index, bos)
    settings = {"from_index": from_index, "to_index": to_index, "top": top, "heads": n_heads, "index": index}
    doc = export.attend_document(result, top, n_heads, settings)
    records = export.attend_records(result, top)

    def write_files(folder):
        from attnscope import render_files

        return render_files.attend_files(result, doc, records, folder)

    if not _emit(result.notes, doc, records, folder, write_files, json_out, csv_out):
        from attnscope import terminal

        console = _console()
        source = f"{result.tokens[result.from_position]!r}@{result.from_position}"
        if result.to_weight is not None:
            targets = ", ".join(str(p) for p in result.to_positions)
            grid_title = f"Attention from {source} to {result.to_token!r} (position {targets}), layer × head"
            console.print(terminal.layer_head_grid(result.to_weight, grid_title))
        else:
            console.print(terminal.layer_head_grid(result.rows.max(axis=-1), f"Largest weight of each head from {source}"))
        by_label = {record["label"]: record for record in records}
        strongest = [by_label[f"{layer}.{head}"] for layer, head in result.strongest(n_heads)]
        console.print(terminal.attend_table(strongest, top, f"Strongest heads from {source}"))


@app.command()
def ablate(
    text: TextArg = None,
    method: Annotated[
        str, typer.Option("--method", help="loss: remove each head and measure the loss; gradient: |dL/d gate| (fast).")
    ] = "loss",
    prune: Annotated[int, typer.Option("--prune", help="Also remove the K least important heads one after another.")] = 0,
    top: Annotated[int, typer.Option("--top", help="Heads shown in the table.")] = 10,
    model: ModelOpt = "gpt2",
    file: FileOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    bos: BosOpt = None,
    batch_size: BatchOpt = 8,
    json_out: JsonOpt = False,
    csv_out: CsvOpt = False,
    out: Annotated[
        Optional[Path], typer.Option("--out", "-o", help="Write ablate.json, ablate.csv and PNG pictures here.")
    ] = None,
) -> None:
    """Which heads matter: the language-model loss when each head's output is removed.

    Example: attnscope ablate "The cat sat on the mat because it was tired." --prune 20
    """
    from attnscope import ablation, export, inputs

    _check_output_flags(json_out, csv_out)
    if method not in ablation.METHODS:
        raise AttnscopeError(f"--method '{method}': use one of {', '.join(ablation.METHODS)}")
    if top < 1 or prune < 0 or batch_size < 1:
        raise AttnscopeError("--top and --batch-size must be at least 1, --prune at least 0")
    texts = inputs.gather_texts(text, file)
    folder = export.prepare_out_dir(out) if out is not None else None
    loaded = _load(model, device, dtype, lm_head=True)
    result = ablation.ablate(loaded, texts, method, prune, bos, batch_size)
    settings = {"method": method, "prune": prune, "batch_size": batch_size}
    doc = export.ablate_document(result, settings)
    records = export.ablate_records(result)

    def write_files(folder):
        from attnscope import render_files

        return render_files.ablate_files(result, doc, records, folder)

    if not _emit(result.notes, doc, records, folder, write_files, json_out, csv_out):
        from attnscope import terminal

        console = _console()
        unit = "loss increase (nats)" if method == "loss" else "|dL/d gate|"
        console.print(f"baseline loss {result.baseline_loss:.4f} nats/token over {result.inputs['predicted_tokens']} predicted tokens")
        console.print(terminal.layer_head_grid(result.importance, f"Head importance, {unit}", unit_range=False))
        by_label = {record["label"]: record for record in records}
        ranked = [by_label[f"{layer}.{head}"] for layer, head in result.ranked()[:top]]
        console.print(terminal.records_table(ranked, f"Most important heads ({method})"))
        if result.prune:
            console.print(terminal.records_table(result.prune, "Loss as the least important heads are removed"))


@app.command()
def report(
    text: TextArg = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for report.html.")] = Path("attnscope-report"),
    model: ModelOpt = "gpt2",
    file: FileOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    bos: BosOpt = None,
    batch_size: BatchOpt = 8,
    probe: Annotated[
        bool, typer.Option("--probe/--no-probe", help="Run the repeated-random-token probe (induction, duplicate-token).")
    ] = True,
    with_diversity: Annotated[
        bool, typer.Option("--diversity/--no-diversity", help="Include the diversity of all heads (one more pass).")
    ] = True,
    max_tokens: MaxTokensOpt = 16384,
    quiet: QuietOpt = False,
) -> None:
    """Write one self-contained HTML page (no network needed to read it): roles, scores, diversity, maps.

    Example: attnscope report --model demo --out report/
    """
    from attnscope import analysis, export, inputs
    from attnscope import report as report_page

    texts = inputs.gather_texts(text, file)
    folder = export.prepare_out_dir(out)
    loaded = _load(model, device, dtype)
    with _ProgressBar(quiet, "heads") as bar:
        result = analysis.analyze_heads(
            loaded, texts, bos=bos, batch_size=batch_size, probe=probe, max_tokens=max_tokens, progress=bar.callback
        )
    layers = sorted({record.layer for record in report_page.characteristic_heads(result.heads)})
    result.attention, _ = analysis.attention_maps(loaded, texts[0], layers, bos)
    settings = {"batch_size": batch_size, "max_tokens": max_tokens, "probe": probe}
    heads_doc = export.heads_document(result, result.heads, settings)
    diversity_result = diversity_doc = None
    if with_diversity:
        with _ProgressBar(quiet, "diversity") as bar:
            diversity_result = analysis.analyze_diversity(
                loaded, texts, None, bos=bos, batch_size=batch_size, max_tokens=max_tokens, progress=bar.callback
            )
        diversity_doc = export.diversity_document(diversity_result, 5)
    if not _is_main():
        return
    for message in result.notes:
        _note(message)
    page = report_page.render(result, heads_doc, diversity_result, diversity_doc)
    (path,) = export.write_all(folder, lambda stage: [export.write_atomic(stage / "report.html", page)])
    print(path)


# The `diversity` parameters that only a model run reads, and those that only --random-mha reads.
MODEL_RUN_PARAMETERS = (
    "text", "layer", "model", "file", "device", "dtype", "bos", "batch_size", "redundant", "cluster_at", "pairs", "max_tokens",
)
RANDOM_MHA_PARAMETERS = ("d_model", "heads", "seq_len", "trials", "seed")


def _refuse_given(ctx: typer.Context, names: tuple[str, ...], reason: str) -> None:
    """One error naming every parameter of `names` that the command line gave (a default is not given)."""
    given = [
        "/".join([param.opts[0], *param.secondary_opts]) if param.param_type_name == "option" else param.name.upper()
        for param in ctx.command.params
        if param.name in names and ctx.get_parameter_source(param.name) is not ParameterSource.DEFAULT
    ]
    if given:
        raise AttnscopeError(f"{', '.join(given)}: {reason}")


@app.command()
def diversity(
    ctx: typer.Context,
    text: TextArg = None,
    layer: Annotated[Optional[str], typer.Option("--layer", "-l", help="Layer number (0-based) or 'all'.")] = None,
    model: ModelOpt = "gpt2",
    file: FileOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    bos: BosOpt = None,
    batch_size: BatchOpt = 8,
    redundant: Annotated[float, typer.Option("--redundant", help="JSD (bits) below which two heads are near-duplicates.")] = 0.1,
    cluster_at: Annotated[float, typer.Option("--cluster-at", help="JSD (bits) below which average-linkage clusters merge.")] = 0.3,
    pairs: Annotated[int, typer.Option("--pairs", help="How many most redundant and most distinct pairs to list.")] = 5,
    json_out: JsonOpt = False,
    csv_out: Annotated[bool, typer.Option("--csv", help="Print every pair of heads as CSV to stdout.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write JSON, CSV and PNG matrices here.")] = None,
    random_mha: Annotated[
        bool, typer.Option("--random-mha", help="Instead: random multi-head attention, diversity against head count.")
    ] = False,
    d_model: Annotated[int, typer.Option("--d-model", help="--random-mha: model width.")] = 64,
    heads: Annotated[str, typer.Option("--heads", help="--random-mha: head counts, comma-separated.")] = "1,2,4,8",
    seq_len: Annotated[int, typer.Option("--seq-len", help="--random-mha: tokens per random sequence.")] = 32,
    trials: Annotated[int, typer.Option("--trials", help="--random-mha: random layers averaged per head count.")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="--random-mha: seed.")] = 0,
    max_tokens: MaxTokensOpt = 16384,
    quiet: QuietOpt = False,
) -> None:
    """How different are the heads? Cosine and Jensen–Shannon between every pair of heads of a layer (or all).

    Example: attnscope diversity --layer 5 --pairs 10; attnscope diversity --layer all --out results/
    """
    from attnscope import export

    _check_output_flags(json_out, csv_out)
    if random_mha:
        _refuse_given(ctx, MODEL_RUN_PARAMETERS, "not used by --random-mha, which runs random attention (no model, no text)")
    else:
        _refuse_given(ctx, RANDOM_MHA_PARAMETERS, "used with --random-mha only")
    folder = export.prepare_out_dir(out) if out is not None else None
    if random_mha:
        _random_mha(d_model, heads, seq_len, trials, seed, json_out, csv_out, folder)
        return
    from attnscope import analysis, inputs

    if pairs < 1:
        raise AttnscopeError("--pairs must be at least 1")
    texts = inputs.gather_texts(text, file)
    if layer is None:
        raise AttnscopeError("--layer is required: a layer number (0-based) or 'all'")
    loaded = _load(model, device, dtype)
    chosen = analysis.parse_layer_choice(layer, loaded.n_layer)
    with _ProgressBar(quiet, "diversity") as bar:
        result = analysis.analyze_diversity(
            loaded, texts, chosen, bos, batch_size, redundant, cluster_at, max_tokens=max_tokens, progress=bar.callback
        )
    if not _is_main():
        return
    doc = export.diversity_document(result, pairs)

    def write_files(folder):
        from attnscope import render_files

        return render_files.diversity_files(result, folder, doc)

    if _emit(result.notes, doc, result.pairs(), folder, write_files, json_out, csv_out):
        return
    from attnscope import terminal

    console = _console()
    scope = "all heads" if chosen is None else f"layer {chosen}"
    console.print(terminal.layer_scores_table(result.layer_scores, f"Head diversity: {loaded.name}, {scope}"))
    if chosen is not None and len(result.labels) <= 16:
        console.print(terminal.matrix_table(result.js, result.labels, "JS divergence between heads (bits)"))
    console.print(terminal.pairs_table(result.ranked_pairs(pairs, True), "Most redundant pairs (lowest JSD)"))
    console.print(terminal.pairs_table(result.ranked_pairs(pairs, False), "Most distinct pairs (highest JSD)"))
    groups = "; ".join(", ".join(group) for group in result.groups) or "none"
    console.print(f"Near-duplicate groups (JSD < {result.redundant} bits): {groups}")
    if chosen is None:
        clusters = "; ".join(", ".join(group) for group in result.clusters) or "none"
        console.print(f"Clusters (average linkage below {result.cluster_at} bits): {clusters}")


def _random_mha(d_model, heads, seq_len, trials, seed, json_out, csv_out, folder) -> None:
    from attnscope import export
    from attnscope.experiments import random_mha_diversity

    counts = sorted(set(_numbers(heads, "--heads")))  # each count once, ascending like the plot's axis
    rows = random_mha_diversity(d_model, counts, seq_len, trials=trials, seed=seed)
    settings = {"d_model": d_model, "heads": counts, "seq_len": seq_len, "trials": trials, "seed": seed}
    doc = export.random_mha_document(rows, settings)

    def write_files(folder):
        from attnscope import render_files

        return [
            export.write_atomic(folder / "random_mha.json", export.to_json(doc)),
            render_files.random_mha_file(rows, folder, d_model),
        ]

    if not _emit([], doc, rows, folder, write_files, json_out, csv_out):
        from attnscope import terminal

        title = f"Random multi-head attention (d_model {d_model}, {seq_len} tokens, {trials} trials): diversity by heads"
        _console().print(terminal.records_table(rows, title))


def _numbers(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise AttnscopeError(f"{option} '{text}': expected comma-separated numbers") from None
    if not values:
        raise AttnscopeError(f"{option}: give at least one number")
    return values


@app.command()
def bench(
    model: ModelOpt = "gpt2",
    random_weights: Annotated[
        bool, typer.Option("--random-weights", help="The model's architecture with random weights (no download).")
    ] = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    seq: Annotated[str, typer.Option("--seq", help="Sequence lengths, comma-separated.")] = "128,512,1024",
    batch: Annotated[str, typer.Option("--batch", help="Batch sizes, comma-separated.")] = "1,8",
    repeats: Annotated[
        int, typer.Option("--repeats", help="Rounds, each running every method once timed and once for memory (medians reported).")
    ] = 3,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed rounds of every method first.")] = 1,
    methods: Annotated[str, typer.Option("--methods", help="Which of floor,attnscope,tutorial,cache.")] = "floor,attnscope,tutorial,cache",
    micro: Annotated[bool, typer.Option("--micro/--no-micro", help="Also the from-scratch attention micro-benchmark.")] = True,
    json_out: JsonOpt = False,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write bench.json and tokens_per_s.png here.")] = None,
) -> None:
    """How fast is the analysis? Against a plain SDPA forward (the floor) and the usual notebook ways.

    Example: attnscope bench --device cpu --random-weights --seq 128,512 --batch 1
    """
    from attnscope import bench as bench_lib, export
    from attnscope.model import resolve_device, resolve_dtype

    # Every option a user can get wrong is checked here, before a model is loaded or built (seconds to minutes).
    torch_device = resolve_device(device)
    resolve_dtype(dtype)
    chosen = [name.strip() for name in methods.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(bench_lib.METHODS))
    if unknown or not chosen:
        raise AttnscopeError(f"--methods: use some of {', '.join(bench_lib.METHODS)}")
    seqs, batches = _numbers(seq, "--seq"), _numbers(batch, "--batch")
    bench_lib.check_settings(seqs, batches, repeats, warmup)
    folder = export.prepare_out_dir(out) if out is not None else None
    notes = []
    network, name = _bench_network(model, random_weights, torch_device, dtype, seqs, notes)
    import torch

    measurements = bench_lib.run_bench(network, torch_device, seqs, batches, warmup, repeats, chosen)
    rows = bench_lib.records(measurements)
    micro_rows = bench_lib.micro_benchmark(device=torch_device) if micro else []
    machine = {
        "device": str(torch_device),
        "device_name": torch.cuda.get_device_name(torch_device) if torch_device.type == "cuda" else "cpu",
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "dtype": str(next(network.parameters()).dtype).removeprefix("torch."),
    }
    doc = export.document(
        "bench", {"name": name, "n_layer": network.config.num_hidden_layers, "n_head": network.config.num_attention_heads,
                  "d_model": network.config.hidden_size},
        {}, {"seq": seqs, "batch": batches, "repeats": repeats, "warmup": warmup, "methods": chosen, **machine},
        notes, results=rows, micro=micro_rows,
    )

    def write_files(folder):
        from attnscope import render_files

        return [
            export.write_atomic(folder / "bench.json", export.to_json(doc)),
            render_files.bench_file(rows, folder, name, machine),
        ]

    if _emit(notes, doc, rows, folder, write_files, json_out, False):
        return
    from attnscope import terminal

    console = _console()
    where = f"{machine['device_name']}, {machine['cpu_threads']} CPU threads, {machine['dtype']}"
    console.print(terminal.bench_table(rows, f"attnscope bench: {name} on {where}"))
    if micro_rows:
        console.print(terminal.records_table(micro_rows, "From-scratch multi-head attention vs SDPA, ms per call (one 256-token sequence)"))


def _check_bench_model(config) -> None:
    """The bench's baselines (the tutorials' LM-head loop, TransformerLens-style caching) are written for GPT-2."""
    from attnscope.model import CAUSAL_MODEL_TYPES

    if config.model_type not in CAUSAL_MODEL_TYPES:
        raise AttnscopeError(
            f"bench times GPT-2-family decoders only; model type '{config.model_type}' is not supported by bench yet"
        )


def _bench_network(model: str, random_weights: bool, device, dtype: str, seqs: list[int], notes: list[str]):
    """The model to time and its name: `model` itself, or its architecture with random weights (with
    --random-weights, or when the weights are unavailable; GPT-2 small's when even the config is). The config is
    checked (model family, context against --seq) before any weights are loaded or built."""
    from transformers import GPT2Config

    from attnscope import bench as bench_lib
    from attnscope.model import load_config, load_model, resolve_dtype

    config = load_config(model)
    if config is not None:
        _check_bench_model(config)
        bench_lib.check_context(seqs, config.max_position_embeddings)
    if not random_weights:
        try:
            return load_model(model, str(device), dtype).model, model
        except AttnscopeError as error:
            notes.append(f"weights unavailable ({error}); timing random weights instead")
    if config is None:
        notes.append(f"config of '{model}' unavailable; using GPT-2 small's architecture")
        config = GPT2Config()
        bench_lib.check_context(seqs, config.max_position_embeddings)
    return bench_lib.random_model(config, device, resolve_dtype(dtype)), f"{model} (random weights)"


@app.command()
def info(
    model: ModelOpt = "gpt2",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    json_out: JsonOpt = False,
) -> None:
    """The model's shape: layers, heads, d_model, d_head, context, attention parameters, device and dtype.

    Example: attnscope info --model gpt2-medium
    """
    from attnscope import export

    facts = _load(model, device, dtype).info()
    if json_out:
        sys.stdout.write(export.to_json(export.document("info", facts, {}, {}, [])))
        return
    from attnscope import terminal

    matches = "matches" if facts["attention_params"] == facts["attention_params_formula"] else "DIFFERS from"
    rows = [
        ("model", facts["name"]),
        ("type", facts["model_type"]),
        ("layers", str(facts["n_layer"])),
        ("heads per layer", str(facts["n_head"])),
        ("d_model", str(facts["d_model"])),
        ("d_head", str(facts["d_head"])),
        ("context", f"{facts['n_ctx']} tokens"),
        ("vocabulary", f"{facts['vocab_size']:,}"),
        ("parameters", f"{facts['n_params']:,}"),
        ("attention block", f"{facts['attention_params']:,} ({matches} 4·d² + 4·d = {facts['attention_params_formula']:,})"),
        ("device", facts["device"]),
        ("dtype", facts["dtype"]),
    ]
    _console().print(terminal.key_value_table(rows, "Model"))


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on `argv` and return its exit status: the one error boundary for every command."""
    try:
        # Commands return None; typer returns an exit status instead when one stopped early: 130 for Ctrl-C
        # (it turns KeyboardInterrupt into that itself), 0 after --help.
        status = app(args=argv, prog_name="attnscope", standalone_mode=False)
        if status == 130:
            print("attnscope: interrupted", file=sys.stderr)
        return status if isinstance(status, int) else 0
    except AttnscopeError as error:
        print(f"attnscope: error: {error}", file=sys.stderr)
        return 2
    except click_errors.NoArgsIsHelpError as error:  # `attnscope` alone prints the help
        error.show()
        return 0
    except click_errors.UsageError as error:
        hint = f" (see: attnscope {error.ctx.info_name} --help)" if error.ctx is not None and error.ctx.parent else ""
        print(f"attnscope: error: {error.format_message()}{hint}", file=sys.stderr)
        return 2
    except click_errors.ClickException as error:
        print(f"attnscope: error: {error.format_message()}", file=sys.stderr)
        return 2
    except (typer.Abort, KeyboardInterrupt):
        print("attnscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`attnscope heads | head`): stop quietly. Point stdout at /dev/null so
        # that the interpreter's last flush does not fail again; rich does the same for its own writes (exit 1).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (MemoryError, RuntimeError) as error:
        if not _out_of_memory(error):
            raise
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(
            f"attnscope: error: out of memory ({first_line}); try a smaller --batch-size or --max-tokens, "
            "shorter texts, or a smaller --dtype",
            file=sys.stderr,
        )
        return 2


def _out_of_memory(error: BaseException) -> bool:
    """Whether `error` is running out of host or device memory, which a user causes with the size of the input
    (torch raises RuntimeError on the CPU: "can't allocate memory", and torch.OutOfMemoryError on a GPU)."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error).lower()
    return "can't allocate memory" in text or "out of memory" in text


def main() -> None:
    """Console-script entry point (`attnscope`, `python -m attnscope`)."""
    import signal

    # Ctrl-C must stop a run even when the parent started us with SIGINT ignored (as shells do for `&` jobs).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    status = run(sys.argv[1:])
    if status == 130:
        # End the way an interrupted Unix program does, killed by SIGINT (the shell shows 130 and stops a script's
        # loop). This is also the only deterministic ending: CPython itself re-raises SIGINT at exit when the
        # interrupt landed in an `exec` (e.g. a dataclass being built during an import), and exits 130 otherwise.
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(status)
