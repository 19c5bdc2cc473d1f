"""`bench` end to end: every method measured and reported with its ratios; random weights need no download; every
setting is checked before any model is loaded or built."""

from __future__ import annotations

import json

import pytest
import torch


@pytest.mark.slow
def test_bench_cli_reports_every_method_with_ratios(cli, tiny_model_dir, tmp_path):
    code, out, err = cli(
        "bench", "-m", tiny_model_dir, "--device", "cpu", "--seq-lens", "8,16", "--batch-sizes", "1,2",
        "--repeats", "2", "--warmup", "0", "--json", "--out", tmp_path,
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "bench" and doc["settings"]["cpu_threads"] == torch.get_num_threads()
    assert (doc["settings"]["seq_lens"], doc["settings"]["batch_sizes"]) == ([8, 16], [1, 2])
    assert doc["micro"] == []  # off by default (--micro)
    rows = doc["results"]
    assert len(rows) == 4 * 2 * 2  # methods × batches × lengths
    assert {row["method"] for row in rows} == {"floor", "attnscope", "tutorial", "cache"}
    for row in rows:
        assert row["median_s"] > 0 and row["min_s"] <= row["median_s"] <= row["max_s"]
        expected = row["batch"] * row["seq"] / row["median_s"]
        assert row["tokens_per_s"] == pytest.approx(expected, rel=2e-3)  # 6-decimal JSON
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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "tokens_per_s.png"]
    assert json.loads((tmp_path / "bench.json").read_text()) == doc


@pytest.mark.slow
def test_bench_times_all_head_diversity_exact_and_sampled(cli, tiny_model_dir):
    code, out, err = cli(
        "bench", "-m", tiny_model_dir, "--device", "cpu", "--seq-lens", "16", "--batch-sizes", "3",
        "--repeats", "1", "--warmup", "0", "--methods", "floor,diversity,diversity-sampled", "--sample-rows", "4",
        "--micro", "--json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    # --micro: the tutorials' width, whatever the model's, every head count at the one shape timed
    assert doc["settings"]["micro_d_model"] == 512 and doc["model"]["d_model"] != 512
    assert [(row["batch"], row["seq"], row["heads"]) for row in doc["micro"]] == [(3, 16, h) for h in (1, 4, 8, 16)]
    assert [row["method"] for row in doc["results"]] == ["floor", "diversity", "diversity-sampled"]
    assert doc["settings"]["sample_rows"] == 4
    assert all(row["time_vs_floor"] > 0 for row in doc["results"])


@pytest.mark.slow
def test_random_weights_need_no_download(cli):
    code, out, err = cli(
        "bench", "-m", "gpt2", "--random-weights", "--device", "cpu", "--seq-lens", "8", "--batch-sizes", "1",
        "--repeats", "1", "--warmup", "0", "--methods", "floor,attnscope", "--no-micro", "--json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["n_layer"] == 12 and doc["model"]["d_model"] == 768  # GPT-2 small's architecture
    assert "random" in doc["model"]["name"]
    assert [row["method"] for row in doc["results"]] == ["floor", "attnscope"]
    assert any("GPT-2 small's architecture" in note for note in doc["notes"])  # offline: not even the config


BENCH_MISTAKES = [
    (
        ["--methods", "magic"],
        "--methods magic: use some of floor, attnscope, tutorial, cache, fused, blocks, diversity, diversity-sampled",
    ),
    (["--sample-rows", "1"], "--sample-rows 1: must be a whole number from 2 to 2,147,483,647"),
    (["--seq-lens", "0"], "--seq-lens 0: must be a whole number from 2 to 100,000"),
    (["--seq-lens", "8,1"], "--seq-lens 1: must be a whole number from 2"),
    (["--seq-lens", "8,100001"], "--seq-lens 100001: must be a whole number from 2 to 100,000"),
    (["--seq-lens", "4096"], "sequence length 4096: longer than the model's context, 128 tokens"),  # its config
    (["--seq-lens", "a,b"], "--seq-lens a,b: expected comma-separated whole numbers"),
    (["--batch-sizes", "0", "--seq-lens", "8"], "--batch-sizes 0: must be a whole number from 1"),
    (["--batch-sizes", "65537"], "--batch-sizes 65537: must be a whole number from 1 to 65,536"),
    (["--repeats", "0"], "--repeats 0: must be a whole number from 1 to 1,000"),
    (["--repeats", "1000000000000"], "--repeats 1000000000000: must be a whole number from 1 to 1,000"),
    (["--warmup", "-1"], "--warmup -1: must be a whole number from 0 to 100"),
    (["--warmup", "101"], "--warmup 101: must be a whole number from 0 to 100"),
    (["--dtype", "float8"], "--dtype float8: use one of auto, float32, float16, bfloat16"),
    (["--seq", "8"], "No such option: --seq"),  # renamed: --seq-lens
    (["--batch", "1"], "No such option: --batch"),  # renamed: --batch-sizes
]


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("weights", [[], ["--random-weights"]], ids=["weights", "random weights"])
@pytest.mark.parametrize("args, expected", BENCH_MISTAKES, ids=[" ".join(args) for args, _ in BENCH_MISTAKES])
def test_bench_errors_come_before_any_model_is_built(cli, tiny_model_dir, monkeypatch, weights, args, expected):
    from attnscope.analyses import bench
    from attnscope.models import loading

    def must_not_build(*args, **kwargs):
        raise AssertionError("a model was built before the options were checked")

    for module in (loading, bench):
        monkeypatch.setattr(module, "load_model", must_not_build)
    monkeypatch.setattr(bench, "random_model", must_not_build)
    code, out, err = cli("bench", "-m", tiny_model_dir, "--device", "cpu", "--no-micro", *weights, *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and expected in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_bench_on_cuda_without_cuda_stops_at_once(cli, monkeypatch):
    from attnscope.analyses import bench

    monkeypatch.setattr(bench, "random_model", lambda *args: pytest.fail("a model was built"))
    code, out, err = cli("bench", "--random-weights", "--device", "cuda")
    assert code == 2 and out == "" and "CUDA is not available" in err


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_bench_times_any_decoder_from_its_config(cli, tmp_path, family):
    """`--random-weights` builds any supported decoder from its config alone (no weights on disk): a Llama-style
    model with grouped-query attention, and Gemma 2, whose floor is eager attention (it has no SDPA)."""
    from tests.support import family_config

    family_config(family, vocab_size=300).save_pretrained(tmp_path)
    code, out, err = cli(
        "bench", "-m", tmp_path, "--random-weights", "--device", "cpu", "--seq-lens", "12", "--batch-sizes", "2",
        "--repeats", "1", "--warmup", "0", "--methods", "floor,attnscope", "--no-micro", "--json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["model_type"] == family
    assert doc["model"]["n_kv_head"] == 2 and doc["model"]["floor"] == ("sdpa" if family == "llama" else "eager")
    assert [row["method"] for row in doc["results"]] == ["floor", "attnscope"]
