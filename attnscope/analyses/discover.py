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
circuit (as copies of the batch, as many per pass as fit in `pipeline.pair_batch.EDGE_COPY_BYTES`). The runs of a
batch are `pipeline.pair_batch.PairBatch`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope import settings
from attnscope.analyses.common import check_finite, check_weights
from attnscope.analyses.result import Result
from attnscope.errors import AttnscopeError
from attnscope.models.graph import Graph
from attnscope.models.loading import LoadedModel, fastest_attention
from attnscope.output.discover import DiscoverView
from attnscope.pipeline import distributed, interventions, prompt_pairs
from attnscope.pipeline.edges import Layout, NodeRecord
from attnscope.pipeline.pair_batch import PairBatch
from attnscope.pipeline.tokens import default_bos
from attnscope.scores import faithfulness
from attnscope.scores.catalog import counted
from attnscope.settings.intervene import EXACT_MAX_EDGES


@dataclass(repr=False)  # the repr is Result's: a summary
class DiscoverResult(Result):
    """Every edge's score (`scores`, float64, in `graph.edges`' order), the faithfulness of the circuits of the top
    edges on the budget grid (`faithfulness`: ranked by |score|; `faithfulness_signed`: by signed score), MIB's CPR
    and CMD, and the circuit chosen (see the module docstring)."""

    view_class = DiscoverView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

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


@dataclass
class _Curves:
    """What the faithfulness runs found: m(∅), both rankings' curves, CPR, CMD and the circuit chosen."""

    empty: float
    curve: list[dict[str, Any]]
    signed: list[dict[str, Any]]
    cpr: float
    cmd: float
    circuit: dict[str, Any]


# ------------------------------------------------------------------------------------------------- the analysis


class Discover(settings.Discover):
    """Every edge's score and the faithfulness of the circuits of the top edges (see the module docstring). Needs
    the model loaded with its language-model head."""

    def read_inputs(self) -> list[prompt_pairs.PromptPair]:
        """The pairs: the one of clean, corrupt, answer and wrong, or those of the file."""
        return prompt_pairs.pairs_given(self.file, self.clean, self.corrupt, self.answer, self.wrong)

    def run(
        self, loaded: LoadedModel, pairs: Sequence[prompt_pairs.PromptPair] | None = None, progress: Any = None
    ) -> DiscoverResult:
        if loaded.lm_model is None:
            raise AttnscopeError("discover needs the model's language-model head, and this model was loaded without it")
        self.check_shape(loaded.shape)
        pairs = list(self.read_inputs() if pairs is None else pairs)
        layout = Layout.of(loaded)  # an encoder or a post-norm decoder: refused here
        graph = layout.graph
        check_weights(loaded)  # SDPA turns a NaN head's output into zeros
        bos = default_bos(loaded.tokenizer, loaded.kind) if self.bos is None else self.bos
        prefix, tokens = prompt_pairs.tokenized_pairs(loaded, pairs, bos)
        groups = prompt_pairs.length_groups([len(pair.clean) for pair in tokens], self.batch_size, self.max_tokens)
        self._check_exact(graph, len(groups))

        def batches() -> Any:
            return (PairBatch(loaded, layout, tokens, group) for group in groups)

        with interventions.attention(loaded, fastest_attention(loaded.lm_model)):
            clean_ld, corrupt_ld, means = self._baselines(loaded, groups, batches())
            total = np.zeros((graph.n_upstream, graph.n_inputs))
            for found in distributed.in_rounds(batches(), lambda one: self._scores(one, means)):
                total += found
            scores = total[graph.edges[:, 0], graph.edges[:, 1]] / len(pairs)
            check_finite(loaded, "edge score", scores)
            curves = self._faithfulness(graph, scores, batches(), means, float(np.sum(clean_ld)), len(pairs))
        result = self._result(loaded, pairs, tokens, bos, graph, scores, clean_ld, corrupt_ld, curves)
        result.notes += _notes(self, pairs, clean_ld, corrupt_ld, curves, layout)
        result.notes += prompt_pairs.written_specials(loaded, pairs, tokens, len(prefix))
        return result

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

        def baseline(one: PairBatch) -> tuple[Any, Any, Any, int]:
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
        prompt_pairs.check_gap(clean_ld, corrupt_ld, "an edge to carry")
        wide = torch.promote_types(loaded.dtype, torch.float32)  # float32, or a float64 model's own
        means = None if sums is None else _to_device(sums.mean(positions, wide), loaded.device)
        return clean_ld, corrupt_ld, means

    # ---------------------------------------------------------------- the scores

    def _scores(self, one: PairBatch, means: NodeRecord | None) -> np.ndarray:
        """(U, V) float64: the batch's edge scores summed over its pairs (zero where no edge is)."""
        if self.method == "exact":
            return one.exact_scores(means)
        alphas = [1.0] if self.method == "eap" else [(j + 0.5) / self.ig_steps for j in range(self.ig_steps)]
        return one.gradient_scores(means, alphas)

    # ---------------------------------------------------------------- faithfulness

    def _faithfulness(
        self, graph: Graph, scores: np.ndarray, batches: Any, means: NodeRecord | None, clean_sum: float, P: int
    ) -> _Curves:
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

        def work(one: PairBatch) -> np.ndarray:
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
        return _Curves(float(m[empty]), curves[True], curves[False], cpr, cmd, chosen_circuit)

    # ---------------------------------------------------------------- the result

    def _result(
        self,
        loaded: LoadedModel,
        pairs: Sequence[prompt_pairs.PromptPair],
        tokens: Sequence[prompt_pairs.TokenizedPair],
        bos: bool,
        graph: Graph,
        scores: np.ndarray,
        clean_ld: np.ndarray,
        corrupt_ld: np.ndarray,
        curves: _Curves,
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
            prompt_pairs.pair_records(loaded, pairs, tokens, clean_ld, corrupt_ld),
            graph,
            scores,
            float(np.mean(clean_ld)),
            float(np.mean(corrupt_ld)),
            curves.empty,
            curves.curve,
            curves.signed,
            curves.cpr,
            curves.cmd,
            curves.circuit,
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
    pairs: Sequence[prompt_pairs.PromptPair],
    clean_ld: np.ndarray,
    corrupt_ld: np.ndarray,
    curves: _Curves,
    layout: Layout,
) -> list[str]:
    """What to know: a difference with the sign the user did not expect, pairs that pull the other way, circuits
    past the model or below the empty circuit, a circuit that is the whole graph, how normalised heads are read."""
    curve, signed, circuit = curves.curve, curves.signed, curves.circuit
    notes = prompt_pairs.pair_notes(pairs, clean_ld, corrupt_ld, "the scores and the faithfulness")
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
    if any(math.isnan(row["f"]) for row in curve):
        notes.append(
            "with every edge ablated the model gives the clean logit difference (within 0.001 logits): faithfulness "
            "is undefined (null in the JSON) and the circuit is every edge; ablate with the corrupted run (--ablation "
            "corrupt)"
        )
    elif circuit["percent"] == 100.0 and len(curve) > 1:
        notes.append(
            f"no circuit smaller than the whole graph reaches faithfulness {analysis.target:g}: the circuit is every "
            "edge (add budgets with --budgets, or lower --target)"
        )
    if layout.normalised:
        notes.append(
            f"{counted(len(layout.normalised), 'layer')} normalise their attention's output before the residual sum: a "
            "head's edges carry its share before the norm, and the norm is recomputed for each input (as MIB does)"
        )
    return notes


def _percents(rows: Sequence[dict]) -> str:
    return ", ".join(f"{row['percent']:g} %" for row in rows[:4]) + (" and more" if len(rows) > 4 else "")
