"""The circuit of a task: the edges between a decoder's components that carry what a clean prompt and its corrupted
twin differ in, scored, then proven by running the model with only the top edges (`attnscope discover`).

The graph, its nodes and edges are `models.graph`'s; how a run cuts edges and takes gradients is
`pipeline.edges`'. The metric is `patch`'s: the logit difference LD = logit(answer) − logit(wrong) at the last
position, its mean over the pairs. An edge's score estimates how much the metric falls when that edge alone carries
its ablated value instead of its clean one (positive: the edge carries the answer; negative: it works against it):

    exact    LD(clean) − LD(clean with the edge ablated), each edge run alone: one run of the clean batch per edge,
             as copies of the batch, the layers below the edge's target not computed again (as `patch` does)
    eap      Σ_positions (c_u(clean) − a_u) · ∂LD/∂r_v at the clean run: one forward and one backward pass
             (attribution patching, Syed et al. 2023)
    eap-ig   the same difference dotted with the gradient averaged over `steps` points α = (j + ½) / steps of the
             straight line from the ablated run's embeddings to the clean run's (integrated gradients on the inputs,
             Hanna et al. 2024; the midpoint rule, as `circuit --method gradient` integrates): `steps` forward and
             backward passes

a_u is what the edge carries once ablated: u's output in the corrupted prompt's run (`ablation corrupt`), or its
mean over every position of every pair, clean prompts and corrupted (`mean`). Scores are means over the pairs.

Faithfulness (`scores.faithfulness`): for each budget of the grid, the top ⌊percent · E / 100⌋ edges, ranked by
|score| and by signed score, pruned to those on a path from the embeddings to the logits (as MIB does), are run
with every other edge ablated; f = (m(C) − m(∅)) / (m(N) − m(∅)), m(N) the clean LD and m(∅) the run with every edge
ablated. CPR is the area under the signed ranking's f, CMD the area between the |score| ranking's f and 1. The
circuit is the |score| ranking's smallest budget with f ≥ `target`.

Cost, per batch of pairs of one length: two forwards for the baselines (recording every node's output where the
ablation is a mean), two recording forwards, then `steps` forward and backward passes (eap: one; exact: one run of
the batch per edge, as copies), then one recording forward of the corrupted prompts and one run per distinct
circuit (as copies of the batch, as many per pass as fit in EDGE_COPY_BYTES).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope import settings
from attnscope.analyses.common import check_finite, damaged_weights, first_non_finite_weight
from attnscope.analyses.harness import trim_heap
from attnscope.analyses.result import Result
from attnscope.errors import AttnscopeError
from attnscope.models.graph import Graph
from attnscope.models.loading import LoadedModel, fastest_attention
from attnscope.pipeline import distributed, interventions
from attnscope.pipeline.edges import (
    DifferenceRecorder,
    Differences,
    EdgeGradients,
    Layout,
    NodeRecord,
    NodeRecorder,
    PatchedEdges,
)
from attnscope.pipeline.prompt_pairs import (
    LogitDifference,
    PromptPair,
    TokenizedPair,
    batch,
    given_pair,
    length_groups,
    pair_records,
    read_pairs,
    tokenized,
)
from attnscope.pipeline.tokens import default_bos, special_tokens
from attnscope.scores import faithfulness
from attnscope.scores.catalog import counted
from attnscope.settings.intervene import EXACT_MAX_EDGES

GAP_MIN = 1e-3  # logits: a mean clean − corrupted difference smaller than this leaves nothing to find
EDGE_COPY_BYTES = 2**28  # the differences and split inputs of the copies of one pass, at most (about)


@dataclass(repr=False)  # the repr is Result's: a summary
class DiscoverResult(Result):
    """Every edge's score (`scores`, float64, in `graph.edges`' order), the faithfulness of the circuits of the top
    edges on the budget grid (`faithfulness`: ranked by |score|; `faithfulness_signed`: by signed score), MIB's CPR
    and CMD, and the circuit chosen (see the module docstring)."""

    model: dict[str, Any]
    inputs: dict[str, Any]
    settings: dict[str, Any]
    pairs: list[dict[str, Any]]
    graph: Graph
    scores: np.ndarray
    clean_logit_diff: float  # m(N): mean over pairs
    corrupt_logit_diff: float
    ablated_logit_diff: float  # m(∅): every edge ablated
    faithfulness: list[dict[str, Any]]  # percent, edges, kept, f (edges ranked by |score|)
    faithfulness_signed: list[dict[str, Any]]  # the same, ranked by signed score
    cpr: float
    cmd: float
    circuit: dict[str, Any]  # percent, f, edges (indices into graph.edges, pruned)
    notes: list[str] = field(default_factory=list)

    def ranked(self) -> np.ndarray:
        """Edge indices from the largest |score| to the smallest, ties in the edges' order."""
        return faithfulness.ranked(self.scores, absolute=True)

    def edge(self, index: int) -> tuple[str, str, str | None]:
        """(from, to, input) of edge `index`."""
        upstream, target = self.graph.edges[index]
        return self.graph.edge_name(int(upstream), int(target))


# ------------------------------------------------------------------------------------------------- one batch


class _Batch:
    """One batch of pairs of one length: its ids, answers and wrong tokens, and the runs made of it."""

    def __init__(self, analysis: Discover, loaded: LoadedModel, layout: Layout, tokens: Sequence[TokenizedPair], group):
        self.analysis, self.loaded, self.layout = analysis, loaded, layout
        self.clean, self.corrupt, self.answer, self.wrong = batch(tokens, group, loaded.device)
        self.metric = LogitDifference(loaded)

    @property
    def size(self) -> int:
        return self.clean.shape[0]

    def logit_differences(self, ids: Any, copies: int = 1) -> Any:
        """(copies · B,) float64 on the host: LD of `ids` (copies of the batch, copy-major)."""
        return self.metric(ids, self.answer.repeat(copies), self.wrong.repeat(copies)).double().cpu()

    def recorded(self, ids: Any, *more: Any) -> tuple[NodeRecord, Any]:
        """Every node's output in the run of `ids`, and its LD (more hooks beside, as `interventions.hooks` takes)."""
        recorder = NodeRecorder(self.layout)
        with interventions.hooks(self.loaded, recorder, *more):
            differences = self.logit_differences(ids)
        return recorder.record, differences

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

    @property
    def tokens(self) -> tuple[int, int, int]:
        """(B, n, d): the batch's pairs, their length, the stream's width."""
        return (*self.clean.shape, self.loaded.d_model)

    def ablated(self, means: NodeRecord | None) -> NodeRecord:
        """What an ablated edge carries: the corrupted run's node outputs, or the means."""
        return self.recorded(self.corrupt)[0] if means is None else means

    def circuits(self, removed: Sequence[np.ndarray], ablated: NodeRecord) -> np.ndarray:
        """(C,) float64: Σ_pairs LD of the clean batch run with each circuit's `removed` edges (U, V) ablated, as
        copies of the batch."""
        import torch

        graph = self.layout.graph
        found = np.zeros(len(removed))
        per_pass = _copies(self.clean.shape, graph, self.layout)
        for first in range(0, len(removed), per_pass):
            chunk = removed[first : first + per_pass]
            masks = torch.from_numpy(np.stack(chunk)).to(self.loaded.device)  # (C, U, V)
            with torch.no_grad(), interventions.hooks(self.loaded, PatchedEdges(self.layout, masks, ablated)):
                differences = self.logit_differences(self.clean.repeat(len(chunk), 1), len(chunk))
            found[first : first + len(chunk)] = differences.view(len(chunk), -1).sum(dim=1).numpy()
        return found


def _copies(shape: Any, graph: Graph, layout: Layout) -> int:
    """Copies of a batch (B, n) per pass: their differences (U per copy) and split inputs within EDGE_COPY_BYTES,
    their tokens within interventions.MAX_COPY_TOKENS."""
    B, n = shape
    d = layout.layers[0].W_O.shape[-1]
    per_copy = 4 * B * n * d * (graph.n_upstream + 3 * graph.inputs_per_layer)
    return max(1, min(EDGE_COPY_BYTES // per_copy, interventions.MAX_COPY_TOKENS // (B * n)))


# ------------------------------------------------------------------------------------------------- the analysis


class Discover(settings.Discover):
    """Every edge's score and the faithfulness of the circuits of the top edges (see the module docstring). Needs
    the model loaded with its language-model head."""

    def read_inputs(self) -> list[PromptPair]:
        """The pairs: the one of clean, corrupt, answer and wrong, or those of the file."""
        if self.file is not None:
            return read_pairs(self.file)
        return given_pair(self.clean, self.corrupt, self.answer, self.wrong)

    def run(
        self, loaded: LoadedModel, pairs: Sequence[PromptPair] | None = None, progress: Any = None
    ) -> DiscoverResult:
        if loaded.lm_model is None:
            raise AttnscopeError("discover needs the model's language-model head: load it with lm_head=True")
        self.check_shape(loaded.shape)
        pairs = list(self.read_inputs() if pairs is None else pairs)
        layout = Layout.of(loaded)  # an encoder or a post-norm decoder: refused here
        graph = layout.graph
        self._normalised = sorted(layout.normalised)
        damaged = first_non_finite_weight(loaded.lm_model)  # SDPA turns a NaN head's output into zeros
        if damaged is not None:
            raise AttnscopeError(damaged_weights(damaged))
        bos = default_bos(loaded.tokenizer, loaded.kind) if self.bos is None else self.bos
        prefix, _ = special_tokens(loaded.tokenizer, loaded.kind, bos)
        tokens = [tokenized(loaded, pair, prefix) for pair in pairs]
        groups = length_groups([len(pair.clean) for pair in tokens], self.batch_size, self.max_tokens)
        self._check_exact(graph, len(groups))

        def batches() -> Any:
            return (_Batch(self, loaded, layout, tokens, group) for group in groups)

        with interventions.attention(loaded, fastest_attention(loaded.lm_model)):
            clean_ld, corrupt_ld, means = self._baselines(loaded, groups, batches())
            total = np.zeros((graph.n_upstream, graph.n_inputs))
            for found in distributed.in_rounds(batches(), lambda one: self._scores(one, means)):
                total += found
            scores = total[graph.edges[:, 0], graph.edges[:, 1]] / len(pairs)
            check_finite(loaded, "edge score", scores)
            curves = self._faithfulness(graph, scores, batches(), means, float(np.sum(clean_ld)), len(pairs))
        return self._result(loaded, pairs, tokens, bos, graph, scores, clean_ld, corrupt_ld, *curves)

    def _check_exact(self, graph: Graph, n_batches: int) -> None:
        if self.method == "exact" and graph.n_edges > EXACT_MAX_EDGES:
            raise AttnscopeError(
                f"method exact patches each of this model's {graph.n_edges:,} edges alone: {graph.n_edges:,} runs of "
                f"each of the {counted(n_batches, 'batch')} of pairs ({graph.n_edges * n_batches:,} in all); it is "
                f"refused above {EXACT_MAX_EDGES:,} edges: use method eap-ig (the default) or eap"
            )

    # ---------------------------------------------------------------- the baselines

    def _baselines(self, loaded: LoadedModel, groups: list, batches: Any) -> tuple[Any, Any, NodeRecord | None]:
        """Every pair's clean and corrupted LD (and, for mean ablation, every node's mean output over every
        position of the pairs); a corruption that changes nothing is refused before anything costlier runs."""
        import torch

        P = sum(len(group) for group in groups)
        clean_ld, corrupt_ld = np.zeros(P), np.zeros(P)
        sums, positions = None, 0

        def baseline(one: _Batch) -> tuple[Any, Any, Any, int]:
            with torch.no_grad():
                if self.ablation == "corrupt":
                    clean, corrupt = one.logit_differences(one.clean), one.logit_differences(one.corrupt)
                    return clean.numpy(), corrupt.numpy(), None, 0
                clean_record, clean = one.recorded(one.clean)
                corrupt_record, corrupt = one.recorded(one.corrupt)
                summed = _on_host(clean_record.summed() + corrupt_record.summed())
                return clean.numpy(), corrupt.numpy(), summed, 2 * one.clean.numel()

        for group, (clean, corrupt, summed, count) in zip(
            groups, distributed.in_rounds(batches, baseline), strict=True
        ):
            clean_ld[group], corrupt_ld[group] = clean, corrupt
            if summed is not None:
                sums, positions = summed if sums is None else sums + summed, positions + count
        check_finite(loaded, "logit difference", np.concatenate([clean_ld, corrupt_ld]))
        gap = float(np.mean(clean_ld - corrupt_ld))
        if abs(gap) < GAP_MIN:
            raise AttnscopeError(
                f"the clean and corrupted prompts give the same logit difference (answer − wrong: clean "
                f"{np.mean(clean_ld):.4f}, corrupted {np.mean(corrupt_ld):.4f} on average): there is no difference "
                "for an edge to carry; corrupt the prompt where it decides the answer"
            )
        wide = torch.promote_types(loaded.dtype, torch.float32)  # float32, or a float64 model's own
        means = None if sums is None else _to_device(sums.mean(positions, wide), loaded.device)
        return clean_ld, corrupt_ld, means

    # ---------------------------------------------------------------- the scores

    def _scores(self, one: _Batch, means: NodeRecord | None) -> np.ndarray:
        """(U, V) float64: the batch's edge scores summed over its pairs (zero where no edge is)."""
        import torch

        if self.method == "exact":
            layers = interventions.LayerOutputsRecorder()
            with torch.no_grad():
                clean, clean_ld = one.recorded(one.clean, layers)
                ablated = one.ablated(means)
            return self._exact(one, clean, clean_ld, ablated, layers.outputs)
        graph, loaded = one.layout.graph, one.loaded
        with torch.no_grad():
            differences = one.differences(means)
        alphas = [1.0] if self.method == "eap" else [(j + 0.5) / self.ig_steps for j in range(self.ig_steps)]
        scores = torch.zeros(graph.n_upstream, graph.n_inputs, dtype=torch.float64, device=loaded.device)
        with interventions.weights_frozen(loaded), torch.enable_grad():
            for alpha in alphas:
                with interventions.hooks(loaded, EdgeGradients(one.layout, differences, alpha, scores)):
                    one.metric(one.clean, one.answer, one.wrong).sum().backward()
                # glibc keeps what a backward pass freed and reuses little of it in the next: measured on a
                # 30-layer model, the resident size grew by a fifth of a pass's peak per step without this
                trim_heap()
        return (scores / len(alphas)).cpu().numpy()

    def _exact(self, one: _Batch, clean: NodeRecord, clean_ld: Any, ablated: NodeRecord, outputs: dict) -> np.ndarray:
        """(U, V) float64: Σ_pairs LD(clean) − LD(clean with the edge alone ablated), the edges into one layer's
        inputs at a time as copies of the batch, the layers below not computed again."""
        import torch

        graph, loaded = one.layout.graph, one.loaded
        found = np.zeros((graph.n_upstream, graph.n_inputs))
        per_pass = _copies(one.clean.shape, graph, one.layout)
        for layer in range(graph.n_layer + 1):  # the logits' input last, as layer n_layer
            last = graph.first_input(layer + 1) if layer < graph.n_layer else graph.n_inputs
            edges = [(u, v) for v in range(graph.first_input(layer), last) for u in range(graph.upstream_count(v))]
            for first in range(0, len(edges), per_pass):
                upstream, inputs = (list(part) for part in zip(*edges[first : first + per_pass], strict=True))
                k = len(upstream)
                removed = torch.zeros(k, graph.n_upstream, graph.n_inputs, dtype=torch.bool, device=loaded.device)
                removed[torch.arange(k), upstream, inputs] = True  # copy c: its one edge
                patched = PatchedEdges(one.layout, removed, ablated, clean, first=layer)
                with (
                    torch.no_grad(),
                    interventions.hooks(loaded, patched, interventions.SkippedLayers(outputs, layer, k)),
                ):
                    differences = one.logit_differences(one.clean.repeat(k, 1), k).view(k, -1)  # (k, B)
                found[upstream, inputs] = (clean_ld[None, :] - differences).sum(dim=1).numpy()
        return found

    # ---------------------------------------------------------------- faithfulness

    def _faithfulness(
        self, graph: Graph, scores: np.ndarray, batches: Any, means: NodeRecord | None, clean_sum: float, P: int
    ) -> tuple[Any, ...]:
        """Every budget's circuit in both rankings run on every batch: the curves, m(∅), CPR, CMD and the circuit."""
        import torch

        removed: list[np.ndarray] = []  # the distinct circuits, as the edges they ablate (U, V)
        known: dict[bytes, int] = {}

        def circuit(kept: np.ndarray) -> int:
            ablated = graph.valid & ~kept
            key = np.packbits(ablated).tobytes()
            if key not in known:
                known[key] = len(removed)
                removed.append(ablated)
            return known[key]

        empty = circuit(np.zeros_like(graph.valid))
        rows: dict[bool, list[tuple[float, int, np.ndarray, int]]] = {True: [], False: []}
        for absolute in (True, False):
            order = faithfulness.ranked(scores, absolute)
            for percent in self.budgets:
                k = faithfulness.budget_edges(percent, graph.n_edges)
                kept = graph.pruned(graph.mask(order[:k]))
                rows[absolute].append((percent, k, kept, circuit(kept)))

        def work(one: _Batch) -> np.ndarray:
            with torch.no_grad():
                ablated = one.ablated(means)
            return one.circuits(removed, ablated)

        sums = np.zeros(len(removed))
        for found in distributed.in_rounds(batches, work):
            sums += found
        m = sums / P
        full = clean_sum / P
        curves = {
            absolute: [
                {
                    "percent": percent,
                    "edges": k,
                    "kept": int(kept.sum()),
                    "f": faithfulness.faithfulness(float(m[index]), full, float(m[empty])),
                }
                for percent, k, kept, index in rows[absolute]
            ]
            for absolute in (True, False)
        }
        percents = list(self.budgets)
        cpr, cmd = faithfulness.areas(percents, [row["f"] for row in curves[False]], [row["f"] for row in curves[True]])
        chosen = faithfulness.smallest_faithful([row["f"] for row in curves[True]], self.target)
        kept = rows[True][chosen][2]
        circuit_edges = np.nonzero(kept[graph.edges[:, 0], graph.edges[:, 1]])[0]
        chosen_circuit = {"percent": percents[chosen], "f": curves[True][chosen]["f"], "edges": circuit_edges}
        return float(m[empty]), curves[True], curves[False], cpr, cmd, chosen_circuit

    # ---------------------------------------------------------------- the result

    def _result(
        self,
        loaded: LoadedModel,
        pairs: Sequence[PromptPair],
        tokens: Sequence[TokenizedPair],
        bos: bool,
        graph: Graph,
        scores: np.ndarray,
        clean_ld: np.ndarray,
        corrupt_ld: np.ndarray,
        empty: float,
        curve: list[dict],
        signed: list[dict],
        cpr: float,
        cmd: float,
        circuit: dict,
    ) -> DiscoverResult:
        source = pairs[0].source if self.file is None else "standard input" if self.file == "-" else self.file
        return DiscoverResult(
            loaded.info(),
            {"source": source, "n_pairs": len(pairs), "n_tokens": sum(len(pair.clean) for pair in tokens), "bos": bos},
            {
                "method": self.method,
                "steps": self.ig_steps if self.method == "eap-ig" else None,
                "ablation": self.ablation,
                "target": self.target,
                "budgets": list(self.budgets),
                "top": self.top,
                "batch_size": self.batch_size,
                "max_tokens": self.max_tokens,
            },
            pair_records(loaded, pairs, tokens, clean_ld, corrupt_ld),
            graph,
            scores,
            float(np.mean(clean_ld)),
            float(np.mean(corrupt_ld)),
            empty,
            curve,
            signed,
            cpr,
            cmd,
            circuit,
            notes=_notes(self, graph, pairs, clean_ld, corrupt_ld, curve, signed, circuit, self._normalised),
        )


def _on_host(record: NodeRecord) -> NodeRecord:
    return _to_device(record, "cpu")


def _to_device(record: NodeRecord, device: Any) -> NodeRecord:
    def moved(tensor: Any) -> Any:
        return tensor.to(device)

    return NodeRecord(
        moved(record.embed), [moved(h) for h in record.heads], [moved(x) for x in record.attention],
        [moved(m) for m in record.mlp],
    )  # fmt: skip


FAR_ABOVE, FAR_BELOW = 1.05, -0.05  # faithfulness past these is named in the notes


def _notes(
    analysis: Discover,
    graph: Graph,
    pairs: Sequence[PromptPair],
    clean_ld: np.ndarray,
    corrupt_ld: np.ndarray,
    curve: list[dict],
    signed: list[dict],
    circuit: dict,
    normalised: Sequence[int],
) -> list[str]:
    """What to know: a difference with the sign the user did not expect, pairs that pull the other way, circuits
    past the model or below the empty circuit, a circuit that is the whole graph, how normalised heads are read."""
    notes = []
    gaps = clean_ld - corrupt_ld
    total = float(gaps.sum())
    if total < 0:
        notes.append(
            f"the corrupted prompts favour the answer more than the clean ones (clean − corrupted = "
            f"{total / len(gaps):.3f} logits on average): answer and wrong may be swapped"
        )
    against = [pair.source for pair, gap in zip(pairs, gaps, strict=True) if gap * total < 0]
    if against:
        listed = ", ".join(against[:3]) + (f" and {len(against) - 3:,} more" if len(against) > 3 else "")
        notes.append(
            f"the corruption moves the logit difference the other way in {counted(len(against), 'pair')} "
            f"({listed}): in the scores and the faithfulness they count against the others"
        )
    for name, rows in (("by |score|", curve), ("by signed score", signed)):
        above = [row for row in rows if row["f"] > FAR_ABOVE]
        below = [row for row in rows if row["f"] < FAR_BELOW]
        if above:
            notes.append(
                f"circuits of the top edges {name} go past the whole model (f up to "
                f"{max(row['f'] for row in above):.2f}, at {_percents(above)}): they leave out edges that work "
                "against the answer (negative scores)"
            )
        if below:
            notes.append(
                f"circuits of the top edges {name} do worse than no edge at all (f down to "
                f"{min(row['f'] for row in below):.2f}, at {_percents(below)}): their edges' effects need others left "
                "out, or cancel"
            )
    if circuit["percent"] == 100.0 and len(curve) > 1:
        notes.append(
            f"no circuit smaller than the whole graph reaches faithfulness {analysis.target:g}: the circuit is every "
            "edge (add budgets with --budgets, or lower --target)"
        )
    if normalised:
        notes.append(
            f"{counted(len(normalised), 'layer')} normalise their attention's output before the residual sum: a head's "
            "edges carry its share before the norm, and the norm is recomputed for each input (as MIB does)"
        )
    return notes


def _percents(rows: Sequence[dict]) -> str:
    return ", ".join(f"{row['percent']:g} %" for row in rows[:4]) + (" and more" if len(rows) > 4 else "")
