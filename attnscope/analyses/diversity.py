"""`attnscope diversity`: how different the heads are, pair by pair (cosine and Jensen–Shannon, `scores.pairs`),
per layer, and grouped (near-duplicates, average-linkage clusters, `scores.groups`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.analyses import common
from attnscope.analyses.common import Progress
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.pipeline import distributed
from attnscope.pipeline.inputs import Text, Texts
from attnscope.pipeline.reducers import DiversityStatistics
from attnscope.pipeline.tokens import WindowStream
from attnscope.scores import groups

DEFAULT_REDUNDANT = 0.1  # bits: heads whose rows differ by less than a tenth of the way to disjoint
DEFAULT_CLUSTER_AT = 0.3  # bits: average-linkage merges below this form a cluster (all layers)
DEFAULT_TOP = 5  # pairs listed as most redundant and most distinct
ALL_LAYERS_BUDGET = 64 * 2**20  # bytes of all layers' attention held at once for all layers (one window at least)


@dataclass
class DiversityResult:
    """Pairwise similarity of the heads `labels` (one layer's, or all heads of the model in layer.head order).

    Matrices are (K, K) numpy float64: `cosine`, `js` (mean JSD per scored row, bits) and `js_distance` (mean of
    its square root per row). `layer_scores`: layer -> mean JSD over the pairs of its heads.
    """

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

    @property
    def redundant(self) -> float:
        return self.settings["redundant"]

    @property
    def cluster_at(self) -> float:
        return self.settings["cluster_at"]

    def pairs(self) -> list[dict[str, Any]]:
        """Every unordered pair of heads, in label order; each head also as integers, since a numeric CSV reader
        takes the labels `0.1` and `0.10` for the same number."""
        K = len(self.labels)
        heads = [tuple(int(part) for part in label.split(".")) for label in self.labels]
        return [
            {
                "a": self.labels[i],
                "b": self.labels[j],
                "a_layer": heads[i][0],
                "a_head": heads[i][1],
                "b_layer": heads[j][0],
                "b_head": heads[j][1],
                "cosine": float(self.cosine[i, j]),
                "js": float(self.js[i, j]),
                "js_distance": float(self.js_distance[i, j]),
            }
            for i in range(K)
            for j in range(i + 1, K)
        ]

    def ranked_pairs(self, most_similar: bool, k: int | None = None) -> list[dict[str, Any]]:
        """The k (default: the run's `top`) most redundant (lowest JSD) or most distinct (highest JSD) pairs; ties
        in label order."""
        pairs = self.pairs()
        pairs.sort(key=lambda pair: pair["js"] if most_similar else -pair["js"])
        return pairs[: self.settings["top"] if k is None else k]


def parse_layer_choice(text: str | int | None) -> int | None:
    """A layer number, or `all` (None)."""
    if text is None or isinstance(text, int):
        return text
    if text.strip().lower() == "all":
        return None
    if not text.strip().isdigit():
        raise AttnscopeError(f"layer '{text}': expected a layer number (0-based) or 'all'")
    return int(text)


@dataclass(frozen=True)
class Diversity:
    """Cosine and Jensen–Shannon similarity between the heads of `layer` (None: every head of the model)."""

    layer: int | None
    bos: bool | None = None
    batch_size: int = common.DEFAULT_BATCH_SIZE
    max_tokens: int | None = common.DEFAULT_MAX_TOKENS
    redundant: float = DEFAULT_REDUNDANT
    cluster_at: float = DEFAULT_CLUSTER_AT
    top: int = DEFAULT_TOP

    def __post_init__(self) -> None:
        common.check_positive("batch size", self.batch_size)
        common.check_positive("max tokens", self.max_tokens)
        common.check_positive("top", self.top)
        for name, value in (("redundant", self.redundant), ("cluster-at", self.cluster_at)):
            if not 0.0 < value <= 1.0:
                raise AttnscopeError(f"{name} {value}: a JS divergence in bits, above 0 and at most 1")

    def run(
        self, model: LoadedModel, texts: Texts | Sequence[Text], progress: Progress | None = None
    ) -> DiversityResult:
        if self.layer is not None:
            common.check_layer(self.layer, model.n_layer)
        layers = list(range(model.n_layer)) if self.layer is None else [self.layer]
        windows = WindowStream(model, texts, self.bos)
        fits = None
        if self.layer is None:  # all layers' maps of a batch are held at once: size batches to the budget
            per_position_pair = model.n_layer * model.n_head * 4  # bytes per (query, key) of a window

            def fits(count: int, longest: int) -> bool:
                return count * per_position_pair * longest * longest <= ALL_LAYERS_BUDGET

        statistics = DiversityStatistics(model.kind, layers, model.n_head, model.device)
        common.run_windows(
            model, windows, statistics, self.batch_size, self.max_tokens, progress, flush=statistics.flush, fits=fits
        )
        distributed.all_reduce_sum(statistics.dots, statistics.js, statistics.js_root, statistics.row_count)
        if int(statistics.row_count) == 0:
            raise AttnscopeError(common.too_short(model, "compare"))
        matrices = {name: value.numpy() for name, value in statistics.results().items()}
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
            notes=windows.notes(),
        )


def analyze_diversity(
    model: LoadedModel,
    texts: Texts | Sequence[Text],
    layer: int | None,
    progress: Progress | None = None,
    **settings: Any,
) -> DiversityResult:
    """`Diversity(layer, **settings).run(model, texts, progress)`."""
    return Diversity(layer, **settings).run(model, texts, progress)
