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
from attnscope.output.documents import document
from attnscope.output.views import View, fitted, inputs_read, model_shape, shown_rows, summary
from attnscope.scores.catalog import counted

EDGE_MIN = 0.05  # |change| of a score (its own units: most are fractions of attention) for an edge of the graph
EDGES_PER_HEAD = 3  # each head's strongest dependencies drawn at most: its circuit, not every small effect
EDGES_MAX = 150  # edges drawn at most, the strongest: beyond, a graph of 144 heads is a smear
TERMINAL_HEADS = 24  # explained heads given a table in the terminal; the rest are in --json and --csv
SHOWN = 10  # dependencies per explained head the terminal and a notebook list without --top


class CircuitView(View):
    command = "circuit"
    columns = ("label", "on", "score", "with", "without", "change")

    def document(self, every: bool = False) -> dict:
        """The explained heads' dependencies (each head's --top largest by |change|, or all; by change, most
        negative first), the composition of every earlier head into them, and one record per head."""
        result = self.result
        return document(
            "circuit",
            result.model,
            result.inputs,
            result.settings,
            result.notes,
            dependencies=result.dependencies(None if every else result.top),
            composition=result.composition_records(),
            composition_baseline=result.baseline,
            heads=result.heads,
        )

    def records(self) -> list[dict]:
        """--csv's rows: each explained head's dependencies (B, A earlier), by change (its --top largest, or all)."""
        return self.result.dependencies(self.result.top)

    def full_document(self) -> dict:
        return self.document(every=True)

    def full_records(self) -> list[dict]:
        """circuit.csv: every dependency."""
        return self.result.dependencies()

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
        """(title, rows) per explained head, its `top` dependencies."""
        result = self.result
        by_head: dict[str, list[dict]] = {}
        for record in result.dependencies(shown_rows(result, SHOWN)):
            by_head.setdefault(record["label"], []).append(record)
        tables = []
        heads = {record["label"]: record for record in result.heads}
        for layer, head, score in result.explained[:TERMINAL_HEADS]:
            label = f"{layer}.{head}"
            record = heads[label]
            rows = [
                {
                    "on": dep["on"],
                    "role": heads[dep["on"]]["role"],
                    "without": dep["without"],
                    "change": dep["change"],
                }
                for dep in by_head.get(label, [])
            ]
            title = f"{label} ({record['role']}), {score} = {record['value']:.3f}"
            tables.append((title, rows))
        return tables

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
        shown: list[Any] = [
            f"{len(result.explained)} head{'s' if len(result.explained) != 1 else ''} explained by removing each "
            f"earlier head ({_how(result)}); the {shown_rows(result, SHOWN)} largest changes of each, "
            "most negative first"
        ]
        for title, rows in self._tables():
            shown.append(terminal.records_table(rows, title) if rows else f"{title}: no earlier head")
        if len(result.explained) > TERMINAL_HEADS:
            shown.append(f"… and {len(result.explained) - TERMINAL_HEADS} more heads: see --json, --csv or --out")
        line = self._weights_line()
        if line:
            shown.append(line)
        return shown

    def notebook(self) -> str:
        parts = [notebook.note_lines(self.notes)]
        for title, rows in self._tables():
            parts.append(notebook.records_table(rows, title))
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
        headline = (
            f"{model_shape(result.model)}; {counted(len(result.explained), 'head')} explained by {how}"
            f"{inputs_read(result.inputs)}"
        )
        strongest = sorted(result.dependencies(1), key=lambda record: (record["change"], record["label"]))
        needs = [f"{record['on']} → {record['label']} {record['change']:+.3f}" for record in strongest]
        lines = [fitted("removing A changes B: ", needs)]
        weights = self._weights_line()  # its parts one per line: the composition, the copying, the direct effect
        lines += weights.split("; ") if weights else []
        return summary(self, headline, lines, [".dependencies(top)", ".heads", ".explained"])


def _how(result: Any) -> str:
    """The method, and the ablation where one was recorded: `removal, mean ablation`."""
    ablation = result.settings.get("ablation")
    return result.settings["method"] + (f", {ablation} ablation" if ablation else "")


# -------------------------------------------------------------------------------------------------------------- figures


def _roles(result: Any) -> list[list[str]]:
    L, H = result.model["n_layer"], result.model["n_head"]
    roles = [["mixed"] * H for _ in range(L)]
    for record in result.heads:
        roles[record["layer"]][record["head"]] = record["role"]
    return roles


def _score_names(result: Any) -> str:
    names = sorted({score for _, _, score in result.explained})
    return names[0] if len(names) == 1 else "each head's deciding score"


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
    note = f"{len(edges):,} dependencies drawn (|change| ≥ {EDGE_MIN:g})" + (f"; {'; '.join(left)}" if left else "")
    return head_graph.head_graph(
        _roles(result),
        edges,
        "Circuit: which earlier heads each head's score depends on",
        f"change of {_score_names(result)} without head A",
        f"{figures.describe_input(result.model, result.inputs)}; ringed: the heads explained",
        note,
        marked=[(layer, head) for layer, head, _ in result.explained],
    )


def _pair_axes(result: Any) -> tuple[list[str], list[str], int]:
    rows = [f"{layer}.{head}" for layer, head, _ in result.explained]
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
    return head_matrices.pair_matrix(
        matrix,
        rows,
        columns,
        "How each head's score changes without an earlier head",
        f"change of {_score_names(result)} (its units)",
        figures.describe_input(result.model, result.inputs),
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


def composition_matrix(result: Any, kind: str) -> Any:
    """B × A: the `kind` ("q", "k", "v") composition score from the weights, from 0; the random baseline named."""
    from attnscope.output import head_matrices

    rows, columns, top = _pair_axes(result)
    H = result.model["n_head"]
    scores = getattr(result.composition, kind)  # (L, H, L, H) [A, B]
    matrix = np.full((len(rows), top * H), np.nan)
    for i, (layer, head, _) in enumerate(result.explained):
        matrix[i, : layer * H] = scores[:layer, :, layer, head].reshape(-1)
    baseline = result.baseline[kind]
    return head_matrices.pair_matrix(
        matrix,
        rows,
        columns,
        COMPOSITION_TITLES[kind],
        f"{kind.upper()}-composition score (random heads: {baseline['mean']:.3f} ± {baseline['std']:.3f})",
        f"{result.model.get('name', '')}, from the weights alone",
        vmax=None,
        row_title="reading head B (layer.head)",
        column_title="writing head A (layer.head)",
    )
