"""`heads`, `info` and the CLI's shared surface end to end, through the real CLI on tiny random-weight models of
every kind loaded by path; numbers are checked against the from-scratch attention of the same weights."""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import sys

import pytest
import torch

from attnscope.pipeline.inputs import Text
from attnscope.pipeline.probe import probe_windows
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from attnscope.scores import catalog, roles
from attnscope.scores.rows import head_scores
from tests.support import CAT, png_size, reference_maps

PROBE_NOTE = "the probes (repeated tokens, needle) measure left-to-right copying; skipped for encoder models"
SPECIAL_TOKENS = {"decoder": 1, "encoder": 2}  # BOS; [CLS] and [SEP]
MODEL_TYPE = {"decoder": "gpt2", "encoder": "bert"}
CONTEXT = {"decoder": 128, "encoder": 64}  # n_positions / max_position_embeddings of tests.support's builders
COMMANDS = (
    "heads", "show", "diversity", "random-mha", "attend", "ablate", "circuit", "report", "compare", "bench", "info",
    "kvplan",
)  # fmt: skip
UNMEASURED = {  # per kind, the catalog's scores that stay null even with the probe on (the other kind's own)
    "decoder": {"next_token", "last_token"},
    "encoder": {"induction", "duplicate_token", "retrieval"},
}


def _reference_batch(model, texts):
    windows = tokenize(model, [Text(text, "argument") for text in texts]).windows
    return next(batches(windows, len(windows), model.device, pad_id(model.tokenizer)))


def _heads(cli, *args):
    code, out, err = cli("heads", *args, "--json")
    assert code == 0, err
    return json.loads(out)


# ------------------------------------------------------------------------------------------------------- heads


def test_heads_json_scores_equal_the_from_scratch_attention(cli, model, model_dir, kind):
    code, out, err = cli("heads", CAT, "--model", model_dir, "--device", "cpu", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["command"] == "heads"
    facts = doc["model"]
    assert (facts["kind"], facts["model_type"]) == (kind, MODEL_TYPE[kind])
    assert (facts["n_layer"], facts["n_head"], facts["d_head"]) == (2, 4, 8)
    # 11 text tokens, the special tokens around them; scored: the 11 rows after BOS / between [CLS] and [SEP]
    assert doc["input"]["n_tokens"] == 11 + SPECIAL_TOKENS[kind]
    assert doc["input"]["bos"] is True and doc["input"]["scored_rows"] == 11
    assert [h["label"] for h in doc["heads"]] == [f"{layer}.{head}" for layer in range(2) for head in range(4)]
    kind_roles = {role.name for role in catalog.roles_for(kind)}
    assert set(doc["settings"]["thresholds"]) == kind_roles - {"mixed"}
    if kind == "encoder":
        assert PROBE_NOTE in doc["notes"] and PROBE_NOTE in err and "probe" not in doc["input"]
    else:
        assert doc["notes"] == [] and err == "" and doc["input"]["probe"]["period"] == 50
    batch = _reference_batch(model, [CAT])
    reference = reference_maps(model, batch)
    for record in doc["heads"]:
        expected = head_scores(model.kind, reference[record["layer"]], batch.lengths)
        # the scores not measured on every row close the record, in the catalog's order: the encoder's own, then
        # the repeated-token probe's, then the needle probe's
        assert list(record)[-5:] == ["next_token", "last_token", "induction", "duplicate_token", "retrieval"]
        for name in catalog.SCORE_NAMES:
            if name in UNMEASURED[kind]:
                assert record[name] is None, (record["label"], name)
            elif name in expected:
                value = float(expected[name][record["head"]])
                assert record[name] == pytest.approx(value, abs=2e-6), (record["label"], name)
            else:  # a probe score of a decoder: see the probe test below
                assert isinstance(record[name], float)
        assert record["role"] in kind_roles
        assert record["role"] == roles.classify(record).role
        assert record["role_score"] == record[record["role_metric"]]


def test_probe_scores_equal_the_from_scratch_attention_on_the_probe(cli, tiny, tiny_model_dir):
    doc = _heads(cli, CAT, "-m", tiny_model_dir, "--probe-len", "10", "--probe-seed", "5")
    assert doc["input"]["probe"] == {"period": 10, "sequences": 4, "seed": 5, "scored_rows": 40}
    windows = probe_windows(tiny.tokenizer, 10, tiny.n_ctx, seed=5)
    batch = next(batches(windows, len(windows), tiny.device))
    reference = reference_maps(tiny, batch)
    queries = torch.arange(11, 21)  # BOS, copy 1 at 1..10, copy 2 at 11..20
    for record in doc["heads"]:
        maps = reference[record["layer"]][:, record["head"]]  # (4, 21, 21)
        induction = maps[:, queries, queries - 9].mean()
        duplicate = maps[:, queries, queries - 10].mean()
        assert record["induction"] == pytest.approx(float(induction), abs=2e-6)
        assert record["duplicate_token"] == pytest.approx(float(duplicate), abs=2e-6)


def test_no_probe_leaves_its_scores_null(cli, tiny_model_dir):
    doc = _heads(cli, CAT, "-m", tiny_model_dir, "--no-probe")
    assert "probe" not in doc["input"] and doc["settings"]["probe"] is False
    assert "needle" not in doc["input"]  # --no-probe switches both probes off
    assert all(h["induction"] is None and h["duplicate_token"] is None and h["retrieval"] is None for h in doc["heads"])
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir, "--no-probe", "--sort", "induction")
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line == "attnscope: error: sort by induction: that score comes from the probe, which is off"


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
@pytest.mark.usefixtures("fresh_loads")
def test_json_is_byte_identical_across_runs(cli, model_dir):
    first = cli("heads", "--model", model_dir, "--json")
    second = cli("heads", "--model", model_dir, "--json")
    assert first[0] == 0 and first[1] == second[1]
    doc = json.loads(first[1])
    assert doc["input"]["n_texts"] >= 5  # no text given: the bundled samples
    assert all(source.startswith("sample:") for source in doc["input"]["sources"])


def _same_value(cell: str, value) -> bool:
    if value is None:
        return cell == ""
    if isinstance(value, float):
        return float(cell) == pytest.approx(value, abs=1e-12)
    return cell == str(value)


def test_csv_rows_equal_json_records(cli, model_dir, kind):
    records = _heads(cli, CAT, "--model", model_dir)["heads"]
    code, out, _ = cli("heads", CAT, "--model", model_dir, "--csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == len(records) == 8
    assert list(rows[0]) == list(records[0])  # the same columns, in the same order
    for row, record in zip(rows, records, strict=True):
        for key, value in record.items():
            assert _same_value(row[key], value), (record["label"], key, row[key], value)
    unmeasured = sorted(UNMEASURED[kind])[0]
    assert all(row[unmeasured] == "" for row in rows)  # null is an empty cell


KIND_SCORE = {"decoder": "induction", "encoder": "last_token"}  # a score only that kind measures


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("score", ["previous_token", "kind's own"])
def test_sort_top_and_layer_pick_the_rows(cli, model_dir, kind, score):
    name = KIND_SCORE[kind] if score == "kind's own" else score
    everything = _heads(cli, CAT, "-m", model_dir)["heads"]
    doc = _heads(cli, CAT, "-m", model_dir, "--layer", "1", "--sort", name, "--top", "2")
    assert (doc["settings"]["layer"], doc["settings"]["sort"], doc["settings"]["top"]) == (1, name, 2)
    best = sorted((h for h in everything if h["layer"] == 1), key=lambda h: -h[name])[:2]
    assert [h["label"] for h in doc["heads"]] == [h["label"] for h in best]
    assert doc["heads"] == best  # the same records, only fewer


def test_table_output(cli, model_dir, kind):
    code, out, err = cli("heads", CAT, "-m", model_dir)
    assert code == 0, err
    assert out.startswith(f"Head roles: {model_dir}  (1 text, ")  # one text, not "1 texts"
    lines = out.splitlines()
    stripped = [line.strip() for line in lines]
    legend = " ".join(stripped[stripped.index("rows: layers, columns: heads (from 0)") + 1 : stripped.index("Heads")])
    legend = legend.split()
    for role in catalog.ROLES:  # the legend names the roles this kind of model can be given, and only those
        assert (role.name in legend) == (role in catalog.roles_for(kind)), role.name
        assert legend.count(role.name) <= 1  # no "self=self"
    assert max(len(line) for line in out.splitlines()) <= 80  # fits a plain terminal
    records = _heads(cli, CAT, "-m", model_dir)["heads"]
    lines = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0][:1].isdigit()}
    for record in records:  # every head has its row, with its numbers rounded as shown
        line = lines[record["label"]]
        assert record["role"] in line.split()
        assert f"{record['previous_token']:.2f}" in line and f"{record['confidence']:.2f}" in line


@pytest.mark.slow
def test_out_writes_tables_and_pictures(cli, model_dir, kind, tmp_path):
    out_dir = tmp_path / "results" / "run1"  # parents are created
    code, out, err = cli("heads", CAT, "-m", model_dir, "--out", out_dir, "--plot", "1.2", "--plot", "0.0", "--json")
    assert code == 0, err
    measured = [s.name for s in catalog.scores_for(kind) if s.per_head]
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(
        ["heads.json", "heads.csv", "role_map.png", "attention_1.2.png", "attention_0.0.png"]
        + [f"score_{name}.png" for name in measured]
    )  # and no temporary files left behind
    assert json.loads((out_dir / "heads.json").read_text()) == json.loads(out)
    assert len(list(csv.DictReader((out_dir / "heads.csv").open()))) == 8
    assert f"note: wrote {5 + len(measured)} files to {out_dir}" in err.splitlines()  # without -q
    # sizes in pixels, at 150 dpi: grid = 0.6 in per head + 3.1 in margins, 0.44 in per layer + 0.3 in + 1.5 in;
    # attention = max(4, 0.16 in per token) + 2.9 in wide, + 2.5 in high
    assert png_size(out_dir / "role_map.png") == (825, 402)
    assert png_size(out_dir / "score_entropy.png") == (825, 402)
    assert png_size(out_dir / "attention_1.2.png") == (1035, 975)
    assert oct((out_dir / "heads.json").stat().st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode


@pytest.mark.slow
def test_out_of_a_selection_still_holds_every_head(cli, tiny_model_dir, tmp_path):
    """--sort/--top/--layer pick the rows printed; the files of --out always hold every head."""
    args = ("heads", CAT, "-m", tiny_model_dir, "--no-probe", "--sort", "self", "--top", "1", "--out", tmp_path)
    code, out, err = cli(*args, "--json", "-q")
    assert code == 0 and err == ""  # -q: not even where the files went
    assert len(json.loads(out)["heads"]) == 1
    written = json.loads((tmp_path / "heads.json").read_text())
    assert len(written["heads"]) == 8 and (written["settings"]["sort"], written["settings"]["top"]) == (None, None)
    assert len(list(csv.DictReader((tmp_path / "heads.csv").open()))) == 8


def test_file_input_batched(cli, model, model_dir, tmp_path):
    texts = [CAT, "Hello world", "One two three four five"]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in texts))
    doc = _heads(cli, "--file", corpus, "-m", model_dir, "--batch-size", "2", "--no-probe")
    # one scored row per text token: after BOS, or between [CLS] and [SEP]
    text_tokens = [len(model.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
    assert doc["input"]["n_texts"] == 3 and doc["input"]["scored_rows"] == sum(text_tokens)
    assert doc["input"]["sources"] == [f"{corpus}#0", f"{corpus}#1", f"{corpus}#2"]


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_long_text_is_split_into_windows(cli, short_context_model_dir):
    text = " ".join(["word"] * 40)  # 40 tokens; 15 + BOS per window of 16
    code, out, err = cli("heads", text, "-m", short_context_model_dir, "--json", "--no-probe")
    assert code == 0
    doc = json.loads(out)
    assert doc["input"]["n_windows"] == 3 and doc["input"]["n_texts"] == 1
    assert doc["input"]["scored_rows"] == 40  # every window's first row (BOS) is not scored
    assert err.count("split") == 1 and any("split" in note for note in doc["notes"])


def test_stdin_and_thresholds_through_the_cli(cli, model_dir, kind, monkeypatch):
    def stdin():
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{CAT}\n\nHello world again".encode())))

    stdin()
    doc = _heads(cli, "-", "-m", model_dir, "--no-probe")
    assert doc["input"]["sources"] == ["stdin#0", "stdin#1"] and doc["input"]["n_texts"] == 2
    # a mixed head shows the score closest to its threshold: lowering that threshold below the score gives the head
    # that role, and every head gets what the rules say for the new thresholds
    head = next(h for h in doc["heads"] if h["role"] == "mixed")
    role = next(role.name for role in catalog.ROLES if role.score == head["role_metric"])
    lowered = round(head["role_score"] - 0.01, 6)
    stdin()
    moved = _heads(cli, "-", "-m", model_dir, "--no-probe", "--threshold", f"{role}={lowered}")
    thresholds = {**catalog.DEFAULT_THRESHOLDS, role: lowered}
    assert moved["settings"]["thresholds"][role] == lowered
    assert next(h for h in moved["heads"] if h["label"] == head["label"])["role"] == role
    assert all(h["role"] == roles.classify(h, thresholds).role for h in moved["heads"])


# -------------------------------------------------------------------------------------------------- --sort names


@pytest.mark.parametrize("header, name", [("prev", "previous_token"), ("Hnorm", "entropy_normalized")])
def test_sort_takes_the_column_headers(cli, tiny_model_dir, header, name):
    by_header = _heads(cli, CAT, "-m", tiny_model_dir, "--no-probe", "--sort", header)
    by_name = _heads(cli, CAT, "-m", tiny_model_dir, "--no-probe", "--sort", name)
    assert by_header["settings"]["sort"] == by_name["settings"]["sort"] == name  # stored under the canonical name
    assert by_header["heads"] == by_name["heads"]
    values = [h[name] for h in by_header["heads"]]
    assert values == sorted(values, reverse=True) and len(set(values)) == 8  # a real order, not the default one


# -------------------------------------------------------------------------------------------------------- show


@pytest.mark.slow
def test_show_layer_grid_and_single_head(cli, model_dir, tmp_path):
    code, out, err = cli("show", CAT, "--layer", "1", "-m", model_dir, "--out", tmp_path)
    assert code == 0, err
    assert out == f"{tmp_path / 'attention_L1.png'}\n"  # the path of the picture, and nothing else
    # 2 × 2 panels of min(max(2.5, 0.6 + 0.1 × 12 or 13 tokens), 5) = 2.5 in, + 0.2 in between, + 1.1 in and 1.3 in
    # of margins across; + 0.36 in between, + 0.8 + 0.36 in and 1.36 in down; at 150 dpi
    assert png_size(tmp_path / "attention_L1.png") == (1140, 1182)
    code, out, _ = cli("show", CAT, "--head", "1.3", "-m", model_dir, "--out", tmp_path)
    assert code == 0 and out == f"{tmp_path / 'attention_1.3.png'}\n"
    assert png_size(tmp_path / "attention_1.3.png") == (1035, 975)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention_1.3.png", "attention_L1.png"]


@pytest.mark.slow
def test_show_without_out_draws_into_the_current_folder(cli, model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("show", CAT, "--head", "0.2", "-m", model_dir, "-q")
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir()] == ["attention_0.2.png"]
    assert (tmp_path / out.strip()).resolve() == (tmp_path / "attention_0.2.png").resolve()
    png_size(tmp_path / "attention_0.2.png")


# float32 attention computed two ways differs by up to 1e-6; the JSON and CSV round to 6 decimals (5e-7 more)
MAP_TOLERANCE = 1e-6 + 5e-7


def _first_window_reference(model, text=CAT):
    batch = _reference_batch(model, [text])
    return {layer: maps[0] for layer, maps in reference_maps(model, batch).items()}  # layer -> (H, n, n)


def test_show_json_prints_the_maps_and_writes_nothing(cli, model, model_dir, kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("show", CAT, "--layer", "1", "-m", model_dir, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "show" and doc["settings"]["layer"] == 1 and doc["heads"] == [0, 1, 2, 3]
    assert doc["input"]["n_tokens"] == len(doc["input"]["tokens"]) == 11 + SPECIAL_TOKENS[kind]
    expected = _first_window_reference(model)[1]
    maps = torch.tensor(doc["maps"], dtype=torch.float64)  # (H, n, n)
    assert maps.shape == expected.shape
    assert torch.allclose(maps, expected.double(), atol=MAP_TOLERANCE, rtol=0)
    code, out, _ = cli("show", CAT, "--head", "0.2", "-m", model_dir, "--json")
    one = json.loads(out)
    assert one["heads"] == [2] and one["settings"]["head"] == 2
    single = torch.tensor(one["maps"], dtype=torch.float64)[0]
    assert torch.allclose(single, _first_window_reference(model)[0][2].double(), atol=MAP_TOLERANCE, rtol=0)
    assert list(tmp_path.iterdir()) == []  # no picture without --out


def test_show_csv_has_a_row_per_weight_a_query_sees(cli, model, model_dir, kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("show", CAT, "--head", "1.1", "-m", model_dir, "--csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0])[:4] == ["layer", "head", "query", "key"]
    n = 11 + SPECIAL_TOKENS[kind]
    pairs = [(int(row["query"]), int(row["key"])) for row in rows]
    if kind == "decoder":  # a decoder's query sees itself and the keys before it, no key after it
        assert pairs == [(i, j) for i in range(n) for j in range(i + 1)]
    else:
        assert pairs == [(i, j) for i in range(n) for j in range(n)]
    expected = _first_window_reference(model)[1][1]
    for row, (i, j) in zip(rows, pairs, strict=True):
        assert (row["layer"], row["head"]) == ("1", "1")
        assert float(row["weight"]) == pytest.approx(float(expected[i, j]), abs=MAP_TOLERANCE)
    tokens = {int(row["query"]): row["query_token"] for row in rows}
    assert all(tokens[int(row["key"])] == row["key_token"] for row in rows)
    assert list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------------------------------------------- info


def test_info(cli, model, model_dir, kind):
    code, out, _ = cli("info", "-m", model_dir, "--json")
    assert code == 0
    doc = json.loads(out)
    facts = doc["model"]
    d = 32
    assert facts["kind"] == kind and facts["model_type"] == MODEL_TYPE[kind]
    assert facts["attention_params"] == 4 * d * d + 4 * d  # W_Q, W_K, W_V, W_O and their biases
    assert (facts["n_layer"], facts["n_head"], facts["d_model"], facts["d_head"]) == (2, 4, 32, 8)
    assert facts["n_ctx"] == CONTEXT[kind]
    assert facts["n_params"] == sum(p.numel() for p in model.model.parameters())
    assert facts["vocab_size"] == len(model.tokenizer)
    assert facts["device"] == ("cuda" if torch.cuda.is_available() else "cpu") and facts["dtype"] == "float32"
    code, out, _ = cli("info", "-m", model_dir, "--dtype", "bfloat16")
    assert code == 0 and "bfloat16" in out and "(W_Q, W_K, W_V, W_O and any biases)" in out


def test_info_csv_is_one_header_and_one_row(cli, model_dir, kind):
    code, out, _ = cli("info", "-m", model_dir, "--device", "cpu", "--csv")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2
    (row,) = csv.DictReader(io.StringIO(out))
    assert row["kind"] == kind and row["model_type"] == MODEL_TYPE[kind] and row["name"] == str(model_dir)
    assert (row["n_layer"], row["n_head"], row["d_model"], row["n_ctx"]) == ("2", "4", "32", str(CONTEXT[kind]))
    assert row["attention_params"] == row["attention_params_formula"] == str(4 * 32 * 32 + 4 * 32)


# ------------------------------------------------------------------------------------- version, help, choices


def test_version(cli):
    code, out, err = cli("--version")
    assert code == 0 and err == ""
    assert out == f"attnscope {importlib.metadata.version('attnscope')}\n"  # the installed distribution's version


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_every_command_is_listed_and_takes_the_output_options(cli):
    code, out, _ = cli("--help")
    assert code == 0
    assert all(command in out for command in COMMANDS)
    from attnscope.settings.declare import TOP_HELP

    ranked = []
    for command in COMMANDS:
        code, out, err = cli(command, "--help")
        assert code == 0 and err == "", command
        for option in ("--json", "--csv", "--out", "--quiet"):
            assert option in out, (command, option)
        if "--top" in out:  # one meaning, said the same way: the rows of each ranked table
            ranked.append(command)
            assert " ".join(TOP_HELP.split()) in " ".join(out.replace("│", " ").split()), command
    assert ranked == ["heads", "diversity", "attend", "ablate", "circuit", "compare"]


@pytest.mark.parametrize(
    "command, choices",
    [
        ("heads", "auto|float32|float16|bfloat16"),  # --dtype
        ("info", "auto|float32|float16|bfloat16"),
        ("ablate", "loss|gradient"),  # --method
        ("circuit", "removal|gradient"),
    ],
)
def test_choices_appear_in_help(cli, command, choices):
    code, out, _ = cli(command, "--help")
    assert code == 0 and choices in out


def test_bare_command_prints_help(cli):
    code, out, err = cli()
    assert code == 0 and "Usage:" in out + err and all(command in out + err for command in COMMANDS)
