"""Every mistake a user can make ends in one line, `attnscope: error: ...`, exit status 2, nothing on stdout and
nothing left on disk; what can be checked without the model is checked before it loads, and the probe before any
text runs. A bug is not hidden behind that line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnscope
from tests.support import CAT

DOCTOR_TWICE = "The doctor said that she would help the doctor."
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")

# Placeholders filled in by the test: @decoder / @encoder (the tiny models), @pickle (a pickle-only checkpoint),
# @tmp/... (a path in the test's own folder), @latin1 (a Latin-1 file), @file (a plain file).
D, E = ["-m", "@decoder"], ["-m", "@encoder"]
CASES = {
    # texts
    "empty text": (["heads", "", *D], "the text given (TEXT) holds no text"),
    "whitespace text": (["heads", "  \n ", *D], "the text given (TEXT) holds no text"),
    "missing file": (["heads", "--file", "@tmp/nope.txt", *D], "no such file"),
    "non-UTF-8 file": (["heads", "--file", "@latin1", *D], "is not UTF-8 text"),
    "text and file": (["heads", CAT, "--file", "@file", *D], "texts and file (TEXT, --file): give one or the other"),
    "binary file": (["heads", "--file", "@binary", *D], "looks like a binary file (a NUL byte at byte 6)"),
    "a device": (["heads", "--file", "/dev/zero", *D], "/dev/zero is not a regular file"),
    "lone surrogate in JSON": (["heads", "--file", "@surrogate", *D], 'surrogate.jsonl:1: the "text" field is not'),
    "invalid UTF-8 argument": (["heads", "caf\udce9", *D], "the text given (TEXT) is not valid text: byte 0xe9"),
    "a single token": (["heads", "cat", *D, "--no-bos"], "every text is a single token once tokenized"),
    "a single token after BOS": (["heads", "cat", *D], "every window has one scored row (the longest is 2 tokens"),
    "one token between [CLS] and [SEP]": (["heads", "cat", *E], "and that row's previous token is the window's first"),
    "nothing between [CLS] and [SEP]": (["heads", "cat", *E, "--no-bos"], "no text has a token between"),
    # models
    "unknown model path": (["heads", CAT, "-m", "@tmp/no-model"], "no such model directory"),
    "model path ending in /": (["info", "-m", "no-such-model-dir/"], "no such model directory"),
    "pickle checkpoint": (["heads", CAT, "-m", "@pickle"], "holds only a pickle checkpoint"),
    "hub id offline": (["info", "-m", "gpt2"], "not in the local Hugging Face cache"),
    "bad device": (["info", *D, "--device", "tpu"], "--device tpu: use auto, cpu, cuda or cuda:N"),
    "bad dtype": (["info", *D, "--dtype", "float8"], "--dtype float8: use one of auto, float32, float16, bfloat16"),
    "cuda without CUDA": pytest.param(["heads", CAT, *D, "--device", "cuda"], "CUDA is not available", marks=NO_CUDA),
    "cuda:1 without CUDA": pytest.param(["info", *D, "--device", "cuda:1"], "CUDA is not available", marks=NO_CUDA),
    # heads
    "layer out of range": (["heads", CAT, *D, "--layer", "2"], "layer 2 is out of range (this model has layers 0-1)"),
    "plot out of range": (["heads", CAT, *D, "--plot", "99.0", "--out", "@tmp/plots"], "head '99.0': layer 99"),
    "plot malformed": (["heads", CAT, *D, "--plot", "4-11", "--out", "@tmp/plots"], "expected LAYER.HEAD"),
    "plot without out": (["heads", CAT, *D, "--plot", "0.1"], "--plot draws into the folder of --out"),
    "unwritable out": (["heads", CAT, *D, "--out", "@file/sub"], "cannot write to --out"),
    "out named like a file": (["heads", CAT, *D, "--out", "@tmp/results.json"], "results.json is named like a file"),
    "save into out": (
        ["ablate", CAT, *D, "--remove", "0.1", "--save", "@tmp/m", "--out", "@tmp/m/analysis"],
        "would mix",
    ),
    "a model given twice by two names": (["compare", "-m", "demo", "-m", "@demo"], "is given twice (as 'demo' and "),
    "out named like a page": (["report", *D, "--out", "@tmp/report.html"], "report.html is named like a file (.html)"),
    "empty out": (["heads", CAT, *D, "--out", ""], "--out '': an empty folder name"),
    "blank out": (["show", CAT, *D, "--layer", "0", "--out", " "], "--out ' ': an empty folder name"),
    "threshold of no role": (["heads", CAT, *D, "--threshold", "previous=0.2"], "expected ROLE=VALUE"),
    "threshold above 1": (["heads", CAT, *D, "--threshold", "previous-token=2"], "thresholds lie between 0 and 1"),
    "bad sort": (["heads", CAT, *D, "--sort", "beauty"], "--sort beauty: use one of"),
    "json and csv": (["heads", CAT, *D, "--json", "--csv"], "give --json or --csv, not both"),
    "not a number": (["heads", CAT, *D, "--top", "many"], "--top many: expected a whole number from 1 to 1,000,000"),
    "top 0": (["heads", CAT, *D, "--top", "0"], "--top 0: must be a whole number from 1 to 1,000,000"),
    "window 0": (["heads", CAT, *D, "--window", "0"], "--window 0: must be a whole number from 1 to 100,000"),
    "batch size 0": (["heads", CAT, *D, "--batch-size", "0"], "--batch-size 0: must be a whole number from 1"),
    "unknown option": (["heads", CAT, *D, "--colour"], "No such option: --colour"),
    "an option before the command": (["--model", "@decoder", "heads", CAT], "--model: options go after the command's"),
    "a long option with one dash": (["heads", CAT, *D, "-out", "x"], "-out: an option's long name takes two dashes"),
    "a file given twice": (
        ["heads", *D, "--file", "@file", "--file", "@file"],
        "--file is given 2 times (--file, --file): it takes one",
    ),
    "a short option given twice": (["heads", CAT, *D, "-w", "3", "--window=4"], "--window is given 2 times (-w, "),
    "a switch both ways": (["heads", CAT, *D, "--bos", "--no-bos"], "--bos is given 2 times (--bos, --no-bos)"),
    "probe period 2": (["heads", CAT, *D, "--probe-len", "2"], "--probe-len 2: must be a whole number from 3"),
    "probe too long": (["heads", CAT, *D, "--probe-len", "100"], "must fit the model's context of 128 tokens"),
    "negative probe seed": (["heads", CAT, *D, "--probe-seed", "-1"], "--probe-seed -1: must be a whole number from 0"),
    "sort by a probe score of an encoder": (["heads", CAT, *E, "--sort", "induction"], "measured for decoders only"),
    "sort by an encoder score of a decoder": (["heads", CAT, *D, "--sort", "next"], "measured for encoders only"),
    # show
    "show without a layer": (["show", CAT, *D], "layer or head (--layer L, --head L.H): say what to draw"),
    "show layer out of range": (["show", CAT, *D, "--layer", "7", "--out", "@tmp/x"], "layer 7 is out of range"),
    "show head out of range": (["show", CAT, *D, "--head", "1.4", "--out", "@tmp/x"], "head '1.4': head 4 is out of"),
    "show head of another layer": (["show", CAT, *D, "--layer", "0", "--head", "1.2"], "is in layer 1, not layer 0"),
    "show index out of range": (["show", CAT, *D, "--layer", "0", "--index", "2"], "text index 2 is out of range"),
    # diversity
    "diversity layer out of range": (["diversity", CAT, *E, "--layer", "2"], "layer 2 is out of range"),
    "diversity layer -1": (
        ["diversity", CAT, *D, "--layer", "-1"],
        "--layer -1: expected a layer number (0-based) or 'all'",
    ),
    "diversity layer five": (["diversity", CAT, *D, "--layer", "five"], "or 'all'"),
    "diversity without a layer": (["diversity", CAT, *D], "Missing option '--layer'"),
    "redundant 1.5": (["diversity", CAT, *D, "--layer", "1", "--redundant", "1.5"], "--redundant 1.5: must be a"),
    "redundant -1": (["diversity", CAT, *D, "--layer", "1", "--redundant", "-1"], "--redundant -1: must be a number"),
    "redundant nan": (["diversity", CAT, *D, "--layer", "1", "--redundant", "nan"], "--redundant nan: must be a"),
    "cluster-at 2": (["diversity", CAT, *D, "--layer", "all", "--cluster-at", "2"], "--cluster-at 2: must be a"),
    "diversity top 0": (["diversity", CAT, *D, "--layer", "1", "--top", "0"], "--top 0: must be a whole number"),
    "diversity has no --random-mha": (["diversity", *D, "--layer", "1", "--random-mha"], "No such option"),
    "diversity has no --pairs": (["diversity", CAT, *D, "--layer", "1", "--pairs", "3"], "No such option: --pairs"),
    # random-mha
    "heads not dividing d_model": (["random-mha", "--head-counts", "3"], "head count 3: must divide d_model 64"),
    "heads not a number": (
        ["random-mha", "--head-counts", "two"],
        "--head-counts two: expected comma-separated whole numbers",
    ),
    "heads empty": (["random-mha", "--head-counts", ","], "give at least one number"),
    "heads 0": (["random-mha", "--head-counts", "0"], "--head-counts 0: must be a whole number from 1 to 4,096"),
    "heads negative": (["random-mha", "--head-counts", "-2"], "--head-counts -2: must be a whole number from 1"),
    "d-model 0": (["random-mha", "--d-model", "0"], "--d-model 0: must be a whole number from 1 to 4,096"),
    "seq-len too long": (
        ["random-mha", "--seq-len", "100000000"],
        "--seq-len 100000000: must be a whole number from 2 to 4,096",
    ),
    "attention too large": (["random-mha", "--seq-len", "4096", "--head-counts", "8"], "use fewer heads or tokens"),
    "trials 0": (["random-mha", "--trials", "0"], "--trials 0: must be a whole number from 1 to 10,000"),
    "random-mha takes no text": (["random-mha", "Some text"], "unexpected extra argument"),
    "random-mha takes no layer": (["random-mha", "--layer", "1"], "No such option: --layer"),
    "random-mha takes no model": (["random-mha", *D], "No such option: -m"),
    # attend
    "attend missing token": (["attend", CAT, *E, "--from", "dog"], "from word 'dog' is not in the text"),
    "attend nurse": (["attend", DOCTOR_TWICE, *D, "--from", "nurse"], "its tokens are <bos>@0 The@1 doctor@2 said@3"),
    "attend to a later token": (["attend", DOCTOR_TWICE, *D, "--from", "she", "--to", "would"], "comes after from"),
    "attend occurrence": (
        ["attend", DOCTOR_TWICE, *D, "--from", "doctor", "--from-index", "5"],
        "from occurrence 5: 'doctor' occurs 2 times (doctor@2, doctor@9)",
    ),
    "attend to occurrence": (
        ["attend", DOCTOR_TWICE, *D, "--from", "she", "--to", "doctor", "--to-index", "4"],
        "to occurrence 4: 'doctor' occurs 2 times",
    ),
    "attend to-index without to": (["attend", CAT, *D, "--from", "cat", "--to-index", "0"], "give the to word"),
    "attend top 0": (["attend", CAT, *D, "--from", "cat", "--top", "0"], "--top 0: must be a whole number"),
    "attend tokens 0": (["attend", CAT, *D, "--from", "cat", "--tokens", "0"], "--tokens 0: must be a whole"),
    "attend has no --head-counts": (
        ["attend", CAT, *D, "--from", "cat", "--head-counts", "3"],
        "No such option: --head-counts",
    ),
    "attend index": (["attend", CAT, *D, "--from", "cat", "--index", "3"], "text index 3 is out of range"),
    "attend json and csv": (["attend", CAT, *D, "--from", "cat", "--json", "--csv"], "give --json or --csv, not both"),
    "attend without from": (["attend", CAT, *D], "Missing option '--from'"),
    # ablate
    "ablate method": (["ablate", CAT, *D, "--method", "magic"], "--method magic: use one of loss, gradient"),
    "ablate prune": (["ablate", CAT, *D, "--prune", "100"], "prune 100: this model has 8 heads"),
    "ablate json and csv": (["ablate", CAT, *D, "--json", "--csv"], "give --json or --csv, not both"),
    "ablate nothing to predict": (["ablate", "cat", *D, "--no-bos"], "there is no next token to predict"),
    "ablate nothing to mask": (["ablate", "cat", *E, "--no-bos"], "there is nothing to mask"),
    # circuit
    "circuit head in layer 0": (["circuit", CAT, *D, "--head", "0.1"], "in layer 0, and no head comes before it"),
    "circuit head out of range": (["circuit", CAT, *D, "--head", "1.9"], "head 9 is out of range"),
    "circuit head form": (["circuit", CAT, *D, "--head", "one"], "expected LAYER.HEAD such as 4.11"),
    "circuit method": (["circuit", CAT, *D, "--method", "exact"], "--method exact: use one of removal, gradient"),
    "circuit score the same for every head": (
        ["circuit", CAT, *D, "--score", "local_uniform"],
        "--score local_uniform: local_uniform is the same for every head",
    ),
    "circuit probe score": (
        ["circuit", CAT, *D, "--score", "induction", "--no-probe"],
        "score induction: that score comes from the probe, which is off",
    ),
    # report, info
    "report window 0": (["report", CAT, *D, "--window", "0"], "--window 0: must be a whole number"),
    "report threshold": (["report", CAT, *D, "--threshold", "x=1"], "threshold 'x=1': expected ROLE=VALUE"),
    "report probe too long": (["report", CAT, *D, "--probe-len", "64"], "BOS + twice the period (129 tokens)"),
    "compare score the same for every head": (
        ["compare", CAT, *D, "-m", "demo", "--score", "unif"],
        "--score unif: local_uniform is the same for every head",
    ),
    "report revisions of the demo": (
        ["report", CAT, "-m", "demo", "--revisions", "a,b", "--out", "@tmp/page"],
        "revisions (--revisions) a,b: model 'demo' is the demo model bundled with attnscope, which has no revisions",
    ),
    "info json and csv": (["info", *D, "--json", "--csv"], "give --json or --csv, not both"),
    # bench is written for GPT-2
    "bench is for decoders": (["bench", *E, "--device", "cpu"], "bench times decoders"),
    "bench random weights": (["bench", *E, "--random-weights", "--device", "cpu"], "model type 'bert' is an encoder"),
    "bench batch too large": (
        ["bench", *D, "--batch-sizes", "70000", "--device", "cpu"],
        "--batch-sizes 70000: must be a whole number from 1",
    ),
    "bench length too long": (
        ["bench", *D, "--seq-lens", "200000", "--device", "cpu"],
        "--seq-lens 200000: must be a whole number from 2",
    ),
    "random-mha heads too many": (
        ["random-mha", "--head-counts", "5000"],
        "--head-counts 5000: must be a whole number from 1",
    ),
}


@pytest.fixture(scope="module")
def pickle_only_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2Model

    folder = tmp_path_factory.mktemp("pickle-only")
    model = GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=100, bos_token_id=0, eos_token_id=0))
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")  # the old pickle format (transformers v5 writes none)
    assert (folder / "pytorch_model.bin").exists() and not list(folder.glob("*.safetensors"))
    return folder


@pytest.fixture
def fill(model_dirs, pickle_only_dir, tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    places = {"@decoder": model_dirs["decoder"], "@encoder": model_dirs["encoder"], "@pickle": pickle_only_dir}
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"GIF89a\x00\x01")
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"text": "a \\ud800 b"}\n', encoding="utf-8")
    places |= {"@latin1": latin, "@file": a_file, "@tmp": tmp_path, "@binary": binary, "@surrogate": surrogate}
    places["@demo"] = Path(attnscope.__file__).parent / "demo_model"  # the bundled demo's own folder

    def filled(args):
        out = []
        for arg in args:
            head, sep, rest = arg.partition("/")
            out.append(str(places[head] / rest if sep else places[head]) if head in places else arg)
        return out

    return filled


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("args, expected", list(CASES.values()), ids=list(CASES))
def test_a_mistake_ends_in_one_line_and_status_2(cli, fill, tmp_path, args, expected):
    before = sorted(tmp_path.iterdir())
    code, out, err = cli(*fill(args))
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("attnscope: error: ") and expected in lines[0], lines[0]
    assert sorted(tmp_path.iterdir()) == before  # no --out folder, no temporary file left behind


@pytest.mark.parametrize(
    "args, expected",
    [
        (["heads", CAT, "--sort", "beauty"], "--sort beauty: use one of"),
        (["heads", CAT, "--top", "0"], "--top 0: must be"),
        (["heads", CAT, "--plot", "0.1"], "give --out DIR too"),
        (["heads", CAT, "--probe-len", "2"], "--probe-len 2: must be"),
        (["heads", CAT, "--probe-seed", "-1"], "--probe-seed -1: must be"),
        (["heads", CAT, "--threshold", "broad=7"], "thresholds lie between 0 and 1"),
        (["heads", "   "], "holds no text"),
        (["diversity", CAT, "--layer", "1", "--redundant", "2"], "--redundant 2: must be a number from 0 to 1"),
        (["attend", CAT, "--from", "cat", "--to-index", "1"], "give the to word"),
        (["random-mha", "--head-counts", "3"], "must divide d_model"),
        (["bench", "--seq-lens", "1", "--random-weights"], "--seq-lens 1: must be a whole number from 2"),
    ],
)
def test_what_needs_no_model_is_checked_before_it_loads(cli, tmp_path, args, expected):
    """A model that does not exist is not even looked for: the option's own error comes first."""
    code, out, err = cli(*args, "-m", tmp_path / "no-model") if args[0] != "random-mha" else cli(*args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and expected in err, err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["heads", CAT, "--probe-len", "64"], "BOS + twice the period (129 tokens)"),
        (["heads", CAT, "--layer", "5"], "layer 5 is out of range"),
        (["heads", CAT, "--plot", "0.9", "--out", "OUT"], "head 9 is out of range"),
        (["heads", CAT, "--sort", "last_token"], "measured for encoders only"),
        (["report", CAT, "--probe-len", "64"], "BOS + twice the period (129 tokens)"),
    ],
)
def test_what_needs_the_model_is_checked_before_any_text_runs(
    cli, tiny_model_dir, tmp_path, monkeypatch, args, expected
):
    from attnscope.analyses import scoring

    def no_analysis(*args, **kwargs):
        raise AssertionError("the texts ran before the settings were checked")

    monkeypatch.setattr(scoring, "run_windows", no_analysis)
    args = [str(tmp_path / "out") if arg == "OUT" else arg for arg in args]
    code, out, err = cli(*args, "-m", tiny_model_dir)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and expected in err, err
    assert list(tmp_path.iterdir()) == []


def test_under_torchrun_rank_0_alone_says_a_shared_error_and_a_process_out_of_memory_says_its_rank(
    cli, tiny_model_dir, monkeypatch
):
    """Every process of a torchrun launch reads the same options and texts, so a user's error is every process's:
    one line, rank 0's, not one per process. Running out of memory is one process's own: its line names the rank.
    (The processes' group is not joined here: its joining is stubbed, the error comes first.)"""
    from attnscope.analyses import scoring
    from attnscope.pipeline import distributed

    torchrun = {"WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(distributed, "init", lambda device: distributed.world())
    for rank, lines in (("1", 0), ("0", 1)):
        monkeypatch.setenv("RANK", rank)
        for args in (["heads", CAT, "--top", "-3"], ["diversity", CAT, "--layer", "7", "-m", tiny_model_dir]):
            code, out, err = cli(*args)
            assert code == 2 and out == "" and len(err.splitlines()) == lines, (rank, args, err)
            assert err.startswith("attnscope: error: ") or not lines

    def allocate(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(scoring, "run_windows", allocate)
    monkeypatch.setenv("RANK", "1")
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("attnscope: error (rank 1): out of memory (MemoryError)"), line


def test_running_out_of_memory_is_one_line_and_a_bug_is_not_hidden(cli, tiny_model_dir, monkeypatch):
    from attnscope.analyses import scoring

    def allocate(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you tried "
            "to allocate 204800000000 bytes. Error code 12 (Cannot allocate memory)"
        )

    monkeypatch.setattr(scoring, "run_windows", allocate)
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("attnscope: error: out of memory") and "--batch-size" in line

    def bug(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(scoring, "run_windows", bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # a bug keeps its traceback, for the bug report
        cli("heads", CAT, "-m", tiny_model_dir)


def test_out_through_a_link_to_nothing_is_one_line(cli, tiny_model_dir, tmp_path):
    """A dangling link once said only "File exists"."""
    (tmp_path / "results").symlink_to(tmp_path / "gone")
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir, "--out", tmp_path / "results")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"it is a link to {tmp_path / 'gone'}, which does not exist" in err
