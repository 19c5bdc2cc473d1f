"""pipeline.streaming's attention function on random tensors against attention written from scratch (every key's
logit, the band as a mask, softmax): grouped-query attention, the causal triangle or a padding mask, Gemma's soft cap,
gpt-oss's sinks, blocks of several sizes; the keys a block gathers; and RULER's multi-key needle prompts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnscope.errors import AttnscopeError
from attnscope.pipeline import streaming
from attnscope.pipeline.passkey import MULTIKEY_KEYS, MULTIKEY_NEEDLE, WORDS, multikey_prompts, task_prompts
from tests.support import TOKENIZER_DIR

B, H, H_KV, N, D = 2, 4, 2, 70, 8
SINK, RECENT = 3, 9


def _from_scratch(query, key, value, allowed, streamed, scaling, softcap=None, sinks=None):
    """(B, n, H, d): every head over every key it sees, the band of the streaming heads as a mask."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)  # (B, H, n, d)
    logits = query @ key.transpose(-1, -2) * scaling  # (B, H, n, n)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    seen = (j <= i).expand(B, H, N, N).clone()  # (B, H, n, n)
    if allowed is not None:
        seen &= allowed
    seen[:, streamed] &= (j < SINK) | (j > i - RECENT)
    logits = logits.masked_fill(~seen, torch.finfo(logits.dtype).min)
    if sinks is not None:
        logits = torch.cat([logits, sinks.view(1, H, 1, 1).expand(B, H, N, 1)], -1)
    weights = logits.softmax(-1)[..., :N]  # (B, H, n, n)
    return (weights @ value).transpose(1, 2)  # (B, n, H, d)


def _inputs(seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(B, H, N, D, generator=generator)  # (B, H, n, d)
    return query, torch.randn(B, H_KV, N, D, generator=generator), torch.randn(B, H_KV, N, D, generator=generator)


MODULE = SimpleNamespace(layer_idx=0, is_causal=True, num_key_value_groups=H // H_KV, training=False)


@pytest.mark.parametrize("block", [8, 13, 256])
@pytest.mark.parametrize("family", ["plain", "padded", "softcap", "sinks"])
def test_blocks_equal_attention_from_scratch(block, family, monkeypatch):
    monkeypatch.setattr(streaming, "BLOCK", block)
    query, key, value = _inputs()
    streamed = [0, 1, 3]  # a whole KV group and one head of the other
    allowed, extra = None, {}
    if family == "padded":  # row 1: the last 5 tokens are padding (SDPA's boolean mask, as transformers builds it)
        real = torch.ones(B, N, dtype=torch.bool)
        real[1, -5:] = False
        allowed = (real[:, None, None, :] & torch.ones(N, N, dtype=torch.bool).tril()).clone()  # (B, 1, n, n)
        allowed |= ~allowed.any(-1, keepdim=True)  # a row that sees nothing sees everything (torch's fix)
    if family == "softcap":
        extra = {"softcap": 1.5}
    if family == "sinks":
        extra = {"s_aux": torch.tensor([0.5, -1.0, 2.0, 0.0])}
    plan = streaming.StreamingPlan.of({0: streamed}, SINK, RECENT)
    output, weights = streaming.streaming_attention(
        MODULE, query, key, value, allowed, scaling=0.3, attnscope_streaming=plan, **extra
    )
    expected = _from_scratch(query, key, value, allowed, streamed, 0.3, extra.get("softcap"), extra.get("s_aux"))
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
    assert weights is None and plan.layers_seen == [0]


def test_without_a_plan_or_streaming_heads_it_is_transformers_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    query, key, value = _inputs(1)
    expected, _ = sdpa_attention_forward(MODULE, query, key, value, None, scaling=0.3)
    for plan in (None, streaming.StreamingPlan.of({1: [0]}, SINK, RECENT)):
        extra = {} if plan is None else {"attnscope_streaming": plan}
        output, _ = streaming.streaming_attention(MODULE, query, key, value, None, scaling=0.3, **extra)
        assert torch.equal(output, expected)


def test_a_block_gathers_the_sink_and_the_window_and_nothing_else():
    assert streaming.block_keys(0, 4, (3, 9)).tolist() == [0, 1, 2, 3]
    assert streaming.block_keys(20, 24, (3, 9)).tolist() == [0, 1, 2, *range(12, 24)]
    assert streaming.block_keys(5, 8, (3, 9)).tolist() == list(range(8))  # the window reaches the sink
    assert streaming.block_keys(5, 8, None).tolist() == list(range(8))


def test_a_family_outside_the_attention_interface_is_refused_in_one_line():
    plan = streaming.StreamingPlan.of({0: [1]}, 4, 8)
    plan.layers_seen[:] = [1]
    with pytest.raises(AttnscopeError, match=r"^the attention of layer 0 did not go through .* cannot be checked$"):
        plan.check(2)


def test_a_cache_or_an_encoder_is_refused():
    query, key, value = _inputs()
    plan = streaming.StreamingPlan.of({0: [1]}, SINK, RECENT)
    with pytest.raises(AttnscopeError, match="causal self-attention"):
        streaming.streaming_attention(MODULE, query[:, :, -1:], key, value, None, attnscope_streaming=plan)


def gpt2_tokenizer():
    from transformers import GPT2TokenizerFast

    return GPT2TokenizerFast.from_pretrained(TOKENIZER_DIR)


def test_multikey_prompts_hide_four_keys_and_ask_for_the_one_at_the_depth_asked():
    tokenizer = gpt2_tokenizer()
    prompts = multikey_prompts(tokenizer, [300, 400], [0.25, 0.75], trials=2, seed=3)
    assert [(p.length, p.depth, p.task) for p in prompts] == [
        (n, d, "multikey") for n in (300, 400) for d in (0.25, 0.75) for _ in "ab"
    ]
    assert len({p.key for p in prompts}) == len(prompts)
    for prompt in prompts:
        text = tokenizer.decode(prompt.ids)
        start, end = prompt.answer
        assert end == len(prompt.ids) <= prompt.length and tokenizer.decode(prompt.ids[start:end]) == f" {prompt.key}"
        asked = tokenizer.decode(prompt.ids[prompt.needle[0] : prompt.needle[1]])
        word = asked.split(" for ")[1].split(" is:")[0]
        assert asked == MULTIKEY_NEEDLE.format(word=word, number=prompt.key) and word in WORDS
        assert text.count("One of the special magic numbers for") == MULTIKEY_KEYS
        assert text.count(f" for {word}") == 1 + 2  # its needle, and twice in the question
        assert prompt.needle[0] / start < 0.5 if prompt.depth == 0.25 else prompt.needle[0] / start > 0.5
    assert multikey_prompts(tokenizer, [300, 400], [0.25, 0.75], trials=2, seed=3) == prompts  # seeded


def test_the_multikey_task_leaves_out_a_length_too_short_for_it():
    tokenizer = gpt2_tokenizer()
    prompts = task_prompts(tokenizer, [100, 300], [0.5], trials=1)
    assert [(p.task, p.length) for p in prompts] == [("passkey", 100), ("passkey", 300), ("multikey", 300)]
    with pytest.raises(AttnscopeError, match="^a multi-key prompt of 100 tokens is too short"):
        multikey_prompts(tokenizer, [100], [0.5], trials=1)
