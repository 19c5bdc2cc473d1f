"""Every command's `--json` on the demo model, byte for byte as it was when these files were written: a change of
shape (issue 39: one command registry, orchestrators split into named steps, shared scoring moved) must not change
what any command prints. The files in tests/data/same-output are the commands' own output, kept as a record of
behaviour that other tests prove right (each command has tests against independent references); they change only
with a change of behaviour that is meant, written down in the CHANGELOG, by running

    ATTNSCOPE_WRITE_SAME_OUTPUT=1 python -m pytest tests/e2e/test_same_output.py -n 0

`bench` is left out: its times change at every run. `compare` compares the demo with the demo without its head 0.2,
saved by `ablate --save` into a folder of the test's own (its name, not its place, is in the JSON)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "data" / "same-output"
CAT = "The cat sat on the mat because it was tired."
DOCTOR = "The doctor said that she would help the patient."
PATCHED = (
    "--clean", "The file and the list hold the value method. The file and the list hold the value",
    "--corrupt", "The file and the list hold the code method. The file and the list hold the value",
    "--answer", "method", "--wrong", "table",
)  # fmt: skip
COMMANDS = {
    "heads": ("heads", CAT, "--model", "demo"),
    "show": ("show", DOCTOR, "--model", "demo", "--layer", "0"),
    "diversity": ("diversity", "--model", "demo", "--layer", "all"),
    "random-mha": ("random-mha", "--d-model", "64", "--head-counts", "1,2,4"),
    "attend": ("attend", DOCTOR, "--model", "demo", "--from", "she", "--to", "doctor"),
    "ablate": ("ablate", CAT, "--model", "demo", "--prune", "4"),
    "circuit": ("circuit", "--model", "demo", "--head", "1.0", "--top", "3"),
    "report": ("report", "--model", "demo", DOCTOR),
    "compare": ("compare", "--model", "demo", "--model", "demo-no-0.2", CAT),
    "info": ("info", "--model", "demo"),
    "patch": ("patch", "--model", "demo", *PATCHED),
    "discover": ("discover", "--model", "demo", "--file", "sample_texts/demo-pairs.jsonl", "--method", "eap"),
    "kvplan": ("kvplan", "--model", "demo", "--sink", "16", "--recent", "64"),
}
WRITE = os.environ.get("ATTNSCOPE_WRITE_SAME_OUTPUT") == "1"


def test_every_command_but_bench_is_recorded():
    from attnscope import api

    assert set(COMMANDS) == set(api.COMMANDS) - {"bench"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_json_is_what_it_was(name, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sample_texts").symlink_to(ROOT / "sample_texts")
    if name == "compare":
        code, _, err = cli("ablate", "--model", "demo", "--remove", "0.2", "--save", "demo-no-0.2", "--json")
        assert code == 0, err
    code, out, err = cli(*COMMANDS[name], "--json")
    assert code == 0, err
    recorded = RECORDED / f"{name}.json"
    if WRITE:
        recorded.write_text(out, encoding="utf-8")
    assert out == recorded.read_text(encoding="utf-8"), f"{name}: its --json changed"
