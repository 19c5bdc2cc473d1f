"""Terminal rendering with rich: tables and the role map. Renders only; computes nothing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from attnscope.scores.catalog import ROLE, ROLES, SCORE, Score, counted, roles_for, table_columns

ROLE_STYLES = {role.name: f"bold {role.ink} on {role.colour}" for role in ROLES}  # the catalog's palette

# What each score the heads table can show is, in words, for the key under the table (the catalog's descriptions
# are definitions, with formulas; these are for a reader of the table). `share`: of a row's attention, 0 to 1.
SCORE_KEYS = {
    "previous_token": "share on the token before",
    "first_token": "share on the first token",
    "self": "share on the token itself",
    "next_token": "share on the token after",
    "last_token": "share on the last token",
    "induction": "share on the token after an earlier copy (probe)",
    "duplicate_token": "share on the earlier copy itself (probe)",
    "local": "share in the local window",
    "local_lift": "local lift: 0 as uniform, 1 all in the window",
    "local_uniform": "share in the local window if attention were uniform",
    "entropy_normalized": "entropy / its maximum: 1 uniform",
    "entropy": "entropy in nats",
    "confidence": "weight of the strongest key",
}


def role_cell(role: str) -> Text:
    return Text(f"{ROLE[role].short:^5}", style=ROLE_STYLES[role])


def role_codes(roles: Iterable[Any], width: int) -> dict[str, str]:
    """Each role's code in a cell `width` characters wide: its short label cut to `width` letters (prev, pre, pr).
    Cut to 2 or 3 letters, the labels of the catalog's roles still differ (tests/unit/test_terminal.py checks it)."""
    return {role.name: role.short[:width] for role in roles}


def packed(entries: Sequence[Text], width: int, separator: str = "   ") -> Text:
    """`entries` laid out in lines of at most `width` cells, broken only between entries (an entry longer than a
    line gets a line of its own, and is wrapped by rich there)."""
    lines: list[Text] = []
    line = Text()
    for entry in entries:
        if line.cell_len and line.cell_len + len(separator) + entry.cell_len > width:
            lines.append(line)
            line = Text()
        if line.cell_len:
            line.append(separator)
        line.append_text(entry)
    if line.cell_len:
        lines.append(line)
    return Text("\n").join(lines)


class HeadsTable:
    """One row per head: its label, role, what decided the role, and the catalog's table columns for this kind of
    model (`catalog.table_columns`: sorted by a score that has no column of its own, it takes its sibling's place,
    entropy in nats where Hnorm was, the raw local share where lift was); `-` is a score that was not measured.

    Fits the console's width: score columns are left out (the sort's last, the others from the right) before the
    head, the role and what decided it, and the key under the table says which; the key names every header in
    words."""

    def __init__(
        self,
        heads: Sequence[Any],
        title: str,
        kind: str,
        sort: str | None = None,
        thresholds: dict[str, float] | None = None,
    ):
        self.heads, self.title, self.kind, self.sort = heads, title, kind, sort
        self.thresholds = thresholds or {role.name: role.threshold for role in ROLES if role.threshold is not None}
        self.columns = table_columns(kind, sort)

    def thresholds_in_words(self) -> str:
        """`0.5 (Hnorm 0.8)`: the thresholds of the roles of this kind, the commonest first, the others by score."""
        by_score = {
            SCORE[role.score].short: self.thresholds.get(role.name, role.threshold)
            for role in roles_for(self.kind)
            if role.score is not None
        }
        values = list(by_score.values())
        common = max(values, key=values.count)
        others = ", ".join(f"{short} {value:g}" for short, value in by_score.items() if value != common)
        return f"{common:g}" + (f" ({others})" if others else "")

    def table(self, columns: Sequence[Score]) -> Table:
        table = Table(
            title=self.title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0)
        )
        table.add_column("head", justify="right", no_wrap=True)
        table.add_column("role", no_wrap=True)
        table.add_column("decided by", justify="right", no_wrap=True)
        for score in columns:
            table.add_column(score.short, justify="right", no_wrap=True)
        for record in self.heads:
            table.add_row(
                record.label,
                role_cell(record.role.role),
                f"{SCORE[record.role.metric].short} {record.role.score:.2f}",
                *("-" if record.scores[s.name] is None else f"{record.scores[s.name]:.2f}" for s in columns),
            )
        return table

    def fitting_columns(self, console: Console, options: ConsoleOptions) -> list[Score]:
        """The score columns that fit in the width: the sort's first, then in table order."""
        wanted = sorted(self.columns, key=lambda score: score.name != self.sort)
        shown: list[Score] = []
        for score in wanted:
            trial = [column for column in self.columns if column in shown or column is score]
            natural = console.measure(self.table(trial), options=options.update_width(10_000)).maximum
            if natural > options.max_width:
                break
            shown = trial
        return shown

    def key(self, shown: Sequence[Score], width: int) -> Text:
        def entry(header: str, words: str) -> Text:
            return Text.assemble((header, "bold"), " ", words)

        entries = [
            entry("head", "layer.head, from 0"),
            entry(
                "decided by",
                f"the score that passed its threshold, {self.thresholds_in_words()}; for mixed, the score "
                "closest to its threshold",
            ),
            *(entry(score.short, SCORE_KEYS[score.name]) for score in shown),
            Text("share: of a row's attention, 0 to 1; scores are means over the rows read"),
        ]
        hidden = [score.short for score in self.columns if score not in shown]
        if hidden:
            entries.append(Text(f"left out for want of width: {', '.join(hidden)} (see --json or --csv)", "dim"))
        return packed(entries, width, "  ·  ")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shown = self.fitting_columns(console, options)
        yield self.table(shown)
        yield self.key(shown, options.max_width)


def heads_table(
    heads: Sequence[Any], title: str, kind: str, sort: str | None = None, thresholds: dict[str, float] | None = None
) -> HeadsTable:
    """The heads table (see `HeadsTable`): as many score columns as the console's width holds."""
    return HeadsTable(heads, title, kind, sort, thresholds)


class RoleMap:
    """Layers as rows, heads as columns, one coloured cell per head with its role's code, and a legend under it.
    Cells are 5 characters wide (the roles' short labels), or 3 or 2 where the width is short (the labels cut to
    as many letters as still tell the roles apart); the legend breaks between its entries, never inside one."""

    def __init__(self, heads: Sequence[Any], n_layer: int, n_head: int, title: str, kind: str):
        self.roles = {(record.layer, record.head): record.role.role for record in heads}
        self.n_layer, self.n_head, self.title, self.kind = n_layer, n_head, title, kind

    def grid(self, cell: int) -> Table:
        codes = role_codes(roles_for(self.kind), cell)
        grid = Table(box=None, padding=(0, 1, 0, 0), show_edge=False, header_style="bold")
        grid.add_column("L\\H", justify="right", no_wrap=True)
        for head in range(self.n_head):
            grid.add_column(str(head), justify="center", width=cell, no_wrap=True)
        for layer in range(self.n_layer):
            cells = (self.roles[layer, head] for head in range(self.n_head))
            grid.add_row(str(layer), *(Text(f"{codes[role]:^{cell}}", style=ROLE_STYLES[role]) for role in cells))
        return grid

    def legend(self, cell: int, width: int) -> Text:
        codes = role_codes(roles_for(self.kind), cell)
        entries = []
        for role in roles_for(self.kind):
            chip = Text(f" {codes[role.name]} ", style=ROLE_STYLES[role.name])
            entries.append(chip if codes[role.name] == role.name else Text.assemble(chip, " ", role.name))
        return packed(entries, width, "  ")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        label = max(len(str(self.n_layer - 1)), len("L\\H")) + 1  # the layer column and its padding
        cell = next((size for size in (5, 3) if label + (size + 1) * self.n_head <= options.max_width), 2)
        yield Text(self.title, style="bold")
        yield self.grid(cell)
        yield Text("rows: layers, columns: heads (from 0)", style="dim")
        yield self.legend(cell, options.max_width)


def role_map(heads: Sequence[Any], n_layer: int, n_head: int, title: str, kind: str) -> RoleMap:
    """The role map (see `RoleMap`): GPT-2 small's 12 × 12 fits in 80 columns, and in 40 with 2-letter codes."""
    return RoleMap(heads, n_layer, n_head, title, kind)


def key_value_table(rows: Sequence[tuple[str, str]], title: str) -> Table:
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, value)
    return table


def pairs_table(pairs: Sequence[dict], title: str) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for header in ("heads", "JSD bits", "JS distance", "cosine"):
        table.add_column(header, justify="right")
    for pair in pairs:
        table.add_row(
            f"{pair['a']} ~ {pair['b']}", f"{pair['js']:.3f}", f"{pair['js_distance']:.3f}", f"{pair['cosine']:.3f}"
        )
    return table


def matrix_table(matrix: Any, labels: Sequence[str], title: str) -> Table:
    """A small square matrix (one layer's heads) as a table, two decimals."""
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    table.add_column("", justify="right", style="bold")
    short = [label.split(".")[-1] for label in labels]
    for name in short:
        table.add_column(name, justify="right")
    for i, label in enumerate(labels):
        table.add_row(label, *("" if i == j else f"{matrix[i][j]:.2f}" for j in range(len(labels))))
    return table


def layer_scores_table(scores: dict, title: str) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("layer", justify="right")
    table.add_column("mean pairwise JSD (bits)", justify="right")
    for layer, score in scores.items():
        table.add_row(str(layer), f"{score:.3f}")
    return table


def records_table(rows: Sequence[dict], title: str) -> Table:
    """Any list of flat records with the same keys; floats with three decimals, None as '-'."""
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for key in rows[0]:
        table.add_column(key.removesuffix("_ms").replace("_", " "), justify="right")
    for row in rows:
        table.add_row(*("-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    return table


def bench_table(rows: Sequence[dict], title: str) -> Table:
    """One group of rows per batch size × sequence length (B × n). Fits 80 columns: headers on up to three lines,
    one space between columns; the caption says what every column is."""
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
                f"time {', '.join(f'×{name}' for name in baselines)}: the method's median time / that method's "
                "(below 1: faster).",
                "peak MB: the median of the runs' peaks; memory ×floor: it / the floor's.",
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
            f"{row['peak_mb']:.0f}",
            _times(row["memory_vs_floor"]),
            end_section=last,
        )
    return table


def _runs(runs: set) -> str:
    return counted(min(runs), "run") if len(runs) == 1 else "runs per row: " + ", ".join(map(str, sorted(runs)))


def micro_table(rows: Sequence[dict], title: str, repeats: int, d_model: int) -> Table:
    """The micro-benchmark's milliseconds per call, one group of rows per B × n, one row per head count."""
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


def layer_head_grid(matrix: Any, title: str, unit_range: bool = True) -> Group:
    """A layer × head matrix; GPT-2 small (12 × 12) fits in 80 columns. Weights in [0, 1] (`unit_range`) are written
    with two decimals without the leading zero, heavy cells in bold; any other values as a signed percentage of the
    largest magnitude, which the title then states."""
    n_layer, n_head = matrix.shape
    scale = max(float(abs(matrix).max()), 1e-300)
    if not unit_range:
        title = f"{title}, as % of the largest magnitude ({scale:.3g})"
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    table.add_column("L\\H", justify="right", style="bold")
    for head in range(n_head):
        table.add_column(str(head), justify="right")
    for layer in range(n_layer):
        cells = []
        for head in range(n_head):
            value = float(matrix[layer, head])
            share = value if unit_range else value / scale
            if unit_range:
                text = "1.0" if value >= 0.995 else f"{value:.2f}".lstrip("0")
            else:
                text = f"{100 * share:.0f}"
            cells.append(Text(text, style="bold" if share >= 0.5 else "dim" if abs(share) < 0.05 else ""))
        table.add_row(str(layer), *cells)
    return Group(Text(title, style="bold"), table)


def attend_table(
    rows: Sequence[tuple[str, float | None, Sequence[tuple[str, float]]]], header: str, title: str
) -> Table:
    """The strongest heads, one row each: (head label, weight on the target or None, top keys as (name, weight)),
    the names as tables show tokens and words (`do@2`, `##ct@3`, `doctor@2-4`)."""
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("head", justify="right")
    targeted = any(weight is not None for _, weight, _ in rows)
    if targeted:
        table.add_column("to target", justify="right")
    table.add_column(header)
    for label, weight, tops in rows:
        shown = ", ".join(f"{name}: {value:.2f}" for name, value in tops)
        table.add_row(label, *([f"{weight:.3f}"] if targeted else []), shown)
    return table
