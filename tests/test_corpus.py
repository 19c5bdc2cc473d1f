"""Corpus scale: token-budgeted batches, progress, exact merging, and two processes under torchrun."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from attnscope.analysis import analyze_heads
from attnscope.inputs import Text
from attnscope.tokens import Window, batch_order

WORDS = "the cat sat on mat because it was tired doctor said that she would help patient quick brown fox".split()


def corpus(count, seed=0):
    generator = random.Random(seed)
    return [Text(" ".join(generator.choice(WORDS) for _ in range(generator.randint(3, 40))), f"t{i}") for i in range(count)]


def test_batches_respect_the_token_budget():
    windows = [Window(i, tuple(range(length)), 0) for i, length in enumerate([10, 50, 20, 50, 5, 30])]
    groups = batch_order(windows, batch_size=8, max_tokens=100)
    assert sorted(i for group in groups for i in group) == list(range(6))  # every window once
    for group in groups:
        longest = max(len(windows[i].ids) for i in group)
        assert len(group) * longest <= 100
    assert groups[0] == [1, 3]  # the two 50-token windows together, longest first
    assert batch_order([Window(0, tuple(range(300)), 0)], 8, max_tokens=100) == [[0]]  # too long alone: still runs


def test_two_thousand_texts_with_progress(tiny):
    calls = []
    texts = corpus(2000)
    result = analyze_heads(tiny, texts, batch_size=64, probe=False, progress=lambda *args: calls.append(args))
    assert result.inputs["n_texts"] == 2000
    total_tokens = calls[-1][3]
    assert calls[-1] == (2000, total_tokens, 2000, total_tokens)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)  # monotone
    assert result.inputs["scored_rows"] == total_tokens - 2000  # every window's row 0 is not scored


def test_corpus_split_in_two_and_merged_equals_one_run(tiny):
    texts = corpus(40, seed=1)
    whole = analyze_heads(tiny, texts, probe=False, batch_size=7)
    parts = [analyze_heads(tiny, half, probe=False, batch_size=5) for half in (texts[:15], texts[15:])]
    rows = [part.inputs["scored_rows"] for part in parts]
    for index, record in enumerate(whole.heads):
        for name in ("previous_token", "entropy", "confidence", "local"):
            merged = sum(r * part.heads[index].scores[name] for r, part in zip(rows, parts)) / sum(rows)
            assert record.scores[name] == pytest.approx(merged, abs=1e-6)


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun test uses localhost TCP and fork")
def test_torchrun_two_gloo_processes_equal_one(tiny_model_dir, tmp_path):
    file = tmp_path / "corpus.jsonl"
    file.write_text("".join(json.dumps({"text": t.text}) + "\n" for t in corpus(30, seed=2)))
    args = ["heads", "--file", str(file), "-m", str(tiny_model_dir), "--device", "cpu", "--json", "--batch-size", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.run([sys.executable, "-m", "attnscope", *args], capture_output=True, text=True, env=env, timeout=300)
    assert single.returncode == 0, single.stderr
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "attnscope"]
    double = subprocess.run([*launcher, *args], capture_output=True, text=True, env=env, timeout=300)
    assert double.returncode == 0, double.stderr[-2000:]
    one, two = json.loads(single.stdout), json.loads(double.stdout)  # only rank 0 printed: one document
    assert two["input"]["scored_rows"] == one["input"]["scored_rows"]
    for a, b in zip(one["heads"], two["heads"]):
        for name in ("previous_token", "first_token", "self", "local", "entropy", "confidence", "induction"):
            assert b[name] == pytest.approx(a[name], abs=2e-6), (a["label"], name)


@pytest.mark.skipif(sys.platform != "linux", reason="sends SIGINT")
def test_ctrl_c_stops_cleanly_and_writes_nothing(tiny_model_dir, tmp_path):
    import signal
    import time

    file = tmp_path / "big.jsonl"
    file.write_text("".join(json.dumps({"text": t.text}) + "\n" for t in corpus(20000, seed=3)))
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "attnscope", "heads", "--file", str(file), "-m", str(tiny_model_dir), "--out", str(out),
         "--batch-size", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )

    def cpu_seconds() -> float:  # user + system time of the process, from /proc (clock ticks)
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    deadline = time.monotonic() + 120
    # Importing torch and transformers takes a few CPU seconds, then the model loads and the 20,000 texts run for
    # far longer: 5 CPU seconds in, the command is inside the CLI, loading or analysing, whatever the machine's speed.
    while cpu_seconds() < 5.0 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    # Killed by its own SIGINT after cleaning up, as interrupted Unix programs end (a shell shows $? = 130).
    assert process.returncode == -signal.SIGINT, err
    assert err.strip().splitlines() == ["attnscope: interrupted"]
    assert not out.exists()  # nothing written, nothing half-written, not even the folder
