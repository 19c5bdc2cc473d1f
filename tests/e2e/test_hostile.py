"""What a hostile user, a broken model or a failing system can do, beyond the table of mistakes in test_errors.py:
a full disk under --out or stdout, Ctrl-C turned into another exception by a library, a Rust panic for want of
memory, a batch that cannot fit, a model with NaN weights, a context too short for the probe, a CSV with no rows."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest
import torch

from attnscope.errors import AttnscopeError
from tests.support import CAT, build_tiny_gpt2, with_nan


def one_error_line(code: int, out: str, err: str) -> str:
    assert code == 2 and out == "", err
    (line,) = err.strip().splitlines()
    assert line.startswith("attnscope: error: ")
    return line


@pytest.mark.slow
def test_a_full_disk_under_out_is_one_line_and_leaves_nothing(cli, tiny_model_dir, tmp_path, monkeypatch):
    from attnscope.output import files

    real = files.write_atomic
    calls = []

    def fill_up(path, data):
        calls.append(path)
        if len(calls) == 3:  # a few files in, the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, data)

    monkeypatch.setattr(files, "write_atomic", fill_up)  # every file of --out is written through it
    line = one_error_line(*cli("heads", CAT, "-m", tiny_model_dir, "--out", tmp_path / "results"))
    assert len(calls) == 3
    assert f"cannot write to --out {tmp_path / 'results'}: No space left on device" in line
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a staged file


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize("output", [["--json"], []])  # --csv writes as --json does; the table through rich
def test_standard_output_on_a_full_disk_is_one_line(tiny_model_dir, output):
    with open("/dev/full", "w") as full:
        finished = subprocess.run(
            [sys.executable, "-m", "attnscope", "heads", CAT, "-m", str(tiny_model_dir), *output],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert finished.returncode == 2, finished.stderr
    assert finished.stderr.strip().splitlines() == [
        "attnscope: error: cannot write to standard output: No space left on device"
    ]


def test_ctrl_c_that_a_library_turns_into_another_error_still_ends_as_an_interrupt(cli, tiny_model_dir, monkeypatch):
    """transformers can catch the KeyboardInterrupt of an import cut short and raise an ImportError instead: the
    run must still end as interrupted (130), not as "cannot load model"."""
    from attnscope.cli import boundary
    from attnscope.models import loading

    def interrupted_load(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler runs at once, interrupting the sleep
            raise AssertionError("SIGINT was not delivered")
        except KeyboardInterrupt:
            raise ImportError("cannot import name 'GPT2Model' from partially initialized module") from None

    previous = signal.signal(signal.SIGINT, boundary._on_interrupt)
    try:
        monkeypatch.setattr(loading, "load_model", interrupted_load)
        code, out, err = cli("heads", CAT, "-m", tiny_model_dir)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130 and out == ""
    assert err.strip() == "attnscope: interrupted"
    # and the next run in the same process is not taken for an interrupted one
    monkeypatch.undo()
    code, out, err = cli("info", "-m", tiny_model_dir, "--json")
    assert code == 0, err


def test_an_interrupt_that_lands_in_a_destructor_still_stops_the_run(cli, tiny_model_dir, monkeypatch):
    """Python drops an exception raised in a destructor (`__del__`) with an "Exception ignored" traceback: a Ctrl-C
    that landed while the tokenizer's regex objects were freed let the run go on and write all its files. The
    interrupt must come again outside the destructor, and stderr keep its one line."""
    from attnscope.cli import boundary
    from attnscope.models import loading

    class Freed:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:  # the handler runs here, inside the destructor
                pass

    def load_freeing_an_object(*args, **kwargs):
        Freed()  # made and freed at once
        time.sleep(5)  # the interrupt, sent again, ends this
        raise AssertionError("the interrupt was lost in the destructor")

    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    hook = sys.unraisablehook
    boundary.handle_stopping_signals()
    try:
        monkeypatch.setattr(loading, "load_model", load_freeing_an_object)
        code, out, err = cli("heads", CAT, "-m", tiny_model_dir)
    finally:
        sys.unraisablehook = hook
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert (code, out) == (130, "")
    assert err.strip() == "attnscope: interrupted"


def test_a_rust_panic_for_want_of_memory_is_the_out_of_memory_line_and_other_panics_are_bugs():
    from attnscope.cli.boundary import _user_error

    class PanicException(BaseException):  # pyo3's, raised by the tokenizers library: a BaseException
        pass

    message, status = _user_error(PanicException("memory allocation of 68719476736 bytes failed"), "heads")
    assert status == 2 and message.startswith("attnscope: error: out of memory (memory allocation of")
    assert "--batch-size" in message
    assert _user_error(PanicException("index out of bounds"), "heads") == (None, 0)


def test_out_of_memory_advice_names_the_options_of_the_command_that_ran():
    from attnscope.cli.boundary import _user_error

    error = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
    bench, _ = _user_error(error, "bench")
    heads, _ = _user_error(error, "heads")
    assert "--batch-sizes or --seq-lens" in bench and "--max-tokens" not in bench
    assert "--batch-size or --max-tokens" in heads


def test_a_bench_shape_that_cannot_fit_is_refused_before_any_weights(cli, tiny_model_dir, monkeypatch):
    from attnscope.analyses import bench, bench_limits

    monkeypatch.setattr(bench_limits, "available_bytes", lambda device: 2**30)  # 1 GiB free
    monkeypatch.setattr(bench, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    monkeypatch.setattr(bench, "random_model", lambda *a, **k: pytest.fail("weights built before the check"))
    args = ["bench", "-m", tiny_model_dir, "--device", "cpu", "--seq-lens", "128", "--no-micro"]
    line = one_error_line(*cli(*args, "--batch-sizes", "1,40000"))
    assert "batch size 40000 × sequence length 128" in line and "GiB available on cpu" in line
    assert "use smaller --batch-sizes or --seq-lens" in line


def test_the_memory_estimate_is_below_what_a_forward_takes_and_grows_with_the_shape():
    from transformers import GPT2Config

    from attnscope.analyses.bench_limits import estimated_bytes

    config = GPT2Config()
    weights = 4 * (config.vocab_size * 768 + 12 * 12 * 768 * 768)
    floor_8x1024 = estimated_bytes(config, 8, 1024, "floor", 4) - weights
    # docs/performance.md: the floor's measured peak at 8 × 1024 is 1.4 GB; the estimate must not refuse what runs.
    # It counts the hidden states (14 values per token and model dimension) but no logits: SDPA need not hold them
    assert floor_8x1024 == 4 * 14 * 8 * 1024 * 768 < 1.4e9
    assert estimated_bytes(config, 16, 1024, "floor", 4) > estimated_bytes(config, 8, 1024, "floor", 4)
    # the notebook ways run one text at a time, whatever the batch, but keep every layer's maps of it
    assert estimated_bytes(config, 8, 1024, "tutorial", 4) == estimated_bytes(config, 1, 1024, "tutorial", 4)
    assert (
        estimated_bytes(config, 1, 1024, "tutorial", 4)
        > estimated_bytes(config, 1, 1024, "floor", 4) + 12 * 12 * 1024**2
    )


@pytest.fixture(scope="module")
def nan_model_dir(tmp_path_factory):
    """A tiny GPT-2 whose second layer's query/key/value weights hold a NaN (a damaged checkpoint)."""
    return with_nan(
        build_tiny_gpt2(tmp_path_factory.mktemp("nan-weights")), "transformer.h.1.attn.c_attn.weight", (3, 5)
    )


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize(
    "args, what",
    [
        (["heads", CAT], "the attention is not finite (NaN or infinity) from layer 1 on"),
        (["diversity", CAT, "--layer", "all"], "the attention is not finite (NaN or infinity) from layer 1 on"),
        (["attend", CAT, "--from", "mat"], "the attention is not finite (NaN or infinity) from layer 1 on"),
        (["show", CAT, "--layer", "1", "--json"], "the attention is not finite (NaN or infinity) from layer 1 on"),
        (["ablate", CAT], "the model's weights hold NaN or infinite values"),
        (["ablate", CAT, "--method", "gradient"], "the model's weights hold NaN or infinite values"),
    ],
)
def test_nan_weights_are_refused_naming_the_first_damaged_weight(cli, nan_model_dir, args, what):
    line = one_error_line(*cli(*args, "-m", nan_model_dir))
    assert what in line
    assert line.endswith(
        "h.1.attn.c_attn.weight): the checkpoint is damaged"
    )  # (transformer.)h.1…: ablate scans its LM model


def test_a_layer_before_the_damage_is_still_shown(cli, nan_model_dir, tiny_model_dir):
    """The NaN is in layer 1's weights: layer 0 computes before it and cannot see it, so its maps are those of the
    same tiny GPT-2 without the NaN (both built with seed 0), finite, each row summing to 1."""
    code, out, err = cli("show", CAT, "--layer", "0", "--json", "-m", nan_model_dir)
    assert code == 0, err
    sound_code, sound, _ = cli("show", CAT, "--layer", "0", "--json", "-m", tiny_model_dir)
    assert sound_code == 0
    damaged, whole = json.loads(out), json.loads(sound)
    assert damaged["maps"] == whole["maps"] and damaged["maps"]
    maps = torch.tensor(damaged["maps"], dtype=torch.float64)  # (heads, rows, keys)
    assert maps.isfinite().all() and torch.allclose(maps.sum(-1), torch.ones(()).double(), atol=1e-5)


def test_half_precision_that_overflows_is_told_to_use_float32():
    from types import SimpleNamespace

    from attnscope.analyses.common import check_finite
    from attnscope.errors import AttnscopeError

    network = torch.nn.Linear(2, 2).half()
    model = SimpleNamespace(model=network, dtype=torch.float16)
    check_finite(model, "attention", [[0.5, 0.25], [0.1, 0.0]], range(2))  # finite: nothing to say
    with pytest.raises(AttnscopeError, match=r"from layer 1 on; nothing is reported: float16 overflowed: try --dtype"):
        check_finite(model, "attention", [[0.5, 0.25], [float("inf"), 0.0]], range(2))


@pytest.mark.slow
def test_a_context_too_short_for_the_probe_skips_it_with_a_note(cli, tmp_path):
    folder = build_tiny_gpt2(tmp_path / "ctx6", n_positions=6)
    import json

    code, out, err = cli("heads", "The cat sat", "-m", folder, "--json")
    assert code == 0, err
    document = json.loads(out)
    assert any("the repeated-token probe was skipped" in note and "context of 6 tokens" in note
               for note in document["notes"])  # fmt: skip
    assert all(head["induction"] is None and head["duplicate_token"] is None for head in document["heads"])
    assert "probe" not in document["input"]
    # a context that holds a short probe gets one, and says so
    folder = build_tiny_gpt2(tmp_path / "ctx9", n_positions=9)
    code, out, err = cli("heads", "The cat sat", "-m", folder, "--json")
    document = json.loads(out)
    assert document["input"]["probe"]["period"] == 4
    assert "probe period shortened to 4 tokens to fit the context of 9 tokens" in document["notes"]


@pytest.mark.slow
def test_a_csv_with_no_rows_still_has_its_header(cli, tmp_path):
    """A layer of one head has no pair to compare: the CSV is its header line, which CSV readers accept."""
    import csv
    import io

    folder = build_tiny_gpt2(tmp_path / "one-head", n_head=1)
    code, out, err = cli("diversity", CAT, "-m", folder, "--layer", "0", "--csv")
    assert code == 0, err
    reader = csv.DictReader(io.StringIO(out))
    assert list(reader) == [] and reader.fieldnames[:2] == ["a", "b"] and "js" in reader.fieldnames


# ====================================================================================================================
# Issue 23, by kind. Each kind: what must never happen, tested on the listed case and on others of its kind.

# ------------------------------------------------------------------------------- silently wrong: configs and weights


def _copy_with_config(source: Path, folder: Path, **changes) -> Path:
    """A model folder whose weights and tokenizer are `source`'s (linked, not copied) and whose config.json has
    `changes` (None removes a key)."""
    import json

    folder.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name != "config.json":
            (folder / entry.name).symlink_to(entry)
    config = json.loads((source / "config.json").read_text())
    config.update(changes)
    config = {key: value for key, value in config.items() if value is not None}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


BAD_CONFIGS = {
    "n_head 0": ({"n_head": 0}, "n_head is 0: a layer has at least one attention head"),
    "n_head -4": ({"n_head": -4}, "n_head is -4: a layer has at least one attention head"),
    'n_head "4"': ({"n_head": "4"}, 'n_head is "4", not a whole number'),
    "n_head true": ({"n_head": True}, "n_head is True, not a whole number"),
    "n_head 3 of 32": ({"n_head": 3}, "n_embd 32 is not divisible by n_head 3: the heads cannot share the width"),
    "dtype float99": ({"dtype": "float99"}, 'dtype "float99" is not a floating-point type'),
    "n_layer 0": ({"n_layer": 0}, "n_layer is 0: a model has at least one layer"),
    "n_layer huge": ({"n_layer": 10**30}, "n_layer is a number of more than 20 digits: a model has at least one"),
    "n_positions 0": ({"n_positions": 0}, "n_positions is 0: the context holds at least one token"),
    "vocab 1.5": ({"vocab_size": 1.5}, "vocab_size is 1.5, not a whole number"),
    "n_inner -1": ({"n_inner": -1}, "n_inner is -1: the feed-forward width is at least 1"),
    "model_type 7": ({"model_type": 7}, "model_type is 7, not a name such as 'gpt2'"),
}


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("changes, problem", BAD_CONFIGS.values(), ids=BAD_CONFIGS)
def test_a_config_that_describes_no_model_is_refused_before_anything_is_built(
    cli, tiny_model_dir, tmp_path, monkeypatch, changes, problem
):
    """`info` does not print its nonsense as facts (heads −4, a negative parameter count, d_head 10.67); the
    analyses refuse it before the weights, through the same check; so does the library's loader."""
    from attnscope.models import loading

    folder = _copy_with_config(tiny_model_dir, tmp_path / "bad", **changes)
    expected = f"attnscope: error: the config.json of model '{folder}' does not describe a model: {problem}"
    line = one_error_line(*cli("info", "-m", folder))
    assert line.startswith(expected), line
    monkeypatch.setattr(loading, "_from_pretrained", lambda *a, **k: pytest.fail("transformers read the config"))
    assert one_error_line(*cli("heads", CAT, "-m", folder)).startswith(expected)
    with pytest.raises(AttnscopeError, match=re.escape(problem)):
        loading.load_model(str(folder), "cpu")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["heads", CAT, "--layer", "99"], "layer 99 is out of range (this model has layers 0-1)"),
        (["heads", CAT, "--plot", "0.9", "--out", "OUT"], "head '0.9': head 9 is out of range"),
        (["show", CAT, "--head", "0.4"], "head '0.4': head 4 is out of range"),
        (["diversity", CAT, "--layer", "2"], "layer 2 is out of range"),
        (["ablate", CAT, "--prune", "9"], "prune 9: this model has 8 heads"),
        (["report", CAT, "--threshold", "prev=0.5", "--sort", "prev"], "No such option: --sort"),
    ],
)
def test_the_models_shape_is_checked_from_its_config_before_the_weights_load(
    cli, tiny_model_dir, tmp_path, monkeypatch, args, expected
):
    from attnscope.models import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the weights loaded before the check"))
    args = [str(tmp_path / "out") if arg == "OUT" else arg for arg in args]
    assert expected in one_error_line(*cli(*args, "-m", tiny_model_dir))
    assert list(tmp_path.iterdir()) == []


def test_the_api_checks_the_models_shape_from_its_config_before_the_weights_load(tiny_model_dir, monkeypatch):
    import attnscope
    from attnscope.models import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the weights loaded before the check"))
    with pytest.raises(AttnscopeError, match=r"^layer 99 is out of range \(this model has layers 0-1\)$"):
        attnscope.heads(tiny_model_dir, CAT, layer=99)
    with pytest.raises(AttnscopeError, match=r"^head '1.7': head 7 is out of range"):
        attnscope.show(tiny_model_dir, CAT, head="1.7")


def _drop_weights(folder: Path, prefix: str) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in weights.items() if prefix not in k}, folder / "model.safetensors", {"format": "pt"})


@pytest.fixture(scope="module")
def damaged_models(tmp_path_factory) -> dict[str, Path]:
    """Checkpoints that transformers loads with some weights started from random numbers: weights missing, a
    config over other weights, a checkpoint with a layer its config lacks, a config wider than the weights."""
    import json
    import shutil

    root = tmp_path_factory.mktemp("damaged")
    base = build_tiny_gpt2(root / "base")
    made = {}
    made["missing"] = Path(shutil.copytree(base, root / "missing"))
    _drop_weights(made["missing"], "h.1.attn.c_attn")
    made["bert config"] = _copy_with_config(base, root / "bert-config", model_type="bert", architectures=["BertModel"])
    made["extra layer"] = build_tiny_gpt2(root / "three-layers", n_layer=3)
    config = json.loads((made["extra layer"] / "config.json").read_text())
    (made["extra layer"] / "config.json").write_text(json.dumps({**config, "n_layer": 2}))
    made["wider config"] = _copy_with_config(base, root / "wider", n_embd=40)
    return made


@pytest.mark.slow
@pytest.mark.parametrize(
    "damage, command, expected",
    [
        ("missing", "heads", "the checkpoint lacks 2 weights of the model its config describes (h.1.attn.c_attn.bias"),
        ("missing", "ablate", "the checkpoint lacks 2 weights of the model its config describes (transformer.h.1.attn"),
        ("bert config", "heads", "the checkpoint lacks 197 weights of the model its config describes (embeddings."),
        # 11 of layer 2's 12: transformers ignores any `attn.bias`, the name of old GPT-2 checkpoints' mask buffer
        ("extra layer", "heads", "the checkpoint holds 11 weights the config does not describe (transformer.h.2.attn"),
        ("extra layer", "ablate", "the checkpoint holds 11 weights the config does not describe (transformer.h.2.attn"),
        ("wider config", "heads", "the checkpoint's h.0.attn.c_attn.bias has shape (96,), but the config makes it"),
    ],
)
def test_weights_that_would_be_initialised_rather_than_loaded_are_refused_naming_them(
    cli, damaged_models, damage, command, expected
):
    """Today's checkpoints load with such weights filled at random: exit 0, other numbers at every run. `ablate`
    says the checkpoint is damaged, not that it has no language-model head."""
    line = one_error_line(*cli(command, CAT, "-m", damaged_models[damage]))
    assert expected in line, line
    assert "transformers would start them from random numbers" in line or "which would be left out" in line
    assert "language-model head" not in line


def test_a_base_models_unused_pooler_is_not_taken_for_a_damaged_checkpoint(tiny_bert_dir):
    """BertModel has a pooler that BertForMaskedLM checkpoints do not save: no analysis reads it."""
    from attnscope.models.loading import load_model

    assert load_model(str(tiny_bert_dir), "cpu").n_layer == 2


# ------------------------------------------------------------------------------------ silently wrong: tokenizers


def _letter_a_tokenizer():
    """A vocabulary of `a` and `b` alone, with no unknown token and no byte fallback: it drops every other
    character, so "The cat sat on the mat." becomes `a a a`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab={"<|endoftext|>": 0, "a": 1, "b": 2}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def test_text_that_the_tokenizer_drops_is_refused_or_counted():
    from types import SimpleNamespace

    from attnscope.pipeline.inputs import Text
    from attnscope.pipeline.tokens import WindowStream
    from attnscope.scores.kinds import DECODER

    model = SimpleNamespace(
        tokenizer=_letter_a_tokenizer(), n_ctx=64, kind=DECODER, model=SimpleNamespace(get_input_embeddings=None)
    )
    model.model = SimpleNamespace()  # no embeddings to compare ids with
    with pytest.raises(AttnscopeError) as raised:
        list(WindowStream(model, [Text("The cat sat on the mat.", "argument")]))
    assert str(raised.value).startswith(
        "the tokenizer cannot represent 15 of the 18 characters of text 0 (argument), e.g. 'T', 'h', 'e', 't', 'o': "
        "it has no unknown token and no byte fallback for them, so the model would see another text ('a a a')"
    )
    stream = WindowStream(model, [Text("a b a b ab ba. a", "argument")])
    assert [len(window.ids) for window in stream] == [1 + 9]
    assert stream.notes()[0].startswith("1 of 10 characters of the texts (10.0%) are represented by no token, e.g. '.'")


@pytest.mark.slow
def test_a_model_whose_tokenizer_drops_the_text_is_refused(cli, tiny_model_dir, tmp_path):
    folder = tmp_path / "letter-a"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).symlink_to(tiny_model_dir / name)
    _letter_a_tokenizer().save_pretrained(folder)
    line = one_error_line(*cli("heads", "The cat sat on the mat.", "-m", folder))
    assert "the tokenizer cannot represent 15 of the 18 characters of text 0 (argument)" in line


# ----------------------------------------------------------------------------------------- half-written output


def test_a_folder_in_the_way_of_a_file_stops_the_write_before_any_file_moves(tmp_path):
    from attnscope.output import files

    out = tmp_path / "o"
    (out / "b.png").mkdir(parents=True)
    (out / "a.json").write_text("earlier")

    def write(stage):
        return [files.write_atomic(stage / name, "new") for name in ("a.json", "b.png", "c.csv")]

    with pytest.raises(AttnscopeError, match=r"o/b.png is a folder, and b.png would replace it"):
        files.write_all(out, write)
    assert sorted(path.name for path in out.iterdir()) == ["a.json", "b.png"]  # no stage left, nothing moved
    assert (out / "a.json").read_text() == "earlier"


def test_a_move_that_fails_midway_puts_back_what_the_earlier_moves_replaced(tmp_path, monkeypatch):
    from attnscope.output import files

    out = tmp_path / "o"
    out.mkdir()
    (out / "a.json").write_text("earlier")
    real = os.replace

    def refuse_the_third(source, destination):
        if Path(destination) == out / "c.csv":  # as a file another user owns in a sticky folder
            raise PermissionError(errno.EPERM, "Operation not permitted", str(source), None, str(destination))
        return real(source, destination)

    monkeypatch.setattr(files.os, "replace", refuse_the_third)

    def write(stage):
        return [files.write_atomic(stage / name, "new") for name in ("a.json", "b.png", "c.csv")]

    with pytest.raises(AttnscopeError, match=r"cannot write to --out .*o: c.csv: Operation not permitted; nothing was"):
        files.write_all(out, write)
    assert sorted(path.name for path in out.iterdir()) == ["a.json"]
    assert (out / "a.json").read_text() == "earlier"


_WRITES_SLOWLY = """
import sys, time
from pathlib import Path
from attnscope.output import files
real, cue = files.write_all, Path(sys.argv[1])
def write_all(folder, write):
    def slowly(stage):
        written = write(stage)
        cue.write_text("writing")  # the test's cue: the files are staged, none has moved yet
        time.sleep(60)
        return written
    return real(folder, slowly)
files.write_all = write_all
sys.argv = ["attnscope", *sys.argv[2:]]
from attnscope.cli import main
main()
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="sends signals")
def test_sigterm_and_sighup_while_writing_end_like_ctrl_c_and_leave_nothing(tmp_path):
    """Killed while --out is being written: one line, the staging folder and the parent folders it made removed,
    and the exit status of a program killed by that signal (143, 129), as a shell reports it. Each run starts as
    from a terminal, SIGHUP not ignored, even where the suite itself runs under nohup (which attnscope respects)."""
    runs = {}
    for stop in (signal.SIGTERM, signal.SIGHUP):
        cue, out = tmp_path / f"cue-{stop.name}", tmp_path / stop.name / "deep" / "out"
        args = ["random-mha", "--d-model", "8", "--head-counts", "1,2", "--seq-len", "4", "--trials", "1", "--out", out]
        process = subprocess.Popen(
            [sys.executable, "-c", _WRITES_SLOWLY, cue, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
        )
        runs[stop] = (process, cue, out)
    for stop, (process, cue, _) in runs.items():
        deadline = time.monotonic() + 120
        while not cue.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cue.exists(), process.communicate()[1]
        process.send_signal(stop)
    for stop, (process, _, _) in runs.items():
        _, err = process.communicate(timeout=60)
        assert process.returncode == -stop, err
        assert err.strip().splitlines() == [f"attnscope: interrupted ({stop.name})"]
        assert not (tmp_path / stop.name).exists()  # no stage, no file, not even the folders --out made


# --------------------------------------------------------------------------------------------------- unbounded


def test_stdin_and_fifos_are_checked_while_copied():
    """`< /dev/zero` is refused at its first block, not after copying gigabytes; a stream past the cap stops."""
    from attnscope.pipeline import reading

    with open("/dev/zero", "rb") as zeros:
        with pytest.raises(AttnscopeError, match=r"^standard input looks like a binary file \(a NUL byte at byte 0\)"):
            reading._spool(zeros, "standard input")
        assert zeros.tell() <= reading.BLOCK_BYTES


def test_a_stream_past_the_cap_is_refused(monkeypatch):
    import io

    from attnscope.pipeline import reading

    monkeypatch.setattr(reading, "SPOOL_MAX_BYTES", 3 * reading.BLOCK_BYTES)
    endless = io.BytesIO(b"word " * (reading.BLOCK_BYTES))  # 5 blocks
    with pytest.raises(AttnscopeError, match=r"^standard input holds more than .* GiB, the most attnscope copies"):
        reading._spool(endless, "standard input")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_fifo_fed_zeros_is_refused_at_its_first_block(cli, tmp_path):
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        try:
            with open(fifo, "wb") as pipe:
                while True:
                    pipe.write(b"\0" * 65536)
        except (BrokenPipeError, OSError):
            return

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    line = one_error_line(*cli("heads", "--file", fifo, "-m", tmp_path / "no-model"))
    assert line.endswith("fifo looks like a binary file (a NUL byte at byte 0), not text")
    feeder.join(timeout=10)
    assert not feeder.is_alive()


@pytest.mark.parametrize(
    "args, expected",
    [
        (["random-mha", "--trials", "99999999999999999999"], "--trials 99999999999999999999: must be a whole number"),
        (["bench", "--repeats", "1000000000000"], "--repeats 1000000000000: must be a whole number from 1 to 1,000"),
        (["bench", "--warmup", "1000"], "--warmup 1000: must be a whole number from 0 to 100"),
        (["heads", CAT, "--top", "9" * 5000], "--top " + "9" * 37 + "...: must be a whole number"),
        (["attend", CAT, "--from", "cat", "--tokens", "10000000"], "--tokens 10000000: must be a whole number"),
        (["ablate", CAT, "--prune", "10000000"], "--prune 10000000: must be a whole number from 0 to 1,000,000"),
        (["random-mha", "--trials", "10000", "--seq-len", "4096", "--head-counts", "1"], "pairwise comparisons"),
    ],
)
def test_every_count_is_bounded(cli, tmp_path, args, expected):
    code, out, err = cli(*args, *([] if args[0] == "random-mha" else ["-m", tmp_path / "no-model"]))
    assert expected in one_error_line(code, out, err)


def test_a_file_that_grows_while_read_is_read_as_it_was_checked(tmp_path):
    """A log another program keeps writing would otherwise be read for ever."""
    from attnscope.pipeline import reading

    log = tmp_path / "growing.txt"
    log.write_text("The cat sat.\n\nThe dog ran.\n")
    texts = reading.read_file(str(log))
    texts.check()
    with open(log, "a") as more:
        more.write("\nWritten later.\n" * 1000)
    assert [text.text for text in texts] == ["The cat sat.", "The dog ran."]


# -------------------------------------------------------------------------------------------------- tracebacks


def test_a_jsonl_line_with_a_5000_digit_integer_is_one_line(cli, tmp_path):
    corpus = tmp_path / "big.jsonl"
    corpus.write_text('{"text": "The cat", "n": ' + "9" * 5000 + "}\n")
    line = one_error_line(*cli("heads", "--file", corpus, "-m", tmp_path / "no-model"))
    assert line.startswith(f"attnscope: error: {corpus}:1: cannot read its JSON (Exceeds the limit (4300 digits)")


def test_a_jsonl_line_without_end_is_held_to_a_bound(tmp_path, monkeypatch):
    from attnscope.pipeline import reading

    monkeypatch.setattr(reading, "LONGEST_JSON_LINE", 1000)
    corpus = tmp_path / "long.jsonl"
    corpus.write_text('{"text": "ok"}\n{"text": "' + "a" * 5000)
    with pytest.raises(AttnscopeError, match=r"long.jsonl:2: a line longer than 1,000 characters"):
        reading.read_file(str(corpus)).check()


@pytest.mark.parametrize("option", ["--out", "--model"])
def test_a_home_folder_of_no_user_is_one_line(cli, option):
    args = ["heads", CAT, "--out", "~nosuchuser-attnscope/x"] if option == "--out" else ["info"]
    if option == "--model":
        args += ["--model", "~nosuchuser-attnscope/m"]
    line = one_error_line(*cli(*args))
    assert f"{option} ~nosuchuser-attnscope/" in line and "cannot expand ~nosuchuser-attnscope (no such user" in line


@pytest.mark.parametrize("header", [b"\xff" * 8, (10).to_bytes(8, "little") + b'["a", "b"]'], ids=["0xFF...", "list"])
def test_a_safetensors_header_of_nonsense_is_no_traceback(cli, tiny_model_dir, tmp_path, header):
    import json

    folder = tmp_path / "damaged"
    folder.mkdir()
    config = json.loads((tiny_model_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "dtype"}))
    (folder / "model.safetensors").write_bytes(header + b"\0" * 64)
    code, out, err = cli("info", "-m", folder, "--json")
    assert code == 0 and json.loads(out)["model"]["dtype"] == "float32", err  # the header says nothing: the default


@pytest.mark.slow
@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_closed_standard_stream_is_one_line_and_status_2(closed):
    """`info --model demo >&-` printed a traceback; with `2>&-` every command exited 1 before doing anything and
    usage errors went to stdout."""
    if closed == "stdout":
        finished = subprocess.run(
            f"exec {sys.executable} -m attnscope info --model demo >&-", shell=True, stderr=subprocess.PIPE, text=True
        )
        assert finished.returncode == 2
        assert finished.stderr.strip().splitlines() == [
            "attnscope: error: standard output is closed (>&-): attnscope writes its results there; redirect it to a "
            "file, or to /dev/null"
        ]
        return
    command = f"exec {sys.executable} -m attnscope"
    good = subprocess.run(f"{command} info --model demo --json 2>&-", shell=True, stdout=subprocess.PIPE, text=True)
    assert good.returncode == 0 and '"n_layer": 2' in good.stdout
    usage = subprocess.run(f"{command} info --model demo --bogus 2>&-", shell=True, stdout=subprocess.PIPE, text=True)
    assert usage.returncode == 2 and usage.stdout == ""


# ---------------------------------------------------------------------------------- messages and quiet failures


def test_a_revision_of_a_folder_is_refused_rather_than_ignored(cli, tiny_model_dir):
    """transformers ignores a revision for a folder: the analysis would be of what is there, not of step1000."""
    for command in (["info"], ["heads", CAT]):
        line = one_error_line(*cli(*command, "-m", tiny_model_dir, "--revision", "step1000"))
        assert "revision (--revision) step1000: model" in line
        assert "is a folder on this machine, which has no revisions" in line


def test_control_characters_and_long_values_keep_the_message_one_readable_line(cli, tmp_path):
    line = one_error_line(*cli("heads", CAT, "-m", "no\nsuch\x1b[2J/"))
    assert "no\\nsuch\\x1b[2J" in line  # written as escapes: no second line, no cleared screen
    line = one_error_line(*cli("heads", CAT, "-m", tmp_path / "no-model", "--threshold", "a" * 100_000 + "=1"))
    assert len(line) < 300 and "threshold 'aaaa" in line


@pytest.mark.parametrize("columns", ["0", "-5", "wide", "99999999999"])
def test_an_unusable_columns_still_prints_the_table(cli, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    code, out, err = cli("info", "-m", "demo")
    assert code == 0 and "heads per layer" in out, err


def test_non_ascii_bytes_in_an_ascii_locale_blame_the_locale(monkeypatch):
    from attnscope.pipeline import inputs

    # how Python passes UTF-8 bytes it read as ASCII (LC_ALL=C, PYTHONUTF8=0): each byte a lone surrogate
    argument = "Ça va".encode().decode("ascii", "surrogateescape")
    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: "ascii")
    monkeypatch.setenv("LC_ALL", "C")
    with pytest.raises(AttnscopeError) as raised:
        inputs.valid_text(argument, "the TEXT argument")
    assert str(raised.value) == (
        "the TEXT argument holds bytes that are not ASCII (0xc3 at character 0), and the locale's encoding is ASCII "
        "(LC_ALL=C), so Python could not read them as text: use a UTF-8 locale (e.g. LC_ALL=C.UTF-8) or PYTHONUTF8=1"
    )


def test_redundant_and_cluster_at_accept_0_as_help_says():
    from attnscope.analyses.diversity import Diversity

    for name in ("redundant", "cluster_at"):
        parameter = next(p for p in _diversity_options() if p.name == name)
        assert typing.get_args(parameter.annotation)[1].parser("0") == 0.0
    assert Diversity(layer=1, redundant=0, cluster_at=0).redundant == 0.0


def _diversity_options():
    import inspect

    from attnscope import cli as cli_module

    command = next(
        info.callback for info in cli_module.app.registered_commands if info.callback.__name__ == "diversity"
    )
    return inspect.signature(command).parameters.values()


@pytest.mark.slow
def test_redundant_and_cluster_at_0_mean_no_pair_and_no_cluster(cli, tiny_model_dir):
    import json

    code, out, err = cli(
        "diversity", CAT, "-m", tiny_model_dir, "--layer", "all", "--redundant", "0", "--cluster-at", "0", "--json"
    )
    assert code == 0, err
    document = json.loads(out)
    assert document["settings"]["redundant"] == 0.0 and document["settings"]["cluster_at"] == 0.0
    # no divergence lies below 0: no pair is a near-duplicate, no cluster merges
    assert document["redundant_groups"] == [] and document["clusters"] == []


@pytest.mark.parametrize("variable", ["MPLCONFIGDIR", "HOME"])
def test_an_unusable_matplotlib_folder_is_replaced_without_a_word(tmp_path, monkeypatch, variable):
    from attnscope.cli import boundary

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    monkeypatch.delenv("MPLCONFIGDIR", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv(variable, str(a_file))
    monkeypatch.delitem(sys.modules, "matplotlib", raising=False)
    boundary._usable_matplotlib_folder()
    chosen = Path(os.environ["MPLCONFIGDIR"])
    assert chosen != a_file and chosen.is_dir() and os.access(chosen, os.W_OK)


@pytest.mark.slow
def test_a_hostile_environment_adds_nothing_to_stderr(tmp_path):
    """An ASCII locale, COLUMNS=0 and a file where matplotlib keeps its folder: the run is what it is anywhere."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "COLUMNS": "0", "MPLCONFIGDIR": str(a_file)}
    env.pop("LANG", None)
    args = ["random-mha", "--d-model", "8", "--head-counts", "1,2", "--seq-len", "4", "--trials", "1"]
    finished = subprocess.run(
        [sys.executable, "-m", "attnscope", *args, "--out", tmp_path / "o"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stderr.strip().splitlines() == [f"note: wrote 2 files to {tmp_path / 'o'}"]
    assert "heads" in finished.stdout  # the table, at the terminal's width rather than none


def test_a_long_path_with_brackets_is_printed_whole_on_one_line(cli, tiny_model_dir, tmp_path):
    """The paths `show` prints are read back by scripts: a path longer than the terminal is not cut in two, and a
    folder named like a rich style (`[red]`) is printed as it is, not taken for markup."""
    folder = tmp_path / ("a" * 100) / "[red]b"
    code, out, err = cli("show", CAT, "--layer", "1", "-m", tiny_model_dir, "--out", folder)
    assert code == 0, err
    assert out == f"{folder / 'attention_L1.png'}\n"
    assert (folder / "attention_L1.png").is_file()


# ====================================================================================================================
# Issue 30, part 2: a fourth round, by kind.

TORCHRUN_ENV = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


@pytest.fixture
def no_process_group(monkeypatch):
    """A test of torchrun's variables never waits for processes that will not come."""
    from attnscope.pipeline import distributed

    monkeypatch.setattr(distributed, "_meet", lambda place: pytest.fail("waited for the other processes"))
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: pytest.fail("joined a group"))


# ------------------------------------------------------------------------------- silent wrong answers: processes


@pytest.mark.parametrize(
    "args, expected",
    [
        (["kvplan", "-m", "TINY"], "kvplan does not share its work among torchrun's processes"),
        (["random-mha", "--trials", "1"], "random-mha does not share its work among torchrun's processes"),
    ],
)
def test_what_torchrun_would_get_wrong_or_repeat_is_refused_before_any_model(
    cli, tiny_model_dir, monkeypatch, no_process_group, args, expected
):
    """compare's divergence under torchrun was one process's share of the texts (0.1267 against 0.1184, exit 0);
    circuit, ablate, report --ablate and random-mha ran whole in every process. compare, circuit's removals, ablate's
    passes (one model's report --ablate's too) and patch's runs are shared now (tests/e2e/test_processes.py);
    kvplan and random-mha are not."""
    from attnscope.models import loading

    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("a model loaded before the refusal"))
    line = one_error_line(*cli(*[str(tiny_model_dir) if arg == "TINY" else arg for arg in args]))
    assert expected in line and ("(each of the 2 would" in line or "torchrun's 2 processes yet" in line)


def test_what_torchrun_shares_among_its_processes_is_not_refused():
    from attnscope import settings

    for allowed in (settings.Heads(), settings.Diversity(layer=1), settings.Report(), settings.Compare()):
        allowed.check_processes(2, 3)  # heads and diversity sum across processes; compare shares its models
    settings.Compare().check_processes(2, 2)  # the divergence and the loss too (each piece whole on one process)
    settings.Circuit().check_processes(2)  # the removals are shared
    settings.Report(ablate=True).check_processes(2, 2)  # several models: the last one's ablation on one process
    settings.Report(circuit=True).check_processes(2, 1)  # one model's circuit: its removals shared
    settings.Report(ablate=True).check_processes(2, 1)  # one model's ablation: its passes shared
    settings.Ablate().check_processes(2)  # its passes of configurations (the gradient's batches) go round
    settings.Patch(file="pairs.jsonl").check_processes(2)  # its batches' baselines and patched runs are shared
    settings.Circuit(method="gradient").check_processes(2)  # the batches go round the processes


def test_a_stray_rank_without_torchrun_is_ignored_with_a_note(cli, tiny_model_dir, monkeypatch):
    """`RANK=1` alone made every command skip the first window, then print nothing, exit 0."""
    import json

    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir, "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["input"]["n_windows"] == 1 and document["input"]["scored_rows"] > 0
    assert document["notes"][0].startswith("RANK=1 ignored: WORLD_SIZE is not set (torchrun sets both)")


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"WORLD_SIZE": "abc"}, "WORLD_SIZE=abc: torchrun sets it to a whole number"),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 says this is one of 2 processes, but RANK, LOCAL_RANK, MASTER_ADDR"),
        ({**TORCHRUN_ENV, "RANK": "x"}, "RANK=x: torchrun sets it to a whole number"),
        ({**TORCHRUN_ENV, "RANK": "2"}, "RANK=2 with WORLD_SIZE=2: a rank is below the number of processes"),
        (
            {**TORCHRUN_ENV, "ATTNSCOPE_RENDEZVOUS_TIMEOUT": "1m"},
            "ATTNSCOPE_RENDEZVOUS_TIMEOUT=1m: how long the processes wait for each other, in seconds (a number above 0",
        ),
    ],
)
def test_an_environment_torchrun_did_not_make_is_one_line(
    cli, tiny_model_dir, monkeypatch, no_process_group, env, expected
):
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert expected in one_error_line(*cli("heads", CAT, "-m", tiny_model_dir))


# ----------------------------------------------------------------------------- silent wrong answers: the numbers


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_texts_of_one_token_give_no_made_up_role(cli, model_dirs, kind):
    """Its only scored row looks back at the BOS ([CLS]): previous-token and first-token are one weight, and every
    head of the tiny GPT-2 was called previous-token."""
    import attnscope

    line = one_error_line(*cli("heads", "cat", "-m", model_dirs[kind]))
    assert "every window has one scored row" in line and "previous-token and first-token attention are the same" in line
    with pytest.raises(AttnscopeError, match="give texts of at least 2 tokens$"):
        attnscope.report(model_dirs[kind], ["cat", "a"])
    attnscope.heads(model_dirs[kind], ["cat", "the cat"])  # one text of two tokens gives every head real rows


@pytest.mark.slow
def test_a_window_that_holds_every_text_reports_no_local_lift(cli, fresh_loads, tiny_model_dir, tmp_path):
    """With a window as long as the texts, local is everything but the first token (checked below from the scores
    themselves), and local_lift came out −1.75, −10.06: a function of the first-token score, not of locality."""
    import json

    code, out, err = cli("heads", "The cat sat on", "-m", tiny_model_dir, "--window", "4", "--json")
    assert code == 0, err
    document = json.loads(out)
    for head in document["heads"]:
        assert head["local"] + head["first_token"] == pytest.approx(1.0, abs=1e-5)  # the window holds the rest
        assert head["local_lift"] is None and head["role"] != "local"
    assert any("local_lift (and the local role) is not reported" in note for note in document["notes"])
    code, out, err = cli("heads", "The cat sat on", "-m", tiny_model_dir, "--window", "1", "--json", "--sort", "lift")
    assert all(head["local_lift"] is not None for head in json.loads(out)["heads"])
    twin = tmp_path / "twin"  # the same weights in another folder: a second model
    twin.mkdir()
    for entry in tiny_model_dir.iterdir():
        (twin / entry.name).symlink_to(entry)
    args = ["compare", "The cat sat on", "-m", tiny_model_dir, "-m", twin, "--window", "4", "--score", "local_lift"]
    assert "score local_lift was not measured" in one_error_line(*cli(*args, "--out", tmp_path / "pictures"))


@pytest.mark.parametrize(
    "args",
    [["circuit", CAT, "--score", "local_uniform"], ["compare", CAT, "-m", "demo", "--score", "unif"]],
    ids=["circuit", "compare"],
)
def test_a_score_the_same_for_every_head_is_refused_where_heads_are_told_apart(cli, fresh_loads, tiny_model_dir, args):
    line = one_error_line(*cli(*args, "-m", tiny_model_dir))
    assert "local_uniform is the same for every head (a property of the texts, not of a head)" in line
    assert "(see: attnscope" in line  # refused with the options, before any model


def test_the_same_score_still_sorts_the_heads(cli, tiny_model_dir):
    """local_uniform is the same for every head (a property of the text): sorting by it keeps the order layer.head,
    as docs/promises.md says."""
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir, "--sort", "local_uniform", "--top", "3", "--json")
    assert code == 0, err
    heads = json.loads(out)["heads"]
    assert [head["label"] for head in heads] == ["0.0", "0.1", "0.2"]
    assert len({head["local_uniform"] for head in heads}) == 1


def test_a_nul_character_is_refused_from_every_input(cli, tmp_path, tiny_model_dir):
    """The CLI refused a file with a NUL byte; a JSON line's `\\u0000`, a Text object and a list of them went
    through."""
    import attnscope
    from attnscope.pipeline.inputs import Text

    corpus = tmp_path / "nul.jsonl"
    corpus.write_text('{"text": "The cat\\u0000 sat"}\n')
    line = one_error_line(*cli("heads", "--file", corpus, "-m", tiny_model_dir))
    assert line.endswith('nul.jsonl:1: the "text" field holds a NUL byte (character 7): it is not text')
    for given, where in [
        (Text("The\0 cat", "mine"), "the text given (TEXT)"),
        ([Text("The cat", "a"), Text("The\0 cat", "b")], "text 1 of the list"),
        (str(corpus), None),
    ]:
        with pytest.raises(AttnscopeError, match="holds a NUL byte"):
            if where is None:
                attnscope.heads(tiny_model_dir, file=given)
            else:
                attnscope.heads(tiny_model_dir, given)


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
def test_a_special_token_written_in_a_text_is_noted(cli, tiny_model_dir):
    """`<|endoftext|>` in a text is GPT-2's BOS mid-text, as its tokenizer reads it: said, with the id."""
    import json

    from transformers import AutoTokenizer

    bos = AutoTokenizer.from_pretrained(tiny_model_dir).bos_token_id
    code, out, err = cli("heads", "The cat<|endoftext|> sat on the mat.", "-m", tiny_model_dir, "--json")
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert f"the texts write 1 special token of the tokenizer (<|endoftext|> × 1 (id {bos}, the BOS)" in notes[0]
    code, out, err = cli("heads", CAT, "-m", tiny_model_dir, "--json")
    assert not any("special token" in note for note in json.loads(out)["notes"])


# ----------------------------------------------------------------------------------- clean streams, one line


@pytest.fixture(scope="module")
def infinite_head_dir(tmp_path_factory):
    """A tiny GPT-2 whose untied unembedding holds an infinity: its attention is finite, its circuits are not."""
    from transformers import GPT2LMHeadModel

    folder = build_tiny_gpt2(tmp_path_factory.mktemp("inf-head"), tie_word_embeddings=False)
    model = GPT2LMHeadModel.from_pretrained(folder)
    with torch.no_grad():
        model.lm_head.weight[5, 3] = float("inf")
    model.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_infinite_weights_leave_standard_output_to_the_result(capfd, infinite_head_dir):
    """LAPACK printed `Intel oneMKL ERROR: Parameter 3 was incorrect on entry to DGEBAL` on the C-level stdout:
    `--json > file` was corrupted. The weights are checked before any linear algebra sees them."""
    from attnscope.cli import run

    code = run(["circuit", CAT, "-m", str(infinite_head_dir), "--json", "--head", "1.0"])
    out, err = capfd.readouterr()
    assert code == 2 and out == "", out
    assert err.strip().splitlines() == [
        "attnscope: error: the weight circuits cannot be computed: the model's weights hold NaN or infinite values "
        "(first in lm_head.weight): the checkpoint is damaged"
    ]


# ------------------------------------------------------------------------------ lies refused before allocation


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"n_layer": 9999}, "its config.json describes 9,999 layers (n_layer), but the checkpoint holds 2 (h.0 to"),
        ({"n_embd": 65536}, "the checkpoint's h.0.attn.c_attn.bias has shape (96,), but the config makes it (196608,)"),
    ],
    ids=["9,999 layers", "hidden size 65,536"],
)
def test_a_config_that_claims_more_than_its_weights_is_refused_before_the_model_is_built(
    cli, tiny_model_dir, tmp_path, monkeypatch, changes, expected
):
    """9,999 layers over two allocated until memory ran out (111 s); a hidden size of 65,536 asked for 64 GiB."""
    from attnscope.models import loading

    real = loading._from_pretrained

    def config_and_tokenizer_only(name, loader, *args, **kwargs):
        assert loader.__name__ in ("AutoConfig", "AutoTokenizer"), "transformers built the model"
        return real(name, loader, *args, **kwargs)

    monkeypatch.setattr(loading, "_from_pretrained", config_and_tokenizer_only)
    folder = _copy_with_config(tiny_model_dir, tmp_path / "lie", **changes)
    line = one_error_line(*cli("heads", CAT, "-m", folder))
    assert f"model '{folder}': " in line and expected in line and "belongs to other weights" in line


def test_a_sharded_checkpoint_is_read_from_its_index(cli, tmp_path):
    import json

    from transformers import GPT2LMHeadModel

    folder = build_tiny_gpt2(tmp_path / "sharded")
    GPT2LMHeadModel.from_pretrained(folder).save_pretrained(folder, max_shard_size="20KB")
    (folder / "model.safetensors").unlink(missing_ok=True)
    assert len(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]) > 2
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_layer": 500}))
    line = one_error_line(*cli("heads", CAT, "-m", folder))
    assert "describes 500 layers (n_layer), but the checkpoint holds 2" in line
    (folder / "model.safetensors.index.json").write_text("{not json")
    line = one_error_line(*cli("heads", CAT, "-m", folder))
    assert "the model.safetensors.index.json of model" in line and "is not a valid JSON file" in line


def test_circuit_refuses_batches_that_would_not_fit_before_any_forward(cli, tiny_model_dir, monkeypatch):
    from attnscope.analyses import harness
    from attnscope.pipeline import capture

    monkeypatch.setattr(harness, "available_bytes", lambda device: 2**10)  # 1 KiB free: the tiny model needs 32 KiB
    monkeypatch.setattr(capture, "run", lambda *a, **k: pytest.fail("a forward ran before the check"))
    line = one_error_line(*cli("circuit", CAT, "-m", tiny_model_dir))
    assert "circuit keeps every layer's inputs and heads' outputs of a batch for its replays: batches of 1 × " in line
    assert "more than the 0.0 GiB available on cpu; lower batch_size or max_tokens (--batch-size, --max-tokens)" in line


# ------------------------------------------------------------------------------------- errors name the culprit


@pytest.mark.slow
@pytest.mark.parametrize("command", ["compare", "report"])
def test_a_damaged_model_among_several_is_named(cli, fresh_loads, tiny_model_dir, nan_model_dir, tmp_path, command):
    args = [command, CAT, "-m", tiny_model_dir, "-m", nan_model_dir]
    line = one_error_line(*cli(*args, *(["--out", tmp_path / "page"] if command == "report" else [])))
    assert line.startswith(f"attnscope: error: model '{nan_model_dir.name}': the model's weights hold NaN")
    assert line.endswith("h.1.attn.c_attn.weight): the checkpoint is damaged")


def _mlp_damage(command: str) -> str:
    """The refusal's words for mlp_nan_model_dir: compare scans the model with its language-model head (loaded for
    the loss), whose parameters are named from the checkpoint's top (transformer.h.1...)."""
    weight = f"{'transformer.' if command == 'compare' else ''}h.1.mlp.c_fc.weight"
    return f"the model's weights hold NaN or infinite values (first in {weight}): the checkpoint is damaged"


@pytest.mark.slow  # the library's refusals are in the everyday loop (integration/test_compare.py, test_report.py)
@pytest.mark.parametrize("command", ["compare", "report"])
@pytest.mark.parametrize("damaged_first", [True, False], ids=["damaged first", "damaged second"])
def test_a_model_whose_mlp_holds_nan_is_refused_among_several(
    cli, tiny_model_dir, mlp_nan_model_dir, tmp_path, command, damaged_first
):
    """Its maps are finite, so nothing non-finite came out: compare gave its loss as null without a word and report
    wrote the page, both with exit 0. Each model's weights are now checked as it opens, first or second."""
    models = [tiny_model_dir, mlp_nan_model_dir][:: -1 if damaged_first else 1]
    output = ["--out", tmp_path / "page"] if command == "report" else ["--json"]
    line = one_error_line(*cli(command, CAT, "-m", models[0], "-m", models[1], *output))
    assert line == f"attnscope: error: model '{mlp_nan_model_dir.name}': {_mlp_damage(command)}"
    assert list(tmp_path.iterdir()) == []  # no page, no staged file


@pytest.mark.slow
def test_one_model_whose_mlp_holds_nan_has_no_report(cli, mlp_nan_model_dir, tmp_path):
    """`heads` shows its maps, finite and true (weights are looked at once a result comes out non-finite); a page
    would pass for a sound model's, so `report` checks the weights first, and writes nothing."""
    code, out, err = cli("heads", CAT, "-m", mlp_nan_model_dir, "--json", "--no-probe")
    assert code == 0, err
    line = one_error_line(*cli("report", CAT, "-m", mlp_nan_model_dir, "--out", tmp_path / "page"))
    assert line == f"attnscope: error: {_mlp_damage('report')}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_folder_that_vanishes_during_a_run_is_said_to_be_gone(fresh_loads, tiny_model_dir, tmp_path, monkeypatch):
    """It was taken for a Hub id, and the Hub's library complained of its spelling ("Repo id must be in the
    form...")."""
    import attnscope

    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        (tmp_path / "runs" / "x" / name).mkdir(parents=True)
        for entry in tiny_model_dir.iterdir():
            (tmp_path / "runs" / "x" / name / entry.name).symlink_to(entry)
    moved = []

    def progress(*_):
        if not moved:
            moved.append(os.rename("runs/x/b", "runs/x/b-moved"))

    with pytest.raises(AttnscopeError, match=r"^model 'runs/x/b': the folder is gone \(it was there when the run"):
        attnscope.compare(["runs/x/a", "runs/x/b"], CAT, divergence=False, progress=progress)


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_no_message_repeats_a_large_object(tiny):
    """An error carried a model's repr: 3,797 characters."""
    import attnscope

    network = tiny.model
    assert len(repr(network)) > 500
    calls = [
        lambda: attnscope.heads(tiny, CAT, thresholds=network),
        lambda: attnscope.heads(tiny, CAT).save(network),
        lambda: attnscope.heads(tiny, CAT, plot=[network]),
        lambda: attnscope.heads(network, CAT),
    ]
    for call in calls:
        with pytest.raises(AttnscopeError) as raised:
            call()
        assert len(str(raised.value)) < 200 and "Embedding(" not in str(raised.value), str(raised.value)[:300]


@pytest.mark.parametrize(
    "content, expected",
    [
        ("", "the tokenizer.json of model 'broken' is not a valid JSON file (Expecting value: line 1 column 1"),
        ('{"version": "1.0"}', "cannot load the tokenizer (tokenizer.json, tokenizer_config.json) of model 'broken'"),
    ],
    ids=["empty", "not a tokenizer"],
)
def test_a_broken_tokenizer_file_is_named(cli, tiny_model_dir, tmp_path, monkeypatch, content, expected):
    folder = tmp_path / "broken"
    folder.mkdir()
    for entry in tiny_model_dir.iterdir():
        if entry.name != "tokenizer.json":
            (folder / entry.name).symlink_to(entry)
    (folder / "tokenizer.json").write_text(content)
    monkeypatch.chdir(tmp_path)
    assert expected in one_error_line(*cli("heads", CAT, "-m", "broken"))


def test_revisions_of_the_demo_say_what_the_demo_is(cli):
    for args in (["report", CAT, "--revisions", "a,b"], ["heads", CAT, "--revision", "a"]):
        line = one_error_line(*cli(*args, "-m", "demo"))
        assert "model 'demo' is the demo model bundled with attnscope, which has no revisions" in line
        assert "folder" not in line and ("revisions (--revisions) a,b" in line or "revision (--revision) a" in line)


def test_an_empty_score_is_named_as_the_score(tiny):
    import attnscope

    for call in (attnscope.circuit, attnscope.compare):
        with pytest.raises(AttnscopeError, match=r"^score '': use one of previous_token, first_token"):
            call(tiny, CAT, score="")


def test_demo_says_which_model_it_used_beside_a_demo_folder(cli, tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    code, out, err = cli("info", "-m", "demo", "--json")
    assert code == 0, err
    expected = "demo is the bundled model; the folder ./demo was not used: give ./demo to use it"
    assert json.loads(out)["notes"] == [expected] and f"note: {expected}" in err


@pytest.mark.parametrize("spelling", ["slash", "link"])
def test_report_refuses_a_model_given_twice_however_it_is_spelled(cli, tiny_model_dir, tmp_path, spelling):
    other = f"{tiny_model_dir}/" if spelling == "slash" else tmp_path / "link"
    if spelling == "link":
        other.symlink_to(tiny_model_dir)
    line = one_error_line(*cli("report", CAT, "-m", tiny_model_dir, "-m", other, "--out", tmp_path / "page"))
    assert "is given twice" in line and "give each model once" in line
    assert not (tmp_path / "page").exists()


def test_a_home_folder_of_no_user_in_a_models_name_is_one_line(cli):
    line = one_error_line(*cli("compare", CAT, "-m", "~nosuchuser-attnscope/m", "-m", "demo"))
    assert "--model ~nosuchuser-attnscope/m: cannot expand ~nosuchuser-attnscope" in line


# ------------------------------------------------------------------------------------------- narrow terminals


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize(
    "columns, args",
    [("5", ["heads", CAT]), ("20", ["circuit", CAT, "--head", "1.0"]), ("40", ["ablate", CAT])],
)
def test_a_narrow_terminal_keeps_every_cell_whole_and_says_so(cli, tiny_model_dir, monkeypatch, columns, args):
    """At COLUMNS=5 the role map was one "…" and the tables had no rows; at 20 every circuit cell was "0…"."""
    monkeypatch.setenv("COLUMNS", columns)
    code, out, err = cli(*args, "-m", tiny_model_dir)
    assert code == 0, err
    assert "…" not in out
    assert f"note: the terminal is {columns} columns wide and these tables need" in err
    assert "--json or --csv" in err
    if args[0] == "heads":
        assert "0.3" in out and "L\\H" in out  # a row of the table, the role map's header
    if args[0] == "circuit":
        assert "0.2" in out and "-0." in out  # a head removed, and its change


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_a_terminal_of_usual_width_gets_no_note(cli, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    for args in (["heads", CAT], ["ablate", CAT], ["circuit", CAT, "--head", "1.0"]):
        code, out, err = cli(*args, "-m", tiny_model_dir)
        assert code == 0 and "columns wide" not in err, err
