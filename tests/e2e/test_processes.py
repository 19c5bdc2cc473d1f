"""The process itself under test: `python -m attnscope`, a reader that goes away, Ctrl-C, two processes under
torchrun. All in subprocesses, all slow."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support import CAT, build_tiny_gpt2

pytestmark = pytest.mark.slow

WORDS = "the cat sat on mat because it was tired doctor said that she would help patient quick brown fox".split()


def _corpus_file(path: Path, count: int, seed: int) -> Path:
    generator = random.Random(seed)
    lines = []
    for _ in range(count):
        text = " ".join(generator.choice(WORDS) for _ in range(generator.randint(3, 40)))
        lines.append(json.dumps({"text": text}) + "\n")
    path.write_text("".join(lines))
    return path


def _module(*args, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "attnscope", *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_python_dash_m_entry_point(tiny_model_dir):
    """The process as a user starts it (the same for every kind of model: one kind is enough here)."""
    result = _module("heads", CAT, "-m", tiny_model_dir, "--json")
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["heads"]) == 8
    assert result.stderr == ""  # no progress bars or load reports on a clean run
    failed = _module("heads", "", "-m", tiny_model_dir)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stderr.strip().splitlines() == [
        "attnscope: error: the text given (TEXT) holds no text (it is empty or only whitespace)"
    ]


@pytest.mark.parametrize("output", [["--json"], []])
def test_a_reader_that_goes_away_ends_the_run_quietly(tiny_model_dir, output):
    """`attnscope heads | head -1`: the pipe closes before attnscope writes; no traceback, no error message."""
    process = subprocess.Popen(
        [sys.executable, "-m", "attnscope", "heads", CAT, "-m", str(tiny_model_dir), *output],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.stdout.close()  # the reader is gone before anything is written
    err = process.stderr.read()
    assert process.wait(timeout=120) == 1
    assert err == ""


IOI_PAIRS = [
    {"clean": "When Mary and John went to the store, John gave a drink to",
     "corrupt": "When Mary and John went to the store, John gave a drink from", "answer": " Mary", "wrong": " John"},
    {"clean": "Alice gave Bob a book, and then Bob gave it to",
     "corrupt": "Alice gave Bob a book, and then Alice gave it to", "answer": " Alice", "wrong": " Bob"},
    {"clean": "The cat sat on the mat and the dog sat on the",
     "corrupt": "The cat sat on the rug and the dog sat on the", "answer": " mat", "wrong": " rug"},
]  # fmt: skip

CHAIN = """
import contextlib, sys
from attnscope.cli import run

folder, commands = sys.argv[1], sys.argv[2:]
for k, command in enumerate(commands):
    with open(f"{folder}/{k}.json", "w") as out, contextlib.redirect_stdout(out):
        status = run(command.split("|"))
    if status:
        sys.exit(status)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun test uses localhost TCP and fork")
def test_work_shared_under_torchrun_gives_one_process_json(cli, tiny_model_dir, tmp_path):
    """Two gloo processes under one torchrun launch: heads' windows (each process sums every second window of 30
    texts; the sums are added, so the scores equal one process's to float rounding), then, byte for byte one
    process's (this one, with one thread, as each of the two): circuit's removals (of the texts and the probe), its
    gradient's batches and its direct effects' (a batch each), compare's two models (their divergence and their
    losses on different processes; without the loss, one process does it all and the other joins the group without
    a model), a report of three models (one process opens two) and discover's batches of pairs (EAP-IG with
    corrupted ablation; exact with mean ablation). Last, a user's error: one line on stderr for the
    launch, not one per process."""
    file = _corpus_file(tmp_path / "corpus.jsonl", 2, seed=4)
    pairs = tmp_path / "pairs.jsonl"  # three pairs of two lengths, for discover's batches of pairs
    pairs.write_text("".join(json.dumps(pair) + "\n" for pair in IOI_PAIRS), encoding="utf-8")
    corpus = _corpus_file(tmp_path / "corpus30.jsonl", 30, seed=2)
    a, b, c = tiny_model_dir, build_tiny_gpt2(tmp_path / "b", seed=1), build_tiny_gpt2(tmp_path / "c", seed=2)
    common = ["--file", file, "--device", "cpu", "--json"]
    commands = [
        ["heads", "--file", corpus, "-m", a, "--device", "cpu", "--json", "--batch-size", "4"],
        ["circuit", "-m", a, *common],
        ["circuit", "-m", a, *common, "--method", "gradient", "--batch-size", "1", "--weights"],
        ["compare", "-m", a, "-m", b, "--no-probe", *common],
        ["compare", "-m", a, "-m", b, "--no-probe", "--no-loss", *common],  # one piece: the second process loads none
        ["report", "-m", a, "-m", b, "-m", c, "--no-diversity", "--no-probe", *common],
        ["discover", "-m", a, "--file", pairs, "--device", "cpu", "--json", "--batch-size", "1"],
        ["discover", "-m", a, "--file", pairs, "--device", "cpu", "--json", "--method", "exact", "--ablation", "mean"],
    ]
    script = tmp_path / "chain.py"
    script.write_text(CHAIN)
    root = str(Path(__file__).resolve().parents[2])  # this attnscope, not another installed (the script is elsewhere)
    path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    failing = ["diversity", "-m", a, *common, "--layer", "7"]  # after the commands: a user's error, every process's
    chained = ["|".join(map(str, command)) for command in [*commands, failing]]
    ran = subprocess.run([*launcher, script, tmp_path, *chained], capture_output=True, text=True, env=env, timeout=300)
    said = [line for line in ran.stderr.splitlines() if line.startswith("attnscope: ")]
    assert ran.returncode != 0 and len(said) == 1 and "layer 7" in said[0], (said, ran.stderr[:3000])  # rank 0 alone
    assert all((tmp_path / f"{k}.json").stat().st_size for k in range(len(commands))), ran.stderr[-2000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for k, command in enumerate(commands):
            code, out, err = cli(*command)
            assert code == 0, err
            assert json.loads(out)["command"] == command[0]
            if command[0] == "heads":  # sums added across processes: equal to float rounding
                one, two = json.loads(out), json.loads((tmp_path / f"{k}.json").read_text())
                assert two["input"]["scored_rows"] == one["input"]["scored_rows"]
                for x, y in zip(one["heads"], two["heads"], strict=True):
                    for name in (
                        "previous_token",
                        "first_token",
                        "self",
                        "local",
                        "entropy",
                        "confidence",
                        "induction",
                    ):
                        assert y[name] == pytest.approx(x[name], abs=2e-6), (x["label"], name)
                    assert y["role"] == x["role"]
            else:
                assert (tmp_path / f"{k}.json").read_text() == out, command[:6]
    finally:
        torch.set_num_threads(threads)


DEMO_PAIRS = Path(__file__).resolve().parents[2] / "attnscope" / "sample_texts" / "demo-pairs.jsonl"


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun test uses localhost TCP and fork")
def test_ablate_and_patch_under_torchrun_give_one_process_json(cli, tmp_path):
    """Two gloo processes under one torchrun launch, on the demo model, each command's JSON one process's byte for
    byte (this one's, with one thread, as each of the two): ablate's passes of configurations, shared round by round
    (mean, resample with pruning, and the gradient's batches: batches of 2 of the six sample texts make three
    rounds' worth), the model saved without a head by rank 0 alone (the same weights, byte for byte; no head scored),
    patch's batches' baselines and patched runs (the demo's pairs, batches of one length), and one model's report
    --ablate, whose ablation is shared as ablate's is (its heads, shared by window, equal one process's to rounding:
    test_work_shared_under_torchrun_gives_one_process_json)."""
    common = ["-m", "demo", "--device", "cpu", "--json"]
    commands = [
        ["ablate", *common, "--batch-size", "2"],
        ["ablate", *common, "--batch-size", "2", "--ablation", "resample", "--prune", "3"],
        ["ablate", *common, "--batch-size", "2", "--method", "gradient", "--ablation", "zero"],
        ["ablate", *common, "--batch-size", "2", "--remove", "0.2,1.1", "--save", "SAVED"],
        ["patch", *common, "--file", DEMO_PAIRS],
        ["patch", *common, "--file", DEMO_PAIRS, "--batch-size", "1"],
        ["report", *common, "--ablate", "--no-diversity", "--no-probe", "--batch-size", "2"],
    ]
    script = tmp_path / "chain.py"
    script.write_text(CHAIN)
    root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    }
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    chained = [
        "|".join(str(tmp_path / "two") if arg == "SAVED" else str(arg) for arg in command) for command in commands
    ]
    ran = subprocess.run([*launcher, script, tmp_path, *chained], capture_output=True, text=True, env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for k, command in enumerate(commands):
            code, out, err = cli(*[tmp_path / "one" if arg == "SAVED" else arg for arg in command])
            assert code == 0, err
            two = (tmp_path / f"{k}.json").read_text()
            if "SAVED" in command:  # the same document but for the folder's name, and the same weights
                assert two == out.replace(str(tmp_path / "one"), str(tmp_path / "two"))
                assert json.loads(out)["heads"] == [] and json.loads(out)["settings"]["score"] is False
                for name in ("model.safetensors", "config.json", "tokenizer.json"):
                    assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
            elif command[0] == "report":
                assert json.loads(two)["ablation"] == json.loads(out)["ablation"]
            else:
                assert two == out, command[:8]
    finally:
        torch.set_num_threads(threads)


FORKED = """
import os, sys, torch
from attnscope.pipeline import tiles
torch.set_num_threads(2)
tiles.block_in_tiles = lambda *job: job[0] * 2  # the pool, not the arithmetic, is under test
assert tiles.blocks_in_tiles([(1,), (2,), (3,)]) == [2, 4, 6]  # the parent's pool exists now
child = os.fork()
if child == 0:
    os._exit(0 if tiles.blocks_in_tiles([(4,), (5,)]) == [8, 10] else 3)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="forks")
def test_a_process_forked_after_tiles_ran_shares_its_blocks_among_threads_of_its_own():
    """The tiles' thread pool belongs to the process that made it: a fork has none of its threads, and a pool it
    inherited would take its blocks and never run them (the run would hang); the fork builds its own."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, env=env, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]


@pytest.mark.skipif(sys.platform != "linux", reason="sends SIGINT")
def test_ctrl_c_stops_cleanly_and_writes_nothing(tiny_model_dir, tmp_path):
    file = _corpus_file(tmp_path / "big.jsonl", 20000, seed=3)
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "attnscope", "heads", "--file", str(file), "-m", str(tiny_model_dir)]
        + ["--out", str(out), "--batch-size", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def cpu_seconds() -> float:  # user + system time of the process, from /proc (clock ticks)
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    deadline = time.monotonic() + 120
    # Importing torch and transformers takes a few CPU seconds, then the model loads and the 20,000 texts run for
    # far longer: 5 CPU seconds in, the command is inside the CLI, loading or analysing, whatever the machine's speed.
    while cpu_seconds() < 5.0 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    # Killed by its own SIGINT after cleaning up, as interrupted Unix programs end (a shell shows $? = 130).
    assert process.returncode == -signal.SIGINT, err
    assert err.strip().splitlines() == ["attnscope: interrupted"]
    assert not out.exists()  # nothing written, nothing half-written, not even the folder


def test_bytes_that_are_not_utf8_and_a_closed_stdin_end_in_one_line(tiny_model_dir):
    """The real process: the operating system passes the argument's bytes as they are, and stdin may be closed."""
    bad = subprocess.run(
        [sys.executable.encode(), b"-m", b"attnscope", b"heads", b"The cat \xff\xfe sat", b"-m", bytes(tiny_model_dir)],
        capture_output=True,
        timeout=300,
    )
    assert bad.returncode == 2 and bad.stdout == b""
    assert bad.stderr.decode().strip().splitlines() == [
        "attnscope: error: the text given (TEXT) is not valid text: byte 0xff at character 8 is not UTF-8"
    ]
    closed = subprocess.run(
        f"exec {sys.executable} -m attnscope heads - -m {tiny_model_dir} <&-",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert closed.returncode == 2 and "Traceback" not in closed.stderr
    assert closed.stderr.strip().splitlines() == [
        "attnscope: error: standard input is closed: there is no text to read from '-'"
    ]


def test_a_long_single_line_from_stdin_streams_to_the_same_numbers_as_the_same_text_given_whole(tiny_model_dir):
    """A 100 KB line with no line break (bigger than a block read and than a piece tokenized), read from a pipe,
    against the same text as the TEXT argument (one string in memory): the same windows, the same scores."""
    line = " ".join(f"The cat number {k} sat on the mat." for k in range(1900))
    assert 64 * 1024 < len(line) < 128 * 1024  # an argument may not be longer
    piped = subprocess.run(
        [sys.executable, "-m", "attnscope", "heads", "-", "-m", str(tiny_model_dir), "--json", "--no-probe"],
        input=line,
        capture_output=True,
        text=True,
        timeout=300,
    )
    whole = _module("heads", line, "-m", tiny_model_dir, "--json", "--no-probe")
    assert piped.returncode == 0 and whole.returncode == 0, piped.stderr + whole.stderr
    streamed, given = json.loads(piped.stdout), json.loads(whole.stdout)
    assert streamed["input"]["n_windows"] == given["input"]["n_windows"] > 100
    assert streamed["input"]["n_tokens"] == given["input"]["n_tokens"]
    for a, b in zip(streamed["heads"], given["heads"], strict=True):
        assert a["role"] == b["role"]
        for name in ("previous_token", "first_token", "self", "local", "entropy"):
            assert a[name] == pytest.approx(b[name], abs=1e-6)


FINISHED_THEN_SIGNALLED = """
import os, signal, sys
from attnscope.cli import boundary

done, sent = boundary.run, getattr(signal, sys.argv[1])

def run_then_signal(argv):
    status = done(argv)
    os.kill(os.getpid(), sent)  # the second after the last file is written
    return status

boundary.run = run_then_signal
sys.argv = ["attnscope", "info", "--model", "demo", "--out", sys.argv[2]]
boundary.main()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="sends signals")
@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_signal_once_the_result_is_complete_changes_nothing(tmp_path, name):
    """A signal between the last file written and the exit once ended a complete run with 130 or 143 and no line."""
    out = tmp_path / "info"
    ran = subprocess.run(
        [sys.executable, "-c", FINISHED_THEN_SIGNALLED, name, str(out)], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert "interrupted" not in ran.stderr and (out / "info.json").exists()


# ---------------------------------------------------------------------- issue 38, item 9: a rank that waits forever


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _one_of_two(rank: int, port: int, seconds: float) -> dict[str, str]:
    """Process `rank` of two, launched by hand (no torchrun), to meet the other at 127.0.0.1:port within `seconds`."""
    place = {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1"}
    return {**os.environ, **place, "MASTER_PORT": str(port), "ATTNSCOPE_RENDEZVOUS_TIMEOUT": f"{seconds:g}"}


ALONE = {1: ["heads", "--model", "demo", "--json", CAT], 0: ["circuit", "--model", "demo", "--json"]}


@pytest.mark.skipif(sys.platform != "linux", reason="meets on localhost TCP")
@pytest.mark.parametrize("rank", [1, 0])
def test_a_process_whose_others_never_come_ends_in_one_line_that_states_the_timeout(rank):
    """`WORLD_SIZE=2 RANK=1 ... attnscope circuit`, started by hand without the other process, waited 30 minutes in
    torch's rendezvous, then printed a C++ stack; rank 0 alone, the same. Now one line, once the timeout it states
    has passed: rank 1 finds nothing listening at MASTER_ADDR:MASTER_PORT, rank 0 waits there for a rank 1 that
    never comes."""
    port = _free_port()
    ran = _module(*ALONE[rank], env=_one_of_two(rank, port, 2), timeout=120)
    assert ran.returncode == 2 and ran.stdout == "", ran.stderr[-3000:]
    (line,) = ran.stderr.splitlines()
    said = (
        f"attnscope: error (rank 1): nothing answered at MASTER_ADDR:MASTER_PORT (127.0.0.1:{port}) within 2 s, "
        if rank
        else f"attnscope: error: torchrun's 2 processes did not all come to 127.0.0.1:{port} within 2 s ("
    )
    assert line.startswith(said) and line.endswith("or give them longer: ATTNSCOPE_RENDEZVOUS_TIMEOUT=SECONDS"), line


def _listening(port: int, deadline: float) -> None:
    """Wait for rank 0 to listen at its port (a connection it sees come and go is no process joining)."""
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"nothing listened at {port}")


@pytest.mark.skipif(sys.platform != "linux", reason="sends signals")
@pytest.mark.parametrize("rank, stop", [(1, signal.SIGINT), (1, signal.SIGTERM), (0, signal.SIGINT)])
def test_a_signal_ends_the_wait_for_the_other_processes_at_once(rank, stop):
    """Waiting in torch's rendezvous, a process ignored Ctrl-C and SIGTERM (torch waits inside C++, where Python's
    handlers cannot run; only SIGKILL ended it) and printed a C++ stack. Rank 1 here finds a listener that never
    answers, so torch's client waits in C++ for a reply; rank 0 waits for rank 1. The wait's own timeout is a
    minute: the signal, not the timeout, ends it, with the usual line and the status of a program killed by it."""
    port = _free_port()
    with contextlib.ExitStack() as cleanup:
        listener = cleanup.enter_context(socket.create_server(("127.0.0.1", port))) if rank else None
        process = subprocess.Popen(
            [sys.executable, "-m", "attnscope", *ALONE[rank]],
            env=_one_of_two(rank, port, 60),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        cleanup.callback(lambda: process.poll() is None and process.kill())
        if listener is not None:
            listener.settimeout(60)
            cleanup.enter_context(listener.accept()[0])  # it has come to the rendezvous
        else:
            _listening(port, time.monotonic() + 60)
        time.sleep(1.0)  # well inside torch's wait
        process.send_signal(stop)
        sent = time.monotonic()
        _, err = process.communicate(timeout=10)
    assert time.monotonic() - sent < 5
    assert process.returncode == -stop, err[-3000:]
    named = "" if stop == signal.SIGINT else f" ({stop.name})"
    assert err.splitlines() == [f"attnscope: interrupted{named}"]
