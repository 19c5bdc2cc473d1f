"""Loading: the real from_pretrained path, base model, eval mode, eager attention, safetensors."""

import pytest
import torch

from attnscope.errors import AttnscopeError
from attnscope.model import load_model, resolve_device, resolve_dtype


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
