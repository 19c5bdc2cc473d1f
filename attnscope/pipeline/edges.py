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

Each kind of hook is installed with `interventions.hooks`; this module holds where a model's nodes read and write
(`Layout`), the hooks every kind shares (`LayerHooks`) and the recorders; the circuits' runs are
`pipeline.edge_circuits`, the gradients `pipeline.edge_gradients`:

    NodeRecorder    every node's output in one run (the clean run, the ablated run)
    DifferenceRecorder  each run's outputs added into one buffer as they come, −a_u from the ablated run, + c_u from
                    the clean one: the differences the gradients need
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.models.families import module_at
from attnscope.models.graph import Graph
from attnscope.models.norms import Norm, at_least_float32, read_norm
from attnscope.models.weights import (
    out_in,
    output_norms,
    projection_groups,
    reading_norms,
    residual_multiplier,
    weight_paths,
)

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
    """Every node's output in one run of a batch (B, n), float32 (a float64 model's: float64): `embed` (B, n, d); per
    layer `heads` (H, B, n, d) (o_h, before what follows the output projection), `attention` (B, n, d) the output
    projection's output x, `mlp` (B, n, d). A record of means (`mean`) has B = n = 1."""

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
        """Every output summed over the batch and the positions, float64, kept (…, 1, 1, d): what `mean` divides."""

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


class LayerHooks:
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


class NodeRecorder(LayerHooks):
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


class DifferenceRecorder(LayerHooks):
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
