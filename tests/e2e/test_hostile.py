"""What a hostile user, a broken model or a failing system can do, beyond the table of mistakes in test_errors.py:
a full disk under --out or stdout, Ctrl-C turned into another exception by a library, a Rust panic for want of
memory, a batch that cannot fit, a model with NaN weights, a context too short for the probe, a CSV with no rows."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support import CAT, build_tiny_gpt2


def one_error_line(code: int, out: str, err: str) -> str:
    assert code == 2 and out == "", err
    (line,) = err.strip().splitlines()
    assert line.startswith("attnscope: error: ")
    return line


@pytest.mark.slow
def test_a_full_disk_under_out_is_one_line_and_leaves_nothing(cli, tiny_model_dir, tmp_path, monkeypatch):
    from attnscope.output import files

    real = files.write_atomic
    calls = []

    def fill_up(path, data):
        calls.append(path)
        if len(calls) == 3:  # a few files in, the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, data)

    monkeypatch.setattr(files, "write_atomic", fill_up)  # every file of --out is written through it
    line = one_error_line(*cli("heads", CAT, "-m", tiny_model_dir, "--out", tmp_path / "results"))
    assert len(calls) == 3
    assert f"cannot write to --out {tmp_path / 'results'}: No space left on device" in line
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a staged file


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize("output", [["--json"], []])  # --csv writes as --json does; the table through rich
def test_standard_output_on_a_full_disk_is_one_line(tiny_model_dir, output):
    with open("/dev/full", "w") as full:
        finished = subprocess.run(
            [sys.executable, "-m", "attnscope", "heads", CAT, "-m", str(tiny_model_dir), *output],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert finished.returncode == 2, finished.stderr
    assert finished.stderr.strip().splitlines() == [
        "attnscope: error: cannot write to standard output: No space left on device"
    ]


def test_ctrl_c_that_a_library_turns_into_another_error_still_ends_as_an_interrupt(cli, tiny_model_dir, monkeypatch):
    """transformers can catch the KeyboardInterrupt of an import cut short and raise an ImportError instead: the
    run must still end as interrupted (130), not as "cannot load model"."""
    from attnscope import cli as cli_module

    def interrupted_load(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler runs at once, interrupting the sleep
            raise AssertionError("SIGINT was not delivered")
        except KeyboardInterrupt:
            raise ImportError("cannot import name 'GPT2Model' from partially initialized module") from None

    previous = signal.signal(signal.SIGINT, cli_module._on_interrupt)
    try:
        monkeypatch.setattr(cli_module, "_load", interrupted_load)
        code, out, err = cli("heads", CAT, "-m", tiny_model_dir)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130 and out == ""
    assert err.strip() == "attnscope: interrupted"
    # and the next run in the same process is not taken for an interrupted one
    monkeypatch.undo()
    code, out, err = cli("info", "-m", tiny_model_dir, "--json")
    assert code == 0, err


def test_a_rust_panic_for_want_of_memory_is_the_out_of_memory_line_and_other_panics_are_bugs():
    from attnscope.cli import _user_error

    class PanicException(BaseException):  # pyo3's, raised by the tokenizers library: a BaseException
        pass

    message, status = _user_error(PanicException("memory allocation of 68719476736 bytes failed"), "heads")
    assert status == 2 and message.startswith("attnscope: error: out of memory (memory allocation of")
    assert "--batch-size" in message
    assert _user_error(PanicException("index out of bounds"), "heads") == (None, 0)


def test_out_of_memory_advice_names_the_options_of_the_command_that_ran():
    from attnscope.cli import _user_error

    error = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
    bench, _ = _user_error(error, "bench")
    heads, _ = _user_error(error, "heads")
    assert "--batch-sizes or --seq-lens" in bench and "--max-tokens" not in bench
    assert "--batch-size or --max-tokens" in heads


def test_a_bench_shape_that_cannot_fit_is_refused_before_any_weights(cli, tiny_model_dir, monkeypatch):
    from attnscope.analyses import bench

    monkeypatch.setattr(bench, "available_bytes", lambda device: 2**30)  # 1 GiB free
    monkeypatch.setattr(bench, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    monkeypatch.setattr(bench, "random_model", lambda *a, **k: pytest.fail("weights built before the check"))
    args = ["bench", "-m", tiny_model_dir, "--device", "cpu", "--seq-lens", "128", "--no-micro"]
    line = one_error_line(*cli(*args, "--batch-sizes", "1,4000"))
    assert "batch size 4000 × sequence length 128" in line and "GiB available on cpu" in line
    assert "use smaller --batch-sizes or --seq-lens" in line


def test_the_memory_estimate_is_below_what_a_forward_takes_and_grows_with_the_shape():
    from transformers import GPT2Config

    from attnscope.analyses.bench import estimated_bytes

    config = GPT2Config()
    weights = 4 * (config.vocab_size * 768 + 12 * 12 * 768 * 768)
    floor_8x1024 = estimated_bytes(config, 8, 1024, "floor", 4) - weights
    # docs/performance.md: the floor's measured peak at 8 × 1024 is 1.4 GB; the estimate must not refuse what runs
    assert 0.8e9 < floor_8x1024 < 1.4e9
    assert estimated_bytes(config, 16, 1024, "floor", 4) > estimated_bytes(config, 8, 1024, "floor", 4)
    # the notebook ways run one text at a time, but keep every layer's maps of it
    assert estimated_bytes(config, 8, 1024, "tutorial", 4) < estimated_bytes(config, 8, 1024, "floor", 4)
    assert estimated_bytes(config, 1, 1024, "tutorial", 4) > estimated_bytes(config, 1, 1024, "floor", 4)


@pytest.fixture(scope="module")
def nan_model_dir(tmp_path_factory):
    """A tiny GPT-2 whose second layer's query/key/value weights hold a NaN (a damaged checkpoint)."""
    from transformers import GPT2LMHeadModel

    folder = build_tiny_gpt2(tmp_path_factory.mktemp("nan-weights"))
    model = GPT2LMHeadModel.from_pretrained(folder)
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.weight[3, 5] = float("nan")
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "args, what",
    [
        (["heads", CAT], "the attention is not finite (NaN or infinity) from layer 1 on"),
        (["diversity", CAT, "--layer", "all"], "the attention is not finite (NaN or infinity) from layer 1 on"),
        (["attend", CAT, "--from", "mat"], "the attention is not finite (NaN or infinity) from layer 1 on"),
        (["show", CAT, "--layer", "1", "--json"], "the attention is not finite (NaN or infinity) from layer 1 on"),
        (["ablate", CAT], "the model's weights hold NaN or infinite values"),
        (["ablate", CAT, "--method", "gradient"], "the model's weights hold NaN or infinite values"),
    ],
)
def test_nan_weights_are_refused_naming_the_first_damaged_weight(cli, nan_model_dir, args, what):
    line = one_error_line(*cli(*args, "-m", nan_model_dir))
    assert what in line
    assert line.endswith(
        "h.1.attn.c_attn.weight): the checkpoint is damaged"
    )  # (transformer.)h.1…: ablate scans its LM model


def test_a_layer_before_the_damage_is_still_shown(cli, nan_model_dir):
    code, out, err = cli("show", CAT, "--layer", "0", "--json", "-m", nan_model_dir)
    assert code == 0, err


def test_half_precision_that_overflows_is_told_to_use_float32():
    from types import SimpleNamespace

    from attnscope.analyses.common import check_finite
    from attnscope.errors import AttnscopeError

    network = torch.nn.Linear(2, 2).half()
    model = SimpleNamespace(model=network, dtype=torch.float16)
    check_finite(model, "attention", [[0.5, 0.25], [0.1, 0.0]], range(2))  # finite: nothing to say
    with pytest.raises(AttnscopeError, match=r"from layer 1 on; nothing is reported: float16 overflowed: try --dtype"):
        check_finite(model, "attention", [[0.5, 0.25], [float("inf"), 0.0]], range(2))


@pytest.mark.slow
def test_a_context_too_short_for_the_probe_skips_it_with_a_note(cli, tmp_path):
    folder = build_tiny_gpt2(tmp_path / "ctx6", n_positions=6)
    import json

    code, out, err = cli("heads", "The cat sat", "-m", folder, "--json")
    assert code == 0, err
    document = json.loads(out)
    assert any("the repeated-token probe was skipped" in note and "context of 6 tokens" in note
               for note in document["notes"])  # fmt: skip
    assert all(head["induction"] is None and head["duplicate_token"] is None for head in document["heads"])
    assert "probe" not in document["input"]
    # a context that holds a short probe gets one, and says so
    folder = build_tiny_gpt2(tmp_path / "ctx9", n_positions=9)
    code, out, err = cli("heads", "The cat sat", "-m", folder, "--json")
    document = json.loads(out)
    assert document["input"]["probe"]["period"] == 4
    assert "probe period shortened to 4 tokens to fit the context of 9 tokens" in document["notes"]


@pytest.mark.slow
def test_a_csv_with_no_rows_still_has_its_header(cli, tmp_path):
    """A layer of one head has no pair to compare: the CSV is its header line, which CSV readers accept."""
    import csv
    import io

    folder = build_tiny_gpt2(tmp_path / "one-head", n_head=1)
    code, out, err = cli("diversity", CAT, "-m", folder, "--layer", "0", "--csv")
    assert code == 0, err
    reader = csv.DictReader(io.StringIO(out))
    assert list(reader) == [] and reader.fieldnames[:2] == ["a", "b"] and "js" in reader.fieldnames
