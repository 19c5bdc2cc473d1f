"""`ablate` on a tiny BERT: the masked-LM loss against a fresh BertForMaskedLM whose W_O columns of a head are
zeroed by hand, transformers' own masked-LM loss, and finite differences for the gradient."""

import numpy as np
import pytest
import torch

from attnscope.ablation import IGNORED, MASK_FRACTION, ablate, masked_windows
from attnscope.inputs import Text
from attnscope.model import load_model
from attnscope.tokens import tokenize

TEXTS = [
    Text("The cat sat on the mat because it was tired.", "a"),
    Text("Hello world, again and again and again.", "b"),
    Text("Short one", "c"),
]


@pytest.fixture(scope="module")
def tiny_bert_lm(tiny_bert_dir):
    return load_model(str(tiny_bert_dir), "cpu", lm_head=True)


@pytest.fixture(scope="module")
def masked(tiny_bert_lm):
    tokenizer = tiny_bert_lm.tokenizer
    return masked_windows(tokenize(tokenizer, TEXTS, tiny_bert_lm.n_ctx).windows, tokenizer.mask_token_id)


def test_masking_is_deterministic_and_covers_the_text_tokens_only(tiny_bert_lm, masked):
    tokenizer = tiny_bert_lm.tokenizer
    windows = tokenize(tokenizer, TEXTS, tiny_bert_lm.n_ctx).windows
    again = masked_windows(windows, tokenizer.mask_token_id)
    assert again.windows == masked.windows and again.labels == masked.labels
    for original, window, labels in zip(windows, masked.windows, masked.labels):
        positions = [i for i, label in enumerate(labels) if label != IGNORED]
        assert len(positions) == max(1, round(MASK_FRACTION * (len(original.ids) - 2)))
        assert all(1 <= i <= len(original.ids) - 2 for i in positions)  # never [CLS] or [SEP]
        for i, (token, before) in enumerate(zip(window.ids, original.ids)):
            assert token == (tokenizer.mask_token_id if i in positions else before)
            assert labels[i] == (before if i in positions else IGNORED)
    assert masked.predicted == sum(sum(label != IGNORED for label in labels) for labels in masked.labels)


def reference_loss(folder, masked, removed=(), scale=None):
    """Mean cross-entropy at the masked positions, pooled over windows, one window at a time with transformers' own
    masked-LM loss, on a fresh BertForMaskedLM whose `attention.output.dense` input columns of the `removed` heads
    are zeroed (or of head `scale[0]` multiplied by scale[1]). Returns (pooled loss, per-window losses)."""
    from transformers import BertForMaskedLM

    model = BertForMaskedLM.from_pretrained(folder).eval()
    d_head = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        for layer, head in removed:
            dense = model.bert.encoder.layer[layer].attention.output.dense
            dense.weight[:, head * d_head : (head + 1) * d_head] = 0  # nn.Linear: (out, in), heads are input columns
        if scale is not None:
            (layer, head), factor = scale
            dense = model.bert.encoder.layer[layer].attention.output.dense
            dense.weight[:, head * d_head : (head + 1) * d_head] *= factor
        per_window, weights = [], []
        for window, labels in zip(masked.windows, masked.labels):
            ids, targets = torch.tensor([window.ids]), torch.tensor([labels])
            per_window.append(float(model(input_ids=ids, labels=targets).loss))
            weights.append(int((targets != IGNORED).sum()))
    return float(np.average(per_window, weights=weights)), per_window


def test_loss_method_equals_zeroed_weights(tiny_bert_lm, tiny_bert_dir, masked):
    result = ablate(tiny_bert_lm, TEXTS, "loss", batch_size=2)  # padded batches of windows of different lengths
    assert any("masked-LM loss" in note for note in result.notes)
    assert result.inputs["predicted_tokens"] == masked.predicted
    baseline, _ = reference_loss(tiny_bert_dir, masked)
    assert result.baseline_loss == pytest.approx(baseline, abs=1e-5)
    for layer in range(2):
        for head in range(4):
            without, _ = reference_loss(tiny_bert_dir, masked, removed=[(layer, head)])
            assert result.ablated_loss[layer, head] == pytest.approx(without, abs=1e-5)
            assert result.importance[layer, head] == pytest.approx(without - baseline, abs=1e-5)
    assert np.ptp(result.importance) > 0.01  # the heads really differ, so a swapped head would fail


def test_gradient_method_equals_finite_differences(tiny_bert_lm, tiny_bert_dir, masked):
    result = ablate(tiny_bert_lm, TEXTS, "gradient", batch_size=3)
    eps = 1e-2
    for layer, head in [(0, 0), (0, 3), (1, 1), (1, 2)]:
        _, up = reference_loss(tiny_bert_dir, masked, scale=((layer, head), 1 + eps))
        _, down = reference_loss(tiny_bert_dir, masked, scale=((layer, head), 1 - eps))
        expected = np.mean(np.abs((np.array(up) - np.array(down)) / (2 * eps)))
        assert result.importance[layer, head] == pytest.approx(expected, rel=2e-2, abs=1e-4)


def test_prune_on_an_encoder(tiny_bert_lm, tiny_bert_dir, masked):
    result = ablate(tiny_bert_lm, TEXTS, "loss", prune=2)
    least = result.ranked()[::-1][:2]
    for k, step in enumerate(result.prune):
        expected, _ = reference_loss(tiny_bert_dir, masked, removed=least[: k + 1])
        assert step["loss"] == pytest.approx(expected, abs=1e-5)


def test_too_short_windows_are_one_line_errors(tiny_bert_lm):
    from attnscope.errors import AttnscopeError

    with pytest.raises(AttnscopeError, match="nothing to mask"):
        ablate(tiny_bert_lm, [Text("cat", "t")], "loss", bos=False)
