"""Stage 5: the library's entry points, wiring inputs, tokens, capture, statistics and roles together.

    from attnscope.model import load_model
    from attnscope.inputs import Text
    from attnscope.analysis import analyze_heads
    loaded = load_model("gpt2")
    result = analyze_heads(loaded, [Text("The cat sat on the mat because it was tired.", "argument")])
    result.heads[0].role, result.heads[0].scores["previous_token"]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from attnscope import capture, metrics, roles
from attnscope.errors import AttnscopeError
from attnscope.inputs import Text
from attnscope.model import LoadedModel
from attnscope.tokens import PROBE_SEQUENCES, Tokenized, batches, probe_windows, token_labels, tokenize

DEFAULT_BATCH_SIZE = 8
DEFAULT_MAX_TOKENS = 16384  # padded tokens per batch: bounds activations whatever --batch-size says

# progress(texts done, tokens done, texts in all, tokens in all), called after every batch; a text split into
# windows is done when its last window is (under torchrun: this process's share of the texts)
Progress = Callable[[int, int, int, int], None]
DEFAULT_PROBE_LEN = 50
PROBE_SCORES = ("induction", "duplicate_token")
ENCODER_PROBE_NOTE = "the repeated-token probe measures left-to-right copying; skipped for encoder models"


@dataclass(frozen=True)
class HeadRecord:
    layer: int
    head: int
    scores: dict[str, float]
    role: roles.Role

    @property
    def label(self) -> str:
        return f"{self.layer}.{self.head}"


@dataclass
class AttentionMap:
    """One window's full attention for one layer: maps (H, n, n) float32 on the host, with token labels."""

    layer: int
    maps: Any
    tokens: list[str]
    text_index: int


@dataclass
class HeadsResult:
    model: dict[str, Any]
    inputs: dict[str, Any]
    window: int
    thresholds: dict[str, float]
    heads: list[HeadRecord]
    notes: list[str] = field(default_factory=list)
    attention: dict[int, AttentionMap] = field(default_factory=dict)  # layer -> maps of the first window


def check_selection(
    sort: str | None, top: int | None, causal: bool | None = None, probe: bool = True
) -> str | None:
    """The score `--sort` names (dashes read as underscores), checked with `--top` before any work is done; with
    `causal` known (after the model is loaded), also that this kind of model, with or without the probe, measures
    that score."""
    if top is not None and top < 1:
        raise AttnscopeError("--top must be at least 1")
    if sort is None:
        return None
    name = sort.strip().replace("-", "_")
    known = metrics.ALL_SCORES + PROBE_SCORES
    if name not in known:
        raise AttnscopeError(f"--sort '{sort}': use one of {', '.join(known)}")
    if causal is None:
        return name
    if name in metrics.ENCODER_SCORES and causal:
        raise AttnscopeError(f"--sort {sort}: that score is measured for encoder (BERT-type) models only")
    if name in PROBE_SCORES and not causal:
        raise AttnscopeError(f"--sort {sort}: that score comes from the probe, which is skipped for encoder models")
    if name in PROBE_SCORES and not probe:
        raise AttnscopeError(f"--sort {sort}: that score comes from the probe, which --no-probe turned off")
    return name


def select_heads(
    heads: Sequence[HeadRecord], layer: int | None = None, sort: str | None = None, top: int | None = None
) -> list[HeadRecord]:
    """Heads of one layer (or all), sorted by a score (descending, ties in layer.head order), the first `top`."""
    name = check_selection(sort, top)
    selected = [record for record in heads if layer is None or record.layer == layer]
    if name is not None:
        if selected and selected[0].scores[name] is None:
            raise AttnscopeError(f"--sort {sort}: that score was not measured for this model or run")
        selected.sort(key=lambda record: -record.scores[name])
    if top is not None:
        selected = selected[:top]
    return selected


def parse_head(label: str, n_layer: int, n_head: int) -> tuple[int, int]:
    """`L.H` (0-based, as in the literature: `4.11`) checked against the model's shape."""
    layer_text, sep, head_text = label.strip().partition(".")
    if not sep or not layer_text.isdigit() or not head_text.isdigit():
        raise AttnscopeError(f"head '{label}': expected LAYER.HEAD such as 4.11 (0-based)")
    layer, head = int(layer_text), int(head_text)
    if layer >= n_layer:
        raise AttnscopeError(f"head '{label}': layer {layer} is out of range (this model has layers 0-{n_layer - 1})")
    if head >= n_head:
        raise AttnscopeError(f"head '{label}': head {head} is out of range (this model has heads 0-{n_head - 1})")
    return layer, head


def check_layer(layer: int, n_layer: int) -> int:
    if not 0 <= layer < n_layer:
        raise AttnscopeError(f"layer {layer} is out of range (this model has layers 0-{n_layer - 1})")
    return layer


def input_summary(texts: Sequence[Text], tokenized: Tokenized, scored_rows: int | None = None) -> dict[str, Any]:
    summary = {
        "n_texts": len(texts),
        "n_windows": len(tokenized.windows),
        "n_tokens": tokenized.n_tokens,
        "bos": tokenized.bos,
        "sources": [item.source for item in texts],
    }
    if scored_rows is not None:
        summary["scored_rows"] = scored_rows
    return summary


def _run_windows(
    loaded: LoadedModel,
    tokenized: Tokenized,
    reducer: capture.Reducer,
    batch_size: int,
    max_tokens: int | None,
    progress: Progress | None,
    keep_layers: Sequence[int] = (),
    flush: Callable[[Any], None] | None = None,
) -> capture.Captured:
    """Forward this process's share of the windows (every N-th under torchrun) in batches, reducing as it goes."""
    from attnscope import distributed

    place = distributed.world()
    mine = tokenized.windows[place.rank :: place.size]  # window 0, whose maps pictures use, is rank 0's
    windows_left = Counter(window.text_index for window in mine)  # text -> its windows not yet run
    total_texts, total_tokens = len(windows_left), sum(len(window.ids) for window in mine)
    done = [0, 0]  # texts, tokens

    def after_batch(batch) -> None:
        if flush is not None:
            flush(batch)
        for index in batch.indices:
            text = mine[index].text_index
            windows_left[text] -= 1
            done[0] += windows_left[text] == 0
        done[1] += sum(len(mine[index].ids) for index in batch.indices)
        if progress is not None:
            progress(done[0], done[1], total_texts, total_tokens)

    return capture.run(
        loaded.model,
        batches(mine, batch_size, loaded.device, _pad_id(loaded.tokenizer), max_tokens),
        reducer,
        keep_layers=keep_layers,
        keep_window=0 if place.rank == 0 else None,
        on_batch=after_batch,
    )


def _pad_id(tokenizer: Any) -> int:
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return token_id
    return 0


def analyze_heads(
    loaded: LoadedModel,
    texts: Sequence[Text],
    window: int = metrics.DEFAULT_WINDOW,
    bos: bool | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    thresholds: Mapping[str, float] = roles.DEFAULT_THRESHOLDS,
    keep_layers: Sequence[int] = (),
    probe: bool = True,
    probe_len: int | None = None,
    probe_seed: int = 0,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    progress: Progress | None = None,
) -> HeadsResult:
    """Every head's statistics over `texts` and its role; full maps of `keep_layers` for the first window.

    With `probe`, one more short forward pass on the repeated-random-token probe of period `probe_len` (None:
    DEFAULT_PROBE_LEN, or less when twice that does not fit the context) adds the `induction` and
    `duplicate_token` scores; without it they are None, as they are for encoders (the probe is skipped with a
    note). `next_token` and `last_token` are measured for encoders only (None for decoders).
    """
    from attnscope import distributed
    from attnscope.stats import HeadStatistics

    if window < 1:
        raise AttnscopeError("--window must be at least 1")
    tokenized = tokenize(loaded.tokenizer, texts, loaded.n_ctx, bos)
    notes = list(tokenized.notes)
    probe_input = None
    if probe and not loaded.causal:
        notes.append(ENCODER_PROBE_NOTE)
    elif probe:
        if probe_len is None:
            probe_len = min(DEFAULT_PROBE_LEN, (loaded.n_ctx - 1) // 2)
            if probe_len < DEFAULT_PROBE_LEN:
                notes.append(f"probe period shortened to {probe_len} tokens to fit the context of {loaded.n_ctx}")
        # built before the texts run, so that a bad --probe-len or --probe-seed stops the command at once
        probe_input = probe_windows(loaded.tokenizer, probe_len, loaded.n_ctx, probe_seed)
    statistics = HeadStatistics(loaded.n_layer, loaded.n_head, loaded.device, window, loaded.causal)
    captured = _run_windows(loaded, tokenized, statistics, batch_size, max_tokens, progress, keep_layers)
    distributed.all_reduce_sum(statistics.sums, statistics.uniform_sum, statistics.row_count)
    if int(statistics.row_count) == 0:
        raise AttnscopeError(_too_short(loaded, "score"))
    means = statistics.means()
    summary = input_summary(texts, tokenized, int(statistics.row_count))
    if probe_input is not None:
        probe_means, summary["probe"] = probe_scores(loaded, probe_input, probe_len, probe_seed)
        means.update(probe_means)
    heads = []
    for layer in range(loaded.n_layer):
        for head in range(loaded.n_head):
            scores = {name: float(means[name][layer, head]) for name in metrics.SCORES}
            for name in metrics.ENCODER_SCORES + PROBE_SCORES:
                scores[name] = float(means[name][layer, head]) if name in means else None
            heads.append(HeadRecord(layer, head, scores, roles.classify(scores, thresholds)))
    first = tokenized.windows[0]
    labels = token_labels(loaded.tokenizer, first.ids)
    attention = {
        layer: AttentionMap(layer, maps, labels, first.text_index) for layer, maps in captured.maps.items()
    }
    return HeadsResult(
        model=loaded.info(),
        inputs=summary,
        window=window,
        # only the roles this kind of model can be given (a decoder's JSON is what it was before encoders)
        thresholds={role: value for role, value in thresholds.items() if role in roles.roles_for(not loaded.causal)},
        heads=heads,
        notes=notes,
        attention=attention,
    )


def _too_short(loaded: LoadedModel, what: str) -> str:
    if loaded.causal:
        return f"every text is a single token once tokenized; give at least two tokens to {what}"
    return (
        f"no text has a token between the first and the last of its window; give at least one token to {what} "
        "(with --bos, [CLS] and [SEP] are added around it)"
    )


def probe_scores(
    loaded: LoadedModel, windows: Sequence[Any], period: int, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Induction and duplicate-token scores of every head, name -> (n_layer, n_head), from one forward pass over
    the probe `windows` (tokens.probe_windows with this `period` and `seed`: seeded random sequences of `period`
    tokens repeated twice); and a summary for the JSON."""
    from attnscope.stats import ProbeStatistics

    first_query = len(windows[0].ids) - period  # BOS (when any) + the first copy
    statistics = ProbeStatistics(loaded.n_layer, loaded.n_head, loaded.device, period, first_query)
    capture.run(loaded.model, batches(windows, len(windows), loaded.device), statistics)
    summary = {"period": period, "sequences": PROBE_SEQUENCES, "seed": seed, "scored_rows": int(statistics.row_count)}
    return statistics.means(), summary


def layer_attention(
    loaded: LoadedModel, text: Text, layer: int, bos: bool | None = None
) -> tuple[AttentionMap, list[str]]:
    """One layer's full attention maps for one text (its first window when it is longer than the context)."""
    maps, notes = attention_maps(loaded, text, [layer], bos)
    return maps[layer], notes


def attention_maps(
    loaded: LoadedModel, text: Text, layers: Sequence[int], bos: bool | None = None
) -> tuple[dict[int, AttentionMap], list[str]]:
    """Full attention maps of `layers` for one text (its first window when it is longer than the context), from
    one forward pass: layer -> AttentionMap."""
    for layer in layers:
        check_layer(layer, loaded.n_layer)
    tokenized = tokenize(loaded.tokenizer, [text], loaded.n_ctx, bos)
    notes = list(tokenized.notes)
    if len(tokenized.windows) > 1:
        notes.append("showing the first window only")
    first = tokenized.windows[:1]
    captured = capture.run(
        loaded.model, batches(first, 1, loaded.device, _pad_id(loaded.tokenizer)), None, keep_layers=layers, keep_window=0
    )
    labels = token_labels(loaded.tokenizer, first[0].ids)
    return {layer: AttentionMap(layer, captured.maps[layer], labels, 0) for layer in layers}, notes


DEFAULT_REDUNDANT = 0.1  # bits: heads whose rows differ by less than a tenth of the way to disjoint
DEFAULT_CLUSTER_AT = 0.3  # bits: average-linkage merges below this form a cluster (--layer all)
ALL_LAYERS_BUDGET = 64 * 2**20  # bytes of all layers' attention held at once for --layer all (one window at least)


@dataclass
class DiversityResult:
    """Pairwise similarity of the heads `labels` (one layer's, or all heads of the model in layer.head order).

    Matrices are (K, K) numpy float64: `cosine`, `js` (mean JSD per scored row, bits) and `js_distance` (mean of
    its square root per row). `layer_scores`: layer -> mean JSD over the pairs of its heads.
    """

    model: dict[str, Any]
    inputs: dict[str, Any]
    layer: int | None  # None: all layers
    labels: list[str]
    cosine: Any
    js: Any
    js_distance: Any
    layer_scores: dict[int, float]
    redundant: float
    groups: list[list[str]]  # near-duplicate heads: JSD below `redundant`, joined transitively
    order: list[int]  # heads ordered so that similar ones sit together (average linkage)
    clusters: list[list[str]]  # average-linkage clusters below `cluster_at`
    cluster_at: float
    notes: list[str] = field(default_factory=list)

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

    def ranked_pairs(self, k: int, most_similar: bool) -> list[dict[str, Any]]:
        """The k most redundant (lowest JSD) or most distinct (highest JSD) pairs; ties in label order."""
        pairs = self.pairs()
        pairs.sort(key=lambda pair: pair["js"] if most_similar else -pair["js"])
        return pairs[:k]


def parse_layer_choice(text: str | None, n_layer: int) -> int | None:
    """`--layer N` or `--layer all` (None)."""
    if text is None:
        raise AttnscopeError("--layer is required: a layer number (0-based) or 'all'")
    if text.strip().lower() == "all":
        return None
    if not text.strip().isdigit():
        raise AttnscopeError(f"--layer '{text}': expected a layer number (0-based) or 'all'")
    return check_layer(int(text), n_layer)


def analyze_diversity(
    loaded: LoadedModel,
    texts: Sequence[Text],
    layer: int | None,
    bos: bool | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    redundant: float = DEFAULT_REDUNDANT,
    cluster_at: float = DEFAULT_CLUSTER_AT,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    progress: Progress | None = None,
) -> DiversityResult:
    """Cosine and Jensen–Shannon similarity between the heads of `layer` (None: all heads of the model)."""
    import numpy as np

    from attnscope import distributed, groups
    from attnscope.stats import DiversityStatistics

    if not 0.0 < redundant <= 1.0:
        raise AttnscopeError("--redundant is a JS divergence in bits: between 0 (excluded) and 1")
    if not 0.0 < cluster_at <= 1.0:
        raise AttnscopeError("--cluster-at is a JS divergence in bits: between 0 (excluded) and 1")
    layers = list(range(loaded.n_layer)) if layer is None else [layer]
    tokenized = tokenize(loaded.tokenizer, texts, loaded.n_ctx, bos)
    notes = list(tokenized.notes)
    if layer is None:  # all layers' maps of a batch are held at once: size batches to the budget
        longest = max(len(window.ids) for window in tokenized.windows)
        per_window = loaded.n_layer * loaded.n_head * longest * longest * 4
        fitting = max(1, ALL_LAYERS_BUDGET // per_window)
        batch_size = min(batch_size, fitting)
    statistics = DiversityStatistics(layers, loaded.n_head, loaded.device, loaded.causal)
    _run_windows(loaded, tokenized, statistics, batch_size, max_tokens, progress, flush=statistics.flush)
    distributed.all_reduce_sum(statistics.dots, statistics.js, statistics.js_root, statistics.row_count)
    if int(statistics.row_count) == 0:
        raise AttnscopeError(_too_short(loaded, "compare"))
    matrices = {name: value.numpy() for name, value in statistics.results().items()}
    labels = [f"{layer_}.{head}" for layer_ in layers for head in range(loaded.n_head)]
    H = loaded.n_head
    layer_scores = {}
    for index, layer_ in enumerate(layers):
        block = matrices["js"][index * H : (index + 1) * H, index * H : (index + 1) * H]
        upper = block[np.triu_indices(H, k=1)]
        layer_scores[layer_] = float(upper.mean()) if upper.size else float("nan")
    linkage = groups.average_linkage(matrices["js"])
    return DiversityResult(
        model=loaded.info(),
        inputs=input_summary(texts, tokenized, int(statistics.row_count)),
        layer=layer,
        labels=labels,
        cosine=matrices["cosine"],
        js=matrices["js"],
        js_distance=matrices["js_distance"],
        layer_scores=layer_scores,
        redundant=redundant,
        groups=[[labels[k] for k in group] for group in groups.near_duplicate_groups(matrices["js"], redundant)],
        order=linkage.order,
        clusters=[[labels[k] for k in group] for group in groups.clusters(linkage, cluster_at)],
        cluster_at=cluster_at,
        notes=notes,
    )
