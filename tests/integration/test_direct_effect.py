"""Direct logit attribution against from-scratch computations from the model's own hidden states: each head's output
taken at the output projection's input, pushed forward through the raw output-projection weights and every norm with
its denominator computed here from the norm's recorded input, dotted with the unembedding's centred column of the
correct token; and the identity that every component's direct effect adds up to the model's own centred logit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnscope.analyses.direct_effect import direct_effects
from attnscope.errors import AttnscopeError
from attnscope.models.loading import load_model
from attnscope.pipeline.loss_windows import IGNORED, masked_windows
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from tests.support import FAMILY_TEXTS, TEXTS, byte_level_tokenizer, check_attention, family_config, randomise_norms

# one decoder per way the direct path differs: Llama's layout; Gemma's 1 + γ and tied head; Gemma 2's output norm and
# final soft-capping; OLMo's LayerNorm without parameters; OLMo 2's output norm with no input norm; Granite's
# multipliers; Cohere's logit scale and LayerNorm without bias; Phi's LM-head bias; GPT-NeoX's LayerNorms with bias;
# OPT; gpt-oss's biases (all slow: GPT-2 and BERT run in the everyday loop)
DECODER_NAMES = [
    pytest.param(name, marks=pytest.mark.slow, id=name)
    for name in ("llama", "gemma", "gemma2", "olmo", "olmo2", "granite", "cohere", "phi", "gpt_neox", "opt", "gpt_oss")
]
OUTPUT_NORMED = {"gemma2", "gemma3_text", "olmo2", "exaone4"}  # post_attention_layernorm normalises the output
GEMMA = {"gemma", "gemma2", "gemma3_text"}  # RMSNorm scales by 1 + γ


class Inputs:
    """Record the input of modules (forward pre-hooks) and the output of others during one pass."""

    def __init__(self, inputs=(), outputs=()):
        self.values, self.handles = {}, []
        for module in inputs:
            self.handles.append(module.register_forward_pre_hook(self._keep(module)))
        for module in outputs:
            self.handles.append(
                module.register_forward_hook(lambda m, a, out: self.values.__setitem__((id(m), 1), out))
            )

    def _keep(self, module):
        def hook(m, args):
            self.values[id(m)] = args[0]

        return hook

    def __getitem__(self, module):
        return self.values[id(module)]

    def output(self, module):
        return self.values[id(module), 1]

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()

    def __enter__(self):
        return self


def frozen(norm_module, recorded_input, c, offset=0.0):
    """The norm applied to the contribution c with its denominator from its recorded input: γ ⊙ C c / σ."""
    x = recorded_input.double()
    eps = getattr(norm_module, "eps", None) or getattr(norm_module, "variance_epsilon", None) or 1e-5
    weight = getattr(norm_module, "weight", None)
    gamma = torch.ones(x.shape[-1], dtype=torch.float64) if weight is None else weight.double()
    if type(norm_module).__name__.endswith("RMSNorm"):
        return (gamma + offset) * c / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    centred = c - c.mean(-1, keepdim=True)
    return gamma * centred / (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()


def _linear_slices(module, H):
    """Per head, its rows of the output projection in "x @ W" form: (H, k, d)."""
    weight = module.weight.double()
    weight = weight if type(module).__name__ == "Conv1D" else weight.T  # (H·k, d)
    return weight.reshape(H, -1, weight.shape[1])


@torch.no_grad()
def _decoder_reference(model, name, texts):
    """Per head, the mean over predicted tokens of the frozen direct path, and the mean centred logit from the
    model's own logits (window by window, no padding)."""
    base, lm = model.model, model.lm_model
    family, H = model.family, model.n_head
    projections = family.output_projections(base)
    layers = family.layers(base)
    output_norms = [module.post_attention_layernorm for module in layers] if name in OUTPUT_NORMED else None
    final = next(
        getattr(owner, attr)
        for owner in (base, getattr(base, "decoder", None))
        for attr in ("norm", "final_layernorm", "final_layer_norm", "ln_f")
        if owner is not None and getattr(owner, attr, None) is not None
    )
    offset = 1.0 if name in GEMMA else 0.0
    config = model.config
    residual = getattr(config, "residual_multiplier", 1.0) if name in ("granite", "granitemoe") else 1.0
    scale = getattr(config, "logit_scale", 1.0) if name == "cohere" else 1.0
    if name in ("granite", "granitemoe"):
        scale = 1.0 / config.logits_scaling
    head = lm.get_output_embeddings()
    W = head.weight.double() * scale  # (V, d)
    bias = (head.bias.double() if getattr(head, "bias", None) is not None else torch.zeros(W.shape[0])) * scale
    totals, logit_total, count = torch.zeros(model.n_layer, H, dtype=torch.float64), 0.0, 0
    for window in tokenize(model, texts).windows:
        ids = torch.tensor([window.ids])
        watched = [*projections, final, *(output_norms or [])]
        with Inputs(watched, [final]) as recorded, torch.no_grad():
            logits = lm(input_ids=ids).logits[0].double()  # (n, V)
        targets = ids[0, 1:]
        column = W[targets] - W.mean(0)  # (n-1, d)
        for layer, projection in enumerate(projections):
            o = recorded[projection][0, :-1].double()  # (n-1, H·k)
            slices = _linear_slices(projection, H)
            for h in range(H):
                c = o.view(len(o), H, -1)[:, h] @ slices[h] * residual  # (n-1, d)
                if output_norms is not None:
                    c = frozen(output_norms[layer], recorded[output_norms[layer]][0, :-1], c, offset)
                y = frozen(final, recorded[final][0, :-1], c, offset)
                totals[layer, h] += (y * column).sum()
        centred = logits[:-1] - logits[:-1].mean(-1, keepdim=True)
        logit_total += float(centred.gather(1, targets[:, None]).sum())
        count += len(targets)
        # the unembedding reads the final norm's output: the model's own logits are that (up to soft-capping)
        if not getattr(config, "final_logit_softcapping", None):
            mine = recorded.output(final)[0, :-1].double() @ W.T + bias  # (n-1, V)
            assert torch.allclose(mine, logits[:-1], atol=1e-4 * float(logits.abs().max()))
    return (totals / count).numpy(), logit_total / count


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    model = load_model(str(tiny_model_dir), "cpu", lm_head=True)
    randomise_norms(model.lm_model)
    return model


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@torch.no_grad()
def test_gpt2_direct_effects_equal_the_frozen_path_and_add_up_to_the_logit(tiny_lm):
    """Per head against the from-scratch path; then the identity: heads + the output projections' biases + the
    MLPs + the embeddings, each through the frozen final LayerNorm, + its β, give the model's centred logit."""
    texts = TEXTS[:3]
    got = direct_effects(tiny_lm, texts, batch_size=2)  # a padded batch of unequal windows, then one alone
    want, mean_logit = _decoder_reference(tiny_lm, "gpt2", texts)
    np.testing.assert_allclose(got.heads, want, rtol=1e-4, atol=1e-5)
    assert got.mean_logit == pytest.approx(mean_logit, rel=1e-5)
    assert got.predicted == sum(len(w.ids) - 1 for w in tokenize(tiny_lm, texts).windows)
    base = tiny_lm.model
    W = tiny_lm.lm_model.lm_head.weight.double()
    others, count = 0.0, 0
    for window in tokenize(tiny_lm, texts).windows:
        ids = torch.tensor([window.ids])
        mlps = [module.mlp for module in base.h]
        with Inputs([base.ln_f], mlps) as recorded, torch.no_grad():
            hidden = base(input_ids=ids, output_hidden_states=True).hidden_states
        column = W[ids[0, 1:]] - W.mean(0)  # (n-1, d)
        h = recorded[base.ln_f][0, :-1]
        parts = [hidden[0][0, :-1].double()]  # the embeddings
        parts += [recorded.output(mlp)[0, :-1].double() for mlp in mlps]
        parts += [module.attn.c_proj.bias.double().expand(len(h), -1) for module in base.h]
        for part in parts:
            others += float((frozen(base.ln_f, h, part) * column).sum())
        others += float((base.ln_f.bias.double() * column).sum())
        count += len(column)
    assert got.heads.sum() + others / count == pytest.approx(mean_logit, rel=1e-5)


@pytest.fixture(scope="module")
def families(family_dir):
    models = {}

    def model(name):
        if name not in models:
            models[name] = load_model(str(family_dir(name)), "cpu", lm_head=True)
            randomise_norms(models[name].lm_model)
        return models[name]

    return model


@pytest.mark.parametrize("name", DECODER_NAMES)
def test_every_decoders_direct_effects_equal_the_frozen_path(families, name):
    """Output norms (Gemma 2/3, OLMo 2, EXAONE 4), 1 + γ, residual and logit multipliers, biases of the LM head."""
    model = families(name)
    got = direct_effects(model, FAMILY_TEXTS, batch_size=3)
    want, mean_logit = _decoder_reference(model, name, FAMILY_TEXTS)
    np.testing.assert_allclose(got.heads, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    if not getattr(model.config, "final_logit_softcapping", None):
        assert got.mean_logit == pytest.approx(mean_logit, rel=1e-4, abs=1e-5)
    else:
        assert any("soft-capping" in note for note in got.notes)


@torch.no_grad()
def test_bert_direct_effects_equal_the_frozen_path_and_add_up_to_the_logit(tiny_bert_dir):
    """Post-norm: a head's write passes its layer's two LayerNorms and every later one, then the masked-LM head with
    its gate a(z)/z and its LayerNorm's σ frozen, at the masked positions. Every component (the embeddings, each
    attention and MLP output, each LayerNorm's β, the transform's biases, the decoder's bias) adds up to the
    model's own centred logit."""
    model = load_model(str(tiny_bert_dir), "cpu", lm_head=True)
    randomise_norms(model.lm_model)
    got = direct_effects(model, TEXTS, batch_size=2)
    lm, base, H = model.lm_model, model.model, model.n_head
    layers = base.encoder.layer
    transform = lm.cls.predictions.transform
    decoder = lm.cls.predictions.decoder
    norms = [norm for module in layers for norm in (module.attention.output.LayerNorm, module.output.LayerNorm)]
    windows = masked_windows(tokenize(model, TEXTS).windows, model.tokenizer.mask_token_id)
    W = decoder.weight.double()  # (V, d)
    totals, others, logit_total, count = torch.zeros(model.n_layer, H, dtype=torch.float64), 0.0, 0.0, 0
    for window, labels in zip(windows.windows, windows.labels, strict=True):
        ids, labels = torch.tensor([window.ids]), torch.tensor(labels)
        masked = labels != IGNORED
        targets = labels[masked]
        watched = [*norms, transform.LayerNorm, *(module.attention.output.dense for module in layers)]
        outputs = [transform.dense, base.embeddings, *(module.output.dense for module in layers)]
        with Inputs(watched, outputs) as recorded, torch.no_grad():
            logits = lm(input_ids=ids).logits[0].double()[masked]  # (M, V)
        column = W[targets] - W.mean(0)  # (M, d)
        z = recorded.output(transform.dense)[0][masked].double()
        gate = recorded[transform.LayerNorm][0][masked].double() / z

        def to_logit(c, first, masked=masked, gate=gate, column=column):
            """c (M, d) entering the residual stream before norm `first`, through the rest, to the centred logit."""
            for norm in norms[first:]:
                c = frozen(norm, recorded[norm][0][masked], c)
            c = frozen(
                transform.LayerNorm,
                recorded[transform.LayerNorm][0][masked],
                gate * (c @ transform.dense.weight.double().T),
            )
            return float((c * column).sum())

        for layer, module in enumerate(layers):
            dense = module.attention.output.dense
            o = recorded[dense][0][masked].double().view(len(targets), H, -1)  # (M, H, k)
            slices = dense.weight.double().T.reshape(H, -1, dense.weight.shape[0])  # (H, k, d)
            for h in range(H):
                totals[layer, h] += to_logit(o[:, h] @ slices[h], 2 * layer)
            others += to_logit(dense.bias.double().expand(len(targets), -1), 2 * layer)
            others += to_logit(module.attention.output.LayerNorm.bias.double().expand(len(targets), -1), 2 * layer + 1)
            others += to_logit(recorded.output(module.output.dense)[0][masked].double(), 2 * layer + 1)
            others += to_logit(module.output.LayerNorm.bias.double().expand(len(targets), -1), 2 * layer + 2)
        others += to_logit(recorded.output(base.embeddings)[0][masked].double(), 0)
        bias_through = frozen(
            transform.LayerNorm, recorded[transform.LayerNorm][0][masked], gate * transform.dense.bias.double()
        )
        others += float((bias_through * column).sum()) + float((transform.LayerNorm.bias.double() * column).sum())
        others += float((decoder.bias.double()[targets] - decoder.bias.double().mean()).sum())
        centred = logits - logits.mean(-1, keepdim=True)
        logit_total += float(centred.gather(1, targets[:, None]).sum())
        count += len(targets)
    assert got.predicted == count
    np.testing.assert_allclose(got.heads, (totals / count).numpy(), rtol=1e-4, atol=1e-6)
    assert got.mean_logit == pytest.approx(logit_total / count, rel=1e-5)
    assert got.heads.sum() + others / count == pytest.approx(logit_total / count, rel=1e-5)


def test_an_encoder_without_its_head_is_refused(tiny_bert):
    with pytest.raises(AttnscopeError, match="lm_head=True"):
        direct_effects(tiny_bert, TEXTS)


def test_the_model_runs_as_before_afterwards(tiny_lm):
    """The hooks are gone and the attention implementation is back."""
    windows = tokenize(tiny_lm, TEXTS[:1]).windows
    batch = next(batches(windows, 1, tiny_lm.device, pad_id(tiny_lm.tokenizer)))
    with torch.no_grad():
        before = tiny_lm.model(input_ids=batch.input_ids).last_hidden_state
    implementation = tiny_lm.config._attn_implementation

    def hooks():  # transformers keeps hooks of its own on some modules
        return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in tiny_lm.lm_model.modules())

    count = hooks()
    direct_effects(tiny_lm, TEXTS[:1])
    assert tiny_lm.config._attn_implementation == implementation
    assert hooks() == count
    with torch.no_grad():
        assert torch.equal(tiny_lm.model(input_ids=batch.input_ids).last_hidden_state, before)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["roberta", "electra", "modernbert", "distilbert"])
def test_every_encoders_masked_head_is_read_where_the_model_reads_it(families, name):
    """The other encoders' masked-LM heads (RoBERTa's lm_head, ELECTRA's generator head, ModernBERT's head after its
    final norm, DistilBERT's vocab_transform): the mean centred logit attnscope reads through them equals the one of
    the model's own logits at the masked positions, and every head's effect is finite."""
    model = families(name)
    got = direct_effects(model, FAMILY_TEXTS, batch_size=3)
    windows = masked_windows(tokenize(model, FAMILY_TEXTS).windows, model.tokenizer.mask_token_id)
    total, count = 0.0, 0
    for window, labels in zip(windows.windows, windows.labels, strict=True):
        labels = torch.tensor(labels)
        with torch.no_grad():
            logits = model.lm_model(input_ids=torch.tensor([window.ids])).logits[0].double()[labels != IGNORED]
        centred = logits - logits.mean(-1, keepdim=True)
        total += float(centred.gather(1, labels[labels != IGNORED][:, None]).sum())
        count += int((labels != IGNORED).sum())
    assert got.predicted == count
    assert got.mean_logit == pytest.approx(total / count, rel=1e-4)
    assert np.isfinite(got.heads).all() and np.abs(got.heads).max() > 0


@pytest.mark.slow
def test_a_post_norm_decoder_with_projections(tmp_path):
    """OPT-350m's shape: LayerNorms after the residual sums (no final norm: the last layer's is the final one) and
    the embeddings projected in and out of a narrower width. Its weights reproduce its attention, and the mean
    centred logit read through project_out and the LM head is the model's own."""
    import transformers

    vocabulary = byte_level_tokenizer(tmp_path)
    config = family_config("opt", vocabulary)
    config.do_layer_norm_before, config.word_embed_proj_dim = False, 16
    torch.manual_seed(0)
    transformers.OPTForCausalLM(config).save_pretrained(tmp_path)
    model = load_model(str(tmp_path), "cpu", lm_head=True)
    randomise_norms(model.lm_model)
    check_attention(model)
    got = direct_effects(model, FAMILY_TEXTS, batch_size=3)
    total, count = 0.0, 0
    for window in tokenize(model, FAMILY_TEXTS).windows:
        ids = torch.tensor([window.ids])
        with torch.no_grad():
            logits = model.lm_model(input_ids=ids).logits[0, :-1].double()
        centred = logits - logits.mean(-1, keepdim=True)
        total += float(centred.gather(1, ids[0, 1:, None]).sum())
        count += len(window.ids) - 1
    assert got.mean_logit == pytest.approx(total / count, rel=1e-4)
    assert np.isfinite(got.heads).all()
