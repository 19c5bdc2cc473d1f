"""`kvplan` on tiny models: every head's score against the same sum computed here from transformers' eager
`output_attentions` maps, on GPT-2 (padding, several windows), and on a family with grouped-query attention and a
sliding window (Gemma 2: 4 query heads over 2 KV heads, layer 0 sliding over 4 tokens); the KV heads' scores and
the plan from them; the passkey probe; texts too short to measure."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from attnscope import api
from attnscope.errors import AttnscopeError
from attnscope.models.loading import load_model
from attnscope.pipeline import capture, distant
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.passkey import passkey_prompts
from attnscope.pipeline.reducers import DistantAttention
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from tests.support import CAT, DOCTOR, FAMILY_TEXTS, WINDOW, build_tiny_gpt2, tiles_everywhere

TEXTS = [
    Text(CAT, "a"),
    Text("Hi there", "short"),  # no row past sink + recent: never run
    Text(DOCTOR + " " + CAT + " " + DOCTOR, "b"),
]


def _by_eager_maps(model, texts, sink: int, recent: int) -> tuple[np.ndarray, int]:
    """(L, H) the mean over rows i >= sink + recent of every window of the weights on keys sink..i - recent, summed
    here from the eager maps of transformers (`output_attentions`), all windows in one padded batch; and the rows."""
    windows = tokenize(model, texts).windows
    batch = next(batches(windows, len(windows), model.device, pad_id(model.tokenizer)))
    with torch.no_grad():
        maps = model.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True
        ).attentions
    assert len(maps) == model.n_layer
    sums, rows = np.zeros((model.n_layer, model.n_head)), 0
    for window, length in enumerate(batch.lengths.tolist()):
        for i in range(sink + recent, length):
            rows += 1
            for layer, weights in enumerate(maps):
                sums[layer] += weights[window, :, i, sink : i - recent + 1].double().sum(dim=-1).numpy()
    return sums / rows, rows


@contextlib.contextmanager
def _long_rows(path: str, monkeypatch):
    """Inside the `with`, every layer goes as a long one would on the CPU by `path`: "blocks" (none is long), "tiles"
    (every block's keys in tiles of 3: tiles wholly inside the summed keys, wholly outside, across their edges) or
    "distant" (the fused kernel's logsumexp, pipeline.distant); yields the calls of the path taken."""
    calls = []
    if path == "blocks":
        yield calls
        return
    if path == "tiles":  # kvplan's reducer as it is (no expected logit in the tiles), the fused kernel's path off
        monkeypatch.setattr(distant, "KERNEL", None)
    monkeypatch.setattr(distant, "BAND_ROWS", 4)  # bands of 4 rows: several a window, a last one shorter
    taken = distant.attention
    monkeypatch.setattr(distant, "attention", lambda *args: calls.append(args[1].layer) or taken(*args))
    with tiles_everywhere() as tiled:
        yield tiled if path == "tiles" else calls
        if path == "distant":
            assert not tiled  # no block went by tiles


@pytest.mark.parametrize("path", ["blocks", "tiles", "distant"])
def test_gpt2_scores_equal_the_eager_maps_sums(tiny, path, monkeypatch):
    """Also as long rows go on the CPU: in tiles, and by the fused kernel's logsumexp (the sink's and the recent
    window's keys subtracted from 1), on a padded batch."""
    sink, recent = 2, 3
    expected, rows = _by_eager_maps(tiny, TEXTS, sink, recent)
    with _long_rows(path, monkeypatch) as taken:
        result = api.kvplan(tiny, TEXTS, sink=sink, recent=recent, batch_size=2)  # the two long texts in one batch
    assert bool(taken) == (path != "blocks")
    assert result.inputs["scored_rows"] == rows and result.inputs["n_windows"] == 3
    assert np.allclose(result.scores, expected, atol=1e-6)
    assert np.array_equal(result.kv_scores, result.scores)  # GPT-2: one KV head per query head
    assert result.sliding_windows == [None, None]
    assert any("1 window of 3 no longer than sink + recent (5 tokens) was not run" in note for note in result.notes)
    assert result.streaming_count == 4  # floor(0.5 × 8)
    streamed = {(layer, head) for layer, head in zip(*np.nonzero(~result.full), strict=True)}
    kept = {(layer, head) for layer, head in zip(*np.nonzero(result.full), strict=True)}
    assert max(result.kv_scores[lh] for lh in streamed) <= min(result.kv_scores[lh] for lh in kept)


def test_the_distant_path_leaves_the_models_output_as_eager_attention(tiny, monkeypatch):
    """pipeline.distant computes the layer's output by torch's fused kernel: the model's last hidden states on a
    padded window equal eager attention's."""
    windows = tokenize(tiny, TEXTS[2:]).windows
    batch = next(batches(windows, 1, tiny.device, pad_id(tiny.tokenizer)))
    outputs = []
    hook = tiny.model.register_forward_hook(lambda module, args, output: outputs.append(output[0]))
    try:
        with _long_rows("distant", monkeypatch) as taken:
            capture.run(tiny.model, [batch], DistantAttention(tiny.n_layer, tiny.n_head, tiny.device, 2, 3))
    finally:
        hook.remove()
    assert taken == list(range(tiny.n_layer))
    with torch.no_grad():
        eager = tiny.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)[0]
    torch.testing.assert_close(outputs[0], eager, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def gemma2(family_dir):
    return load_model(str(family_dir("gemma2")), "cpu")


@pytest.fixture(scope="module")
def llama(family_dir):
    return load_model(str(family_dir("llama")), "cpu")


@pytest.mark.parametrize("path", ["blocks", "tiles", "distant"])
def test_grouped_query_attention_by_each_path_against_the_eager_maps(llama, path, monkeypatch):
    """Llama: 4 query heads over 2 KV heads, a padded batch; the fused kernel's path takes each KV head for the query
    heads that read it, in a row."""
    assert llama.n_head == 2 * llama.n_kv_head
    sink, recent = 1, 2
    expected, rows = _by_eager_maps(llama, FAMILY_TEXTS, sink, recent)
    with _long_rows(path, monkeypatch) as taken:
        result = api.kvplan(llama, FAMILY_TEXTS, sink=sink, recent=recent, batch_size=8)
    assert bool(taken) == (path != "blocks")
    assert result.inputs["scored_rows"] == rows
    assert np.allclose(result.scores, expected, atol=1e-6)


@pytest.mark.parametrize("tiled", [False, True], ids=["blocks", "tiles"])
def test_grouped_query_attention_and_a_sliding_window_against_the_eager_maps(gemma2, tiled):
    """Gemma 2's layer 0 slides over WINDOW tokens: a row sees keys i - 3 .. i, so only some of the keys after the
    sink and before the recent window carry weight; 4 query heads share 2 KV heads, whose score is the larger of
    their two. Also with every block's keys in tiles of 3."""
    assert (gemma2.n_head, gemma2.n_kv_head) == (4, 2)
    sink, recent = 1, 2
    expected, rows = _by_eager_maps(gemma2, FAMILY_TEXTS, sink, recent)
    with tiles_everywhere() if tiled else contextlib.nullcontext([]) as tiled_blocks:
        result = api.kvplan(gemma2, FAMILY_TEXTS, sink=sink, recent=recent, streaming=0.75, context=1000)
    assert bool(tiled_blocks) == tiled
    assert result.inputs["scored_rows"] == rows
    assert np.allclose(result.scores, expected, atol=1e-5)
    assert result.kv_scores.shape == (2, 2)
    assert np.allclose(result.kv_scores, np.maximum(expected[:, 0::2], expected[:, 1::2]), atol=1e-5)  # 0,1 | 2,3
    assert result.sliding_windows == [WINDOW, None]
    assert result.streaming_count == 3  # floor(0.75 × 4)
    lowest = sorted(result.ranked(), key=lambda lh: result.kv_scores[lh])[:3]
    assert set(lowest) == {(int(a), int(b)) for a, b in zip(*np.nonzero(~result.full), strict=True)}
    # by hand: layer 0 holds its window of 4 positions per head, full or streaming (min(4, 3) = 3 when streaming)
    d, element = gemma2.d_head, gemma2.dtype.itemsize
    held = [(int(row.sum()), positions) for row, positions in zip(result.full, (4, 1000), strict=True)]
    planned = 2 * d * element * sum(full * positions + (2 - full) * min(positions, 3) for full, positions in held)
    assert result.memory["full_bytes"] == 2 * d * element * 2 * (4 + 1000)
    assert result.memory["plan_bytes"] == planned
    assert any("1 layer already slides with the model's own window" in note for note in result.notes)


def test_the_probe_scores_the_rows_that_predict_the_passkey(tiny):
    """The probe without a text: eight passkey prompts as long as the context allows, the needle at k/9 of the
    filler, each scored at the rows whose next token is the passkey's, against the same sum from the eager maps."""
    sink, recent = 4, 8
    result = api.kvplan(tiny, sink=sink, recent=recent, batch_size=3)  # batches of 3, 3 and 2 prompts
    prompts = passkey_prompts(tiny.tokenizer, [tiny.n_ctx], [k / 9 for k in range(1, 9)], 1, seed=1)
    sums, rows = np.zeros((tiny.n_layer, tiny.n_head)), 0
    for prompt in prompts:
        start, end = prompt.answer
        with torch.no_grad():
            maps = tiny.model(input_ids=torch.tensor([prompt.ids[: end - 1]]), output_attentions=True).attentions
        for i in range(start - 1, end - 1):  # the rows that predict the answer's tokens
            rows += 1
            for layer, weights in enumerate(maps):
                sums[layer] += weights[0, :, i, sink : i - recent + 1].double().sum(dim=-1).numpy()
    assert result.inputs["sources"] == ["probe: passkey prompts"] and result.inputs["n_windows"] == 8
    assert result.inputs["scored_rows"] == rows == sum(prompt.answer[1] - prompt.answer[0] for prompt in prompts)
    assert result.inputs["probe"]["length"] == tiny.n_ctx == 128 and result.inputs["probe"]["seed"] == 1
    assert np.allclose(result.scores, sums / rows, atol=1e-6)
    assert result.notes[0].startswith("no text was given: the scores are from the passkey probe, 8 prompts of 128")


def test_texts_too_short_to_measure_are_one_line(tiny):
    with pytest.raises(AttnscopeError) as raised:
        api.kvplan(tiny, [CAT, "Hi"], sink=8, recent=16)
    message = str(raised.value)
    assert message.startswith("no text is longer than sink + recent (8 + 16 = 24 tokens, --sink and --recent; the ")
    assert "longest window is 12 tokens, the model's context 128)" in message and "\n" not in message


def _windows_of(config, n_layer: int) -> list[int | None]:
    """Each layer's own sliding window by the family's config (tests.support.visible_keys's rule)."""
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    return [window if types is None or types[layer] == "sliding_attention" else None for layer in range(n_layer)]


@pytest.mark.parametrize(
    "name",
    [
        "mistral",  # every layer slides, 4 query heads over 2 KV heads
        pytest.param("gpt_oss", marks=pytest.mark.slow),  # learned sinks: each row's weights sum to less than 1
        pytest.param("qwen2", marks=pytest.mark.slow),  # the layers past max_window_layers slide
        pytest.param("gemma3_text", marks=pytest.mark.slow),
    ],
)
def test_the_families_scores_kv_heads_and_windows_against_the_eager_maps(family_dir, name):
    model = load_model(str(family_dir(name)), "cpu")
    expected, rows = _by_eager_maps(model, FAMILY_TEXTS, 1, 2)
    result = api.kvplan(model, FAMILY_TEXTS, sink=1, recent=2)
    assert result.inputs["scored_rows"] == rows
    assert np.allclose(result.scores, expected, atol=1e-5)
    group = model.n_head // model.n_kv_head
    assert np.allclose(result.kv_scores, expected.reshape(model.n_layer, model.n_kv_head, group).max(-1), atol=1e-5)
    assert result.sliding_windows == _windows_of(model.config, model.n_layer)
    assert result.sliding_windows == [layer["window"] for layer in model.attention_layers()]  # what `info` says


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_a_context_too_short_for_the_probe_is_one_line(tmp_path):
    """A model whose context cannot hold one passkey prompt (its fixed parts take ~60 tokens with GPT-2's
    tokenizer): the probe is refused in one line that says to give texts; texts still work."""
    model = load_model(str(build_tiny_gpt2(tmp_path / "short", n_positions=40)))
    with pytest.raises(AttnscopeError) as raised:
        api.kvplan(model, sink=2, recent=4)
    message = str(raised.value)
    assert message.startswith("kvplan's passkey probe (no TEXT or --file) cannot fit the model's context of 40 tokens")
    assert message.endswith("give TEXT or --file") and "\n" not in message
    assert api.kvplan(model, [CAT + " " + DOCTOR], sink=2, recent=4).inputs["n_windows"] >= 1
