"""The graph of `discover` (models.graph) and its faithfulness arithmetic (scores.faithfulness), by hand: edge counts
from the definition (and GPT-2 small's count in the literature), names, grouped-query and parallel blocks, MIB's
pruning on circuits built by hand, budgets, rankings and the areas of hand-made curves."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.models.graph import Graph
from attnscope.scores import faithfulness


def counted_by_hand(L: int, H: int, K: int, parallel: bool) -> int:
    """Σ over inputs of the nodes they read: a layer's H + 2K attention inputs read the embeddings and every earlier
    layer's H heads and MLP; its MLP reads those and (not in a parallel block) its own H heads; the logits read all."""
    total = 0
    for layer in range(L):
        before = 1 + layer * (H + 1)
        total += (H + 2 * K) * before + before + (0 if parallel else H)
    return total + 1 + L * (H + 1)


@pytest.mark.parametrize("shape", [(12, 12, 12, False), (2, 4, 4, False), (3, 8, 2, False), (4, 6, 6, True)])
def test_edges_are_counted_as_the_definition_says(shape):
    graph = Graph(*shape)
    assert graph.n_edges == counted_by_hand(*shape) == len(graph.edges)
    assert graph.valid.sum() == graph.n_edges


def test_gpt2_small_has_the_literatures_count():
    assert Graph(12, 12, 12).n_edges == 32_491  # MIB's GPT-2 graph; Conmy et al. 2023 say about 32,000


def test_names_of_edges_and_inputs():
    graph = Graph(2, 4, 2)
    assert graph.upstream_names[:6] == ("embed", "0.0", "0.1", "0.2", "0.3", "mlp 0")
    assert graph.input_targets[:9] == (
        ("0.0", "q"), ("0.1", "q"), ("0.2", "q"), ("0.3", "q"),
        ("0.kv0", "k"), ("0.kv1", "k"), ("0.kv0", "v"), ("0.kv1", "v"), ("mlp 0", None),
    )  # fmt: skip
    assert graph.input_targets[-1] == ("logits", None)
    assert graph.edge_name(graph.head_index(0, 2), graph.first_input(1) + 5) == ("0.2", "1.kv1", "k")
    assert Graph(1, 2, 2).input_targets[2] == ("0.0", "k")  # multi-head: keys go to the head itself


def test_a_parallel_block_has_no_edge_from_a_layers_heads_into_its_mlp():
    sequential, parallel = Graph(2, 4, 4), Graph(2, 4, 4, parallel=True)
    mlp = sequential.first_input(1) + sequential.inputs_per_layer - 1
    assert sequential.upstream_count(mlp) == 1 + 5 + 4 and parallel.upstream_count(mlp) == 1 + 5
    assert sequential.n_edges - parallel.n_edges == 2 * 4


def _kept(graph: Graph, *named: tuple[str, str, str | None]) -> np.ndarray:
    kept = np.zeros_like(graph.valid)
    for edge in named:
        (index,) = [k for k, (u, v) in enumerate(graph.edges) if graph.edge_name(u, v) == edge]
        upstream, target = graph.edges[index]
        kept[upstream, target] = True
    return kept


def test_pruning_keeps_the_edges_on_a_path_from_the_embeddings_to_the_logits():
    graph = Graph(2, 4, 2)
    path = _kept(graph, ("embed", "0.1", "q"), ("0.1", "logits", None))
    assert (graph.pruned(path) == path).all()
    dangling = _kept(graph, ("embed", "0.1", "q"))  # 0.1 reaches nothing
    assert not graph.pruned(dangling).any()
    unreached = _kept(graph, ("0.1", "logits", None))  # 0.1 reads nothing kept
    assert not graph.pruned(unreached).any()
    # under grouped-query attention 1.1 reads key/value head 0 (heads 0 and 1 share it): kept through its key
    through_key = _kept(graph, ("embed", "1.kv0", "k"), ("1.1", "logits", None))
    assert (graph.pruned(through_key) == through_key).all()
    other_group = _kept(graph, ("embed", "1.kv1", "k"), ("1.1", "logits", None))
    assert not graph.pruned(other_group).any()


def test_budgets_are_floors_of_the_share_of_edges_as_mibs_int():
    assert [faithfulness.budget_edges(p, 110) for p in (0.1, 0.5, 1, 2, 5, 10, 20, 50, 100)] == [
        0, 0, 1, 2, 5, 11, 22, 55, 110
    ]  # fmt: skip
    assert faithfulness.budget_edges(0.1, 32_491) == 32 and faithfulness.budget_edges(0.2, 1000) == 2


def test_rankings_by_magnitude_and_by_sign_keep_ties_in_order():
    scores = np.array([1.0, -2.0, 2.0, 0.0])
    assert faithfulness.ranked(scores, absolute=True).tolist() == [1, 2, 0, 3]
    assert faithfulness.ranked(scores, absolute=False).tolist() == [2, 0, 3, 1]


def test_faithfulness_and_the_areas_of_hand_made_curves():
    assert faithfulness.faithfulness(2.0, 5.0, 1.0) == pytest.approx(0.25)
    assert math.isnan(faithfulness.faithfulness(2.0, 1.0005, 1.0))  # the model and the empty circuit agree
    cpr, cmd = faithfulness.areas([1, 10, 100], [0.2, 0.6, 1.0], [0.5, 1.2, 1.0])
    assert cpr == pytest.approx(0.09 * 0.8 / 2 + 0.9 * 1.6 / 2)
    assert cmd == pytest.approx(0.09 * 0.7 / 2 + 0.9 * 0.2 / 2)
    assert faithfulness.smallest_faithful([0.1, 0.85, 0.7, 1.0], 0.8) == 1
    assert faithfulness.smallest_faithful([0.1, float("nan"), 0.99], 1.0) == 2  # the whole graph at worst


@pytest.mark.parametrize(
    "text, expected",
    [("1,0.1,100", (0.1, 1.0, 100.0)), ("10%, 5%", (5.0, 10.0)), ("50,50", (50.0,))],
)
def test_budgets_are_read_sorted_and_once(text, expected):
    assert options.BUDGETS.parse(text) == expected


@pytest.mark.parametrize("value", [[0], [101], [float("nan")], ["5"], [], "5"])
def test_budgets_out_of_their_domain_are_refused(value):
    with pytest.raises(AttnscopeError, match="^budgets "):
        options.BUDGETS.check(value, "budgets")
