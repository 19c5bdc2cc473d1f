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
from pathlib import Path
from typing import Any

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
from attnscope.output.files import Pictures, write_atomic


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
        """heads.json and heads.csv (every head, whatever the selection), role_map, score_<name> and
        attention_<L.H> for each plotted head (.png, .svg or .pdf)."""
        from attnscope.output import figures

        result = self.result
        written = [
            write_atomic(stage / "heads.json", to_json(heads_document(result, result.heads))),
            write_atomic(stage / "heads.csv", to_csv(head_records(result.heads, result.model))),
            self.picture(figures.heads_role_map(result), stage, "role_map"),
        ]
        for name in figures.drawn_scores(result):
            written.append(self.picture(figures.heads_score_heatmap(result, name), stage, f"score_{name}"))
        for layer, head in result.plotted:
            figure = figures.head_attention(result.model, result.attention[layer], head)
            written.append(self.picture(figure, stage, f"attention_{layer}.{head}"))
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


class ShowView(View):
    command = "show"
    names_files = True

    def document(self) -> dict:
        result, attention = self.result, self.result.attention
        maps = attention.maps if result.head is None else attention.maps[result.head : result.head + 1]
        heads = list(range(attention.maps.shape[0])) if result.head is None else [result.head]
        return document(
            "show",
            result.model,
            {"index": result.index, "tokens": attention.tokens, "n_tokens": len(attention.tokens)},
            {"layer": attention.layer, "head": result.head, "index": result.index, "bos": result.bos},
            result.notes,
            heads=heads,
            maps=maps.tolist(),
        )

    def records(self) -> list[dict]:
        """One row per (head, query, key) the query sees (a decoder's keys after the query are left out)."""
        result, attention = self.result, self.result.attention
        heads = range(attention.maps.shape[0]) if result.head is None else [result.head]
        n = len(attention.tokens)
        causal = result.model["kind"] == "decoder"
        return [
            {
                "layer": attention.layer,
                "head": head,
                "query": i,
                "key": j,
                "query_token": attention.tokens[i],
                "key_token": attention.tokens[j],
                "weight": float(attention.maps[head, i, j]),
            }
            for head in heads
            for i in range(n)
            for j in range(i + 1 if causal else n)
        ]

    def files(self, stage: Path) -> list[Path]:
        """attention_L<layer> (every head of the layer) or attention_<L.H> (one head, larger)."""
        from attnscope.output import figures

        result, layer = self.result, self.result.attention.layer
        stem = f"attention_L{layer}" if result.head is None else f"attention_{layer}.{result.head}"
        return [self.picture(figures.show_figure(result), stage, stem)]

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
        """diversity.json, diversity_pairs.csv, js_matrix, cosine_matrix and, for all layers, layer_diversity.
        Matrices of all heads are drawn in linkage order (similar heads together) under the dendrogram."""
        from attnscope.output import figures

        result = self.result
        written = [
            write_atomic(stage / "diversity.json", to_json(self.document())),
            write_atomic(stage / "diversity_pairs.csv", to_csv(self.records(), self.columns)),
            self.picture(figures.diversity_matrix(result, "js"), stage, "js_matrix"),
            self.picture(figures.diversity_matrix(result, "cosine"), stage, "cosine_matrix"),
        ]
        if result.layer is None:
            written.append(self.picture(figures.diversity_per_layer(result), stage, "layer_diversity"))
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
        """random_mha.json and random_mha (each measure against the number of heads)."""
        from attnscope.output import figures

        plot = self.picture(figures.random_mha_figure(self.result), stage, "random_mha")
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
    top tokens (position, token, weight)."""
    n_layer, n_head = result.rows.shape[:2]
    records = []
    for layer in range(n_layer):
        for head in range(n_head):
            record: dict[str, Any] = {"layer": layer, "head": head, "label": f"{layer}.{head}"}
            if result.to_weight is not None:
                record["to_weight"] = float(result.to_weight[layer, head])
            for rank, (position, weight) in enumerate(result.top_keys(layer, head), start=1):
                record[f"top{rank}_position"] = position
                record[f"top{rank}_token"] = result.tokens[position]
                record[f"top{rank}_weight"] = weight
            records.append(record)
    return records


class AttendView(View):
    command = "attend"

    def document(self) -> dict:
        """The query token, the target, one record per head, the strongest heads and the full attention row of
        every head (`rows[layer][head][key]`)."""
        result = self.result
        return document(
            "attend",
            result.model,
            {"tokens": result.tokens, "n_tokens": len(result.tokens), "bos": result.bos},
            result.settings,
            result.notes,
            **{"from": {"token": result.tokens[result.from_position], "position": result.from_position}},
            to=None if result.to_token is None else {"token": result.to_token, "positions": result.to_positions},
            heads=attend_records(result),
            strongest=[f"{layer}.{head}" for layer, head in result.strongest()],
            rows=result.rows.tolist(),
        )

    def records(self) -> list[dict]:
        return attend_records(self.result)

    def files(self, stage: Path) -> list[Path]:
        """attend.json, attend.csv and attend: a layer × head heatmap of the weight on the target, or, without one,
        of each head's largest weight with the token it falls on written in the cell."""
        from attnscope.output import figures

        return [*super().files(stage), self.picture(figures.attend_figure(self.result), stage, "attend")]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result = self.result
        source = f"{result.tokens[result.from_position]!r}@{result.from_position}"
        if result.to_weight is not None:
            targets = ", ".join(str(p) for p in result.to_positions)
            grid = terminal.layer_head_grid(
                result.to_weight, f"Attention from {source} to {result.to_token!r}@{targets}"
            )
        else:
            grid = terminal.layer_head_grid(result.rows.max(axis=-1), f"Largest weight of each head from {source}")
        by_label = {record["label"]: record for record in self.records()}
        strongest = [by_label[f"{layer}.{head}"] for layer, head in result.strongest()]
        return [grid, terminal.attend_table(strongest, result.settings["tokens"], f"Strongest heads from {source}")]


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
        """ablate.json, ablate.csv, importance (layer × head) and, with pruning, prune (the loss increase against
        heads removed)."""
        from attnscope.output import figures

        written = [*super().files(stage), self.picture(figures.ablate_importance(self.result), stage, "importance")]
        if self.result.prune:
            written.append(self.picture(figures.prune_curve(self.result), stage, "prune"))
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
        """The `heads` and `diversity` documents of `--json` (every head), side by side."""
        result = self.result
        heads = result.heads
        return document(
            "report",
            heads.model,
            heads.inputs,
            {"diversity": result.diversity is not None},
            result.notes,
            heads=heads_document(heads, heads.heads),
            diversity=None if result.diversity is None else diversity_document(result.diversity),
        )

    def records(self) -> list[dict]:
        return head_records(self.result.heads.heads, self.result.heads.model)

    def files(self, stage: Path) -> list[Path]:
        """report.html: one self-contained page."""
        from attnscope.output import html

        doc = self.document()
        return [write_atomic(stage / "report.html", html.render(self.result, doc["heads"], doc["diversity"]))]

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
        """bench.json and tokens_per_s: tokens per second against sequence length, one line per method and batch
        size: a colour per method, a line style per batch size."""
        from attnscope.output import figures

        plot = self.picture(figures.bench_figure(self.result), stage, "tokens_per_s")
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


def view_of(result: Any, pictures: Pictures | None = None) -> View:
    """The view of an analysis result; `pictures`: how its files' pictures are written (default PNG at
    output.files.DPI)."""
    return VIEWS[type(result)](result, pictures)
