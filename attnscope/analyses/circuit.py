"""`attnscope circuit`: which heads each head depends on, by removing every earlier head and scoring it again.

For every explained head B and every head A of an earlier layer: B's score with A, without A (A's slice of the
output projection's input zeroed, exactly as `ablate` removes a head: `HeadGates`), and the change, on the same
texts and the same repeated-token probe as `heads`. B's score is its deciding score by default (the score that gave
it its role; for a `mixed` head, the score that came closest to its role's threshold), or the one `score` names.

    change(B, A) = score_B(A removed) − score_B(every head kept)          (B's layer > A's layer; 0 otherwise)

Removal (`removal_changes`), exact and cheap. Removing A in layer l changes nothing below l, nor layer l's
attention: each batch runs once, with hooks noting what every layer received (its hidden states and arguments) and
each layer's heads' outputs z (the output projection's input); then, for each A, the forward is replayed from
layer l only: the attention module of layer l returns the projection of the noted z with A's slice zeroed (what
`HeadGates` feeds the projection), the rest of layer l (its MLP, norms, residual sums) and the layers above run as
the model runs them, their attention captured with the capture's streaming statistics (no map kept), and the replay
stops right after the attention of the last layer holding an explained head (what follows changes no score). Only
the layers with an explained head above l are scored. The probe is replayed the same way. A removal in layer l
costs layer l's MLP, the layers between and the top layer's attention; the naive way (`naive_changes`: one full
forward of the texts and the probe per removed head, gated by `HeadGates`, the heads analysis run again) costs
every layer every time. Removals of one layer are replayed together, as copies of the batch (MAX_COPY_TOKENS),
each copy scored by its own reducer (on a GPU; see COPIES_ON_THE_CPU). The two agree to float rounding (tests).

    gradient: attribution patching, the first-order estimate (`attnscope.analyses.circuit_gradient`)

Both share one signature (`CHANGES`): (loaded, texts, explained [(layer, head, score name)], heads settings) ->
(with_values (n,), changes (n, L, H)), changes exactly 0 where A's layer >= B's layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from attnscope import options
from attnscope.analyses.common import (
    Progress,
    check_finite,
    head_label,
    parse_head,
    too_short,
)
from attnscope.analyses.heads import Scoring, sort_score
from attnscope.analyses.result import Result
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape
from attnscope.models.loading import LoadedModel
from attnscope.pipeline import interventions
from attnscope.pipeline.inputs import Text, Texts
from attnscope.scores import catalog

METHODS = options.CIRCUIT_METHODS
DEFAULT_TOP = 10  # dependencies listed per explained head
# Removals of one layer replayed at once, as copies of a batch (up to `interventions.MAX_COPY_TOKENS`, as `ablate`
# runs its configurations); on a GPU the replay of a short batch then costs one pass of its blocks (its
# kernel launches and Python), not one per removed head. Not on the CPU, where a pass costs its arithmetic whatever
# the batch, and the copies' larger blocks fall out of the caches: GPT-2 small's 132 removals of 2 × 128 tokens took
# 35.8 s of CPU time as copies, 32.4 s one by one (one thread).
COPIES_ON_THE_CPU = False
Explained = tuple[int, int, str]  # (layer, head, score name) of a head B


# ------------------------------------------------------------------------------------------------- removal


class _Copies:
    """The reducer of a replay that runs `len(inner)` copies of a batch of `batch` windows at once, copy c with its
    own head removed: copy c's windows (c·batch .. (c+1)·batch) go to `inner[c]`, and only the layers in `layers`
    (the ones holding an explained head): the replays score nothing else."""

    def __init__(self, inner: Sequence[Any], layers: Iterable[int], batch: int):
        self.inner = list(inner)
        self.layers = frozenset(layers)
        self.batch = batch
        self.wants_blocks = self.inner[0].wants_blocks

    def keys_to_gather(self, positions, lengths):
        return self.inner[0].keys_to_gather(positions, lengths)  # every copy's reducer asks for the same keys

    def _part(self, copy: int) -> slice:
        return slice(copy * self.batch, (copy + 1) * self.batch)

    def add_block(self, layer: int, block: Any) -> None:
        if layer in self.layers:
            for copy, reducer in enumerate(self.inner):
                part = self._part(copy)
                reducer.add_block(
                    layer,
                    dataclasses.replace(
                        block,
                        exp_logits=block.exp_logits[part],
                        normalizer=block.normalizer[part],
                        lengths=block.lengths[part],
                    ),
                )

    def add_layer(self, layer: int, rows: Any) -> None:
        if layer in self.layers:
            for copy, reducer in enumerate(self.inner):
                part = self._part(copy)
                sliced = {
                    item.name: None if getattr(rows, item.name) is None else getattr(rows, item.name)[part]
                    for item in dataclasses.fields(rows)
                }  # every field of LayerRows is one row per window first
                reducer.add_layer(layer, type(rows)(**sliced))

    def end_run(self) -> None:
        for reducer in self.inner:
            reducer.end_run()


def _copied(value: Any, batch: int, copies: int) -> Any:
    """A layer's argument for `copies` copies of a batch of `batch` windows: every tensor of two dimensions or more
    whose first is the batch's (hidden states, masks, rotary tables, position ids; with more than one window, one
    of 1 for every window alike is left to broadcast), repeated along it; in tuples, lists and dicts likewise;
    anything else as it is."""
    if copies == 1:
        return value
    if isinstance(value, dict):
        return {key: _copied(item, batch, copies) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_copied(item, batch, copies) for item in value)
    if hasattr(value, "dim") and value.dim() >= 2 and value.shape[0] == batch:
        return value.repeat(copies, *([1] * (value.dim() - 1)))  # (copies·B, ...)
    return value


class _Recorder:
    """Hooks that note, while one batch runs forward, what a replay from layer l needs: what each layer up to `top`
    received (its arguments, the hidden states cloned), each layer's heads' outputs z below `top` (the output
    projection's input, (B, n, H·d_head)), and the form of each attention module's output."""

    def __init__(self, loaded: LoadedModel, top: int):
        family, network = loaded.family, loaded.model
        self.calls: dict[int, tuple[tuple, dict]] = {}
        self.z: dict[int, Any] = {}
        self.outputs: dict[int, tuple[bool, tuple]] = {}  # layer -> (a tuple?, the elements after the first)
        layers = family.layers(network)[: top + 1]
        self.handles = [module.register_forward_pre_hook(self._call(layer), with_kwargs=True) for layer, module in
                        enumerate(layers)]  # fmt: skip
        for layer in range(top):
            self.handles.append(family.output_projections(network)[layer].register_forward_pre_hook(self._z(layer)))
            self.handles.append(family.attention_modules(network)[layer].register_forward_hook(self._output(layer)))

    def _call(self, layer: int) -> Callable:
        def record(module, args, kwargs):
            if args:
                args = (args[0].clone(), *args[1:])
            else:
                kwargs = {**kwargs, "hidden_states": kwargs["hidden_states"].clone()}
            self.calls[layer] = (args, dict(kwargs))

        return record

    def _z(self, layer: int) -> Callable:
        def record(module, args):
            self.z[layer] = args[0].clone()  # (B, n, H·d_head)

        return record

    def _output(self, layer: int) -> Callable:
        def record(module, args, output):
            is_tuple = isinstance(output, tuple)
            self.outputs[layer] = (is_tuple, tuple(output[1:]) if is_tuple else ())

        return record

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class _Stop(Exception):
    """Raised by a hook when a replay has computed all it needs, to leave the layer it is in."""


def _replay(
    loaded: LoadedModel, recorded: _Recorder, layer: int, heads: Sequence[int], top: int, state: Any
) -> list[int]:
    """Run layers `layer` .. `top` again from the noted inputs, as len(`heads`) copies of the batch, copy c with head
    `heads[c]` of `layer` removed; the attention of the layers above goes to `state`'s reducer. Returns the layers
    whose attention ran (for the check)."""
    import torch

    family, network = loaded.family, loaded.model
    layers = family.layers(network)
    attention = family.attention_modules(network)[layer]
    projection = family.output_projections(network)[layer]
    inside = family.output_projection.startswith(family.attention + ".")  # GPT-2, Llama: yes; BERT: the next module
    z, (is_tuple, rest) = recorded.z[layer], recorded.outputs[layer]
    B, n, width = z.shape
    k = len(heads)

    def removed(*args: Any, **kwargs: Any) -> Any:
        kept = z.repeat(k, 1, 1).view(k, B, n, loaded.n_head, width // loaded.n_head)  # (k, B, n, H, d_head)
        copies, removed_heads = torch.arange(k, device=z.device), torch.as_tensor(heads, device=z.device)
        kept[copies, :, :, removed_heads] = 0  # copy c without head heads[c], as HeadGates
        kept = kept.view(k * B, n, width)
        output = projection(kept) if inside else kept
        return (output, *rest) if is_tuple else output

    def stop(module: Any, args: Any, output: Any) -> None:
        raise _Stop  # the top layer's attention is scored: what follows it in the layer changes no score

    attention.forward = removed  # an instance attribute: nn.Module.__call__ finds it first
    last = family.attention_modules(network)[top].register_forward_hook(stop)
    try:
        args, kwargs = recorded.calls[layer]
        hidden = _copied(args[0] if args else kwargs["hidden_states"], B, k)
        for j in range(layer, top + 1):
            args, kwargs = recorded.calls[j]
            kwargs = {**_copied(kwargs, B, k), "attnscope_state": state}
            if args:
                output = layers[j](hidden, *_copied(args[1:], B, k), **kwargs)
            else:
                output = layers[j](**{**kwargs, "hidden_states": hidden})
            hidden = output[0] if isinstance(output, (tuple, list)) else output
    except _Stop:
        pass
    finally:
        last.remove()
        del attention.forward
    return state.layers_seen


@dataclass
class _Source:
    """One input the scores are measured on: the texts (HeadStatistics) or the probe (ProbeStatistics)."""

    batches: Callable[[], Iterable[Any]]  # the batches, made when the pass starts
    reducer: Callable[[], Any]  # a fresh reducer
    means: Callable[[Any, int], dict[str, Any]]  # a reducer's means, given the scored rows of the base pass
    count: Callable[[Any], int]  # the scored rows a base reducer counted


def _removal_pass(
    loaded: LoadedModel, source: _Source, layers: Sequence[int], after_batch: Callable[[Any], None] | None = None
) -> tuple[dict[str, Any], dict[tuple[int, int], dict[str, Any]]]:
    """The base means, and the means with each head A of a layer below max(`layers`) removed (scored only on the
    `layers` above A's), of every batch of `source`: each batch runs once, then is replayed from each A's layer."""
    from attnscope.pipeline import capture
    from attnscope.pipeline.blocks import CaptureState

    network, H = loaded.model, loaded.n_head
    top = max(layers)
    base = source.reducer()
    removed = {(a, h): source.reducer() for a in range(top) for h in range(H)}
    geometry: dict[tuple, tuple] = {}
    notes: dict[str, set[int]] = {}

    def state_of(reducer: Any, lengths: Any) -> CaptureState:
        return CaptureState(reducer, lengths, kernel=loaded.kernel, run_geometry=geometry, run_notes=notes)

    with capture.capturing(network):
        for batch in source.batches():
            recorded = _Recorder(loaded, top)
            try:
                state = state_of(base, batch.lengths)
                network(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                    attnscope_state=state,
                )  # fmt: skip
            finally:
                recorded.remove()
            _check_seen(state.layers_seen, range(loaded.n_layer))
            B, n = batch.input_ids.shape
            per_pass = max(1, interventions.MAX_COPY_TOKENS // (B * n))  # removals replayed at once, as copies
            if batch.input_ids.device.type == "cpu" and not COPIES_ON_THE_CPU:
                per_pass = 1
            for a in range(top):
                above = [layer for layer in layers if layer > a]
                for first in range(0, H, per_pass):
                    heads = list(range(first, min(H, first + per_pass)))
                    reducer = _Copies([removed[(a, h)] for h in heads], above, B)
                    lengths = batch.lengths.repeat(len(heads))  # (k·B,)
                    seen = _replay(loaded, recorded, a, heads, max(above), state_of(reducer, lengths))
                    _check_seen(seen, range(a + 1, max(above) + 1))
                    reducer.end_run()  # scored now: nothing of a replay is kept past it
            del recorded
            if after_batch is not None:
                after_batch(batch)
        base.end_run()
    count = source.count(base)
    if count == 0:
        raise AttnscopeError(too_short(loaded, "score"))
    return source.means(base, count), {key: source.means(reducer, count) for key, reducer in removed.items()}


def _check_seen(seen: Sequence[int], expected: Iterable[int]) -> None:
    if sorted(seen) != list(expected):
        raise AttnscopeError(
            "the attention of some layers did not go through transformers' attention interface, so attnscope cannot "
            "see it; this model cannot be analysed exactly"
        )


def _sources(loaded: LoadedModel, texts: Texts | Sequence[Text], heads: Any, progress: Progress | None) -> dict:
    """The texts' and the probe's `_Source`, as the heads analysis runs them (its windows, batches and probe)."""
    from attnscope.analyses.heads import default_probe_period
    from attnscope.pipeline.probe import probe_windows
    from attnscope.pipeline.reducers import HeadStatistics, ProbeStatistics
    from attnscope.pipeline.tokens import WindowStream, batches, pad_id
    from attnscope.scores import rows

    L, H, device = loaded.n_layer, loaded.n_head, loaded.device
    kind = loaded.kind
    stream = WindowStream(loaded, texts, heads.bos)

    def text_batches() -> Iterable[Any]:
        return batches(stream, heads.batch_size, device, pad_id(loaded.tokenizer), heads.max_tokens)

    def text_means(reducer: Any, count: int) -> dict[str, Any]:
        return rows.finish(kind, reducer.sums.cpu(), reducer.uniform_sum.cpu(), count)

    sources = {
        catalog.ROWS: _Source(
            text_batches,
            lambda: HeadStatistics(kind, L, H, device, heads.window),
            text_means,
            lambda reducer: int(reducer.row_count),
        )
    }
    period = heads.probe_len
    if heads.probe and kind.probe and period is None:
        period, _ = default_probe_period(loaded)
    if heads.probe and kind.probe and period is not None:
        windows = probe_windows(loaded.tokenizer, period, loaded.n_ctx, heads.probe_seed)
        first_query = len(windows[0].ids) - period

        def probe_means(reducer: Any, count: int) -> dict[str, Any]:
            means = reducer.sums.cpu() / count
            return {name: means[..., k] for k, name in enumerate(rows.PROBE_SCORES)}

        sources[catalog.PROBE] = _Source(
            lambda: batches(windows, len(windows), device),
            lambda: ProbeStatistics(L, H, device, period, first_query),
            probe_means,
            lambda reducer: int(reducer.row_count),
        )
    sources["stream"] = stream
    return sources


def _source_of(score: str) -> str:
    return catalog.PROBE if catalog.score_named(score).source == catalog.PROBE else catalog.ROWS


def _split(explained: Sequence[Explained]) -> dict[str, list[int]]:
    """The layers holding an explained head, per source (texts or probe)."""
    layers: dict[str, set[int]] = {}
    for layer, _, score in explained:
        layers.setdefault(_source_of(score), set()).add(layer)
    return {source: sorted(found) for source, found in layers.items()}


def _assemble(
    loaded: LoadedModel,
    explained: Sequence[Explained],
    base: dict[str, dict[str, Any]],
    removed: dict[str, dict[tuple[int, int], dict[str, Any]]],
) -> tuple[np.ndarray, np.ndarray]:
    """(with (n,), changes (n, L, H)) from the base means and the means with each head removed, per source."""
    L, H = loaded.n_layer, loaded.n_head
    with_values = np.zeros(len(explained))
    changes = np.zeros((len(explained), L, H))
    for i, (layer, head, score) in enumerate(explained):
        source = _source_of(score)
        with_values[i] = float(base[source][score][layer, head])
        for a in range(layer):
            for h in range(H):
                changes[i, a, h] = float(removed[source][(a, h)][score][layer, head]) - with_values[i]
    return with_values, changes


def _check_explained(loaded: LoadedModel, explained: Sequence[Explained], sources: dict) -> None:
    for layer, head, score in explained:
        if layer == 0:
            raise AttnscopeError(f"head {layer}.{head} is in layer 0: no head comes before it")
        if _source_of(score) not in sources:
            raise AttnscopeError(f"score {score} comes from the repeated-token probe, which is off or cannot run")


def removal_changes(
    loaded: LoadedModel,
    texts: Texts | Sequence[Text],
    explained: Sequence[Explained],
    heads: Any,
    progress: Progress | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact removal of every head A below each explained head B, replayed from A's layer (module docstring):
    with_values (n,), changes (n, L, H)."""
    sources = _sources(loaded, texts, heads, progress)
    _check_explained(loaded, explained, sources)
    stream, tokens = sources["stream"], [0]

    def after_batch(batch: Any) -> None:
        tokens[0] += sum(len(window.ids) for window in batch.windows)
        if progress is not None:
            progress(stream.n_texts, tokens[0], stream.share())

    base, removed = {}, {}
    for source, layers in _split(explained).items():
        base[source], removed[source] = _removal_pass(
            loaded, sources[source], layers, after_batch if source == catalog.ROWS else None
        )
    with_values, changes = _assemble(loaded, explained, base, removed)
    check_finite(loaded, "attention", np.concatenate([with_values, changes.ravel()]))
    return with_values, changes


def _naive_pass(
    loaded: LoadedModel, source: _Source, layers: Sequence[int]
) -> tuple[dict[str, Any], dict[tuple[int, int], dict[str, Any]]]:
    """As `_removal_pass`, the naive way: every batch of `source` runs whole once with every head, then once more for
    each head A of a layer below max(`layers`), A gated off by `HeadGates`, every layer scored."""
    import torch

    from attnscope.pipeline import capture

    L, H = loaded.n_layer, loaded.n_head

    def reduced() -> Any:
        reducer = source.reducer()
        capture.run(loaded.model, source.batches(), reducer, kernel=loaded.kernel)
        return reducer

    base = reduced()
    count = source.count(base)
    if count == 0:
        raise AttnscopeError(too_short(loaded, "score"))
    removed = {}
    gates = interventions.HeadGates()
    with interventions.hooks(loaded, gates):
        for a in range(max(layers)):
            for h in range(H):
                gates.values = torch.ones(1, L, H, device=loaded.device)  # (1, L, H): every window alike
                gates.values[0, a, h] = 0
                removed[(a, h)] = source.means(reduced(), count)
    return source.means(base, count), removed


def naive_changes(
    loaded: LoadedModel,
    texts: Texts | Sequence[Text],
    explained: Sequence[Explained],
    heads: Any,
    progress: Progress | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The reference: for each head A below an explained head, the texts and the probe run whole again with A's
    slice of the output projection's input zeroed (`HeadGates`, as `ablate` removes a head), every layer scored."""
    sources = _sources(loaded, texts, heads, progress)
    _check_explained(loaded, explained, sources)
    base, removed = {}, {}
    for name, layers in _split(explained).items():
        base[name], removed[name] = _naive_pass(loaded, sources[name], layers)
    return _assemble(loaded, explained, base, removed)


def timed_pass(loaded: LoadedModel, batches: Sequence[Any], naive: bool = False) -> dict[tuple[int, int], Any]:
    """What `attnscope bench` times (methods circuit and circuit-naive): every head of layer 1 and above explained by
    its row statistics on `batches` (the texts' statistics; the probe left out, as bench's `attnscope` method leaves
    it out), each earlier head removed by replay or the naive way; the means with each head removed."""
    from attnscope.pipeline.reducers import HeadStatistics
    from attnscope.scores import rows

    kind, L, H = loaded.kind, loaded.n_layer, loaded.n_head
    source = _Source(
        lambda: batches,
        lambda: HeadStatistics(kind, L, H, loaded.device),
        lambda reducer, count: rows.finish(kind, reducer.sums.cpu(), reducer.uniform_sum.cpu(), count),
        lambda reducer: int(reducer.row_count),
    )
    layers = list(range(1, L))
    return (_naive_pass if naive else _removal_pass)(loaded, source, layers)[1]


def gradient_changes(*args: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
    """`--method gradient`: attnscope.analyses.circuit_gradient.gradient_changes, imported when first asked for."""
    from attnscope.analyses.circuit_gradient import gradient_changes

    return gradient_changes(*args, **kwargs)


CHANGES: dict[str, Callable] = {"removal": removal_changes, "gradient": gradient_changes}  # the methods, by name


# ------------------------------------------------------------------------------------------------- the analysis


@dataclass
class CircuitResult(Result):
    """Which heads each explained head depends on.

    explained: [(layer, head, score)] of each head B; with_values (n,) its score with every head; changes (n, L, H)
    the change of that score when head A is removed (0 where A's layer >= B's); heads: one record per head of the
    model (label, layer, head, role, the score a head is explained by or decided by, copying, direct_effect);
    composition (scores.composition.Composition, or None without the weights) and its random baseline."""

    model: dict[str, Any]
    inputs: dict[str, Any]
    settings: dict[str, Any]
    explained: list[Explained]
    with_values: np.ndarray
    changes: np.ndarray
    heads: list[dict[str, Any]]
    composition: Any = None
    baseline: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def top(self) -> int:
        return self.settings["top"]

    def dependencies(self, top: int | None = None) -> list[dict[str, Any]]:
        """One record per pair (B, A earlier), B in layer.head order; within B, by change, the most negative first
        (the heads B needs most), ties in A's layer.head order. `top` keeps each B's `top` largest |change|."""
        _, L, H = self.changes.shape
        records = []
        for i, (layer, head, score) in enumerate(self.explained):
            pairs = [(a, h) for a in range(layer) for h in range(H)]
            if top is not None:
                pairs = sorted(pairs, key=lambda ah: (-abs(self.changes[i][ah]), ah))[:top]
            pairs.sort(key=lambda ah: (self.changes[i][ah], ah))
            for a, h in pairs:
                change = float(self.changes[i, a, h])
                records.append(
                    {
                        "label": f"{layer}.{head}",
                        "on": f"{a}.{h}",
                        "score": score,
                        "with": float(self.with_values[i]),
                        "without": float(self.with_values[i]) + change,
                        "change": change,
                    }
                )
        return records

    def edges(
        self, threshold: float, per_head: int, limit: int
    ) -> tuple[list[tuple[int, int, int, int, float]], int, int]:
        """The dependencies to draw, as (layer A, head A, layer B, head B, change): those with |change| >=
        `threshold`, each head B's `per_head` largest, the `limit` largest of all; and how many pairs fell below
        the threshold, and how many passed it but were left out by the two limits."""
        _, _, H = self.changes.shape
        passing, below, over = [], 0, 0
        for i, (layer, head, _) in enumerate(self.explained):
            mine = []
            for a in range(layer):
                for h in range(H):
                    change = float(self.changes[i, a, h])
                    if abs(change) >= threshold:
                        mine.append((a, h, layer, head, change))
                    else:
                        below += 1
            mine.sort(key=lambda edge: (-abs(edge[4]), edge[:4]))
            passing += mine[:per_head]
            over += max(0, len(mine) - per_head)
        passing.sort(key=lambda edge: (-abs(edge[4]), edge[:4]))
        return passing[:limit], below, over + max(0, len(passing) - limit)

    def composition_records(self) -> list[dict[str, Any]]:
        return [] if self.composition is None else self.composition.records()


def _head_labels(heads: Any) -> tuple[str, ...]:
    """The heads B named, `L.H` labels (a string alone is one head; None: none), each checked for its form."""
    items = () if heads is None else (heads,) if isinstance(heads, str) else heads
    if isinstance(items, (bytes, Mapping)) or not isinstance(items, Iterable):
        raise AttnscopeError(f"head {options.shown(heads)}: expected heads such as ['1.0', '2.3'] (LAYER.HEAD)")
    labels = []
    for label in items:
        if not isinstance(label, str):
            raise AttnscopeError(f"head {options.shown(label)}: expected a head such as '1.0' (LAYER.HEAD, 0-based)")
        head_label(label)
        labels.append(label.strip())
    return tuple(labels)


@dataclass(frozen=True)
class Circuit(Scoring):
    """Settings of a circuit analysis (see the module docstring); `run` checks what needs the model first.

    score: one score explained for every head B (None: each head's deciding score); head: the heads B explained,
    `L.H` labels (empty: every head of layer 1 and above); top: dependencies listed per head B; method: removal
    (exact) or gradient (attribution patching); steps: the gradient's integration points (0: the gradient with
    every head kept, attribution patching proper; N: integrated gradients over N points, N times the cost, closer to
    removal where a softmax saturates); weights: also the composition and copying scores from the weights
    and each head's direct effect (needs the language-model head). The rest are the heads analysis's settings."""

    score: str | None = None
    head: Sequence[str] | None = None  # a tuple once built
    top: int = DEFAULT_TOP
    method: str = "removal"
    weights: bool = True
    steps: int = 0  # gradient: 0, the gradient at every head kept; N, integrated gradients over N points
    OPTIONS: ClassVar[dict[str, options.Option]] = {
        **Scoring.SCORING_OPTIONS,
        "top": options.TOP,
        "method": options.CIRCUIT_METHOD,
        "weights": options.FLAG,
        "steps": options.STEPS,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.score is not None:
            object.__setattr__(self, "score", sort_score(options.check_text(self.score, "score")).name)
        object.__setattr__(self, "head", _head_labels(self.head))
        if self.steps and self.method != "gradient":
            raise AttnscopeError("steps (--steps) are the gradient's integration points: give method gradient too")

    @property
    def needs_lm_head(self) -> bool:
        return self.weights  # the unembedding of the copying scores, the logits of the direct effects

    def check_shape(self, shape: Shape) -> None:
        """The heads B (in range, above layer 0), the model has more than one layer, the score its kind measures:
        from the config before the weights load, and again."""
        if shape.n_layer < 2:
            raise AttnscopeError("this model has one layer: no head has an earlier head to depend on")
        for label in self.head:
            layer, head = parse_head(label, shape.n_layer, shape.n_head)
            if layer == 0:
                raise AttnscopeError(f"head {label}: it is in layer 0, and no head comes before it to depend on")
        if self.score is not None and shape.kind_name is not None:
            score = catalog.score_named(self.score)
            if shape.kind_name not in score.kinds:
                measured = " and ".join(f"{name}s" for name in sorted(score.kinds))
                raise AttnscopeError(f"score {self.score}: that score is measured for {measured} only")
            if score.source == catalog.PROBE and not self.probe:
                raise AttnscopeError(f"score {self.score}: that score comes from the probe, which is off")

    def run(
        self, loaded: LoadedModel, texts: Texts | Sequence[Text], progress: Progress | None = None
    ) -> CircuitResult:
        self.check_shape(loaded.shape)
        L, H = loaded.n_layer, loaded.n_head
        heads = self.heads_settings()
        base = heads.run(loaded, texts, progress)  # every head's scores and role
        chosen = [head_label(label) for label in self.head] or [(a, h) for a in range(1, L) for h in range(H)]
        chosen = list(dict.fromkeys(chosen))
        records = {(record.layer, record.head): record for record in base.heads}
        explained = []
        for layer, head in sorted(chosen):
            record = records[(layer, head)]
            score = self.score or record.role.metric
            if record.scores.get(score) is None:
                raise AttnscopeError(f"score {score} of head {layer}.{head} was not measured (see the notes of heads)")
            explained.append((layer, head, score))
        function = CHANGES[self.method]
        # the removal pass reports its progress (the texts' pass again, the longest); the gradient takes its steps
        shown = {"progress": progress} if self.method == "removal" else {"steps": self.steps}
        with_values, changes = function(loaded, texts, explained, heads, **shown)
        with_values, changes = np.asarray(with_values, dtype=np.float64), np.asarray(changes, dtype=np.float64)
        notes = list(base.notes)
        composition = baseline = copying = effects = None
        if self.weights:
            from attnscope.analyses.composition import weight_circuits
            from attnscope.analyses.direct_effect import direct_effects

            circuits = weight_circuits(loaded, readers=[(layer, head) for layer, head, _ in explained])
            composition, baseline, copying = circuits.composition, circuits.baseline, circuits.copying
            notes += circuits.notes
            found = direct_effects(loaded, texts, self.bos, self.batch_size, self.max_tokens)
            effects = found.heads
            notes += [note for note in found.notes if note not in notes]
        explained_scores = {(layer, head): score for layer, head, score in explained}
        head_records = []
        for record in base.heads:
            key = (record.layer, record.head)
            score = explained_scores.get(key, record.role.metric)
            head_records.append(
                {
                    "label": record.label,
                    "layer": record.layer,
                    "head": record.head,
                    "role": record.role.role,
                    "explained": key in explained_scores,
                    "score": score,
                    "value": record.scores.get(score),
                    "copying": None if copying is None else float(copying[key]),
                    "direct_effect": None if effects is None else float(effects[key]),
                }
            )
        settings = {
            "score": self.score,
            "head": list(self.head),
            "top": self.top,
            "method": self.method,
            "steps": self.steps,
            "weights": self.weights,
            "window": self.window,
            "thresholds": base.settings["thresholds"],
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "probe": self.probe,
            "probe_len": self.probe_len,
            "probe_seed": self.probe_seed,
        }
        return CircuitResult(
            model=base.model,
            inputs=base.inputs,
            settings=settings,
            explained=explained,
            with_values=with_values,
            changes=changes,
            heads=head_records,
            composition=composition,
            baseline=baseline,
            notes=notes,
        )
