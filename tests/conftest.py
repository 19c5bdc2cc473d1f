"""Fixtures: tiny random-weight models of every kind saved to disk and loaded by path, like real ones; the CLI run
in-process; a network that cannot be reached.

Tiers: tests/unit (pure functions, no model), tests/integration (the library on tiny models), tests/e2e (the real
CLI, subprocesses, a browser). `-m "not slow"` leaves out what takes seconds per test.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# The user's own cache, for the one test that may read real weights (tests/e2e/test_known_heads.py), kept before
# HF_HOME is pointed at an empty folder below.
os.environ.setdefault("ATTNSCOPE_REAL_HF_HOME", os.environ.get("HF_HOME", ""))
# No test may touch the network: the Hub is off and the cache is an empty folder. Set here, when pytest loads this
# file and before any test module imports transformers: huggingface_hub reads both variables once, on import.
OFFLINE_HF_HOME = tempfile.mkdtemp(prefix="attnscope-tests-hf-home-")
# Every process that loads this file makes one (xdist's controller and each worker); each removes its own on exit.
atexit.register(shutil.rmtree, OFFLINE_HF_HOME, ignore_errors=True)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = OFFLINE_HF_HOME
# Off a terminal a long run prints a progress line now and then (cli.display.Live); a test run on a busy machine
# would get one where it checks stderr line by line. The tests of those lines turn them back on.
os.environ["ATTNSCOPE_PROGRESS"] = "off"
# Without a GPU the fused kernel's tests run it under Triton's interpreter. Triton reads TRITON_INTERPRET once, when it
# is imported (triton.language decorates its own functions, tl.sum and the like, as compiled or interpreted then),
# and transformers imports it (through torch._dynamo) long before any kernel runs: so it is set here, before any test
# module imports transformers. Not with a GPU, whose tests compile the kernel for it.
import torch  # noqa: E402  (torch itself does not import triton)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The suite runs in one worker per core (pytest-xdist, `-n auto` in pyproject.toml): each worker's torch gets its
# share of the cores, not all of them, so that two workers on two cores do not fight over four threads.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

from tests.support import BUILDERS, build_family_model, build_tiny_gpt2, with_nan  # noqa: E402  (after the offline variables)


@pytest.fixture(scope="session", autouse=True)
def offline():
    """The empty cache stays empty (a test that downloaded would fill it), and goes at the end."""
    yield
    leftovers = [path for path in Path(OFFLINE_HF_HOME).rglob("*") if path.is_file()]
    shutil.rmtree(OFFLINE_HF_HOME, ignore_errors=True)
    assert not leftovers, f"tests wrote into the offline Hugging Face cache: {leftovers[:5]}"


@pytest.fixture(autouse=True)
def _one_call_a_bench_sample(monkeypatch):
    """bench repeats a short call until a timed sample lasts 0.1 s, so that its figures are steady; tests check what
    it reports, not how steady it is, so a sample is one call (tests of the sampling itself set their own)."""
    from attnscope.analyses import bench

    monkeypatch.setattr(bench, "SAMPLE_S", 0.0)


@pytest.fixture(autouse=True)
def _kernel_decided_afresh():
    """`kernels.decide` remembers its answer for the process (Triton does not come and go in a real one); a test
    that takes Triton away must not read an answer an earlier test cached with Triton there."""
    from attnscope.pipeline import kernels

    kernels.decide.cache_clear()


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    """kind -> the folder of a tiny model of that kind (built once per session)."""
    return {kind: build(tmp_path_factory.mktemp(f"tiny-{kind}")) for kind, build in BUILDERS.items()}


@pytest.fixture(scope="session")
def loaded_models(model_dirs) -> dict[str, object]:
    from attnscope.models.loading import load_model

    return {kind: load_model(str(folder), "cpu") for kind, folder in model_dirs.items()}


@pytest.fixture(params=sorted(BUILDERS))
def kind(request) -> str:
    """Each kind of attention in turn: a test that takes it runs once per kind."""
    return request.param


@pytest.fixture
def model_dir(model_dirs, kind) -> Path:
    return model_dirs[kind]


@pytest.fixture
def model(loaded_models, kind):
    """The tiny model of the current kind, loaded as any model is."""
    return loaded_models[kind]


@pytest.fixture(scope="session")
def tiny_model_dir(model_dirs) -> Path:
    return model_dirs["decoder"]


@pytest.fixture(scope="session")
def tiny(loaded_models):
    return loaded_models["decoder"]


@pytest.fixture(scope="session")
def tiny_bert_dir(model_dirs) -> Path:
    return model_dirs["encoder"]


@pytest.fixture(scope="session")
def tiny_bert(loaded_models):
    return loaded_models["encoder"]


@pytest.fixture(scope="session")
def mlp_nan_model_dir(tmp_path_factory) -> Path:
    """The tiny GPT-2 with a NaN in its last layer's MLP: every attention map stays finite (that MLP comes after the
    last attention), its loss does not: a damaged checkpoint that no map reveals."""
    return with_nan(build_tiny_gpt2(tmp_path_factory.mktemp("mlp-nan")), "transformer.h.1.mlp.c_fc.weight", (2, 7))


@pytest.fixture(scope="session")
def mlp_nan_model(mlp_nan_model_dir):
    from attnscope.models.loading import load_model

    return load_model(str(mlp_nan_model_dir), "cpu")


@pytest.fixture(scope="session")
def short_context_model_dir(tmp_path_factory) -> Path:
    """Context of 16 tokens, so that ordinary sentences must be split into windows."""
    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2-ctx16"), seed=1, n_positions=16)


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory):
    """family -> the folder of its tiny model (tests.support.FAMILY_MODELS), built the first time a test asks."""
    built = {}

    def folder(name):
        if name not in built:
            built[name] = build_family_model(name, tmp_path_factory.mktemp(name))
        return built[name]

    return folder


@pytest.fixture
def cli(capsys):
    """Run the real CLI in-process: returns (exit status, stdout, stderr)."""
    from attnscope.cli import run

    def invoke(*args):
        code = run([str(arg) for arg in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke
