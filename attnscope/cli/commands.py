"""The commands: each one is its Python function (attnscope.api) with options. A command's options are made from
the declarations of the function's keywords (`api.keywords`, attnscope.cli.declare) and of where its result goes
(attnscope.output.destination); running it is one flow for all (`_run`): prove --out writable, call the function
with what was given (a status line and a progress bar on a terminal), and show its result (`display.emit`).

What is written here per command is what only the command line has: its help, with a runnable example.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from attnscope import __version__, api
from attnscope.cli.declare import parameter
from attnscope.cli.display import Live, emit, is_main
from attnscope.errors import AttnscopeError
from attnscope.output.destination import Drawing, Output

app = typer.Typer(
    name="attnscope",
    help="What every attention head of a transformer does: roles, scores, pictures.",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

HELP = {
    "heads": """Score and classify every attention head.

    --sort, --top and --layer pick the table's rows (and those of --json and --csv); the role map and the files
    of --out always show every head.

    Example: attnscope heads "The cat sat on the mat because it was tired." --sort prev --top 10
    """,
    "show": """Draw one layer's attention maps (or one head's) with token labels, as PNG.

    The picture goes to --out (default: the current folder) and its path is printed; with --json or --csv the
    maps are printed instead (every weight a query gives a key it sees), and a picture is drawn only with --out.
    Labels mark a piece that continues a word with ##; --words draws (and prints) words instead of tokens.

    Example: attnscope show "The doctor said that she would help the patient." --head 5.1 --words --out pictures/
    """,
    "diversity": """How different are the heads? Cosine and Jensen–Shannon between every pair of heads of a layer (or
    all).

    --top K lists the K most redundant and the K most distinct pairs; --csv prints every pair of heads, most
    redundant first. Exact by default; --sample-rows N estimates JS on N seeded random rows per window (cosine stays
    exact) and reports each pair's standard error.

    Example: attnscope diversity --layer 5 --top 10; attnscope diversity --layer all --sample-rows 32 --out results/
    """,
    "random-mha": """The tutorials' experiment: how different are the heads of a random (untrained) attention layer,
    by their number? No model and no text: random weights on random inputs.

    Example: attnscope random-mha --d-model 64 --head-counts 1,2,4,8
    """,
    "attend": """Where one word looks, in every layer and head.

    A word of several tokens (doctor = do|ct|or) looks with the mean of its tokens' rows and is looked at with the
    sum over its tokens; --words ranks the keys as words too. --top K lists the K strongest heads.

    Example: attnscope attend "The doctor said that she would help the patient." --from she --to doctor
    """,
    "ablate": """Which heads matter: the language-model loss when each head's output is removed.

    A removed head's output is replaced by its mean over the texts' positions (--ablation mean, the default), by 0,
    or by its output on another text (resample). --top K lists the K most important heads (and --csv's rows); the
    grid and the files of --out show every head. --remove L.H,... removes heads first; --save DIR writes that model
    and measures its loss, scoring no head unless --score asks.

    Example: attnscope ablate "The cat sat on the mat because it was tired." --prune 20;
    attnscope ablate --model demo --remove 0.2 --save demo-no-0.2
    """,
    "circuit": """Which earlier heads each head depends on: its score with and without each of them.

    Every head of an earlier layer is removed in turn (its output replaced as --ablation says, as ablate removes a
    head: its mean by default) and the explained heads are scored again on the same texts and probe. --head L.H
    explains only those heads; --top K lists each one's K largest changes, most negative first.

    Example: attnscope circuit --model demo --head 1.0 --top 3
    """,
    "report": """Write one self-contained HTML page to explore every head, offline: roles, maps, diversity, ablation.

    Click a head to see its attention on each text, hover a token to see where it looks; the page needs no network
    and no other file. It is report.html in --out (default: attnscope-report/), and its path is printed; with
    --json or --csv the numbers are printed instead, and the page is written only with --out. Several models
    (--model repeated, or --revisions): a slider on the page switches the role map and the head's maps between them.

    Example: attnscope report --model demo --out report/
    """,
    "compare": """Compare the heads of several models: checkpoints of one training run, a model and its fine-tune.

    The same texts and probe go through every model, loaded one at a time. For each head: its scores and role in
    every model, the model from which it holds each role to the end (when it formed); for two models, how far its
    attention moved (its divergence). Models must share their layers × heads and their tokenizer.

    Example: attnscope compare --model EleutherAI/pythia-160m --revisions step0,step512,step1000 --out pythia/
    """,
    "bench": """How fast is the analysis? Against a plain SDPA forward (the floor) and the usual notebook ways; with
    --methods floor,diversity,diversity-sampled, `diversity --layer all` exact and with --sample-rows; with
    --methods floor,fused,blocks, the analysis with either kernel (on a GPU; the attnscope row uses --kernel's).

    Example: attnscope bench --device cpu --random-weights --seq-lens 128,512 --batch-sizes 1
    """,
    "info": """The model's shape: layers, heads, d_model, d_head, context, parameters, device and dtype.

    Reads the model's config.json only: no weights are loaded or downloaded.

    Example: attnscope info --model gpt2-medium
    """,
    "patch": """Activation patching per head: which heads carry what a clean prompt and a corrupted one differ in.

    The metric is the logit difference answer − wrong at the last position. For each head, its clean output (at
    every position) goes into the corrupted run: the share of the clean − corrupted difference it restores
    (denoising); and its corrupted output into the clean run: the share it removes (noising). The prompts must have
    as many tokens; --answer and --wrong are one token each, as the next word (Mary means ' Mary'). --file takes
    several pairs (JSON lines with clean, corrupt, answer, wrong), combined as a ratio of sums.

    Example: attnscope patch --model demo --clean "The file and the list hold the value method. The file and the list
    hold the value" --corrupt "The file and the list hold the value table. The file and the list hold the value"
    --answer method --wrong table --top 5
    """,
    "discover": """The circuit of a task: the edges between components that carry what two prompts differ in.

    Nodes are the embeddings, every head, every MLP and the logits; an edge goes into a head's query, key or value
    (under grouped-query attention, the key/value head's), an MLP's input or the logits. Each edge is scored by how
    much of the logit difference answer − wrong (last position) it carries: --method eap-ig (integrated gradients,
    --steps points), eap (one gradient) or exact (each edge patched alone). Then the top edges of each budget
    (--budgets, % of the edges) run with every other edge ablated (--ablation corrupt or mean): faithfulness f,
    CPR and CMD (MIB), and the circuit: the fewest edges with f >= --target. Pairs as patch takes them.

    Example: attnscope discover --model demo --clean "The file and the list hold the value method. The file and the
    list hold the value" --corrupt "The file and the list hold the code method. The file and the list hold the value"
    --answer method --wrong table --top 10
    """,
    "kvplan": """A KV-cache plan in DuoAttention's format: which key/value heads keep the whole past, which stream.

    A streaming head keeps the first --sink and the last --recent tokens alone (DuoAttention; kvpress's
    DuoAttentionPress). Each head's score is its attention on the keys that would drop, over the rows that have
    such keys; a KV head's is the largest of its query heads'. The --streaming share of KV heads with the lowest
    scores stream. Without TEXT or --file, a long probe made of the bundled samples is read. --out writes
    full_attention_heads.tsv and config.json (DuoAttention's files), kvplan.json, kvplan.csv and the picture.
    --check proves the plan on passkey retrieval against full attention and random plans of the same budget
    (kvplan_check.png); --streaming auto lets the check choose the share.

    Example: attnscope kvplan --model demo --sink 16 --recent 64 --out plan/
    """,
}
NEEDS_OUT = {"plot"}  # options whose pictures are drawn into the folder of --out


def _run(name: str, function: Any, output: Output, given: dict[str, Any]) -> None:
    """The one flow of every command: --out proven writable (and, for a command whose output is its files, its
    default folder), the function called with the options given, its result shown."""
    from attnscope.output.files import prepare_out_dir

    for option in NEEDS_OUT:
        if given.get(option) and output.out is None:
            raise AttnscopeError(f"--{option} draws into the folder of --out: give --out DIR too")
    _check_apart(given.get("save"), output.out)
    default = function.settings.default_out
    folder = output.out if output.out is not None else None if output.json or output.csv or default is None else default
    folder = None if folder is None else prepare_out_dir(Path(folder))
    takes = inspect.signature(function).parameters
    with Live(output.quiet, name) as live:
        callbacks = {key: getattr(live, key) for key in ("progress", "status") if key in takes}
        result = function(**given, **callbacks)
    if is_main():
        emit(result, output, folder)


def _check_apart(saved: Any, out: Any) -> None:
    """ablate's --save (a model's folder) and --out (the analysis' files) in one folder, or one inside the other,
    would mix the analysis' files into the saved model's folder: refused."""
    if saved is None or out is None:
        return
    model, files = (Path(folder).expanduser().resolve() for folder in (saved, out))
    if model == files or model in files.parents or files in model.parents:
        raise AttnscopeError(
            f"--save {saved} and --out {out}: the saved model's folder and the analysis' files would mix; give "
            "them folders apart"
        )


def _given(values: dict[str, Any]) -> dict[str, Any]:
    """The function's keywords from the options' values: a repeated option left out is the function's default, and
    TEXT '-' reads standard input (the file '-')."""
    given = {key: value for key, value in values.items() if value is not None or key in ("bos", "divergence")}
    if given.get("texts") == "-":
        if given.get("file") is not None:
            raise AttnscopeError("texts and file (TEXT, --file): give one or the other")
        given["file"] = given.pop("texts")
    return given


def _register(name: str, function: Any) -> None:
    output = Drawing if function.settings.draws else Output
    own = [parameter(item) for item in api.keywords(function.settings) if item.command_line]
    shown = [parameter(item) for item in output.declarations()]

    def command(**values: Any) -> None:
        chosen = output(**{item.name: values.pop(item.name) for item in output.declarations()})
        _run(name, function, chosen, _given(values))

    command.__signature__ = inspect.Signature(own + shown)  # what typer reads
    command.__doc__ = HELP[name]
    command.__name__ = name.replace("-", "_")
    app.command(name)(command)


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


for _name, _function in api.COMMANDS.items():
    _register(_name, _function)
