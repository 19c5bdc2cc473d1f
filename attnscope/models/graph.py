"""A decoder as a graph of components and the edges between them (`attnscope discover`), the convention of EAP,
EAP-IG and MIB's circuit track (Syed et al. 2023; Hanna et al. 2024; Mueller et al. 2025).

Nodes are what writes into the residual stream: `embed` (the token and position embeddings, as layer 0 receives
them), every attention head `L.H`, every MLP `mlp L`; and `logits`, which reads it. An edge goes from a node u to an
input of a node v that reads the stream after u wrote it:

    a head's query input       to `L.H`, input `q`
    its key and value inputs   to `L.H`, inputs `k` and `v`; under grouped-query attention the key and value belong
                               to the key/value head the query heads share: to `L.kvK`, the edges counted once
    an MLP's input             to `mlp L`  (input None)
    the logits                 to `logits` (input None)

A head reads what every earlier layer wrote and the embeddings; an MLP also reads the heads of its own layer, except
in a parallel block (GPT-NeoX, Phi, Cohere: attention and MLP read the same input); the logits read everything.
GPT-2 small has 32,491 edges (Conmy et al. 2023 count ~32,000).

Indices. Upstream nodes are numbered in the order they write: 0 is `embed`, then layer l's heads 1 + l(H+1) + h
and its MLP 1 + l(H+1) + H. Inputs are numbered layer by layer: layer l's are its H query inputs, its H_kv key
inputs, its H_kv value inputs and its MLP's, from l·(H + 2H_kv + 1); `logits` is the last. An edge is a pair
(upstream, input); the edges into an input are the first `upstream_count(input)` upstream nodes (those of a head's
own layer excluded). Pure Python and numpy: no model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

EMBED, LOGITS = "embed", "logits"


@dataclass(frozen=True)
class Graph:
    """The graph of a decoder with `n_layer` layers of `n_head` query heads and `n_kv_head` key/value heads, its MLPs
    after its attention (`parallel`: beside it)."""

    n_layer: int
    n_head: int
    n_kv_head: int
    parallel: bool = False

    # ------------------------------------------------------------------ nodes

    @property
    def per_layer(self) -> int:
        """Upstream nodes per layer: its heads and its MLP."""
        return self.n_head + 1

    @property
    def n_upstream(self) -> int:
        return 1 + self.n_layer * self.per_layer

    @property
    def inputs_per_layer(self) -> int:
        """A layer's inputs: H query, H_kv key, H_kv value, one MLP."""
        return self.n_head + 2 * self.n_kv_head + 1

    @property
    def n_inputs(self) -> int:
        return self.n_layer * self.inputs_per_layer + 1

    @property
    def grouped(self) -> bool:
        """Key and value inputs belong to key/value heads other than the query heads (grouped- or multi-query)."""
        return self.n_kv_head != self.n_head

    def head_index(self, layer: int, head: int) -> int:
        return 1 + layer * self.per_layer + head

    def mlp_index(self, layer: int) -> int:
        return 1 + layer * self.per_layer + self.n_head

    def first_input(self, layer: int) -> int:
        """The index of layer `layer`'s first input (its head 0's query); `n_layer` gives the logits'."""
        return layer * self.inputs_per_layer

    @cached_property
    def upstream_names(self) -> tuple[str, ...]:
        names = [EMBED]
        for layer in range(self.n_layer):
            names += [f"{layer}.{head}" for head in range(self.n_head)] + [f"mlp {layer}"]
        return tuple(names)

    @cached_property
    def upstream_layers(self) -> np.ndarray:
        """(U,) the layer of each upstream node (-1 for the embeddings)."""
        return np.array([-1] + [layer for layer in range(self.n_layer) for _ in range(self.per_layer)])

    @cached_property
    def upstream_is_head(self) -> np.ndarray:
        """(U,) bool: the upstream node is an attention head."""
        return np.array([False] + [k < self.n_head for _ in range(self.n_layer) for k in range(self.per_layer)])

    # ------------------------------------------------------------------ inputs

    def input_of(self, index: int) -> tuple[int, str, int | None]:
        """(layer, kind, head) of input `index`: kind q, k, v (head: the query or key/value head), mlp, or logits
        (layer n_layer, head None)."""
        layer, offset = divmod(index, self.inputs_per_layer)
        if layer == self.n_layer:
            return layer, LOGITS, None
        H, K = self.n_head, self.n_kv_head
        if offset < H:
            return layer, "q", offset
        if offset < H + K:
            return layer, "k", offset - H
        if offset < H + 2 * K:
            return layer, "v", offset - H - K
        return layer, "mlp", None

    @cached_property
    def input_targets(self) -> tuple[tuple[str, str | None], ...]:
        """Per input, (the node it feeds, its kind q/k/v or None): `("1.0", "q")`, `("1.kv0", "k")` under
        grouped-query attention, `("mlp 1", None)`, `("logits", None)`."""
        targets: list[tuple[str, str | None]] = []
        for index in range(self.n_inputs):
            layer, kind, head = self.input_of(index)
            if kind == LOGITS:
                targets.append((LOGITS, None))
            elif kind == "mlp":
                targets.append((f"mlp {layer}", None))
            elif kind == "q" or not self.grouped:
                targets.append((f"{layer}.{head}", kind))
            else:
                targets.append((f"{layer}.kv{head}", kind))
        return tuple(targets)

    def upstream_count(self, index: int) -> int:
        """How many upstream nodes input `index` reads: the first so many (a head: everything before its layer; an
        MLP: also its own layer's heads, unless the block is parallel; the logits: everything)."""
        layer, kind, _ = self.input_of(index)
        before = 1 + layer * self.per_layer
        if kind == "mlp" and not self.parallel:
            return before + self.n_head
        return before

    @cached_property
    def upstream_counts(self) -> np.ndarray:
        """(V,) `upstream_count` of every input."""
        return np.array([self.upstream_count(index) for index in range(self.n_inputs)])

    @cached_property
    def valid(self) -> np.ndarray:
        """(U, V) bool: True where (upstream, input) is an edge."""
        return np.arange(self.n_upstream)[:, None] < self.upstream_counts[None, :]

    @cached_property
    def edges(self) -> np.ndarray:
        """(E, 2) every edge as (upstream, input), input-major (the order of `valid`'s transpose): edge k's index."""
        inputs, upstream = np.nonzero(self.valid.T)
        return np.stack([upstream, inputs], axis=1)

    @property
    def n_edges(self) -> int:
        return int(self.valid.sum())

    def edge_name(self, upstream: int, index: int) -> tuple[str, str, str | None]:
        """(from, to, input) of an edge, as the JSON names it."""
        target, kind = self.input_targets[index]
        return self.upstream_names[upstream], target, kind

    # ------------------------------------------------------------------ circuits

    def mask(self, edges: np.ndarray) -> np.ndarray:
        """(U, V) bool: True at the edges given as indices into `edges`."""
        chosen = np.zeros((self.n_upstream, self.n_inputs), dtype=bool)
        pairs = self.edges[np.asarray(edges, dtype=np.int64)]
        chosen[pairs[:, 0], pairs[:, 1]] = True
        return chosen

    def pruned(self, kept: np.ndarray) -> np.ndarray:
        """(U, V) bool: the edges of `kept` (U, V) that lie on a path from the embeddings to the logits, as MIB's
        evaluation prunes a circuit before running it. Under corrupted ablation pruning changes no number: a node
        none of whose inputs is kept computes what it computed in the corrupted run, so the edges out of it carry
        that run's value anyway; and an edge into a node with no kept way to the logits changes nothing
        downstream. It makes the count of a circuit's edges honest."""
        kept = kept & self.valid
        reached = np.zeros(self.n_upstream, dtype=bool)  # the circuit computes this node's output from its inputs
        reached[0] = True
        for node in range(1, self.n_upstream):
            reached[node] = bool(kept[:, self.node_inputs[node]][reached].any())
        useful_input = np.zeros(self.n_inputs, dtype=bool)  # an input with a kept way to the logits
        useful_input[-1] = True
        for node in range(self.n_upstream - 1, 0, -1):  # a node's inputs feed later nodes only: decided first
            if (kept[node] & useful_input).any():
                useful_input[self.node_inputs[node]] = True
        return kept & reached[:, None] & useful_input[None, :]

    @cached_property
    def node_inputs(self) -> list[list[int]]:
        """Per upstream node, the inputs it computes from: a head its query and its key/value head's key and value,
        an MLP its input, the embeddings none."""
        inputs: list[list[int]] = [[]]
        H, K = self.n_head, self.n_kv_head
        for layer in range(self.n_layer):
            first = self.first_input(layer)
            for head in range(H):
                kv = head // (H // K)
                inputs.append([first + head, first + H + kv, first + H + K + kv])
            inputs.append([first + H + 2 * K])
        return inputs
