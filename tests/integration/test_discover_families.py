"""`discover`'s edges on every decoder family, each checked against something independent of the edge machinery:
the family's own forward pass, `patch`'s replacement of a head's output, and the machinery's other half.

On a tiny random model of each family, run in float64 (so that differences of 10⁻⁶ mean something):

- the split forward is the model: every input rebuilt edge by edge from the clean run's own outputs (every edge
  "removed" in favour of the same values) gives the clean logit difference, through the split projections (fused,
  per-head, grouped-query), the families' norms, their rotary and QK-norms, soft-capping and sliding windows;
- ablating every edge gives the corrupted run (f(0) = 0), and ablating every edge out of one head is the same as
  putting that head's corrupted output into the clean run (`interventions.PatchedHeads`, which `patch` uses), also
  where the layer normalises its attention's output (Gemma 2, OLMo 2);
- the gradients (EAP) are the forward's derivative: each edge's EAP score equals the derivative of the logit
  difference with that edge alone ablated to values a small ε of the way from the clean run's to the corrupted run's
  (a central difference quotient, the runs through the forward machinery).

A grouped-query Llama and Gemma 2 (soft-capping, a sliding window, a normalised attention output) run in the quick
loop; every decoder family (GPT-2, the parallel GPT-NeoX and Phi, OPT whose MLP reads the stream flattened, the
mixtures of experts, ...) in the slow one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnscope
from attnscope.models.families import BY_MODEL_TYPE
from attnscope.pipeline import interventions
from attnscope.pipeline.edge_circuits import PatchedEdges
from attnscope.pipeline.edge_gradients import EdgeGradients
from attnscope.pipeline.edges import DifferenceRecorder, Layout, NodeRecord, NodeRecorder
from attnscope.pipeline.prompt_pairs import LogitDifference
from tests.support import FAMILY_MODELS

DECODERS = sorted(name for name in FAMILY_MODELS if BY_MODEL_TYPE[name].kind_name == "decoder")
QUICK = ["llama", "gemma2"]  # grouped-query; soft-capping, a sliding window, a normalised attention output
# The families' eager attention takes its softmax in float32 even in a float64 model: a logit difference moves by
# ~1e-7 for any change, so the difference quotient is central, over ±1e-3 (its error ε² ≈ 1e-6, the noise 5e-5).
EPSILON = 1e-3


class Run:
    """One family's model in float64, a batch of two random prompts of 9 tokens and their corrupted twins (two
    tokens changed), and the runs the checks need."""

    def __init__(self, folder):
        self.loaded = attnscope.load(folder, "cpu", lm_head=True)
        self.loaded.lm_model.double()
        self.loaded.config._experts_implementation = "eager"  # grouped_mm takes no float64 (mixture-of-experts MLPs)
        self.layout = Layout.of(self.loaded)
        self.graph = self.layout.graph
        vocab = self.loaded.config.vocab_size
        generator = torch.Generator().manual_seed(0)
        self.clean = torch.randint(3, vocab, (2, 9), generator=generator)
        self.corrupt = self.clean.clone()
        self.corrupt[:, [2, 5]] = torch.randint(3, vocab, (2, 2), generator=generator)
        self.answer, self.wrong = torch.tensor([3, 4]), torch.tensor([5, 6])
        self.metric = LogitDifference(self.loaded)

    def ld(self, ids, *kinds, copies=1):
        with torch.no_grad(), interventions.hooks(self.loaded, *kinds):
            return self.metric(ids.repeat(copies, 1), self.answer.repeat(copies), self.wrong.repeat(copies))

    def recorded(self, ids):
        recorder = NodeRecorder(self.layout)
        return recorder, self.ld(ids, recorder)

    def removed(self, masks):
        return torch.from_numpy(np.stack(masks))


@pytest.fixture(scope="module")
def runs(family_dir):
    made = {}

    def run(name):
        if name not in made:
            made[name] = Run(family_dir(name))
        return made[name]

    return run


def mixed(clean: NodeRecord, corrupt: NodeRecord, epsilon: float) -> NodeRecord:
    """The outputs ε of the way from the clean run's to the corrupted run's."""

    def between(a, b):
        return a + epsilon * (b - a)

    return NodeRecord(
        between(clean.embed, corrupt.embed),
        [between(a, b) for a, b in zip(clean.heads, corrupt.heads, strict=True)],
        [between(a, b) for a, b in zip(clean.attention, corrupt.attention, strict=True)],
        [between(a, b) for a, b in zip(clean.mlp, corrupt.mlp, strict=True)],
    )


def check_family(run: Run) -> None:
    graph, valid = run.graph, run.graph.valid
    clean, clean_ld = run.recorded(run.clean)
    corrupt, corrupt_ld = run.recorded(run.corrupt)
    assert (clean_ld - corrupt_ld).abs().max() > 1e-3  # the corruption changes something

    # every input rebuilt from the clean run's own outputs, every layer split: the clean run
    rebuilt = run.ld(run.clean, PatchedEdges(run.layout, run.removed([valid]), clean.record))
    torch.testing.assert_close(rebuilt, clean_ld, rtol=1e-7, atol=1e-7)
    # every edge ablated: the corrupted run
    emptied = run.ld(run.clean, PatchedEdges(run.layout, run.removed([valid]), corrupt.record))
    torch.testing.assert_close(emptied, corrupt_ld, rtol=1e-7, atol=1e-7)

    # every edge out of one head (the last layer's head 0, and layer 0's last) = that head's corrupted output
    heads = interventions.HeadOutputsRecorder()
    run.ld(run.corrupt, heads)
    for layer, head in ((graph.n_layer - 1, 0), (0, graph.n_head - 1)):
        out_of_head = np.zeros_like(valid)
        out_of_head[graph.head_index(layer, head)] = valid[graph.head_index(layer, head)]
        cut = run.ld(run.clean, PatchedEdges(run.layout, run.removed([out_of_head]), corrupt.record))
        patches = interventions.PatchedHeads()
        chosen = torch.zeros(1, 1, 1, graph.n_head, dtype=torch.bool)
        chosen[..., head] = True
        patches.chosen, patches.values = {layer: chosen}, {layer: heads.outputs[layer]}
        torch.testing.assert_close(cut, run.ld(run.clean, patches), rtol=1e-7, atol=1e-7)

    # EAP at the clean run = d/dε of each edge ablated alone towards the corrupted run
    scores = torch.zeros(graph.n_upstream, graph.n_inputs, dtype=torch.float64)
    ablated = DifferenceRecorder(run.layout, None, -1.0)
    run.ld(run.corrupt, ablated)
    run.ld(run.clean, DifferenceRecorder(run.layout, ablated.differences, 1.0))
    with interventions.weights_frozen(run.loaded), torch.enable_grad():
        with interventions.hooks(run.loaded, EdgeGradients(run.layout, ablated.differences, 1.0, scores)):
            run.metric(run.clean, run.answer, run.wrong).sum().backward()
    eap = scores.numpy()[graph.edges[:, 0], graph.edges[:, 1]]
    one_edge = []
    for upstream, index in graph.edges:
        alone = np.zeros_like(valid)
        alone[upstream, index] = True
        one_edge.append(alone)
    moved = {}
    for sign in (1, -1):
        nudged = mixed(clean.record, corrupt.record, sign * EPSILON)
        patched = run.ld(run.clean, PatchedEdges(run.layout, run.removed(one_edge), nudged), copies=len(one_edge))
        moved[sign] = patched.view(len(one_edge), -1).sum(dim=1).numpy()
    derivative = (moved[-1] - moved[1]) / (2 * EPSILON)
    assert np.abs(eap).max() > 1e-2
    np.testing.assert_allclose(derivative, eap, rtol=1e-3, atol=1e-3 * np.abs(eap).max())


@pytest.mark.parametrize("name", QUICK)
def test_edges_agree_with_the_model_and_with_patching(runs, name):
    check_family(runs(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in DECODERS if name not in QUICK])
def test_edges_agree_with_the_model_and_with_patching_in_every_family(runs, name):
    check_family(runs(name))


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
def test_the_graph_follows_each_architecture(runs):
    llama, neox, phi = runs("llama").graph, runs("gpt_neox").graph, runs("phi").graph
    assert (llama.n_head, llama.n_kv_head, llama.grouped) == (4, 2, True)
    assert llama.input_targets[llama.first_input(1) + 4] == ("1.kv0", "k")
    # a key/value head is one input for its query heads: 2 layers, 4 heads, 2 KV heads (embed, 5 nodes a layer)
    assert llama.n_edges == (4 + 2 * 2) * 1 + 5 + (4 + 2 * 2) * 6 + 10 + 11
    assert neox.parallel and phi.parallel and not llama.parallel
    # parallel blocks: no edge from a layer's heads into its own MLP
    mlp = neox.first_input(0) + neox.inputs_per_layer - 1
    assert neox.upstream_count(mlp) == 1 and llama.upstream_count(llama.first_input(0) + 8) == 5
    assert runs("gemma2").layout.normalised == frozenset({0, 1})
