"""Corpus scale in one process: token-budgeted batches, progress over thousands of texts, exact merging of parts."""

from __future__ import annotations

import random

import pytest

from attnscope import api
from attnscope.errors import AttnscopeError
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.tokens import Window, batch_order, tokenize

WORDS = "the cat sat on mat because it was tired doctor said that she would help patient quick brown fox".split()
# rows a window does not score: a decoder's row 0; an encoder's [CLS] and [SEP] rows
UNSCORED_PER_WINDOW = {"decoder": 1, "encoder": 2}


def _corpus(count, seed=0):
    generator = random.Random(seed)
    return [
        Text(" ".join(generator.choice(WORDS) for _ in range(generator.randint(3, 40))), f"t{i}") for i in range(count)
    ]


def test_batches_respect_the_token_budget():
    windows = [Window(i, tuple(range(length)), 0) for i, length in enumerate([10, 50, 20, 50, 5, 30])]
    groups = batch_order(windows, batch_size=8, max_tokens=100)
    assert sorted(i for group in groups for i in group) == list(range(6))  # every window once
    for group in groups:
        longest = max(len(windows[i].ids) for i in group)
        assert len(group) * longest <= 100
    assert groups[0] == [1, 3]  # the two 50-token windows together, longest first
    assert batch_order([Window(0, tuple(range(300)), 0)], 8, max_tokens=100) == [[0]]  # too long alone: still runs
    assert batch_order(windows, batch_size=2) == [[1, 3], [5, 2], [0, 4]]  # no budget: by count, longest first


@pytest.mark.parametrize("batch_size, max_tokens, message", [(0, None, "batch size 0"), (1, 0, "max tokens 0")])
def test_batch_settings_below_one_are_refused(batch_size, max_tokens, message):
    with pytest.raises(AttnscopeError, match=f"^{message}: must be at least 1$"):
        batch_order([Window(0, (1, 2), 0)], batch_size, max_tokens)


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
def test_two_thousand_texts_with_progress(model, kind):
    calls = []
    texts = _corpus(2000)
    result = api.heads(model, texts, batch_size=64, probe=False, progress=lambda *args: calls.append(args))
    assert result.inputs["n_texts"] == 2000 and result.inputs["n_windows"] == 2000
    total_tokens = sum(len(window.ids) for window in tokenize(model, texts).windows)
    assert result.inputs["n_tokens"] == total_tokens
    assert calls[-1] == (2000, total_tokens, 1.0)  # every text read, every token run, the whole input
    assert len(calls) >= 2000 // 64  # one call per batch
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)  # monotone
    assert [c[1] for c in calls] == sorted(c[1] for c in calls)
    assert [c[2] for c in calls] == sorted(c[2] for c in calls)
    assert result.inputs["scored_rows"] == total_tokens - UNSCORED_PER_WINDOW[kind] * 2000


def test_corpus_split_in_two_and_merged_equals_one_run(model):
    texts = _corpus(40, seed=1)
    whole = api.heads(model, texts, probe=False, batch_size=7)
    parts = [api.heads(model, half, probe=False, batch_size=5) for half in (texts[:15], texts[15:])]
    counts = [part.inputs["scored_rows"] for part in parts]
    assert whole.inputs["scored_rows"] == sum(counts)
    for index, record in enumerate(whole.heads):
        for name in model.kind.row_score_names:
            weighted = [r * part.heads[index].scores[name] for r, part in zip(counts, parts, strict=True)]
            merged = sum(weighted) / sum(counts)
            assert record.scores[name] == pytest.approx(merged, abs=1e-6), (record.label, name)


def test_a_token_budget_changes_the_batches_not_the_scores(model):
    texts = _corpus(30, seed=4)
    calls = {}
    for max_tokens in (None, 64):
        seen = []
        progress = lambda *args, seen=seen: seen.append(args)  # noqa: E731
        result = api.heads(model, texts, probe=False, batch_size=16, max_tokens=max_tokens, progress=progress)
        calls[max_tokens] = (len(seen), result)
    (few, unbounded), (many, budgeted) = calls[None], calls[64]
    assert many > few  # the budget really split the batches
    for a, b in zip(unbounded.heads, budgeted.heads, strict=True):
        for name in model.kind.row_score_names:
            assert a.scores[name] == pytest.approx(b.scores[name], abs=1e-6), (a.label, name)
