"""The bundled demo model: loads offline through the real path, and attnscope finds its learned heads.

The heads were trained, not planted (scripts/train_demo_model.py); these tests check that the shipped weights have
them and that the tool finds them with its default settings, on the bundled sample texts and the default probe.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnscope.models.loading import demo_model_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def heads_doc():
    from attnscope.cli import run

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert run(["heads", "--model", "demo", "--json", "--device", "cpu"]) == 0
    return json.loads(buffer.getvalue())


def test_small_safetensors_only_with_a_model_card():
    files = {path.name: path.stat().st_size for path in demo_model_dir().iterdir()}
    assert sum(files.values()) <= 10 * 10**6
    assert "model.safetensors" in files and "MODEL_CARD.md" in files
    assert not [name for name in files if name.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl"))]
    card = (demo_model_dir() / "MODEL_CARD.md").read_text()
    assert "python scripts/train_demo_model.py" in card and "Python Software Foundation License" in card


def test_loads_like_any_gpt2_checkpoint():
    from attnscope.models.loading import load_model

    loaded = load_model("demo", "cpu")
    assert type(loaded.model).__name__ == "GPT2Model" and loaded.config.model_type == "gpt2"
    assert loaded.family.name == "GPT-2" and loaded.kind.name == "decoder"
    assert loaded.tokenizer("The cat sat on the mat.")["input_ids"]  # ordinary English encodes
    assert loaded.tokenizer.bos_token == "<|endoftext|>"


def test_odd_text_round_trips_through_the_demo_tokenizer():
    from attnscope.models.loading import load_model

    tokenizer = load_model("demo", "cpu").tokenizer
    for text in ("naïve café, Ελληνικά, 日本語 🙂", "def f(x):\n\treturn x ** 2  # tabs and spaces", "a\u200bb\r\n"):
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text  # byte-level BPE: every text encodes and comes back whole, no UNK


def test_attnscope_finds_a_previous_token_head_and_an_induction_head(heads_doc):
    heads = heads_doc["heads"]
    assert heads_doc["model"]["kind"] == "decoder"
    assert heads_doc["input"]["sources"][0].startswith("sample")  # the bundled sample texts
    assert heads_doc["input"]["probe"]["period"] == 50  # the default probe, not shortened
    best_previous = max(heads, key=lambda head: head["previous_token"])
    best_induction = max(heads, key=lambda head: head["induction"])
    assert best_previous["previous_token"] >= 0.7 and best_previous["role"] == "previous-token"
    assert best_induction["induction"] >= 0.5 and best_induction["role"] == "induction"
    assert best_previous["layer"] < best_induction["layer"]  # the induction circuit: previous-token head first
    # the two patterns are told apart: the induction head is not a previous-token head on the probe's terms
    assert best_induction["previous_token"] < 0.5 and best_previous["induction"] < 0.5


def test_model_card_scores_are_what_the_tool_measures(heads_doc):
    scores = json.loads((demo_model_dir() / "scores.json").read_text())
    by_label = {head["label"]: head for head in heads_doc["heads"]}
    for kind in ("previous_token", "induction"):
        head = by_label[scores[kind]["head"]]
        assert head[kind] == pytest.approx(scores[kind]["score"], abs=1e-5)
        assert head["role"] == scores[kind]["role"]
    assert heads_doc["input"]["probe"] == scores["probe"]
    for label, recorded in scores["heads"].items():  # every head of the card
        assert by_label[label]["role"] == recorded["role"], label
        for name, value in recorded.items():
            if name != "role":
                assert by_label[label][name] == pytest.approx(value, abs=1e-5), (label, name)


@pytest.mark.slow
def test_readme_main_command_runs_offline(tmp_path):
    """`attnscope heads --model demo`, as the README's first command runs it, in a fresh process with the Hub
    unreachable and an empty cache: the role map shows the previous-token and induction heads."""
    assert "attnscope heads --model demo" in (ROOT / "README.md").read_text()
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "empty-cache"), COLUMNS="100")
    done = subprocess.run(
        [sys.executable, "-m", "attnscope", "heads", "--model", "demo", "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    map_rows = [line.split() for line in done.stdout.split("Heads")[0].splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in map_rows] == ["0", "1"]  # one row of cells per layer, the legend left out
    assert "prev" in map_rows[0][1:] and "induc" in map_rows[1][1:]


@pytest.mark.slow
def test_a_built_wheel_carries_the_demo_model_and_the_samples(tmp_path):
    """`pip install .` (not only the editable install the tests run from) must ship the package data, and the API's
    types."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "attnscope", tmp_path / "attnscope", ignore=shutil.ignore_patterns("__pycache__", "*.log"))
    build = "import setuptools.build_meta as b; print(b.build_wheel('dist'))"
    result = subprocess.run([sys.executable, "-c", build], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    wheel = tmp_path / "dist" / result.stdout.strip().splitlines()[-1]
    shipped = set(zipfile.ZipFile(wheel).namelist())
    for folder, pattern in (("demo_model", "*"), ("sample_texts", "*.txt")):
        expected = {f"attnscope/{folder}/{p.name}" for p in (tmp_path / "attnscope" / folder).glob(pattern)}
        assert expected and expected <= shipped, sorted(expected - shipped)
    assert "attnscope/demo_model/model.safetensors" in shipped
    # every subpackage of the new layout ships too
    for package in ("scores", "models", "pipeline", "analyses", "output"):
        assert f"attnscope/{package}/__init__.py" in shipped, package
    # the API's types: PEP 561's marker, and the stubs a type checker reads (scripts/generate_stubs.py)
    assert {"attnscope/py.typed", "attnscope/__init__.pyi", "attnscope/api.pyi"} <= shipped
