"""The capture, for every kind of model, against an independent re-computation of attention from the model's own
weights (tests.support.reference_maps), against transformers' eager attention, and batched against one at a time."""

from __future__ import annotations

import contextlib

import pytest
import torch

from attnscope import api
from attnscope.pipeline import capture
from attnscope.pipeline.blocks import Reducer
from attnscope.pipeline.reducers import HeadStatistics
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from attnscope.scores import rows
from tests.support import TEXTS, capture_blocks_of, captured_maps, real_entries, reference_maps, tiles_everywhere


def _one_batch(loaded, texts):
    """All windows of `texts` in one right-padded batch (windows of different lengths: all but one padded)."""
    windows = tokenize(loaded, texts).windows
    return next(batches(windows, len(windows), loaded.device, pad_id(loaded.tokenizer)))


def _heads_statistics(loaded, batch, block_bytes=None):
    statistics = HeadStatistics(loaded.kind, loaded.n_layer, loaded.n_head, loaded.device)
    with capture_blocks_of(block_bytes):
        capture.run(loaded.model, [batch], statistics)
    return statistics


@pytest.fixture
def batch(model):
    return _one_batch(model, TEXTS)


def test_the_batch_pads_windows_of_different_lengths(batch):
    assert len(set(batch.lengths.tolist())) == len(TEXTS)  # so every comparison below covers padded windows


def test_capture_matches_from_scratch_attention(model, batch):
    reference, captured = reference_maps(model, batch), captured_maps(model, batch)
    assert sorted(captured) == list(range(model.n_layer))
    n = batch.input_ids.shape[1]
    valid = real_entries(batch, model.kind.causal).expand(-1, model.n_head, -1, -1)
    for layer in range(model.n_layer):
        assert captured[layer].shape == reference[layer].shape == (len(TEXTS), model.n_head, n, n)
        difference = (captured[layer] - reference[layer]).abs()[valid]
        assert float(difference.max()) < 1e-5, f"layer {layer}"


def test_a_decoder_capture_puts_no_weight_after_the_query(tiny):
    batch = _one_batch(tiny, TEXTS)
    captured = captured_maps(tiny, batch)
    n = batch.input_ids.shape[1]
    above_diagonal = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    for layer in range(tiny.n_layer):
        # causal, padded rows included: a masked key weighs at most exp(-87) / Z (blocks.LOGIT_FLOOR)
        assert float(captured[layer][..., above_diagonal].abs().max()) < 1e-37


def test_an_encoder_capture_sees_later_keys_but_no_padded_ones(tiny_bert):
    batch = _one_batch(tiny_bert, TEXTS)
    captured = captured_maps(tiny_bert, batch)
    n = batch.input_ids.shape[1]
    valid = real_entries(batch, causal=False).expand(-1, tiny_bert.n_head, -1, -1)
    above = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    padded_key = (torch.arange(n)[None, :] >= batch.lengths[:, None])[:, None, None, :]  # (B, 1, 1, n)
    real_row = (torch.arange(n)[None, :] < batch.lengths[:, None])[:, None, :, None]  # (B, 1, n, 1)
    for layer in range(tiny_bert.n_layer):
        assert float(captured[layer][valid & above].max()) > 0.05  # no causal mask
        assert float(captured[layer][(padded_key & real_row).expand_as(captured[layer])].max()) < 1e-30


def test_the_comparison_has_teeth(model, batch):
    """Heads differ from each other by far more than the tolerance, so swapped heads or a transpose would fail."""
    reference = reference_maps(model, batch)[1]
    valid = real_entries(batch, model.kind.causal)[:, 0]
    for h in range(1, model.n_head):
        assert float((reference[:, 0] - reference[:, h]).abs()[valid].max()) > 0.05
    length = int(batch.lengths[0])
    first = reference[0, 0, :length, :length]
    assert float((first.transpose(0, 1) - first).abs().max()) > 0.05


def test_capture_matches_transformers_eager_attention(model, batch):
    with torch.no_grad():
        eager = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
    assert len(eager.attentions) == model.n_layer  # one tensor per layer (SDPA would give an empty tuple)
    captured = captured_maps(model, batch)
    valid = real_entries(batch, model.kind.causal).expand_as(captured[0])
    for layer, weights in enumerate(eager.attentions):
        assert float((captured[layer] - weights).abs()[valid].max()) < 1e-5


def test_model_output_is_unchanged_by_the_capture(model, batch):
    with torch.no_grad():
        plain = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    outputs = []
    hook = model.model.register_forward_hook(lambda module, args, output: outputs.append(output.last_hidden_state))
    try:
        capture.run(model.model, [batch], Reducer())
        capture.run(model.model, [batch], None)
    finally:
        hook.remove()
    assert model.model.config._attn_implementation == "eager"  # restored after the capture
    real = torch.arange(batch.input_ids.shape[1])[None, :] < batch.lengths[:, None]
    assert len(outputs) == 2
    for output in outputs:
        assert float((output - plain).abs()[real].max()) < 1e-5


def test_a_run_gives_back_whatever_implementation_the_model_had(model, batch):
    """The first run switches through transformers, later ones set the noted configs only: both give back the
    implementation the model had, even one set between two runs."""
    model.model.set_attn_implementation("sdpa")
    try:
        for _ in range(2):
            seen: list[str] = []
            hook = model.model.register_forward_pre_hook(
                lambda module, args, seen=seen: seen.append(module.config._attn_implementation)
            )
            try:
                capture.run(model.model, [batch], None)
            finally:
                hook.remove()
            assert seen == [capture.IMPLEMENTATION]
            assert {
                module.config._attn_implementation for module in model.model.modules() if hasattr(module, "config")
            } == {"sdpa"}
    finally:
        model.model.set_attn_implementation("eager")
    capture.run(model.model, [batch], None)
    assert model.model.config._attn_implementation == "eager"


def test_outside_a_capture_the_implementation_is_eager_attention(model, batch):
    """Called with the capture's implementation but no capture, a model computes eager attention, whatever mask
    the capture's mask function gives it (boolean, or none for an unpadded batch)."""
    unpadded = _one_batch(model, TEXTS[:1])
    with torch.no_grad():
        eager = [model.model(input_ids=b.input_ids, attention_mask=b.attention_mask) for b in (batch, unpadded)]
        capture._register()
        model.model.set_attn_implementation(capture.IMPLEMENTATION)
        try:
            ours = [model.model(input_ids=b.input_ids, attention_mask=b.attention_mask) for b in (batch, unpadded)]
        finally:
            model.model.set_attn_implementation("eager")
    for b, expected, got in zip((batch, unpadded), eager, ours, strict=True):
        real = torch.arange(b.input_ids.shape[1])[None, :] < b.lengths[:, None]
        assert float((got.last_hidden_state - expected.last_hidden_state).abs()[real].max()) < 1e-5


def test_small_blocks_give_the_same_maps_and_statistics(model, batch):
    whole, small = captured_maps(model, batch), captured_maps(model, batch, block_bytes=1)  # one row per block
    for layer in whole:
        assert torch.allclose(whole[layer], small[layer], atol=1e-6)
    big, tiny_blocks = _heads_statistics(model, batch), _heads_statistics(model, batch, block_bytes=1)
    for name, value in big.means().items():
        assert torch.allclose(value, tiny_blocks.means()[name], atol=1e-6), name


@pytest.mark.parametrize("tiled", [False, True], ids=["blocks", "tiles"])
def test_statistics_equal_scores_of_reference_maps(model, batch, tiled):
    """The fast per-row path (logits gathered at the kind's keys, an encoder's [SEP] included) against the scores
    computed from the from-scratch maps; also with every block's keys in tiles of 3 (how long rows go)."""
    reference = reference_maps(model, batch)
    with tiles_everywhere() if tiled else contextlib.nullcontext([]) as tiled_blocks:
        got = _heads_statistics(model, batch).means()
    assert bool(tiled_blocks) == tiled
    expected_names = {*model.kind.row_score_names, "local_uniform", "local_lift"}
    assert set(got) == expected_names
    for layer, maps in reference.items():
        expected = rows.head_scores(model.kind, maps.nan_to_num(0.0), batch.lengths)
        for name in expected_names:
            assert torch.allclose(got[name][layer], expected[name], atol=1e-5), (layer, name)


def test_tiled_blocks_shared_among_threads_give_exactly_what_one_thread_gives(model, batch):
    """The tiled blocks of a layer go to a pool of threads as long as torch has more than one (pipeline.tiles):
    every statistic and the model's output are bit-identical to one thread's."""
    runs = []
    before = torch.get_num_threads()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outputs = []
        hook = model.model.register_forward_hook(lambda module, args, output, kept=outputs: kept.append(output[0]))
        try:
            with tiles_everywhere() as tiled_blocks:
                statistics = _heads_statistics(model, batch)
        finally:
            hook.remove()
            torch.set_num_threads(before)
        assert len(tiled_blocks) > 2 * model.n_layer  # several blocks a layer, to share
        pooled = {name for *_, name in tiled_blocks if name.startswith("attnscope-workers")}
        assert len(pooled) == (0 if threads == 1 else 2)  # one thread: no pool; two: both threads took blocks
        runs.append((statistics.means(), outputs[0]))
    (one, one_output), (two, two_output) = runs
    assert torch.equal(one_output, two_output)
    for name in one:
        assert torch.equal(one[name], two[name]), name


def test_batched_and_one_at_a_time_give_the_same_scores(model):
    """Padding is really masked: a window padded beside longer ones scores as it does alone."""
    together = api.heads(model, TEXTS, batch_size=len(TEXTS), probe=False)
    separate = [api.heads(model, [text], batch_size=1, probe=False) for text in TEXTS]
    counts = [result.inputs["scored_rows"] for result in separate]
    assert together.inputs["scored_rows"] == sum(counts)
    for index, record in enumerate(together.heads):
        for name in model.kind.row_score_names:
            pooled = sum(
                r * result.heads[index].scores[name] for r, result in zip(counts, separate, strict=True)
            ) / sum(counts)
            assert record.scores[name] == pytest.approx(pooled, abs=1e-5), (record.label, name)


def test_merged_partial_runs_equal_one_run(model):
    windows = tokenize(model, TEXTS).windows
    pad = pad_id(model.tokenizer)

    def statistics_of(part):
        statistics = HeadStatistics(model.kind, model.n_layer, model.n_head, model.device)
        capture.run(model.model, batches(part, 2, model.device, pad), statistics)
        return statistics

    whole, first, second = statistics_of(windows), statistics_of(windows[:1]), statistics_of(windows[1:])
    first.merge(second)
    assert int(first.row_count) == int(whole.row_count)
    # float32 attention depends a little on the batch it was computed in: padding changes how the kernels block their
    # sums (seen at ~1e-8 on a 16-thread CPU and on a GPU, not on 2 threads); the statistics add up in float64
    for name, value in whole.means().items():
        assert torch.allclose(value, first.means()[name], atol=1e-6), name


def test_layers_scored_one_by_one_or_together_agree(model, monkeypatch):
    """Summaries kept back and scored together (all layers of every batch of a run) give the sums of scoring each
    layer of each batch as it comes."""
    windows = tokenize(model, TEXTS).windows
    pad = pad_id(model.tokenizer)

    def statistics_of():
        statistics = HeadStatistics(model.kind, model.n_layer, model.n_head, model.device)
        capture.run(model.model, batches(windows, 2, model.device, pad), statistics)
        return statistics

    together = statistics_of()
    monkeypatch.setattr(HeadStatistics, "PENDING_BYTES", 1)  # every layer scored as it comes
    alone = statistics_of()
    assert int(together.row_count) == int(alone.row_count) > 0
    assert torch.allclose(together.sums, alone.sums, rtol=1e-12, atol=1e-9)
    assert torch.allclose(together.uniform_sum, alone.uniform_sum, rtol=1e-12, atol=1e-12)


FIRST_TOKENS = {"decoder": ["<bos>", "The", " cat"], "encoder": ["[CLS]", "the", "cat"]}


def test_kept_maps_are_the_first_windows(model, kind):
    result = api.heads(model, TEXTS, batch_size=3, plot=("1.2",), probe=False)
    first = _one_batch(model, TEXTS[:1])
    reference = reference_maps(model, first)[1][0]
    assert set(result.attention) == {1}
    kept = result.attention[1]
    n = len(tokenize(model, TEXTS[:1]).windows[0].ids)
    assert kept.maps.shape == reference.shape == (model.n_head, n, n)
    assert float((kept.maps - reference).abs().max()) < 1e-5
    assert kept.tokens[:3] == FIRST_TOKENS[kind] and len(kept.tokens) == n
    assert kept.text_index == 0 and result.plotted == [(1, 2)]
    if kind == "encoder":
        assert kept.tokens[-1] == "[SEP]"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_capture_matches_cpu(model_dir):
    from attnscope.models.loading import load_model

    cpu = api.heads(load_model(str(model_dir), "cpu"), TEXTS)
    gpu = api.heads(load_model(str(model_dir), "cuda"), TEXTS)
    assert cpu.measured == gpu.measured
    for a, b in zip(cpu.heads, gpu.heads, strict=True):
        for name in cpu.measured:
            assert a.scores[name] == pytest.approx(b.scores[name], abs=1e-4), (a.label, name)


@pytest.mark.slow
def test_statistics_at_512_tokens_equal_the_from_scratch_maps(tmp_path):
    """Long context as the capture runs it by default (several blocks a layer, MIN_BLOCK_ROWS's room): a 512-token
    window's statistics equal the scores of the maps computed from the weights, to 1e-5."""
    from attnscope.models.loading import load_model
    from attnscope.pipeline import block_path
    from attnscope.pipeline.tokens import Batch
    from tests.support import build_tiny_gpt2

    loaded = load_model(str(build_tiny_gpt2(tmp_path / "long", n_positions=640)), "cpu")
    n = 512
    ids = torch.randint(0, loaded.tokenizer.vocab_size, (1, n), generator=torch.Generator().manual_seed(5))
    batch = Batch([0], ids, torch.ones_like(ids), torch.tensor([n]))
    assert block_path._block_rows(n // 2, n, loaded.n_head * 4, block_path.BLOCK_BYTES, True) < n // 2  # blocks
    got = _heads_statistics(loaded, batch).means()
    for layer, maps in reference_maps(loaded, batch).items():
        expected = rows.head_scores(loaded.kind, maps.nan_to_num(0.0), batch.lengths)
        for name in loaded.kind.row_score_names:
            assert torch.allclose(got[name][layer], expected[name], atol=1e-5), (layer, name)
