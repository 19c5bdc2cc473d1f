"""Loading: the real from_pretrained path (base model, eval mode, eager attention, safetensors), the family and kind
of each model, the Hugging Face cache offline, and one-line errors for what a user can get wrong."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
import torch

from attnscope.errors import AttnscopeError
from attnscope.models import loading
from attnscope.models.families import family_of
from attnscope.models.loading import load_model, resolve_device, resolve_dtype
from attnscope.models.locating import is_cached
from attnscope.scores.kinds import DECODER, ENCODER

REVISION = "0" * 40  # the commit a fake cache's refs/main points at
WEIGHTS = ("config.json", "model.safetensors")
TOKENIZER = ("tokenizer.json", "tokenizer_config.json")
D_MODEL = 32  # the tiny models' width (tests.support)


def hub_cache(hf_home, model_dir=None, files=(), repo="gpt2"):
    """`files` of a saved model laid out as huggingface_hub caches repo `repo` under HF_HOME:
    hub/models--{repo}/refs/main holds the commit, hub/models--{repo}/snapshots/<commit>/ the files (returned)."""
    folder = hf_home / "hub" / f"models--{repo}"
    snapshot = folder / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(REVISION)
    for name in files:
        shutil.copy(model_dir / name, snapshot / name)
    return snapshot


@pytest.fixture
def offline_cache(monkeypatch, tmp_path):
    """An empty cache under tmp_path, with HF_HUB_OFFLINE on, and any network connection failing the test.

    huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when first imported, so its constants are set as well."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def no_network(*args, **kwargs):
        raise AssertionError("offline loading touched the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    return tmp_path


# ------------------------------------------------------------------------------------ families and kinds


def _architecture(kind):
    """Written out from transformers' own class layouts, not from the family table: the base model class, the
    LM-head class, each layer's attention module and the module the heads' outputs enter (W_O)."""
    from transformers import BertForMaskedLM, BertModel, GPT2LMHeadModel, GPT2Model

    if kind == "decoder":
        return GPT2Model, GPT2LMHeadModel, lambda m: [b.attn for b in m.h], lambda m: [b.attn.c_proj for b in m.h]
    return (
        BertModel,
        BertForMaskedLM,
        lambda m: [layer.attention.self for layer in m.encoder.layer],
        lambda m: [layer.attention.output.dense for layer in m.encoder.layer],
    )


FAMILY = {"decoder": ("GPT-2", DECODER, "gpt2"), "encoder": ("BERT", ENCODER, "bert")}


def test_loaded_the_way_real_models_are(model, kind):
    base_class, _, attention_of, _ = _architecture(kind)
    assert type(model.model) is base_class  # no LM head: analysis does not need it
    assert model.lm_model is None
    assert not model.model.training
    assert model.model.config._attn_implementation == "eager"
    attention = model.family.attention_modules(model.model)
    assert len(attention) == model.n_layer == 2
    assert all(a is b for a, b in zip(attention, attention_of(model.model), strict=True))
    if kind == "decoder":
        assert model.tokenizer.bos_token_id == 50256  # the real GPT-2 vocabulary's <|endoftext|>


def test_the_family_and_kind_of_each_tiny_model(model, kind):
    name, expected_kind, model_type = FAMILY[kind]
    *_, projection_of = _architecture(kind)
    assert model.family.name == name and model.kind is expected_kind and model.kind.name == kind
    assert model.kind.causal == (kind == "decoder")
    assert family_of(model.config) is model.family
    projections = model.family.output_projections(model.model)
    assert len(projections) == model.n_layer
    assert all(a is b for a, b in zip(projections, projection_of(model.model), strict=True))
    # every projection takes the heads' outputs side by side: d_model inputs
    assert all(p.weight.shape == (D_MODEL, D_MODEL) for p in projections)


def test_info_reports_the_kind_and_counts_the_attention_parameters(model, kind):
    info = model.info()
    _, _, model_type = FAMILY[kind]
    assert info["kind"] == kind and info["model_type"] == model_type
    assert (info["n_layer"], info["n_head"], info["d_model"], info["d_head"]) == (2, 4, D_MODEL, D_MODEL // 4)
    assert info["n_ctx"] == (128 if kind == "decoder" else 64)
    assert info["vocab_size"] == len(model.tokenizer)
    # W_Q, W_K, W_V, W_O (d × d each) and their biases, counted from the first layer's own modules
    assert info["attention_params"] == info["attention_params_formula"] == 4 * D_MODEL * D_MODEL + 4 * D_MODEL
    assert info["n_params"] == sum(p.numel() for p in model.model.parameters())
    assert info["device"] == "cpu" and info["dtype"] == "float32"


def test_with_its_language_model_head_the_base_model_is_the_one_analysed(model_dir, kind):
    _, lm_class, _, _ = _architecture(kind)
    loaded = load_model(str(model_dir), "cpu", lm_head=True)
    assert type(loaded.lm_model) is lm_class and not loaded.lm_model.training
    assert loaded.model is loaded.lm_model.base_model
    assert loaded.kind.name == kind and loaded.n_layer == 2


@pytest.mark.parametrize(
    "config_class, why",
    [
        ("GPTJConfig", "its attention does not go through transformers' attention interface"),
        ("T5Config", "it is not supported yet"),
    ],
)
def test_an_unsupported_config_is_one_line_naming_the_supported_families(config_class, why):
    import transformers

    config = getattr(transformers, config_class)()
    with pytest.raises(AttnscopeError) as raised:
        family_of(config)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"model type '{config.model_type}': {why}")
    from attnscope.models.families import FAMILIES

    assert all(f"{family.name} ({', '.join(family.model_types)})" in message for family in FAMILIES)


def test_loading_an_unsupported_family_is_refused_before_its_weights(tmp_path, tiny_model_dir):
    from transformers import GPTJConfig

    GPTJConfig(n_embd=32, n_layer=1, n_head=4).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the family is checked first
    shutil.copy(tiny_model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    with pytest.raises(AttnscopeError, match=r"^model type 'gptj': its attention does not go through"):
        load_model(str(tmp_path), "cpu")


# --------------------------------------------------------------------------------------- devices and dtypes


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_dtype_is_applied(model_dir):
    loaded = load_model(str(model_dir), "cpu", "bfloat16")
    assert loaded.dtype == torch.bfloat16 and loaded.info()["dtype"] == "bfloat16"
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())


def test_auto_device():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    assert resolve_dtype("auto") == "auto" and resolve_dtype("float16") is torch.float16


@pytest.mark.parametrize(
    "resolve, spec, message",
    [
        (resolve_device, "tpu", "unknown device 'tpu': use auto, cpu, cuda or cuda:N"),
        (resolve_dtype, "float8", "unknown dtype 'float8': use one of auto, float32, float16, bfloat16"),
    ],
)
def test_unknown_device_or_dtype(resolve, spec, message):
    with pytest.raises(AttnscopeError, match=re.escape(message)):
        resolve(spec)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where CUDA is missing")
def test_cuda_without_cuda_is_a_user_error():
    with pytest.raises(AttnscopeError, match="CUDA is not available"):
        resolve_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_device_index_out_of_range():
    with pytest.raises(AttnscopeError, match="visible"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


# ----------------------------------------------------------------------------------------- local folders


def test_directory_without_config(tmp_path):
    with pytest.raises(AttnscopeError, match="config.json"):
        load_model(str(tmp_path), "cpu")


def test_missing_directory_is_named_by_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AttnscopeError, match=re.escape(f"no such model directory: {tmp_path / 'nope'}")):
        load_model("./nope", "cpu")


def test_pickle_only_checkpoint_is_refused(tmp_path, tiny_model_dir):
    shutil.copy(tiny_model_dir / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(AttnscopeError, match=r"holds only a pickle checkpoint \(pytorch_model.bin\)"):
        load_model(str(tmp_path), "cpu")


def test_demo_model_missing_from_an_install_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(loading, "demo_model_dir", lambda: tmp_path)  # an install that lost the package data
    with pytest.raises(AttnscopeError, match="demo model is not bundled in this installation"):
        load_model("demo", "cpu")


def test_directory_without_tokenizer_files(tmp_path, tiny_model_dir):
    for name in WEIGHTS:
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    with pytest.raises(AttnscopeError, match=f"{re.escape(str(tmp_path))} holds no tokenizer files"):
        load_model(str(tmp_path), "cpu")


def test_empty_tokenizer_is_refused(tmp_path, tiny_model_dir):
    for name in WEIGHTS:
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    (tmp_path / "vocab.txt").write_text("[UNK]\n")  # BERT's vocabulary file: GPT-2's tokenizer finds none of its own
    with pytest.raises(AttnscopeError, match="model '.*' has no usable tokenizer"):
        load_model(str(tmp_path), "cpu")


def damage_weights(folder):
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:100])


def damage_config(folder):
    (folder / "config.json").write_text('{"model_type": "gpt2", ')


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize(
    "damage, cause",
    [(damage_weights, "SafetensorError"), (damage_config, "not a valid JSON file")],
    ids=["truncated weights", "corrupt config"],
)
def test_damaged_files_are_one_line_naming_the_model_and_cause(tmp_path, tiny_model_dir, damage, cause):
    folder = shutil.copytree(tiny_model_dir, tmp_path / "damaged")
    damage(folder)
    with pytest.raises(AttnscopeError, match=f"model '{re.escape(str(folder))}'.*{cause}") as raised:
        load_model(str(folder), "cpu")
    assert "\n" not in str(raised.value)


# ------------------------------------------------------------------------------------ the Hub cache, offline

REPO = {"decoder": "gpt2", "encoder": "bert-base-uncased"}


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_fully_cached_hub_model_loads_offline_without_the_network(offline_cache, model_dir, model, kind):
    hub_cache(offline_cache, model_dir, sorted(p.name for p in model_dir.iterdir()), repo=REPO[kind])
    loaded = load_model(REPO[kind], "cpu")
    assert loaded.name == REPO[kind] and loaded.n_layer == 2 and loaded.kind.name == kind
    assert len(loaded.tokenizer) == len(model.tokenizer) == (50257 if kind == "decoder" else model.config.vocab_size)


@pytest.mark.parametrize("files", [TOKENIZER + ("config.json",), WEIGHTS], ids=["weights missing", "tokenizer missing"])
def test_partly_cached_hub_model_offline_is_the_offline_error(offline_cache, tiny_model_dir, files):
    hub_cache(offline_cache, tiny_model_dir, files)
    with pytest.raises(AttnscopeError, match="not in the local Hugging Face cache"):
        load_model("gpt2", "cpu")


def test_sharded_weights_are_cached_only_with_every_shard(offline_cache):
    folder = hub_cache(offline_cache, repo="sharded")
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": dict(zip("ab", shards, strict=True))})
    )
    (folder / shards[0]).write_bytes(b"")
    assert not is_cached("sharded")
    (folder / shards[1]).write_bytes(b"")
    assert is_cached("sharded")


@pytest.mark.slow
def test_hub_out_of_reach_with_config_cached_fails_at_once(tmp_path, tiny_model_dir):
    """Config and tokenizer cached, weights not, HF_HUB_OFFLINE unset and no network: it used to retry for minutes
    and end on pytorch_model.bin. Run as a process, since huggingface_hub reads its environment once, at import.
    `info`, which reads the config alone, has all it needs."""
    hub_cache(tmp_path / "hf-home", tiny_model_dir, TOKENIZER + ("config.json",))
    unset = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE")
    env = {key: value for key, value in os.environ.items() if key not in unset}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_ENDPOINT="http://127.0.0.1:9")  # a closed port: refused at once
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "attnscope", "heads", "Hello there", "-m", "gpt2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert time.monotonic() - start < 20  # no retries
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert "not in the local Hugging Face cache" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "attnscope", "info", "-m", "gpt2", "--json"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"]["n_params"] == load_model(str(tiny_model_dir), "cpu").info()["n_params"]


# --------------------------------------------------------------------------------- revisions and device maps


@pytest.mark.slow
def test_a_revision_loads_that_revisions_weights_offline(offline_cache, tmp_path_factory):
    """`revision` names a Hub branch or tag (Pythia's training checkpoints: step1000): the cache holds two snapshots
    of one repository, main and step1000, with different weights, and each revision loads its own."""
    from tests.support import build_tiny_gpt2

    repo = "EleutherAI/pythia-tiny"
    snapshots = {}
    for seed, revision in enumerate(("main", "step1000")):
        source = build_tiny_gpt2(tmp_path_factory.mktemp(f"rev-{revision}"), seed=seed)
        commit = f"{seed + 1}" * 40
        folder = offline_cache / "hub" / f"models--{repo.replace('/', '--')}"
        (folder / "snapshots" / commit).mkdir(parents=True)
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / revision).write_text(commit)
        for file in source.iterdir():
            shutil.copy(file, folder / "snapshots" / commit / file.name)
        snapshots[revision] = load_model(str(source), "cpu")
    for revision, expected in snapshots.items():
        loaded = load_model(repo, "cpu", revision=revision)
        got, want = loaded.model.h[0].attn.c_attn.weight, expected.model.h[0].attn.c_attn.weight
        assert torch.equal(got, want), revision
    with pytest.raises(AttnscopeError, match="at revision 'step2000' is not in the local Hugging Face cache"):
        load_model(repo, "cpu", revision="step2000")


@pytest.mark.slow
def test_a_device_map_spreads_the_model_through_accelerate(tiny_model_dir, tiny, monkeypatch):
    """With accelerate installed (the `big` extra), `device_map="auto"` goes to from_pretrained, the model stays
    where accelerate put it (all on the GPU where there is one, on the CPU otherwise) and the analysis gives the
    numbers of a plain load."""
    pytest.importorskip("accelerate")
    from attnscope import api
    from attnscope.models import loading
    from tests.support import TEXTS

    asked = []
    real = loading._from_pretrained
    monkeypatch.setattr(loading, "_from_pretrained", lambda *a, **options: asked.append(options) or real(*a, **options))
    mapped = load_model(str(tiny_model_dir), "cpu", device_map="auto")
    assert asked[-1]["device_map"] == "auto"
    assert mapped.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    plain, spread = api.heads(tiny, TEXTS, probe=False), api.heads(mapped, TEXTS, probe=False)
    for a, b in zip(plain.heads, spread.heads, strict=True):
        assert a.scores == pytest.approx(b.scores, abs=1e-6)


def test_a_device_map_without_accelerate_is_one_line(tiny_model_dir, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(AttnscopeError, match=r"pip install 'attnscope\[big\]'"):
        load_model(str(tiny_model_dir), "cpu", device_map="auto")


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_bfloat16_runs_on_the_cpu_with_float32_statistics(tiny_model_dir, tiny):
    """`dtype="bfloat16"` on the CPU: the model is bfloat16, softmax and the statistics float32; the numbers stay
    within bfloat16's rounding of the float32 model's (8 bits of mantissa: about 1e-2 relative)."""
    from attnscope import api
    from tests.support import TEXTS

    half = load_model(str(tiny_model_dir), "cpu", "bfloat16")
    assert half.dtype == torch.bfloat16 and half.info()["dtype"] == "bfloat16"
    full, low = api.heads(tiny, TEXTS, probe=False), api.heads(half, TEXTS, probe=False)
    for a, b in zip(full.heads, low.heads, strict=True):
        for score in ("previous_token", "first_token", "self", "confidence", "entropy_normalized"):
            assert b.scores[score] == pytest.approx(a.scores[score], abs=0.05), (a.label, score)


def test_a_checkpoint_without_its_language_model_head_is_refused_for_losses(tmp_path, tiny_bert_dir):
    """A base-model checkpoint (no masked-LM head) analyses as any other, but a loss would come from a head that
    transformers starts at random: `lm_head=True` refuses it, naming a missing weight."""
    from transformers import BertModel

    BertModel.from_pretrained(tiny_bert_dir).save_pretrained(tmp_path)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        if (tiny_bert_dir / name).exists():
            shutil.copy(tiny_bert_dir / name, tmp_path / name)
    assert load_model(str(tmp_path), "cpu").n_layer == 2
    with pytest.raises(AttnscopeError, match=r"has no masked language-model head, whose .* e\.g\. cls\.predictions"):
        load_model(str(tmp_path), "cpu", lm_head=True)
    # attnscope.load, by default with the head where the checkpoint has one, takes the base model alone here
    import attnscope

    assert attnscope.load(tmp_path, "cpu").lm_model is None
    with pytest.raises(AttnscopeError, match="has no masked language-model head"):
        attnscope.load(tmp_path, "cpu", lm_head=True)
    assert attnscope.load(tiny_bert_dir, "cpu").lm_model is not None  # a checkpoint with its head: loaded with it


@pytest.mark.slow
def test_a_model_loaded_as_the_readme_loads_it_serves_every_command():
    """`attnscope.load("demo")`, then `patch`: it once asked for lm_head=True (issue 38); the result is the one the
    model given by name gives."""
    import attnscope

    pair = dict(
        clean="The list holds the value method. The list holds the value", answer="method", wrong="table",
        corrupt="The list holds the value table. The list holds the value",
    )  # fmt: skip
    model = attnscope.load("demo", "cpu")
    assert model.lm_model is not None
    assert attnscope.patch(model, **pair).to_json() == attnscope.patch("demo", **pair, device="cpu").to_json()
    assert attnscope.load("demo", lm_head=False).lm_model is None
