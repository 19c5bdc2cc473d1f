"""`attnscope diversity`: how different the heads are, pair by pair (cosine and Jensen–Shannon, `scores.pairs`),
per layer, and grouped (near-duplicates, average-linkage clusters, `scores.groups`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnscope import settings
from attnscope.analyses import common
from attnscope.analyses.common import Progress
from attnscope.analyses.result import Result
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.output.diversity import DiversityView
from attnscope.pipeline import distributed
from attnscope.pipeline.blocks import AttentionBlock
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.reducers import DiversityStatistics
from attnscope.pipeline.tokens import WindowStream
from attnscope.scores import groups, pairs
from attnscope.scores.kinds import Kind

ALL_LAYERS_BUDGET = 64 * 2**20  # bytes of all layers' attention held at once for all layers (one window at least)


@dataclass(repr=False)  # the repr is Result's: a summary
class DiversityResult(Result):
    """Pairwise similarity of the heads `labels` (one layer's, or all heads of the model in layer.head order).

    Matrices are (K, K) numpy float64: `cosine`, `js` (mean JSD per scored row, bits) and `js_distance` (mean of
    its square root per row). `layer_scores`: layer -> mean JSD over the pairs of its heads.
    """

    view_class = DiversityView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    model: dict[str, Any]
    inputs: dict[str, Any]
    settings: dict[str, Any]
    layer: int | None  # None: all layers
    labels: list[str]
    cosine: Any
    js: Any
    js_distance: Any
    layer_scores: dict[int, float]
    groups: list[list[str]]  # near-duplicate heads: JSD below `redundant`, joined transitively
    order: list[int]  # heads ordered so that similar ones sit together (average linkage, optimal leaf order)
    clusters: list[list[str]]  # average-linkage clusters below `cluster_at`
    notes: list[str] = field(default_factory=list)
    js_se: Any = None
    js_distance_se: Any = None
    linkage: Any = None  # scipy's linkage matrix (K-1, 4) of the average linkage behind `order` and `clusters`

    @property
    def redundant(self) -> float:
        return self.settings["redundant"]

    @property
    def cluster_at(self) -> float:
        return self.settings["cluster_at"]

    @property
    def ordered_labels(self) -> list[str]:
        """The heads in the clustered order (`order`, indices into `labels`), as `L.H` labels."""
        return [self.labels[index] for index in self.order]

    def pair_columns(self) -> list[str]:
        """The keys of a pair's record, in order (the CSV's header, also when there is no pair)."""
        errors = [] if self.js_se is None else ["js_se", "js_distance_se"]
        return ["a", "b", "a_layer", "a_head", "b_layer", "b_head", "cosine", "js", "js_distance", *errors]

    def pairs(self) -> list[dict[str, Any]]:
        """Every unordered pair of heads, in label order; each head also as integers, since a numeric CSV reader
        takes the labels `0.1` and `0.10` for the same number."""
        K = len(self.labels)
        heads = [tuple(int(part) for part in label.split(".")) for label in self.labels]
        matrices = [self.cosine, self.js, self.js_distance]
        if self.js_se is not None:
            matrices += [self.js_se, self.js_distance_se]
        return [
            dict(
                zip(
                    self.pair_columns(),
                    [self.labels[i], self.labels[j], *heads[i], *heads[j], *(float(m[i, j]) for m in matrices)],
                    strict=True,
                )
            )
            for i in range(K)
            for j in range(i + 1, K)
        ]

    def ranked_pairs(self, most_similar: bool, k: int | None = None) -> list[dict[str, Any]]:
        """The k (default: the run's `top`) most redundant (lowest JSD) or most distinct (highest JSD) pairs; ties
        in label order."""
        pairs = self.pairs()
        pairs.sort(key=lambda pair: pair["js"] if most_similar else -pair["js"])
        return pairs[: self.settings["top"] if k is None else k]


class SampledDiversityStatistics(DiversityStatistics):
    """DiversityStatistics with the divergences estimated on `sample_rows` random scored rows per window, drawn
    with a generator seeded by (`seed`, the window's index in the corpus): the same rows whatever the batch size
    or the number of processes. The dot products (cosine) stay exact, over every scored row.

    Each window is a stratum: its N_w = min(sample_rows, R_w) rows estimate the sum over its R_w scored rows, and
    the spread of the per-row JSD gives the variance of that estimate (`pairs.stratified_estimate`); a window
    with no more scored rows than `sample_rows` is taken whole and adds no variance. Every layer is buffered
    (reducers.LayerBuffer) until its batch ends (one layer too), since which rows to take is known only with the
    batch's window indices.
    """

    def __init__(self, kind: Kind, layers: list[int], n_head: int, device: torch.device, sample_rows: int, seed: int):
        super().__init__(kind, layers, n_head, device)
        self.sample_rows = sample_rows
        self.seed = seed
        self.js_variance = torch.zeros_like(self.js)  # (K, K) of the estimated JSD sum
        self.js_root_variance = torch.zeros_like(self.js)  # (K, K) of the estimated sqrt-JSD sum

    def add_block(self, layer: int, block: AttentionBlock) -> None:
        if layer in self.layers:
            self.buffer.add_block(layer, block)

    def flush(self, batch=None) -> None:
        """Reduce the buffered batch: exact dot products, sampled divergences (batch.indices name its windows)."""
        buffered = self.buffer.take()
        if buffered is None:
            return
        maps, lengths = buffered  # (B, K, n, n), (B,)
        positions = torch.arange(maps.shape[2], device=maps.device)  # (n,)
        scored = self.kind.scored_rows(lengths, positions)  # (B, n)
        place = distributed.working()  # this process runs windows rank, rank + size, ... of the corpus
        seeds = [window_seed(self.seed, place.rank + index * place.size) for index in batch.indices]
        chosen = pairs.sample_rows(scored, self.sample_rows, seeds)  # (B, n)
        causal = positions if self.kind.causal else None
        self.dots += pairs.pairwise_dots(maps, scored, causal).to(self.dots.device)
        sums = pairs.window_divergence_sums(maps, chosen, causal)  # (3, B, K, K) Σ JSD, Σ sqrt JSD, Σ JSD²
        sampled, total = chosen.sum(-1), scored.sum(-1)  # (B,)
        js, js_variance = pairs.stratified_estimate(sums[0], sums[2], sampled, total)
        js_root, js_root_variance = pairs.stratified_estimate(sums[1], sums[0], sampled, total)  # (√JSD)² = JSD
        for running, value in (
            (self.js, js),
            (self.js_variance, js_variance),
            (self.js_root, js_root),
            (self.js_root_variance, js_root_variance),
        ):
            running += value.to(running.device)
        self.row_count += total.sum().to(self.row_count.device)

    def results(self) -> dict[str, torch.Tensor]:
        """DiversityStatistics.results with `js_se` and `js_distance_se`, the standard errors of the means."""
        count = int(self.row_count)
        return super().results() | {
            "js_se": self.js_variance.cpu().sqrt() / count,
            "js_distance_se": self.js_root_variance.cpu().sqrt() / count,
        }


def diversity_statistics(
    kind: Kind, layers: list[int], n_head: int, device: torch.device, sample_rows: int = 0, seed: int = 0
) -> DiversityStatistics:
    """The reducer of `diversity`: exact (sample_rows 0) or with JS on `sample_rows` random rows per window."""
    if sample_rows:
        return SampledDiversityStatistics(kind, layers, n_head, device, sample_rows, seed)
    return DiversityStatistics(kind, layers, n_head, device)


def layers_batch_size(batch_size: int, n_layers: int, n_head: int, longest: int) -> int:
    """The batch size, lowered so that a batch's buffered maps of `n_layers` layers, float32 (B, L·H, n, n) for
    windows of up to `longest` tokens, stay within ALL_LAYERS_BUDGET (one window at least)."""
    per_window = n_layers * n_head * longest * longest * 4
    return min(batch_size, max(1, ALL_LAYERS_BUDGET // per_window))


def layers_fit(n_layers: int, n_head: int) -> Callable[[int, int], bool]:
    """The batch-size rule of `layers_batch_size` as the batcher's `fits(count, longest)` predicate."""

    def fits(count: int, longest: int) -> bool:
        return count * n_layers * n_head * longest * longest * 4 <= ALL_LAYERS_BUDGET

    return fits


def window_seed(seed: int, window: int) -> int:
    """The seed of window `window`'s row sample: the user's seed and the window's index mixed (numpy SeedSequence),
    so that neighbouring seeds or windows do not draw related samples."""
    return int(np.random.SeedSequence((seed, window)).generate_state(1)[0])


class Diversity(settings.Diversity):
    """Cosine and Jensen–Shannon similarity between the heads of `layer` (None: every head of the model)."""

    def run(
        self, model: LoadedModel, texts: Texts | Sequence[Text], progress: Progress | None = None
    ) -> DiversityResult:
        self.check_shape(model.shape)
        layers = list(range(model.n_layer)) if self.layer is None else [self.layer]
        windows = WindowStream(model, texts, self.bos)
        fits = None
        if self.layer is None or self.sample_rows:  # the layers' maps of a batch are held at once: size batches
            fits = layers_fit(len(layers), model.n_head)
        statistics = diversity_statistics(model.kind, layers, model.n_head, model.device, self.sample_rows, self.seed)
        variances = [statistics.js_variance, statistics.js_root_variance] if self.sample_rows else []
        captured = common.run_windows(
            model, windows, statistics, self.batch_size, self.max_tokens, progress, flush=statistics.flush, fits=fits
        )
        distributed.all_reduce_sum(statistics.dots, statistics.js, statistics.js_root, statistics.row_count, *variances)
        if int(statistics.row_count) == 0:
            raise AttnscopeError(common.too_short(model, "compare"))
        matrices = {name: value.numpy() for name, value in statistics.results().items()}
        # a head's similarity to itself is finite exactly when its attention is
        common.check_finite(model, "attention", np.diag(matrices["cosine"]).reshape(len(layers), -1), layers)
        notes = windows.notes() + captured.notes
        if self.sample_rows:
            off_diagonal = ~np.eye(matrices["js"].shape[0], dtype=bool)
            js_se, root_se = (matrices[name][off_diagonal].max(initial=0.0) for name in ("js_se", "js_distance_se"))
            notes.append(
                f"JS estimated on {self.sample_rows} random scored rows per window (seed {self.seed}; cosine uses "
                f"every row): largest standard error {js_se:.2g} bits for js, {root_se:.2g} for js_distance (per "
                "pair: js_se, js_distance_se); --sample-rows 0 for the exact values"
            )
        labels = [f"{layer}.{head}" for layer in layers for head in range(model.n_head)]
        H = model.n_head
        layer_scores = {}
        for index, layer in enumerate(layers):
            block = matrices["js"][index * H : (index + 1) * H, index * H : (index + 1) * H]
            upper = block[np.triu_indices(H, k=1)]
            layer_scores[layer] = float(upper.mean()) if upper.size else float("nan")
        linkage = groups.average_linkage(matrices["js"])
        settings = {
            "layer": "all" if self.layer is None else self.layer,
            "redundant": self.redundant,
            "cluster_at": self.cluster_at,
            "top": self.top,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "js_unit": "bits (log base 2)",
            "sample_rows": self.sample_rows,
            "seed": self.seed,
        }
        return DiversityResult(
            model=model.info(),
            inputs=common.input_summary(windows, int(statistics.row_count)),
            settings=settings,
            layer=self.layer,
            labels=labels,
            cosine=matrices["cosine"],
            js=matrices["js"],
            js_distance=matrices["js_distance"],
            layer_scores=layer_scores,
            groups=[
                [labels[k] for k in group] for group in groups.near_duplicate_groups(matrices["js"], self.redundant)
            ],
            order=linkage.order,
            clusters=[[labels[k] for k in group] for group in groups.clusters(linkage, self.cluster_at)],
            notes=notes,
            js_se=matrices.get("js_se"),
            js_distance_se=matrices.get("js_distance_se"),
            linkage=linkage.merges,
        )
