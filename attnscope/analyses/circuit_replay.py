"""circuit's removals, exact and cheap (`removal_changes`): every batch runs once, and is replayed from the layer of
each removed head only.

Removing head A of layer l changes nothing below l, nor layer l's attention. So each batch runs once, with hooks
noting what every layer received (its hidden states and arguments) and each layer's heads' outputs z (the output
projection's input: `pipeline.interventions.LayerInputsRecorder`); then, for each A, the forward is replayed from
layer l only: the attention module of layer l returns the projection of the noted z with A's slice replaced as the
ablation says (`pipeline.ablation`: 0, A's mean, or the donor windows' z; what `HeadGates` feeds the projection:
`pipeline.interventions.ReplacedAttention`), the rest of layer l (its MLP, norms,
residual sums) and the layers above run as the model runs them, their attention captured with the capture's
streaming statistics (no map kept), and the replay stops right after the attention of the last layer holding an
explained head (`StopAfterAttention`: what follows changes no score). Only the layers with an explained head above l
are scored. The probe is replayed the same way. A removal in layer l costs layer l's MLP, the layers between and the
top layer's attention; the naive way (`analyses.circuit_naive`: one full forward per removed head) costs every layer
every time. Removals of one layer are replayed together, as copies of the batch (`interventions.MAX_COPY_TOKENS`), each
copy scored by its own reducer (on a GPU; see COPIES_ON_THE_CPU). The two agree to float rounding (tests).

Under torchrun the removals are shared: every process runs every batch once (and the ablation's preparation), and
replays every N-th removal only; the means of each removal are gathered, in order, on every process (`_mine`). On
the CPU (one removal per replay) the changes are one process's, bit for bit; on GPUs, where the removals of a layer
are replayed together as copies, a process's copies are fewer than one process's, and a matmul over another number
of rows may round its last bit otherwise.

What replaces A's output costs the replays nothing: mean ablation's means come from one pass over the input before
(`Ablation.prepare`: one forward of the layers below the top one per batch); resample's donors run once per batch,
beside the batch's own pass (one forward of the donor windows up to the top layer's heads, their z kept while the
batch's removals replay), so each removal still replays from A's layer only, whatever the mode.

Here too live what the naive way shares with the replay, so that both score the same inputs the same way: the
inputs as the heads analysis runs them (`sources_of`, one `Source` each for the texts and the probes), the explained
heads checked (`check_explained`) and split by input (`layers_by_source`), and the changes assembled (`assemble`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.analyses.common import Progress, check_finite, too_short
from attnscope.errors import AttnscopeError
from attnscope.models.loading import LoadedModel
from attnscope.pipeline import distributed, interventions
from attnscope.pipeline.ablation import Ablation
from attnscope.pipeline.blocks import Reducer
from attnscope.pipeline.inputs import AnyTexts, Text, Texts
from attnscope.scores import catalog

# Removals of one layer replayed at once, as copies of a batch (up to `interventions.MAX_COPY_TOKENS`, as `ablate`
# runs its configurations); on a GPU the replay of a short batch then costs one pass of its layers (their kernel
# launches and Python), not one per removed head. Not on the CPU, where a pass costs its arithmetic whatever the
# batch, and the copies' larger activations fall out of the caches: GPT-2 small's 132 removals of 2 × 128 tokens took
# 35.8 s of CPU time as copies, 32.4 s one by one (one thread).
COPIES_ON_THE_CPU = False
Explained = tuple[int, int, str]  # (layer, head, score name) of a head B


class _Copies(Reducer):
    """The reducer of a replay that runs `len(inner)` copies of a batch of `batch` windows at once, copy c with its
    own head removed: copy c's windows (c·batch .. (c+1)·batch) go to `inner[c]`, and only the layers in `layers`
    (the ones holding an explained head): the replays score nothing else."""

    def __init__(self, inner: Sequence[Any], layers: Iterable[int], batch: int):
        self.inner = list(inner)
        self.layers = frozenset(layers)
        self.batch = batch
        self.wants_blocks = self.inner[0].wants_blocks
        self.summed_keys = self.inner[0].summed_keys

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
                    item.name: value if value is None or isinstance(value, int) else value[part]
                    for item in dataclasses.fields(rows)
                    for value in (getattr(rows, item.name),)
                }  # every tensor of LayerRows is one row per window first (the layer's window is a number)
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


def _replay(
    loaded: LoadedModel,
    recorded: interventions.LayerInputsRecorder,
    layer: int,
    heads: Sequence[int],
    top: int,
    state: Any,
    replacement: Any = None,
) -> list[int]:
    """Run layers `layer` .. `top` again from the noted inputs, as len(`heads`) copies of the batch, copy c with head
    `heads[c]` of `layer` removed: its output replaced by `replacement` ((B or 1, n or 1, H, d_head), see
    `pipeline.ablation`; None: 0); the attention of the layers above goes to `state`'s reducer. Returns the layers
    whose attention ran (for the check)."""
    import torch

    family, network = loaded.family, loaded.model
    layers = family.layers(network)
    projection = family.output_projections(network)[layer]
    inside = family.output_projection.startswith(family.attention + ".")  # GPT-2, Llama: yes; BERT: the next module
    z, (is_tuple, rest) = recorded.z[layer], recorded.outputs[layer]
    B, n, width = z.shape
    k = len(heads)

    def removed(*args: Any, **kwargs: Any) -> Any:
        H = loaded.n_head
        kept = z.repeat(k, 1, 1).view(k, B, n, H, width // H)  # (k, B, n, H, d_head)
        copies, removed_heads = torch.arange(k, device=z.device), torch.as_tensor(heads, device=z.device)
        if replacement is None:
            kept[copies, :, :, removed_heads] = 0  # copy c without head heads[c], as HeadGates
        else:  # copy c with head heads[c]'s output replaced, as HeadGates with its replacements
            r = replacement[:, :n].to(z.dtype).expand(B, n, H, width // H)  # (B, n, H, d_head)
            kept[copies, :, :, removed_heads] = r[:, :, removed_heads].permute(2, 0, 1, 3)  # (k, B, n, d_head)
        kept = kept.view(k * B, n, width)
        output = projection(kept) if inside else kept
        return (output, *rest) if is_tuple else output

    # layer `layer`'s attention returns the heads kept; the top layer's is scored, and what follows it changes no score
    replay = interventions.ReplacedAttention(layer, removed), interventions.StopAfterAttention(top)
    with interventions.hooks(loaded, *replay):
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
        except interventions.Stop:
            pass
    return state.layers_seen


@dataclass
class Source:
    """One input the scores are measured on: the texts (HeadStatistics), the repeated-token probe (ProbeStatistics)
    or the needle probe (RetrievalStatistics)."""

    batches: Callable[[], Iterable[Any]]  # the batches, made when the pass starts
    reducer: Callable[[], Any]  # a fresh reducer
    means: Callable[[Any, int], dict[str, Any]]  # a reducer's means, given the scored rows of the base pass
    count: Callable[[Any], int]  # the scored rows a base reducer counted


def removal_pass(
    loaded: LoadedModel,
    source: Source,
    layers: Sequence[int],
    after_batch: Callable[[Any], None] | None = None,
    ablation: Ablation | None = None,
) -> tuple[dict[str, Any], dict[tuple[int, int], dict[str, Any]]]:
    """The base means, and the means with each head A of a layer below max(`layers`) removed (scored only on the
    `layers` above A's), of every batch of `source`: each batch runs once, then is replayed from each A's layer, A's
    output replaced as `ablation` (prepared on `source`) says (None: 0)."""
    from attnscope.pipeline import capture
    from attnscope.pipeline.blocks import CaptureState

    network, H = loaded.model, loaded.n_head
    top = max(layers)
    base = source.reducer()
    place = distributed.working()  # under torchrun, this process replays every N-th removal (see `_mine`)
    removed = {key: source.reducer() for key in _mine(top, H, place)}
    geometry: dict[tuple, tuple] = {}
    notes: dict[str, set[int]] = {}

    def state_of(reducer: Any, lengths: Any) -> CaptureState:
        return CaptureState(reducer, lengths, kernel=loaded.kernel, run_geometry=geometry, run_notes=notes)

    with capture.capturing(network):
        for batch in source.batches():
            replacements = None if ablation is None else ablation.for_batch(batch)  # layer -> (B|1, n|1, H, d_head)
            recorded = interventions.LayerInputsRecorder(top)
            state = state_of(base, batch.lengths)
            with interventions.hooks(loaded, recorded):
                network(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                    attnscope_state=state,
                )  # fmt: skip
            _check_seen(state.layers_seen, range(loaded.n_layer))
            B, n = batch.input_ids.shape
            per_pass = max(1, interventions.MAX_COPY_TOKENS // (B * n))  # removals replayed at once, as copies
            if batch.input_ids.device.type == "cpu" and not COPIES_ON_THE_CPU:
                per_pass = 1
            for a in range(top):
                above = [layer for layer in layers if layer > a]
                mine = [h for layer, h in removed if layer == a]
                for first in range(0, len(mine), per_pass):
                    heads = mine[first : first + per_pass]
                    reducer = _Copies([removed[(a, h)] for h in heads], above, B)
                    lengths = batch.lengths.repeat(len(heads))  # (k·B,)
                    replacement = None if replacements is None else replacements[a]
                    seen = _replay(loaded, recorded, a, heads, max(above), state_of(reducer, lengths), replacement)
                    _check_seen(seen, range(a + 1, max(above) + 1))
                    reducer.end_run()  # scored now: nothing of a replay is kept past it
            del recorded, replacements
            if after_batch is not None:
                after_batch(batch)
        base.end_run()
    count = source.count(base)
    if count == 0:
        raise AttnscopeError(too_short(loaded, "score"))
    means = distributed.gather([(key, source.means(reducer, count)) for key, reducer in removed.items()])
    return source.means(base, count), dict(means)


def _mine(top: int, n_head: int, place: distributed.World) -> list[tuple[int, int]]:
    """The removals (layer, head) below layer `top` this process replays: every one for one process; under
    torchrun, every N-th in layer.head order from this process's rank (so that each process replays heads of every
    layer, the costly low ones as the cheap high ones). Every process runs every batch once, as one process does, so
    each removal is replayed exactly as one process replays it; the means are gathered in order (`removal_pass`)."""
    removals = [(a, h) for a in range(top) for h in range(n_head)]
    return distributed.share(removals, place.rank, place.size)


def _check_seen(seen: Sequence[int], expected: Iterable[int]) -> None:
    if sorted(seen) != list(expected):
        raise AttnscopeError(
            "the attention of some layers did not go through transformers' attention interface, so attnscope cannot "
            "see it; this model cannot be analysed exactly"
        )


def sources_of(loaded: LoadedModel, texts: Texts | Sequence[Text], heads: Any, progress: Progress | None) -> dict:
    """The texts' and the probes' `Source`, as the heads analysis runs them (its windows, batches and probes)."""
    from attnscope.pipeline.needle import needle_for
    from attnscope.pipeline.probe import probe_for
    from attnscope.pipeline.reducers import HeadStatistics, ProbeStatistics, RetrievalStatistics
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
        catalog.ROWS: Source(
            text_batches,
            lambda: HeadStatistics(kind, L, H, device, heads.window),
            text_means,
            lambda reducer: int(reducer.row_count),
        )
    }
    probe, _ = probe_for(loaded, heads.probe, heads.probe_len, heads.probe_seed)
    if probe is not None:
        windows, period, first_query = probe.windows, probe.period, probe.first_query

        def probe_means(reducer: Any, count: int) -> dict[str, Any]:
            means = reducer.sums.cpu() / count
            return {name: means[..., k] for k, name in enumerate(rows.PROBE_SCORES)}

        sources[catalog.PROBE] = Source(
            lambda: batches(windows, len(windows), device),
            lambda: ProbeStatistics(L, H, device, period, first_query),
            probe_means,
            lambda reducer: int(reducer.row_count),
        )
    needle, _ = needle_for(loaded, heads.probe, heads.haystack_len, heads.probe_seed)
    if needle is not None:
        _, starts = needle.batch(device)  # the windows' order in their one batch, the same each time it is made

        sources[catalog.NEEDLE] = Source(
            lambda: iter([needle.batch(device)[0]]),
            lambda: RetrievalStatistics(L, H, device, needle.first_query, starts),
            lambda reducer, count: {"retrieval": reducer.hits.cpu().double() / count},
            lambda reducer: int(reducer.row_count),
        )
    sources["stream"] = stream
    return sources


def _source_of(score: str) -> str:
    """The input a score is measured on: a probe's (catalog.PROBE, catalog.NEEDLE) or the texts' (catalog.ROWS, the
    derived scores included)."""
    source = catalog.score_named(score).source
    return source if source in catalog.PROBES else catalog.ROWS


def layers_by_source(explained: Sequence[Explained]) -> dict[str, list[int]]:
    """The layers holding an explained head, per source (texts or probe)."""
    layers: dict[str, set[int]] = {}
    for layer, _, score in explained:
        layers.setdefault(_source_of(score), set()).add(layer)
    return {source: sorted(found) for source, found in layers.items()}


def assemble(
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


def check_explained(loaded: LoadedModel, explained: Sequence[Explained], sources: dict) -> None:
    for layer, head, score in explained:
        if layer == 0:
            raise AttnscopeError(f"head {layer}.{head} is in layer 0: no head comes before it")
        source = _source_of(score)
        if source not in sources:
            which = "needle probe" if source == catalog.NEEDLE else "repeated-token probe"
            raise AttnscopeError(f"score {score} comes from the {which}, which is off or cannot run")


def removal_changes(
    loaded: LoadedModel,
    texts: AnyTexts,
    explained: Sequence[Explained],
    heads: Any,
    progress: Progress | None = None,
    *,
    ablation: str,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact removal of every head A below each explained head B, replayed from A's layer (module docstring), A's
    output replaced as `ablation` (zero, mean, resample with `seed`: `pipeline.ablation`) says, on each input (the
    texts, the probe) its own: with_values (n,), changes (n, L, H)."""
    sources = sources_of(loaded, texts, heads, progress)
    check_explained(loaded, explained, sources)
    stream, tokens = sources["stream"], [0]

    def after_batch(batch: Any) -> None:
        tokens[0] += sum(len(window.ids) for window in batch.windows)
        if progress is not None:
            progress(stream.n_texts, tokens[0], stream.share())

    base, removed = {}, {}
    for source, layers in layers_by_source(explained).items():
        replacing = Ablation(loaded, ablation, seed, top=max(layers)).prepare(sources[source].batches)
        base[source], removed[source] = removal_pass(
            loaded, sources[source], layers, after_batch if source == catalog.ROWS else None, replacing
        )
    with_values, changes = assemble(loaded, explained, base, removed)
    check_finite(loaded, "attention", np.concatenate([with_values, changes.ravel()]))
    return with_values, changes
