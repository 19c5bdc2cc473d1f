"""A new user's first minutes: errors that cannot find a model point to `--model demo`, and so does every command's
`--model` help; `info` reads the config alone (no weights, no tokenizer, no torch for GPT-2) and agrees with the
loaded model; a command that loads a model says so on a terminal, and its progress bar counts what it says."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support import CAT, FAMILY_MODELS, build_tiny_gpt2

DEMO_HINT = "the model 'demo' (--model demo) is the small GPT-2 bundled with attnscope, with no download"
MODEL_COMMANDS = (
    "heads", "show", "diversity", "attend", "ablate", "circuit", "report", "compare", "bench", "info", "kvplan",
)  # fmt: skip

# ------------------------------------------------------------------------------------------- --model demo


@pytest.mark.parametrize(
    "args",
    [
        ["heads", CAT],  # the default model, gpt2, is not in the (empty, offline) cache of the test session
        ["info"],
        ["heads", CAT, "-m", "EleutherAI/pythia-70m"],
        ["info", "-m", "gpt2", "--revision", "main"],
    ],
    ids=["heads gpt2", "info gpt2", "heads pythia", "info at a revision"],
)
def test_a_model_that_is_not_there_points_to_the_demo(cli, args):
    code, out, err = cli(*args)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("attnscope: error: model '")
    assert "is not in the local Hugging Face cache and the Hub cannot be reached" in err and DEMO_HINT in err


def test_a_missing_folder_that_reads_as_a_hub_id_says_both(cli, tmp_path, monkeypatch):
    """`runs/step-0000` could be a folder (here, relative) or a Hub id: when it is neither, the line says where the
    folder was looked for, as well as that the Hub has no such model."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("heads", CAT, "-m", "runs/step-0000")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "model 'runs/step-0000' is not in the local Hugging Face cache" in err
    assert f"(nor is there a folder {tmp_path / 'runs' / 'step-0000'})" in err


@pytest.mark.parametrize("command", ["compare", "report"])
def test_revisions_without_a_model_name_the_model_option(cli, command):
    code, out, err = cli(command, CAT, "--revisions", "step0,step512")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "revisions (--revisions) are revisions of a model: name it with --model" in err


@pytest.mark.parametrize("command", ["heads", "info"])
def test_a_missing_model_directory_points_to_the_demo(cli, tmp_path, command):
    code, out, err = cli(command, *([CAT] if command == "heads" else []), "-m", tmp_path / "nope")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert f"no such model directory: {tmp_path / 'nope'}" in err and DEMO_HINT in err


def test_a_hub_id_that_does_not_exist_points_to_the_demo():
    """What transformers raises when the Hub has no such repository (it cannot be reached from the tests, so the
    loader raises what transformers would), as one line naming the demo."""
    from attnscope.errors import AttnscopeError
    from attnscope.models.loading import _from_pretrained

    class Missing:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            raise OSError(
                "nobody/no-such-model is not a local folder and is not a valid model identifier listed on "
                "'https://huggingface.co/models'\nIf this is a private repository, make sure to pass a token"
            )

    with pytest.raises(AttnscopeError) as caught:
        _from_pretrained("nobody/no-such-model", Missing, "nobody/no-such-model", local_only=False)
    assert str(caught.value).startswith("model 'nobody/no-such-model' is neither a local directory nor a model on")
    assert DEMO_HINT in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_every_model_option_names_the_demo(cli, command):
    code, out, _ = cli(command, "--help")
    assert code == 0
    words = " ".join(out.split())
    assert "-m, --model NAME|PATH 'demo': the small GPT-2 bundled with attnscope (no download, works offline)" in words


# ----------------------------------------------------------------------------------------------------- info


def _info(cli, *args):
    code, out, err = cli("info", *args, "--json")
    assert code == 0, err
    return json.loads(out)["model"]


def test_info_reads_the_config_alone_and_agrees_with_the_loaded_model(cli, model_dir, model, tmp_path):
    """A folder holding nothing but config.json gives the facts of the full model loaded (weights, tokenizer)."""
    shutil.copy(model_dir / "config.json", tmp_path / "config.json")
    facts = _info(cli, "-m", tmp_path, "--device", "cpu")
    assert facts == {**model.info(), "name": str(tmp_path)}


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_info_runs_without_torch_on_the_demo_model():
    """`attnscope info --model demo` imports neither torch nor transformers (python -X importtime shows why it is
    fast); the demo's facts are those of the model loaded."""
    code = (
        "import json, sys, io, contextlib\n"
        "from attnscope.cli import run\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    status = run(['info', '--model', 'demo', '--device', 'auto', '--json'])\n"
        "print(json.dumps({'status': status, 'torch': 'torch' in sys.modules,\n"
        "                  'transformers': 'transformers' in sys.modules, 'doc': json.loads(out.getvalue())}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == 0 and not answer["torch"] and not answer["transformers"]
    from attnscope.models.loading import load_model

    assert answer["doc"]["model"] == load_model("demo", "cpu").info()


def test_gpt2_small_parameter_count_from_its_config():
    """GPT-2 small, from an empty config.json (GPT2Config's defaults): the count of the architecture built on the
    meta device, and the 124,439,808 of the literature."""
    import torch
    from transformers import GPT2Config, GPT2Model

    from attnscope.models.facts import gpt2_parameter_count

    with torch.device("meta"):
        built = GPT2Model(GPT2Config())
    total, attention = gpt2_parameter_count({})
    assert total == sum(p.numel() for p in built.parameters()) == 124_439_808
    assert attention == sum(p.numel() for p in built.h[0].attn.parameters())


@pytest.mark.slow
def test_gpt2_formula_equals_the_loaded_model(tmp_path):
    """A GPT-2 unlike the tiny one of the other tests (which has the default MLP width, 4d): n_inner set."""
    from attnscope.models.facts import model_facts
    from attnscope.models.loading import load_model

    folder = build_tiny_gpt2(tmp_path, n_inner=48, n_layer=3, n_embd=24, n_head=3, n_positions=40)
    assert model_facts(str(folder), "cpu") == load_model(str(folder), "cpu").info()


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_the_dtype_comes_from_the_weights_when_the_config_does_not_say(tmp_path, tiny_model_dir):
    """transformers' rule for `dtype="auto"`: the config's dtype, else the first floating-point tensor's."""
    from attnscope.models.facts import model_facts
    from attnscope.models.loading import load_model

    folder = tmp_path / "bf16"
    shutil.copytree(tiny_model_dir, folder)
    from safetensors.torch import load_file, save_file

    weights = {name: tensor.bfloat16() for name, tensor in load_file(folder / "model.safetensors").items()}
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config.pop("dtype", None), config.pop("torch_dtype", None)
    (folder / "config.json").write_text(json.dumps(config))
    facts = model_facts(str(folder), "cpu")
    assert facts["dtype"] == load_model(str(folder), "cpu").info()["dtype"] == "bfloat16"
    (folder / "model.safetensors").unlink()  # no weights: torch's default
    assert model_facts(str(folder), "cpu")["dtype"] == "float32"
    assert model_facts(str(folder), "cpu", "float16")["dtype"] == "float16"


FAST_FAMILIES = ["llama", "gemma2", "bert"]


@pytest.mark.parametrize(
    "family", [name if name in FAST_FAMILIES else pytest.param(name, marks=pytest.mark.slow) for name in FAMILY_MODELS]
)
def test_info_of_every_family_equals_the_loaded_model(family_dir, family, tmp_path):
    """Counted on the architecture built on the meta device from config.json alone: every fact equals the model
    loaded with its weights (grouped-query attention, QK-norms, mixtures of experts, encoders' poolers), and so does
    each layer's attention."""
    from attnscope.models.facts import facts_and_layers, model_facts
    from attnscope.models.loading import load_model

    shutil.copy(family_dir(family) / "config.json", tmp_path / "config.json")
    loaded = load_model(str(family_dir(family)), "cpu")
    facts, layers = facts_and_layers(str(tmp_path), "cpu")
    assert model_facts(str(tmp_path), "cpu") == facts == {**loaded.info(), "name": str(tmp_path)}
    assert layers == loaded.attention_layers() and len(layers) == loaded.n_layer


def test_info_takes_no_device_map(cli, tiny_model_dir):
    code, out, err = cli("info", "-m", tiny_model_dir, "--device-map", "auto")
    assert code == 2 and out == "" and "No such option: --device-map" in err


# ------------------------------------------------------------------------------------ status and progress


@pytest.fixture
def terminal(monkeypatch):
    """Call it in the test (capture swaps sys.stderr between setup and call): the captured stderr taken for a
    terminal 120 columns wide, as the status line and the progress bar see it."""

    def take(columns: int = 120) -> None:
        monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
        monkeypatch.setenv("COLUMNS", str(columns))

    return take


def test_loading_says_so_on_a_terminal_then_clears_the_line(cli, tiny_model_dir, terminal):
    terminal()
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir, "--json")
    assert code == 0 and json.loads(out)
    said = f"\r\x1b[2Kloading {tiny_model_dir} …"
    assert said in err
    assert err.index("\r\x1b[2K", err.index(said) + len(said)) > 0  # cleared once loaded


def test_no_status_line_with_quiet_or_off_a_terminal(cli, tiny_model_dir, terminal):
    terminal()
    code, _, err = cli("heads", CAT, "-m", tiny_model_dir, "--json", "-q")
    assert code == 0 and err == ""


def test_no_status_line_when_stderr_is_not_a_terminal(cli, tiny_model_dir):
    code, _, err = cli("heads", CAT, "-m", tiny_model_dir, "--json")
    assert code == 0 and "loading" not in err and "\x1b" not in err


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_the_progress_bar_counts_texts_read_and_the_share_of_the_input(cli, tiny_model_dir, terminal, tmp_path):
    terminal()
    corpus = tmp_path / "three.txt"
    corpus.write_text(f"{CAT}\n\nHello world.\n\nThe doctor said that she would help the patient.\n")
    code, _, err = cli("heads", "--file", corpus, "-m", tiny_model_dir, "--json", "--batch-size", "1")
    assert code == 0
    assert "3 texts read" in err and "100% of the input" in err and "tokens/s" in err
    code, _, err = cli("heads", CAT, "-m", tiny_model_dir, "--json")
    assert "1 text read" in err and "1 texts" not in err


def test_a_status_line_wider_than_the_terminal_is_cut(cli, tiny_model_dir, terminal):
    terminal(20)
    code, _, err = cli("heads", CAT, "-m", tiny_model_dir, "--json")
    assert code == 0
    line = err.split("\r\x1b[2K")[1]
    assert line == f"loading {tiny_model_dir}"[:18] + "…"  # 19 cells: never wraps, so it can be cleared


@pytest.mark.slow
def test_bench_says_what_it_times(cli, tiny_model_dir, terminal, monkeypatch):
    from attnscope.analyses import common

    terminal()
    monkeypatch.setattr(common, "LARGE_WORK_FLOP", 0)  # and what it plans, as it does before a large run
    args = ("--seq-lens", "8,12", "--batch-sizes", "1", "--repeats", "1", "--warmup", "0", "--device", "cpu", "--micro")
    code, _, err = cli("bench", "-m", tiny_model_dir, *args, "--methods", "floor,attnscope", "--json")
    assert code == 0
    assert f"loading {tiny_model_dir} …" in err
    assert (
        "timing floor, attnscope at 1 × 8 (1 of 2) …" in err and "timing floor, attnscope at 1 × 12 (2 of 2) …" in err
    )
    assert "micro-benchmark at 1 × 12 (2 of 2) …" in err
    planned = "note: bench times 2 methods at 2 shapes (--batch-sizes × --seq-lens), 0 warm-up + 1 timed run each: "
    assert f"\r\x1b[2K{planned}4 forward passes, 40 tokens in all" in err  # 2 × 1 × (8 + 12) tokens
    assert err.endswith("\r\x1b[2K")


@pytest.mark.slow
def test_on_a_real_terminal_the_status_line_is_drawn_and_cleared(tiny_model_dir):
    """A pseudo-terminal on stderr, a pipe on stdout: the JSON is whole and the terminal's last line is clean."""
    import pty

    leader, follower = pty.openpty()
    env = dict(os.environ, COLUMNS="120")
    done = subprocess.run(
        [sys.executable, "-m", "attnscope", "heads", CAT, "-m", str(tiny_model_dir), "--json", "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=follower,
        env=env,
        timeout=300,
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert done.returncode == 0 and json.loads(done.stdout)
    drawn = seen.decode()
    assert f"loading {tiny_model_dir} …" in drawn and drawn.rstrip("\r\n").endswith("\x1b[2K")


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_notes_count_in_words(cli, short_context_model_dir):
    """One text split: "1 text ... was split", and the windows counted."""
    long_text = " ".join([CAT] * 3)  # about 36 tokens: 3 windows of a 16-token context
    code, _, err = cli("heads", long_text, "-m", short_context_model_dir, "--no-probe", "--json")
    assert code == 0
    split = next(line for line in err.splitlines() if "split into windows" in line)
    assert re.fullmatch(
        r"note: 1 text longer than the model's context \(16 tokens\) was split into windows; \d+ windows in all", split
    )


def test_a_name_one_letter_from_the_demo_is_asked_about_from_python_too():
    """`load("demoo")` once spoke to a Python user of the command line's flag alone."""
    import attnscope
    from attnscope.errors import AttnscopeError

    with pytest.raises(AttnscopeError) as caught:
        attnscope.load("demoo")
    assert "did you mean 'demo'? the model 'demo' (--model demo) is the small GPT-2" in str(caught.value)


def test_the_rate_counts_the_tokens_run_since_the_bar_started(terminal):
    """The first batch runs before the bar exists: counted in the rate, it divided its tokens by almost no time
    (a 2-text run once showed 7,683,865 tokens/s)."""
    import time

    from attnscope.cli.display import Live

    terminal()
    with Live(False, "heads") as live:
        live.progress(1, 50_000, 0.5)  # the first batch: no rate yet
        assert live.bar.tasks[0].fields["rate"] == ""
        time.sleep(0.05)
        live.progress(2, 50_100, 1.0)  # 100 tokens in 0.05 s or more
        rate = int(live.bar.tasks[0].fields["rate"].split()[0].replace(",", ""))
    assert 0 < rate <= 2_000


def test_off_a_terminal_a_long_run_says_how_it_goes_in_plain_lines_now_and_then(capsys, monkeypatch):
    """A pipe, CI, a notebook's subprocess: no line in the first PLAIN_FIRST_S seconds (a quick command says
    nothing), then the latest news at most once every PLAIN_EVERY_S seconds (issue 38: `bench` printed nothing for
    15 minutes); a planned piece of work is said at once, and kept, as a note."""
    from attnscope.cli import display
    from attnscope.settings import Planned

    clock = [100.0]
    monkeypatch.setattr(display.time, "perf_counter", lambda: clock[0])
    monkeypatch.delenv(display.PLAIN_SWITCH)  # the tests turn the lines off (conftest); on by default
    with display.Live(False, "kvplan") as live:
        live.status("loading demo …")
        live.status(Planned("--check runs 12 passkey prompts 33 times"))
        clock[0] += display.PLAIN_FIRST_S - 1
        live.progress(1, 500, 0.25)
        assert capsys.readouterr().err == "note: --check runs 12 passkey prompts 33 times\n"
        clock[0] += 2  # past the first wait
        live.progress(2, 1_100, 0.5)
        clock[0] += display.PLAIN_EVERY_S - 1  # too soon for another
        live.status("timing floor at 1 × 8 (1 of 2) …")
        clock[0] += 1
        live.progress(3, 1_700, 0.75)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [  # the rate counts from the first batch (9 s in, 500 tokens): loading is no part of it
        "progress: kvplan: 50% of the input, 2 texts read, 1,100 tokens run (300 tokens/s); 11 s so far",
        "progress: kvplan: 75% of the input, 3 texts read, 1,700 tokens run (38 tokens/s); 41 s so far",
    ]
    with display.Live(True, "kvplan") as quiet:  # --quiet: nothing
        assert quiet.status is None and quiet.progress is None
    monkeypatch.setenv(display.PLAIN_SWITCH, "off")  # no lines, but what is planned is still said
    with display.Live(False, "kvplan") as off:
        off.status(Planned("a large piece of work"))
        clock[0] += 100
        off.status("loading demo …")
        assert off.progress is None
    assert capsys.readouterr().err == "note: a large piece of work\n"


@pytest.mark.slow
def test_a_large_check_says_before_it_starts_how_large_it_is(monkeypatch):
    """What the announcement counts is what the check runs: 2 lengths × 3 depths × 1 trial = 6 passkey prompts, and
    3 multi-key needle prompts (the demo's tokenizer needs more than 128 tokens for them: 256 only), through full
    attention once and, at each share that streams some KV head, through the plan and 3 random plans."""
    import attnscope
    from attnscope.analyses import common
    from attnscope.settings import Planned

    monkeypatch.setattr(common, "LARGE_WORK_FLOP", 0)  # every piece of work is large
    said = []
    result = attnscope.kvplan(
        "demo", sink=8, recent=32, check=True, check_lengths=(128, 256), trials=1, status=said.append
    )
    (planned,) = [line for line in said if isinstance(line, Planned)]
    streaming = sum(share["kv_heads"] > 0 for share in result.check["shares"])
    runs = 1 + streaming * (1 + result.check["random_plans"])
    assert result.check["prompts"] == 9 and runs == 17
    assert planned.startswith(
        f"--check runs 9 prompts (2 lengths × 3 depths × 1 trial per task: 6 passkey, 3 multikey) {runs} times"
    )
    assert f"{runs * 9:,} forward passes, {runs * 3 * (128 + 256 + 256):,} tokens in all" in planned
    assert "fewer --trials" in planned
    monkeypatch.setattr(common, "LARGE_WORK_FLOP", 1e30)
    said.clear()
    attnscope.kvplan("demo", sink=8, recent=32, check=True, check_lengths=(128,), trials=1, status=said.append)
    assert not any(isinstance(line, Planned) for line in said)  # small work: nothing said


@pytest.mark.slow
def test_a_large_ablation_says_before_it_starts_how_large_it_is(monkeypatch):
    """The loss method runs the texts once with every head and once without each (the demo: 2 layers × 4 heads, so
    9 passes); the gradient method and --save without --score are small whatever the model."""
    import attnscope
    from attnscope.analyses import common
    from attnscope.api import Planned

    monkeypatch.setattr(common, "LARGE_WORK_FLOP", 0)
    said = []
    attnscope.ablate("demo", [CAT] * 2, status=said.append)
    (planned,) = [line for line in said if isinstance(line, Planned)]
    tokens = 2 * len(CAT) // 4
    assert planned.startswith(f"ablate runs the texts (about {tokens} tokens) with every head, then without each of")
    assert f": 9 forward passes, {9 * tokens:,} tokens in all" in planned and "--method gradient" in planned
    said.clear()
    attnscope.ablate("demo", [CAT] * 2, method="gradient", status=said.append)
    assert not any(isinstance(line, Planned) for line in said)
