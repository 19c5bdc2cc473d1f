"""The gradients of `attnscope discover`: one forward and backward pass of a batch per integration point, the metric's
gradient at every input of every node dotted with every upstream node's difference (`pipeline.edges.Differences`)
and summed over positions, into an (upstream nodes × inputs) matrix of scores."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnscope.models.norms import at_least_float32
from attnscope.pipeline.edges import Differences, LayerHooks, Layout, Projection

if TYPE_CHECKING:
    from attnscope.models.loading import LoadedModel


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


class EdgeGradients(LayerHooks):
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
