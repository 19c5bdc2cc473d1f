"""One batch of prompt pairs of one length on one model, and the runs `attnscope discover` makes of it: the node
records, the differences and the gradients' scores, each edge patched alone, the circuits. What the analysis
(`analyses.discover`) shares out batch by batch, under torchrun too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from attnscope.pipeline import heap, interventions
from attnscope.pipeline.edge_circuits import PatchedEdges
from attnscope.pipeline.edge_gradients import EdgeGradients
from attnscope.pipeline.edges import DifferenceRecorder, Differences, Layout, NodeRecord, NodeRecorder
from attnscope.pipeline.prompt_pairs import LogitDifference, TokenizedPair, batch

if TYPE_CHECKING:
    from attnscope.models.loading import LoadedModel

EDGE_COPY_BYTES = 2**28  # the differences and split inputs of the copies of one pass, at most (about)


class PairBatch:
    """The pairs `group` of `tokens` (of one length: nothing is padded, the last position is every row's last
    token): their clean and corrupted ids (B, n), answers and wrong tokens (B,)."""

    def __init__(self, loaded: LoadedModel, layout: Layout, tokens: Sequence[TokenizedPair], group: Sequence[int]):
        self.loaded, self.layout = loaded, layout
        self.clean, self.corrupt, self.answer, self.wrong = batch(tokens, group, loaded.device)
        self.metric = LogitDifference(loaded)

    @property
    def tokens(self) -> tuple[int, int, int]:
        """(B, n, d): the batch's pairs, their length, the stream's width."""
        return (*self.clean.shape, self.loaded.d_model)

    def logit_differences(self, ids: Any, copies: int = 1) -> Any:
        """(copies · B,) float64 on the host: LD of `ids` (copies of the batch, copy-major)."""
        return self.metric(ids, self.answer.repeat(copies), self.wrong.repeat(copies)).double().cpu()

    def recorded(self, ids: Any, *more: Any) -> tuple[NodeRecord, Any]:
        """Every node's output in the run of `ids`, and its LD (more hooks beside, as `interventions.hooks` takes)."""
        recorder = NodeRecorder(self.layout)
        with interventions.hooks(self.loaded, recorder, *more):
            differences = self.logit_differences(ids)
        return recorder.record, differences

    def ablated(self, means: NodeRecord | None) -> NodeRecord:
        """What an ablated edge carries: the corrupted run's node outputs, or the means."""
        return self.recorded(self.corrupt)[0] if means is None else means

    def differences(self, means: NodeRecord | None) -> Differences:
        """Every node's clean output minus its ablated value, recorded as the runs go
        (`pipeline.edges.DifferenceRecorder`): −a_u from the corrupted run (or the means), then + c_u from the clean
        run, into one buffer."""
        differences = None if means is None else Differences.from_means(self.layout, means, self.tokens)
        if means is None:
            recorder = DifferenceRecorder(self.layout, None, -1.0)
            with interventions.hooks(self.loaded, recorder):
                self.logit_differences(self.corrupt)
            differences = recorder.differences
        with interventions.hooks(self.loaded, DifferenceRecorder(self.layout, differences, 1.0)):
            self.logit_differences(self.clean)
        return differences

    def gradient_scores(self, means: NodeRecord | None, alphas: Sequence[float]) -> np.ndarray:
        """(U, V) float64: Σ_pairs of every edge's score, the difference of its upstream node dotted with the gradient
        at its input, averaged over the points `alphas` ([1]: EAP; the midpoints: EAP-IG)."""
        import torch

        graph, loaded = self.layout.graph, self.loaded
        with torch.no_grad():
            differences = self.differences(means)
        scores = torch.zeros(graph.n_upstream, graph.n_inputs, dtype=torch.float64, device=loaded.device)
        with interventions.weights_frozen(loaded), torch.enable_grad():
            for alpha in alphas:
                with interventions.hooks(loaded, EdgeGradients(self.layout, differences, alpha, scores)):
                    self.metric(self.clean, self.answer, self.wrong).sum().backward()
                heap.trim()  # what the backward pass freed, handed back before the next
        return (scores / len(alphas)).cpu().numpy()

    def exact_scores(self, means: NodeRecord | None) -> np.ndarray:
        """(U, V) float64: Σ_pairs LD(clean) − LD(clean with the edge alone ablated), the edges into one layer's
        inputs at a time as copies of the batch, the layers below not computed again (they return what they did in
        the clean run)."""
        import torch

        graph, loaded = self.layout.graph, self.loaded
        layers = interventions.LayerOutputsRecorder()
        with torch.no_grad():
            clean, clean_ld = self.recorded(self.clean, layers)
            ablated = self.ablated(means)
        found = np.zeros((graph.n_upstream, graph.n_inputs))
        per_pass = self.copies_per_pass()
        for layer in range(graph.n_layer + 1):  # the logits' input last, as layer n_layer
            last = graph.first_input(layer + 1) if layer < graph.n_layer else graph.n_inputs
            edges = [(u, v) for v in range(graph.first_input(layer), last) for u in range(graph.upstream_count(v))]
            for first in range(0, len(edges), per_pass):
                upstream, inputs = (list(part) for part in zip(*edges[first : first + per_pass], strict=True))
                k = len(upstream)
                removed = torch.zeros(k, graph.n_upstream, graph.n_inputs, dtype=torch.bool, device=loaded.device)
                removed[torch.arange(k), upstream, inputs] = True  # copy c: its one edge
                patched = PatchedEdges(self.layout, removed, ablated, clean, first=layer)
                skipped = interventions.SkippedLayers(layers.outputs, layer, k)
                with torch.no_grad(), interventions.hooks(loaded, patched, skipped):
                    differences = self.logit_differences(self.clean.repeat(k, 1), k).view(k, -1)  # (k, B)
                found[upstream, inputs] = (clean_ld[None, :] - differences).sum(dim=1).numpy()
        return found

    def circuits(self, removed: Sequence[np.ndarray], ablated: NodeRecord) -> np.ndarray:
        """(C,) float64: Σ_pairs LD of the clean batch run with each circuit's `removed` edges (U, V) ablated, as
        copies of the batch."""
        import torch

        found = np.zeros(len(removed))
        per_pass = self.copies_per_pass()
        for first in range(0, len(removed), per_pass):
            chunk = removed[first : first + per_pass]
            masks = torch.from_numpy(np.stack(chunk)).to(self.loaded.device)  # (C, U, V)
            with torch.no_grad(), interventions.hooks(self.loaded, PatchedEdges(self.layout, masks, ablated)):
                differences = self.logit_differences(self.clean.repeat(len(chunk), 1), len(chunk))
            found[first : first + len(chunk)] = differences.view(len(chunk), -1).sum(dim=1).numpy()
        return found

    def copies_per_pass(self) -> int:
        """Copies of the batch per pass: their differences (U rows each) and split inputs within EDGE_COPY_BYTES,
        their tokens within interventions.MAX_COPY_TOKENS."""
        B, n, d = self.tokens
        graph = self.layout.graph
        per_copy = 4 * B * n * d * (graph.n_upstream + 3 * graph.inputs_per_layer)
        return max(1, min(EDGE_COPY_BYTES // per_copy, interventions.MAX_COPY_TOKENS // (B * n)))
