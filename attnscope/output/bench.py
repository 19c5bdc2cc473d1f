"""`attnscope bench`, shown: the JSON of every measurement (and the micro-benchmark's), the speed picture, the
terminal's tables and the notebook's.

Reads a BenchResult (analyses.bench) by duck typing: `model` (name and shape), `settings` (what was asked, and the
machine), `rows` (analyses.bench.records: one per method × batch × sequence length), `micro`, `notes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import document, to_json
from attnscope.output.views import View, fitted, summary
from attnscope.scores.catalog import counted


class BenchView(View):
    command = "bench"

    def document(self) -> dict:
        result = self.result
        return document(
            "bench", result.model, {}, result.settings, result.notes, results=result.rows, micro=result.micro
        )

    def records(self) -> list[dict]:
        return self.result.rows

    def data_files(self, stage: Path) -> list[Path]:
        return [self.write(stage, "bench.json", to_json(self.document()))]

    def figures(self) -> dict[str, Any]:
        """tokens_per_s: tokens per second against sequence length, one line per method and batch size: a colour
        per method, a line style per batch size."""
        return {"tokens_per_s": bench_figure(self.result)}

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        result, machine = self.result, self.result.settings
        where = f"{machine['device_name']}, {counted(machine['cpu_threads'], 'CPU thread')}, {machine['dtype']}"
        shown = [bench_table(result.rows, f"attnscope bench: {result.model['name']} on {where}")]
        if result.micro:
            title = "Attention from scratch vs torch's SDPA"
            d_model = machine.get("micro_d_model", 512)
            shown.append(micro_table(result.micro, title, machine["repeats"], d_model))
        return shown

    def notebook(self) -> str:
        return notebook.fragment(
            notebook.note_lines(self.notes),
            notebook.records_table(self.records(), f"attnscope bench: {self.result.model['name']}"),
        )

    def summary(self) -> str:
        """The model and the machine, what was timed, the fastest method at each size (batch × length), and
        attnscope's time against the floor's and its speed-up over the baselines (the ranges over the sizes)."""
        result, machine, rows = self.result, self.result.settings, self.result.rows
        threads = machine.get("cpu_threads")
        where = ", ".join(
            str(part)
            for part in (machine.get("device_name"), threads and counted(threads, "CPU thread"), machine.get("dtype"))
            if part
        )
        methods = list(dict.fromkeys(row["method"] for row in rows))
        batches = sorted({row["batch"] for row in rows})
        lengths = sorted({row["seq"] for row in rows})
        headline = (
            f"{result.model.get('name')} on {where}: {counted(len(methods), 'method')} × batch "
            f"{', '.join(map(str, batches))} × length {', '.join(map(str, lengths))}"
        )
        fastest: dict[tuple[int, int], dict] = {}
        for row in rows:
            size = (row["batch"], row["seq"])
            if size not in fastest or row["tokens_per_s"] > fastest[size]["tokens_per_s"]:
                fastest[size] = row
        winners = [row["method"] for row in fastest.values()]
        wins = [f"{method} at {winners.count(method)}" for method in dict.fromkeys(winners)]
        lines = [fitted(f"fastest method, of the {len(fastest)} sizes (batch × length): ", wins)]

        def spread(key: str) -> str | None:
            """attnscope's `key` over the sizes: `1.21×`, or `1.21-1.90×`; None where it has none."""
            values = [row[key] for row in rows if row["method"] == "attnscope" and row.get(key) is not None]
            if not values:
                return None
            low, high = f"{min(values):.2f}", f"{max(values):.2f}"
            return f"{low}×" if low == high else f"{low}-{high}×"

        ours = [f"{spread('time_vs_floor')} the floor's time"] if spread("time_vs_floor") else []
        speedups = {name: spread(f"speedup_vs_{name}") for name in ("tutorial", "cache")}
        speedups = [f"{name} {value}" for name, value in speedups.items() if value]
        ours += [f"speed-up over {', '.join(speedups)}"] if speedups else []
        lines.append(fitted("attnscope: ", ours))
        if result.micro:
            lines.append(f"micro-benchmark: {counted(len(result.micro), 'row')} in .micro")
        return summary(self, headline, lines, [".rows", *([".micro"] if result.micro else [])])


# -------------------------------------------------------------------------------------------------------------- figures


def bench_figure(result: Any) -> Any:
    """A BenchResult: tokens per second against sequence length, one line per method and batch size (a colour and
    a marker per method, a line style per batch size), each point the median run, with an error bar from the
    slowest to the fastest of its runs (batch × seq tokens over max_s and min_s), on an axis from 0."""
    from attnscope.output import line_plots

    rows, machine = result.rows, result.settings
    seqs = sorted({row["seq"] for row in rows})
    methods = list(dict.fromkeys(row["method"] for row in rows))
    dashes = ("-", "--", ":", "-.")
    batches = sorted({row["batch"] for row in rows})
    line_styles = {batch: dashes[index % len(dashes)] for index, batch in enumerate(batches)}
    series, spread, styles = {}, {}, {}
    for row in rows:
        label = f"{row['method']}, batch {row['batch']}"
        tokens = row["batch"] * row["seq"]
        series.setdefault(label, {})[row["seq"]] = row["tokens_per_s"]
        spread.setdefault(label, {})[row["seq"]] = (tokens / row["max_s"], tokens / row["min_s"])
        k = methods.index(row["method"])
        styles[label] = {
            "color": line_plots.SERIES_COLOURS[k % len(line_plots.SERIES_COLOURS)],
            "marker": line_plots.SERIES_MARKERS[k % len(line_plots.SERIES_MARKERS)],
            "linestyle": line_styles[row["batch"]],
        }
    lines = {label: [values.get(seq) for seq in seqs] for label, values in series.items()}
    spreads = {
        label: tuple([values[seq][end] if seq in values else None for seq in seqs] for end in (0, 1))
        for label, values in spread.items()
    }
    threads = machine["cpu_threads"]
    where = (
        machine["device_name"] if machine["device"] != "cpu" else f"CPU, {threads} thread{'s' if threads != 1 else ''}"
    )
    runs = sorted({row.get("runs", 1) for row in rows})
    subtitle = f"{result.model['name']} on {where}, {machine.get('dtype', '')}".rstrip(", ")
    subtitle += f"; points: the median of {'/'.join(map(str, runs))} runs, bars: the slowest to the fastest"
    labels = ("sequence length (tokens)", "tokens per second")
    return line_plots.line_plot(
        seqs, lines, *labels, "Analysis speed by sequence length", subtitle, log_x=True, styles=styles, spreads=spreads
    )


# ------------------------------------------------------------------------------------------------------------- terminal


def bench_table(rows: Sequence[dict], title: str) -> Any:
    """One group of rows per batch size × sequence length (B × n). Fits 80 columns: headers on up to three lines,
    one space between columns; the caption says what every column is."""
    from rich import box
    from rich.table import Table

    methods = {row["method"] for row in rows}
    baselines = [name for name in ("floor", "tutorial", "cache") if name in methods]
    runs = {row.get("runs") for row in rows}
    table = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=0,
        show_edge=False,
        caption=" ".join(
            [
                "median ms: of one call (a batch);",
                "spread: (max - min) / median time of the runs"
                + (" ('–': one run only)." if 1 in runs else f" ({_runs(runs)})."),
                f"time {', '.join(f'×{name}' for name in baselines)}: this row's median time divided by "
                f"{', '.join(f'the {name} method' + chr(39) + 's' for name in baselines)} at the same B × n (below 1: "
                "faster).",
                "peak MB: the median of the runs' peaks above the memory in use before;",
                "memory ×floor: this row's peak divided by the floor's ('–' where the floor's peak is under 1 MB, too "
                "small to divide by).",
            ]
        ),
        caption_justify="left",
    )
    headers = [
        ("B × n", "right"),
        ("method", "left"),
        ("median\nms", "right"),
        ("spread", "right"),
        ("tokens/s", "right"),
        *((f"time\n×{name}", "right") for name in baselines),
        ("peak\nMB", "right"),
        ("memory\n×floor", "right"),
    ]
    for header, justify in headers:
        table.add_column(header, justify=justify, no_wrap=True)
    for index, row in enumerate(rows):
        config = (row["batch"], row["seq"])
        first = index == 0 or config != (rows[index - 1]["batch"], rows[index - 1]["seq"])
        last = index == len(rows) - 1 or config != (rows[index + 1]["batch"], rows[index + 1]["seq"])
        table.add_row(
            f"{row['batch']} × {row['seq']}" if first else "",
            row["method"],
            f"{row['median_s'] * 1000:,.2f}",  # a small model's forward takes a millisecond or two
            "–" if row.get("runs") == 1 else f"{row['spread']:.0%}",
            f"{row['tokens_per_s']:,.0f}",
            *(_times(row.get(f"time_vs_{name}")) for name in baselines),
            _megabytes(row["peak_mb"]),
            _times(row["memory_vs_floor"]) or "–",
            end_section=last,
        )
    return table


def _runs(runs: set) -> str:
    return counted(min(runs), "run") if len(runs) == 1 else "runs per row: " + ", ".join(map(str, sorted(runs)))


def micro_table(rows: Sequence[dict], title: str, repeats: int, d_model: int) -> Any:
    """The micro-benchmark's milliseconds per call, one group of rows per B × n, one row per head count."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        show_edge=False,
        caption=(
            f"Milliseconds per call (one call: all B sequences; numpy takes them one at a time), the median of "
            f"{counted(repeats, 'run')}; d_model {d_model}, causal attention."
        ),
        caption_justify="left",
    )
    headers = ("B × n", "heads", "d_head", "numpy\nloop", "numpy\nbatched", "torch\nscratch", "torch\nSDPA")
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    for index, row in enumerate(rows):
        shape = (row.get("batch", 1), row.get("seq"))
        first = index == 0 or shape != (rows[index - 1].get("batch", 1), rows[index - 1].get("seq"))
        last = index == len(rows) - 1 or shape != (rows[index + 1].get("batch", 1), rows[index + 1].get("seq"))
        table.add_row(
            f"{shape[0]} × {shape[1]}" if first else "",
            str(row["heads"]),
            str(row["d_head"]),
            *(
                f"{row[name]:,.2f}"
                for name in ("numpy_loop_ms", "numpy_batched_ms", "torch_scratch_ms", "torch_sdpa_ms")
            ),
            end_section=last,
        )
    return table


def _times(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}×"


def _megabytes(value: float) -> str:
    """A peak in MB with the digits it needs: 1,234, 12, 3.4, 0.42 (a small model's peaks are under a megabyte)."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}" if value >= 1 else f"{value:.2f}"
