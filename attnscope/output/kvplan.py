"""`attnscope kvplan`, shown: the plan in DuoAttention's files (full_attention_heads.tsv, config.json), every head's
score and the memory in kvplan.json (and the KV heads in CSV), the layer × KV-head grid of scores with the streaming
heads hatched, the terminal's table per layer and the memory line.

DuoAttention's plan files, as its own loader and kvpress's read them (mit-han-lab/duo-attention
`duo_attn/utils.py` `load_attn_pattern`; NVIDIA/kvpress `DuoAttentionPress.load_attention_pattern`):
`full_attention_heads.tsv` is `numpy.loadtxt(path, dtype=float, delimiter="\\t")`, clipped to [0, 1]: one line
per layer, one tab-separated value per KV head, no header (written as `numpy.savetxt` writes it, `%.18e`), 1 for a
head that keeps the full cache and 0 for a streaming one; `config.json` gives `sink_size` and `recent_size`, the
two keys both loaders read.

Retrieval Head's scores file (Wu et al. 2024, nightdessert/Retrieval_Head, `head_score/<model>.json`): one JSON
object on one line, `{"layer-head": [score, ...]}` for every query head (0-based, layer by layer), which its README
and `needle_in_haystack_with_mask.py` read with `json.loads(file.readline())` and rank by `numpy.mean` of the list,
highest first. head_score.json holds each query head's kvplan score in that form, one value to a list.

Reads a KvplanResult (analyses.kvplan) by duck typing: `model`, `inputs`, `settings`, `notes`, `scores` (L, H),
`kv_scores` (L, H_kv), `full` (L, H_kv), `sliding_windows`, `memory`, `streaming_count`, `ranked()`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import clean, document, to_csv, to_json
from attnscope.output.views import View, fitted, model_shape, summary
from attnscope.scores.catalog import counted

PLAN_FILE = "full_attention_heads.tsv"  # DuoAttention's names, which its loader and kvpress's open
CONFIG_FILE = "config.json"
HEAD_SCORE_FILE = "head_score.json"  # Retrieval Head's format; its folder is head_score/, a file per model
SCALE = "score"  # viridis from 0 to the largest score
SCORE = (
    "mean attention on the keys a streaming head drops: for a causal row i, keys sink <= j <= i - recent; over the "
    "rows i >= sink + recent (of the passkey probe, the rows that predict the passkey)"
)
KV_SCORE = "the largest of its query heads' scores (a shared cache keeps what any of them needs)"
RULE = (
    "the floor(streaming × KV heads) KV heads with the lowest scores (as written here, 6 decimals) stream, ties by "
    "layer, then KV head; the others keep the full cache"
)
FORMULA = (
    "2 (keys and values) × d_head × bytes_per_element × the positions each KV head holds, summed over layers and KV "
    "heads: context for a full head (the layer's own window where it slides and that is shorter), min(that, sink + "
    "recent) for a streaming one"
)


def score_text(value: float) -> str:
    """A score with three decimals, without the leading zero: `.004`, `1.000`."""
    return f"{value:.3f}".removeprefix("0")


def byte_size(count: float) -> str:
    """Bytes in binary units: `1.50 GiB`, `64.0 MiB`, `512 B`."""
    for unit, power in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 2**power:
            value = count / 2**power
            digits = 2 if value < 10 else 1 if value < 100 else 0
            return f"{value:.{digits}f} {unit}"
    return f"{count:.0f} B"


def memory_line(result: Any) -> str:
    """`KV cache at 32,768 tokens: 1.50 GiB full, 0.84 GiB with this plan (56 %)`."""
    memory = result.memory
    return (
        f"KV cache at {memory['context']:,} tokens ({memory['dtype']}): {byte_size(memory['full_bytes'])} full, "
        f"{byte_size(memory['plan_bytes'])} with this plan ({100 * memory['ratio']:.0f} %)"
    )


def plan_line(result: Any) -> str:
    """`4 of 8 KV heads streaming (first 128 + last 256 tokens), 4 full`."""
    total, streaming = result.full.size, result.streaming_count
    auto = " (auto)" if result.settings.get("streaming") == "auto" else ""
    return (
        f"{streaming} of {counted(total, 'KV head')} streaming{auto} (the first {result.settings['sink']:,} + last "
        f"{result.settings['recent']:,} tokens), {total - streaming} full"
    )


def kv_head_records(result: Any) -> list[dict]:
    """One record per KV head, layer by layer: layer, kv_head, score, full."""
    n_layer, n_kv_head = result.kv_scores.shape
    return [
        {
            "layer": layer,
            "kv_head": head,
            "score": float(result.kv_scores[layer, head]),
            "full": bool(result.full[layer, head]),
        }
        for layer in range(n_layer)
        for head in range(n_kv_head)
    ]


def query_head_records(result: Any) -> list[dict]:
    """One record per query head: layer, head, the KV head it reads, score."""
    n_layer, n_head = result.scores.shape
    group = n_head // result.kv_scores.shape[1]
    return [
        {"layer": layer, "head": head, "kv_head": head // group, "score": float(result.scores[layer, head])}
        for layer in range(n_layer)
        for head in range(n_head)
    ]


def layer_records(result: Any) -> list[dict]:
    """One record per layer: its own sliding window (None: none), its KV heads that keep the full cache and those
    that stream, and its highest KV-head score (the score of the whole layer, for an engine that streams a whole
    layer or none of it)."""
    return [
        {
            "layer": layer,
            "sliding_window": result.sliding_windows[layer],
            "full": int(result.full[layer].sum()),
            "streaming": int((~result.full[layer]).sum()),
            "max_score": float(result.kv_scores[layer].max()),
        }
        for layer in range(result.kv_scores.shape[0])
    ]


def plan_tsv(full: Any) -> str:
    """full_attention_heads.tsv: one line per layer, one tab-separated value per KV head, 1 (full) or 0 (streaming),
    as `numpy.savetxt(path, plan, delimiter="\\t")` writes them (DuoAttention's `save_full_attention_heads`)."""
    return "".join("\t".join(f"{float(value):.18e}" for value in row) + "\n" for row in full)


def plan_config(result: Any) -> dict:
    """config.json: DuoAttention's `sink_size` and `recent_size` (what `load_attn_pattern` and kvpress read), the
    model's name, and the share of streaming heads as DuoAttention's `sparsity` (its `sparsify_attention_heads`
    argument: the plan's 0s and 1s give the same heads back)."""
    return {
        "model_name": result.model.get("name"),
        "sink_size": result.settings["sink"],
        "recent_size": result.settings["recent"],
        "sparsity": result.streaming_count / result.full.size,
    }


def head_score_json(scores: Any) -> str:
    """head_score.json: every query head's score (L, H) as Retrieval Head writes its scores, `{"0-0": [0.409432],
    "0-1": [...], ...}`, keys `f"{layer}-{head}"` layer by layer (the order its `retrieval_head_accumulate` fills
    them), all on one line (its readers take `file.readline()`). Its lists hold one score per detection run and are
    ranked by their mean; here each holds one value, the score itself (6 decimals, as kvplan.json's query_heads), so
    that mean is the score and their ranking is kvplan's: the scores are one mean over every scored row of every
    text, with no runs to list apart."""
    n_layer, n_head = scores.shape
    heads = {f"{layer}-{head}": [float(scores[layer, head])] for layer in range(n_layer) for head in range(n_head)}
    return json.dumps(clean(heads)) + "\n"


class KvplanView(View):
    command = "kvplan"

    def document(self) -> dict:
        """The definitions, the plan (counts and rule), the memory, each layer, each KV head (the plan's heads) and
        each query head (the scores behind them)."""
        result = self.result
        total, streaming = result.full.size, result.streaming_count
        return document(
            "kvplan",
            result.model,
            result.inputs,
            result.settings,
            result.notes,
            score=SCORE,
            kv_score=KV_SCORE,
            plan={
                "kv_heads": total,
                "streaming": streaming,
                "full": total - streaming,
                "streaming_fraction": streaming / total,
                "rule": RULE,
            },
            memory={**result.memory, "formula": FORMULA},
            layers=layer_records(result),
            heads=kv_head_records(result),
            query_heads=query_head_records(result),
            check=result.check,
        )

    def records(self) -> list[dict]:
        """--csv's rows: the KV heads, layer by layer (layer, kv_head, score, full)."""
        return kv_head_records(self.result)

    def data_files(self, stage: Path) -> list[Path]:
        """kvplan.json and kvplan.csv, DuoAttention's two files of the plan, Retrieval Head's file of the scores."""
        return [
            self.write(stage, "kvplan.json", to_json(self.document())),
            self.write(stage, "kvplan.csv", to_csv(self.records())),
            self.write(stage, PLAN_FILE, plan_tsv(self.result.full)),
            self.write(stage, CONFIG_FILE, json.dumps(plan_config(self.result), indent=2) + "\n"),
            self.write(stage, HEAD_SCORE_FILE, head_score_json(self.result.scores)),
        ]

    def figures(self) -> dict[str, Any]:
        """kvplan: the layer × KV-head grid of scores, streaming heads hatched."""
        pictures = {"kvplan": plan_grid(self.result)}
        if self.result.check is not None:
            pictures["kvplan_check"] = check_plot(self.result)
        return pictures

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        result = self.result
        shown = [plan_table(result), memory_line(result)]
        if result.check is not None:
            shown.append(check_table(result.check))
        return shown

    def notebook(self) -> str:
        result = self.result
        n_layer, n_kv_head = result.kv_scores.shape
        largest = max(float(result.kv_scores.max()), 1e-12)
        rows = []
        for layer in range(n_layer):
            cells = []
            for head in range(n_kv_head):
                value = float(result.kv_scores[layer, head])
                text = score_text(value) if result.full[layer, head] else f"({score_text(value)})"
                cells.append(notebook.cell(text, notebook.shade(value, largest, SCALE), base=notebook.SHADED))
            rows.append([notebook.cell(str(layer), header=True), *cells])
        title = "Attention outside the sink and the recent window, per KV head (in parentheses: streaming)"
        return notebook.fragment(
            notebook.note_lines(self.notes),
            notebook.paragraph(plan_line(result)),
            notebook.paragraph(memory_line(result)),
            notebook.table(["L\\KV", *(str(head) for head in range(n_kv_head))], rows, title),
        )

    def summary(self) -> str:
        """The model, the plan, the memory, the streaming heads with their scores (the plan's order)."""
        result = self.result
        streamed = [
            f"{layer}.{head} {score_text(float(result.kv_scores[layer, head]))}"
            for layer, head in result.ranked()[: result.streaming_count]
        ]
        lines = [plan_line(result), memory_line(result), fitted("streaming (layer.kv_head score): ", streamed)]
        return summary(self, model_shape(result.model), lines, [".kv_scores", ".scores", ".full", ".memory"])


# ------------------------------------------------------------------------------------------------- terminal

WIDE = 16  # KV heads beyond which a layer's row gives the margin of its plan instead of every KV head's score


def plan_table(result: Any) -> Any:
    """Per layer: its own window (where any layer slides), its full KV heads of all, and each KV head's score, the
    streaming heads' in parentheses (and dim); past WIDE KV heads (a multi-head model of 32), the largest score that
    streams and the smallest that keeps the full cache instead, so that the table stays one line per layer."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    n_layer, n_kv_head = result.kv_scores.shape
    slides = any(window is not None for window in result.sliding_windows)
    every = n_kv_head <= WIDE
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    table.add_column("L", justify="right", style="bold")
    if slides:
        table.add_column("window", justify="right")
    table.add_column("full", justify="right")
    for name in [str(head) for head in range(n_kv_head)] if every else ["highest streaming", "lowest full"]:
        table.add_column(name, justify="right")

    def shown(value: float, full: bool) -> Text:
        return Text(score_text(value), style="bold") if full else Text(f"({score_text(value)})", style="dim")

    for layer in range(n_layer):
        scores, full = result.kv_scores[layer], result.full[layer]
        row: list[Any] = [str(layer)]
        if slides:
            window = result.sliding_windows[layer]
            row.append("-" if window is None else f"{window:,}")
        row.append(f"{int(full.sum())}/{n_kv_head}")
        if every:
            row += [shown(float(value), bool(kept)) for value, kept in zip(scores, full, strict=True)]
        else:
            row.append(shown(float(scores[~full].max()), False) if (~full).any() else "-")
            row.append(shown(float(scores[full].min()), True) if full.any() else "-")
        table.add_row(*row)
    what = "per KV head" if every else "the largest of the layer's streaming KV heads and the smallest of its full ones"
    key = f"scores: attention outside the sink and the recent window, {what} (in parentheses: streaming)"
    return Group(Text(f"KV cache plan: {plan_line(result)}", style="bold"), table, Text(key, style="dim"))


# ------------------------------------------------------------------------------------------------- figures


def plan_grid(result: Any) -> Any:
    """The layer × KV-head heatmap of the KV heads' scores (viridis from 0 to the largest), each written in its
    cell, the streaming heads hatched."""
    from matplotlib.patches import Rectangle

    from attnscope.output import head_grids

    n_layer, n_kv_head = result.kv_scores.shape
    text = [[score_text(float(value)) for value in row] for row in result.kv_scores]
    inputs = result.inputs
    tokens = f"{inputs.get('n_tokens', 0):,} tokens"
    if inputs.get("probe"):  # no text given: the passkey probe
        read = f"the passkey probe ({counted(inputs['n_texts'], 'prompt')}, {tokens})"
    elif inputs.get("n_texts", 1) == 1:
        read = tokens + (f" ({inputs['sources'][0]})" if inputs.get("sources") else "")
    else:
        read = f"{counted(inputs['n_texts'], 'text')} ({tokens})"
    subtitle = (
        f"{result.model.get('name', '')}, {read}; hatched: the {result.streaming_count} streaming heads (first "
        f"{result.settings['sink']:,} + last {result.settings['recent']:,} tokens)"
    )
    figure = head_grids.score_heatmap(
        result.kv_scores,
        "KV cache plan: attention outside the sink and the recent window",
        "attention on the keys a streaming head drops (mean over rows, max over the KV head's query heads)",
        subtitle,
        vmin=0.0,
        vmax=None,
        cell_text=text,
        scale=SCALE,
    )
    axes = figure.axes[0]
    for layer in range(n_layer):
        for head in range(n_kv_head):
            if not result.full[layer, head]:
                axes.add_patch(
                    Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, hatch="//", edgecolor="#bbbbbb", linewidth=0)
                )
    axes.set_xlabel("KV head")
    return figure


def _interval(bounds: Any) -> str:
    low, high = bounds
    return f"[{low * 100:.0f}-{high:.0%}]"


def check_table(check: dict) -> Any:
    """--check: per streaming share, the KV heads that stream and the accuracy of the plan (both tasks, and each) and
    of the random plans of the same budget (their mean and range); full attention's above; the plan's share
    marked."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    tasks = {task: part for task, part in check.get("tasks", {}).items() if part["prompts"]}
    curve = check.get("curve", False)
    names = ("streaming", "KV heads", "KV cache", "this plan", *(f"plan: {task}" for task in tasks), "random plans")
    for name in (*names, *(["uniform by layer"] if curve else [])):
        table.add_column(name, justify="right")
    for position, share in enumerate(check["shares"]):
        randoms = share["random"]
        spread = f"{share['random_mean']:.0%} ({min(randoms):.0%}-{max(randoms):.0%})" if randoms else "-"
        marked = share["streaming"] == check["streaming"]
        layered = [] if not curve else [f"{share['uniform']:.0%} {_interval(share['uniform_interval'])}"]
        table.add_row(
            f"{share['streaming']:g}{' *' if marked else ''}",
            str(share["kv_heads"]),
            f"{share['memory']:.0%}",
            Text(f"{share['plan']:.0%} {_interval(share['plan_interval'])}", style="bold" if marked else ""),
            *(f"{part['shares'][position]['plan']:.0%}" for part in tasks.values()),
            spread,
            *layered,
        )
    by_task = ", ".join(f"{task} {part['full']:.0%}" for task, part in tasks.items())
    heading = (
        f"Check: {counted(check['prompts'], 'prompt')} ({', '.join(tasks) or 'passkey'}; "
        f"{', '.join(f'{n:,}' for n in check['lengths'])} tokens; depths "
        f"{', '.join(f'{d:.0%}' for d in check['depths'])}), full attention {check['full']:.0%} "
        f"{_interval(check['full_interval'])}{f' ({by_task})' if by_task else ''}"
    )
    key = (
        f"*: this plan's share; KV cache: this plan's at --context, of full attention's; [a-b]: Wilson's 95 % interval "
        f"over the {check['prompts']} prompts; random plans: the mean of {check['random_plans']} (their range)"
        + ("; uniform by layer: as many streaming KV heads in every layer" if curve else "")
    )
    return Group(Text(heading, style="bold"), table, Text(key, style="dim"))


def check_plot(result: Any) -> Any:
    """Accuracy (both tasks' prompts) against the KV cache's memory at --context, as a share of full attention's:
    the plan's line, random plans' mean with their range as bars, the uniform-by-layer plan's line (the curve), full
    attention's level dashed in its 95 % interval; the plan's share marked. Shares that stream as many KV heads
    (1/8 and 1/4 of 4 heads: one) are one plan and one point, the first of them."""
    from matplotlib.ticker import PercentFormatter

    from attnscope.output.line_plots import line_plot

    check = result.check
    counts: set[int] = set()  # shares that stream as many KV heads are one plan: the first of them is drawn
    shares = [share for share in check["shares"] if not (share["kv_heads"] in counts or counts.add(share["kv_heads"]))]
    x = [share["memory"] for share in shares]
    randoms = [share["random"] or [share["plan"]] for share in shares]  # no head streams: full attention itself
    random_name = f"random plans (mean of {check['random_plans']}, range)"
    series = {
        "this plan (lowest scores stream)": [share["plan"] for share in shares],
        random_name: [float(sum(r) / len(r)) for r in randoms],
    }
    if check.get("curve"):
        series["uniform by layer (as many streaming in each)"] = [share["uniform"] for share in shares]
    full_name = "full attention (its 95 % interval shaded)"
    series[full_name] = [check["full"]] * len(shares)
    styles = {full_name: {"color": "#5F5F5F", "linestyle": "--", "marker": ""}}
    spreads = {random_name: ([min(r) for r in randoms], [max(r) for r in randoms])}
    subtitle = (
        f"{result.model.get('name', '')}; {counted(check['prompts'], 'prompt')} of "
        f"{', '.join(f'{n:,}' for n in check['lengths'])} tokens; streaming heads keep the first "
        f"{result.settings['sink']:,} + last {result.settings['recent']:,} tokens; memory at "
        f"{result.settings['context']:,} tokens"
    )
    figure = line_plot(
        x, series, "KV cache at --context (share of full attention's)", "accuracy (share retrieved)",
        "Passkey and multi-key needle retrieval against KV-cache memory", subtitle,
        styles=styles, y_top=1.05, spreads=spreads,
    )  # fmt: skip
    axes = figure.axes[0]
    axes.axhspan(*check["full_interval"], color="#5F5F5F", alpha=0.12, linewidth=0, zorder=0)
    axes.xaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
    chosen = next(share for share in check["shares"] if share["streaming"] == check["streaming"])
    axes.axvline(chosen["memory"], color="#bbbbbb", linewidth=1, zorder=0)
    label = f"the plan: {check['streaming']:g} streaming" + (" (auto)" if check.get("auto") else "")
    axes.annotate(label, (chosen["memory"], 1.05), xytext=(3, -10), textcoords="offset points", fontsize=8,
                  color="#5F5F5F")  # fmt: skip
    return figure
