"""`Ablate` on both kinds of model against an independent removal: a fresh transformers model whose output-projection
weights of a head are zeroed by hand, scored with transformers' own loss (next-token for GPT-2, masked-LM for BERT);
finite differences of that loss for the gradient method. Mean and resample ablation against their definitions,
written here: each window run alone, a hook on the output projection putting in a head's place its mean over every
position of every window, or the donor window's output at the same position."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from attnscope.analyses.ablate import Ablate
from attnscope.errors import AttnscopeError
from attnscope.models.loading import load_model
from attnscope.pipeline.ablation import donors
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.loss_windows import IGNORED, MASK_FRACTION, masked_windows
from attnscope.pipeline.tokens import tokenize

TEXTS = [
    Text("The cat sat on the mat because it was tired.", "a"),
    Text("Hello world, again and again and again.", "b"),
    Text("Short one", "c"),
]
HEADS = [(layer, head) for layer in range(2) for head in range(4)]


@pytest.fixture(scope="module")
def lm_models(model_dirs):
    """kind -> the tiny model loaded with its language-model head, as `ablate` needs it."""
    return {kind: load_model(str(folder), "cpu", lm_head=True) for kind, folder in model_dirs.items()}


@pytest.fixture
def lm(lm_models, kind):
    return lm_models[kind]


@pytest.fixture(scope="module")
def fresh_models(model_dirs):
    """kind -> the tiny model loaded by transformers alone (its own LM-head class), never touched by attnscope."""
    from transformers import BertForMaskedLM, GPT2LMHeadModel

    return {
        "decoder": GPT2LMHeadModel.from_pretrained(model_dirs["decoder"]).eval(),
        "encoder": BertForMaskedLM.from_pretrained(model_dirs["encoder"]).eval(),
    }


def _masked(lm_model, texts):
    """An encoder's masked windows of `texts`, as the masked-LM loss sees them."""
    return masked_windows(tokenize(lm_model, texts).windows, lm_model.tokenizer.mask_token_id)


def _head_columns(model, kind, layer):
    """A function giving head h's slice of the input side of layer `layer`'s output-projection weight (a view):
    GPT-2's c_proj is a Conv1D with weight (in, out), so a head owns rows; BERT's dense is an nn.Linear with weight
    (out, in), so a head owns columns."""
    d_head = model.config.hidden_size // model.config.num_attention_heads
    if kind == "decoder":
        weight = model.transformer.h[layer].attn.c_proj.weight
        return lambda h: weight[h * d_head : (h + 1) * d_head]
    weight = model.bert.encoder.layer[layer].attention.output.dense.weight
    return lambda h: weight[:, h * d_head : (h + 1) * d_head]


def _reference_windows(lm_model, kind, texts):
    """(ids, labels) of each window as transformers' own loss takes them: a decoder's BOS and text tokens, labelled
    by themselves (the model shifts them); an encoder's masked window, labelled at its masked positions only."""
    if kind == "decoder":
        tokenizer = lm_model.tokenizer
        windows = [[tokenizer.bos_token_id] + tokenizer(item.text)["input_ids"] for item in texts]
        return [(ids, ids) for ids in windows]
    masked = _masked(lm_model, texts)
    return [(list(window.ids), list(labels)) for window, labels in zip(masked.windows, masked.labels, strict=True)]


def _modified_copy(fresh_models, kind, removed=(), scale=None):
    """A copy of the fresh model whose output-projection inputs of the `removed` heads are zeroed (or of head
    `scale[0]` multiplied by scale[1])."""
    model = copy.deepcopy(fresh_models[kind])
    with torch.no_grad():
        for layer, head in removed:
            _head_columns(model, kind, layer)(head).zero_()
        if scale is not None:
            (layer, head), factor = scale
            _head_columns(model, kind, layer)(head).mul_(factor)
    return model


def _reference_loss(fresh_models, lm_model, kind, texts, removed=()):
    """Loss of `texts` pooled over every predicted token, from transformers' own loss on one right-padded batch of
    their windows (padded labels ignored), on the fresh model with the `removed` heads' weights zeroed. Decoders:
    next-token loss with BOS first. Encoders: masked-LM loss at the masked positions."""
    model = _modified_copy(fresh_models, kind, removed)
    windows = _reference_windows(lm_model, kind, texts)
    n = max(len(ids) for ids, _ in windows)
    input_ids = torch.zeros(len(windows), n, dtype=torch.long)
    labels = torch.full((len(windows), n), IGNORED, dtype=torch.long)
    attention_mask = torch.zeros(len(windows), n, dtype=torch.long)
    for row, (ids, targets) in enumerate(windows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor(targets)
        attention_mask[row, : len(ids)] = 1
    with torch.no_grad():
        return float(model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss)


def _reference_window_losses(fresh_models, lm_model, kind, texts, scale):
    """Each window's own loss, one window at a time with transformers' own loss, on the fresh model with head
    `scale[0]`'s weights multiplied by scale[1]."""
    model = _modified_copy(fresh_models, kind, scale=scale)
    with torch.no_grad():
        return [
            float(model(input_ids=torch.tensor([ids]), labels=torch.tensor([targets])).loss)
            for ids, targets in _reference_windows(lm_model, kind, texts)
        ]


def test_loss_method_equals_zeroed_weights(lm, kind, fresh_models):
    result = Ablate(method="loss", ablation="zero", batch_size=2).run(
        lm, TEXTS
    )  # padded batches of windows of different lengths
    baseline = _reference_loss(fresh_models, lm, kind, TEXTS)
    assert result.baseline_loss == pytest.approx(baseline, abs=1e-5)
    assert result.importance.shape == result.ablated_loss.shape == (2, 4)
    for layer, head in HEADS:
        without = _reference_loss(fresh_models, lm, kind, TEXTS, removed=[(layer, head)])
        assert result.ablated_loss[layer, head] == pytest.approx(without, abs=1e-5), (layer, head)
        assert result.importance[layer, head] == pytest.approx(without - baseline, abs=1e-5), (layer, head)
    assert np.ptp(result.importance) > 0.01  # the heads really differ, so a swapped head would fail
    assert result.method == "loss" and result.model["kind"] == kind


def test_gradient_method_equals_finite_differences(lm, kind, fresh_models):
    result = Ablate(method="gradient", ablation="zero", batch_size=3).run(lm, TEXTS)
    eps = 1e-2
    for layer, head in [(0, 0), (0, 3), (1, 1), (1, 2)]:
        up = _reference_window_losses(fresh_models, lm, kind, TEXTS, scale=((layer, head), 1 + eps))
        down = _reference_window_losses(fresh_models, lm, kind, TEXTS, scale=((layer, head), 1 - eps))
        expected = np.mean(np.abs((np.array(up) - np.array(down)) / (2 * eps)))  # mean over windows of |dL_w/dξ|
        assert result.importance[layer, head] == pytest.approx(expected, rel=2e-2, abs=1e-4), (layer, head)
    assert result.ablated_loss is None
    assert result.baseline_loss == pytest.approx(_reference_loss(fresh_models, lm, kind, TEXTS), abs=1e-5)


def test_prune_removes_the_least_important_heads_cumulatively(lm, kind, fresh_models):
    result = Ablate(method="loss", ablation="zero", prune=3).run(lm, TEXTS[:2])
    least = sorted(HEADS, key=lambda lh: (result.importance[lh], -lh[0], -lh[1]))[:3]  # by hand: least first
    assert result.ranked()[::-1][:3] == least
    assert [step["head"] for step in result.prune] == [f"{layer}.{head}" for layer, head in least]
    for k, step in enumerate(result.prune):
        expected = _reference_loss(fresh_models, lm, kind, TEXTS[:2], removed=least[: k + 1])
        assert step["removed"] == k + 1 and step["loss"] == pytest.approx(expected, abs=1e-5)


def test_the_model_is_left_as_it_was(lm):
    """The gates are removed and the attention implementation restored: the model predicts as before."""
    ids = tokenize(lm, TEXTS[:1]).windows[0].ids
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        before = lm.lm_model(input_ids=input_ids).logits
    implementation = lm.model.config._attn_implementation
    Ablate(method="gradient").run(lm, TEXTS[:1])
    Ablate(method="loss", prune=1).run(lm, TEXTS[:1])
    assert lm.model.config._attn_implementation == implementation
    with torch.no_grad():
        after = lm.lm_model(input_ids=input_ids).logits
    assert torch.allclose(before, after, atol=1e-6)
    assert not any(module._forward_pre_hooks for module in lm.family.output_projections(lm.model))


def test_masking_is_deterministic_and_covers_the_text_tokens_only(lm_models):
    lm = lm_models["encoder"]
    tokenizer = lm.tokenizer
    windows = tokenize(lm, TEXTS).windows
    masked, again = _masked(lm, TEXTS), _masked(lm, TEXTS)
    assert again.windows == masked.windows and again.labels == masked.labels
    assert len(masked.windows) == len(windows)
    for original, window, labels in zip(windows, masked.windows, masked.labels, strict=True):
        positions = [i for i, label in enumerate(labels) if label != IGNORED]
        assert len(positions) == max(1, round(MASK_FRACTION * (len(original.ids) - 2)))
        assert all(1 <= i <= len(original.ids) - 2 for i in positions)  # never [CLS] or [SEP]
        for i, (token, before) in enumerate(zip(window.ids, original.ids, strict=True)):
            assert token == (tokenizer.mask_token_id if i in positions else before)
            assert labels[i] == (before if i in positions else IGNORED)
    assert masked.predicted == sum(sum(label != IGNORED for label in labels) for labels in masked.labels)
    result = Ablate(method="loss").run(lm, TEXTS)
    assert any("masked-LM loss" in note for note in result.notes)
    assert result.inputs["predicted_tokens"] == masked.predicted


def test_a_decoder_predicts_every_token_after_the_first(lm_models):
    lm = lm_models["decoder"]
    result = Ablate(method="loss").run(lm, TEXTS)
    windows = tokenize(lm, TEXTS).windows
    assert result.inputs["predicted_tokens"] == sum(len(w.ids) - 1 for w in windows)
    assert not any("masked-LM" in note for note in result.notes)


def test_model_without_its_head_and_bad_prune_are_refused(model, lm):
    with pytest.raises(AttnscopeError, match="language-model head: load it with lm_head=True"):
        Ablate().run(model, TEXTS)
    with pytest.raises(AttnscopeError, match="^prune 9: this model has 8 heads$"):
        Ablate(prune=9).run(lm, TEXTS)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"method": "magic"}, "method 'magic': use one of loss, gradient"),
        ({"prune": -1}, "prune -1: must be a whole number from 0 to 1,000,000"),
        ({"batch_size": 0}, "batch_size 0: must be a whole number from 1 to 100,000"),
        ({"top": 0}, "top 0: must be a whole number from 1 to 1,000,000"),
        ({"top": 2.0}, "top 2.0: expected a whole number from 1 to 1,000,000, not a float"),
    ],
)
def test_bad_settings_are_refused_on_construction(settings, message):
    with pytest.raises(AttnscopeError, match=f"^{message}$"):
        Ablate(**settings)


@pytest.mark.parametrize(
    "kind_, message",
    [("decoder", "every window has a single token"), ("encoder", "nothing to mask")],
)
def test_too_short_windows_are_one_line_errors(lm_models, kind_, message):
    with pytest.raises(AttnscopeError, match=message) as raised:
        Ablate(method="loss", bos=False).run(lm_models[kind_], [Text("cat", "t")])
    assert "\n" not in str(raised.value)


# ---------------------------------------------------------------------------------- mean and resample ablation


def _projection(model, kind, layer):
    """The module whose input is layer `layer`'s heads' outputs side by side."""
    if kind == "decoder":
        return model.transformer.h[layer].attn.c_proj
    return model.bert.encoder.layer[layer].attention.output.dense


def _outputs(model, kind, layer, ids) -> torch.Tensor:
    """(n, H·d_head): layer `layer`'s heads' outputs for one window run alone."""
    found = {}
    handle = _projection(model, kind, layer).register_forward_pre_hook(lambda m, args: found.update(z=args[0][0]))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        handle.remove()
    return found["z"].clone()


def _loss_sum(model, kind, layer, head, ids, targets, value=None) -> tuple[float, int]:
    """transformers' own loss of one window, summed over its predicted tokens, with head `head` of `layer` giving
    `value(x)` ((n, d_head) from its own output x) in place of its output; and the count of predicted tokens."""
    d_head = model.config.hidden_size // model.config.num_attention_heads
    part = slice(head * d_head, (head + 1) * d_head)

    def replace(module, args):
        x = args[0].clone()
        x[0, :, part] = value(x[0, :, part])
        return (x,)

    handle = _projection(model, kind, layer).register_forward_pre_hook(replace) if value is not None else None
    try:
        with torch.no_grad():
            loss = float(model(input_ids=torch.tensor([ids]), labels=torch.tensor([targets])).loss)
    finally:
        if handle is not None:
            handle.remove()
    count = len(ids) - 1 if kind == "decoder" else sum(target != -100 for target in targets)
    return loss * count, count


_OUTPUTS: dict = {}  # (model, layer, window ids) -> _outputs: the references ask for each several times


def _replacements(model, kind, windows, layer, head, mode, seed=0) -> list:
    """Per window, what head `head` of `layer` gives once removed, as the definitions say: its mean over every
    position of every window (each run alone), or the donor window's output at the same position (the mean past the
    donor's end)."""
    d_head = model.config.hidden_size // model.config.num_attention_heads
    part = slice(head * d_head, (head + 1) * d_head)
    for ids, _ in windows:
        if (id(model), layer, tuple(ids)) not in _OUTPUTS:
            _OUTPUTS[(id(model), layer, tuple(ids))] = _outputs(model, kind, layer, ids)
    outputs = [_OUTPUTS[(id(model), layer, tuple(ids))][:, part] for ids, _ in windows]  # (n_w, d_head) each
    mean = torch.cat(outputs).double().mean(0).float()  # (d_head,)
    if mode == "mean":
        return [mean.expand(len(ids), d_head) for ids, _ in windows]
    given = donors([len(ids) for ids, _ in windows], seed)
    values = []
    for (ids, _), d in zip(windows, given, strict=True):
        value = mean.repeat(len(ids), 1)  # (n, d_head)
        shared = min(len(ids), len(outputs[d]))
        value[:shared] = outputs[d][:shared]
        values.append(value)
    return values


def _reference(fresh_models, lm, kind, mode, layer, head, seed=0, xi=0.0) -> float:
    """The loss over every window, head `layer`.`head`'s output x made x·ξ + r·(1 − ξ), r as `mode` says."""
    model = fresh_models[kind]
    windows = _reference_windows(lm, kind, TEXTS)
    values = _replacements(model, kind, windows, layer, head, mode, seed)
    total, count = 0.0, 0
    for (ids, targets), value in zip(windows, values, strict=True):
        part, n = _loss_sum(model, kind, layer, head, ids, targets, lambda x, value=value: x * xi + value * (1 - xi))
        total, count = total + part, count + n
    return total / count


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("mode", ["mean", "resample"])
def test_the_loss_without_each_head_equals_the_definition(lm_models, fresh_models, kind, mode):
    lm = lm_models[kind]
    result = Ablate(ablation=mode, resample_seed=3 if mode == "resample" else 0, batch_size=2).run(lm, TEXTS)
    assert result.settings["ablation"] == mode
    assert result.settings["resample_seed"] == (3 if mode == "resample" else None)
    for layer, head in [(0, 1), (0, 3), (1, 0), (1, 2)]:  # every head is computed alike: four of the eight
        expected = _reference(fresh_models, lm, kind, mode, layer, head, seed=3)
        assert result.ablated_loss[layer, head] == pytest.approx(expected, abs=1e-5), (layer, head)
    zero = Ablate(ablation="zero", batch_size=2).run(lm, TEXTS)
    assert result.baseline_loss == pytest.approx(zero.baseline_loss, abs=1e-9)  # nothing removed, nothing changed
    assert np.abs(result.ablated_loss - zero.ablated_loss).max() > 1e-3  # the modes differ: the test has teeth


def test_the_gradient_estimates_the_mean_ablation(lm_models, fresh_models, kind):
    """|∂L_w/∂ξ| of x·ξ + m·(1 − ξ) at ξ = 1, window by window, against finite differences of the reference."""
    lm = lm_models[kind]
    result = Ablate(method="gradient", ablation="mean").run(lm, TEXTS)
    model, windows, eps = fresh_models[kind], _reference_windows(lm, kind, TEXTS), 1e-2
    for layer, head in [(0, 1), (1, 2)]:
        values = _replacements(model, kind, windows, layer, head, "mean")
        slopes = []
        for (ids, targets), value in zip(windows, values, strict=True):
            losses = [
                _loss_sum(model, kind, layer, head, ids, targets, lambda x, v=value, xi=xi: x * xi + v * (1 - xi))
                for xi in (1 + eps, 1 - eps)
            ]
            slopes.append(abs(losses[0][0] - losses[1][0]) / losses[0][1] / (2 * eps))
        assert result.importance[layer, head] == pytest.approx(np.mean(slopes), rel=2e-2, abs=1e-4), (layer, head)
