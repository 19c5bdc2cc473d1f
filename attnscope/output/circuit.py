"""`attnscope circuit`, shown: the dependencies of each explained head (JSON, CSV, a table per head), the circuit
graph, the dependency matrix and the composition matrices as pictures, the notebook's tables.

Reads a CircuitResult (analyses.circuit) by duck typing: `model`, `inputs`, `settings`, `notes`, `explained`,
`with_values`, `changes` (n, L, H), `heads` (records), `composition` (or None), `baseline`, `top`,
`dependencies(top)`, `composition_records()`, `edges(threshold)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.output import notebook
from attnscope.output.documents import result_document
from attnscope.output.views import TopView, fitted, inputs_read, model_shape, shown_rows, summary
from attnscope.scores.catalog import FRACTION, NATS, SCORE, SIGNED, counted

EDGE_MIN = 0.05  # |change| of a score (its own units: most are fractions of attention) for an edge of the graph
EDGES_PER_HEAD = 3  # each head's strongest dependencies drawn at most: its circuit, not every small effect
EDGES_MAX = 150  # edges drawn at most, the strongest: beyond, a graph of 144 heads is a smear
TERMINAL_HEADS = 24  # explained heads given a table in the terminal; the rest are in --json and --csv
SHOWN = 10  # dependencies per explained head the terminal and a notebook list without --top


class CircuitView(TopView):
    command = "circuit"
    columns = ("label", "on", "score", "with", "without", "change")

    def document(self, every: bool = False) -> dict:
        """The explained heads' dependencies (each head's --top largest by |change|, or all; by change, most
        negative first), the composition of every earlier head into them, and one record per head."""
        result = self.result
        return result_document(
            "circuit",
            result,
            estimate=result.estimate,
            dependencies=result.dependencies(None if every else result.top),
            composition=result.composition_records(),
            composition_baseline=result.baseline,
            heads=result.heads,
        )

    def rows(self, every: bool) -> list[dict]:
        """--csv's rows: each explained head's dependencies (B, A earlier), by change (its --top largest, or all);
        `every` (circuit.csv): every dependency."""
        return self.result.dependencies(None if every else self.result.top)

    # ---------------------------------------------------------------------------------------------- figures

    def figures(self) -> dict[str, Any]:
        """circuit (the graph), dependencies (B × A), and with the weights composition_q, composition_k,
        composition_v (B × A)."""
        drawn = {"circuit": circuit_graph(self.result), "dependencies": dependency_matrix(self.result)}
        if self.result.composition is not None:
            for kind in ("q", "k", "v"):
                drawn[f"composition_{kind}"] = composition_matrix(self.result, kind)
        return drawn

    # --------------------------------------------------------------------------------------------- terminal

    def _tables(self) -> list[tuple[str, list[dict]]]:
        """(title, rows) per explained head, its `top` dependencies. The gradient's rows say they are estimates
        (`est. change`, `est. without`), and a `without` clipped to the score's range says so."""
        result = self.result
        by_head: dict[str, list[dict]] = {}
        for record in result.dependencies(shown_rows(result, SHOWN)):
            by_head.setdefault(record["label"], []).append(record)
        tables = []
        heads = {record["label"]: record for record in result.heads}
        without, change = ("est. without", "est. change") if result.estimate else ("without", "change")
        for layer, head, score in result.explained[:TERMINAL_HEADS]:
            label = f"{layer}.{head}"
            record = heads[label]
            rows = [
                {
                    "on": dep["on"],
                    "role": heads[dep["on"]]["role"],
                    without: f"{dep['without']:.3f} (clipped)" if dep["clipped"] else dep["without"],
                    change: dep["change"],
                }
                for dep in by_head.get(label, [])
            ]
            title = f"{label} ({record['role']}), {score} = {record['value']:.3f}"
            tables.append((title, rows))
        return tables

    def _headline(self) -> str:
        """What the tables hold: measured changes (removal), or estimates to confirm by removal (gradient)."""
        result = self.result
        count = f"{len(result.explained)} head{'s' if len(result.explained) != 1 else ''}"
        shown = shown_rows(result, SHOWN)
        ablation = result.settings.get("ablation")
        mode = f", {ablation} ablation" if ablation else ""
        if not result.estimate:
            return (
                f"{count} explained by removing each earlier head (removal: measured{mode}); the {shown} largest "
                "changes of each, most negative first"
            )
        steps = result.settings.get("steps")
        how = f"integrated gradients over {steps} points" if steps else "the gradient with every head kept"
        return (
            f"{count} explained by ESTIMATES of each earlier head's removal (gradient: {how}{mode}, a first-order "
            f"estimate; confirm with --method removal); the {shown} largest estimated changes of each, most negative "
            "first"
        )

    def _clipped_line(self) -> str | None:
        result = self.result
        if not any(record["clipped"] for record in result.dependencies(shown_rows(result, SHOWN))):
            return None
        return (
            "clipped: with + the estimated change leaves the range the score can take ([0, 1] for a share); shown "
            "at the range's end: the linear estimate has broken down there"
        )

    def _weights_line(self) -> str | None:
        """One line on composition and copying: the strongest K-composition pair, the most copying head."""
        result = self.result
        parts = []
        pairs = result.composition_records()
        if pairs:
            best = max(pairs, key=lambda pair: (pair["k"], pair["from"], pair["to"]))
            mean = result.baseline["k"]["mean"] if result.baseline else float("nan")
            parts.append(f"strongest K-composition {best['from']} → {best['to']} {best['k']:.3f} (random {mean:.3f})")
        copying = [record for record in result.heads if record["copying"] is not None]
        if copying:
            best = max(copying, key=lambda record: record["copying"])
            parts.append(f"most copying head {best['label']} ({best['copying']:.2f})")
        effects = [record for record in result.heads if record["direct_effect"] is not None]
        if effects:
            best = max(effects, key=lambda record: abs(record["direct_effect"]))
            parts.append(f"largest direct effect {best['label']} ({best['direct_effect']:+.3f})")
        return "; ".join(parts) if parts else None

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result = self.result
        shown: list[Any] = [self._headline()]
        for title, rows in self._tables():
            shown.append(terminal.records_table(rows, title) if rows else f"{title}: no earlier head")
        if len(result.explained) > TERMINAL_HEADS:
            shown.append(f"… and {len(result.explained) - TERMINAL_HEADS} more heads: see --json, --csv or --out")
        clipped = self._clipped_line()
        if clipped:
            shown.append(clipped)
        line = self._weights_line()
        if line:
            shown.append(line)
        return shown

    def notebook(self) -> str:
        parts = [notebook.note_lines(self.notes), notebook.paragraph(self._headline())]
        for title, rows in self._tables():
            parts.append(notebook.records_table(rows, title))
        clipped = self._clipped_line()
        if clipped:
            parts.append(notebook.paragraph(clipped))
        line = self._weights_line()
        if line:
            parts.append(notebook.paragraph(line))
        return notebook.fragment(*parts)

    def summary(self) -> str:
        """The model, the heads explained and how, each head's strongest dependency (the first row of its terminal
        table: A → B and the change of B's score without A), the most negative first, and the weights' line."""
        result = self.result
        method = result.settings.get("method", "removal")
        steps = result.settings.get("steps")
        how = f"{method} ({counted(steps, 'step')})" if method == "gradient" and steps else method
        how += f", {result.settings['ablation']} ablation" if result.settings.get("ablation") else ""
        if result.estimate:
            how += ", estimates to confirm by removal"
        headline = (
            f"{model_shape(result.model)}; {counted(len(result.explained), 'head')} explained by {how}"
            f"{inputs_read(result.inputs)}"
        )
        strongest = sorted(result.dependencies(1), key=lambda record: (record["change"], record["label"]))
        needs = [f"{record['on']} → {record['label']} {record['change']:+.3f}" for record in strongest]
        lines = [fitted("removing A changes B (estimated): " if result.estimate else "removing A changes B: ", needs)]
        weights = self._weights_line()  # its parts one per line: the composition, the copying, the direct effect
        lines += weights.split("; ") if weights else []
        return summary(self, headline, lines, [".dependencies(top)", ".heads", ".explained"])


# -------------------------------------------------------------------------------------------------------------- figures


def _roles(result: Any) -> list[list[str]]:
    L, H = result.model["n_layer"], result.model["n_head"]
    roles = [["mixed"] * H for _ in range(L)]
    for record in result.heads:
        roles[record["layer"]][record["head"]] = record["role"]
    return roles


def unit_words(name: str) -> str:
    """A score's unit in words, for a colour bar."""
    score = SCORE[name]
    if name == "entropy_normalized":
        return "entropy ratio to uniform"
    return {FRACTION: "share of attention", SIGNED: "lift, at most 1", NATS: "nats"}[score.unit]


def change_label(result: Any, arrows: bool = False) -> str:
    """The colour bar's label of the changes: which score changes (each explained head's own, or the one asked
    for), of which head without which (B without A: the arrow's end without its start, in the graph), in what unit,
    and whether estimated."""
    names = sorted({score for _, _, score in result.explained})
    change = "estimated change" if result.estimate else "change"
    where = "B without A (arrow A → B)" if arrows else "B (row) without A (column)"
    if len(names) == 1:
        return f"{change} of {SCORE[names[0]].label}, {where}; {unit_words(names[0])}"
    units = "; ".join(f"{SCORE[name].short}: {unit_words(name)}" for name in names)
    return f"{change} of the deciding score, {where}; {units}"


def _estimated(result: Any, subtitle: str) -> str:
    """A picture's subtitle, saying when its changes are estimates."""
    if not result.estimate:
        return subtitle
    return f"{subtitle}; ESTIMATED by attribution patching (method gradient): confirm by removal"


def circuit_graph(result: Any) -> Any:
    """The circuit: heads in layer columns coloured by role; an arrow A → B for each dependency with |change| of at
    least EDGE_MIN, each head's EDGES_PER_HEAD strongest, EDGES_MAX at most; a note says how many were left out."""
    from attnscope.output import figures, head_graph

    edges, below, beyond = result.edges(EDGE_MIN, EDGES_PER_HEAD, EDGES_MAX)
    left = []
    if below:
        left.append(f"{below:,} pairs with |change| < {EDGE_MIN:g} left out")
    if beyond:
        left.append(f"{beyond:,} more beyond each head's {EDGES_PER_HEAD} strongest (and {EDGES_MAX} in all) left out")
    note = f"{counted(len(edges), 'dependency', 'dependencies')} drawn (|change| ≥ {EDGE_MIN:g})" + (
        f"; {'; '.join(left)}" if left else ""
    )
    title = "Circuit: which earlier heads each head's score depends on"
    return head_graph.head_graph(
        _roles(result),
        edges,
        f"{title} (estimated)" if result.estimate else title,
        change_label(result, arrows=True),
        _estimated(result, f"{figures.describe_input(result.model, result.inputs)}; ringed: the heads explained"),
        note,
        marked=[(layer, head) for layer, head, _ in result.explained],
    )


def _pair_axes(result: Any, scores: bool = True) -> tuple[list[str], list[str], int]:
    """The rows (the heads explained; with several scores and `scores`, each row names its own), the columns (every
    head of the layers before the last explained one) and that layer."""
    several = scores and len({score for _, _, score in result.explained}) > 1
    rows = [
        f"{layer}.{head}" + (f" {SCORE[score].short}" if several else "") for layer, head, score in result.explained
    ]
    top = max(layer for layer, _, _ in result.explained)
    H = result.model["n_head"]
    columns = [f"{a}.{h}" for a in range(top) for h in range(H)]
    return rows, columns, top


def dependency_matrix(result: Any) -> Any:
    """B × A: the change of B's score without A, centred at 0 (blue: B depends on A); grey where A is not earlier."""
    from attnscope.output import figures, head_matrices

    rows, columns, top = _pair_axes(result)
    H = result.model["n_head"]
    matrix = result.changes[:, :top, :].reshape(len(rows), top * H).copy()  # (n, top·H)
    for i, (layer, _, _) in enumerate(result.explained):
        matrix[i, layer * H :] = np.nan  # A in B's layer or later: no such dependency
    title = "How each head's score changes without an earlier head"
    return head_matrices.pair_matrix(
        matrix,
        rows,
        columns,
        f"{title} (estimated)" if result.estimate else title,
        change_label(result),
        _estimated(result, figures.describe_input(result.model, result.inputs)),
        scale="score_change",
        signed=True,
        vmin=None,
        row_title="explained head B (layer.head)",
        column_title="removed head A (layer.head)",
    )


COMPOSITION_TITLES = {
    "q": "Q-composition: B's queries read what A writes",
    "k": "K-composition: B's keys read what A writes",
    "v": "V-composition: B's values read what A writes",
}
BASELINE_SPREAD = 5.0  # the colour scale's half-width is at least this many of the random heads' standard deviations


def composition_matrices(result: Any) -> dict[str, np.ndarray]:
    """Per kind ("q", "k", "v"), B × A: the composition score of each earlier head A into each explained head B
    (NaN where A is not earlier)."""
    rows, _, top = _pair_axes(result, scores=False)
    H = result.model["n_head"]
    matrices = {}
    for kind in ("q", "k", "v"):
        scores = getattr(result.composition, kind)  # (L, H, L, H) [A, B]
        matrix = np.full((len(rows), top * H), np.nan)
        for i, (layer, head, _) in enumerate(result.explained):
            matrix[i, : layer * H] = scores[:layer, :, layer, head].reshape(-1)
        matrices[kind] = matrix
    return matrices


def composition_half_width(result: Any, matrices: dict[str, np.ndarray]) -> float:
    """The half-width of the three composition pictures' colour scales, the same for all three so that they compare:
    the largest distance of any score from its kind's random mean, and at least BASELINE_SPREAD of the random heads'
    largest standard deviation (scores within the random spread stay pale)."""
    baseline = result.baseline
    spread = BASELINE_SPREAD * max(baseline[kind]["std"] for kind in matrices)
    distances = [
        float(np.nanmax(np.abs(matrix - baseline[kind]["mean"])))
        for kind, matrix in matrices.items()
        if np.isfinite(matrix).any()
    ]
    return max([spread, *distances]) or 1.0


def composition_matrix(result: Any, kind: str) -> Any:
    """B × A: the `kind` ("q", "k", "v") composition score from the weights, on a diverging scale centred on the
    random heads' mean (white: what random heads of the same shapes give; red above, blue below), the same half-width
    in the three pictures; the random mean and its ±2 standard deviations marked on the colour bar."""
    from attnscope.output import head_matrices

    rows, columns, _ = _pair_axes(result, scores=False)
    matrices = composition_matrices(result)
    baseline = result.baseline[kind]
    mean, std = baseline["mean"], baseline["std"]
    return head_matrices.pair_matrix(
        matrices[kind],
        rows,
        columns,
        COMPOSITION_TITLES[kind],
        f"{kind.upper()}-composition (a ratio of norms); white: random heads, {mean:.3f} ± {std:.3f} (hatched: "
        "±2 s.d.)",
        f"{result.model.get('name', '')}, from the weights alone",
        scale="composition",
        centre=mean,
        half_width=composition_half_width(result, matrices),
        band=(mean - 2 * std, mean + 2 * std),
        row_title="reading head B (layer.head)",
        column_title="writing head A (layer.head)",
    )
