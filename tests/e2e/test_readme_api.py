"""The README's Python example runs as it is written, so the README cannot go stale: the code block of its "Python
API" section is taken from the file and run, on the bundled demo model."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_python_api_section_sits_between_the_commands_and_the_numbers():
    headings = re.findall(r"^## (.+)$", README.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert headings.index("Commands") < headings.index("Python API") < headings.index("What the numbers mean")


def test_the_readmes_python_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", _section("Python API"), flags=re.DOTALL)
    assert len(blocks) == 1
    code = blocks[0]
    for name in ("load(", "heads(", "to_records()", "_repr_html_()", "diversity(", "attend(", "plot()"):
        assert name in code, name
    monkeypatch.chdir(tmp_path)  # whatever it might write lands here
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    lines = printed.getvalue().splitlines()
    # the demo model's previous-token head (its model card: 0.2) heads the table sorted by previous_token, as the
    # comment in the example says
    assert lines[0].startswith("0.2 previous-token ")
    assert "first: 0.2 previous-token" in code
    assert [path.name for path in tmp_path.iterdir()] == ["role_map.svg"]  # the one figure it saves
    assert (tmp_path / "role_map.svg").read_text(encoding="utf-8").lstrip().startswith("<?xml")
