"""The command line: parse options, call the library, render. The only module that knows about Typer.

Heavy imports (torch, transformers, matplotlib) happen inside the commands, so `attnscope --help` stays fast.
Every AttnscopeError and usage error ends as one line on stderr with exit status 2 (see `main`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

try:  # typer >= 0.25 carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # older typer runs on click itself
    from click import exceptions as click_errors

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
    Optional[bool], typer.Option("--bos/--no-bos", help="Prepend the BOS token (default: on when the model has one).", show_default=False)
]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Windows per forward pass (padded, length-bucketed).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (schema_version 1) to stdout instead of tables.")]
CsvOpt = Annotated[bool, typer.Option("--csv", help="Print CSV (one row per head) to stdout instead of tables.")]


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def _check_output_flags(json_out: bool, csv_out: bool) -> None:
    if json_out and csv_out:
        raise AttnscopeError("give --json or --csv, not both")


def _load(model: str, device: str, dtype: str):
    from attnscope.model import load_model

    return load_model(model, device, dtype)


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
) -> None:
    """Score and classify every attention head.

    Example: attnscope heads "The cat sat on the mat because it was tired." --sort previous_token --top 10
    """
    from attnscope import analysis, export, inputs, roles

    _check_output_flags(json_out, csv_out)
    thresholds = roles.parse_thresholds(threshold)
    texts = inputs.gather_texts(text, file)
    folder = export.prepare_out_dir(out) if out is not None else None
    loaded = _load(model, device, dtype)
    if layer is not None:
        analysis.check_layer(layer, loaded.n_layer)
    plotted = [analysis.parse_head(label, loaded.n_layer, loaded.n_head) for label in plot or []]
    result = analysis.analyze_heads(
        loaded, texts, window=window, bos=bos, batch_size=batch_size, thresholds=thresholds,
        keep_layers=sorted({layer_ for layer_, _ in plotted}), probe=probe, probe_len=probe_len, probe_seed=probe_seed,
    )
    selected = analysis.select_heads(result.heads, layer, sort, top)
    settings = {"batch_size": batch_size, "layer": layer, "sort": sort, "top": top, "probe": probe}
    for message in result.notes:
        _note(message)
    if folder is not None:
        from attnscope import render_files

        written = render_files.heads_files(result, plotted, folder, settings)
        _note(f"wrote {len(written)} files to {folder}")
    if json_out:
        sys.stdout.write(export.to_json(export.heads_document(result, selected, settings)))
    elif csv_out:
        sys.stdout.write(export.to_csv(export.head_records(selected)))
    else:
        from attnscope import terminal

        console = _console()
        info = result.model
        console.print(
            terminal.role_map(result.heads, info["n_layer"], info["n_head"], f"Head roles: {info['name']}  "
            f"({result.inputs['n_texts']} texts, {result.inputs['n_tokens']} tokens)")
        )
        console.print(terminal.heads_table(selected, "Heads"))


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

    path = render_files.show_file(attention, head, folder, loaded.name)
    print(path)


@app.command()
def diversity(
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
) -> None:
    """How different are the heads? Cosine and Jensen–Shannon between every pair of heads of a layer (or all).

    Example: attnscope diversity --layer 5 --pairs 10; attnscope diversity --layer all --out results/
    """
    from attnscope import export

    _check_output_flags(json_out, csv_out)
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
    result = analysis.analyze_diversity(loaded, texts, chosen, bos, batch_size, redundant, cluster_at)
    doc = export.diversity_document(result, pairs)
    for message in result.notes:
        _note(message)
    if folder is not None:
        from attnscope import render_files

        written = render_files.diversity_files(result, folder, doc)
        _note(f"wrote {len(written)} files to {folder}")
    if json_out:
        sys.stdout.write(export.to_json(doc))
        return
    if csv_out:
        sys.stdout.write(export.to_csv(result.pairs()))
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

    try:
        counts = [int(part) for part in heads.split(",") if part.strip()]
    except ValueError:
        raise AttnscopeError(f"--heads '{heads}': expected comma-separated numbers such as 1,2,4,8") from None
    if not counts:
        raise AttnscopeError("--heads: give at least one head count")
    rows = random_mha_diversity(d_model, counts, seq_len, trials=trials, seed=seed)
    settings = {"d_model": d_model, "heads": counts, "seq_len": seq_len, "trials": trials, "seed": seed}
    doc = export.random_mha_document(rows, settings)
    if folder is not None:
        from attnscope import render_files

        export.write_atomic(folder / "random_mha.json", export.to_json(doc))
        render_files.random_mha_file(rows, folder, d_model)
        _note(f"wrote 2 files to {folder}")
    if json_out:
        sys.stdout.write(export.to_json(doc))
    elif csv_out:
        sys.stdout.write(export.to_csv(rows))
    else:
        from attnscope import terminal

        title = f"Random multi-head attention (d_model {d_model}, {seq_len} tokens, {trials} trials): diversity by heads"
        _console().print(terminal.records_table(rows, title))


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
        app(args=argv, prog_name="attnscope", standalone_mode=False)
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
    except (click_errors.Abort, KeyboardInterrupt):
        print("attnscope: interrupted", file=sys.stderr)
        return 130
    return 0


def main() -> None:
    """Console-script entry point (`attnscope`, `python -m attnscope`)."""
    sys.exit(run(sys.argv[1:]))
