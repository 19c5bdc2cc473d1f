"""`attnscope circuit`'s dependencies against independent references: the heads analysis run on a copy of the model
whose output projection's weights for head A are zeroed by hand; the naive way (one full forward per removed head);
the demo model's induction circuit; every family once (slow)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from attnscope.analyses.circuit import Circuit
from attnscope.analyses.circuit_naive import naive_changes
from attnscope.analyses.circuit_replay import removal_changes
from attnscope.analyses.heads import Heads
from attnscope.errors import AttnscopeError
from attnscope.models.loading import load_model
from attnscope.pipeline.inputs import Text
from tests.support import FAMILY_MODELS, FAMILY_TEXTS, TEXTS

PROBE = dict(probe_len=6)  # a short probe: the tiny models' vocabularies and contexts


def _zeroed(loaded, layer: int, head: int):
    """`loaded` with a copy of its network whose output projection in `layer` ignores `head`: that head's input
    rows (GPT-2's Conv1D, weight (in, out)) or columns (nn.Linear, weight (out, in)) set to zero."""
    network = copy.deepcopy(loaded.model)
    module = loaded.family.output_projections(network)[layer]
    d_head = module.weight.shape[0 if type(module).__name__ == "Conv1D" else 1] // loaded.n_head
    cut = slice(head * d_head, (head + 1) * d_head)
    with torch.no_grad():
        if type(module).__name__ == "Conv1D":
            module.weight[cut, :] = 0
        else:
            module.weight[:, cut] = 0
    return dataclasses.replace(loaded, model=network, lm_model=None)


def _scores(loaded, texts, heads: Heads) -> dict:
    """(layer, head) -> every score, from the heads analysis."""
    return {(record.layer, record.head): record.scores for record in heads.run(loaded, texts).heads}


def _texts(texts):
    return [text if isinstance(text, Text) else Text(text, f"t{k}") for k, text in enumerate(texts)]


def _every_deciding_score(loaded, texts, heads: Heads) -> list[tuple[int, int, str]]:
    result = heads.run(loaded, texts)
    return [(record.layer, record.head, record.role.metric) for record in result.heads if record.layer > 0]


def _check_against_zeroed_copies(loaded, texts, heads: Heads, removed: list[tuple[int, int]]) -> np.ndarray:
    explained = _every_deciding_score(loaded, texts, heads)
    explained += [(layer, head, "entropy_normalized") for layer, head, _ in explained[:2]]  # a rows score for sure
    with_values, changes = removal_changes(loaded, texts, explained, heads, ablation="zero")
    base = _scores(loaded, texts, heads)
    for i, (layer, head, score) in enumerate(explained):
        assert with_values[i] == pytest.approx(base[(layer, head)][score], abs=1e-9)
    for a, h in removed:
        without = _scores(_zeroed(loaded, a, h), texts, heads)
        for i, (layer, head, score) in enumerate(explained):
            expected = without[(layer, head)][score] - base[(layer, head)][score] if layer > a else 0.0
            assert changes[i, a, h] == pytest.approx(expected, abs=2e-5), (a, h, layer, head, score)
    assert np.abs(changes).max() > 1e-3  # the removals mattered: the comparison has teeth
    return changes


def test_the_demo_induction_circuit_is_found_and_equals_zeroed_weights():
    """The issue's numbers, measured independently: the demo's previous-token head 0.2 removed (its c_proj rows
    zeroed in a copy), the induction heads 1.0, 1.2, 1.3 fall far below, and 0.2 is each one's largest dependency;
    removing 0.1 costs 1.0 much less."""
    demo = load_model("demo", "cpu")
    texts = _texts(TEXTS)
    heads = Heads(probe_len=None)
    explained = [(1, head, "induction") for head in (0, 2, 3)]
    with_values, changes = removal_changes(demo, texts, explained, heads, ablation="zero")
    for removed in ((0, 2), (0, 1)):
        without = _scores(_zeroed(demo, *removed), texts, heads)
        for i, (layer, head, score) in enumerate(explained):
            assert with_values[i] + changes[i][removed] == pytest.approx(without[(layer, head)][score], abs=2e-5)
    assert with_values.min() > 0.7
    for i in range(3):
        assert np.unravel_index(np.argmin(changes[i]), changes[i].shape) == (0, 2)
        assert with_values[i] + changes[i, 0, 2] < 0.45
    assert changes[0, 0, 1] > -0.2 and changes[0, 0, 2] < -0.5
    assert np.all(changes[:, 1, :] == 0)  # nothing in B's own layer


def test_the_demo_induction_heads_retrieval_is_explained_by_removal_as_zeroed_weights_say():
    """Retrieval on the needle probe, explained by exact removal (the needle's own windows replayed): each change is
    what the heads analysis of a copy with the removed head's output rows zeroed gives, and the previous-token head
    0.2, which the induction heads need to find the token after the current one's earlier occurrence, is what the
    needle's copy needs too."""
    demo = load_model("demo", "cpu")
    texts, heads = _texts(TEXTS[:1]), Heads()
    explained = [(1, head, "retrieval") for head in (0, 2, 3)]
    with_values, changes = removal_changes(demo, texts, explained, heads, ablation="zero")
    base = _scores(demo, texts, heads)
    assert list(with_values) == [base[(layer, head)][score] for layer, head, score in explained]
    for removed in ((0, 2), (0, 1)):
        without = _scores(_zeroed(demo, *removed), texts, heads)
        for i, (layer, head, score) in enumerate(explained):
            assert with_values[i] + changes[i][removed] == pytest.approx(without[(layer, head)][score], abs=1e-9)
    assert with_values.min() > 0.8 and changes[:, 0, 2].max() < -0.2


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_removal_equals_zeroed_weights_gpt2_and_bert(loaded_models, kind):
    model = loaded_models[kind]
    heads = Heads(**PROBE)
    every = [(a, h) for a in range(model.n_layer - 1) for h in range(model.n_head)]
    _check_against_zeroed_copies(model, _texts(TEXTS[:4]), heads, every)


@pytest.mark.slow
def test_removal_equals_zeroed_weights_llama_with_grouped_query_attention(family_dir):
    model = load_model(str(family_dir("llama")), "cpu")
    assert model.config.num_key_value_heads < model.n_head
    every = [(a, h) for a in range(model.n_layer - 1) for h in range(model.n_head)]
    _check_against_zeroed_copies(model, _texts(FAMILY_TEXTS), Heads(**PROBE), every)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILY_MODELS))
def test_every_family_replays_what_the_naive_way_computes(family_dir, name, monkeypatch):
    """The replay from a head's layer gives what the full forward with the head gated gives, for every family: its
    layers' own arguments (rotary, masks, sliding windows, sinks, post-norms) are reused as they were, the removals
    of a layer replayed together as copies of the batch (as on a GPU; the other tests replay them one by one)."""
    from attnscope.analyses import circuit_replay

    monkeypatch.setattr(circuit_replay, "COPIES_ON_THE_CPU", True)
    model = load_model(str(family_dir(name)), "cpu")
    heads = Heads(**PROBE)
    texts = _texts(FAMILY_TEXTS)
    explained = _every_deciding_score(model, texts, heads)
    with_values, changes = removal_changes(model, texts, explained, heads, ablation="zero")
    naive_with, naive = naive_changes(model, texts, explained, heads, ablation="zero")
    np.testing.assert_allclose(with_values, naive_with, atol=1e-9)
    np.testing.assert_allclose(changes, naive, atol=2e-5)
    assert np.abs(changes).max() > 1e-4


@pytest.mark.parametrize("mode", ["zero", "mean", "resample"])
def test_the_replay_of_each_ablation_equals_the_naive_way(mode):
    """The replay puts 0, the means, or the donors' outputs recorded beside each batch, where the naive way puts its
    own (every window run alone, in a full forward per removal), on the texts (four windows of different lengths in
    one padded batch: the longest takes the mean past its donor's end) and on the probe (its own means and donors)."""
    demo = load_model("demo", "cpu")
    texts, heads = _texts(TEXTS), Heads(probe_len=8)
    explained = [(1, 0, "induction"), (1, 2, "previous_token"), (1, 3, "first_token")]
    with_values, changes = removal_changes(demo, texts, explained, heads, ablation=mode, seed=5)
    naive_with, naive = naive_changes(demo, texts, explained, heads, ablation=mode, seed=5)
    np.testing.assert_allclose(with_values, naive_with, atol=1e-9)
    np.testing.assert_allclose(changes, naive, atol=2e-6)
    assert np.abs(changes).max() > 0.3  # 0.2 removed: the induction head falls
    if mode != "zero":
        _, zero = removal_changes(demo, texts, explained, heads, ablation="zero")
        assert np.abs(changes - zero).max() > 1e-2  # the replacement matters: the comparison has teeth
    seed = 5 if mode == "resample" else 0
    result = Circuit(head=["1.0"], ablation=mode, resample_seed=seed, weights=False, probe_len=8)
    found = result.run(demo, texts)
    assert found.settings["ablation"] == mode and found.settings["resample_seed"] == (5 if mode == "resample" else None)
    assert any(note.startswith(f"{mode} ablation") for note in found.notes)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_replay_equals_the_naive_way():
    """On CUDA the replays' attention goes through the fused kernel (when Triton imports), copies and all."""
    demo = load_model("demo", "cuda")
    texts, heads = _texts(TEXTS), Heads()
    explained = _every_deciding_score(demo, texts, heads)
    with_values, changes = removal_changes(demo, texts, explained, heads, ablation="zero")
    naive_with, naive = naive_changes(demo, texts, explained, heads, ablation="zero")
    np.testing.assert_allclose(with_values, naive_with, atol=1e-6)
    np.testing.assert_allclose(changes, naive, atol=1e-4)
    assert changes[[i for i, e in enumerate(explained) if e[2] == "induction"], 0, 2].max() < -0.3


def test_circuit_settings_refuse_what_cannot_be_explained():
    demo_shape = load_model("demo", "cpu").shape
    with pytest.raises(AttnscopeError, match="in layer 0, and no head comes before it"):
        Circuit(head=["0.1"]).check_shape(demo_shape)
    with pytest.raises(AttnscopeError, match=r"head '1\.9': head 9 is out of range"):
        Circuit(head=["1.9"]).check_shape(demo_shape)
    with pytest.raises(AttnscopeError, match="expected LAYER.HEAD"):
        Circuit(head=["one"])
    with pytest.raises(AttnscopeError, match="method 'exact': use one of removal, gradient"):
        Circuit(method="exact")
    with pytest.raises(AttnscopeError, match="comes from the probe, which is off"):
        Circuit(score="induction", probe=False).check_shape(demo_shape)
    with pytest.raises(AttnscopeError, match="top 0"):
        Circuit(top=0)


def test_the_view_of_a_result_made_by_hand():
    """Dependencies sorted by change within each head, the top K by |change| (a positive one kept), every pair in
    the CSV rows, the notebook fragment escaped and self-contained, the pictures drawn."""
    from attnscope.analyses.circuit import CircuitResult
    from attnscope.output.views import view_of

    changes = np.zeros((2, 2, 2))
    changes[0, 0] = [0.3, -0.2]  # head 1.0: 0.0 raises it, 0.1 lowers it
    changes[1, 0] = [-0.05, -0.4]
    heads = [
        {"label": f"{layer}.{head}", "layer": layer, "head": head, "role": "mixed", "explained": layer == 1,
         "score": "<b>", "value": 0.5, "copying": None, "direct_effect": None}
        for layer in range(2) for head in range(2)
    ]  # fmt: skip
    result = CircuitResult(
        {"name": "hand", "n_layer": 2, "n_head": 2}, {"n_texts": 1, "n_tokens": 5}, {"top": 1, "method": "removal"},
        [(1, 0, "induction"), (1, 1, "induction")], np.array([0.5, 0.6]), changes, heads,
    )  # fmt: skip
    assert [(d["label"], d["on"]) for d in result.dependencies(1)] == [("1.0", "0.0"), ("1.1", "0.1")]
    assert [d["on"] for d in result.dependencies() if d["label"] == "1.0"] == ["0.1", "0.0"]
    assert result.dependencies()[0]["without"] == pytest.approx(0.5 - 0.2)
    view = view_of(result)
    # --top 1: each head's largest change in --csv and --json; the files of --out keep every pair
    assert len(view.records()) == 2 and view.document()["dependencies"][0]["change"] == pytest.approx(0.3)
    assert len(view.document(every=True)["dependencies"]) == 4
    html = view.notebook()
    assert html.startswith("<div") and "<b>" not in html and "0.0" in html
    assert set(view.figures()) == {"circuit", "dependencies"}


@pytest.mark.slow
def test_bench_times_the_same_removals_both_ways():
    """bench's circuit and circuit-naive methods compute the same means with each head removed (on the layers above
    the removed head's, the ones a replay scores)."""
    from transformers import GPT2Config

    from attnscope.analyses import bench

    config = GPT2Config(n_layer=3, n_head=2, n_embd=16, n_positions=32, vocab_size=64, initializer_range=0.3)
    model = bench.random_model(config, "cpu", "auto")
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    runs = bench._methods(model, ids, torch.device("cpu"))
    replayed, naive = runs["circuit"](), runs["circuit-naive"]()
    assert sorted(replayed) == sorted(naive) == [(a, h) for a in range(2) for h in range(2)]
    for (a, h), means in replayed.items():
        for name, value in means.items():
            torch.testing.assert_close(value[a + 1 :], naive[(a, h)][name][a + 1 :], atol=1e-6, rtol=0)
