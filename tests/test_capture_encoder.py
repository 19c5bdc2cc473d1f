"""The capture on a tiny random-weight BERT (bidirectional attention) against an independent re-computation from the
model's own query/key/value weights, against transformers' eager attention, and batched against one at a time."""

import pytest
import torch

from attnscope import capture, metrics
from attnscope.analysis import analyze_heads
from attnscope.reference import bidirectional_attention
from attnscope.stats import HeadStatistics
from attnscope.tokens import batches, tokenize
from tests.helpers import TEXTS, captured_maps


def layer_inputs(loaded, batch):
    """The input of every layer's self-attention (the previous layer's output, or the embeddings' for layer 0),
    recorded with forward pre-hooks."""
    recorded = {}
    hooks = [
        module.register_forward_pre_hook(lambda module, args, layer=layer: recorded.__setitem__(layer, args[0]))
        for layer, module in enumerate(loaded.attention_modules())
    ]
    try:
        with torch.no_grad():
            loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    finally:
        for hook in hooks:
            hook.remove()
    return recorded


def reference_maps(loaded, batch):
    """layer -> (B, H, n, n) from the from-scratch bidirectional attention on each layer's query/key/value."""
    maps = {}
    for layer, x in layer_inputs(loaded, batch).items():
        attention = loaded.attention_modules()[layer]
        weights = [(linear.weight, linear.bias) for linear in (attention.query, attention.key, attention.value)]
        with torch.no_grad():
            _, maps[layer] = bidirectional_attention(x, *weights, loaded.n_head, lengths=batch.lengths)
    return maps


@pytest.fixture(scope="module")
def batch(tiny_bert):
    windows = tokenize(tiny_bert.tokenizer, TEXTS, tiny_bert.n_ctx).windows
    return next(batches(windows, len(windows), tiny_bert.device, tiny_bert.tokenizer.pad_token_id))


def real_entries(batch):
    """(B, 1, n, n) bool: query and key both real tokens (every key is visible in an encoder)."""
    n = batch.input_ids.shape[1]
    real = torch.arange(n)[None, :] < batch.lengths[:, None]  # (B, n)
    return (real[:, :, None] & real[:, None, :])[:, None]


def test_windows_are_wrapped_in_cls_and_sep(tiny_bert, batch):
    tokenizer = tiny_bert.tokenizer
    for row, length in enumerate(batch.lengths.tolist()):
        ids = batch.input_ids[row, :length].tolist()
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert tokenizer.unk_token_id not in ids


def test_capture_matches_from_scratch_attention(tiny_bert, batch):
    reference, captured = reference_maps(tiny_bert, batch), captured_maps(tiny_bert, batch)
    assert sorted(captured) == list(range(tiny_bert.n_layer))
    n = batch.input_ids.shape[1]
    valid = real_entries(batch).expand(-1, tiny_bert.n_head, -1, -1)
    for layer in range(tiny_bert.n_layer):
        assert captured[layer].shape == reference[layer].shape == (len(TEXTS), tiny_bert.n_head, n, n)
        assert float((captured[layer] - reference[layer]).abs()[valid].max()) < 1e-5, f"layer {layer}"
        # keys after the query carry weight (no causal mask) and padded keys none
        above = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        assert float(captured[layer][valid & above].max()) > 0.05
        padded_key = (torch.arange(n)[None, :] >= batch.lengths[:, None])[:, None, None, :]  # (B, 1, 1, n)
        real_row = (torch.arange(n)[None, :] < batch.lengths[:, None])[:, None, :, None]
        assert float(captured[layer][(padded_key & real_row).expand_as(captured[layer])].max()) < 1e-30


def test_the_comparison_has_teeth(tiny_bert, batch):
    reference = reference_maps(tiny_bert, batch)[1]
    valid = real_entries(batch)[:, 0]
    for h in range(1, tiny_bert.n_head):
        assert float((reference[:, 0] - reference[:, h]).abs()[valid].max()) > 0.05


def test_capture_matches_transformers_eager_attention(tiny_bert, batch):
    with torch.no_grad():
        eager = tiny_bert.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
    assert len(eager.attentions) == tiny_bert.n_layer
    captured = captured_maps(tiny_bert, batch)
    valid = real_entries(batch).expand_as(captured[0])
    for layer, weights in enumerate(eager.attentions):
        assert float((captured[layer] - weights).abs()[valid].max()) < 1e-5


def test_model_output_is_unchanged_by_the_capture(tiny_bert, batch):
    with torch.no_grad():
        plain = tiny_bert.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    outputs = []
    hook = tiny_bert.model.register_forward_hook(lambda module, args, output: outputs.append(output.last_hidden_state))
    try:
        capture.run(tiny_bert.model, [batch], capture.Reducer())
    finally:
        hook.remove()
    assert tiny_bert.model.config._attn_implementation == "eager"
    real = torch.arange(batch.input_ids.shape[1])[None, :] < batch.lengths[:, None]
    assert float((outputs[0] - plain).abs()[real].max()) < 1e-5


def test_statistics_equal_metrics_of_reference_maps(tiny_bert, batch):
    """The fast per-row path (logits gathered at per-window keys, [SEP] included) against the reference metrics."""
    reference = reference_maps(tiny_bert, batch)
    statistics = HeadStatistics(tiny_bert.n_layer, tiny_bert.n_head, tiny_bert.device, causal=False)
    capture.run(tiny_bert.model, [batch], statistics)
    got = statistics.means()
    assert set(got) == set(metrics.ALL_SCORES)
    for layer, maps in reference.items():
        expected = metrics.head_scores(maps.nan_to_num(0.0), batch.lengths, causal=False)
        for name in metrics.ALL_SCORES:
            assert torch.allclose(got[name][layer], expected[name], atol=1e-5), (layer, name)


def test_small_blocks_give_the_same_statistics(tiny_bert, batch):
    statistics = [HeadStatistics(tiny_bert.n_layer, tiny_bert.n_head, tiny_bert.device, causal=False) for _ in range(2)]
    capture.run(tiny_bert.model, [batch], statistics[0])
    original, capture.BLOCK_BYTES = capture.BLOCK_BYTES, 1  # one row per block
    try:
        capture.run(tiny_bert.model, [batch], statistics[1])
    finally:
        capture.BLOCK_BYTES = original
    for name, value in statistics[0].means().items():
        assert torch.allclose(value, statistics[1].means()[name], atol=1e-6), name


def test_batched_and_one_at_a_time_give_the_same_scores(tiny_bert):
    """Padding is really masked: a window padded beside longer ones scores as it does alone."""
    together = analyze_heads(tiny_bert, TEXTS, batch_size=len(TEXTS))
    separate = [analyze_heads(tiny_bert, [text], batch_size=1) for text in TEXTS]
    rows = [result.inputs["scored_rows"] for result in separate]
    assert together.inputs["scored_rows"] == sum(rows)
    for index, record in enumerate(together.heads):
        for name in metrics.ROW_SCORES + metrics.ENCODER_SCORES:
            pooled = sum(r * result.heads[index].scores[name] for r, result in zip(rows, separate)) / sum(rows)
            assert record.scores[name] == pytest.approx(pooled, abs=1e-5), (record.label, name)


def test_heads_result_of_an_encoder(tiny_bert):
    result = analyze_heads(tiny_bert, TEXTS[:2], keep_layers=[0])
    assert "the repeated-token probe measures left-to-right copying; skipped for encoder models" in result.notes
    assert "probe" not in result.inputs
    assert "induction" not in result.thresholds and "next-token" in result.thresholds
    for record in result.heads:
        assert record.scores["induction"] is None and record.scores["duplicate_token"] is None
        assert 0.0 <= record.scores["next_token"] <= 1.0 and 0.0 <= record.scores["last_token"] <= 1.0
    kept = result.attention[0]
    assert kept.tokens[0] == "[CLS]" and kept.tokens[-1] == "[SEP]" and kept.tokens[1:3] == ["the", "cat"]
    assert kept.maps.shape == (tiny_bert.n_head, len(kept.tokens), len(kept.tokens))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_capture_matches_cpu(tiny_bert_dir):
    from attnscope.model import load_model

    cpu = analyze_heads(load_model(str(tiny_bert_dir), "cpu"), TEXTS)
    gpu = analyze_heads(load_model(str(tiny_bert_dir), "cuda"), TEXTS)
    for a, b in zip(cpu.heads, gpu.heads):
        for name in metrics.ALL_SCORES:
            assert a.scores[name] == pytest.approx(b.scores[name], abs=1e-4)
