"""`attnscope info`'s `layers`: each layer's attention (full or a sliding window, soft-capping, QK-norm, sinks,
key/value heads), from a folder's config.json alone and from the loaded model alike, against what is independent of
attnscope's reading: the config's own fields, the modules transformers built, and which keys the eager maps
weigh."""

from __future__ import annotations

import shutil

import pytest
import torch

import attnscope
from attnscope.models.loading import load_model
from tests.support import FAMILY_MODELS, FAMILY_TEXTS, WINDOW

ENCODERS = {name for name, (_, style, _) in FAMILY_MODELS.items() if style in ("wordpiece", "roberta")}
QK_NORMS = {"q_norm", "q_layernorm", "query_layernorm"}  # the families' names for the queries' norm


@pytest.fixture(scope="module")
def loaded(family_dir):
    models = {}

    def model(name):
        if name not in models:
            models[name] = load_model(str(family_dir(name)), "cpu")
        return models[name]

    return model


def _by_the_config(config) -> list[dict]:
    """Each layer's attention from the config's own fields (tests.support.visible_keys's rule for the window)."""
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if config.model_type == "qwen2" and not config.use_sliding_window:
        window = None
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    cap = getattr(config, "attn_logit_softcapping", None)
    return [
        {
            "layer": layer,
            "attention": "full" if window is None or (types and types[layer] != "sliding_attention") else "sliding",
            "window": None if window is None or (types and types[layer] != "sliding_attention") else window,
            "softcap": cap,
            "sinks": config.model_type == "gpt_oss",
            "kv_heads": kv_heads,
            "query_heads_per_kv_head": config.num_attention_heads // kv_heads,
        }
        for layer in range(config.num_hidden_layers)
    ]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("gemma2", ["sliding", "full"]),  # alternating, soft-capped
        pytest.param("gemma3_text", ["sliding", "full"], marks=pytest.mark.slow),  # alternating, QK-norm
        pytest.param("gpt_oss", ["sliding", "full"], marks=pytest.mark.slow),  # alternating, learned sinks
        pytest.param("qwen2", ["full", "sliding"], marks=pytest.mark.slow),  # the layers past max_window_layers
        pytest.param("mistral", ["sliding", "sliding"], marks=pytest.mark.slow),  # every layer
        pytest.param("modernbert", ["full", "sliding", "full"], marks=pytest.mark.slow),  # local encoder layers
    ],
)
def test_each_layers_attention_from_the_folder_and_from_the_loaded_model(loaded, family_dir, tmp_path, name, expected):
    model = loaded(name)
    shutil.copy(family_dir(name) / "config.json", tmp_path / "config.json")  # the config alone: no weights
    from_folder = attnscope.info(tmp_path, device="cpu").layers
    from_model = attnscope.info(model).layers
    assert from_folder == from_model == model.attention_layers()
    assert [layer["attention"] for layer in from_model] == expected
    assert {layer["window"] for layer in from_model if layer["attention"] == "sliding"} <= {WINDOW, WINDOW // 2}
    without_qk_norm = [{key: value for key, value in layer.items() if key != "qk_norm"} for layer in from_model]
    assert without_qk_norm == _by_the_config(model.config)
    document = attnscope.info(model).to_document()
    assert document["layers"] == from_model and "layers" not in document["model"]


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=() if name == "gemma2" else pytest.mark.slow) for name in FAMILY_MODELS],
)
def test_each_layers_attention_is_what_the_model_does(loaded, name):
    """Every family: the keys each layer's eager maps weigh (all of a row's keys up to itself, the last W of them in
    a sliding layer, |i - j| <= W in an encoder's local layer), the norms on queries and keys and the sinks among
    the attention modules transformers built, the soft cap the attention modules apply."""
    model = loaded(name)
    layers = model.attention_layers()
    ids = model.tokenizer(FAMILY_TEXTS[2].text, return_tensors="pt")["input_ids"]  # longer than every window
    n = ids.shape[1]
    with torch.no_grad():
        maps = model.model(input_ids=ids, output_attentions=True).attentions  # each (1, H, n, n)
    row = n // 2 if name in ENCODERS else n - 1
    for layer, attention, module in zip(layers, maps, model.family.attention_modules(model.model), strict=True):
        seen = int((attention[0, 0, row] > 0).sum())
        if layer["attention"] == "full":
            assert seen == n, (name, layer)
        elif name in ENCODERS:
            assert seen == 2 * layer["window"] + 1, (name, layer)
        else:
            assert seen == layer["window"] < n, (name, layer)
        children = {child for child, _ in module.named_children()}
        assert layer["qk_norm"] == bool(children & QK_NORMS), (name, layer)
        assert layer["sinks"] == any(parameter == "sinks" for parameter, _ in module.named_parameters())
        assert layer["softcap"] == getattr(module, "attn_logit_softcapping", None)
        assert layer["kv_heads"] * layer["query_heads_per_kv_head"] == model.n_head


def test_the_terminal_shows_an_alternating_models_layers(cli, family_dir):
    code, out, err = cli("info", "-m", family_dir("gemma2"), "--device", "cpu")
    assert code == 0, err
    lines = [" ".join(line.strip("│ ").split()) for line in out.splitlines()]
    start = lines.index("attention │ layer 0: sliding window of 4 tokens")
    assert lines[start - 1 : start + 3] == [
        "heads per layer │ 4 (sharing 2 key/value heads, 2 query heads each)",
        "attention │ layer 0: sliding window of 4 tokens",
        "layer 1: full causal attention",
        "every layer: logits soft-capped at ±2",
    ]


def test_gpt2_from_its_config_alone_is_full_causal_attention_on_every_layer(tiny_model_dir, tiny):
    layers = attnscope.info(tiny_model_dir, device="cpu").layers
    assert layers == tiny.attention_layers() == [
        {"layer": layer, "attention": "full", "window": None, "softcap": None, "qk_norm": False, "sinks": False,
         "kv_heads": 4, "query_heads_per_kv_head": 1}
        for layer in range(2)
    ]  # fmt: skip
