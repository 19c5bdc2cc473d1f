"""The Python API and the CLI are one program: a function with keywords gives the document the command prints
with the same options, byte for byte, and the records its CSV holds; a keyword reaches the analysis as its option
does (`window=5` moves `local` as `--window 5` does)."""

from __future__ import annotations

import csv
import io
import json

import pytest

import attnscope
from tests.support import CAT, DOCTOR

# (command, the API's keywords, the CLI's options, the text: CAT, DOCTOR, None for the samples, or "file")
CASES = [
    ("heads", {}, [], CAT),
    ("heads", {"window": 5}, ["--window", "5"], CAT),
    ("heads", {"thresholds": {"previous-token": 0.1}, "probe": False}, ["-t", "previous-token=0.1", "--no-probe"], CAT),
    (
        "heads",
        {
            "thresholds": ["prev=0.2", "broad=0.3"],
            "probe_len": 5,
            "probe_seed": 3,
            "sort": "prev",
            "top": 3,
            "layer": 1,
        },
        [
            "-t",
            "prev=0.2",
            "-t",
            "broad=0.3",
            "--probe-len",
            "5",
            "--probe-seed",
            "3",
            "--sort",
            "prev",
            "--top",
            "3",
            "--layer",
            "1",
        ],
        CAT,
    ),
    (
        "heads",
        {"bos": False, "batch_size": 1, "max_tokens": 64},
        ["--no-bos", "--batch-size", "1", "--max-tokens", "64"],
        "file",
    ),
    ("diversity", {"layer": 1, "top": 2, "redundant": 0.2}, ["--layer", "1", "--top", "2", "--redundant", "0.2"], CAT),
    (
        "diversity",
        {"layer": "all", "sample_rows": 3, "seed": 7, "cluster_at": 0.5},
        ["--layer", "all", "--sample-rows", "3", "--seed", "7", "--cluster-at", "0.5"],
        "file",
    ),
    (
        "attend",
        {"from_token": "mat", "to_token": "cat", "tokens": 2, "top": 3},
        ["--from", "mat", "--to", "cat", "--tokens", "2", "--top", "3"],
        CAT,
    ),
    (
        "attend",
        {"from_token": "the", "from_index": 2, "to_token": "the", "to_index": 0},
        ["--from", "the", "--from-index", "2", "--to", "the", "--to-index", "0"],
        "the cat and the dog saw the bird",
    ),
    ("attend", {"from_token": "the", "index": 2, "bos": False}, ["--from", "the", "--index", "2", "--no-bos"], None),
    ("show", {"head": "1.2"}, ["--head", "L1H2"], DOCTOR),  # TransformerLens's spelling of a head too
    ("show", {"layer": 0, "index": 1}, ["--layer", "0", "--index", "1"], None),
    ("ablate", {"method": "gradient", "top": 3}, ["--method", "gradient", "--top", "3"], CAT),
    ("ablate", {"prune": 2, "batch_size": 2}, ["--prune", "2", "--batch-size", "2"], "file"),
    ("circuit", {"head": ["1.0"], "top": 2, "weights": False}, ["--head", "1.0", "--top", "2", "--no-weights"], CAT),
    (
        "report",
        {"diversity": False, "window": 4, "probe": False},
        ["--no-diversity", "--window", "4", "--no-probe"],
        CAT,
    ),
    ("info", {}, [], None),
]
WITHOUT_TEXT = {"info"}


def _texts(text, tmp_path) -> tuple[dict, list[str]]:
    """The same texts for the API and the CLI."""
    if text == "file":
        corpus = tmp_path / "corpus.txt"
        corpus.write_text(f"{CAT}\n\n{DOCTOR}\n", encoding="utf-8")
        return {"file": str(corpus)}, ["--file", str(corpus)]
    return ({}, []) if text is None else ({"texts": text}, [text])


def _ids(case) -> str:
    return f"{case[0]}:{','.join(case[2]) or 'defaults'}"


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("command, keywords, options, text", CASES, ids=[_ids(case) for case in CASES])
def test_a_function_gives_the_document_and_the_rows_of_its_command(
    cli, tiny_model_dir, tmp_path, command, keywords, options, text
):
    given, arguments = _texts(text, tmp_path) if command not in WITHOUT_TEXT else ({}, [])
    result = getattr(attnscope, command)(str(tiny_model_dir), **given, **keywords, device="cpu")
    model = ["-m", str(tiny_model_dir), "--device", "cpu"]
    code, out, err = cli(command, *arguments, *model, *options, "--json")
    assert code == 0, err
    assert result.to_json() == out  # byte for byte
    code, out, err = cli(command, *arguments, *model, *options, "--csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    records = result.to_records()
    assert [list(row) for row in rows] == [list(record) for record in records]
    for row, record in zip(rows, records, strict=True):
        for key, value in record.items():
            if isinstance(value, float):
                assert float(row[key]) == pytest.approx(value, abs=1e-6), key
            else:
                assert row[key] == ("" if value is None else str(value)), key


def test_window_reaches_the_local_score_as_the_option_does(cli, tiny_model_dir):
    """`local` is the attention on the current token and the `window` before it: a wider window holds more of every
    row, and the API's keyword moves it exactly as the CLI's option."""
    narrow = attnscope.heads(str(tiny_model_dir), CAT, device="cpu", window=1)
    wide = attnscope.heads(str(tiny_model_dir), CAT, device="cpu", window=5)
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir, "--device", "cpu", "--window", "5", "--json")
    assert code == 0, err
    by_cli = {head["label"]: head["local"] for head in json.loads(out)["heads"]}
    for before, after in zip(narrow.heads, wide.heads, strict=True):
        assert after.scores["local"] > before.scores["local"]
        assert by_cli[after.label] == pytest.approx(after.scores["local"], abs=1e-6)
    assert wide.settings["window"] == 5 and narrow.settings["window"] == 1


def test_random_mha_gives_the_commands_document(cli):
    result = attnscope.random_mha(d_model=16, head_counts=(1, 2), seq_len=8, trials=1, seed=3)
    code, out, err = cli(
        "random-mha",
        "--d-model",
        "16",
        "--head-counts",
        "1,2",
        "--seq-len",
        "8",
        "--trials",
        "1",
        "--seed",
        "3",
        "--json",
    )
    assert code == 0, err
    assert result.to_json() == out


def test_an_error_is_the_clis_line_as_an_exception(cli, tiny_model_dir):
    """The same settings are refused with the same words: the CLI prints the AttnscopeError's message."""
    with pytest.raises(attnscope.AttnscopeError) as raised:
        attnscope.heads(str(tiny_model_dir), CAT, device="cpu", sort="induction", probe=False)
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir, "--device", "cpu", "--sort", "induction", "--no-probe")
    assert code == 2 and err.strip() == f"attnscope: error: {raised.value}"
