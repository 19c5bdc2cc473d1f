"""`discover` against edges patched by hand: GPT-2 written out here from its own weights in float64, every input of
every node (each head's query, key and value, each MLP, the logits) its own sum of the nodes' outputs before it, an
edge outside a circuit taking its value from a run of the corrupted prompt (or the mean). On the bundled demo model,
whose circuit is known (the previous-token head 0.2 feeds the induction heads' keys when the token before the first
` method` is corrupted), `exact` equals each edge patched alone by hand, EAP and EAP-IG equal the gradients of the
hand-written model, every faithfulness value equals the hand-written run of its circuit, f(100 %) = 1 and m(∅) is
the corrupted run's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope.analyses.discover import Discover
from attnscope.errors import AttnscopeError
from attnscope.models.graph import Graph
from attnscope.pipeline.prompt_pairs import PromptPair
from attnscope.scores import faithfulness

# Two pairs of one length (a batch of two) and one of another: the corruption hits the token before the first
# ` method` (` value` -> ` code`), so the previous-token head 0.2 writes another token there and the induction heads
# 1.0 and 1.3, at the last ` value`, no longer find ` method` after the earlier ` value`.
PAIRS = [
    PromptPair(
        "The file and the list hold the value method. The file and the list hold the value",
        "The file and the list hold the code method. The file and the list hold the value",
        "method",
        "table",
        "pair 0",
    ),
    PromptPair(
        "The list and the file hold the code table. The list and the file hold the code",
        "The list and the file hold the value table. The list and the file hold the code",
        "table",
        "method",
        "pair 1",
    ),
    PromptPair(
        "A tree and the man see the code run. A tree and the man see the code",
        "A tree and the man see the value run. A tree and the man see the code",
        "run",
        "list",
        "pair 2",
    ),
]


class HandGPT2:
    """GPT-2 from its weights, float64: `run` gives each node's output (graph order: embed, per layer its heads
    then its MLP) and the logit difference at the last position, each input built from the outputs before it, with
    `removed[u, v]` edges taking `ablated[u]` instead, and `nudges[v]` (zero tensors that require grad) added to
    input v so that its gradient can be read."""

    def __init__(self, lm_model):
        config = lm_model.config
        assert config.activation_function == "gelu_new" and config.scale_attn_weights
        assert not config.scale_attn_by_inverse_layer_idx and not config.reorder_and_upcast_attn
        self.w = {name: value.detach().double() for name, value in lm_model.state_dict().items()}
        self.L, self.H, self.d = config.n_layer, config.n_head, config.n_embd
        self.eps = config.layer_norm_epsilon
        self.graph = Graph(self.L, self.H, self.H)

    def _ln(self, x, name):
        return F.layer_norm(x, (self.d,), self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.eps)

    def _input(self, outputs, index, removed, ablated, nudges):
        total = 0
        for u in range(self.graph.upstream_count(index)):
            take = ablated[u] if removed is not None and removed[u, index] else outputs[u]
            total = total + take
        if nudges is not None:
            total = total + nudges[index]
        return total

    def run(self, ids, answer, wrong, removed=None, ablated=None, nudges=None, embed=None):
        w, H, d, graph = self.w, self.H, self.d, self.graph
        k = d // H
        n = ids.shape[-1]
        positions = torch.arange(n)
        outputs = [
            w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][positions] if embed is None else embed
        ]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        for layer in range(self.L):
            p = f"transformer.h.{layer}"
            first = graph.first_input(layer)
            W, b = w[f"{p}.attn.c_attn.weight"], w[f"{p}.attn.c_attn.bias"]  # (d, 3d) Conv1D: x @ W + b
            W_O, b_O = w[f"{p}.attn.c_proj.weight"], w[f"{p}.attn.c_proj.bias"]
            heads = []
            for head in range(H):
                streams = [self._input(outputs, first + j * H + head, removed, ablated, nudges) for j in range(3)]
                q, key, v = (
                    self._ln(stream, f"{p}.ln_1") @ W[:, j * d + head * k : j * d + (head + 1) * k]
                    + b[j * d + head * k : j * d + (head + 1) * k]
                    for j, stream in enumerate(streams)
                )
                logits = (q @ key.transpose(-1, -2)) / k**0.5
                z = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1) @ v
                heads.append(z @ W_O[head * k : (head + 1) * k] + b_O / H)
            outputs += heads
            stream = self._input(outputs, first + 3 * H, removed, ablated, nudges)
            hidden = self._ln(stream, f"{p}.ln_2") @ w[f"{p}.mlp.c_fc.weight"] + w[f"{p}.mlp.c_fc.bias"]
            hidden = F.gelu(hidden, approximate="tanh")
            outputs.append(hidden @ w[f"{p}.mlp.c_proj.weight"] + w[f"{p}.mlp.c_proj.bias"])
        final = self._input(outputs, graph.n_inputs - 1, removed, ablated, nudges)
        logits = self._ln(final, "transformer.ln_f")[..., -1, :] @ w["transformer.wte.weight"].T
        return outputs, logits[..., answer] - logits[..., wrong]


@pytest.fixture(scope="module")
def demo():
    return attnscope.load("demo", "cpu", lm_head=True)


@pytest.fixture(scope="module")
def hand(demo):
    return HandGPT2(demo.lm_model)


@pytest.fixture(scope="module")
def encoded(demo):
    """Per pair: clean and corrupted ids (with BOS, as discover reads them), answer and wrong ids."""
    bos = demo.tokenizer.bos_token_id
    found = []
    for pair in PAIRS:
        clean = torch.tensor([bos, *demo.tokenizer(pair.clean)["input_ids"]])
        corrupt = torch.tensor([bos, *demo.tokenizer(pair.corrupt)["input_ids"]])
        answer = demo.tokenizer(" " + pair.answer)["input_ids"]
        wrong = demo.tokenizer(" " + pair.wrong)["input_ids"]
        assert len(clean) == len(corrupt) and len(answer) == len(wrong) == 1
        found.append((clean, corrupt, answer[0], wrong[0]))
    return found


class Results(dict):
    """discover's result for (method, ablation) on the three pairs, run when a test first asks."""

    def __init__(self, demo):
        super().__init__()
        self.demo = demo

    def __missing__(self, key):
        method, ablation = key
        given = dict(clean="-", corrupt="-", answer="-", wrong="-")  # the pairs are handed to run
        self[key] = Discover(method=method, ablation=ablation, **given).run(self.demo, PAIRS)
        return self[key]


@pytest.fixture(scope="module")
def results(demo):
    return Results(demo)


def hand_ablated(hand, encoded, ablation):
    """Per pair, what each node's ablated edges carry: its corrupted run's outputs, or its mean over every position
    of every pair, clean and corrupted."""
    runs = [(hand.run(clean, a, w)[0], hand.run(corrupt, a, w)[0]) for clean, corrupt, a, w in encoded]
    if ablation == "corrupt":
        return [corrupt for _, corrupt in runs]
    count = sum(2 * len(clean) for clean, _, _, _ in encoded)
    means = [sum(run[u].sum(0) for pair in runs for run in pair) / count for u in range(hand.graph.n_upstream)]
    return [[mean.expand(len(clean), -1) for mean in means] for clean, _, _, _ in encoded]


def hand_mean_ld(hand, encoded, ablated, removed):
    """The mean over pairs of the clean run's LD with the `removed` edges ablated."""
    runs = [hand.run(c, a, w, removed, abl)[1].item() for (c, _, a, w), abl in zip(encoded, ablated, strict=True)]
    return float(np.mean(runs))


def test_the_graph_of_the_demo(results):
    graph = results[("exact", "corrupt")].graph
    assert (graph.n_layer, graph.n_head, graph.n_kv_head, graph.parallel) == (2, 4, 4, False)
    assert graph.n_edges == len(results[("exact", "corrupt")].scores) == 110


@pytest.mark.parametrize("ablation", ["corrupt", pytest.param("mean", marks=pytest.mark.slow)])
def test_exact_equals_each_edge_patched_alone_by_hand(results, hand, encoded, ablation):
    result = results[("exact", ablation)]
    graph = result.graph
    ablated = hand_ablated(hand, encoded, ablation)
    clean = hand_mean_ld(hand, encoded, ablated, None)
    expected = np.zeros(graph.n_edges)
    for index, (u, v) in enumerate(graph.edges):
        removed = np.zeros((graph.n_upstream, graph.n_inputs), dtype=bool)
        removed[u, v] = True
        expected[index] = clean - hand_mean_ld(hand, encoded, ablated, removed)
    assert np.abs(expected).max() > 1  # edges that matter, and
    np.testing.assert_allclose(result.scores, expected, atol=5e-4, rtol=1e-4)


def hand_gradient_scores(hand, encoded, alphas, ablation="corrupt"):
    """EAP (alphas [1]) or EAP-IG (midpoints): Σ_positions (c_u − a_u) · ∂LD/∂r_v averaged over the alphas and the
    pairs, the gradient at each input read from a zero nudge added to it in the hand-written model."""
    graph = hand.graph
    total = np.zeros(graph.n_edges)
    for (clean, _, answer, wrong), corrupt_out in zip(encoded, hand_ablated(hand, encoded, ablation), strict=True):
        clean_out, _ = hand.run(clean, answer, wrong)
        for alpha in alphas:
            nudges = [
                torch.zeros(len(clean), hand.d, dtype=torch.float64, requires_grad=True) for _ in range(graph.n_inputs)
            ]
            embed = corrupt_out[0] + alpha * (clean_out[0] - corrupt_out[0])
            _, ld = hand.run(clean, answer, wrong, nudges=nudges, embed=embed)
            ld.backward()
            for index, (u, v) in enumerate(graph.edges):
                total[index] += float(((clean_out[u] - corrupt_out[u]).detach() * nudges[v].grad).sum()) / len(alphas)
    return total / len(encoded)


def test_eap_equals_the_gradient_of_the_hand_written_model(results, hand, encoded):
    expected = hand_gradient_scores(hand, encoded, [1.0])
    np.testing.assert_allclose(results[("eap", "corrupt")].scores, expected, atol=5e-4, rtol=1e-3)


@pytest.mark.slow
def test_eap_ig_with_mean_ablation_equals_the_hand_written_model(results, hand, encoded):
    """The ablated values are each node's mean over every position of the pairs, the embeddings moved from theirs."""
    expected = hand_gradient_scores(hand, encoded, [(j + 0.5) / 5 for j in range(5)], "mean")
    np.testing.assert_allclose(results[("eap-ig", "mean")].scores, expected, atol=5e-4, rtol=1e-3)


def test_eap_ig_equals_integrated_gradients_of_the_hand_written_model(results, hand, encoded):
    expected = hand_gradient_scores(hand, encoded, [(j + 0.5) / 5 for j in range(5)])
    np.testing.assert_allclose(results[("eap-ig", "corrupt")].scores, expected, atol=5e-4, rtol=1e-3)
    # integrated gradients come closer to the exact scores than the one gradient of EAP
    exact = results[("exact", "corrupt")].scores
    assert np.abs(expected - exact).sum() < np.abs(results[("eap", "corrupt")].scores - exact).sum()


@pytest.mark.parametrize("method", ["exact", "eap-ig"])
def test_the_known_circuit_is_found(results, method):
    """The previous-token head's output into the induction heads' keys, directly and through the MLP of layer 0,
    and the embeddings into 0.2's value: in the circuit chosen, which reaches the target."""
    result = results[(method, "corrupt")]
    chosen = {result.edge(index) for index in result.circuit["edges"]}
    for edge in (("0.2", "1.0", "k"), ("0.2", "1.3", "k"), ("0.2", "mlp 0", None), ("embed", "0.2", "v")):
        assert edge in chosen
    assert result.circuit["f"] >= 0.8
    assert result.circuit["percent"] < 100
    top = [result.edge(index) for index in result.ranked()[:3]]
    assert ("0.2", "mlp 0", None) in top


@pytest.mark.parametrize(
    "key", [("exact", "corrupt"), ("eap-ig", "corrupt"), pytest.param(("exact", "mean"), marks=pytest.mark.slow)]
)
def test_every_faithfulness_value_equals_a_hand_written_run_of_its_circuit(results, hand, encoded, key):
    result = results[key]
    graph = result.graph
    ablated = hand_ablated(hand, encoded, key[1])
    full = hand_mean_ld(hand, encoded, ablated, None)
    empty = hand_mean_ld(hand, encoded, ablated, graph.valid)
    assert result.clean_logit_diff == pytest.approx(full, abs=1e-4)
    assert result.ablated_logit_diff == pytest.approx(empty, abs=1e-4)
    if key[1] == "corrupt":  # every edge ablated: the corrupted run itself
        assert empty == pytest.approx(result.corrupt_logit_diff, abs=1e-4)
    for absolute, curve in ((True, result.faithfulness), (False, result.faithfulness_signed)):
        order = faithfulness.ranked(result.scores, absolute)
        for row in curve:
            assert row["edges"] == int(row["percent"] * graph.n_edges / 100 + 1e-9)
            kept = graph.pruned(graph.mask(order[: row["edges"]]))
            assert row["kept"] == kept.sum()
            expected = (hand_mean_ld(hand, encoded, ablated, graph.valid & ~kept) - empty) / (full - empty)
            assert row["f"] == pytest.approx(expected, abs=2e-4)
    assert result.faithfulness[-1]["f"] == pytest.approx(1.0, abs=1e-6)


def test_cpr_and_cmd_are_the_areas_of_the_curves(results):
    result = results[("eap-ig", "corrupt")]
    x = np.array([row["percent"] for row in result.faithfulness]) / 100
    signed = np.array([row["f"] for row in result.faithfulness_signed])
    absolute = np.array([row["f"] for row in result.faithfulness])
    assert result.cpr == pytest.approx(np.trapezoid(signed, x))
    assert result.cmd == pytest.approx(np.trapezoid(np.abs(1 - absolute), x))


def test_a_corruption_that_changes_nothing_is_refused(demo):
    same = PromptPair(PAIRS[0].clean, PAIRS[0].clean, "method", "table", "pair")
    with pytest.raises(AttnscopeError, match="same logit difference"):
        Discover(clean="-", corrupt="-", answer="-", wrong="-").run(demo, [same])


@pytest.mark.slow
def test_layers_added_a_few_at_a_time_give_the_scores_of_one_at_a_time(tmp_path, monkeypatch):
    """The gradients' products take LAYERS_PER_PRODUCT layers at once (on 6 layers: 2-5, then 0-1); one layer at a
    time gives the same scores."""
    from attnscope.pipeline import edge_gradients as edges
    from tests.support import build_tiny_gpt2

    model = attnscope.load(build_tiny_gpt2(tmp_path / "six", n_layer=6), "cpu", lm_head=True)
    pair = PromptPair("When Mary and John went to the store, John gave a drink to",
                      "When Mary and John went to the store, Mary gave a drink to", "Mary", "John", "pair")  # fmt: skip
    given = dict(clean="-", corrupt="-", answer="-", wrong="-", method="eap", budgets=[100])
    assert edges.LAYERS_PER_PRODUCT == 4
    chunked = Discover(**given).run(model, [pair]).scores
    monkeypatch.setattr(edges, "LAYERS_PER_PRODUCT", 1)
    one_by_one = Discover(**given).run(model, [pair]).scores
    assert np.abs(chunked).max() > 1e-3
    np.testing.assert_allclose(chunked, one_by_one, rtol=1e-5, atol=1e-6)
