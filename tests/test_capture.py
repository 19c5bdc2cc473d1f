"""The capture against an independent re-computation of attention from the model's own weights."""

import pytest
import torch

from attnscope import capture, metrics
from attnscope.analysis import analyze_heads
from attnscope.reference import multi_head_attention
from attnscope.stats import HeadStatistics
from attnscope.tokens import batches, tokenize
from tests.helpers import TEXTS, captured_maps


def layer_inputs(loaded, batch):
    """The input of every layer's attention (the output of ln_1), recorded with forward hooks."""
    recorded = {}
    hooks = [
        block.ln_1.register_forward_hook(lambda module, args, output, layer=layer: recorded.__setitem__(layer, output))
        for layer, block in enumerate(loaded.model.h)
    ]
    try:
        with torch.no_grad():
            loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    finally:
        for hook in hooks:
            hook.remove()
    return recorded


def reference_maps(loaded, batch):
    """layer -> (B, H, n, n) from the from-scratch multi-head attention on each layer's c_attn weights."""
    maps = {}
    for layer, x in layer_inputs(loaded, batch).items():
        c_attn = loaded.model.h[layer].attn.c_attn
        with torch.no_grad():
            _, weights = multi_head_attention(x, c_attn.weight, c_attn.bias, loaded.n_head, lengths=batch.lengths)
            maps[layer] = weights
    return maps


@pytest.fixture(scope="module")
def batch(tiny):
    windows = tokenize(tiny.tokenizer, TEXTS, tiny.n_ctx).windows
    return next(batches(windows, len(windows), tiny.device))


def real_entries(batch):
    """(B, 1, n, n) bool: query and key both real tokens, key not after query."""
    n = batch.input_ids.shape[1]
    real = torch.arange(n)[None, :] < batch.lengths[:, None]  # (B, n)
    return (real[:, :, None] & real[:, None, :] & torch.tril(torch.ones(n, n, dtype=torch.bool)))[:, None]


def test_capture_matches_from_scratch_attention(tiny, batch):
    reference, captured = reference_maps(tiny, batch), captured_maps(tiny, batch)
    assert sorted(captured) == list(range(tiny.n_layer))
    valid = real_entries(batch).expand_as(captured[0])
    for layer in range(tiny.n_layer):
        assert captured[layer].shape == reference[layer].shape == (4, tiny.n_head, batch.input_ids.shape[1], batch.input_ids.shape[1])
        difference = (captured[layer] - reference[layer]).abs()[valid]
        assert float(difference.max()) < 1e-5, f"layer {layer}"
        n = captured[layer].shape[-1]
        above_diagonal = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        # causal, padded rows included: a masked key weighs at most exp(-87) / Z (capture.LOGIT_FLOOR)
        assert float(captured[layer][..., above_diagonal].abs().max()) < 1e-37


def test_the_comparison_has_teeth(tiny, batch):
    """Heads differ from each other by far more than the tolerance, so swapped heads or a transpose would fail."""
    reference = reference_maps(tiny, batch)[1]
    valid = real_entries(batch)[:, 0]
    for h in range(1, tiny.n_head):
        assert float((reference[:, 0] - reference[:, h]).abs()[valid].max()) > 0.05
    transposed = reference[0, 0].transpose(0, 1)
    assert float((transposed - reference[0, 0]).abs().max()) > 0.05


def test_capture_matches_transformers_eager_attention(tiny, batch):
    with torch.no_grad():
        eager = tiny.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
    assert len(eager.attentions) == tiny.n_layer  # one tensor per layer (SDPA would give an empty tuple)
    captured = captured_maps(tiny, batch)
    valid = real_entries(batch).expand_as(captured[0])
    for layer, weights in enumerate(eager.attentions):
        assert float((captured[layer] - weights).abs()[valid].max()) < 1e-5


def test_model_output_is_unchanged_by_the_capture(tiny, batch):
    with torch.no_grad():
        plain = tiny.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    capture.run(tiny.model, [batch], capture.Reducer())
    assert tiny.model.config._attn_implementation == "eager"  # restored after the capture
    outputs = []
    hook = tiny.model.register_forward_hook(lambda module, args, output: outputs.append(output.last_hidden_state))
    try:
        capture.run(tiny.model, [batch], None)
    finally:
        hook.remove()
    real = (torch.arange(batch.input_ids.shape[1])[None, :] < batch.lengths[:, None])
    assert float((outputs[0] - plain).abs()[real].max()) < 1e-5


def test_small_blocks_give_the_same_maps(tiny, batch):
    whole, small = captured_maps(tiny, batch), captured_maps(tiny, batch, block_bytes=1)  # one row per block
    statistics = [HeadStatistics(tiny.n_layer, tiny.n_head, tiny.device) for _ in range(2)]
    capture.run(tiny.model, [batch], statistics[0])
    original, capture.BLOCK_BYTES = capture.BLOCK_BYTES, 1
    try:
        capture.run(tiny.model, [batch], statistics[1])
    finally:
        capture.BLOCK_BYTES = original
    for name, value in statistics[0].means().items():
        assert torch.allclose(value, statistics[1].means()[name], atol=1e-6), name
    for layer in whole:
        assert torch.allclose(whole[layer], small[layer], atol=1e-6)


def test_statistics_equal_metrics_of_reference_maps(tiny, batch):
    reference = reference_maps(tiny, batch)
    statistics = HeadStatistics(tiny.n_layer, tiny.n_head, tiny.device)
    capture.run(tiny.model, [batch], statistics)
    got = statistics.means()
    for layer, maps in reference.items():
        expected = metrics.head_scores(maps.nan_to_num(0.0), batch.lengths)
        for name in metrics.SCORES:
            assert torch.allclose(got[name][layer], expected[name], atol=1e-5), (layer, name)


def test_batched_and_one_at_a_time_give_the_same_scores(tiny):
    together = analyze_heads(tiny, TEXTS, batch_size=len(TEXTS))
    separate_stats = [analyze_heads(tiny, [text], batch_size=1) for text in TEXTS]
    rows = [result.inputs["scored_rows"] for result in separate_stats]
    assert together.inputs["scored_rows"] == sum(rows)
    for index, record in enumerate(together.heads):
        for name in ("previous_token", "first_token", "self", "local", "entropy", "entropy_normalized", "confidence"):
            pooled = sum(r * result.heads[index].scores[name] for r, result in zip(rows, separate_stats)) / sum(rows)
            assert record.scores[name] == pytest.approx(pooled, abs=1e-5), (record.label, name)


def test_merged_partial_runs_equal_one_run(tiny):
    windows = tokenize(tiny.tokenizer, TEXTS, tiny.n_ctx).windows
    whole = HeadStatistics(tiny.n_layer, tiny.n_head, tiny.device)
    capture.run(tiny.model, batches(windows, 2, tiny.device), whole)
    first, second = (HeadStatistics(tiny.n_layer, tiny.n_head, tiny.device) for _ in range(2))
    capture.run(tiny.model, batches(windows[:1], 2, tiny.device), first)
    capture.run(tiny.model, batches(windows[1:], 2, tiny.device), second)
    first.merge(second)
    for name, value in whole.means().items():
        assert torch.allclose(value, first.means()[name], atol=1e-9), name


def test_kept_maps_are_the_first_windows(tiny):
    result = analyze_heads(tiny, TEXTS, batch_size=3, keep_layers=[1])
    windows = tokenize(tiny.tokenizer, TEXTS[:1], tiny.n_ctx).windows
    reference = reference_maps(tiny, next(batches(windows, 1, tiny.device)))[1][0]
    assert set(result.attention) == {1}
    kept = result.attention[1]
    assert kept.maps.shape == reference.shape == (tiny.n_head, 12, 12)
    assert float((kept.maps - reference).abs().max()) < 1e-5
    assert kept.tokens[:3] == ["<bos>", "The", " cat"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_capture_matches_cpu(tiny_model_dir):
    from attnscope.model import load_model

    cpu = analyze_heads(load_model(str(tiny_model_dir), "cpu"), TEXTS)
    gpu = analyze_heads(load_model(str(tiny_model_dir), "cuda"), TEXTS)
    for a, b in zip(cpu.heads, gpu.heads):
        for name in a.scores:
            assert a.scores[name] == pytest.approx(b.scores[name], abs=1e-4)
