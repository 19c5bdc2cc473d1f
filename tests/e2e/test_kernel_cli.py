"""`--kernel` end to end: the block path as before; the fused kernel on the CPU under Triton's interpreter (slow, and
said so), equal to the block path; one error line where the fused kernel cannot run; the commands that capture no
attention refusing the option; bench timing either kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.support import CAT

INTERPRETER = "the fused kernel ran under Triton's interpreter"


def _needs_the_interpreter(in_this_process: bool) -> None:
    """Skip where Triton's interpreter cannot run the kernel on the CPU: no Triton, a Triton too old for numpy 2, or
    (in this process) a GPU machine, where the conftest leaves the interpreter off so that the GPU compiles."""
    pytest.importorskip("triton", reason="needs triton")
    from attnscope.pipeline import kernels

    if (why := kernels.old_interpreter()) is not None:
        pytest.skip(why)
    if in_this_process and torch.cuda.is_available():
        pytest.skip("the interpreter is off in this process (a GPU compiles the kernel)")


def _scores(doc):
    """(layer, head) -> every number of the head's record."""
    return {
        (head["layer"], head["head"]): {name: value for name, value in head.items() if isinstance(value, float)}
        for head in doc["heads"]
    }


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_kernel_blocks_is_what_the_cpu_ran_before(cli, tiny_model_dir):
    """On the CPU `auto` is the block path: the same bytes, and no note about kernels."""
    common = ("heads", CAT, "-m", tiny_model_dir, "--device", "cpu", "--no-probe", "--json")
    auto, blocks = cli(*common), cli(*common, "--kernel", "blocks")
    assert auto[0] == blocks[0] == 0
    assert auto[1] == blocks[1] and auto[2] == blocks[2] == ""


@pytest.mark.slow
def test_kernel_fused_on_the_cpu_runs_the_interpreter_and_says_so(cli, tiny_model_dir):
    _needs_the_interpreter(in_this_process=True)
    common = ("heads", CAT, "-m", tiny_model_dir, "--device", "cpu", "--no-probe", "--json")
    code, out, err = cli(*common, "--kernel", "fused")
    assert code == 0, err
    assert INTERPRETER in err and "very slow" in err
    doc = json.loads(out)
    assert any(INTERPRETER in note for note in doc["notes"])
    blocks = json.loads(cli(*common, "--kernel", "blocks")[1])
    for head, scores in _scores(blocks).items():
        assert _scores(doc)[head] == pytest.approx(scores, abs=1e-5), head


def test_kernel_fused_without_triton_is_one_error_line(cli, tiny_model_dir, monkeypatch):
    import attnscope.pipeline
    from attnscope.models import loading

    monkeypatch.delattr(attnscope.pipeline, "fused", raising=False)
    monkeypatch.delitem(sys.modules, "attnscope.pipeline.fused", raising=False)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` fails, as where it is not installed
    monkeypatch.setattr(loading, "load_model", lambda *args: pytest.fail("a model was loaded before the check"))
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir, "--device", "cpu", "--kernel", "fused")
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith("attnscope: error: kernel fused: Triton cannot be imported")
    assert line.endswith("pip install 'attnscope[gpu]'")


@pytest.mark.parametrize("command", ["ablate", "info"])
def test_commands_that_capture_no_attention_refuse_a_kernel(cli, tiny_model_dir, command):
    code, out, err = cli(command, "-m", tiny_model_dir, "--device", "cpu", "--kernel", "blocks")
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()  # the option is not theirs: it is not offered, and --help does not list it
    assert line.startswith("attnscope: error: No such option: --kernel")
    assert line.endswith(f"attnscope {command} --help)")


@pytest.mark.slow
def test_a_fresh_process_switches_the_interpreter_on_by_itself(tiny_model_dir):
    """Triton reads TRITON_INTERPRET when it is imported: without the variable (the tests' conftest sets it), the
    command sets it before anything imports Triton."""
    _needs_the_interpreter(in_this_process=False)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-m", "attnscope", "show", CAT, "-m", str(tiny_model_dir), "--device", "cpu", "--layer", "1",
         "--kernel", "fused", "--json"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # show keeps full maps: the block path computes them, and says why the fused kernel was left
    assert "full attention weights" in result.stderr and "come from the block path" in result.stderr
    assert json.loads(result.stdout)["command"] == "show"


@pytest.mark.slow
def test_bench_times_either_kernel(cli, tiny_model_dir):
    _needs_the_interpreter(in_this_process=True)  # the fused row runs on the CPU
    code, out, err = cli(
        "bench", "-m", tiny_model_dir, "--device", "cpu", "--seq-lens", "16", "--batch-sizes", "2",
        "--repeats", "1", "--warmup", "0", "--methods", "floor,attnscope,fused,blocks", "--no-micro", "--json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert [row["method"] for row in doc["results"]] == ["floor", "attnscope", "fused", "blocks"]
    assert doc["settings"]["kernel"] == "blocks"  # the attnscope row's, auto on the CPU
    assert any(INTERPRETER in note for note in doc["notes"])
    assert all(row["median_s"] > 0 for row in doc["results"])


def test_a_triton_too_old_for_numpy_2_is_one_error_line_on_the_cpu(cli, tiny_model_dir, monkeypatch):
    """Triton 3.6's interpreter fails inside the kernel with numpy 2 (seen on a GPU machine's image): on the CPU the
    fused kernel is refused before anything runs, naming the versions, rather than ending in a traceback."""
    triton = pytest.importorskip("triton", reason="needs triton")
    import numpy

    if int(numpy.__version__.split(".")[0]) < 2:
        pytest.skip("numpy 1 runs the old interpreter")
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir, "--device", "cpu", "--kernel", "fused")
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert line.startswith("attnscope: error: kernel fused: on the CPU it runs under Triton's interpreter")
    assert "Triton 3.6.0's fails with numpy" in line and line.endswith("pip install 'triton>=3.7'")
