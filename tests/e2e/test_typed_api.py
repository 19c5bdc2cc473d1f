"""The API is typed for the tools that read code without running it: mypy, run on a user's script against the
package's stubs (attnscope/api.pyi, attnscope/__init__.pyi), passes a correct script and reports a misspelt keyword,
a value of the wrong type, a choice that is none of the choices, a misspelt function and a misspelt method of a result.

mypy reads the checkout as a user's installed package (MYPYPATH: the editable install's import hook is invisible to
it); it follows attnscope's own modules silently, for the result classes the stubs name, and skips the third-party
ones (torch, transformers: tens of seconds to analyse, and nothing of the API's surface)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import attnscope

ROOT = Path(attnscope.__file__).resolve().parents[1]

CORRECT = """\
import attnscope

model = attnscope.load("demo", dtype="float32", lm_head=False)
heads = attnscope.heads(model, "The cat sat on the mat.", window=5, sort="prev", top=3, plot=["4.11"])
rows: list[dict] = heads.to_records()
diversity = attnscope.diversity("demo", ["one text", attnscope.Text("another", "mine")], layer="all")
plan = attnscope.kvplan(model, streaming="auto", check_lengths=[128], progress=lambda texts, tokens, share: None)
pages = attnscope.report(["demo", model], revisions=None, status=print)
"""
WRONG = {  # a line of a user's script, and what mypy says of it
    'attnscope.heads("demo", "text", sortt="prev")': r'Unexpected keyword argument "sortt" for "heads"; did you mean',
    'attnscope.heads("demo", "text", top="3")': r'Argument "top" to "heads" has incompatible type "str"',
    'attnscope.load("demo", dtype="float64")': r'Argument "dtype" to "load" has incompatible type',
    'attnscope.ablate("demo", method="los")': r'Argument "method" to "ablate" has incompatible type',
    'attnscope.bench(attnscope.load("demo"))': r'Argument 1 to "bench" has incompatible type "LoadedModel"',
    'attnscope.heds("demo")': r'Module has no attribute "heds"; maybe "heads"\?',
    'attnscope.heads("demo").to_recrds()': r'"HeadsResult" has no attribute "to_recrds"',
}
CONFIG = "[mypy]\nfollow_imports = skip\n\n[mypy-attnscope.*]\nfollow_imports = silent\n"


@pytest.mark.slow
def test_mypy_passes_a_correct_script_and_reports_each_mistake(tmp_path):
    (tmp_path / "correct.py").write_text(CORRECT, encoding="utf-8")
    (tmp_path / "wrong.py").write_text("import attnscope\n\n" + "\n".join(WRONG) + "\n", encoding="utf-8")
    (tmp_path / "mypy.ini").write_text(CONFIG, encoding="utf-8")
    command = [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", str(tmp_path / "cache")]
    environment = {**os.environ, "MYPYPATH": str(ROOT)}
    done = subprocess.run(
        [*command, "--no-error-summary", "correct.py", "wrong.py"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "No module named mypy" not in done.stderr, "mypy is in the test extra: pip install -e '.[test]'"
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    assert not [line for line in errors if not line.startswith("wrong.py:")], done.stdout + done.stderr
    for number, (line, said) in enumerate(WRONG.items(), start=3):
        found = [error for error in errors if error.startswith(f"wrong.py:{number}: ")]
        assert found and re.search(said, found[0]), (line, found, done.stdout)
    assert len(errors) == len(WRONG), done.stdout
