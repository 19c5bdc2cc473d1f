"""The reference streaming heads (tests.support.StreamingHeads, the mask hook attnscope used before its tiled
`pipeline.streaming`; DuoAttention's streaming heads) against independent facts: softmax
over a subset of keys is the full softmax renormalised over that subset, so at the first layer a streaming head's
eager weights must be its unrestricted weights renormalised over the sink and recent keys, and every other head's
must be untouched; a band that holds every key changes nothing; SDPA and eager give the same logits under the same
narrowing. And the passkey prompts: their answer is where they say, at the depth asked."""

from __future__ import annotations

import pytest
import torch

from attnscope.models.loading import load_model
from attnscope.pipeline.interventions import AttentionWeightsRecorder, attention, hooks
from attnscope.pipeline.passkey import NEEDLE, passkey_prompts, passkey_results
from tests.support import StreamingHeads

SINK, RECENT = 2, 3


@pytest.fixture(scope="module", params=["llama", "mistral"])
def loaded(request, family_dir):
    return load_model(str(family_dir(request.param)), "cpu", lm_head=True)


def _ids(loaded, n: int = 14) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(3, loaded.tokenizer.vocab_size, (2, n), generator=generator)  # (B, n)


def _first_layer_weights(loaded, ids, *narrowed):
    recorder = AttentionWeightsRecorder()
    recorder.layers = frozenset({0})
    with torch.inference_mode(), attention(loaded, "eager"), hooks(loaded, recorder, *narrowed):
        logits = loaded.lm_model(input_ids=ids).logits
    return recorder.probs[0], logits  # (B, H, n, n), (B, n, V)


def test_a_streaming_head_sees_only_its_sink_and_recent_keys(loaded):
    ids = _ids(loaded)
    B, n = ids.shape
    full, _ = _first_layer_weights(loaded, ids)
    narrowed, _ = _first_layer_weights(loaded, ids, StreamingHeads({0: [1]}, SINK, RECENT))
    query, key = torch.arange(n)[:, None], torch.arange(n)[None, :]
    band = (key <= query) & ((key < SINK) | (key > query - RECENT))  # (n, n), by the definition, here
    expected = full[:, 1] * band / (full[:, 1] * band).sum(-1, keepdim=True)  # renormalised over the band
    torch.testing.assert_close(narrowed[:, 1], expected, atol=1e-6, rtol=1e-5)
    assert (narrowed[:, 1][:, ~band] == 0).all()
    others = [head for head in range(loaded.n_head) if head != 1]
    torch.testing.assert_close(narrowed[:, others], full[:, others])
    # a row whose keys all lie in the band (the first SINK + RECENT rows) is as it was
    torch.testing.assert_close(narrowed[:, 1, : SINK + RECENT], full[:, 1, : SINK + RECENT], atol=1e-6, rtol=1e-5)


def test_a_band_that_holds_every_key_changes_nothing_and_sdpa_agrees_with_eager(loaded):
    ids = _ids(loaded)
    everyone = {layer: range(loaded.n_head) for layer in range(loaded.n_layer)}
    _, plain = _first_layer_weights(loaded, ids)
    _, wide = _first_layer_weights(loaded, ids, StreamingHeads(everyone, ids.shape[1], 0))
    torch.testing.assert_close(wide, plain, atol=1e-5, rtol=1e-5)
    streaming = StreamingHeads({0: [0, 1], loaded.n_layer - 1: [2]}, SINK, RECENT)
    _, eager = _first_layer_weights(loaded, ids, streaming)
    with torch.inference_mode(), attention(loaded, "sdpa"), hooks(loaded, streaming):
        sdpa = loaded.lm_model(input_ids=ids).logits
    torch.testing.assert_close(sdpa, eager, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(eager, plain, atol=1e-4)  # the narrowing did something


def test_passkey_prompts_hide_the_key_at_the_depth_asked_and_answer_it_last(loaded):
    tokenizer = loaded.tokenizer
    prompts = passkey_prompts(tokenizer, [700, 900], [0.0, 0.5, 1.0], trials=2, seed=3)
    assert [(p.length, p.depth) for p in prompts] == [(n, d) for n in (700, 900) for d in (0.0, 0.5, 1.0) for _ in "ab"]
    assert len({p.key for p in prompts}) == len(prompts)
    needle_starts = []
    for prompt in prompts:
        assert len(prompt.ids) <= prompt.length
        start, end = prompt.answer
        assert end == len(prompt.ids) and tokenizer.decode(prompt.ids[start:end]).strip() == str(prompt.key)
        text = tokenizer.decode(prompt.ids)
        needle = NEEDLE.format(key=prompt.key).strip()
        assert text.count(needle) == 1
        needle_starts.append(text.index(needle) / len(text))
    # depth 0 puts the needle right after the introduction, depth 1 right before the question
    for k in range(0, len(prompts), 6):
        shallow, middle, deep = needle_starts[k], needle_starts[k + 2], needle_starts[k + 4]
        assert shallow < 0.3 < middle < 0.7 < deep


@pytest.mark.slow
def test_greedy_decoding_is_what_the_passkey_check_counts(loaded):
    """The check's one forward says what greedy generation gives: a prompt passes exactly when `generate` (greedy,
    from the prompt without its answer) writes the answer's tokens."""
    prompts = passkey_prompts(loaded.tokenizer, [300], [0.5], trials=3, seed=1)
    # make one prompt's answer what this random model predicts, so that both outcomes occur
    start, end = prompts[0].answer
    with torch.inference_mode():
        ids = torch.tensor([prompts[0].ids[:start]])
        generated = loaded.lm_model.generate(ids, max_new_tokens=end - start, do_sample=False, pad_token_id=0)
    from dataclasses import replace

    prompts[0] = replace(prompts[0], ids=tuple(generated[0].tolist()))
    results = passkey_results(loaded, prompts)
    for prompt, passed in zip(prompts, results, strict=True):
        start, end = prompt.answer
        with torch.inference_mode():
            ids = torch.tensor([prompt.ids[:start]])
            out = loaded.lm_model.generate(ids, max_new_tokens=end - start, do_sample=False, pad_token_id=0)
        assert passed == (out[0, start:].tolist() == list(prompt.ids[start:end]))
    assert results[0] is True and not all(results)
