"""`Show` and `attention_maps`: the full maps of a layer for one text, against the from-scratch attention."""

from __future__ import annotations

import pytest

from attnscope.analyses.show import Show, attention_maps
from attnscope.errors import AttnscopeError
from attnscope.models.loading import load_model
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.labels import token_labels
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from tests.support import TEXTS, reference_maps


def _first_window_reference(loaded, text):
    """layer -> (H, n, n): the from-scratch maps of the first window of `text`, and that window."""
    window = tokenize(loaded, [text]).windows[0]
    batch = next(batches([window], 1, loaded.device, pad_id(loaded.tokenizer)))
    return {layer: maps[0] for layer, maps in reference_maps(loaded, batch).items()}, window


@pytest.mark.parametrize("layer, head, index", [(1, 2, 0), (0, None, 3)])
def test_show_returns_the_maps_of_the_first_window(model, layer, head, index):
    result = Show(layer=layer, head=None if head is None else f"L{layer}H{head}", index=index).run(model, TEXTS)
    reference, window = _first_window_reference(model, TEXTS[index])
    n = len(window.ids)
    assert result.attention.layer == layer and result.head == head and result.index == index
    assert result.attention.text_index == index
    assert result.attention.maps.shape == (model.n_head, n, n)  # every head, whichever one is shown
    assert float((result.attention.maps - reference[layer]).abs().max()) < 1e-5
    assert result.attention.tokens == token_labels(model.tokenizer, window.ids)
    assert result.model["kind"] == model.kind.name and result.notes == []


def test_the_maps_are_rows_of_probabilities_over_the_visible_keys(model):
    maps = Show(layer=1).run(model, TEXTS).attention.maps
    n = maps.shape[-1]
    assert float((maps.sum(-1) - 1).abs().max()) < 1e-5
    if model.kind.causal:
        # a masked key weighs at most exp(-87) / Z (blocks.LOGIT_FLOOR)
        assert float(maps.triu(diagonal=1).abs().max()) < 1e-37
    else:
        assert float(maps.triu(diagonal=1).sum()) > 0.1 * n


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_a_long_text_shows_its_first_window_only(short_context_model_dir):
    loaded = load_model(str(short_context_model_dir), "cpu")
    text = Text(" ".join(["cat"] * 40), "long")
    result = Show(layer=0).run(loaded, [text])
    reference, window = _first_window_reference(loaded, text)
    assert len(window.ids) == 16 and result.attention.maps.shape == (loaded.n_head, 16, 16)
    assert float((result.attention.maps - reference[0]).abs().max()) < 1e-5
    assert any("showing its first window only" in note for note in result.notes)
    assert any("split into windows" in note for note in result.notes)


def test_attention_maps_keeps_exactly_the_layers_asked_for(model):
    maps, notes = attention_maps(model, TEXTS[1], [1])
    reference, _ = _first_window_reference(model, TEXTS[1])
    assert set(maps) == {1} and notes == []
    assert float((maps[1].maps - reference[1]).abs().max()) < 1e-5
    both, _ = attention_maps(model, TEXTS[1], [0, 1])
    assert set(both) == {0, 1}
    assert float((both[0].maps - reference[0]).abs().max()) < 1e-5


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"layer": 2}, r"^layer 2 is out of range \(this model has layers 0-1\)$"),
        ({"head": "1.4"}, r"^head '1.4': head 4 is out of range \(this model has heads 0-3\)$"),
        ({"layer": 0, "index": 4}, r"^text index 4 is out of range \(4 texts given\)$"),
    ],
)
def test_show_refuses_what_the_model_or_texts_lack(model, settings, message):
    with pytest.raises(AttnscopeError, match=message):
        Show(**settings).run(model, TEXTS)
