"""attnscope bench: every method runs and is reported with ratios; the baselines compute what they claim."""

import json
import statistics

import numpy as np
import pytest
import torch

from attnscope import bench, metrics
from attnscope.reference import multi_head_attention, numpy_mha_batched, numpy_mha_loop
from tests.test_metrics import previous_token_map, uniform_map


def test_bench_cli_reports_every_method_with_ratios(cli, tiny_model_dir, tmp_path):
    code, out, err = cli(
        "bench", "-m", tiny_model_dir, "--device", "cpu", "--seq", "8,16", "--batch", "1,2", "--repeats", "2",
        "--warmup", "0", "--json", "--out", tmp_path, "--no-micro",
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "bench" and doc["settings"]["cpu_threads"] == torch.get_num_threads()
    rows = doc["results"]
    assert len(rows) == 4 * 2 * 2  # methods × batches × lengths
    for row in rows:
        assert row["median_s"] > 0 and row["min_s"] <= row["median_s"] <= row["max_s"]
        assert row["tokens_per_s"] == pytest.approx(row["batch"] * row["seq"] / row["median_s"], rel=2e-3)  # 6-decimal JSON
        if row["method"] == "floor":
            assert row["time_vs_floor"] == pytest.approx(1.0)
    by_method = {(row["method"], row["batch"], row["seq"]): row for row in rows}
    for (method, batch, seq), row in by_method.items():
        for baseline in ("tutorial", "cache"):
            if method != "attnscope":
                assert row[f"speedup_vs_{baseline}"] is None
                continue
            expected = by_method[baseline, batch, seq]["median_s"] / row["median_s"]
            assert row[f"speedup_vs_{baseline}"] == pytest.approx(expected, rel=1e-2)  # medians rounded to 1 µs
    assert (tmp_path / "bench.json").exists() and (tmp_path / "tokens_per_s.png").exists()


def test_records_ratios_are_the_ratios_of_the_medians():
    runs = {
        "floor": ([1.0, 3.0, 2.0], [100, 300, 200]),
        "attnscope": ([2.0, 2.2, 9.0], [210, 250, 230]),
        "tutorial": ([7.0, 5.0, 6.0], [400, 420, 410]),
        "cache": ([4.0, 4.4, 4.2], [500, 500, 600]),
    }
    measurements = [bench.Measurement(name, 2, 16, times, peaks) for name, (times, peaks) in runs.items()]
    rows = {row["method"]: row for row in bench.records(measurements)}
    time = {name: statistics.median(times) for name, (times, _) in runs.items()}
    memory = {name: statistics.median(peaks) for name, (_, peaks) in runs.items()}
    ours = rows["attnscope"]
    assert ours["speedup_vs_tutorial"] == pytest.approx(time["tutorial"] / time["attnscope"])  # 6.0 / 2.2
    assert ours["speedup_vs_cache"] == pytest.approx(time["cache"] / time["attnscope"])
    assert ours["time_vs_floor"] == pytest.approx(time["attnscope"] / time["floor"])
    assert ours["memory_vs_floor"] == pytest.approx(memory["attnscope"] / memory["floor"])  # median peaks
    assert ours["peak_mb"] == pytest.approx(230 / 2**20)
    assert ours["spread"] == pytest.approx((9.0 - 2.0) / 2.2)
    assert all(rows[name]["speedup_vs_tutorial"] is None for name in ("floor", "tutorial", "cache"))


def test_methods_run_round_robin(monkeypatch):
    """Warm-up rounds, then each round runs every method once timed and once for memory, starting one later."""
    from transformers import GPT2Config

    calls = []
    monkeypatch.setattr(
        bench, "_methods", lambda *args: {name: (lambda name=name: calls.append(name)) for name in bench.METHODS}
    )
    model = bench.random_model(GPT2Config(n_layer=1, n_head=2, n_embd=8, n_positions=16, vocab_size=64), "cpu", "auto")
    measurements = bench.run_bench(model, torch.device("cpu"), [8], [1], warmup=1, repeats=3)
    f, a, t, c = bench.METHODS
    rounds = [[f, a, t, c], [a, t, c, f], [t, c, f, a]]
    assert calls == [f, a, t, c] + [name for order in rounds for name in order * 2]  # timed, then memory
    assert all(len(m.times) == 3 and len(m.peaks) == 3 for m in measurements)


def test_random_weights_need_no_download(cli):
    code, out, err = cli("bench", "-m", "gpt2", "--random-weights", "--device", "cpu", "--seq", "8", "--batch", "1",
                         "--repeats", "1", "--warmup", "0", "--methods", "floor,attnscope", "--no-micro", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["n_layer"] == 12 and doc["model"]["d_model"] == 768  # GPT-2 small's architecture
    assert "random" in doc["model"]["name"]


def test_bench_errors_come_before_any_model_is_built(cli, tiny_model_dir, monkeypatch):
    import attnscope.model

    def must_not_build(*args, **kwargs):
        raise AssertionError("a model was built before the options were checked")

    monkeypatch.setattr(attnscope.model, "load_model", must_not_build)
    monkeypatch.setattr(bench, "random_model", must_not_build)
    for args, expected in [
        (["--methods", "magic"], "--methods"),
        (["--seq", "0"], "--seq 0: a sequence needs at least 2 tokens"),
        (["--seq", "8,1"], "--seq 1:"),
        (["--seq", "4096"], "--seq 4096: longer than the model's context, 128 tokens"),  # from the config alone
        (["--seq", "a,b"], "--seq"),
        (["--batch", "0", "--seq", "8"], "--batch 0:"),
        (["--repeats", "0"], "--repeats 0:"),
        (["--warmup", "-1"], "--warmup -1:"),
        (["--dtype", "float8"], "unknown dtype 'float8'"),
    ]:
        for weights in ([], ["--random-weights"]):
            code, out, err = cli("bench", "-m", tiny_model_dir, "--device", "cpu", "--no-micro", *weights, *args)
            assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, (args, err)
    if not torch.cuda.is_available():
        code, _, err = cli("bench", "--random-weights", "--device", "cuda")
        assert code == 2 and "CUDA is not available" in err


def test_tutorial_scoring_matches_metrics():
    maps = torch.stack([previous_token_map(9)[0, 0], uniform_map(9)[0, 0]])  # (2, 9, 9)
    ours = metrics.head_scores(maps[None], torch.tensor([9]))
    theirs = bench.numpy_head_scores(maps.numpy())
    for name in ("previous_token", "first_token", "self", "entropy", "confidence"):
        assert theirs[name] == pytest.approx(ours[name].numpy(), abs=1e-6), name


def test_numpy_attention_variants_agree_with_torch():
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(12, 16, generator=generator), torch.randn(16, 48, generator=generator) / 4
    b = torch.randn(48, generator=generator)
    out, weights = multi_head_attention(x[None].double(), w.double(), b.double(), 4)
    for variant in (numpy_mha_loop, numpy_mha_batched):
        got_out, got_weights = variant(x.double().numpy(), w.double().numpy(), b.double().numpy(), 4)
        assert np.allclose(got_out, out[0].numpy()) and np.allclose(got_weights, weights[0].numpy())


def test_micro_benchmark_rows():
    rows = bench.micro_benchmark(d_model=32, heads=(1, 4), seq=16, repeats=1)
    assert [row["heads"] for row in rows] == [1, 4] and [row["d_head"] for row in rows] == [32, 8]
    assert all(row[key] > 0 for row in rows for key in row if key.endswith("_ms"))
