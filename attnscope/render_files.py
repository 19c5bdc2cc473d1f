"""Files for `--out`: tables and pictures, each written atomically. Renders what the library computed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnscope import export, plots
from attnscope.roles import SHORT_NAMES, roles_for

# score -> colour range of its layer × head heatmap (None: from the data)
HEATMAP_SCORES = {
    "previous_token": (0.0, 1.0),
    "first_token": (0.0, 1.0),
    "self": (0.0, 1.0),
    "next_token": (0.0, 1.0),
    "last_token": (0.0, 1.0),
    "induction": (0.0, 1.0),
    "duplicate_token": (0.0, 1.0),
    "local": (0.0, 1.0),
    "local_lift": (None, None),
    "entropy": (None, None),
    "entropy_normalized": (0.0, 1.0),
    "confidence": (0.0, 1.0),
}


def score_matrix(heads: Sequence[Any], name: str, n_layer: int, n_head: int) -> np.ndarray:
    matrix = np.full((n_layer, n_head), np.nan)
    for record in heads:
        matrix[record.layer, record.head] = record.scores[name]
    return matrix


def role_map_file(heads: Sequence[Any], name: str, n_layer: int, n_head: int, path: Path) -> Path:
    """The layer × head map of roles, each cell labelled with the score that decided its role (named in a mixed
    head's cell, where it is only the closest to its threshold)."""
    roles = [[None] * n_head for _ in range(n_layer)]
    deciding = [[""] * n_head for _ in range(n_layer)]
    for record in heads:
        role = record.role
        roles[record.layer][record.head] = role.role
        named = f"{SHORT_NAMES[role.metric]} " if role.role == "mixed" else ""
        deciding[record.layer][record.head] = f"{named}{role.score:.2f}"
    legend = roles_for(heads[0].scores.get("next_token") is not None)
    return plots.role_map(roles, deciding, name, path, legend)


def heads_files(result: Any, plotted: Sequence[tuple[int, int]], folder: Path, settings: dict) -> list[Path]:
    """heads.json, heads.csv, role_map.png, score_<name>.png and attention_<L.H>.png for each plotted head."""
    n_layer, n_head = result.model["n_layer"], result.model["n_head"]
    name = result.model["name"]
    every_head = {**settings, "layer": None, "sort": None, "top": None}  # the files hold every head, unfiltered
    written = [
        export.write_atomic(folder / "heads.json", export.to_json(export.heads_document(result, result.heads, every_head))),
        export.write_atomic(folder / "heads.csv", export.to_csv(export.head_records(result.heads))),
    ]
    written.append(role_map_file(result.heads, name, n_layer, n_head, folder / "role_map.png"))
    for score, (low, high) in HEATMAP_SCORES.items():
        if result.heads[0].scores[score] is None:  # not measured: the probe's without it, next/last for a decoder
            continue
        title = f"{score} per head: {name}"
        matrix = score_matrix(result.heads, score, n_layer, n_head)
        written.append(plots.score_heatmap(matrix, title, folder / f"score_{score}.png", low, high))
    for layer, head in plotted:
        attention = result.attention[layer]
        title = f"Head {layer}.{head}: {name} (text {attention.text_index})"
        path = folder / f"attention_{layer}.{head}.png"
        written.append(plots.attention_heatmap(attention.maps[head].numpy(), attention.tokens, title, path))
    return written


def show_file(attention: Any, head: int | None, folder: Path, model_name: str) -> Path:
    """attention_L<layer>.png (every head of the layer) or attention_<L.H>.png (one head, larger)."""
    if head is None:
        return plots.layer_grid(attention.maps.numpy(), attention.tokens, attention.layer, folder / f"attention_L{attention.layer}.png")
    title = f"Head {attention.layer}.{head}: {model_name}"
    path = folder / f"attention_{attention.layer}.{head}.png"
    return plots.attention_heatmap(attention.maps[head].numpy(), attention.tokens, title, path)


def diversity_files(result: Any, folder: Path, doc: dict) -> list[Path]:
    """diversity.json, diversity_pairs.csv, js_matrix.png, cosine_matrix.png and, for all layers,
    layer_diversity.png. Matrices of all heads are drawn in linkage order (similar heads together)."""
    order = result.order if result.layer is None else list(range(len(result.labels)))
    labels = [result.labels[k] for k in order]
    name = result.model["name"]
    scope = "all heads" if result.layer is None else f"layer {result.layer}"
    written = [
        export.write_atomic(folder / "diversity.json", export.to_json(doc)),
        export.write_atomic(folder / "diversity_pairs.csv", export.to_csv(result.pairs())),
        plots.head_matrix(
            result.js[np.ix_(order, order)], labels, f"JS divergence (bits), {scope}: {name}",
            folder / "js_matrix.png", 0.0, 1.0, "viridis_r",
        ),
        plots.head_matrix(
            result.cosine[np.ix_(order, order)], labels, f"Cosine similarity, {scope}: {name}",
            folder / "cosine_matrix.png", 0.0, 1.0, "viridis",
        ),
    ]
    if result.layer is None:
        layers = sorted(result.layer_scores)
        written.append(
            plots.line_plot(
                layers, {"mean pairwise JSD": [result.layer_scores[layer] for layer in layers]}, "layer",
                "mean JS divergence between heads (bits)", f"Head diversity per layer: {name}",
                folder / "layer_diversity.png",
            )
        )
    return written


def random_mha_file(rows: list[dict], folder: Path, d_model: int) -> Path:
    heads = [row["heads"] for row in rows]
    series = {name: [row[name] for row in rows] for name in ("js", "js_distance", "cosine", "entropy_normalized")}
    return plots.line_plot(
        heads, series, "heads", "value", f"Random multi-head attention, d_model {d_model}",
        folder / "random_mha.png", log_x=True,
    )


def bench_file(rows: list[dict], folder: Path, model_name: str, machine: dict) -> Path:
    """tokens_per_s.png: tokens per second against sequence length, one line per method and batch size: a colour
    per method, a line style per batch size."""
    seqs = sorted({row["seq"] for row in rows})
    colours = {method: f"C{index}" for index, method in enumerate(dict.fromkeys(row["method"] for row in rows))}
    dashes = ("-", "--", ":", "-.")
    batches = sorted({row["batch"] for row in rows})
    line_styles = {batch: dashes[index % len(dashes)] for index, batch in enumerate(batches)}
    series, styles = {}, {}
    for row in rows:
        label = f"{row['method']}, batch {row['batch']}"
        series.setdefault(label, {})[row["seq"]] = row["tokens_per_s"]
        styles[label] = {"color": colours[row["method"]], "linestyle": line_styles[row["batch"]]}
    lines = {label: [values.get(seq) for seq in seqs] for label, values in series.items()}
    where = machine["device_name"] if machine["device"] != "cpu" else f"CPU, {machine['cpu_threads']} threads"
    return plots.line_plot(
        seqs, lines, "sequence length (tokens)", "tokens per second", f"{model_name} on {where}",
        folder / "tokens_per_s.png", log_x=True, styles=styles,
    )


def attend_files(result: Any, doc: dict, records: list[dict], folder: Path) -> list[Path]:
    """attend.json, attend.csv and attend.png: a layer × head heatmap of the weight on the target, or, without one,
    of each head's largest weight with the token it falls on written in the cell."""
    source = result.tokens[result.from_position]
    name = result.model["name"]
    if result.to_weight is not None:
        matrix, cells = result.to_weight, None
        title = f"Attention from {source!r}@{result.from_position} to {result.to_token!r}: {name}"
    else:
        n_layer, n_head = result.rows.shape[:2]
        matrix = result.rows.max(axis=-1)
        cells = [
            [f"{result.tokens[result.top_keys(layer, head, 1)[0][0]][:8]}\n{matrix[layer, head]:.2f}" for head in range(n_head)]
            for layer in range(n_layer)
        ]
        title = f"Where {source!r}@{result.from_position} looks (top token per head): {name}"
    return [
        export.write_atomic(folder / "attend.json", export.to_json(doc)),
        export.write_atomic(folder / "attend.csv", export.to_csv(records)),
        plots.score_heatmap(matrix, title, folder / "attend.png", 0.0, 1.0, cell_text=cells),
    ]


def ablate_files(result: Any, doc: dict, records: list[dict], folder: Path) -> list[Path]:
    """ablate.json, ablate.csv, importance.png (layer × head) and, with --prune, prune.png (loss against heads
    removed)."""
    name = result.model["name"]
    unit = "loss increase, nats" if result.method == "loss" else "|dL/d gate|"
    written = [
        export.write_atomic(folder / "ablate.json", export.to_json(doc)),
        export.write_atomic(folder / "ablate.csv", export.to_csv(records)),
        plots.score_heatmap(result.importance, f"Head importance ({unit}): {name}", folder / "importance.png", None, None),
    ]
    if result.prune:
        removed = [0] + [step["removed"] for step in result.prune]
        losses = [result.baseline_loss] + [step["loss"] for step in result.prune]
        written.append(
            plots.line_plot(removed, {"loss": losses}, "heads removed (least important first)", "loss (nats/token)",
                            f"Pruning heads: {name}", folder / "prune.png")
        )
    return written
