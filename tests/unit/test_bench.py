"""`bench`'s pieces that need no model files: the ratios, the round-robin order, and the baselines compute what
they claim."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
import torch

from attnscope.analyses import bench, bench_limits, harness, micro_bench
from attnscope.scores import rows
from attnscope.scores.kinds import DECODER
from attnscope.scores.reference import multi_head_attention, numpy_mha_batched, numpy_mha_loop
from tests.support import previous_token_map, uniform_map

MB = 2**20


def test_records_ratios_are_the_ratios_of_the_medians():
    runs = {
        "floor": ([1.0, 3.0, 2.0], [100 * MB, 300 * MB, 200 * MB]),
        "attnscope": ([2.0, 2.2, 9.0], [210 * MB, 250 * MB, 230 * MB]),
        "tutorial": ([7.0, 5.0, 6.0], [400 * MB, 420 * MB, 410 * MB]),
        "cache": ([4.0, 4.4, 4.2], [500 * MB, 500 * MB, 600 * MB]),
    }
    measurements = [harness.Measurement(name, 2, 16, times, peaks) for name, (times, peaks) in runs.items()]
    records = {row["method"]: row for row in bench.records(measurements)}
    time = {name: statistics.median(times) for name, (times, _) in runs.items()}
    memory = {name: statistics.median(peaks) for name, (_, peaks) in runs.items()}
    ours = records["attnscope"]
    assert ours["median_s"] == 2.2 and (ours["min_s"], ours["max_s"]) == (2.0, 9.0)
    assert ours["speedup_vs_tutorial"] == pytest.approx(time["tutorial"] / time["attnscope"])  # 6.0 / 2.2
    assert ours["speedup_vs_cache"] == pytest.approx(time["cache"] / time["attnscope"])
    assert ours["time_vs_floor"] == pytest.approx(time["attnscope"] / time["floor"])
    assert ours["memory_vs_floor"] == pytest.approx(memory["attnscope"] / memory["floor"])  # median peaks
    assert ours["peak_mb"] == pytest.approx(230)
    assert ours["spread"] == pytest.approx((9.0 - 2.0) / 2.2)
    assert ours["tokens_per_s"] == pytest.approx(2 * 16 / 2.2)
    assert records["floor"]["time_vs_floor"] == pytest.approx(1.0)
    assert all(records[name]["speedup_vs_tutorial"] is None for name in ("floor", "tutorial", "cache"))
    assert all(records[name]["speedup_vs_cache"] is None for name in ("floor", "tutorial", "cache"))
    for name in runs:  # every method's time against each baseline's, below 1 when faster
        for baseline in ("tutorial", "cache"):
            assert records[name][f"time_vs_{baseline}"] == pytest.approx(time[name] / time[baseline])
        assert records[name]["runs"] == 3
    assert ours["time_vs_tutorial"] == pytest.approx(1 / ours["speedup_vs_tutorial"])


def test_a_floor_peak_under_a_megabyte_is_no_yardstick():
    """A small model's peaks are noise: 0.4 MB against 0.3 MB is not "1.33× the memory"."""
    small = [
        harness.Measurement("floor", 1, 8, [1.0], [300_000]),
        harness.Measurement("attnscope", 1, 8, [1.0], [400_000]),
    ]
    assert [row["memory_vs_floor"] for row in bench.records(small)] == [None, None]


def test_records_without_a_floor_have_no_ratios_to_it():
    alone = bench.records([harness.Measurement("attnscope", 1, 8, [1.0], [0])])[0]
    assert alone["time_vs_floor"] is None and alone["memory_vs_floor"] is None
    assert alone["speedup_vs_tutorial"] is None and alone["time_vs_tutorial"] is None
    assert alone["runs"] == 1 and alone["spread"] == 0.0  # one run: no spread to speak of (shown as '–')


def test_measure_runs_round_robin(monkeypatch):
    """Warm-up rounds, then each round runs every method once timed and once for memory, starting one later."""
    monkeypatch.setattr(harness, "release_freed_memory", lambda: None)  # a garbage collection per run: slow here
    calls = []
    runs = {name: (lambda count, name=name: calls.extend([name] * count)) for name in bench.METHODS}
    measured = harness.measure(runs, torch.device("cpu"), warmup=1, repeats=3)  # no sample_s: one call a sample
    f, a, t, c = bench.METHODS
    rounds = [[f, a, t, c], [a, t, c, f], [t, c, f, a]]
    assert calls == [f, a, t, c] + [name for order in rounds for name in order * 2]  # timed, then memory
    assert all(len(times) == 3 and len(peaks) == 3 for times, peaks in measured.values())
    assert all(time >= 0 for times, _ in measured.values() for time in times)


def test_a_short_call_is_timed_over_several_calls(monkeypatch):
    """A sample makes as many calls as fill sample_s by the warm-up's time, and reports the time of one call."""
    monkeypatch.setattr(harness, "release_freed_memory", lambda: None)
    counts = {"short": [], "long": []}

    def run(name, seconds):
        def calls(count):
            counts[name].append(count)
            time.sleep(seconds * count)

        return calls

    runs = {"short": run("short", 0.002), "long": run("long", 0.03)}
    measured = harness.measure(runs, torch.device("cpu"), warmup=1, repeats=2, sample_s=0.02)
    # warm-up: one call each; then per round one timed sample and one call for memory
    assert counts["long"] == [1, 1, 1, 1, 1]
    assert counts["short"][0] == 1 and counts["short"][2] == 1 and 2 <= counts["short"][1] <= 10
    assert all(0.002 <= t < 0.01 for t in measured["short"][0]) and all(t >= 0.03 for t in measured["long"][0])


@pytest.mark.slow
def test_run_bench_measures_every_method_round_robin(monkeypatch):
    """run_bench hands every method to the round-robin measurement, once per (batch, seq)."""
    from transformers import GPT2Config

    calls = []
    monkeypatch.setattr(
        bench, "_methods", lambda *args: {name: (lambda count, name=name: calls.append(name)) for name in bench.METHODS}
    )
    monkeypatch.setattr(bench, "SAMPLE_S", 0.0)  # one call a sample
    config = GPT2Config(n_layer=1, n_head=2, n_embd=8, n_positions=16, vocab_size=64)
    model = bench.random_model(config, "cpu", "auto")
    measurements = bench.run_bench(model, torch.device("cpu"), [8], [1], warmup=1, repeats=3)
    f, a, t, c = bench.METHODS
    rounds = [[f, a, t, c], [a, t, c, f], [t, c, f, a]]
    assert calls == [f, a, t, c] + [name for order in rounds for name in order * 2]
    assert [m.method for m in measurements] == list(bench.METHODS)
    assert all(len(m.times) == 3 and len(m.peaks) == 3 and (m.batch, m.seq) == (1, 8) for m in measurements)


def test_tutorial_scoring_matches_the_scores():
    maps = torch.stack([previous_token_map(9)[0, 0], uniform_map(9)[0, 0]])  # (2, 9, 9)
    ours = rows.head_scores(DECODER, maps[None], torch.tensor([9]))
    theirs = bench.numpy_head_scores(maps.numpy())
    assert theirs["previous_token"] == pytest.approx([1.0, sum(1 / (i + 1) for i in range(1, 9)) / 8])  # by hand
    for name in ("previous_token", "first_token", "self", "entropy", "confidence"):
        assert theirs[name] == pytest.approx(ours[name].numpy(), abs=1e-6), name


def test_pattern_share_is_the_share_on_the_pattern():
    attn = torch.stack([previous_token_map(5)[0, 0], uniform_map(5)[0, 0]])  # (2, 5, 5)
    previous = torch.zeros(5, 5)
    previous[torch.arange(1, 5), torch.arange(4)] = 1.0
    # previous-token head: 4 of its 5 rows' weight on the pattern (row 0 has no previous token)
    assert bench.pattern_share(previous, attn).tolist() == pytest.approx([4 / 5, (1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 5])


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_numpy_attention_variants_agree_with_torch(causal):
    generator = torch.Generator().manual_seed(0)
    x, w = (
        torch.randn(12, 16, generator=generator, dtype=torch.float64),
        torch.randn(16, 48, generator=generator, dtype=torch.float64) / 4,
    )
    b = torch.randn(48, generator=generator, dtype=torch.float64)
    out, weights = multi_head_attention(x[None], w, b, 4, causal=causal)
    # torch's own attention as the yardstick for the from-scratch one
    q, k, v = (part.reshape(1, 12, 4, 4).transpose(1, 2) for part in (x[None] @ w + b).split(16, dim=-1))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert torch.allclose(out, sdpa.transpose(1, 2).reshape(1, 12, 16))
    for variant in (numpy_mha_loop, numpy_mha_batched):
        got_out, got_weights = variant(x.numpy(), w.numpy(), b.numpy(), 4, causal=causal)
        assert np.allclose(got_out, out[0].numpy()) and np.allclose(got_weights, weights[0].numpy())
        assert np.allclose(got_weights.sum(-1), 1.0)
        assert (np.triu(got_weights, k=1) == 0).all() == causal  # causal maps are lower triangular


def test_micro_benchmark_follows_the_sizes_it_is_given():
    rows_, notes = micro_bench.micro_benchmark(d_model=32, heads=(1, 4), seqs=(8, 16), batches=(1, 3), repeats=1)
    assert notes == []
    shapes = [(row["batch"], row["seq"], row["heads"], row["d_head"]) for row in rows_]
    assert shapes == [(b, n, h, 32 // h) for b in (1, 3) for n in (8, 16) for h in (1, 4)]
    expected = {"batch", "seq", "heads", "d_head", "numpy_loop_ms", "numpy_batched_ms", "torch_scratch_ms"}
    assert all(set(row) == expected | {"torch_sdpa_ms"} for row in rows_)
    assert all(row[key] > 0 for row in rows_ for key in row if key.endswith("_ms"))


def test_micro_benchmark_runs_every_sequence_of_a_batch(monkeypatch):
    """numpy takes the sequences one at a time (as the tutorials do), torch the batch at once, at the given shape."""
    from attnscope.scores import reference

    seen = []
    monkeypatch.setattr(reference, "numpy_mha_loop", lambda x, w, b, h: seen.append(("loop", x.shape, h)))
    monkeypatch.setattr(reference, "numpy_mha_batched", lambda x, w, b, h: seen.append(("batched", x.shape, h)))
    monkeypatch.setattr(reference, "multi_head_attention", lambda x, w, b, h: seen.append(("torch", x.shape, h)))
    micro_bench.micro_benchmark(d_model=8, heads=(2,), seqs=(5,), batches=(3,), repeats=1, warmup=0)
    assert sorted(set(seen)) == [("batched", (5, 8), 2), ("loop", (5, 8), 2), ("torch", (3, 5, 8), 2)]
    assert [name for name, *_ in seen].count("loop") == 3  # the batch's three sequences, one call


def test_micro_benchmark_skips_a_shape_that_would_not_fit(monkeypatch):
    monkeypatch.setattr(micro_bench, "available_bytes", lambda device: 10 * 2**20)  # 10 MiB
    rows_, notes = micro_bench.micro_benchmark(d_model=16, heads=(2,), seqs=(8, 1024), batches=(1,), repeats=1)
    assert [row["seq"] for row in rows_] == [8]
    need = micro_bench.micro_bytes(1, 1024, 2) / 2**30  # 4 arrays of 2 × 1024² float32: 32 MiB
    assert notes == [
        f"micro-benchmark skipped at 1 × 1024: its attention would take about {need:,.1f} GiB on cpu, more than "
        "the 0.0 GiB available"
    ]


@pytest.mark.slow
def test_kvplan_method_gives_kvplans_scores():
    """bench's `kvplan` method runs kvplan's reducer with its default sink and recent window over the batch: the
    scores of the same sums driven by hand."""
    from transformers import LlamaConfig

    from attnscope import settings
    from attnscope.pipeline import capture
    from attnscope.pipeline.reducers import DistantAttention
    from attnscope.pipeline.tokens import Batch

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    model = bench.random_model(config, "cpu", "auto")
    ids = torch.randint(0, 64, (1, 400), generator=torch.Generator().manual_seed(0))
    measured = bench._methods(model, ids, torch.device("cpu"))["kvplan"]()
    sums = DistantAttention(2, 4, torch.device("cpu"), settings.Kvplan.sink, settings.Kvplan.recent)
    batch = Batch([0], ids, torch.ones_like(ids), torch.tensor([400]))
    capture.run(model.base_model, [batch], sums)
    torch.testing.assert_close(measured, sums.means(), atol=0, rtol=0)
    assert measured.shape == (2, 4) and bool((measured > 0).all())


def test_streaming_methods_need_no_n_squared_memory():
    """The floor's SDPA and the capture never hold a layer's (n × n) logits, so a long sequence is not refused for
    them (32,768 tokens: 36 GiB of logits for 9 heads); the notebook ways still count every layer's maps."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=50257, hidden_size=576, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=32768,
    )  # fmt: skip
    for method in bench_limits.STREAMING:
        assert bench_limits.estimated_bytes(config, 1, 32768, method, 4) < 2 * 2**30
    assert bench_limits.estimated_bytes(config, 1, 32768, "tutorial", 4) > 32 * 2**30
