"""The circuits of `attnscope discover` run: the clean batch, as C copies (one circuit each), with every edge outside
a copy's circuit taking its value from the ablated run, each input of each node built from the nodes' outputs as
`pipeline.edges` says; the queries, keys and values of a layer with a removed edge computed input by input."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from attnscope.models.norms import at_least_float32
from attnscope.pipeline.edges import LayerHooks, Layout, NodeRecord, Projection
from attnscope.pipeline.interventions import RestoredForward

if TYPE_CHECKING:
    from attnscope.models.loading import LoadedModel


class PatchedEdges(LayerHooks):
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
