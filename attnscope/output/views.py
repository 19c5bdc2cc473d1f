"""What each command shows, from its analysis result: one view per result type, each with the same four faces.

    document()       the JSON document (`--json`, and the .json file of `--out`)
    records()        the CSV rows (`--csv`, and the .csv file of `--out`)
    files(stage)     the files of `--out`, written into `stage` (see output.files.write_all); returns their paths
    terminal(paths)  rich renderables for the terminal (`paths`: the files just written, for commands that say where)

`view_of(result, pictures)` picks the view; `pictures` (output.files.Pictures: `--format`, `--dpi`) says how its
pictures are written, each drawn by a function of output.figures that returns a Figure. Views render what the
analyses computed and compute nothing themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnscope.output.documents import document, to_csv, to_json
from attnscope.output.files import Pictures, write_atomic
from attnscope.scores.catalog import counted


class View:
    """The default faces: a view overrides what its command has."""

    command = ""
    names_files = False  # True: the terminal face is the paths of the files written (commands whose output they are)
    columns: Sequence[str] = ()  # the CSV's header when there are no records (where records can be none)

    def __init__(self, result: Any, pictures: Pictures | None = None):
        self.result = result
        self.pictures = pictures or Pictures()

    def picture(self, figure: Any, stage: Path, stem: str) -> Path:
        """Write `figure` into `stage` as `stem` in the chosen format (`role_map` -> role_map.png)."""
        from attnscope.output import figures

        path = stage / self.pictures.file_name(stem)
        return figures.save(figure, path, self.pictures.format, self.pictures.dpi)

    @property
    def notes(self) -> list[str]:
        return list(self.result.notes)

    def document(self) -> dict:
        raise NotImplementedError

    def records(self) -> list[dict]:
        raise NotImplementedError

    def data_files(self, stage: Path) -> list[Path]:
        """The files of --out that are not pictures: the JSON document and the CSV rows."""
        return [
            write_atomic(stage / f"{self.command}.json", to_json(self.document())),
            write_atomic(stage / f"{self.command}.csv", to_csv(self.records(), self.columns)),
        ]

    def figures(self) -> dict[str, Any]:
        """The pictures of --out, file stem -> matplotlib Figure (what `Result.plot()` returns); none by default."""
        return {}

    def files(self, stage: Path) -> list[Path]:
        """Every file of --out written into `stage`: the data files, then each figure in the chosen format."""
        figures = self.figures()
        return [*self.data_files(stage), *(self.picture(figure, stage, stem) for stem, figure in figures.items())]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        raise NotImplementedError


def _picture_paths(written: Sequence[Path]) -> list[Any]:
    """The terminal output of a command whose output is its files: their paths, one per line."""
    return [str(path) for path in written]


# --------------------------------------------------------------------------------------------------------- heads


def head_records(heads: Sequence[Any], model: dict) -> list[dict]:
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


def heads_document(result: Any, heads: Sequence[Any] | None = None) -> dict:
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

    def data_files(self, stage: Path) -> list[Path]:
        """heads.json and heads.csv: every head, whatever the selection."""
        result = self.result
        return [
            write_atomic(stage / "heads.json", to_json(heads_document(result, result.heads))),
            write_atomic(stage / "heads.csv", to_csv(head_records(result.heads, result.model))),
        ]

    def figures(self) -> dict[str, Any]:
        """role_map, score_<name> per score measured, and attention_<L.H> for each plotted head."""
        from attnscope.output import figures

        result = self.result
        drawn = {"role_map": figures.heads_role_map(result)}
        for name in figures.drawn_scores(result):
            drawn[f"score_{name}"] = figures.heads_score_heatmap(result, name)
        for layer, head in result.plotted:
            drawn[f"attention_{layer}.{head}"] = figures.head_attention(result.model, result.attention[layer], head)
        return drawn

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result, model, inputs = self.result, self.result.model, self.result.inputs
        read = f"{counted(inputs['n_texts'], 'text')}, {counted(inputs['n_tokens'], 'token')}"
        title = f"Head roles: {model['name']}  ({read})"
        kind, thresholds = result.kind.name, result.settings.get("thresholds")
        return [
            terminal.role_map(result.heads, model["n_layer"], model["n_head"], title, kind),
            terminal.heads_table(result.selected, "Heads", kind, result.selection.get("sort"), thresholds),
        ]


# ---------------------------------------------------------------------------------------------------------- show


def words_field(labels: Any) -> list[dict]:
    """The words of a window for the JSON: each word's text as shown and its token positions."""
    return [{"text": text, "positions": list(word)} for text, word in zip(labels.word_text, labels.words, strict=True)]


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

    def data_files(self, stage: Path) -> list[Path]:
        return []  # the picture is show's output (--json and --csv print the maps)

    def figures(self) -> dict[str, Any]:
        """attention_L<layer> (every head of the layer) or attention_<L.H> (one head, larger)."""
        from attnscope.output import figures

        result, layer = self.result, self.result.attention.layer
        stem = f"attention_L{layer}" if result.head is None else f"attention_{layer}.{result.head}"
        return {stem: figures.show_figure(result)}

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        return _picture_paths(written)


# ----------------------------------------------------------------------------------------------------- diversity


def diversity_document(result: Any) -> dict:
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

    def data_files(self, stage: Path) -> list[Path]:
        return [
            write_atomic(stage / "diversity.json", to_json(self.document())),
            write_atomic(stage / "diversity_pairs.csv", to_csv(self.records(), self.columns)),
        ]

    def figures(self) -> dict[str, Any]:
        """js_matrix and cosine_matrix (all heads: clustered, under the dendrogram) and, for all layers,
        layer_diversity."""
        from attnscope.output import figures

        result = self.result
        drawn = {
            "js_matrix": figures.diversity_matrix(result, "js"),
            "cosine_matrix": figures.diversity_matrix(result, "cosine"),
        }
        if result.layer is None:
            drawn["layer_diversity"] = figures.diversity_per_layer(result)
        return drawn

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

    def data_files(self, stage: Path) -> list[Path]:
        return [write_atomic(stage / "random_mha.json", to_json(self.document()))]

    def figures(self) -> dict[str, Any]:
        """random_mha: each measure against the number of heads."""
        from attnscope.output import figures

        return {"random_mha": figures.random_mha_figure(self.result)}

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        s = self.result.settings
        title = (
            f"Random multi-head attention (d_model {s['d_model']}, {counted(s['seq_len'], 'token')}, "
            f"{counted(s['trials'], 'trial')}): "
            "diversity by heads"
        )
        return [terminal.records_table(self.result.rows, title)]


# -------------------------------------------------------------------------------------------------------- attend


def attend_records(result: Any) -> list[dict]:
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

    def figures(self) -> dict[str, Any]:
        """attend: a layer × head heatmap of the weight on the target, or, without one, of each head's largest
        weight with the token (or word) it falls on written in the cell."""
        from attnscope.output import figures

        return {"attend": figures.attend_figure(self.result)}

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


def ablate_records(result: Any) -> list[dict]:
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

    def figures(self) -> dict[str, Any]:
        """importance (layer × head) and, with pruning, prune (the loss against the heads removed)."""
        from attnscope.output import figures

        drawn = {"importance": figures.ablate_importance(self.result)}
        if self.result.prune:
            drawn["prune"] = figures.prune_curve(self.result)
        return drawn

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

    def data_files(self, stage: Path) -> list[Path]:
        return [write_atomic(stage / "bench.json", to_json(self.document()))]

    def figures(self) -> dict[str, Any]:
        """tokens_per_s: tokens per second against sequence length, one line per method and batch size: a colour
        per method, a line style per batch size."""
        from attnscope.output import figures

        return {"tokens_per_s": figures.bench_figure(self.result)}

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result, machine = self.result, self.result.settings
        where = f"{machine['device_name']}, {counted(machine['cpu_threads'], 'CPU thread')}, {machine['dtype']}"
        shown = [terminal.bench_table(result.rows, f"attnscope bench: {result.model['name']} on {where}")]
        if result.micro:
            title = "Attention from scratch vs torch's SDPA"
            d_model = machine.get("micro_d_model", 512)
            shown.append(terminal.micro_table(result.micro, title, machine["repeats"], d_model))
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
        heads = str(facts["n_head"])
        if facts["n_kv_head"] != facts["n_head"]:  # grouped- or multi-query attention
            heads += f" (sharing {counted(facts['n_kv_head'], 'key/value head')})"
        formula = facts["attention_params_formula"]
        if facts["attention_params"] == formula:
            attention = f"{facts['attention_params']:,} (W_Q, W_K, W_V, W_O and any biases)"
        else:  # what W_Q, W_K, W_V, W_O leave out: QK-norms, sinks
            attention = f"{facts['attention_params']:,} (W_Q, W_K, W_V, W_O and any biases: {formula:,})"
        rows = [
            ("model", facts["name"]),
            ("family", f"{facts['family']} ({facts['model_type']}), {facts['kind']}"),
            ("layers", str(facts["n_layer"])),
            ("heads per layer", heads),
            ("width (d_model)", str(facts["d_model"])),
            ("head width (d_head)", str(facts["d_head"])),
            ("context", counted(facts["n_ctx"], "token")),
            ("vocabulary", counted(facts["vocab_size"], "token")),
            ("parameters", f"{facts['n_params']:,} (without the language-model head)"),
            ("attention per layer", attention),
            ("device", facts["device"]),
            ("dtype", facts["dtype"]),
        ]
        return [terminal.key_value_table(rows, "Model")]


# By the result's class name, so that showing one result imports no other analysis (nor torch, for `info`).
VIEWS: dict[str, type[View]] = {
    "HeadsResult": HeadsView,
    "ShowResult": ShowView,
    "DiversityResult": DiversityView,
    "RandomMhaResult": RandomMhaView,
    "AttendResult": AttendView,
    "AblationResult": AblateView,
    "ReportResult": ReportView,
    "BenchResult": BenchView,
    "InfoResult": InfoView,
}


def view_of(result: Any, pictures: Pictures | None = None) -> View:
    """The view of an analysis result; `pictures`: how its files' pictures are written (default PNG at
    output.files.DPI)."""
    return VIEWS[type(result).__name__](result, pictures)
