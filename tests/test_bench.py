"""attnscope bench: every method runs and is reported with ratios; the baselines compute what they claim."""

import json

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
    assert (tmp_path / "bench.json").exists() and (tmp_path / "tokens_per_s.png").exists()


def test_random_weights_need_no_download(cli):
    code, out, err = cli("bench", "-m", "gpt2", "--random-weights", "--device", "cpu", "--seq", "8", "--batch", "1",
                         "--repeats", "1", "--warmup", "0", "--methods", "floor,attnscope", "--no-micro", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["n_layer"] == 12 and doc["model"]["d_model"] == 768  # GPT-2 small's architecture
    assert "random" in doc["model"]["name"]


def test_bench_errors(cli, tiny_model_dir):
    for args, expected in [
        (["--methods", "magic"], "--methods"),
        (["--seq", "4096"], "--seq"),
        (["--seq", "a,b"], "--seq"),
        (["--batch", "0", "--seq", "8"], "--batch"),
    ]:
        code, out, err = cli("bench", "-m", tiny_model_dir, "--device", "cpu", "--no-micro", *args)
        assert code == 2 and expected in err and len(err.strip().splitlines()) == 1
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
