"""`kvplan` end to end on the demo model: the files of --out (DuoAttention's plan read back as its loader reads it,
its config, kvplan.json, the picture), the terminal's table and memory line, --json byte for byte the API's and the
same twice, --csv; every mistake is one line on stderr and exit status 2, before any model loads where it can be."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from scipy.stats import binomtest

import attnscope
from tests.support import CAT, png_size

ARGS = ["--model", "demo", "--sink", "16", "--recent", "64"]


def test_out_writes_duoattentions_files_the_json_and_the_picture(cli, tmp_path):
    code, out, err = cli("kvplan", *ARGS, "--streaming", "0.25", "--out", tmp_path / "plan")
    assert code == 0, err
    folder = tmp_path / "plan"
    names = sorted(path.name for path in folder.iterdir())
    assert names == "config.json full_attention_heads.tsv head_score.json kvplan.csv kvplan.json kvplan.png".split()
    document = json.loads((folder / "kvplan.json").read_text())
    pattern = np.clip(np.loadtxt(folder / "full_attention_heads.tsv", dtype=float, delimiter="\t"), 0, 1)
    assert pattern.shape == (2, 4)  # the demo's layers × KV heads
    assert pattern.tolist() == [[float(head["full"]) for head in document["heads"][4 * k : 4 * k + 4]] for k in (0, 1)]
    assert pattern.sum() == 8 - 2  # floor(0.25 × 8) stream
    head_score = json.loads((folder / "head_score.json").read_text())  # Retrieval Head's {"layer-head": [score]}
    assert head_score == {f"{q['layer']}-{q['head']}": [q["score"]] for q in document["query_heads"]}
    assert list(head_score)[:5] == ["0-0", "0-1", "0-2", "0-3", "1-0"]
    config = json.loads((folder / "config.json").read_text())
    assert (config["sink_size"], config["recent_size"], config["sparsity"]) == (16, 64, 0.25)
    streamed = sorted(head["score"] for head in document["heads"] if not head["full"])
    assert streamed == sorted(head["score"] for head in document["heads"])[:2]
    probe = document["input"]["probe"]  # 8 passkey prompts of the context's 256 tokens, scored at the answer's rows
    assert document["input"]["n_windows"] == 8 and probe["length"] == 256 and probe["prompts"] == 8
    assert 8 <= document["input"]["scored_rows"] <= 8 * 5  # a five-digit passkey is one to five tokens
    # the memory at 32,768 tokens by hand: 2 layers × 4 KV heads × d_head 32 × 4 bytes, keys and values
    per_position = 2 * 32 * 4
    assert document["memory"]["full_bytes"] == per_position * 8 * 32768 == 64 * 2**20
    assert document["memory"]["plan_bytes"] == per_position * (6 * 32768 + 2 * 80)
    png_size(folder / "kvplan.png")
    assert "KV cache plan: 2 of 8 KV heads streaming (the first 16 + last 64 tokens), 6 full" in out
    assert "KV cache at 32,768 tokens (float32): 64.0 MiB full, 48.0 MiB with this plan (75 %)" in out
    assert "wrote 6 files" in err


def test_json_is_the_apis_and_the_same_twice_and_csv_lists_the_kv_heads(cli):
    code, out, err = cli("kvplan", CAT * 12, *ARGS, "--json")
    assert code == 0, err
    assert cli("kvplan", CAT * 12, *ARGS, "--json")[1] == out
    assert attnscope.kvplan("demo", CAT * 12, sink=16, recent=64).to_json() == out
    document = json.loads(out)
    assert document["command"] == "kvplan" and document["input"]["sources"] == ["argument"]
    code, text, err = cli("kvplan", CAT * 12, *ARGS, "--csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert code == 0 and [row["full"] for row in rows] == [str(head["full"]) for head in document["heads"]]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--streaming", "1.5"], "--streaming 1.5: expected a number from 0 to 1, or 'auto'"),
        (["--streaming", "half"], "--streaming half: expected a number from 0 to 1, or 'auto'"),
        (["--check-lengths", "8"], "--check-lengths 8: must be a whole number from 16 to 100,000"),
        (["--trials", "0"], "--trials 0: must be a whole number from 1 to 10,000"),
        (["--sink", "-1"], "--sink -1: must be a whole number from 0 to 100,000"),
        (["--recent", "0"], "--recent 0: must be a whole number from 1 to 100,000"),
        (["--context", "0"], "--context 0: must be a whole number from 1 to 1,000,000,000"),
    ],
)
def test_a_setting_out_of_its_domain_is_one_line_before_any_model_loads(cli, args, message):
    code, out, err = cli("kvplan", "--model", "no-such-model", *args)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_what_cannot_be_planned_is_one_line(cli, tiny_bert_dir):
    code, out, err = cli("kvplan", "--model", "demo")  # 128 + 256 tokens: more than the demo's context of 256
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("attnscope: error: sink 128 + recent 256 (--sink, --recent) = 384 tokens hold the model's")
    code, out, err = cli("kvplan", CAT, *ARGS)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("attnscope: error: no text is longer than sink + recent (16 + 64 = 80 tokens, --sink and")
    code, out, err = cli("kvplan", "--model", tiny_bert_dir, "--sink", "4", "--recent", "8")
    assert code == 2 and out == ""
    assert err == (
        "attnscope: error: kvplan plans the KV cache a decoder keeps while it generates; this model is an encoder, "
        "which reads its whole text at once and keeps no KV cache\n"
    )


@pytest.mark.slow
def test_check_measures_full_attention_the_plan_and_random_plans_and_auto_picks_a_share(cli, tmp_path):
    """--check on the demo: full attention's passkey accuracy, each share's plan and its three random plans (JSON,
    the table, the picture); --streaming auto measures the curve (0 to 7/8, the uniform-by-layer plan too) and picks
    the largest share whose plan lies within full attention's 95 % interval, and the plan files are that share's."""
    args = [*ARGS, "--check-lengths", "128,192", "--trials", "1"]
    code, out, err = cli("kvplan", *args, "--check", "--json")
    assert code == 0, err
    check = json.loads(out)["check"]
    assert (check["lengths"], check["depths"], check["prompts"]) == ([128, 192], [0.25, 0.5, 0.75], 9)
    assert {task: part["lengths"] for task, part in check["tasks"].items()} == {
        "passkey": [128, 192], "multikey": [192]  # the demo's tokenizer needs more than 128 tokens for 4 keys
    }  # fmt: skip
    assert [share["streaming"] for share in check["shares"]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert [share["kv_heads"] for share in check["shares"]] == [0, 2, 4, 6, 8]
    assert check["shares"][0]["plan"] == check["full"]  # no head streams: full attention itself
    assert all(len(share["random"]) == 3 for share in check["shares"][1:])
    assert check["streaming"] == 0.5 and not check["auto"]
    code, out, err = cli("kvplan", *args, "--streaming", "auto", "--out", tmp_path / "auto")
    assert code == 0, err
    document = json.loads((tmp_path / "auto" / "kvplan.json").read_text())
    auto = document["check"]
    assert (
        auto["auto"] and auto["curve"] and [share["streaming"] for share in auto["shares"]] == [k / 8 for k in range(8)]
    )
    low = binomtest(round(auto["full"] * 9), 9).proportion_ci(method="wilson").low  # scipy: full attention's interval
    within = [share["streaming"] for share in auto["shares"] if share["plan"] >= low - 1e-9]
    assert auto["streaming"] == max(within)
    for share in auto["shares"]:  # the memory by hand: each streaming KV head holds 16 + 64 positions, not 32,768
        streaming = share["kv_heads"]
        assert share["memory"] == pytest.approx(((8 - streaming) * 32768 + streaming * 80) / (8 * 32768), abs=1e-6)
        assert share["uniform"] is not None and len(share["uniform_interval"]) == 2
    streamed = sum(not head["full"] for head in document["heads"])
    assert streamed == int(auto["streaming"] * 8) and document["settings"]["streaming"] == "auto"
    assert "Check: 9 prompts" in out or (tmp_path / "auto" / "kvplan_check.png").exists()
    png_size(tmp_path / "auto" / "kvplan_check.png")
