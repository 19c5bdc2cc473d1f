"""`discover` end to end on the demo model: the JSON (every edge ranked, the curves, the circuit; deterministic, its
baselines those of transformers' own logits), the CSV, --top, the files of --out and their pictures, the Python
function; everything it refuses ends in one line and exit status 2 with nothing written."""

from __future__ import annotations

import csv
import io
import json

import pytest

import attnscope
from attnscope.errors import AttnscopeError
from tests.support import build_family_model, demo_logit_differences, png_size, replaced

REPEATED = "The file and the list hold the value {0}. The file and the list hold the value"
PAIR = {
    "clean": REPEATED.format("method"),
    "corrupt": REPEATED.format("method").replace("value method", "code method"),
    "answer": "method",
    "wrong": "table",
}
ARGS = ["--model", "demo", *(item for key, value in PAIR.items() for item in (f"--{key}", value))]


def test_json_ranks_every_edge_and_holds_the_curves_and_the_circuit(cli):
    code, out, err = cli("discover", *ARGS, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "discover" and (doc["method"], doc["steps"], doc["ablation"]) == ("eap-ig", 5, "corrupt")
    clean, corrupt = demo_logit_differences(PAIR["clean"], PAIR["corrupt"])
    assert doc["clean_logit_diff"] == pytest.approx(clean, abs=1e-4)
    assert doc["corrupt_logit_diff"] == pytest.approx(corrupt, abs=1e-4)
    assert doc["ablated_logit_diff"] == pytest.approx(corrupt, abs=1e-4)  # every edge ablated: the corrupted run
    edges = doc["edges"]
    assert doc["graph"] == {"n_nodes": 12, "n_edges": 110, "grouped": False, "parallel": False}
    assert len(edges) == 110 and set(edges[0]) == {"from", "to", "input", "score", "rank"}
    assert [edge["rank"] for edge in edges] == list(range(1, 111))
    assert [abs(edge["score"]) for edge in edges] == sorted((abs(edge["score"]) for edge in edges), reverse=True)
    assert {edge["input"] for edge in edges} == {"q", "k", "v", None}
    assert {(edge["from"], edge["to"], edge["input"]) for edge in edges} >= {
        ("0.2", "1.0", "k"),
        ("mlp 1", "logits", None),
    }
    curve = doc["faithfulness"]
    assert [row["percent"] for row in curve] == [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100]
    assert [row["edges"] for row in curve] == [0, 0, 0, 1, 2, 5, 11, 22, 55, 110]
    assert curve[-1]["f"] == pytest.approx(1.0, abs=1e-5) and curve[0]["f"] == 0
    assert len(doc["faithfulness_signed"]) == 10 and 0 < doc["cpr"] < 1 and 0 < doc["cmd"] < 1
    circuit = doc["circuit"]
    assert circuit["f"] >= 0.8 and circuit["target"] == 0.8
    chosen = next(row for row in curve if row["percent"] == circuit["percent"])
    assert len(circuit["edges"]) == chosen["kept"] and circuit["f"] == chosen["f"]
    assert {"embed", "0.2", "1.0", "1.3", "logits"} <= set(circuit["nodes"])
    assert cli("discover", *ARGS, "--json")[1] == out  # deterministic


@pytest.mark.slow
def test_csv_top_and_the_files_of_out(cli, tmp_path):
    code, out, err = cli("discover", *ARGS, "--csv", "--top", "4")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [row["rank"] for row in rows] == ["1", "2", "3", "4"]
    assert list(rows[0]) == ["rank", "from", "to", "input", "score", "in_circuit"]
    assert len(json.loads(cli("discover", *ARGS, "--json", "--top", "4")[1])["edges"]) == 4
    code, out, err = cli("discover", *ARGS, "--top", "4", "--out", tmp_path / "found")
    assert code == 0, err
    folder = tmp_path / "found"
    names = ["circuit.png", "discover.csv", "discover.json", "faithfulness.png"]
    assert sorted(path.name for path in folder.iterdir()) == names
    assert len(json.loads((folder / "discover.json").read_text())["edges"]) == 110  # --top cuts no file
    assert len((folder / "discover.csv").read_text().splitlines()) == 111
    png_size(folder / "circuit.png")
    png_size(folder / "faithfulness.png")
    assert "Faithfulness of the circuits of the top edges" in out and "circuit: " in out


@pytest.mark.slow
def test_the_python_function_and_a_model_without_its_head():
    model = attnscope.load("demo", lm_head=True)
    result = attnscope.discover(model, **PAIR, method="eap")
    assert result.settings["method"] == "eap" and len(result.scores) == 110
    assert result.to_json() == result.to_json()
    with pytest.raises(AttnscopeError, match="language-model head"):
        attnscope.discover(attnscope.load("demo", lm_head=False), **PAIR)
    markup = attnscope.discover(
        model, clean="The list holds < and the file holds > and the list holds",
        corrupt="The list holds > and the file holds < and the list holds", answer="<", wrong=">", budgets=[100],
    )._repr_html_()  # fmt: skip
    assert markup.startswith('<div class="attnscope"') and markup.endswith("</div>")
    assert "<script" not in markup and "(&#x27;&lt;&#x27; − &#x27;&gt;&#x27;)" in markup  # the tokens as text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "0"], "--steps 0: must be a whole number from 1 to 1,000"),
        (["--method", "eap", "--steps", "3"], "steps (--steps) are the integral's points of method eap-ig"),
        (["--target", "0"], "--target 0: must be a number from 0.001 to 1"),
        (["--target", "1.5"], "--target 1.5: must be a number from 0.001 to 1"),
        (["--budgets", "0,1"], "a budget is a percentage of the edges, above 0 and at most 100"),
        (["--budgets", "1,150"], "150.0: a budget is a percentage of the edges, above 0 and at most 100"),
        (["--ablation", "zero"], "--ablation zero: use one of corrupt, mean"),
        (["--method", "acdc"], "--method acdc: use one of eap-ig, eap, exact"),
    ],
)
def test_a_setting_out_of_its_domain_is_one_line_before_any_model_loads(cli, tmp_path, args, message):
    code, out, err = cli("discover", "--model", "no-such-model", *ARGS[2:], *args, "--out", tmp_path / "x")
    assert code == 2 and out == "" and message in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_exact_beyond_its_bound_names_the_edges_and_runs(cli, monkeypatch, tmp_path):
    from attnscope.analyses import discover

    monkeypatch.setattr(discover, "EXACT_MAX_EDGES", 100)
    code, out, err = cli("discover", *ARGS, "--method", "exact", "--out", tmp_path / "x")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "method exact patches each of this model's 110 edges alone: 110 runs of each of the 1 batch" in err
    assert "refused above 100 edges: use method eap-ig" in err and not (tmp_path / "x").exists()


def test_pairs_that_cannot_be_used_are_one_line(cli):
    code, out, err = cli("discover", *replaced(ARGS, "--answer", "methodically"))
    assert code == 2 and "answer 'methodically' is not one token after the prompt" in err and err.count("\n") == 1
    code, out, err = cli("discover", *replaced(ARGS, "--corrupt", PAIR["clean"]))
    assert code == 2 and "give the same logit difference" in err and err.count("\n") == 1
    code, out, err = cli("discover", "--model", "demo", "--clean", "a", "--corrupt", "b", "--answer", "c")
    assert code == 2 and "wrong (--wrong): a pair needs clean, corrupt" in err


def test_an_encoder_is_one_line_before_its_weights_load(cli, tiny_bert_dir, monkeypatch):
    from attnscope.models import loading

    monkeypatch.setattr(loading, "load_model", lambda *args, **kwargs: pytest.fail("the weights were loaded"))
    code, out, err = cli("discover", "--model", tiny_bert_dir, *ARGS[2:])
    assert code == 2 and out == ""
    assert err == (
        "attnscope: error: discover reads the logits of the token that follows each prompt: it needs a decoder (a "
        "causal language model); this model is an encoder\n"
    )


@pytest.mark.slow
def test_a_post_norm_decoder_is_one_line(cli, tmp_path):
    folder = build_family_model("opt", tmp_path / "opt350", do_layer_norm_before=False)
    code, out, err = cli("discover", "--model", folder, "--clean", "a b c d", "--corrupt", "a b e d", "--answer", "c",
                         "--wrong", "d")  # fmt: skip
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "normalises the residual stream after each layer (post-norm, as OPT-350m)" in err
