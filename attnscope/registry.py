"""The commands, one record each (`COMMANDS`): what every list of commands is derived from.

- the Python API: one function per record (`attnscope.api`, `attnscope.__all__`), its keywords from `settings`, its
  docstring `doc`, the result of the class `analysis` names;
- the command line: one command per record, in this order, with the options of `settings` and the help `help`
  (ending in a runnable example);
- the views: a result names its own (`Result.view`);
- the documentation: the site's navigation and the commands' index (`page`, `summary`, `picture`; docs/hooks), the
  reference of every option;
- the tests' lists of commands.

Adding a command: its modules (settings, analysis with its result and view, output), one record here, its page, its
tests; nothing else (docs/development.md). Light: no torch, the analysis is named, imported when the command runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnscope import settings


@dataclass(frozen=True)
class Command:
    name: str  # on the command line ("random-mha"); the Python function's name has "_" for "-"
    settings: type[settings.Settings]  # its options: the keywords of the function, the options of the command
    analysis: str  # "module.Class": the settings' subclass that runs it, imported when it runs
    result: str  # "module.Class": what the function returns
    doc: str  # the Python function's docstring (its keywords' lines are added from the settings)
    help: str  # `attnscope NAME --help`, ending in a runnable example
    page: str  # its page of the documentation, from docs/ (with an anchor where it shares a page)
    summary: str  # what it does, in the commands' index
    picture: str  # the picture it draws, in the commands' index ("" when none)

    @property
    def function(self) -> str:
        """The Python function's name: `random_mha` for `random-mha`."""
        return self.name.replace("-", "_")


COMMANDS: tuple[Command, ...] = (
    Command(
        "heads",
        settings.Heads,
        "attnscope.analyses.heads.Heads",
        "attnscope.analyses.scoring.HeadsResult",
        doc="""
        Score and classify every attention head (`attnscope heads`). A notebook shows the role map and the table.
        """,
        help="""
        Score and classify every attention head.

        --sort, --top and --layer pick the table's rows (and those of --json and --csv); the role map and the files
        of --out always show every head.

        Example: attnscope heads "The cat sat on the mat because it was tired." --sort prev --top 10
        """,
        page="commands/heads.md",
        summary="score and classify every head",
        picture="the role map, a heatmap per score",
    ),
    Command(
        "show",
        settings.Show,
        "attnscope.analyses.show.Show",
        "attnscope.analyses.show.ShowResult",
        doc="""
        One layer's attention maps, or one head's, for one text (`attnscope show`). A notebook shows each map as a
        shaded table; `save(folder)` draws the picture.
        """,
        help="""
        Draw one layer's attention maps (or one head's) with token labels, as PNG.

        The picture goes to --out (default: the current folder) and its path is printed; with --json or --csv the
        maps are printed instead (every weight a query gives a key it sees), and a picture is drawn only with --out.
        Labels mark a piece that continues a word with ##; --words draws (and prints) words instead of tokens.

        Example: attnscope show "The doctor said that she would help the patient." --head 5.1 --words --out pictures/
        """,
        page="commands/show.md",
        summary="attention maps as pictures, by token or by word",
        picture="a layer's heads, or one head",
    ),
    Command(
        "diversity",
        settings.Diversity,
        "attnscope.analyses.diversity.Diversity",
        "attnscope.analyses.diversity.DiversityResult",
        doc="""
        How different the heads are: cosine and Jensen–Shannon between every pair (`attnscope diversity`).
        """,
        help="""
        How different are the heads? Cosine and Jensen–Shannon between every pair of heads of a layer (or
        all).

        --top K lists the K most redundant and the K most distinct pairs; --csv prints every pair of heads, most
        redundant first. Exact by default; --sample-rows N estimates JS on N seeded random rows per window (cosine stays
        exact) and reports each pair's standard error.

        Example: attnscope diversity --layer 5 --top 10; attnscope diversity --layer all --sample-rows 32 --out results/
        """,
        page="commands/diversity.md",
        summary="how different the heads are (cosine, Jensen–Shannon)",
        picture="clustered matrices with their dendrogram",
    ),
    Command(
        "random-mha",
        settings.RandomMha,
        "attnscope.analyses.random_mha.RandomMha",
        "attnscope.analyses.random_mha.RandomMhaResult",
        doc="""
        How different are the heads of a random (untrained) attention layer, by their number (`attnscope
        random-mha`)? No model and no text.
        """,
        help="""
        The tutorials' experiment: how different are the heads of a random (untrained) attention layer,
        by their number? No model and no text: random weights on random inputs.

        Example: attnscope random-mha --d-model 64 --head-counts 1,2,4,8
        """,
        page="commands/random-mha.md",
        summary="the tutorials' random-attention experiment",
        picture="measures by head count",
    ),
    Command(
        "attend",
        settings.Attend,
        "attnscope.analyses.attend.Attend",
        "attnscope.analyses.attend.AttendResult",
        doc="""
        Where one word looks, in every layer and head (`attnscope attend`).
        """,
        help="""
        Where one word looks, in every layer and head.

        A word of several tokens (doctor = do|ct|or) looks with the mean of its tokens' rows and is looked at with the
        sum over its tokens; --words ranks the keys as words too. --top K lists the K strongest heads.

        Example: attnscope attend "The doctor said that she would help the patient." --from she --to doctor
        """,
        page="commands/attend.md",
        summary="where one word looks, in every head",
        picture="a layer × head grid",
    ),
    Command(
        "ablate",
        settings.Ablate,
        "attnscope.analyses.ablate.Ablate",
        "attnscope.analyses.ablate.AblationResult",
        doc="""
        Which heads matter: the language-model loss with each head's output removed (`attnscope ablate`). A model
        already loaded must have its language-model head (`load`'s default); one given by name is loaded so.
        """,
        help="""
        Which heads matter: the language-model loss when each head's output is removed.

        A removed head's output is replaced by its mean over the texts' positions (--ablation mean, the default), by 0,
        or by its output on another text (resample). --top K lists the K most important heads (and --csv's rows); the
        grid and the files of --out show every head. --remove L.H,... removes heads first; --save DIR writes that model
        and measures its loss, scoring no head unless --score asks.

        Example: attnscope ablate "The cat sat on the mat because it was tired." --prune 20;
        attnscope ablate --model demo --remove 0.2 --save demo-no-0.2
        """,
        page="commands/ablate.md",
        summary="which heads the loss needs",
        picture="importance grid, pruning curve",
    ),
    Command(
        "circuit",
        settings.Circuit,
        "attnscope.analyses.circuit.Circuit",
        "attnscope.analyses.circuit.CircuitResult",
        doc="""
        Which earlier heads each head depends on: its score with and without each of them (`attnscope circuit`).
        With `weights` (the default), a model already loaded must have its language-model head (`load`'s default); one
        given by name is loaded so.
        """,
        help="""
        Which earlier heads each head depends on: its score with and without each of them.

        Every head of an earlier layer is removed in turn (its output replaced as --ablation says, as ablate removes a
        head: its mean by default) and the explained heads are scored again on the same texts and probe. --head L.H
        explains only those heads; --top K lists each one's K largest changes, most negative first.

        Example: attnscope circuit --model demo --head 1.0 --top 3
        """,
        page="circuit.md",
        summary="which heads each head depends on",
        picture="the circuit",
    ),
    Command(
        "report",
        settings.Report,
        "attnscope.analyses.report.Report",
        "attnscope.analyses.report.ReportResult",
        doc="""
        Everything the report page shows (`attnscope report`): `save(folder)` writes report.html; a notebook shows
        the role map, the heads and the diversity. Several models (a list, or `revisions`) share one page with a
        slider over them, loaded one at a time.
        """,
        help="""
        Write one self-contained HTML page to explore every head, offline: roles, maps, diversity, ablation.

        Click a head to see its attention on each text, hover a token to see where it looks; the page needs no network
        and no other file. It is report.html in --out (default: attnscope-report/), and its path is printed; with
        --json or --csv the numbers are printed instead, and the page is written only with --out. Several models
        (--model repeated, or --revisions): a slider on the page switches the role map and the head's maps between them.

        Example: attnscope report --model demo --out report/
        """,
        page="commands/report.md",
        summary="one interactive offline page to explore every head",
        picture="the page",
    ),
    Command(
        "compare",
        settings.Compare,
        "attnscope.analyses.compare.Compare",
        "attnscope.analyses.compare.CompareResult",
        doc="""
        Compare the heads of several models on the same texts and probe (`attnscope compare`): each head's scores
        and role in every model, when each role formed, and for two models how far its attention moved (its divergence).
        Models given by name are loaded one at a time and freed; models already loaded are used as they are.
        """,
        help="""
        Compare the heads of several models: checkpoints of one training run, a model and its fine-tune.

        The same texts and probe go through every model, loaded one at a time. For each head: its scores and role in
        every model, the model from which it holds each role to the end (when it formed); for two models, how far its
        attention moved (its divergence). Models must share their layers × heads and their tokenizer.

        Example: attnscope compare --model EleutherAI/pythia-160m --revisions step0,step512,step1000 --out pythia/
        """,
        page="compare.md",
        summary="heads across checkpoints or fine-tunes",
        picture="score trajectories",
    ),
    Command(
        "bench",
        settings.Bench,
        "attnscope.analyses.bench.Bench",
        "attnscope.analyses.bench.BenchResult",
        doc="""
        How fast is the analysis, against a plain SDPA forward and the usual notebook ways (`attnscope bench`)? The
        model is named: bench loads it itself, or builds it with random weights.
        """,
        help="""
        How fast is the analysis? Against a plain SDPA forward (the floor) and the usual notebook ways; with
        --methods floor,diversity,diversity-sampled, `diversity --layer all` exact and with --sample-rows; with
        --methods floor,fused,blocks, the analysis with either kernel (on a GPU; the attnscope row uses --kernel's).

        Example: attnscope bench --device cpu --random-weights --seq-lens 128,512 --batch-sizes 1
        """,
        page="commands/bench.md",
        summary="what the analysis costs",
        picture="tokens/s by length",
    ),
    Command(
        "info",
        settings.Info,
        "attnscope.analyses.info.Info",
        "attnscope.analyses.info.InfoResult",
        doc="""
        The model's shape: layers, heads, d_model, d_head, context, attention parameters, device, dtype, and what
        each layer's attention is (`attnscope info`). A model given by name is not loaded: its config.json alone is
        read.
        """,
        help="""
        The model's shape: layers, heads, d_model, d_head, context, parameters, device and dtype, and what
        each layer's attention is (full or a sliding window, soft-capping, QK-norm, sinks, shared key/value heads).

        Reads the model's config.json only: no weights are loaded or downloaded.

        Example: attnscope info --model gpt2-medium
        """,
        page="commands/info.md",
        summary="a model's shape and each layer's attention, from its config alone",
        picture="",
    ),
    Command(
        "patch",
        settings.Patch,
        "attnscope.analyses.patch.Patch",
        "attnscope.analyses.patch.PatchResult",
        doc="""
        Activation patching per head (`attnscope patch`): for clean and corrupted prompts, the share of the logit
        difference (answer − wrong, at the last position) that each head's clean output restores in the corrupted run,
        and that its corrupted output removes from the clean run. A model already loaded must have its language-model
        head (`load`'s default); one given by name is loaded so.
        """,
        help="""
        Activation patching per head: which heads carry what a clean prompt and a corrupted one differ in.

        The metric is the logit difference answer − wrong at the last position. For each head, its clean output (at
        every position) goes into the corrupted run: the share of the clean − corrupted difference it restores
        (denoising); and its corrupted output into the clean run: the share it removes (noising). The prompts must have
        as many tokens; --answer and --wrong are one token each, as the next word (Mary means ' Mary'). --file takes
        several pairs (JSON lines with clean, corrupt, answer, wrong), combined as a ratio of sums.

        Example: attnscope patch --model demo --clean "The file and the list hold the value method. The file and the
        list hold the value" --corrupt "The file and the list hold the value table. The file and the list hold the
        value" --answer method --wrong table --top 5
        """,
        page="patch.md",
        summary="which heads carry what a clean and a corrupted prompt differ in (activation patching)",
        picture="layer × head grids of the shares",
    ),
    Command(
        "discover",
        settings.Discover,
        "attnscope.analyses.discover.Discover",
        "attnscope.analyses.discover.DiscoverResult",
        doc="""
        The circuit of a task (`attnscope discover`): for clean and corrupted prompts, every edge between the model's
        components (embeddings, heads' queries, keys and values, MLPs, logits) scored by how much of the logit
        difference (answer − wrong, at the last position) it carries, then the circuits of the top edges run with
        every other edge ablated: their faithfulness, MIB's CPR and CMD, and the smallest circuit that reaches
        `target`. A model already loaded must have its language-model head (`load`'s default); one given by name is
        loaded so.
        """,
        help="""
        The circuit of a task: the edges between components that carry what two prompts differ in.

        Nodes are the embeddings, every head, every MLP and the logits; an edge goes into a head's query, key or value
        (under grouped-query attention, the key/value head's), an MLP's input or the logits. Each edge is scored by how
        much of the logit difference answer − wrong (last position) it carries: --method eap-ig (integrated gradients,
        --steps points), eap (one gradient) or exact (each edge patched alone). Then the top edges of each budget
        (--budgets, % of the edges) run with every other edge ablated (--ablation corrupt or mean): faithfulness f,
        CPR and CMD (MIB), and the circuit: the fewest edges with f >= --target. Pairs as patch takes them.

        Example: attnscope discover --model demo --clean "The file and the list hold the value method. The file and the
        list hold the value" --corrupt "The file and the list hold the code method. The file and the list hold the
        value" --answer method --wrong table --top 10
        """,
        page="discover.md",
        summary=(
            "the circuit of a task: the edges between embeddings, heads, MLPs and logits that carry what two "
            "prompts differ in, and how faithful their circuits are (EAP-IG, EAP, exact; MIB's CPR and CMD)"
        ),
        picture="the circuit as a graph, the faithfulness curves",
    ),
    Command(
        "kvplan",
        settings.Kvplan,
        "attnscope.analyses.kvplan.Kvplan",
        "attnscope.analyses.kvplan.KvplanResult",
        doc="""
        A KV-cache plan in DuoAttention's format (`attnscope kvplan`): each head's attention on the keys a streaming
        cache drops (those after the first `sink` and before the last `recent` of each row), the largest of a KV head's
        query heads, and the `streaming` share of KV heads with the lowest scores given a streaming cache.
        `save(folder)` writes full_attention_heads.tsv and config.json as DuoAttention and kvpress read them, and
        head_score.json as Retrieval Head reads its scores.
        """,
        help="""
        A KV-cache plan in DuoAttention's format: which key/value heads keep the whole past, which stream.

        A streaming head keeps the first --sink and the last --recent tokens alone (DuoAttention; kvpress's
        DuoAttentionPress). Each head's score is its attention on the keys that would drop, over the rows that have
        such keys; a KV head's is the largest of its query heads'. The --streaming share of KV heads with the lowest
        scores stream. Without TEXT or --file, a passkey probe is read (DuoAttention's kind of data). --out writes
        full_attention_heads.tsv and config.json (DuoAttention's files), head_score.json (each query head's score in
        Retrieval Head's form), kvplan.json, kvplan.csv and the picture. --check proves the plan on passkey retrieval
        and RULER's multi-key needle against full attention and random plans of the same budget (kvplan_check.png);
        --streaming auto lets the check choose the share.

        Example: attnscope kvplan --model demo --sink 16 --recent 64 --out plan/
        """,
        page="kvplan.md",
        summary=(
            "which KV heads need a full cache and which a streaming one (DuoAttention's plan files), and the "
            "memory saved"
        ),
        picture="the layer × KV-head grid of scores",
    ),
)


def named(name: str) -> Command:
    """The record of the command `name` (as the command line spells it)."""
    return next(command for command in COMMANDS if command.name == name)
