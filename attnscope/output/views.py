"""What each command shows, from its analysis result: one view per result type, each with the same four faces.

    document()       the JSON document (`--json`, and the .json file of `--out`)
    records()        the CSV rows (`--csv`, and the .csv file of `--out`)
    files(stage)     the files of `--out`, written into `stage` (see output.files.write_all); returns their paths
    terminal(paths)  rich renderables for the terminal (`paths`: the files just written, for commands that say where)

`view_of(result)` picks the view. Views render what the analyses computed and compute nothing themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.analyses.ablate import AblationResult
from attnscope.analyses.attend import AttendResult
from attnscope.analyses.bench import BenchResult
from attnscope.analyses.diversity import DiversityResult
from attnscope.analyses.heads import HeadRecord, HeadsResult
from attnscope.analyses.info import InfoResult
from attnscope.analyses.maps import ShowResult
from attnscope.analyses.random_mha import RandomMhaResult
from attnscope.analyses.report import ReportResult
from attnscope.output.documents import document, to_csv, to_json
from attnscope.output.files import write_atomic
from attnscope.pipeline.tokens import CONTINUED_LEGEND


class View:
    """The default faces: a view overrides what its command has."""

    command = ""
    names_files = False  # True: the terminal face is the paths of the files written (commands whose output they are)
    columns: Sequence[str] = ()  # the CSV's header when there are no records (where records can be none)

    def __init__(self, result: Any):
        self.result = result

    @property
    def notes(self) -> list[str]:
        return list(self.result.notes)

    def document(self) -> dict:
        raise NotImplementedError

    def records(self) -> list[dict]:
        raise NotImplementedError

    def files(self, stage: Path) -> list[Path]:
        return [
            write_atomic(stage / f"{self.command}.json", to_json(self.document())),
            write_atomic(stage / f"{self.command}.csv", to_csv(self.records(), self.columns)),
        ]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        raise NotImplementedError


def _picture_paths(written: Sequence[Path]) -> list[Any]:
    """The terminal output of a command whose output is its files: their paths, one per line."""
    return [str(path) for path in written]


# --------------------------------------------------------------------------------------------------------- heads


def head_records(heads: Sequence[HeadRecord], model: dict) -> list[dict]:
    """One flat record per head (the `heads` list of the JSON and the rows of the CSV): which key/value head it
    reads (grouped-query attention), its role, and every score of the catalog, null where it was not measured."""
    group = model["n_head"] // model.get("n_kv_head", model["n_head"])  # query heads per key/value head
    return [
        {
            "layer": record.layer,
            "head": record.head,
            "label": record.label,
            "kv_head": record.head // group,
            "role": record.role.role,
            "role_metric": record.role.metric,
            "role_score": record.role.score,
            **record.scores,
        }
        for record in heads
    ]


def heads_document(result: HeadsResult, heads: Sequence[HeadRecord] | None = None) -> dict:
    """The `heads` JSON: metadata, thresholds and one record per head (`heads`: the run's selection when None,
    every head with the selection set to null when given all of them)."""
    selected = result.selected if heads is None else heads
    settings = result.settings if heads is None else {**result.settings, "layer": None, "sort": None, "top": None}
    return document(
        "heads", result.model, result.inputs, settings, result.notes, heads=head_records(selected, result.model)
    )


class HeadsView(View):
    command = "heads"

    def document(self) -> dict:
        return heads_document(self.result)

    def records(self) -> list[dict]:
        return head_records(self.result.selected, self.result.model)

    def files(self, stage: Path) -> list[Path]:
        """heads.json and heads.csv (every head, whatever the selection), role_map.png, score_<name>.png and
        attention_<L.H>.png for each plotted head."""
        from attnscope.output import figures

        result = self.result
        written = [
            write_atomic(stage / "heads.json", to_json(heads_document(result, result.heads))),
            write_atomic(stage / "heads.csv", to_csv(head_records(result.heads, result.model))),
            figures.heads_role_map(result, stage / "role_map.png"),
            *figures.heads_score_heatmaps(result, stage).values(),
        ]
        for layer, head in result.plotted:
            attention = result.attention[layer]
            title = f"Head {layer}.{head}: {result.model['name']} (text {attention.text_index})"
            written.append(map_picture(attention, head, title, stage / f"attention_{layer}.{head}.png"))
        return written

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result, model = self.result, self.result.model
        title = f"Head roles: {model['name']}  ({result.inputs['n_texts']} texts, {result.inputs['n_tokens']} tokens)"
        return [
            terminal.role_map(result.heads, model["n_layer"], model["n_head"], title, result.kind.name),
            terminal.heads_table(result.selected, "Heads", result.kind.name, result.selection.get("sort")),
        ]


# ---------------------------------------------------------------------------------------------------------- show


def words_field(labels: Any) -> list[dict]:
    """The words of a window for the JSON: each word's text as shown and its token positions."""
    return [{"text": text, "positions": list(word)} for text, word in zip(labels.word_text, labels.words, strict=True)]


WORDS_LEGEND = "words: mean of token rows, sum of columns"


def map_legend(attention: Any) -> str:
    """What a map picture's labels need said: how words are made (words view), or what `##` marks (tokens view,
    when some word has several tokens); empty when nothing needs saying."""
    if attention.view == "words":
        return WORDS_LEGEND
    return CONTINUED_LEGEND if attention.labels.continued else ""


def map_picture(attention: Any, head: int | None, title: str, path: Path) -> Path:
    """One head's map (`head`), or every head of the layer (None), in the map's view, with its legend."""
    from attnscope.output import figures

    maps, labels = attention.shown(head)
    legend = map_legend(attention)
    if head is None:
        return figures.layer_grid(maps, labels, attention.layer, path, subtitle=legend)
    return figures.attention_heatmap(maps, labels, f"{title}\n{legend}" if legend else title, path)


class ShowView(View):
    command = "show"
    names_files = True

    def document(self) -> dict:
        """The window's tokens (exact text, and labels as pictures show them), the view, and the maps: `maps` token
        by token always, and in the words view `words` (each word's token positions) and `word_maps`."""
        result, attention = self.result, self.result.attention
        chosen = slice(None) if result.head is None else slice(result.head, result.head + 1)
        heads = list(range(attention.maps.shape[0])) if result.head is None else [result.head]
        words = {}
        if attention.view == "words":
            words = {"words": words_field(attention.labels), "word_maps": attention.word_maps[chosen].tolist()}
        return document(
            "show",
            result.model,
            {
                "index": result.index,
                "tokens": attention.tokens,
                "n_tokens": len(attention.tokens),
                "labels": attention.labels.shown,
            },
            {
                "layer": attention.layer,
                "head": result.head,
                "index": result.index,
                "bos": result.bos,
                "words": attention.view == "words",
            },
            result.notes,
            view=attention.view,
            heads=heads,
            maps=attention.maps[chosen].tolist(),
            **words,
        )

    def records(self) -> list[dict]:
        """One row per (head, query, key) the query sees (a decoder's keys after the query are left out): tokens, or
        in the words view words (query and key are word indices, `query_word`/`key_word` their text)."""
        result, attention = self.result, self.result.attention
        heads = range(attention.maps.shape[0]) if result.head is None else [result.head]
        causal = result.model["kind"] == "decoder"
        maps, labels = attention.shown()
        kind = "word" if attention.view == "words" else "token"
        n = len(labels)
        return [
            {
                "layer": attention.layer,
                "head": head,
                "query": i,
                "key": j,
                f"query_{kind}": labels[i] if kind == "word" else attention.tokens[i],
                f"key_{kind}": labels[j] if kind == "word" else attention.tokens[j],
                "weight": float(maps[head, i, j]),
            }
            for head in heads
            for i in range(n)
            for j in range(i + 1 if causal else n)
        ]

    def files(self, stage: Path) -> list[Path]:
        """attention_L<layer>.png (every head of the layer) or attention_<L.H>.png (one head, larger); by word in
        the words view."""
        result, attention = self.result, self.result.attention
        if result.head is None:
            return [map_picture(attention, None, "", stage / f"attention_L{attention.layer}.png")]
        title = f"Head {attention.layer}.{result.head}: {result.model['name']}"
        return [map_picture(attention, result.head, title, stage / f"attention_{attention.layer}.{result.head}.png")]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        return _picture_paths(written)


# ----------------------------------------------------------------------------------------------------- diversity


def diversity_document(result: DiversityResult) -> dict:
    """The `diversity` JSON: layer scores, ranked pairs, groups, clusters and the full matrices."""
    return document(
        "diversity",
        result.model,
        result.inputs,
        result.settings,
        result.notes,
        layer_scores={str(layer): score for layer, score in result.layer_scores.items()},
        most_redundant=result.ranked_pairs(most_similar=True),
        most_distinct=result.ranked_pairs(most_similar=False),
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

    def records(self) -> list[dict]:
        return self.result.pairs()

    @property
    def columns(self) -> list[str]:
        return self.result.pair_columns()

    def files(self, stage: Path) -> list[Path]:
        """diversity.json, diversity_pairs.csv, js_matrix.png, cosine_matrix.png and, for all layers,
        layer_diversity.png. Matrices of all heads are drawn in linkage order (similar heads together)."""
        from attnscope.output import figures

        result = self.result
        order = result.order if result.layer is None else list(range(len(result.labels)))
        labels = [result.labels[k] for k in order]
        name = result.model["name"]
        scope = "all heads" if result.layer is None else f"layer {result.layer}"
        written = [
            write_atomic(stage / "diversity.json", to_json(self.document())),
            write_atomic(stage / "diversity_pairs.csv", to_csv(self.records(), self.columns)),
            figures.head_matrix(
                result.js[np.ix_(order, order)],
                labels,
                f"JS divergence (bits), {scope}: {name}",
                stage / "js_matrix.png",
                0.0,
                1.0,
                "viridis_r",
            ),
            figures.head_matrix(
                result.cosine[np.ix_(order, order)],
                labels,
                f"Cosine similarity, {scope}: {name}",
                stage / "cosine_matrix.png",
                0.0,
                1.0,
                "viridis",
            ),
        ]
        if result.layer is None:
            written.append(figures.diversity_per_layer(result, stage / "layer_diversity.png"))
        return written

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result = self.result
        scope = "all heads" if result.layer is None else f"layer {result.layer}"
        shown = [terminal.layer_scores_table(result.layer_scores, f"Head diversity: {result.model['name']}, {scope}")]
        if result.layer is not None and len(result.labels) <= 16:
            shown.append(terminal.matrix_table(result.js, result.labels, "JS divergence between heads (bits)"))
        shown.append(terminal.pairs_table(result.ranked_pairs(True), "Most redundant pairs (lowest JSD)"))
        shown.append(terminal.pairs_table(result.ranked_pairs(False), "Most distinct pairs (highest JSD)"))
        groups = "; ".join(", ".join(group) for group in result.groups) or "none"
        shown.append(f"Near-duplicate groups (JSD < {result.redundant} bits): {groups}")
        if result.layer is None:
            clusters = "; ".join(", ".join(group) for group in result.clusters) or "none"
            shown.append(f"Clusters (average linkage below {result.cluster_at} bits): {clusters}")
        return shown


# ---------------------------------------------------------------------------------------------------- random-mha


class RandomMhaView(View):
    command = "random-mha"

    def document(self) -> dict:
        return document("random-mha", {}, {}, self.result.settings, self.result.notes, results=self.result.rows)

    def records(self) -> list[dict]:
        return self.result.rows

    def files(self, stage: Path) -> list[Path]:
        """random_mha.json and random_mha.png (each measure against the number of heads)."""
        from attnscope.output import figures

        rows, d_model = self.result.rows, self.result.settings["d_model"]
        heads = [row["heads"] for row in rows]
        series = {name: [row[name] for row in rows] for name in ("js", "js_distance", "cosine", "entropy_normalized")}
        title = f"Random multi-head attention, d_model {d_model}"
        plot = figures.line_plot(heads, series, "heads", "value", title, stage / "random_mha.png", log_x=True)
        return [write_atomic(stage / "random_mha.json", to_json(self.document())), plot]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        s = self.result.settings
        title = (
            f"Random multi-head attention (d_model {s['d_model']}, {s['seq_len']} tokens, {s['trials']} trials): "
            "diversity by heads"
        )
        return [terminal.records_table(self.result.rows, title)]


# -------------------------------------------------------------------------------------------------------- attend


def attend_records(result: AttendResult) -> list[dict]:
    """One flat record per head, layer.head order: the weight on the target (when one was given) and the head's
    top keys: tokens (position, exact token text, weight), or in the words view words (word index, word text,
    weight)."""
    n_layer, n_head = result.rows.shape[:2]
    records = []
    for layer in range(n_layer):
        for head in range(n_head):
            record: dict[str, Any] = {"layer": layer, "head": head, "label": f"{layer}.{head}"}
            if result.to_weight is not None:
                record["to_weight"] = float(result.to_weight[layer, head])
            for rank, (key, weight) in enumerate(result.top_keys(layer, head), start=1):
                if result.view == "words":
                    record[f"top{rank}_word"] = key
                    record[f"top{rank}_text"] = result.labels.word_text[key]
                else:
                    record[f"top{rank}_position"] = key
                    record[f"top{rank}_token"] = result.tokens[key]
                record[f"top{rank}_weight"] = weight
            records.append(record)
    return records


class AttendView(View):
    command = "attend"

    def document(self) -> dict:
        """The query word, the target, one record per head, the strongest heads and the full attention row of
        every head (`rows[layer][head][key]`, over tokens); in the words view also `words` (each word's token
        positions) and `word_rows[layer][head][word]`."""
        result = self.result
        source = {
            "token": "".join(result.tokens[p] for p in result.from_positions),
            "position": result.from_position,
            "positions": result.from_positions,
            "word": result.labels.text(result.from_positions),
        }
        target = None
        if result.to_token is not None:
            target = {
                "token": result.to_token,
                "positions": result.to_positions,
                "words": [list(span) for span in result.to_words],
            }
        words = {}
        if result.view == "words":
            words = {"words": words_field(result.labels), "word_rows": result.word_rows.tolist()}
        return document(
            "attend",
            result.model,
            {
                "tokens": result.tokens,
                "n_tokens": len(result.tokens),
                "bos": result.bos,
                "labels": result.labels.shown,
            },
            result.settings,
            result.notes,
            **{"from": source},
            to=target,
            view=result.view,
            heads=attend_records(result),
            strongest=[f"{layer}.{head}" for layer, head in result.strongest()],
            rows=result.rows.tolist(),
            **words,
        )

    def records(self) -> list[dict]:
        return attend_records(self.result)

    def files(self, stage: Path) -> list[Path]:
        """attend.json, attend.csv and attend.png: a layer × head heatmap of the weight on the target, or, without
        one, of each head's largest weight with the token (or word) it falls on written in the cell."""
        from attnscope.output import figures

        result = self.result
        source, name = result.from_name, result.model["name"]
        skipped = ", first key left out" if result.settings.get("skip_first") else ""
        if result.to_weight is not None:
            matrix, cells = result.to_weight, None
            targets = ", ".join(result.labels.describe(span) for span in result.to_words)
            title = f"Attention from {source} to {targets}: {name}"
        else:
            n_layer, n_head = result.rows.shape[:2]
            matrix = result.strength()
            cells = [
                [
                    f"{result.key_text(result.top_keys(layer, head, 1)[0][0])[:8]}\n{matrix[layer, head]:.2f}"
                    for head in range(n_head)
                ]
                for layer in range(n_layer)
            ]
            kind = "word" if result.view == "words" else "token"
            title = f"Where {source} looks (top {kind} per head{skipped}): {name}"
            if result.view == "tokens" and result.labels.continued:
                title += f"\n{CONTINUED_LEGEND}"
        return [
            *super().files(stage),
            figures.score_heatmap(matrix, title, stage / "attend.png", 0.0, 1.0, cell_text=cells),
        ]

    def shown(self) -> AttendShown:
        """What the terminal and a notebook show, one computation for both."""
        result = self.result
        source = result.from_name
        if result.to_weight is not None:
            targets = ", ".join(result.labels.describe(span) for span in result.to_words)
            grid, grid_title = result.to_weight, f"Attention from {source} to {targets}"
        else:
            skipped = " (the first key left out)" if result.settings.get("skip_first") else ""
            grid, grid_title = result.strength(), f"Largest weight of each head from {source}{skipped}"
        rows = [
            (
                f"{layer}.{head}",
                None if result.to_weight is None else float(result.to_weight[layer, head]),
                [(result.key_name(key), weight) for key, weight in result.top_keys(layer, head)],
            )
            for layer, head in result.strongest()
        ]
        kind = "word" if result.view == "words" else "token"
        header = f"top {result.settings['tokens']} {kind}s ({kind}@position: weight)"
        return AttendShown(grid, grid_title, rows, header, f"Strongest heads from {source}")

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        shown = self.shown()
        return [
            terminal.layer_head_grid(shown.grid, shown.grid_title),
            terminal.attend_table(shown.rows, shown.header, shown.table_title),
        ]


@dataclass
class AttendShown:
    """attend's face for people: a layer × head grid and the strongest heads, each with (head label, weight on the
    target or None, top keys as (name, weight))."""

    grid: Any
    grid_title: str
    rows: list[tuple[str, float | None, list[tuple[str, float]]]]
    header: str
    table_title: str


# -------------------------------------------------------------------------------------------------------- ablate


def ablate_records(result: AblationResult) -> list[dict]:
    """One flat record per head, layer.head order: importance, rank (1 = most important) and, with the loss method,
    the loss with the head removed."""
    rank = {lh: k for k, lh in enumerate(result.ranked(), start=1)}
    n_layer, n_head = result.importance.shape
    records = []
    for layer in range(n_layer):
        for head in range(n_head):
            record: dict[str, Any] = {
                "layer": layer,
                "head": head,
                "label": f"{layer}.{head}",
                "importance": float(result.importance[layer, head]),
                "rank": rank[(layer, head)],
            }
            if result.ablated_loss is not None:
                record["loss_without_head"] = float(result.ablated_loss[layer, head])
            records.append(record)
    return records


class AblateView(View):
    command = "ablate"

    def document(self) -> dict:
        """The baseline loss, one record per head and the pruning curve."""
        result = self.result
        return document(
            "ablate",
            result.model,
            result.inputs,
            result.settings,
            result.notes,
            baseline_loss=result.baseline_loss,
            heads=ablate_records(result),
            prune=result.prune,
        )

    def records(self) -> list[dict]:
        return ablate_records(self.result)

    def files(self, stage: Path) -> list[Path]:
        """ablate.json, ablate.csv, importance.png (layer × head) and, with pruning, prune.png (loss against heads
        removed)."""
        from attnscope.output import figures

        result = self.result
        name = result.model["name"]
        unit = "loss increase, nats" if result.method == "loss" else "|dL/d gate|"
        written = [
            *super().files(stage),
            figures.score_heatmap(
                result.importance, f"Head importance ({unit}): {name}", stage / "importance.png", None, None
            ),
        ]
        if result.prune:
            removed = [0] + [step["removed"] for step in result.prune]
            losses = [result.baseline_loss] + [step["loss"] for step in result.prune]
            written.append(
                figures.line_plot(
                    removed,
                    {"loss": losses},
                    "heads removed (least important first)",
                    "loss (nats/token)",
                    f"Pruning heads: {name}",
                    stage / "prune.png",
                )
            )
        return written

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result = self.result
        unit = "loss increase (nats)" if result.method == "loss" else "|dL/d gate|"
        by_label = {record["label"]: record for record in self.records()}
        ranked = [by_label[f"{layer}.{head}"] for layer, head in result.ranked()[: result.settings["top"]]]
        shown = [
            f"baseline loss {result.baseline_loss:.4f} nats/token over {result.inputs['predicted_tokens']} predicted "
            "tokens",
            terminal.layer_head_grid(result.importance, f"Head importance, {unit}", unit_range=False),
            terminal.records_table(ranked, f"Most important heads ({result.method})"),
        ]
        if result.prune:
            shown.append(terminal.records_table(result.prune, "Loss as the least important heads are removed"))
        return shown


# -------------------------------------------------------------------------------------------------------- report


class ReportView(View):
    command = "report"
    names_files = True

    def document(self) -> dict:
        """The `heads` and `diversity` documents of `--json` (every head), side by side, and with `--ablate` the
        `ablate` document (loss method) as `ablation`."""
        result = self.result
        heads = result.heads
        return document(
            "report",
            heads.model,
            heads.inputs,
            {"diversity": result.diversity is not None, "ablate": result.ablation is not None},
            result.notes,
            heads=heads_document(heads, heads.heads),
            diversity=None if result.diversity is None else diversity_document(result.diversity),
            ablation=None if result.ablation is None else AblateView(result.ablation).document(),
        )

    def records(self) -> list[dict]:
        return head_records(self.result.heads.heads, self.result.heads.model)

    def files(self, stage: Path) -> list[Path]:
        """report.html: one self-contained page."""
        from attnscope.output import html

        doc = self.document()
        page = html.render(self.result, doc["heads"], doc["diversity"], doc["ablation"])
        return [write_atomic(stage / "report.html", page)]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        return _picture_paths(written)


# --------------------------------------------------------------------------------------------------------- bench


class BenchView(View):
    command = "bench"

    def document(self) -> dict:
        result = self.result
        return document(
            "bench", result.model, {}, result.settings, result.notes, results=result.rows, micro=result.micro
        )

    def records(self) -> list[dict]:
        return self.result.rows

    def files(self, stage: Path) -> list[Path]:
        """bench.json and tokens_per_s.png: tokens per second against sequence length, one line per method and
        batch size: a colour per method, a line style per batch size."""
        from attnscope.output import figures

        rows, machine = self.result.rows, self.result.settings
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
        title, path = f"{self.result.model['name']} on {where}", stage / "tokens_per_s.png"
        labels = ("sequence length (tokens)", "tokens per second")
        plot = figures.line_plot(seqs, lines, *labels, title, path, log_x=True, styles=styles)
        return [write_atomic(stage / "bench.json", to_json(self.document())), plot]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result, machine = self.result, self.result.settings
        where = f"{machine['device_name']}, {machine['cpu_threads']} CPU threads, {machine['dtype']}"
        shown = [terminal.bench_table(result.rows, f"attnscope bench: {result.model['name']} on {where}")]
        if result.micro:
            title = "From-scratch multi-head attention vs SDPA, ms per call (one 256-token sequence)"
            shown.append(terminal.records_table(result.micro, title))
        return shown


# ---------------------------------------------------------------------------------------------------------- info


class InfoView(View):
    command = "info"

    def document(self) -> dict:
        return document("info", self.result.model, {}, {}, self.result.notes)

    def records(self) -> list[dict]:
        return [self.result.model]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        facts = self.result.model
        matches = "matches" if facts["attention_params"] == facts["attention_params_formula"] else "DIFFERS from"
        rows = [
            ("model", facts["name"]),
            ("type", f"{facts['model_type']} ({facts['kind']})"),
            ("layers", str(facts["n_layer"])),
            ("heads per layer", str(facts["n_head"])),
            ("d_model", str(facts["d_model"])),
            ("d_head", str(facts["d_head"])),
            ("context", f"{facts['n_ctx']} tokens"),
            ("vocabulary", f"{facts['vocab_size']:,}"),
            ("parameters", f"{facts['n_params']:,}"),
            (
                "attention block",
                f"{facts['attention_params']:,} ({matches} 4·d² + 4·d = {facts['attention_params_formula']:,})",
            ),
            ("device", facts["device"]),
            ("dtype", facts["dtype"]),
        ]
        return [terminal.key_value_table(rows, "Model")]


VIEWS: dict[type, type[View]] = {
    HeadsResult: HeadsView,
    ShowResult: ShowView,
    DiversityResult: DiversityView,
    RandomMhaResult: RandomMhaView,
    AttendResult: AttendView,
    AblationResult: AblateView,
    ReportResult: ReportView,
    BenchResult: BenchView,
    InfoResult: InfoView,
}


def view_of(result: Any) -> View:
    """The view of an analysis result."""
    return VIEWS[type(result)](result)
