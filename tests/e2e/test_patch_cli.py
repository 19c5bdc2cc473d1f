"""`patch` end to end on the demo model: the JSON (deterministic, its baselines those of transformers' own logits),
the CSV, --top, the files of --out; every pair that cannot be patched, and a model that cannot, ends in one line and
exit status 2."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from tests.support import demo_logit_differences, png_size, replaced

REPEATED = "The file and the list hold the value {0}. The file and the list hold the value"
PAIR = {"clean": REPEATED.format("method"), "corrupt": REPEATED.format("table"), "answer": "method", "wrong": "table"}
ARGS = ["--model", "demo", *(item for key, value in PAIR.items() for item in (f"--{key}", value))]


@pytest.mark.slow
def test_json_csv_and_top(cli):
    code, out, err = cli("patch", *ARGS, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "patch" and doc["input"]["n_pairs"] == 1
    clean, corrupt = demo_logit_differences(PAIR["clean"], PAIR["corrupt"])
    assert doc["clean_logit_diff"] == pytest.approx(clean, abs=1e-4)
    assert doc["corrupt_logit_diff"] == pytest.approx(corrupt, abs=1e-4)
    (pair,) = doc["pairs"]
    assert (pair["answer"], pair["wrong"], pair["n_tokens"]) == (" method", " table", 21)
    heads = doc["heads"]
    assert len(heads) == 8 and set(heads[0]) == {"label", "layer", "head", "restored", "removed", "rank"}
    assert [head["restored"] for head in heads] == sorted((head["restored"] for head in heads), reverse=True)
    assert cli("patch", *ARGS, "--json")[1] == out  # deterministic
    code, out, err = cli("patch", *ARGS, "--csv", "--top", "3")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [row["label"] for row in rows] == [head["label"] for head in heads[:3]]
    assert len(json.loads(cli("patch", *ARGS, "--json", "--top", "3")[1])["heads"]) == 3


@pytest.mark.slow
def test_out_writes_every_head_and_the_two_grids(cli, tmp_path):
    code, out, err = cli("patch", *ARGS, "--top", "2", "--out", tmp_path / "patched")
    assert code == 0, err
    folder = tmp_path / "patched"
    assert sorted(path.name for path in folder.iterdir()) == ["patch.csv", "patch.json", "removed.png", "restored.png"]
    assert len(json.loads((folder / "patch.json").read_text())["heads"]) == 8  # --top cuts no file
    assert len((folder / "patch.csv").read_text().splitlines()) == 9
    png_size(folder / "restored.png")
    assert "Share of the logit difference restored, % (100 = all of it)" in out
    table = out.split("Heads that restore the most")[1]
    assert len(re.findall(r"^\s+\d\.\d\s+-?\d", table, re.MULTILINE)) == 2  # the table: the --top rows


@pytest.mark.parametrize(
    "change, message",
    [
        (["--corrupt", "The file and the list hold the value. The file and the list hold the value"], "is 21 tokens"),
        (["--answer", "methodically"], "answer 'methodically' is not one token after the prompt"),
        (["--wrong", "method"], "answer and wrong are the same token ' method'"),
    ],
)
def test_a_pair_that_cannot_be_patched_is_one_line(cli, change, message):
    code, out, err = cli("patch", *replaced(ARGS, *change))
    assert code == 2 and out == ""
    assert err.startswith("attnscope: error: the pair given: ") and message in err and err.count("\n") == 1


def test_a_file_of_pairs_with_a_line_missing_a_field_is_one_line(cli, tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(PAIR) + "\n" + json.dumps({"clean": "a", "corrupt": "b", "answer": "c"}) + "\n")
    code, out, err = cli("patch", "--model", "demo", "--file", path)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"attnscope: error: {path}:2: expected an object") and "'wrong' missing" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--clean", "a", "--corrupt", "b", "--answer", "c"], "wrong (--wrong): a pair needs clean, corrupt"),
        ([*ARGS[2:], "--file", "pairs.jsonl"], "and file (--clean, --corrupt, --answer, --wrong, --file): give one"),
    ],
)
def test_a_pair_half_given_is_one_line_before_any_model_loads(cli, args, message):
    code, out, err = cli("patch", "--model", "no-such-model", *args)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_an_encoder_is_one_line(cli, tiny_bert_dir):
    code, out, err = cli("patch", "--model", tiny_bert_dir, *ARGS[2:])
    assert code == 2 and out == ""
    assert err == (
        "attnscope: error: patch reads the logits of the token that follows each prompt: it needs a decoder (a "
        "causal language model); this model is an encoder\n"
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (["--clean", REPEATED.format("method") + " "], "remove the white space that ends the prompt"),
        (["--answer", "🙂"], "is tokenized as 4 pieces of its bytes (ids "),
    ],
)
def test_an_answer_that_is_not_one_token_says_why_in_words_that_help(cli, change, message):
    """A prompt ending in a space made ` method`, one token, "not one token"; an emoji's pieces printed as '�'."""
    args = replaced(ARGS, *change)
    if change[0] == "--clean":
        args = replaced(args, "--corrupt", PAIR["corrupt"] + " ")
    code, out, err = cli("patch", *args)
    assert code == 2 and out == "" and message in err and "\ufffd" not in err and err.count("\n") == 1


def test_pairs_that_cancel_are_told_so(cli, tmp_path):
    """Two pairs whose corruptions move the logit difference by the same amount in opposite ways: not 'the same'."""
    swapped = {**PAIR, "clean": PAIR["corrupt"], "corrupt": PAIR["clean"]}
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(PAIR) + "\n" + json.dumps(swapped) + "\n")
    code, out, err = cli("patch", "--model", "demo", "--file", path)
    assert code == 2 and "in opposite directions, and they cancel" in err and err.count("\n") == 1
