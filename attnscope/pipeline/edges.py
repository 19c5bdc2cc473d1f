"""A decoder run edge by edge (`attnscope discover`): every node's output recorded, a circuit run with the edges
outside it taking the ablated run's values, and the gradient of the metric at every input of every node.

The graph is `models.graph.Graph`. The residual stream a node reads is the sum of what the nodes before it wrote:

    h_l = embed + Σ_{l' < l} (attention_{l'} + mlp_{l'})

so the input of node v with the edges u → v outside a circuit C ablated is that sum with those nodes' outputs
replaced by their ablated values a_u (the corrupted run's, or a mean):

    r_v = h_l − Σ_{u → v ∉ C} (c_u − a_u)            c_u: u's output in this run

as MIB's evaluation builds it (hannamw/MIB-circuit-track, `evaluate_graph.py`). What a node writes:

    embed        layer 0's input (token and position embeddings, scaled as the family scales them)
    head L.H     its share of the attention's output: o_h = z_h W_O^h + b_O / H (z_h its slice of the output
                 projection's input, the bias shared equally), through what follows the output projection: Granite's
                 residual multiplier m; where the attention's output is normalised before the residual sum (Gemma 2
                 and 3, OLMo 2, EXAONE 4: P(x) = m · norm(x), x = Σ_h o_h), the heads' shares do not add up linearly,
                 so a layer's attention contributes P(x − Σ_{h ∉ C} (o_h − a_h)) − P(x) to r_v, recomputed for every
                 input (as MIB does for Gemma 2)
    mlp L        what the layer adds beside its attention: h_{l+1} − h_l − P(x), whatever the MLP's own norms

Each kind of hook is installed with `interventions.hooks`:

    NodeRecorder    every node's output in one run (the clean run, the ablated run)
    DifferenceRecorder  the clean run's outputs minus the ablated ones, as they come: what the gradients need
    PatchedEdges    a run of the circuits in `removed`, one per copy of the batch (copy-major, as
                    `interventions.PatchedHeads`): each input of each copy built as above. Where no edge into a
                    layer's attention is removed, the layer runs unchanged; where one is, its queries, keys and values
                    are computed input by input: each query, key and value head from its own stream, normalised by
                    the layer's own norm module, through its columns of the projection (the family's own rotary,
                    QK-norm, soft-capping, sliding window and sinks follow, unchanged)
    EdgeGradients   the model's own forward (no input split), the embeddings moved to a point α of the way from the
                    ablated run's to the clean run's (integrated gradients on the inputs, Hanna et al. 2024), and in
                    the backward pass the gradient of the metric at every input, dotted with every upstream node's
                    difference c_u(clean) − a_u and summed over positions, added into `scores` (U, V): the
                    attribution-patching estimate of each edge (Syed et al. 2023). A query, key or value input's
                    gradient is its columns' gradient through its rows of the projection and the layer's norm, so no
                    (edges × positions × width) tensor and no split forward is ever made. A head whose layer's output
                    is normalised takes the norm's Jacobian at this run's x: J_P(x) (o_h − a_h).

Stage: pipeline (imports models); torch inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.models.families import module_at
from attnscope.models.graph import Graph
from attnscope.models.weights import (
    Norm,
    at_least_float32,
    out_in,
    output_norms,
    projection_groups,
    read_norm,
    reading_norms,
    residual_multiplier,
    weight_paths,
)
from attnscope.pipeline.interventions import RestoredForward

if TYPE_CHECKING:
    from attnscope.models.loading import LoadedModel


# ------------------------------------------------------------------------------------------------- the layout


@dataclass
class Projection:
    """A module computing some of a layer's queries, keys and values: its columns in groups of d_head, each reading
    one input of the layer (`inputs`, the layer's input numbering, `models.graph`); its weight (G, d_head, d) and
    bias (G, d_head) by group."""

    module: Any
    inputs: Any  # (G,) long
    weight: Any
    bias: Any


@dataclass
class LayerParts:
    """What `discover` reads and hooks in one decoder layer."""

    module: Any
    read_norm: Any  # the module normalising the attention's input (None: it reads the stream itself)
    read_math: Norm | None  # its formulas (for the gradient through it)
    projections: list[Projection]
    output_projection: Any
    W_O: Any  # (H, d_head, d)  head h's rows of the output projection, "z @ W" form
    b_O: Any  # (d,) or None
    output_norm: Any  # the module normalising the attention's output before the residual sum (None: none)
    output_math: Norm | None  # its formulas (for its Jacobian)
    mlp_reads: Any  # the module whose first input is the MLP's stream (its norm, or the MLP)
    shared_norm: Any  # the attention's norm, applied to the MLP's stream first (Phi, Cohere), or None
    shared_math: Norm | None


@dataclass
class Layout:
    """Where a loaded decoder's nodes read and write (see the module docstring), read once per run."""

    graph: Graph
    layers: list[LayerParts]
    final_norm: Any
    multiplier: float  # Granite's residual multiplier (1 elsewhere)
    normalised: frozenset[int]  # the layers whose attention output passes a norm before the residual sum

    @classmethod
    def of(cls, loaded: LoadedModel) -> Layout:
        """The layout of a loaded decoder; one AttnscopeError for a model whose stream is not a sum of its nodes'
        outputs (an encoder, a post-norm decoder)."""
        family, network = loaded.family, loaded.model
        paths = weight_paths(loaded)
        if family.mlp is None:
            raise AttnscopeError(f"discover reads decoders; this {family.name} model is an encoder")
        if paths.post_norms:
            raise AttnscopeError(
                f"this {family.name} model normalises the residual stream after each layer (post-norm, as OPT-350m), "
                "so the stream is not the sum of what its nodes wrote and its edges cannot be told apart; discover "
                "reads pre-norm decoders"
            )
        reads, outputs = reading_norms(loaded), output_norms(loaded)
        layers = [
            _layer_parts(loaded, paths, layer, module, reads[layer], outputs[layer])
            for layer, module in enumerate(family.layers(network))
        ]
        graph = Graph(loaded.n_layer, loaded.n_head, loaded.n_kv_head, family.mlp.is_parallel(loaded.config))
        normalised = frozenset(layer for layer, norm in enumerate(outputs) if norm is not None)
        final = module_at(network, paths.final_norm)
        return cls(graph, layers, final, residual_multiplier(loaded), normalised)

    def post(self, layer: int, x: Any) -> Any:
        """What the residual stream receives from layer `layer`'s attention output x (the output projection's)."""
        norm = self.layers[layer].output_norm
        written = x if norm is None else norm(x)
        return written * self.multiplier if self.multiplier != 1.0 else written


def _layer_parts(loaded: LoadedModel, paths: Any, layer: int, module: Any, read: Norm | None, output: Norm | None):
    import torch

    H, K, d_head = loaded.n_head, loaded.n_kv_head, loaded.d_head
    projections = []
    for projection, inputs in projection_groups(module, paths, H, K):
        weight, bias = out_in(projection)  # (G·d_head, d)
        groups = len(inputs)
        projections.append(
            Projection(
                projection,
                torch.tensor(inputs, device=weight.device),
                weight.reshape(groups, d_head, weight.shape[1]),
                None if bias is None else bias.reshape(groups, d_head),
            )
        )
    output_projection = loaded.family.output_projections(loaded.model)[layer]
    weight, bias = out_in(output_projection)  # (d, H·d_head)
    mlp = loaded.family.mlp
    shared = None if mlp.shared_norm is None else module_at(module, mlp.shared_norm)
    return LayerParts(
        module=module,
        read_norm=None if read is None else read.module,
        read_math=read,
        projections=projections,
        output_projection=output_projection,
        W_O=weight.T.reshape(H, d_head, weight.shape[0]),
        b_O=bias,
        output_norm=None if output is None else output.module,
        output_math=output,
        mlp_reads=module_at(module, mlp.reads),
        shared_norm=shared,
        shared_math=None if shared is None else read_norm(shared, f"{layer}.{mlp.shared_norm}", paths.rms_offset),
    )


# ------------------------------------------------------------------------------------------------- records


@dataclass
class NodeRecord:
    """Every node's output in one run of a batch (B, n), float32: `embed` (B, n, d); per layer `heads` (H, B, n, d)
    (o_h, before what follows the output projection), `attention` (B, n, d) the output projection's output x, `mlp`
    (B, n, d). A record of means (`mean_record`) has B = n = 1."""

    embed: Any
    heads: list[Any]
    attention: list[Any]
    mlp: list[Any]

    def streams(self, layout: Layout) -> list[Any]:
        """Per upstream node (graph order), what it writes into the stream, (B, n, d); None for the heads of a layer
        whose attention output is normalised (they do not add up: see the module docstring)."""
        outputs: list[Any] = [self.embed]
        for layer in range(layout.graph.n_layer):
            if layer in layout.normalised:
                outputs += [None] * layout.graph.n_head
            elif layout.multiplier == 1.0:
                outputs += list(self.heads[layer])
            else:
                outputs += list(self.heads[layer] * layout.multiplier)
            outputs.append(self.mlp[layer])
        return outputs

    def summed(self) -> NodeRecord:
        """Every output summed over the batch and the positions, float64, kept (…, 1, 1, d): what `mean_record`
        divides."""

        def total(tensor: Any) -> Any:
            return tensor.double().sum(dim=(-3, -2), keepdim=True)

        return NodeRecord(
            total(self.embed), [total(h) for h in self.heads], [total(x) for x in self.attention],
            [total(m) for m in self.mlp],
        )  # fmt: skip

    def __add__(self, other: NodeRecord) -> NodeRecord:
        return NodeRecord(
            self.embed + other.embed,
            [a + b for a, b in zip(self.heads, other.heads, strict=True)],
            [a + b for a, b in zip(self.attention, other.attention, strict=True)],
            [a + b for a, b in zip(self.mlp, other.mlp, strict=True)],
        )

    def mean(self, count: int, dtype: Any) -> NodeRecord:
        """A record of sums (`summed`, added) over `count` positions as a record of means in `dtype`."""
        return NodeRecord(
            (self.embed / count).to(dtype), [(h / count).to(dtype) for h in self.heads],
            [(x / count).to(dtype) for x in self.attention], [(m / count).to(dtype) for m in self.mlp],
        )  # fmt: skip


class _Layers:
    """The hooks every kind shares: a pre-hook on each layer (its input h_l: `entered`), a pre-hook on each output
    projection (the heads' z: `heads`), a forward hook on it (the attention's output x: `attention`), a forward hook
    on each layer (what it returned, whence the MLP's output: `mlp`). Layers below `first` are skipped
    (interventions.SkippedLayers: they compute nothing) and their hooks do nothing."""

    first = 0
    records_mlp = True  # the MLPs' outputs are wanted (`mlp` is called)

    def __init__(self, layout: Layout):
        self.layout = layout
        self.streams: dict[int, Any] = {}  # layer -> its input h_l (C·B, n, d)
        self.x: dict[int, Any] = {}  # layer -> its attention's output x

    def install(self, loaded: LoadedModel) -> Iterator[Any]:
        for layer, parts in enumerate(self.layout.layers):
            yield parts.module.register_forward_pre_hook(self._entered(layer), with_kwargs=True)
            yield parts.output_projection.register_forward_pre_hook(self._heads(layer))
            yield parts.output_projection.register_forward_hook(self._attention(layer))
            yield parts.module.register_forward_hook(self._left(layer))

    def _entered(self, layer: int) -> Callable:
        def hook(module, args, kwargs):
            if layer < self.first:
                return None
            hidden = args[0] if args else kwargs["hidden_states"]
            self.streams[layer] = hidden
            replaced = self.entered(layer, hidden)
            if replaced is None:
                return None
            self.streams[layer] = replaced
            if args:
                return (replaced, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": replaced}

        return hook

    def _heads(self, layer: int) -> Callable:
        def hook(module, args):
            if layer >= self.first:
                self.heads(layer, args[0])

        return hook

    def _attention(self, layer: int) -> Callable:
        def hook(module, args, output):
            if layer >= self.first:
                if self.records_mlp:  # kept for `mlp`, which needs what the attention added
                    self.x[layer] = output
                self.attention(layer, output)

        return hook

    def _left(self, layer: int) -> Callable:
        def hook(module, args, output):
            if layer < self.first or not self.records_mlp:
                return
            out = output[0] if isinstance(output, tuple) else output
            added = self.layout.post(layer, self.x.pop(layer).detach())
            self.mlp(layer, at_least_float32(out.detach() - self.streams[layer].detach() - added))

        return hook

    def head_outputs(self, layer: int, z: Any) -> Any:
        """(H, B, n, d) float32: o_h = z_h W_O^h + b_O / H from the output projection's input z (B, n, H·d_head)."""
        import torch

        parts = self.layout.layers[layer]
        H, d_head, _ = parts.W_O.shape
        heads = z.detach().reshape(*z.shape[:2], H, d_head)  # (B, n, H, d_head)
        o = at_least_float32(torch.einsum("bnhk,hkd->hbnd", heads, parts.W_O.to(z.dtype)))  # (H, B, n, d)
        return o if parts.b_O is None else o + at_least_float32(parts.b_O) / H

    # what each kind does at each point (nothing by default)
    def entered(self, layer: int, hidden: Any) -> Any:
        """Layer `layer` receives `hidden` (B, n, d); a replacement, or None."""
        return None

    def heads(self, layer: int, z: Any) -> None: ...

    def attention(self, layer: int, x: Any) -> None: ...

    def mlp(self, layer: int, output: Any) -> None: ...


class NodeRecorder(_Layers):
    """Every node's output of one run: `record` (a NodeRecord) once the run has ended."""

    def __init__(self, layout: Layout):
        super().__init__(layout)
        L = layout.graph.n_layer
        self.record = NodeRecord(None, [None] * L, [None] * L, [None] * L)

    def entered(self, layer: int, hidden: Any) -> Any:
        if layer == 0:
            self.record.embed = at_least_float32(hidden.detach())
        return None

    def heads(self, layer: int, z: Any) -> None:
        self.record.heads[layer] = self.head_outputs(layer, z)

    def attention(self, layer: int, x: Any) -> None:
        self.record.attention[layer] = at_least_float32(x.detach())

    def mlp(self, layer: int, output: Any) -> None:
        self.record.mlp[layer] = output


@dataclass
class Differences:
    """What the gradients of one batch need, and only that: `delta` (U, B·n·d), each upstream node's clean output
    minus its ablated value in the stream (c_u − a_u; zero rows for the heads of a normalised layer, whose
    differences before the norm are `heads[layer]`, (H, B·n·d)); the embeddings of both runs, `start` (ablated) and
    `end` (clean), between which the gradients' runs move."""

    delta: Any
    heads: dict[int, Any]
    start: Any
    end: Any = None

    @property
    def tokens(self) -> tuple[int, int, int]:
        return tuple(self.start.shape)

    @classmethod
    def from_means(cls, layout: Layout, means: NodeRecord, tokens: tuple[int, int, int]) -> Differences:
        """−a_u for every node from a record of means, broadcast to the batch's `tokens` (B, n, d): what the clean
        run's outputs are then added to."""
        import torch

        B, n, d = tokens
        graph = layout.graph
        streams = means.streams(layout)
        delta = torch.zeros(graph.n_upstream, B * n * d, dtype=means.embed.dtype, device=means.embed.device)
        for u, mean in enumerate(streams):
            if mean is not None:
                delta[u] = -mean.expand(B, n, d).reshape(-1)
        heads = {
            layer: -means.heads[layer].expand(-1, B, n, d).reshape(graph.n_head, -1) for layer in layout.normalised
        }
        return cls(delta, heads, means.embed.expand(B, n, d))


class DifferenceRecorder(_Layers):
    """Adds `sign` times each node's output of one run into `differences`, as it comes: the corrupted run with sign
    −1 makes them (−a_u), the clean run with +1 completes them (c_u − a_u). One buffer of one record's size: the
    two runs' records never exist whole."""

    def __init__(self, layout: Layout, differences: Differences | None, sign: float):
        super().__init__(layout)
        self.differences, self.sign = differences, sign

    def entered(self, layer: int, hidden: Any) -> Any:
        import torch

        if layer != 0:
            return None
        embed = at_least_float32(hidden.detach())
        if self.differences is None:
            B, n, d = hidden.shape
            delta = torch.zeros(self.layout.graph.n_upstream, B * n * d, dtype=embed.dtype, device=embed.device)
            self.differences = Differences(delta, {}, embed)
        else:
            self.differences.end = embed
        self.differences.delta[0].add_(embed.reshape(-1), alpha=self.sign)
        return None

    def heads(self, layer: int, z: Any) -> None:
        graph, differences = self.layout.graph, self.differences
        heads = self.head_outputs(layer, z).reshape(graph.n_head, -1)  # (H, B·n·d)
        if layer in self.layout.normalised:
            if layer in differences.heads:
                differences.heads[layer].add_(heads, alpha=self.sign)
            else:
                differences.heads[layer] = heads.mul_(self.sign)
        else:
            first = graph.head_index(layer, 0)
            differences.delta[first : first + graph.n_head].add_(heads, alpha=self.sign * self.layout.multiplier)

    def mlp(self, layer: int, output: Any) -> None:
        self.differences.delta[self.layout.graph.mlp_index(layer)].add_(output.reshape(-1), alpha=self.sign)


# ------------------------------------------------------------------------------------------------- circuits


class PatchedEdges(_Layers):
    """A run of C circuits at once, one per copy of the batch of B rows (copy-major): in copy c, each edge u → v with
    `removed[c, u, v]` takes u's value in `ablated` (see the module docstring).

    `removed` is a (C, U, V) bool tensor on the model's device. `ablated` is the ablated run's NodeRecord (or a
    record of means); `clean`, where layers below `first` are skipped (`interventions.SkippedLayers`), is the clean
    run's record, whose outputs stand for theirs. Inputs with no removed edge in any copy are left as the model
    computes them."""

    def __init__(self, layout: Layout, removed: Any, ablated: NodeRecord, clean: NodeRecord | None = None, first=0):
        super().__init__(layout)
        self.removed = removed
        self.copies = removed.shape[0]
        self.ablated = ablated
        self.clean = clean
        self.first = first
        graph = layout.graph
        # an upstream node's difference is kept only if an input has a removed edge from it
        self._needed = removed.any(dim=(0, 2)).tolist()
        self._delta: Any = None  # (C or 1, U, B·n·d): c_u − a_u per upstream node (rows of normalised heads: 0)
        self._pending: dict[int, Any] = {}  # normalised layer -> its heads' o_h (H, C·B, n, d) until x comes
        self._pre: dict[int, Any] = {}  # normalised layer -> (C or 1, H, B·n·d) o_h − a_h
        self._x: dict[int, Any] = {}  # normalised layer -> (C or 1, B, n, d) its x in this run
        self._split: dict[int, Any] = {}  # layer -> (C·B, n, G, d): its attention's inputs, normalised
        self._mlp_removed: dict[int, Any] = {}  # layer -> what its MLP's removed edges from before it take away
        self._head_rows = [graph.head_index(layer, 0) for layer in range(graph.n_layer)]

    def install(self, loaded: LoadedModel) -> Iterator[Any]:
        yield from super().install(loaded)
        for layer, parts in enumerate(self.layout.layers):
            for projection in parts.projections:
                yield RestoredForward(projection.module, self._projection(layer, projection))
            yield parts.mlp_reads.register_forward_pre_hook(self._mlp_input(layer))
        yield self.layout.final_norm.register_forward_pre_hook(self._logits_input)

    # ---------------------------------------------------------------- differences

    def _start(self, hidden: Any) -> None:
        """At the first computed layer: the buffer of differences, and the skipped layers' nodes from `clean`."""
        import torch

        graph = self.layout.graph
        rows, n, d = hidden.shape
        B = rows // self.copies
        computed = graph.upstream_layers >= self.first
        # one buffer per copy where a node this run computes is needed; else one for all (they are the same)
        own = any(need and computed[u] for u, need in enumerate(self._needed))
        self._tokens = (B, n, d)
        dtype = at_least_float32(hidden).dtype
        self._delta = torch.zeros(
            self.copies if own else 1, graph.n_upstream, B * n * d, dtype=dtype, device=hidden.device
        )
        if self.first == 0:
            return
        outputs, ablated = self.clean.streams(self.layout), self.ablated.streams(self.layout)
        for u in range(graph.head_index(self.first, 0)):
            if self._needed[u] and outputs[u] is not None:
                self._delta[:, u] = (outputs[u] - ablated[u]).expand(B, n, d).reshape(-1)
        for layer in self.layout.normalised:
            if layer < self.first:
                self._keep_heads(layer, self.clean.heads[layer], self.clean.attention[layer])

    def _store(self, u: int, output: Any, ablated: Any) -> None:
        """Upstream node u's difference in this run: output (C·B, n, d) minus its ablated value (the embeddings are
        the same in every copy, so one buffer for all takes the first)."""
        if self._needed[u]:
            B, n, d = self._tokens
            difference = (at_least_float32(output).view(-1, B, n, d) - ablated).reshape(-1, B * n * d)  # (C, B·n·d)
            self._delta[:, u] = difference[: self._delta.shape[0]]

    def _keep_heads(self, layer: int, heads: Any, x: Any) -> None:
        """A normalised layer's heads: their differences o_h − a_h (before the norm) and this run's x."""
        B, n, d = self._tokens
        own = self._delta.shape[0]
        H = heads.shape[0]
        difference = heads.view(H, -1, B, n, d) - self.ablated.heads[layer][:, None]  # (H, C, B, n, d)
        self._pre[layer] = difference.reshape(H, -1, B * n * d).transpose(0, 1)[:own]  # (C, H, B·n·d)
        self._x[layer] = at_least_float32(x).reshape(-1, B, n, d)[:own]

    def _removed_sum(self, columns: slice, rows: slice) -> Any:
        """(C, V', B, n, d) float32: what the removed edges from the upstream nodes `rows` into the inputs `columns`
        (V' of them) take away from the stream; None where none is removed."""
        import torch

        chosen = self.removed[:, rows, columns]  # (C, U', V')
        if not bool(chosen.any()):
            return None
        B, n, d = self._tokens
        weights = chosen.transpose(1, 2).to(self._delta.dtype)  # (C, V', U')
        total = torch.matmul(weights, self._delta[:, rows]).view(self.copies, -1, B, n, d)  # (C, V', B, n, d)
        H = self.layout.graph.n_head
        for layer in self.layout.normalised:
            first = self._head_rows[layer] - rows.start
            if not 0 <= first < rows.stop - rows.start or not bool(chosen[:, first : first + H].any()):
                continue
            moved = torch.matmul(weights[:, :, first : first + H], self._pre[layer])  # (C, V', B·n·d)
            x = self._x[layer][:, None]  # (C or 1, 1, B, n, d)
            after = x - moved.view(self.copies, -1, B, n, d)
            total = total + at_least_float32(self.layout.post(layer, x) - self.layout.post(layer, after))
        return total

    def _streams(self, base: Any, removed: Any) -> Any:
        """The streams (C·B, n, V', d) of inputs from `base` (C·B, n, d) less what their removed edges take away
        (C, V', B, n, d)."""
        B, n, d = self._tokens
        moved = removed.permute(0, 2, 3, 1, 4).reshape(self.copies * B, n, removed.shape[1], d)  # (C·B, n, V', d)
        return (at_least_float32(base)[:, :, None, :] - moved).to(base.dtype)

    # ---------------------------------------------------------------- the hooks

    def entered(self, layer: int, hidden: Any) -> Any:
        """The layer's attention inputs and what its MLP's removed edges from before the layer take away, in one
        product (the differences read once for both)."""
        graph = self.layout.graph
        if layer == self.first:
            self._start(hidden)
        if layer == 0:
            self._store(0, hidden, self.ablated.embed)
        first, inputs = graph.first_input(layer), graph.inputs_per_layer
        before = slice(0, graph.head_index(layer, 0))
        removed = self._removed_sum(slice(first, first + inputs), before)  # (C, G + 1, B, n, d)
        self._mlp_removed[layer] = None if removed is None else removed[:, inputs - 1 :]
        split = None
        if removed is not None and bool(self.removed[:, before, first : first + inputs - 1].any()):
            split = self._streams(hidden, removed[:, : inputs - 1])
            read_norm = self.layout.layers[layer].read_norm
            split = split if read_norm is None else read_norm(split)
        self._split[layer] = split
        return None

    def heads(self, layer: int, z: Any) -> None:
        graph = self.layout.graph
        rows = range(graph.head_index(layer, 0), graph.head_index(layer, 0) + graph.n_head)
        if not any(self._needed[u] for u in rows):
            return
        heads = self.head_outputs(layer, z)  # (H, C·B, n, d)
        if layer in self.layout.normalised:
            self._pending[layer] = heads  # kept with x, once the output projection has run
            return
        ablated = self.ablated.heads[layer] * self.layout.multiplier
        for head, u in enumerate(rows):
            self._store(u, heads[head] * self.layout.multiplier, ablated[head])

    def attention(self, layer: int, x: Any) -> None:
        if layer in self._pending:
            self._keep_heads(layer, self._pending.pop(layer), x.detach())

    def mlp(self, layer: int, output: Any) -> None:
        self._store(self.layout.graph.mlp_index(layer), output, self.ablated.mlp[layer])
        self._split.pop(layer, None)

    def _projection(self, layer: int, projection: Projection) -> Callable:
        import torch

        module = projection.module
        original = module.__dict__.get("forward") or type(module).forward.__get__(module)

        def forward(x, *args, **kwargs):
            streams = self._split.get(layer)
            if streams is None:
                return original(x, *args, **kwargs)
            chosen = streams[:, :, projection.inputs.to(streams.device)]  # (C·B, n, G, d)
            out = torch.einsum("bngd,gkd->bngk", chosen.to(projection.weight.dtype), projection.weight)
            if projection.bias is not None:
                out = out + projection.bias
            return out.reshape(*out.shape[:2], -1)  # (C·B, n, G·d_head)

        return forward

    def _mlp_input(self, layer: int) -> Callable:
        def hook(module, args):
            if layer < self.first:
                return None
            graph, parts = self.layout.graph, self.layout.layers[layer]
            index = graph.first_input(layer) + graph.inputs_per_layer - 1
            removed = self._mlp_removed.pop(layer)  # from before the layer (`entered`), then from its own heads
            own = slice(graph.head_index(layer, 0), graph.upstream_count(index))  # empty in a parallel block
            from_heads = self._removed_sum(slice(index, index + 1), own) if own.stop > own.start else None
            if from_heads is not None:
                removed = from_heads if removed is None else removed + from_heads
            if removed is None:
                return None
            base = args[0] if parts.shared_norm is None else self.streams[layer]
            base = base.reshape(-1, *self._tokens[1:])  # (C·B, n, d) (OPT's MLP reads it flattened)
            stream = self._streams(base, removed)[:, :, 0]
            stream = stream if parts.shared_norm is None else parts.shared_norm(stream)
            return (stream.reshape(args[0].shape), *args[1:])

        return hook

    def _logits_input(self, module: Any, args: Any) -> Any:
        graph = self.layout.graph
        if self._delta is None:  # every layer skipped: the edges into the logits alone
            self._start(args[0])
        removed = self._removed_sum(slice(graph.n_inputs - 1, graph.n_inputs), slice(0, graph.n_upstream))
        return None if removed is None else (self._streams(args[0], removed)[:, :, 0], *args[1:])


# ------------------------------------------------------------------------------------------------- gradients

# Layers whose gradients one product adds: the differences (U, B·n·d) are read once per so many layers. Measured on a
# 30-layer model (8 pairs × 15 tokens, 2 threads): per step 0.21 s in the products one layer at a time, 0.09 s by four.
LAYERS_PER_PRODUCT = 4


@dataclass
class _Chunk:
    """The gradients at the inputs of a few consecutive layers, `low` to `top`, in the graph's input order
    ((top − low + 1) · inputs per layer, B, n, d), filled as they arrive in the backward pass; `arrived` counts each
    layer's pieces (its projections' and its MLP's)."""

    low: int
    top: int
    gradient: Any
    arrived: dict[int, int] = field(default_factory=dict)


class EdgeGradients(_Layers):
    """One forward and backward pass of the batch with the embeddings at α of the way from the ablated run's to the
    clean run's (α = 1: the clean run, EAP); `scores` (U, V) float64 receives Σ_positions (c_u − a_u) · ∂m/∂r_v for
    every edge as the backward pass reaches each input (m: what the caller differentiates, the sum of the logit
    differences), the differences those `DifferenceRecorder` made. The caller runs the forward with gradients on
    (weights frozen) and calls backward on m."""

    records_mlp = False  # the differences are made: this run needs no node's output

    def __init__(self, layout: Layout, differences: Differences, alpha: float, scores: Any):
        super().__init__(layout)
        self.differences, self.alpha, self.scores = differences, alpha, scores
        self._delta = differences.delta  # (U, B·n·d) c_u − a_u; a normalised layer's rows are set at each run
        self._tokens = differences.tokens
        self._chunk: _Chunk | None = None  # the layers whose gradients are being gathered
        self._statistics: dict[int, tuple] = {}  # layer -> its read norm's statistics at h_l, while its gradients come

    def install(self, loaded: LoadedModel) -> Iterator[Any]:
        yield from super().install(loaded)
        for layer, parts in enumerate(self.layout.layers):
            for projection in parts.projections:
                yield projection.module.register_forward_hook(self._projection(layer, projection))
            yield parts.mlp_reads.register_forward_pre_hook(self._mlp_input(layer))
        yield self.layout.final_norm.register_forward_pre_hook(self._logits_input)

    def _add(self, columns: slice, count: int, gradient: Any) -> None:
        """scores[:count, columns] += Σ_positions Δ_u · g_v, for the gradients g (V', B, n, d) at those inputs: one
        matrix product, which reads the differences (the size of a record) once."""
        flat = at_least_float32(gradient).reshape(gradient.shape[0], -1)  # (V', B·n·d)
        self.scores[:count, columns] += (self._delta[:count] @ flat.T).double()

    def _arrived(self, layer: int, index: Any, gradient: Any) -> None:
        """Gradients (k, B, n, d) at layer `layer`'s inputs `index` (its input order) arrived. The layers are taken
        LAYERS_PER_PRODUCT at a time, counted from the last: once every piece of a chunk's layers has come (the
        backward pass reaches the layers from the last down), the chunk is added in one product over the rows its
        highest layer reads (the entries of rows an input does not read are not edges, and are never read), so that
        the differences, the size of a record, are read once per so many layers."""
        import torch

        graph = self.layout.graph
        inputs = graph.inputs_per_layer
        top = graph.n_layer - 1 - (graph.n_layer - 1 - layer) // LAYERS_PER_PRODUCT * LAYERS_PER_PRODUCT
        chunk = self._chunk
        if chunk is None or chunk.top != top:
            low = max(0, top - LAYERS_PER_PRODUCT + 1)
            size = (top - low + 1) * inputs
            zeros = torch.zeros(size, *self._tokens, dtype=self._delta.dtype, device=gradient.device)
            chunk = self._chunk = _Chunk(low, top, zeros)
        chunk.gradient[(layer - chunk.low) * inputs :].index_add_(0, index, at_least_float32(gradient))
        chunk.arrived[layer] = chunk.arrived.get(layer, 0) + 1
        needed = [len(self.layout.layers[at].projections) + 1 for at in range(chunk.low, top + 1)]
        if [chunk.arrived.get(at, 0) for at in range(chunk.low, top + 1)] != needed:
            return
        self._chunk = None
        for done in range(chunk.low, chunk.top + 1):
            self._statistics.pop(done, None)
        first, last = graph.first_input(chunk.low), graph.first_input(chunk.top) + inputs
        self._add(slice(first, last), graph.upstream_count(last - 1), chunk.gradient)

    def entered(self, layer: int, hidden: Any) -> Any:
        if layer != 0:
            return None
        start, end = self.differences.start, self.differences.end
        moved = (start + self.alpha * (end - start)).to(hidden.dtype).detach()
        return moved.requires_grad_(True)

    def attention(self, layer: int, x: Any) -> None:
        if layer not in self.layout.normalised:
            return
        # a normalised layer's heads: J_P(x) (o_h − a_h) at this run's x, from the norm's formulas
        graph = self.layout.graph
        norm = self.layout.layers[layer].output_math
        difference = self.differences.heads[layer].view(graph.n_head, *self._tokens)  # (H, B, n, d)
        moved = norm.jvp(x.detach(), difference) * self.layout.multiplier
        first = graph.head_index(layer, 0)
        self._delta[first : first + graph.n_head] = moved.reshape(graph.n_head, -1)

    def _projection(self, layer: int, projection: Projection) -> Callable:
        def hook(module, args, output):
            if output.requires_grad:
                output.register_hook(lambda gradient: self._projection_gradient(layer, projection, gradient))

        return hook

    def _projection_gradient(self, layer: int, projection: Projection, gradient: Any) -> None:
        """The gradient at a projection's output (B, n, G·d_head) taken back, group by group, through its rows of the
        projection and the layer's norm (at its input h_l) to the stream each group reads."""
        import torch

        B, n, d = self._tokens
        parts = self.layout.layers[layer]
        groups = projection.weight.shape[0]
        by_group = gradient.reshape(B * n, groups, -1).transpose(0, 1)  # (G, B·n, d_head)
        streams = torch.bmm(by_group.to(projection.weight.dtype), projection.weight).view(groups, B, n, d)
        if parts.read_math is not None:  # through the layer's norm, at its input h_l (its statistics once a layer)
            if layer not in self._statistics:
                self._statistics[layer] = parts.read_math.statistics(self.streams[layer].detach())
            streams = parts.read_math.vjp(None, streams, self._statistics[layer])
        self._arrived(layer, projection.inputs.to(gradient.device), streams)

    def _mlp_input(self, layer: int) -> Callable:
        def hook(module, args):
            x = args[0]
            if not x.requires_grad:
                return None
            alias = x.view_as(x)  # its own node in the graph: the gradient of the MLP's path alone
            alias.register_hook(lambda gradient: self._mlp_gradient(layer, gradient))
            return (alias, *args[1:])

        return hook

    def _mlp_gradient(self, layer: int, gradient: Any) -> None:
        import torch

        graph, parts = self.layout.graph, self.layout.layers[layer]
        gradient = gradient.reshape(self._tokens)
        if parts.shared_math is not None:  # the MLP received the shared norm's output: back through it
            gradient = parts.shared_math.vjp(self.streams[layer].detach(), gradient)
        index = torch.tensor([graph.inputs_per_layer - 1], device=gradient.device)
        self._arrived(layer, index, gradient[None])

    def _logits_input(self, module, args):
        x = args[0]
        alias = x.view_as(x)
        graph = self.layout.graph
        logits = slice(graph.n_inputs - 1, graph.n_inputs)
        alias.register_hook(lambda gradient: self._add(logits, graph.n_upstream, gradient[None]))
        return (alias, *args[1:])
