"""The weights `models.weights` reads reproduce each family's own attention: from W_Q, W_K, W_V (the reading norm's
γ folded in) and the normalised input, the queries, keys and values the family's attention function receives, the
attention pattern it computes and the heads' outputs the output projection receives; from W_O, what that projection
adds. Norm parameters are randomised first, so that a γ or β folded wrongly (or Gemma's 1 + γ forgotten) shows.
Rotary families run with every position at 0, where the rotation is the identity. A few families run in the
everyday loop; all of them in the slow one."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from attnscope.analyses.composition import weight_circuits
from attnscope.models.loading import load_model
from attnscope.models.weights import embedding, head_weights, reading_norms, unembedding, weight_notes
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from tests.support import FAMILY_MODELS, FAMILY_TEXTS, visible_keys

# in the everyday loop: grouped-query heads, Gemma's 1 + γ, its output norm and soft-capping (the tiny GPT-2 and
# BERT of conftest, fused Conv1D and post-norm, run there too)
EVERYDAY = {"gemma2"}
FAMILY_NAMES = [
    pytest.param(name, marks=() if name in EVERYDAY else pytest.mark.slow, id=name) for name in FAMILY_MODELS
]
QK_NORMS = (("q_norm", "k_norm"), ("query_layernorm", "key_layernorm"), ("q_layernorm", "k_layernorm"))


def randomise_norms(model: torch.nn.Module, seed: int = 0) -> None:
    """Every norm's γ to 1 ± 0.5 and β to ±0.3 (random), so that folding them wrongly changes the numbers."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if not type(module).__name__.endswith("Norm"):
                continue
            for name, parameter in module.named_parameters(recurse=False):
                noise = torch.randn(parameter.shape, generator=generator)
                parameter.copy_(1.0 + 0.5 * noise if name == "weight" else 0.3 * noise)


@pytest.fixture(scope="module")
def loaded(family_dir):
    models = {}

    def model(name):
        if name not in models:
            models[name] = load_model(str(family_dir(name)), "cpu", lm_head=True)
            randomise_norms(models[name].lm_model)
        return models[name]

    return model


class Recorded:
    """One forward pass with hooks: each layer's attention input, the input of each reading norm, what the family's
    attention function receives and returns, and the output projection's input and output."""

    def __init__(self, loaded, batch, position_ids=None):
        self.calls, self.attention_inputs, self.norm_inputs, self.heads_in, self.heads_out = {}, {}, {}, {}, {}
        family = loaded.family
        handles = []
        for layer, module in enumerate(family.attention_modules(loaded.model)):
            handles.append(module.register_forward_pre_hook(self._keep(self.attention_inputs, layer), with_kwargs=True))
        for layer, norm in enumerate(reading_norms(loaded)):
            if norm is not None:
                handles.append(norm.module.register_forward_pre_hook(self._keep(self.norm_inputs, layer)))
        for layer, module in enumerate(family.output_projections(loaded.model)):
            handles.append(module.register_forward_pre_hook(self._keep(self.heads_in, layer)))
            handles.append(module.register_forward_hook(self._output(layer)))
        modeling = sys.modules[type(family.attention_modules(loaded.model)[0]).__module__]
        original = modeling.eager_attention_forward

        def recording(module, query, key, value, attention_mask, scaling=None, **kwargs):
            output, weights = original(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
            self.calls[module.layer_idx] = dict(query=query, key=key, value=value, scaling=scaling, weights=weights)
            return output, weights

        modeling.eager_attention_forward = recording
        try:
            with torch.no_grad():
                options = {} if position_ids is None else {"position_ids": position_ids}
                loaded.model(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True, **options
                )
        finally:
            modeling.eager_attention_forward = original
            for handle in handles:
                handle.remove()

    @staticmethod
    def _keep(store, layer):
        def hook(module, args, kwargs=None):
            store[layer] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _output(self, layer):
        def hook(module, args, output):
            self.heads_out[layer] = output

        return hook


def _qk_norm(attention, which: int, x: torch.Tensor, heads: int) -> torch.Tensor:
    """The family's QK-norm applied to x (B, heads, n, k): per head (Qwen3, Gemma 3, EXAONE 4, HunYuan) or over all
    heads together before they are split (OLMo 2, OLMoE)."""
    for names in QK_NORMS:
        norm = getattr(attention, names[which], None)
        if norm is None:
            continue
        B, _, n, k = x.shape
        if norm.weight.numel() == k:
            return norm(x)
        joined = x.transpose(1, 2).reshape(B, n, heads * k)
        return norm(joined).view(B, n, heads, k).transpose(1, 2)
    return x


def _rotary_scale(model) -> float | None:
    """None without rotary embeddings; else what the rotation multiplies queries and keys by at position 0 (1, or
    YaRN's attention factor: gpt-oss)."""
    for module in model.modules():
        if "Rotary" in type(module).__name__:
            return float(getattr(module, "attention_scaling", 1.0))
    return None


@torch.no_grad()
def check_attention(loaded, batch=None):
    """q, k, v, the pattern, the heads' outputs and W_O's contribution from head_weights, layer by layer, against
    the model's own on the real tokens of a right-padded batch."""
    if batch is None:
        windows = tokenize(loaded, FAMILY_TEXTS).windows
        batch = next(batches(windows, len(windows), loaded.device, pad_id(loaded.tokenizer)))
    B, n = batch.input_ids.shape
    rotary = _rotary_scale(loaded.model)
    recorded = Recorded(loaded, batch, None if rotary is None else torch.zeros_like(batch.input_ids))
    weights = head_weights(loaded)
    H, k = loaded.n_head, loaded.d_head
    group = H // loaded.n_kv_head
    real = (torch.arange(n)[None, :] < batch.lengths[:, None])[:, None, :, None]  # (B, 1, n, 1)
    norms = reading_norms(loaded)
    for layer, attention in enumerate(loaded.family.attention_modules(loaded.model)):
        norm = norms[layer]
        x = recorded.attention_inputs[layer] if norm is None else norm.normalise(recorded.norm_inputs[layer])
        mine = {}
        for letter in "QKV":
            projected = torch.einsum("bnd,hdk->bhnk", x, getattr(weights, f"W_{letter}")[layer])
            mine[letter] = projected + getattr(weights, f"b_{letter}")[layer][None, :, None, :]  # (B, H, n, k)
        mine["Q"] = _qk_norm(attention, 0, mine["Q"], H)
        # keys are normalised per key/value head: every query head of a group holds the same key
        mine["K"] = _qk_norm(attention, 1, mine["K"][:, ::group], loaded.n_kv_head).repeat_interleave(group, dim=1)
        call = recorded.calls[layer]
        own_scale = getattr(attention, "scaling", k**-0.5)  # OPT scales its queries before the call, passing 1.0
        passed = call["scaling"] if call["scaling"] is not None else k**-0.5
        expected = {
            "Q": call["query"] * passed,
            "K": call["key"].repeat_interleave(group, dim=1),
            "V": call["value"].repeat_interleave(group, dim=1),
        }
        mine["Q"] = mine["Q"] * own_scale * (rotary or 1.0)
        mine["K"] = mine["K"] * (rotary or 1.0)
        for letter in "QKV":
            close(mine[letter], expected[letter], real, f"layer {layer} {letter}")
        pattern = _pattern(loaded, attention, layer, mine["Q"], mine["K"], batch.lengths)  # (B, H, n, n)
        close(pattern, call["weights"], real, f"layer {layer} pattern")
        heads = pattern @ mine["V"]  # (B, H, n, k)
        given = recorded.heads_in[layer].view(B, n, H, k).transpose(1, 2)
        close(heads, given, real, f"layer {layer} heads' outputs")
        written = torch.einsum("bhnk,hkd->bnd", given, weights.W_O[layer]) + weights.b_O[layer]
        close(written[:, None], recorded.heads_out[layer][:, None], real, f"layer {layer} output projection")


def _pattern(loaded, attention, layer, q, k, lengths):
    """softmax of q kᵀ over the keys the family's rules let a row see, with Gemma 2's soft-capping and gpt-oss's
    sinks; rows of padding are left uniform (never compared)."""
    logits = q @ k.transpose(-1, -2)  # (B, H, n, n), the scale already in q
    cap = getattr(loaded.config, "attn_logit_softcapping", None)
    if cap:
        logits = cap * torch.tanh(logits / cap)
    n = q.shape[2]
    visible = visible_keys(loaded.config, layer, lengths, n, loaded.kind.causal)[:, None]  # (B, 1, n, n)
    logits = logits.masked_fill(~visible, -1e30)
    sinks = getattr(attention, "sinks", None)
    if sinks is not None:
        sink = sinks.view(1, -1, 1, 1).expand(*logits.shape[:3], 1)
        return torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    return torch.softmax(logits, dim=-1)


def close(mine, theirs, real, what, tolerance=2e-4):
    """Equal on the real rows, relative to the largest value compared."""
    mask = real.expand_as(theirs)
    a, b = mine.float()[mask], theirs.float()[mask]
    error = float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))
    assert error < tolerance, f"{what}: relative error {error:.2e}"


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_weights_reproduce_each_familys_attention(loaded, name):
    check_attention(loaded(name))


@pytest.mark.parametrize("kind_", ["decoder", "encoder"])
def test_the_weights_reproduce_gpt2_and_bert(model_dirs, kind_):
    """GPT-2's fused Conv1D `c_attn` (q, k, v side by side) and BERT's post-norm layers (each reads the previous
    layer's output LayerNorm; layer 0 the embeddings')."""
    model = load_model(str(model_dirs[kind_]), "cpu", lm_head=True)
    randomise_norms(model.lm_model)
    check_attention(model)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_embedding_and_unembedding_have_the_models_shapes(loaded, name):
    """W_E (V, d) and W_U (d, V), finite, and the notes say what the scores leave out."""
    model = loaded(name)
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


def test_the_demo_models_composition_and_copying_equal_explicit_matrices():
    """From the demo's raw parameters read here (GPT-2: c_attn's columns q | k | v, ln_1's γ on the rows, c_proj's
    rows per head, the tied embeddings, ln_f's γ), with d × d matrices in float64: composition by definition, copying
    from the eigenvalues of W_OV W_U W_E (d × d, the same nonzero ones as W_E W_OV W_U)."""
    model = load_model("demo", "cpu")
    got = weight_circuits(model)
    blocks = model.model.h
    H, d = model.n_head, model.d_model
    k = d // H

    def heads(matrix):  # (d, H·k) -> (H, d, k)
        return matrix.reshape(d, H, k).transpose(1, 0, 2)

    Q, K, V, Wo = [], [], [], []
    for block in blocks:
        gamma = block.ln_1.weight.detach().double().numpy()[:, None]
        c_attn = block.attn.c_attn.weight.detach().double().numpy()  # (d, 3d), Conv1D: x @ W
        Q.append(heads(gamma * c_attn[:, :d]))
        K.append(heads(gamma * c_attn[:, d : 2 * d]))
        V.append(heads(gamma * c_attn[:, 2 * d :]))
        Wo.append(block.attn.c_proj.weight.detach().double().numpy().reshape(H, k, d))
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
    assert got.baseline["expected_rms"] == pytest.approx(d**-0.5)
    assert len(got.composition.records()) == H * H  # 2 layers: every head of layer 0 into every head of layer 1
    assert [record["label"] for record in got.head_records()] == [f"{la}.{h}" for la in range(2) for h in range(H)]


def test_a_decoder_without_its_untied_head_has_no_copying_scores_and_says_why(loaded):
    model = load_model(str(loaded("llama").name), "cpu")  # the base model only; Llama's head is not tied
    circuits = weight_circuits(model, readers=[(1, 0)])
    assert circuits.copying is None and any("lm_head=True" in note for note in circuits.notes)
    assert circuits.head_records() == []
    assert len(circuits.composition.records()) == model.n_head
