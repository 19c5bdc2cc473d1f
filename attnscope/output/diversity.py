"""`attnscope diversity`, shown: the JSON of the matrices and ranked pairs, the CSV of every pair, the pictures (the JS
and cosine matrices in clustered order under the dendrogram, the mean JSD per layer), the terminal's and notebook's
tables.

Reads a DiversityResult (analyses.diversity) by duck typing: `model`, `inputs`, `settings`, `notes`, `layer`,
`labels`, `cosine`, `js`, `js_distance`, `js_se`, `js_distance_se` (K × K), `layer_scores`, `groups`, `order`,
`clusters`, `linkage`, `redundant`, `cluster_at`, `pairs()`, `pair_columns()`, `ranked_pairs(most_similar)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import result_document, to_csv, to_json
from attnscope.output.views import View, fitted, inputs_read, shown_rows, summary

SHOWN = 5  # the most redundant and the most distinct pairs the terminal and a notebook list without --top


def diversity_document(result: Any, every: bool = False) -> dict:
    """The `diversity` JSON: layer scores, ranked pairs (the first --top of each list, or `every` pair), groups,
    clusters and the full matrices."""
    k = len(result.labels) ** 2 if every else None
    return result_document(
        "diversity",
        result,
        layer_scores={str(layer): score for layer, score in result.layer_scores.items()},
        most_redundant=result.ranked_pairs(most_similar=True, k=k),
        most_distinct=result.ranked_pairs(most_similar=False, k=k),
        redundant_groups=result.groups,
        clusters=result.clusters,
        labels=result.labels,
        order=[result.labels[i] for i in result.order],
        matrices={
            name: getattr(result, name).tolist()
            for name in ("cosine", "js", "js_distance", "js_se", "js_distance_se")
            if getattr(result, name) is not None  # standard errors only when rows were sampled
        },
    )


class DiversityView(View):
    command = "diversity"

    def document(self) -> dict:
        return diversity_document(self.result)

    def full_document(self) -> dict:
        return diversity_document(self.result, every=True)

    def records(self) -> list[dict]:
        return self.result.pairs()

    @property
    def columns(self) -> list[str]:
        return self.result.pair_columns()

    def data_files(self, stage: Path) -> list[Path]:
        return [
            self.write(stage, "diversity.json", to_json(self.full_document())),
            self.write(stage, "diversity_pairs.csv", to_csv(self.records(), self.columns)),
        ]

    def figures(self) -> dict[str, Any]:
        """js_matrix and cosine_matrix (all heads: clustered, under the dendrogram) and, for all layers,
        layer_diversity."""
        result = self.result
        drawn = {"js_matrix": diversity_matrix(result, "js"), "cosine_matrix": diversity_matrix(result, "cosine")}
        if result.layer is None:
            drawn["layer_diversity"] = diversity_per_layer(result)
        return drawn

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        result = self.result
        scope = "all heads" if result.layer is None else f"layer {result.layer}"
        shown = [layer_scores_table(result.layer_scores, f"Head diversity: {result.model['name']}, {scope}")]
        if result.layer is not None and len(result.labels) <= 16:
            shown.append(matrix_table(result.js, result.labels, "JS divergence between heads (bits)"))
        shown.append(
            pairs_table(result.ranked_pairs(True, shown_rows(result, SHOWN)), "Most redundant pairs (lowest JSD)")
        )
        shown.append(
            pairs_table(result.ranked_pairs(False, shown_rows(result, SHOWN)), "Most distinct pairs (highest JSD)")
        )
        groups = "; ".join(", ".join(group) for group in result.groups) or "none"
        shown.append(f"Near-duplicate groups (JSD < {result.redundant} bits): {groups}")
        if result.layer is None:
            clusters = "; ".join(", ".join(group) for group in result.clusters) or "none"
            shown.append(f"Clusters (average linkage below {result.cluster_at} bits): {clusters}")
        return shown

    def notebook(self) -> str:
        result = self.result
        scope = "all heads" if result.layer is None else f"layer {result.layer}"
        layer_rows = [
            [notebook.cell(str(layer)), notebook.cell(notebook.number(score))]
            for layer, score in result.layer_scores.items()
        ]
        parts = [
            notebook.note_lines(self.notes),
            notebook.table(
                ["layer", "mean pairwise JSD (bits)"], layer_rows, f"Head diversity: {result.model['name']}, {scope}"
            ),
        ]
        if result.layer is not None and len(result.labels) <= 16:
            matrix = [
                [None if i == j else result.js[i][j] for j in range(len(result.labels))]
                for i in range(len(result.labels))
            ]
            parts.append(
                notebook.grid(matrix, result.labels, result.labels, "JS divergence between heads (bits)", "head")
            )
        parts.append(
            pairs_table_html(result.ranked_pairs(True, shown_rows(result, SHOWN)), "Most redundant pairs (lowest JSD)")
        )
        parts.append(
            pairs_table_html(result.ranked_pairs(False, shown_rows(result, SHOWN)), "Most distinct pairs (highest JSD)")
        )
        groups = "; ".join(", ".join(group) for group in result.groups) or "none"
        parts.append(notebook.paragraph(f"Near-duplicate groups (JSD < {result.redundant} bits): {groups}"))
        if result.layer is None:
            clusters = "; ".join(", ".join(group) for group in result.clusters) or "none"
            parts.append(notebook.paragraph(f"Clusters (average linkage below {result.cluster_at} bits): {clusters}"))
        return notebook.fragment(*parts)

    def summary(self) -> str:
        """The heads compared, the mean JSD of each layer, the most redundant and most distinct pairs (as the
        terminal's tables, `a ~ b`), the near-duplicate groups and, for all layers, the clusters."""
        result = self.result
        count = len(result.labels)
        scope = f"all {count} heads" if result.layer is None else f"the {count} heads of layer {result.layer}"
        headline = f"{result.model.get('name')}: {scope}{inputs_read(result.inputs)}"

        def pairs(most_similar: bool) -> list[str]:
            return [f"{pair['a']} ~ {pair['b']} {pair['js']:.3f}" for pair in result.ranked_pairs(most_similar)]

        layers = [f"{layer} {score:.3f}" for layer, score in result.layer_scores.items()]
        duplicates = f"near-duplicates (JSD < {result.redundant:g}): "
        lines = [
            fitted("mean JSD of a pair of heads (bits), by layer: ", layers),
            fitted("most redundant (JSD bits): ", pairs(True)),
            fitted("most distinct: ", pairs(False)),
            fitted(duplicates, [", ".join(group) for group in result.groups], "; ") or duplicates + "none",
        ]
        if result.layer is None:
            clusters = [", ".join(group) for group in result.clusters]
            lines.append(fitted(f"clusters (below {result.cluster_at:g} bits): ", clusters, "; ") or "clusters: none")
        return summary(self, headline, lines, [".pairs()", ".ranked_pairs(most_similar)", ".labels", ".js"])


# -------------------------------------------------------------------------------------------------------------- figures


def diversity_matrix(result: Any, name: str) -> Any:
    """The `js` or `cosine` matrix of a DiversityResult: for all layers, in clustered order under the dendrogram of
    the average linkage of JS; for one layer, in head order."""
    import numpy as np

    from attnscope.output import figures, head_matrices

    clustered = result.layer is None
    order = result.order if clustered else list(range(len(result.labels)))
    labels = [result.labels[k] for k in order]
    matrix = getattr(result, name)[np.ix_(order, order)]
    scope = "all heads" if clustered else f"the heads of layer {result.layer}"
    what = {
        "js": ("Jensen–Shannon divergence between", "JS divergence (bits): 0 same, 1 disjoint"),
        "cosine": ("Cosine similarity between", "cosine similarity of the attention rows: 1 same, 0 nothing shared"),
    }[name]
    title = f"{what[0]} {scope}" + (", in clustered order" if clustered else "")
    linkage = getattr(result, "linkage", None) if clustered else None
    return head_matrices.head_matrix(
        matrix,
        labels,
        title,
        what[1],
        figures.describe_input(result.model, result.inputs),
        0.0,
        1.0,
        name,  # the scale of output.scales: dark = similar, for both measures
        linkage=linkage,
        cut=result.cluster_at if linkage is not None else None,
        linkage_label="JSD (bits),\naverage linkage",
    )


def diversity_per_layer(result: Any) -> Any:
    """The mean pairwise JSD of every layer's heads, a line over the layers (a DiversityResult of all layers), on
    an axis from 0."""
    from attnscope.output import figures, line_plots

    layers = sorted(result.layer_scores)
    return line_plots.line_plot(
        layers,
        {"mean pairwise JSD": [result.layer_scores[layer] for layer in layers]},
        "layer",
        "mean JS divergence between the layer's heads (bits)",
        "Head diversity per layer",
        figures.describe_input(result.model, result.inputs),
    )


# ------------------------------------------------------------------------------------------------------------- terminal


def pairs_table(pairs: Sequence[dict], title: str) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for header in ("heads", "JSD bits", "JS distance", "cosine"):
        table.add_column(header, justify="right")
    for pair in pairs:
        table.add_row(
            f"{pair['a']} ~ {pair['b']}", f"{pair['js']:.3f}", f"{pair['js_distance']:.3f}", f"{pair['cosine']:.3f}"
        )
    return table


def matrix_table(matrix: Any, labels: Sequence[str], title: str) -> Any:
    """A small square matrix (one layer's heads) as a table, two decimals."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    table.add_column("", justify="right", style="bold")
    short = [label.split(".")[-1] for label in labels]
    for name in short:
        table.add_column(name, justify="right")
    for i, label in enumerate(labels):
        table.add_row(label, *("" if i == j else f"{matrix[i][j]:.2f}" for j in range(len(labels))))
    return table


def layer_scores_table(scores: dict, title: str) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("layer", justify="right")
    table.add_column("mean pairwise JSD (bits)", justify="right")
    for layer, score in scores.items():
        table.add_row(str(layer), f"{score:.3f}")
    return table


# ------------------------------------------------------------------------------------------------------------- notebook


def pairs_table_html(pairs: Sequence[dict], title: str) -> str:
    errors = bool(pairs) and "js_se" in pairs[0]
    headers = ["heads", "JSD bits", "JS distance", "cosine", *(["JSD s.e."] if errors else [])]
    rows = [
        [
            notebook.cell(f"{pair['a']} ~ {pair['b']}"),
            *(notebook.cell(notebook.number(pair[key])) for key in ("js", "js_distance", "cosine")),
            *([notebook.cell(notebook.number(pair["js_se"]))] if errors else []),
        ]
        for pair in pairs
    ]
    return notebook.table(headers, rows, title)
