"""Loading: the real from_pretrained path, base model, eval mode, eager attention, safetensors."""

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
from attnscope.model import _is_cached, load_model, resolve_device, resolve_dtype

REVISION = "0" * 40  # the commit a fake cache's refs/main points at
WEIGHTS = ("config.json", "model.safetensors")
TOKENIZER = ("tokenizer.json", "tokenizer_config.json")


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


def test_loaded_the_way_real_gpt2_is(tiny):
    from transformers import GPT2Model

    assert type(tiny.model) is GPT2Model  # no LM head: analysis does not need it
    assert not tiny.model.training
    assert tiny.model.config._attn_implementation == "eager"
    assert tiny.tokenizer.bos_token_id == 50256
    assert len(tiny.attention_modules()) == tiny.n_layer


def test_dtype_is_applied(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir), "cpu", "bfloat16")
    assert loaded.dtype == torch.bfloat16 and loaded.info()["dtype"] == "bfloat16"


def test_auto_device():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto") == "auto" and resolve_dtype("float16") is torch.float16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where CUDA is missing")
def test_cuda_without_cuda_is_a_user_error():
    with pytest.raises(AttnscopeError, match="CUDA is not available"):
        resolve_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_device_index_out_of_range():
    with pytest.raises(AttnscopeError, match="visible"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_directory_without_config(tmp_path):
    with pytest.raises(AttnscopeError, match="config.json"):
        load_model(str(tmp_path), "cpu")


def test_demo_model_missing_from_an_install_is_a_clear_error(monkeypatch, tmp_path):
    from attnscope import model

    monkeypatch.setattr(model, "demo_model_dir", lambda: tmp_path)  # an install that lost the package data
    with pytest.raises(AttnscopeError, match="demo model is not bundled in this installation"):
        load_model("demo", "cpu")


def test_fully_cached_hub_model_loads_offline_without_the_network(offline_cache, tiny_model_dir):
    hub_cache(offline_cache, tiny_model_dir, WEIGHTS + TOKENIZER)
    loaded = load_model("gpt2", "cpu")
    assert loaded.name == "gpt2" and loaded.n_layer == 2 and len(loaded.tokenizer) == 50257


@pytest.mark.parametrize("files", [TOKENIZER + ("config.json",), WEIGHTS], ids=["weights missing", "tokenizer missing"])
def test_partly_cached_hub_model_offline_is_the_offline_error(offline_cache, tiny_model_dir, files):
    hub_cache(offline_cache, tiny_model_dir, files)
    with pytest.raises(AttnscopeError, match="not in the local Hugging Face cache"):
        load_model("gpt2", "cpu")


def test_sharded_weights_are_cached_only_with_every_shard(offline_cache):
    folder = hub_cache(offline_cache, repo="sharded")
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict(zip("ab", shards))}))
    (folder / shards[0]).write_bytes(b"")
    assert not _is_cached("sharded")
    (folder / shards[1]).write_bytes(b"")
    assert _is_cached("sharded")


def test_hub_out_of_reach_with_config_cached_fails_at_once(tmp_path, tiny_model_dir):
    """The audit's case: config and tokenizer cached, weights not, HF_HUB_OFFLINE unset and no network. It used to
    retry for minutes and end on pytorch_model.bin. Run as a process, since huggingface_hub reads its environment
    once, at import."""
    hub_cache(tmp_path / "hf-home", tiny_model_dir, TOKENIZER + ("config.json",))
    unset = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE")
    env = {key: value for key, value in os.environ.items() if key not in unset}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_ENDPOINT="http://127.0.0.1:9")  # a closed port: refused at once
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "attnscope", "info", "-m", "gpt2"], capture_output=True, text=True, env=env, timeout=60
    )
    assert time.monotonic() - start < 20  # no retries
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert "not in the local Hugging Face cache" in result.stderr


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


@pytest.mark.parametrize(
    "damage, cause",
    [(damage_weights, "SafetensorError"), (damage_config, "not a valid JSON file")],
    ids=["truncated weights", "corrupt config"],
)
def test_damaged_files_are_one_line_naming_the_model_and_cause(tmp_path, tiny_model_dir, damage, cause):
    folder = shutil.copytree(tiny_model_dir, tmp_path / "damaged")
    damage(folder)
    with pytest.raises(AttnscopeError, match=f"cannot load model '{re.escape(str(folder))}': .*{cause}") as raised:
        load_model(str(folder), "cpu")
    assert "\n" not in str(raised.value)
