"""Adding a command is its modules, one record in attnscope.registry, its page and its tests (docs/development.md):
a throwaway command (tests/data/throwaway/echo_command.py), its record added before the package's API and command
line are built, appears in the Python API and `attnscope.__all__`, the command line and its `--help`, and the
documentation's reference, commands' index and navigation, and the API's stubs (scripts/generate_stubs.py), with
nothing else written for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = f"""
import sys
sys.path[:0] = [{str(ROOT / "tests" / "data" / "throwaway")!r}, {str(ROOT / "docs" / "hooks")!r}]
sys.path.append({str(ROOT / "scripts")!r})
from attnscope import registry
import echo_command
registry.COMMANDS = (*registry.COMMANDS, echo_command.RECORD)  # the one record: everything else is derived
import attnscope, generate
assert attnscope.echo(times=3).said == [7, 7, 7] and "echo" in attnscope.__all__
assert "## `attnscope echo`" in generate.cli_markdown() and "| `--times N` |" in generate.cli_markdown()
assert "| [`attnscope echo`](echo.md) | says 7 back |  |" in generate.commands_markdown()
assert "echo" in generate.api_markdown()
nav = generate.navigation([{{"Commands": [{{"Overview": "commands/index.md"}}, {{"Every option": "reference.md"}}]}}])
assert nav[0]["Commands"][-2] == {{"echo": "commands/echo.md"}}
import generate_stubs  # the API's stubs: its typed function, and the package's name for it
assert "def echo(\\n    *,\\n    times: int = 2,\\n) -> EchoResult:" in generate_stubs.api_stub()
assert "import echo as echo" in generate_stubs.package_stub()
from attnscope.cli.boundary import run
sys.exit(run(sys.argv[1:]))
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_command_is_one_record_in_the_registry():
    done = _run("echo", "--times", "3", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["command"] == "echo" and document["said"] == [7, 7, 7] and document["settings"] == {"times": 3}
    helped = _run("--help")
    assert helped.returncode == 0 and "echo" in helped.stdout.split("Commands:")[1], helped.stdout
    assert "Example: attnscope echo --times 3" in _run("echo", "--help").stdout
    refused = _run("echo", "--times", "0")
    assert refused.returncode == 2 and refused.stderr.startswith("attnscope: error: --times 0:"), refused.stderr
