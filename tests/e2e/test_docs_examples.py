"""The examples of README.md and docs/ run as they are written, so that they cannot go stale.

- Python: every code block marked `<!-- test: run -->` on the line before it is run, in a folder of its own, on the
  bundled demo model; what it prints and writes is checked against something known apart from it (the demo model's
  card, the files `--out` writes).
- The command line (slow): every line of a bash block that starts with `attnscope` and uses `--model demo`, a model
  of the repository's `tests/data` (the passkey model), or no model (`random-mha`) is run through the CLI, in a
  folder of its own, and must succeed without an error line.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SOURCES = [README, *sorted(path for path in (ROOT / "docs").rglob("*.md") if "hooks" not in path.parts)]
CARD = json.loads((ROOT / "attnscope" / "demo_model" / "scores.json").read_text(encoding="utf-8"))


def runnable_python(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return re.findall(r"^<!-- test: run -->\n```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def run_python(code: str, path: Path, folder: Path, monkeypatch) -> list[str]:
    monkeypatch.chdir(folder)  # whatever it writes lands here
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(path), "exec"), {"__name__": "docs_example"})
    return printed.getvalue().splitlines()


PREVIOUS_TOKEN_HEAD = CARD["previous_token"]["head"]  # the demo model's previous-token head, as its card records it


def test_the_examples_to_run_are_marked():
    assert len(runnable_python(README)) == 1
    assert len(runnable_python(ROOT / "docs" / "api.md")) == 2


def test_the_readmes_python_example(tmp_path, monkeypatch):
    (code,) = runnable_python(README)
    lines = run_python(code, README, tmp_path, monkeypatch)
    # the table sorted by previous-token score starts with the card's previous-token head, as the comment says
    assert len(lines) == 3 and lines[0].startswith(f"{PREVIOUS_TOKEN_HEAD} previous-token ")
    assert "first: 0.2 previous-token" in code
    assert not any(tmp_path.iterdir())  # it writes nothing


def test_the_api_pages_first_example(tmp_path, monkeypatch):
    path = ROOT / "docs" / "api.md"
    code = runnable_python(path)[0]
    for name in ("load(", "heads(", "to_records()", "_repr_html_()", "diversity(", "attend(", "plot()"):
        assert name in code, name
    lines = run_python(code, path, tmp_path, monkeypatch)
    assert lines[0].startswith(f"{PREVIOUS_TOKEN_HEAD} previous-token ")
    assert "first: 0.2 previous-token" in code
    assert [path.name for path in tmp_path.iterdir()] == ["role_map.svg"]  # the one figure it saves
    assert (tmp_path / "role_map.svg").read_text(encoding="utf-8").lstrip().startswith("<?xml")


@pytest.mark.slow
def test_the_api_pages_second_example(tmp_path, monkeypatch):
    path = ROOT / "docs" / "api.md"
    code = runnable_python(path)[1]
    lines = run_python(code, path, tmp_path, monkeypatch)
    saved = sorted(path.name for path in (tmp_path / "ablation").iterdir())
    assert lines[0] == str(saved) and "importance.svg" in saved and "ablate.json" in saved
    assert lines[1] == "words"


# ------------------------------------------------------------------------------------------- command lines


REPOSITORY_MODELS = {"tests/data/passkey-model"}  # models a clone of the repository holds


def command_lines() -> list[tuple[str, list[str]]]:
    """(where, argv) for every command line of the docs that runs offline, each once (its comment aside), in the
    order written: the demo's, random-mha's, and those of models an earlier line saved (`ablate --save DIR`, then
    `compare --model demo --model DIR`: the README's offline compare)."""
    found: dict[tuple[str, ...], tuple[str, list[str]]] = {}
    saved: set[str] = set()
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
            for line in block.splitlines():
                if not line.startswith("attnscope "):
                    continue
                argv = shlex.split(line, comments=True)[1:]
                models = [value for flag, value in zip(argv, argv[1:], strict=False) if flag in ("--model", "-m")]
                if (models and set(models) <= {"demo", *REPOSITORY_MODELS, *saved}) or argv[0] == "random-mha":
                    found.setdefault(tuple(argv), (path.relative_to(ROOT).as_posix(), argv))
                    if "--save" in argv:
                        saved.add(argv[argv.index("--save") + 1])
    return list(found.values())


def test_every_command_page_has_an_example_that_runs_offline():
    import typer

    from attnscope.cli import app

    root = typer.main.get_command(app)
    run = {argv[0] for _, argv in command_lines()}
    pages = {path.stem for path in (ROOT / "docs" / "commands").glob("*.md")} - {"index"}
    assert pages <= run | {"index"}, sorted(pages - run)
    assert run <= set(root.list_commands(root.context_class(root, info_name="attnscope")))
    # attend and show are shown with words, occurrences and the sink (each at least three ways)
    assert sum(argv[0] == "attend" for _, argv in command_lines()) >= 3
    assert sum(argv[0] == "show" for _, argv in command_lines()) >= 3
    assert sum("--words" in argv for _, argv in command_lines()) >= 2


@pytest.mark.slow
def test_every_offline_command_line_of_the_docs_runs(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write into relative folders
    (tmp_path / "sample_texts").symlink_to(ROOT / "sample_texts")  # and read from the repository's root
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "data").symlink_to(ROOT / "tests" / "data")
    for where, argv in command_lines():
        code, out, err = cli(*argv)
        assert code == 0, (where, argv, err)
        assert "error:" not in err, (where, argv, err)
        if "--out" in argv:
            folder = tmp_path / argv[argv.index("--out") + 1]
            assert any(folder.iterdir()), (where, argv)
