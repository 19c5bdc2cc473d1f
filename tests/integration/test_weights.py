"""The weights `models.weights` reads reproduce each family's own attention: from W_Q, W_K, W_V (the reading norm's
γ folded in) and the normalised input, the queries, keys and values the family's attention function receives, the
attention pattern it computes and the heads' outputs the output projection receives; from W_O, what that projection
adds. Norm parameters are randomised first, so that a γ or β folded wrongly (or Gemma's 1 + γ forgotten) shows.
Rotary families run with every position at 0, where the rotation is the identity. A few families run in the
everyday loop; all of them in the slow one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnscope.analyses.composition import weight_circuits
from attnscope.models.loading import load_model
from attnscope.models.readout import embedding, unembedding
from attnscope.models.weights import weight_notes
from tests.support import FAMILY_MODELS, check_attention, randomise_norms

# in the everyday loop: grouped-query heads, Gemma's 1 + γ, its output norm and soft-capping (the tiny GPT-2 and
# BERT of conftest, fused Conv1D and post-norm, run there too)
EVERYDAY = {"gemma2"}
FAMILY_NAMES = [
    pytest.param(name, marks=() if name in EVERYDAY else pytest.mark.slow, id=name) for name in FAMILY_MODELS
]


@pytest.fixture(scope="module")
def loaded(family_dir):
    models = {}

    def model(name, lm_head=False):
        if (name, lm_head) not in models:
            models[name, lm_head] = load_model(str(family_dir(name)), "cpu", lm_head=lm_head)
            randomise_norms(models[name, lm_head].model)
        return models[name, lm_head]

    return model


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_weights_reproduce_each_familys_attention(loaded, name):
    check_attention(loaded(name))


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("kind_", ["decoder", "encoder"])
def test_the_weights_reproduce_gpt2_and_bert(model_dirs, kind_):
    """GPT-2's fused Conv1D `c_attn` (q, k, v side by side) and BERT's post-norm layers (each reads the previous
    layer's output LayerNorm; layer 0 the embeddings')."""
    model = load_model(str(model_dirs[kind_]), "cpu")
    randomise_norms(model.model)
    check_attention(model)


# the families whose embedding or unembedding differ: scales, multipliers, projections, biases, masked-LM heads
EMBEDDINGS = (
    "llama",
    "gemma",
    "granite",
    "cohere",
    "opt",
    "phi",
    "bert",
    "roberta",
    "electra",
    "modernbert",
    "distilbert",
)


@pytest.mark.slow
@pytest.mark.parametrize("name", EMBEDDINGS)
def test_embedding_and_unembedding_have_the_models_shapes(loaded, name):
    """W_E (V, d) and W_U (d, V), finite, and the notes say what the scores leave out."""
    model = loaded(name, lm_head=True)
    W_E, W_U = embedding(model), unembedding(model)
    vocabulary = model.config.vocab_size
    assert W_E.shape == (vocabulary, model.d_model) and W_U.shape == (model.d_model, vocabulary)
    assert bool(torch.isfinite(W_E).all()) and bool(torch.isfinite(W_U).all())
    assert weight_notes(model)


def _explicit_composition(Q, K, V, Wo):
    """Per head the d × d matrices themselves, then the definitions: {kind: (L, H, L, H)} with NaN unless la < lb."""
    L, H = Q.shape[:2]
    qk = np.einsum("lhdk,lhek->lhde", Q, K)  # (L, H, d, d) W_Q W_Kᵀ
    ov = np.einsum("lhdk,lhke->lhde", V, Wo)  # W_V W_O
    scores = {kind: np.full((L, H, L, H), np.nan) for kind in "qkv"}
    norm = np.linalg.norm
    for la in range(L):
        for ha in range(H):
            A = ov[la, ha]
            for lb in range(la + 1, L):
                for hb in range(H):
                    B = qk[lb, hb]
                    scores["q"][la, ha, lb, hb] = norm(A @ B) / (norm(A) * norm(B))
                    scores["k"][la, ha, lb, hb] = norm(B @ A.T) / (norm(A) * norm(B))
                    scores["v"][la, ha, lb, hb] = norm(A @ ov[lb, hb]) / (norm(A) * norm(ov[lb, hb]))
    return scores, ov


def test_a_models_composition_and_copying_equal_explicit_matrices(tiny):
    """From the tiny GPT-2's raw parameters read here (GPT-2: c_attn's columns q | k | v, ln_1's γ on the rows, c_proj's
    rows per head, the tied embeddings, ln_f's γ), with d × d matrices in float64: composition by definition, copying
    from the eigenvalues of W_OV W_U W_E (d × d, the same nonzero ones as W_E W_OV W_U)."""
    model = tiny
    got = weight_circuits(model, samples=4)
    layers = model.model.h
    H, d = model.n_head, model.d_model
    k = d // H

    def heads(matrix):  # (d, H·k) -> (H, d, k)
        return matrix.reshape(d, H, k).transpose(1, 0, 2)

    Q, K, V, Wo = [], [], [], []
    for module in layers:
        gamma = module.ln_1.weight.detach().double().numpy()[:, None]
        c_attn = module.attn.c_attn.weight.detach().double().numpy()  # (d, 3d), Conv1D: x @ W
        Q.append(heads(gamma * c_attn[:, :d]))
        K.append(heads(gamma * c_attn[:, d : 2 * d]))
        V.append(heads(gamma * c_attn[:, 2 * d :]))
        Wo.append(module.attn.c_proj.weight.detach().double().numpy().reshape(H, k, d))
    want, ov = _explicit_composition(*(np.stack(x) for x in (Q, K, V, Wo)))
    for kind in "qkv":
        np.testing.assert_allclose(getattr(got.composition, kind), want[kind], atol=2e-6, equal_nan=True)
    W_E = model.model.wte.weight.detach().double().numpy()  # (V, d)
    W_U = model.model.ln_f.weight.detach().double().numpy()[:, None] * W_E.T  # tied head
    for layer in range(model.n_layer):
        for head in range(H):
            eigenvalues = np.linalg.eigvals(ov[layer, head] @ W_U @ W_E)
            want_copying = eigenvalues.real.sum() / np.abs(eigenvalues).sum()
            assert got.copying[layer, head] == pytest.approx(want_copying, abs=1e-5)
    assert got.baseline["expected_rms"] == pytest.approx(d**-0.5) and got.baseline["samples"] == 4
    assert len(got.composition.records()) == H * H  # 2 layers: every head of layer 0 into every head of layer 1
    assert [record["label"] for record in got.head_records()] == [f"{la}.{h}" for la in range(2) for h in range(H)]


def test_a_decoder_without_its_untied_head_has_no_copying_scores_and_says_why(loaded):
    model = loaded("llama")  # the base model only; Llama's head is not tied
    circuits = weight_circuits(model, readers=[(1, 0)])
    assert circuits.copying is None and any("lm_head=True" in note for note in circuits.notes)
    assert circuits.head_records() == []
    assert len(circuits.composition.records()) == model.n_head
