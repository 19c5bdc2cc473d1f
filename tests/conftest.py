"""Shared fixtures: tiny random-weight GPT-2 models saved to disk and loaded by path, like real ones.

The tokenizer is the real GPT-2 BPE vocabulary, copied into tests/data/gpt2-tokenizer (MIT, see its LICENSE).
Weights use a large initializer range so that heads differ clearly from each other and from uniform attention:
with GPT-2's default 0.02 every head of a tiny model is nearly uniform, and a test that swapped heads would pass.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
REAL_HF_HOME = os.environ.get("HF_HOME")  # before the `offline` fixture points HF_HOME at an empty folder
TOKENIZER_DIR = DATA / "gpt2-tokenizer"


def build_tiny_gpt2(folder: Path, seed: int = 0, **config) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    torch.manual_seed(seed)
    settings = dict(n_layer=2, n_head=4, n_embd=32, n_positions=128, initializer_range=0.3)
    settings.update(config)
    GPT2LMHeadModel(GPT2Config(**settings)).save_pretrained(folder)
    GPT2TokenizerFast.from_pretrained(TOKENIZER_DIR).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def offline(tmp_path_factory):
    """No test may touch the network: the Hub is off and the cache is an empty folder."""
    saved = {key: os.environ.get(key) for key in ("HF_HUB_OFFLINE", "HF_HOME")}
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HOME"] = str(tmp_path_factory.mktemp("hf-home"))
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))


@pytest.fixture(scope="session")
def short_context_model_dir(tmp_path_factory) -> Path:
    """Context of 16 tokens, so that ordinary sentences must be split into windows."""
    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2-ctx16"), seed=1, n_positions=16)


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    from attnscope.model import load_model

    return load_model(str(tiny_model_dir), "cpu")


@pytest.fixture
def cli(capsys):
    """Run the real CLI in-process: returns (exit status, stdout, stderr)."""
    from attnscope.cli import run

    def invoke(*args: str):
        code = run([str(arg) for arg in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke
