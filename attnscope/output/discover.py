"""`attnscope discover`, shown: every edge's score and rank (JSON, CSV, the terminal's table of the strongest), the
faithfulness curves with CPR and CMD, the circuit chosen with its edges and nodes; as pictures, the circuit as a graph
and the faithfulness curves.

Reads a DiscoverResult (analyses.discover) by duck typing: `model`, `inputs`, `settings`, `notes`, `pairs`, `graph`
(n_layer, n_head, n_kv_head, parallel, n_edges, n_upstream, upstream_names, input_targets), `scores`, `ranked()`,
`edge(index)`, `clean_logit_diff`, `corrupt_logit_diff`, `ablated_logit_diff`, `faithfulness`,
`faithfulness_signed`, `cpr`, `cmd`, `circuit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.output import notebook
from attnscope.output.documents import result_document
from attnscope.output.views import TopView, fitted, model_shape, shown_rows, summary
from attnscope.scores.catalog import counted

SHOWN = 20  # edges the terminal and a notebook list without --top
DRAWN = 150  # circuit edges drawn at most, the strongest: beyond, the graph is a smear
METRIC = "logit difference: logit(answer) − logit(wrong) at the last position, in logits (mean over the pairs)"
SCORE = (
    "estimated drop of the metric when the edge alone carries its ablated value (exact: measured), mean over "
    "the pairs, in logits"
)
FAITHFULNESS = "f = (m(C) − m(∅)) / (m(N) − m(∅)); CPR: area under f, edges by signed score; CMD: area of |1 − f|"


def edge_records(result: Any, indices: Sequence[int] | None = None) -> list[dict]:
    """One record per edge, from the largest |score| (rank 1): from, to, input, score, rank; `indices`: only those
    edges (in rank order)."""
    ranked = result.ranked()
    rank_of = np.empty(len(ranked), dtype=np.int64)
    rank_of[ranked] = np.arange(1, len(ranked) + 1)
    chosen = ranked if indices is None else sorted(indices, key=lambda index: rank_of[index])
    records = []
    for index in chosen:
        source, target, kind = result.edge(int(index))
        records.append(
            {
                "from": source,
                "to": target,
                "input": kind,
                "score": float(result.scores[index]),
                "rank": int(rank_of[index]),
            }
        )
    return records


def edge_label(record: dict) -> str:
    """`0.2→1.0(k)`, `mlp 0→logits`: an edge record in a few characters."""
    return f"{record['from']}→{record['to']}" + (f"({record['input']})" if record["input"] else "")


def circuit_nodes(result: Any) -> list[str]:
    """The nodes the circuit's edges touch, in the graph's order (the embeddings, each layer's heads, its key/value
    heads, its MLP, the logits)."""
    touched = set()
    for index in result.circuit["edges"]:
        source, target, _ = result.edge(int(index))
        touched.update((source, target))
    graph = result.graph
    order = [
        "embed",
        *(
            name
            for layer in range(graph.n_layer)
            for name in (
                *(f"{layer}.{head}" for head in range(graph.n_head)),
                *(f"{layer}.kv{kv}" for kv in range(graph.n_kv_head)),
                f"mlp {layer}",
            )
        ),
        "logits",
    ]
    return [name for name in order if name in touched]


def baselines(result: Any, brief: bool = False) -> str:
    """The metric's baselines in one line, with the tokens of a single pair."""
    pairs = result.pairs
    tokens = f" ({pairs[0]['answer']!r} − {pairs[0]['wrong']!r})" if len(pairs) == 1 else ""
    mean = "" if len(pairs) == 1 else f", mean over {counted(len(pairs), 'pair')}"
    numbers = (
        f"clean {result.clean_logit_diff:.3f}, corrupted {result.corrupt_logit_diff:.3f}, every edge ablated "
        f"{result.ablated_logit_diff:.3f}"
    )
    if brief:
        return f"logit difference{tokens}: {numbers}"
    return f"logit difference{tokens} at the last position{mean}: {numbers}"


def circuit_line(result: Any) -> str:
    """The circuit chosen, in one line."""
    circuit, graph = result.circuit, result.graph
    return (
        f"circuit: {counted(len(circuit['edges']), 'edge')} of {graph.n_edges:,} ({circuit['percent']:g} % budget), "
        f"f = {circuit['f']:.3f} (target {result.settings['target']:g}), {counted(len(circuit_nodes(result)), 'node')}"
    )


NODES_SHOWN = 40  # the circuit's nodes listed on the terminal and in a notebook; every one is in --json


def nodes_line(result: Any) -> str:
    """`nodes: embed, 0.2, mlp 0, … and 12 more`: the circuit's nodes, the first NODES_SHOWN."""
    nodes = circuit_nodes(result)
    more = f", … and {len(nodes) - NODES_SHOWN:,} more (--json lists every one)" if len(nodes) > NODES_SHOWN else ""
    return "nodes: " + ", ".join(nodes[:NODES_SHOWN]) + more


class DiscoverView(TopView):
    command = "discover"
    columns = ("rank", "from", "to", "input", "score", "in_circuit")

    def document(self, every: bool = False) -> dict:
        """The method, the baselines, the graph's size, every pair, the edges (the first --top, or all) by rank, the
        faithfulness curves, CPR and CMD, and the circuit with its edges and nodes."""
        result = self.result
        graph = result.graph
        top = None if every else result.settings["top"]
        return result_document(
            "discover",
            result,
            metric=METRIC,
            score=SCORE,
            method=result.settings["method"],
            steps=result.settings["steps"],
            ablation=result.settings["ablation"],
            clean_logit_diff=result.clean_logit_diff,
            corrupt_logit_diff=result.corrupt_logit_diff,
            ablated_logit_diff=result.ablated_logit_diff,
            graph={
                "n_nodes": graph.n_upstream + 1,
                "n_edges": graph.n_edges,
                "grouped": graph.grouped,
                "parallel": graph.parallel,
            },
            pairs=result.pairs,
            edges=edge_records(result)[:top],
            faithfulness=result.faithfulness,
            faithfulness_signed=result.faithfulness_signed,
            cpr=result.cpr,
            cmd=result.cmd,
            circuit={
                "percent": result.circuit["percent"],
                "f": result.circuit["f"],
                "target": result.settings["target"],
                "edges": edge_records(result, result.circuit["edges"]),
                "nodes": circuit_nodes(result),
            },
        )

    def rows(self, every: bool) -> list[dict]:
        """--csv's rows: the edges by rank (the first --top, or all), each with whether the circuit holds it."""
        result = self.result
        inside = {int(index) for index in result.circuit["edges"]}
        rows = [
            {
                "rank": row["rank"],
                **{key: row[key] for key in ("from", "to", "input", "score")},
                "in_circuit": index in inside,
            }
            for index, row in zip(result.ranked().tolist(), edge_records(result), strict=True)
        ]
        return rows if every else rows[: result.settings["top"]]

    def figures(self) -> dict[str, Any]:
        """circuit (the graph of the circuit's edges) and faithfulness (f against the budget, both rankings)."""
        return {"circuit": circuit_graph(self.result), "faithfulness": faithfulness_curves(self.result)}

    def _shown(self) -> list[dict]:
        return edge_records(self.result)[: shown_rows(self.result, SHOWN)]

    def _curve_rows(self) -> list[dict]:
        """The terminal's and notebook's faithfulness table: percent, edges (kept after pruning), f both ways."""
        return [
            {
                "budget %": f"{row['percent']:g}",
                "edges": row["edges"],
                "kept": row["kept"],
                "f (|score|)": row["f"],
                "f (signed)": signed["f"],
            }
            for row, signed in zip(self.result.faithfulness, self.result.faithfulness_signed, strict=True)
        ]

    def _areas(self) -> str:
        return f"CPR {self.result.cpr:.3f} (higher is better), CMD {self.result.cmd:.3f} (lower is better)"

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result = self.result
        return [
            baselines(result),
            terminal.records_table(self._shown(), f"Edges with the largest |score| ({result.settings['method']})"),
            terminal.records_table(self._curve_rows(), "Faithfulness of the circuits of the top edges"),
            self._areas(),
            circuit_line(result),
            nodes_line(result),
        ]

    def notebook(self) -> str:
        result = self.result
        return notebook.fragment(
            notebook.note_lines(self.notes),
            notebook.paragraph(baselines(result)),
            notebook.records_table(self._shown(), f"Edges with the largest |score| ({result.settings['method']})"),
            notebook.records_table(self._curve_rows(), "Faithfulness of the circuits of the top edges"),
            notebook.paragraph(self._areas()),
            notebook.paragraph(circuit_line(result) + "; " + nodes_line(result)),
        )

    def summary(self) -> str:
        """The model and the pairs, the baselines, the strongest edges, the circuit."""
        result = self.result
        headline = f"{model_shape(result.model)}; {counted(len(result.pairs), 'pair')}, {result.settings['method']}"
        strongest = [f"{edge_label(row)} {row['score']:.2f}" for row in edge_records(result)[:12]]
        lines = [baselines(result, brief=True), fitted("strongest edges: ", strongest), circuit_line(result)]
        return summary(self, headline, lines, [".ranked()", ".scores", ".faithfulness", ".circuit"])


# -------------------------------------------------------------------------------------------------------------- figures


def circuit_graph(result: Any) -> Any:
    """The circuit's edges as a graph (output.edge_graph), the DRAWN strongest where there are more."""
    from attnscope.output.edge_graph import edge_graph

    graph, circuit = result.graph, result.circuit
    chosen = sorted(circuit["edges"], key=lambda index: -abs(result.scores[index]))
    drawn = [(*result.edge(int(index)), float(result.scores[index])) for index in chosen[:DRAWN]]
    left = len(chosen) - len(drawn)
    note = f"{counted(left, 'weaker edge')} of the circuit not drawn (every edge is in discover.json)" if left else ""
    title = f"The circuit: {counted(len(chosen), 'edge')}, faithfulness {circuit['f']:.2f}"
    subtitle = (
        f"{result.model.get('name', '')}, {counted(len(result.pairs), 'pair')}; {result.settings['method']}, "
        f"{result.settings['ablation']} ablation; top {circuit['percent']:g} % of {graph.n_edges:,} edges by |score|"
    )
    return edge_graph(graph.n_layer, graph.n_head, graph.n_kv_head, drawn, title, subtitle, note)


def faithfulness_curves(result: Any) -> Any:
    """f against the circuit's size (% of the edges, log scale), edges ranked by |score| and by signed score; the
    target and f = 1 as lines, the circuit chosen ringed."""
    from attnscope.output.line_plots import line_plot

    x = [
        int(row["percent"]) if row["percent"] == int(row["percent"]) else row["percent"] for row in result.faithfulness
    ]
    series = {
        f"by |score| (CMD {result.cmd:.3f})": [row["f"] for row in result.faithfulness],
        f"by signed score (CPR {result.cpr:.3f})": [row["f"] for row in result.faithfulness_signed],
    }
    highest = max(1.0, *(value for values in series.values() for value in values if np.isfinite(value)))
    subtitle = (
        f"{result.model.get('name', '')}, {counted(len(result.pairs), 'pair')}; {result.settings['method']}, "
        f"{result.settings['ablation']} ablation; {result.graph.n_edges:,} edges"
    )
    figure = line_plot(
        x, series, "circuit size: top % of the edges (log scale)", "faithfulness f (1: the whole model)",
        "Faithfulness of the circuits of the top edges", subtitle, log_x=True, y_top=highest * 1.1,
        styles={name: {"linestyle": "--"} for name in list(series)[1:]},
    )  # fmt: skip
    axes = figure.axes[0]
    axes.axhline(1.0, color="#888888", linewidth=0.8, linestyle=":")
    target = result.settings["target"]
    axes.axhline(target, color="#444444", linewidth=0.8, linestyle="--")
    axes.text(x[0], target, f" target {target:g}", va="bottom", ha="left", fontsize=7, color="#444444")
    axes.scatter([result.circuit["percent"]], [result.circuit["f"]], s=160, facecolors="none", edgecolors="black",
                 linewidths=1.2, zorder=5)  # fmt: skip
    return figure
