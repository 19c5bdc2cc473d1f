"""Every command end to end through the real CLI on tiny random-weight GPT-2 models loaded by path."""

import csv
import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnscope import metrics, roles
from attnscope.inputs import Text
from attnscope.tokens import batches, tokenize
from tests.test_capture import reference_maps

CAT = "The cat sat on the mat because it was tired."


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header, and proof that the picture decodes and is not blank."""
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert pixels.std() > 0.01, f"{path} is blank"
    return width, height


def test_heads_json_has_every_head_with_scores_and_role(cli, tiny, tiny_model_dir):
    code, out, err = cli("heads", CAT, "--model", tiny_model_dir, "--device", "cpu", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["command"] == "heads"
    assert (doc["model"]["n_layer"], doc["model"]["n_head"], doc["model"]["d_head"]) == (2, 4, 8)
    assert doc["input"]["n_tokens"] == 12 and doc["input"]["bos"] is True and doc["input"]["scored_rows"] == 11
    assert [h["label"] for h in doc["heads"]] == [f"{l}.{h}" for l in range(2) for h in range(4)]
    # independent check: the scores are the metrics of the from-scratch attention of the same model
    windows = tokenize(tiny.tokenizer, [Text(CAT, "argument")], tiny.n_ctx).windows
    batch = next(batches(windows, 1, tiny.device))
    reference = reference_maps(tiny, batch)
    for record in doc["heads"]:
        expected = metrics.head_scores(reference[record["layer"]], batch.lengths)
        for name in metrics.SCORES:
            assert record[name] == pytest.approx(float(expected[name][record["head"]]), abs=2e-6), (record["label"], name)
        assert record["role"] in roles.ROLES
        assert record["role"] == roles.classify(record).role
        assert record["role_score"] == record[record["role_metric"]]


def test_probe_scores_equal_the_from_scratch_attention_on_the_probe(cli, tiny, tiny_model_dir):
    from attnscope.tokens import probe_windows

    code, out, _ = cli("heads", CAT, "-m", tiny_model_dir, "--probe-len", "10", "--probe-seed", "5", "--json")
    assert code == 0
    doc = json.loads(out)
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
    code, out, _ = cli("heads", CAT, "-m", tiny_model_dir, "--no-probe", "--json")
    assert code == 0
    doc = json.loads(out)
    assert "probe" not in doc["input"]
    assert all(h["induction"] is None and h["duplicate_token"] is None for h in doc["heads"])
    code, _, err = cli("heads", CAT, "-m", tiny_model_dir, "--no-probe", "--sort", "induction")
    assert code == 2 and "--no-probe" in err


def test_json_is_byte_identical_across_runs(cli, tiny_model_dir):
    first = cli("heads", "--model", tiny_model_dir, "--json")
    second = cli("heads", "--model", tiny_model_dir, "--json")
    assert first[0] == 0 and first[1] == second[1]
    assert json.loads(first[1])["input"]["n_texts"] >= 5  # no text given: the bundled samples


def test_csv_rows_equal_json_records(cli, tiny_model_dir):
    _, out_json, _ = cli("heads", CAT, "--model", tiny_model_dir, "--json")
    code, out_csv, _ = cli("heads", CAT, "--model", tiny_model_dir, "--csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out_csv)))
    records = json.loads(out_json)["heads"]
    assert len(rows) == len(records) == 8
    for row, record in zip(rows, records):
        assert row["label"] == record["label"] and row["role"] == record["role"]
        assert float(row["previous_token"]) == pytest.approx(record["previous_token"])


def test_filters_sort_and_top(cli, tiny_model_dir):
    code, out, _ = cli("heads", CAT, "-m", tiny_model_dir, "--layer", "1", "--sort", "previous_token", "--top", "2", "--json")
    assert code == 0
    heads = json.loads(out)["heads"]
    assert len(heads) == 2 and all(h["layer"] == 1 for h in heads)
    _, everything, _ = cli("heads", CAT, "-m", tiny_model_dir, "--layer", "1", "--json")
    best = sorted(json.loads(everything)["heads"], key=lambda h: -h["previous_token"])[:2]
    assert [h["label"] for h in heads] == [h["label"] for h in best]


def test_table_output(cli, tiny_model_dir):
    code, out, _ = cli("heads", CAT, "-m", tiny_model_dir)
    assert code == 0
    assert "Head roles" in out and "1.3" in out and "prev=previous-token" in out
    assert max(len(line) for line in out.splitlines()) <= 80  # fits a plain terminal


def test_out_writes_tables_and_pictures(cli, tiny_model_dir, tmp_path):
    out_dir = tmp_path / "results" / "run1"  # parents are created
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir, "--out", out_dir, "--plot", "1.2", "--plot", "0.0", "--json")
    assert code == 0, err
    names = sorted(p.name for p in out_dir.iterdir())
    scores = ["confidence", "entropy", "entropy_normalized", "first_token", "local", "local_lift", "previous_token", "self",
              "induction", "duplicate_token"]
    assert names == sorted(
        ["heads.json", "heads.csv", "role_map.png", "attention_1.2.png", "attention_0.0.png"] + [f"score_{s}.png" for s in scores]
    )  # and no temporary files left behind
    assert json.loads((out_dir / "heads.json").read_text()) == json.loads(out)
    assert len(list(csv.DictReader((out_dir / "heads.csv").open()))) == 8
    # sizes in pixels, at 100 dpi (plots.py): grid = 0.6 in per head + 3.1 in margins, 0.45 in per layer + 1.6 in;
    # attention = max(4, 0.22 in per token) + 2.7 in wide, + 2.0 in high
    assert png_size(out_dir / "role_map.png") == (550, 250)
    assert png_size(out_dir / "score_entropy.png") == (550, 250)
    assert png_size(out_dir / "attention_1.2.png") == (670, 600)
    assert oct((out_dir / "heads.json").stat().st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode


def test_file_input_batched(cli, tiny_model_dir, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in [CAT, "Hello world", "One two three four five"]) + "\n")
    code, out, _ = cli("heads", "--file", corpus, "-m", tiny_model_dir, "--batch-size", "2", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["input"]["n_texts"] == 3 and doc["input"]["scored_rows"] == 11 + 2 + 5


def test_long_text_is_split_into_windows(cli, short_context_model_dir):
    text = " ".join(["word"] * 40)
    code, out, err = cli("heads", text, "-m", short_context_model_dir, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["input"]["n_windows"] == 3 and doc["input"]["n_texts"] == 1
    assert err.count("split") == 1 and doc["notes"]


def test_show_layer_grid_and_single_head(cli, tiny_model_dir, tmp_path):
    code, out, err = cli("show", CAT, "--layer", "1", "-m", tiny_model_dir, "--out", tmp_path)
    assert code == 0, err
    grid = Path(out.strip())
    assert grid == tmp_path / "attention_L1.png"
    # 2 × 2 panels of min(max(2.5, 0.6 + 0.12 × 12), 8) = 2.5 in, + 0.5 in and 0.6 in
    assert png_size(grid) == (550, 560)
    code, out, _ = cli("show", CAT, "--layer", "1", "--head", "3", "-m", tiny_model_dir, "--out", tmp_path)
    assert code == 0 and Path(out.strip()) == tmp_path / "attention_1.3.png"
    assert png_size(tmp_path / "attention_1.3.png") == (670, 600)


def test_info(cli, tiny_model_dir):
    code, out, _ = cli("info", "-m", tiny_model_dir, "--json")
    assert code == 0
    model = json.loads(out)["model"]
    d = 32
    assert model["attention_params"] == 4 * d * d + 4 * d  # W_Q, W_K, W_V, W_O and their biases
    assert (model["n_layer"], model["n_head"], model["d_model"], model["d_head"], model["n_ctx"]) == (2, 4, 32, 8, 128)
    assert model["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu") and model["dtype"] == "float32"
    code, out, _ = cli("info", "-m", tiny_model_dir, "--dtype", "bfloat16")
    assert code == 0 and "bfloat16" in out and "matches" in out


@pytest.fixture(scope="module")
def pickle_only_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2Model

    folder = tmp_path_factory.mktemp("pickle-only")
    model = GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=100))
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")  # the old pickle format (transformers v5 writes none)
    assert (folder / "pytorch_model.bin").exists() and not list(folder.glob("*.safetensors"))
    return folder


def bad_inputs(tiny_model_dir, pickle_only_dir, tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    m = ["-m", str(tiny_model_dir)]
    cases = {
        "empty text": (["heads", "", *m], "no text"),
        "whitespace text": (["heads", "  \n ", *m], "no text"),
        "missing file": (["heads", "--file", tmp_path / "nope.txt", *m], "no such file"),
        "non-UTF-8 file": (["heads", "--file", latin, *m], "not UTF-8"),
        "unknown model path": (["heads", CAT, "-m", tmp_path / "no-model"], "no such model directory"),
        "model path ending in /": (["info", "-m", "no-such-model-dir/"], "no such model directory"),
        "pickle checkpoint": (["heads", CAT, "-m", pickle_only_dir], "pickle"),
        "hub id offline": (["info", "-m", "gpt2"], "not in the local Hugging Face cache"),
        "layer out of range": (["heads", CAT, *m, "--layer", "2"], "out of range"),
        "show layer out of range": (["show", CAT, *m, "--layer", "7", "--out", tmp_path], "out of range"),
        "show head out of range": (["show", CAT, *m, "--layer", "1", "--head", "4", "--out", tmp_path], "out of range"),
        "plot out of range": (["heads", CAT, *m, "--plot", "99.0", "--out", tmp_path / "plots"], "out of range"),
        "plot malformed": (["heads", CAT, *m, "--plot", "4-11", "--out", tmp_path / "plots"], "LAYER.HEAD"),
        "unwritable out": (["heads", CAT, *m, "--out", a_file / "sub"], "cannot write"),
        "bad threshold": (["heads", CAT, *m, "--threshold", "previous=2"], "threshold"),
        "bad sort": (["heads", CAT, *m, "--sort", "beauty"], "--sort"),
        "json and csv": (["heads", CAT, *m, "--json", "--csv"], "not both"),
        "not a number": (["heads", CAT, *m, "--top", "many"], "--top"),
        "unknown option": (["heads", CAT, *m, "--colour"], "--colour"),
        "bad device": (["info", *m, "--device", "tpu"], "unknown device"),
        "bad dtype": (["info", *m, "--dtype", "float8"], "unknown dtype"),
        "probe too long": (["heads", CAT, *m, "--probe-len", "100"], "context"),
    }
    if not torch.cuda.is_available():
        cases["cuda without CUDA"] = (["heads", CAT, *m, "--device", "cuda"], "CUDA is not available")
        cases["cuda:1 without CUDA"] = (["info", *m, "--device", "cuda:1"], "CUDA is not available")
    return cases


def test_bad_input_ends_in_one_line_and_status_2(cli, tiny_model_dir, pickle_only_dir, tmp_path):
    for name, (args, expected) in bad_inputs(tiny_model_dir, pickle_only_dir, tmp_path).items():
        code, out, err = cli(*args)
        assert code == 2, (name, code, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (name, err)
        assert lines[0].startswith("attnscope: error: ") and expected in lines[0], (name, lines[0])
        assert out == "", name
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir() if p.is_file())  # no temporary leftovers


def run_module(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "attnscope", *map(str, args)], capture_output=True, text=True, env=env, timeout=120
    )


def test_python_dash_m_entry_point(tiny_model_dir):
    result = run_module("heads", CAT, "-m", tiny_model_dir, "--json")
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["heads"]) == 8
    assert result.stderr == ""  # no progress bars or load reports on a clean run
    failed = run_module("heads", "", "-m", tiny_model_dir)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr and len(failed.stderr.splitlines()) == 1


def test_help_does_not_import_heavy_libraries():
    code = "import sys, attnscope.cli; print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]"
    helped = run_module("--help")
    assert helped.returncode == 0 and all(name in helped.stdout for name in ("heads", "show", "info", "diversity"))


def test_option_errors_come_before_any_work(cli, tiny_model_dir, tmp_path, monkeypatch):
    """Options that can be checked without the model are checked before it loads (a model that does not exist is
    not even looked for); the probe's before the texts run (the analysis must never start)."""
    from attnscope import analysis

    missing = ["-m", tmp_path / "no-model"]
    early = {
        "bad sort": (["heads", CAT, *missing, "--sort", "beauty"], "--sort 'beauty'"),
        "top 0": (["heads", CAT, *missing, "--top", "0"], "--top must be at least 1"),
        "plot without out": (["heads", CAT, *missing, "--plot", "0.1"], "give --out"),
    }
    m = ["-m", tiny_model_dir]
    before_the_texts = {
        "probe period 2: induction would be the previous token": (["heads", CAT, *m, "--probe-len", "2"], "at least 3"),
        "probe period 0": (["heads", CAT, *m, "--probe-len", "0"], "at least 3"),
        "probe period too long": (["heads", CAT, *m, "--probe-len", "64"], "BOS + twice the period (129 tokens)"),
        "negative probe seed": (["heads", CAT, *m, "--probe-seed", "-1"], "--probe-seed -1"),
    }

    def no_analysis(*args, **kwargs):
        raise AssertionError("the texts ran before the options were checked")

    monkeypatch.setattr(analysis, "_run_windows", no_analysis)
    for name, (args, expected) in {**early, **before_the_texts}.items():
        code, out, err = cli(*args)
        assert code == 2 and out == "", (name, err)
        assert err.strip().splitlines() == [f"attnscope: error: {err.strip().removeprefix('attnscope: error: ')}"]
        assert expected in err, (name, err)


def test_running_out_of_memory_is_one_line_and_a_bug_is_not_hidden(cli, tiny_model_dir, monkeypatch):
    from attnscope import analysis

    def allocate(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you tried "
                           "to allocate 204800000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(analysis, "_run_windows", allocate)
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("attnscope: error: out of memory") and "--batch-size" in line

    def bug(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(analysis, "_run_windows", bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # a bug keeps its traceback, for the bug report
        cli("heads", CAT, "-m", tiny_model_dir)


@pytest.mark.parametrize("output", [["--json"], []])
def test_a_reader_that_goes_away_ends_the_run_quietly(tiny_model_dir, output):
    """`attnscope heads | head -1`: the pipe closes before attnscope writes; no traceback, no error message."""
    process = subprocess.Popen(
        [sys.executable, "-m", "attnscope", "heads", CAT, "-m", str(tiny_model_dir), *output],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    process.stdout.close()  # the reader is gone before anything is written
    err = process.stderr.read()
    assert process.wait(timeout=120) == 1
    assert err == ""


def test_stdin_and_thresholds_through_the_cli(cli, tiny_model_dir, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{CAT}\n\nHello world again".encode())))
    code, out, _ = cli("heads", "-", "-m", tiny_model_dir, "--no-probe", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["input"]["sources"] == ["stdin#0", "stdin#1"] and doc["input"]["n_texts"] == 2
    # a mixed head shows the score closest to its threshold: lowering that threshold below the score gives the head
    # that role, and every head gets what the rules say for the new thresholds
    head = next(h for h in doc["heads"] if h["role"] == "mixed")
    role = {metric: role for role, metric in roles.RULES.items()}[head["role_metric"]]
    lowered = round(head["role_score"] - 0.01, 6)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{CAT}\n\nHello world again".encode())))
    code, out, _ = cli("heads", "-", "-m", tiny_model_dir, "--no-probe", "--json", "--threshold", f"{role}={lowered}")
    assert code == 0
    thresholds = {**roles.DEFAULT_THRESHOLDS, role: lowered}
    moved = json.loads(out)["heads"]
    assert next(h for h in moved if h["label"] == head["label"])["role"] == role
    assert all(h["role"] == roles.classify(h, thresholds).role for h in moved)
