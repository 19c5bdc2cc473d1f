"""The needle-in-a-haystack probe (pipeline.needle) on real tokenizers and models: its windows laid out as
documented, and each head's retrieval score, through the capture, against transformers' own eager attention on the
same probe ids (nothing of attnscope's but the ids); the same JSON on every run; no score for an encoder."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnscope import api
from attnscope.errors import AttnscopeError
from attnscope.models.loading import demo_model_dir
from attnscope.pipeline import needle as needle_module
from attnscope.pipeline.needle import DEPTHS, NEEDLE_LEN, haystack_ids, needle_for, needle_windows
from tests.support import TEXTS


def eager_retrieval(folder, probe) -> torch.Tensor:
    """(n_layer, n_head) float64: Wu et al.'s retrieval score, teacher-forced, from the checkpoint in `folder` run by
    transformers alone (eager attention, output_attentions) on the probe's windows: at each row q whose next token
    is the copy's k-th, a hit when argmax_j A[q, j] is the k-th needle token's position in the haystack. Checks too
    that no scored row has two keys within 1e-6 of its maximum (float32 rounding is ~1e-7 here), so that rounding
    cannot move an argmax."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = torch.tensor([window.ids for window in probe.windows])  # (W, n): every window as long
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions  # per layer (W, H, n, n)
    n = ids.shape[1]
    queries = torch.arange(n - NEEDLE_LEN - 1, n - 1)  # the second cue, then the copy but its last token
    targets = torch.tensor(probe.needle_starts)[:, None] + torch.arange(NEEDLE_LEN)[None, :]  # (W, N)
    scores = []
    for layer in attentions:
        scored = layer[:, :, queries]  # (W, H, N, n)
        top = scored.topk(2, dim=-1).values  # (W, H, N, 2)
        assert float((top[..., 0] - top[..., 1]).min()) > 1e-6, "a near tie: the comparison would be luck"
        hits = scored.argmax(dim=-1) == targets[:, None, :]  # (W, H, N)
        scores.append(hits.sum(dim=(0, 2)).double() / (len(probe.windows) * NEEDLE_LEN))
    return torch.stack(scores)


def test_retrieval_equals_transformers_eager_attention_on_the_probe(tiny, tiny_model_dir):
    """A tiny random GPT-2: a haystack of 20 tokens, where a few of its heads' strongest keys land on the needle."""
    result = api.heads(tiny, TEXTS[:1], haystack_len=20, probe_seed=1)
    assert result.inputs["needle"]["haystack_len"] == 20 and result.inputs["needle"]["scored_rows"] == 48
    probe = needle_windows(tiny.tokenizer, 20, tiny.n_ctx, seed=1)
    expected = eager_retrieval(tiny_model_dir, probe)
    got = torch.tensor(
        [[result.heads[4 * layer + head].scores["retrieval"] for head in range(4)] for layer in range(2)],
        dtype=torch.float64,
    )
    assert torch.equal(got, expected)  # exact: counts of the same argmaxes
    assert float(expected.max()) > 0  # some head's strongest key is the needle somewhere: not 0 == 0 alone


@pytest.mark.slow
def test_the_demo_models_induction_heads_retrieve_the_needle_as_transformers_sees_them():
    """The bundled demo model's learned induction heads copy the needle: their retrieval scores are far from 0 and
    from each other, and equal transformers' own count."""
    loaded = api.load("demo", device="cpu")
    result = api.heads(loaded, TEXTS[:1])
    probe, _ = needle_for(loaded, True, None, 0)
    expected = eager_retrieval(demo_model_dir(), probe)
    got = torch.tensor(
        [[result.heads[4 * layer + head].scores["retrieval"] for head in range(4)] for layer in range(2)],
        dtype=torch.float64,
    )
    assert torch.equal(got, expected)
    assert float(expected[1].max()) > 0.8  # the induction head 1.0 (demo_model/scores.json)


def test_the_json_is_the_same_on_every_run(tiny):
    first, second = (api.heads(tiny, TEXTS[:1]).to_json() for _ in range(2))
    assert first == second and '"retrieval"' in first and '"sink_rate"' in first


def test_an_encoder_gets_no_retrieval_score(tiny_bert):
    result = api.heads(tiny_bert, TEXTS[:1])
    assert "needle" not in result.inputs and "retrieval" not in result.measured
    assert all(record.scores["retrieval"] is None for record in result.heads)
    assert all(record.role.role != "retrieval" for record in result.heads)


# ------------------------------------------------------------------------------------------- the windows


@pytest.fixture
def gpt2_tokenizer(tiny):
    return tiny.tokenizer  # the real GPT-2 vocabulary (tests/data/gpt2-tokenizer)


def test_the_windows_are_laid_out_as_documented(gpt2_tokenizer):
    haystack_len = 40
    probe = needle_windows(gpt2_tokenizer, haystack_len, n_ctx=1024, seed=3)
    haystack = haystack_ids(gpt2_tokenizer, haystack_len)
    bos = gpt2_tokenizer.bos_token_id
    assert len(probe.windows) == len(DEPTHS) == 3
    assert probe.first_query == 1 + haystack_len + 1 + NEEDLE_LEN  # after BOS, the haystack, a cue, a needle: the cue
    for window, start, depth in zip(probe.windows, probe.needle_starts, DEPTHS, strict=True):
        ids = list(window.ids)
        assert len(ids) == 1 + haystack_len + 2 * (1 + NEEDLE_LEN) and ids[0] == bos
        at = round(depth * haystack_len)
        assert start == 1 + at + 1  # BOS, the haystack before the needle, the cue
        cue, needle = ids[start - 1], ids[start : start + NEEDLE_LEN]
        assert ids[probe.first_query] == cue and ids[probe.first_query + 1 :] == needle  # the copy
        assert ids[1 : start - 1] + ids[start + NEEDLE_LEN : probe.first_query] == haystack  # the haystack, whole
        # each needle token and the cue: distinct, twice in the window (in the haystack's needle and the copy)
        assert len(set(needle + [cue])) == NEEDLE_LEN + 1
        assert all(ids.count(token) == 2 for token in [cue, *needle])
        assert all(gpt2_tokenizer.convert_ids_to_tokens(token)[0] == "Ġ" for token in needle)  # ordinary words
    assert len({window.ids[probe.needle_starts[0]] for window in probe.windows}) > 1  # each window its own needle
    again = needle_windows(gpt2_tokenizer, haystack_len, n_ctx=1024, seed=3)
    assert again == probe  # seeded
    assert needle_windows(gpt2_tokenizer, haystack_len, n_ctx=1024, seed=4).windows != probe.windows
    assert probe.summary() == {
        "haystack_len": 40, "needle_len": NEEDLE_LEN, "depths": [0.1, 0.5, 0.9], "seed": 3, "scored_rows": 48,
    }  # fmt: skip


def test_the_haystack_is_the_sample_texts_repeated(gpt2_tokenizer):
    short = haystack_ids(gpt2_tokenizer, 30)
    long = haystack_ids(gpt2_tokenizer, 2000)
    assert long[:30] == short and len(long) == 2000
    text = gpt2_tokenizer.decode(short)
    assert text.startswith("The cat sat on the mat")  # 01_cat.txt, the first sample


def test_a_haystack_that_does_not_fit_is_refused(gpt2_tokenizer):
    with pytest.raises(AttnscopeError, match=r"^haystack length 9: must be at least 10$"):
        needle_windows(gpt2_tokenizer, 9, n_ctx=1024)
    with pytest.raises(AttnscopeError, match=r"^haystack length 100: BOS \+ .* \(135 tokens\) must fit .* 134 tokens"):
        needle_windows(gpt2_tokenizer, 100, n_ctx=134)


def _stub(n_ctx: int, tokenizer, probe: bool = True):
    return SimpleNamespace(n_ctx=n_ctx, tokenizer=tokenizer, kind=SimpleNamespace(probe=probe))


def test_the_default_haystack_fits_the_context(gpt2_tokenizer):
    probe, notes = needle_for(_stub(1024, gpt2_tokenizer), True, None, 0)
    assert probe.haystack_len == needle_module.DEFAULT_HAYSTACK_LEN and notes == []
    probe, notes = needle_for(_stub(100, gpt2_tokenizer), True, None, 0)  # 100 - BOS - 2 · 17
    assert probe.haystack_len == 65 and len(probe.windows[0].ids) == 100
    assert notes == ["needle probe's haystack shortened to 65 tokens to fit the context of 100 tokens"]
    probe, notes = needle_for(_stub(40, gpt2_tokenizer), True, None, 0)
    assert probe is None and "retrieval was not measured" in notes[0]
    assert needle_for(_stub(1024, gpt2_tokenizer), False, None, 0) == (None, [])  # --no-probe
    assert needle_for(_stub(1024, gpt2_tokenizer, probe=False), True, None, 0) == (None, [])  # an encoder
