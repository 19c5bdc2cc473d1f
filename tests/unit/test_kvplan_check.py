"""`kvplan --check` without a model's forward: the passkey outcome is planted (a prompt is retrieved exactly when one
chosen "retrieval" KV head keeps its full cache), so the answer of every share, every random plan and `auto` is
known by counting; and the query heads a plan narrows, for grouped-query attention."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from attnscope import settings
from attnscope.analyses import kvplan_check
from attnscope.analyses.kv_plans import plan, uniform_plan
from attnscope.analyses.kvplan_check import (
    CURVE_FRACTIONS,
    check_plans,
    chosen_share,
    random_plan,
    streaming_query_heads,
    summary,
    tells_apart,
)
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape
from attnscope.pipeline.passkey import PasskeyPrompt

RETRIEVAL = (1, 2)  # the planted retrieval KV head: (layer, kv_head)
N_HEAD, N_KV_HEAD = 8, 4  # two query heads per KV head


def _prompt(length, depth, key, needle=(10, 12)):
    """40 tokens, the answer at 30: with sink 4 and recent 8 the query at 29 sees keys 0-3 and 22-29."""
    return PasskeyPrompt((0,) * 40, (30, 31), key, length, depth, needle)


def _prompts(tokenizer, lengths, depths, trials, seed):
    return [_prompt(n, d, 10000 + k) for n in lengths for d in depths for k in range(trials)]


@pytest.fixture
def planted(monkeypatch):
    """passkey_results that retrieves every prompt unless a query head of the retrieval KV head streams; the
    streaming maps it was given, in order."""
    calls = []

    def results(loaded, prompts, streaming=None, sink=0, recent=0):
        calls.append(streaming)
        layer, kv_head = RETRIEVAL
        lost = streaming is not None and any(head // 2 == kv_head for head in streaming.get(layer, []))
        return [not lost] * len(prompts)

    monkeypatch.setattr(kvplan_check, "task_prompts", _prompts)
    monkeypatch.setattr(kvplan_check, "passkey_results", results)
    return calls


LOADED = SimpleNamespace(lm_model=object(), n_ctx=1024, n_head=N_HEAD, tokenizer=None)


def _scores() -> np.ndarray:
    scores = np.linspace(0.01, 0.2, 2 * N_KV_HEAD).reshape(2, N_KV_HEAD)  # (L, H_kv)
    scores[RETRIEVAL] = 0.9  # the head that looks far back scores highest
    return scores


def _planner():
    scores = _scores()
    return lambda share: plan(scores, share)


def test_the_plan_keeps_the_retrieval_head_and_auto_takes_the_largest_share_that_does(planted):
    checked = check_plans(LOADED, _planner(), CURVE_FRACTIONS, 4, 8, [512, 1024], 2, seed=0)
    assert len(checked["full"]) == 2 * 3 * 2 and all(checked["full"])
    for share in checked["shares"]:
        streamed = math.floor(share["streaming"] * 8 + 1e-9)
        assert share["kv_heads"] == streamed
        # the plan streams the lowest scores: the retrieval head only when every head streams
        assert all(share["plan"]) == (streamed < 8)
        # a random plan keeps the retrieval head with probability 1 - k/8: each is all-or-nothing here
        assert len(share["random"]) == (kvplan_check.RANDOM_PLANS if streamed else 0)
        assert all(all(outcome) or not any(outcome) for outcome in share["random"])
    assert chosen_share(checked) == 7 / 8
    # random plans of 7 of 8 heads mostly lose the head: over the shares, some random plan lost it
    assert any(not all(outcome) for share in checked["shares"] for outcome in share["random"])
    # every forward narrowed the query heads of its plan's streaming KV heads, both of each group
    for streaming in planted[1:]:
        for heads in streaming.values():
            assert {head // 2 for head in heads} == {head // 2 for head in heads if head ^ 1 in heads}


def test_the_summary_gives_each_share_and_the_plans_accuracy_by_length_and_depth(planted):
    checked = check_plans(LOADED, _planner(), [0.0, 0.5, 1.0], 4, 8, [512], 3, seed=1)
    document = summary(checked, 1.0, [512], 3, 1)
    assert document["prompts"] == 9 and document["full"] == 1.0
    assert [share["plan"] for share in document["shares"]] == [1.0, 1.0, 0.0]
    assert document["shares"][0]["random"] == [] and document["shares"][0]["random_mean"] is None
    assert document["shares"][2]["random"] == [0.0] * kvplan_check.RANDOM_PLANS  # every head streams
    assert [(row["length"], row["depth"]) for row in document["by_prompt"]] == [(512, d) for d in (0.25, 0.5, 0.75)]
    assert all(row["full"] == 1.0 and row["plan"] == 0.0 for row in document["by_prompt"])


def test_the_same_seed_draws_the_same_random_plans(planted):
    first = check_plans(LOADED, _planner(), [0.5], 4, 8, [512], 1, seed=5)
    again = check_plans(LOADED, _planner(), [0.5], 4, 8, [512], 1, seed=5)
    assert first["shares"] == again["shares"]
    generator = np.random.default_rng(0)
    drawn = random_plan((2, 4), 3, generator)
    assert drawn.shape == (2, 4) and int((~drawn).sum()) == 3


def test_a_plan_narrows_every_query_head_of_a_streaming_kv_head():
    full = np.array([[True, False, True, True], [False, True, True, False]])  # (L, H_kv)
    assert streaming_query_heads(full, 8) == {0: [2, 3], 1: [0, 1, 6, 7]}
    assert streaming_query_heads(np.ones((2, 4), dtype=bool), 8) == {}


def test_default_lengths_and_refusals():
    assert settings.Kvplan().lengths_for(256) == (128, 256)
    assert settings.Kvplan().lengths_for(131072) == (2048, 4096)
    assert settings.Kvplan(check_lengths=(300, 200)).lengths_for(256) == (300, 200)
    checked = settings.Kvplan(check=True, check_lengths=(512, 2048), sink=4, recent=8)
    with pytest.raises(AttnscopeError, match=r"--check-lengths 2048: longer than the model's context \(1,024"):
        checked.check_shape(Shape(2, 4, "decoder", 1024))
    headless = SimpleNamespace(**{**vars(LOADED), "lm_model": None})
    with pytest.raises(AttnscopeError, match="language-model head"):
        check_plans(headless, _planner(), [0.5], 4, 8, [512], 1, seed=0)


def test_auto_runs_the_check_and_needs_the_language_model_head():
    assert settings.Kvplan(streaming="auto").check and settings.Kvplan(streaming="AUTO").needs_lm_head
    assert not settings.Kvplan().needs_lm_head and settings.Kvplan(check=True).needs_lm_head
    with pytest.raises(AttnscopeError, match=r"streaming 'most': expected a number from 0 to 1, or 'auto'"):
        settings.Kvplan(streaming="most")
    with pytest.raises(AttnscopeError, match="check_lengths"):
        settings.Kvplan(check_lengths=(8,))


def test_a_check_whose_prompts_a_streaming_cache_holds_whole_is_refused_before_any_weight_loads():
    """Prompts no longer than sink + recent: every plan passes them, so the check would prove nothing (issue 38)."""
    shape = Shape(2, 4, "decoder", 1024)
    with pytest.raises(AttnscopeError, match=r"^--check-lengths 256: no longer than sink 128 \+ recent 256"):
        settings.Kvplan(check=True, check_lengths=(256, 512)).check_shape(shape)
    with pytest.raises(AttnscopeError, match=r"--check-lengths \(default 64,128\) 64: .* = 80 tokens"):
        settings.Kvplan(check=True, sink=16, recent=64).check_shape(Shape(2, 4, "decoder", 128))
    settings.Kvplan(check=True, check_lengths=(385,)).check_shape(shape)  # one token past the cache: a test
    settings.Kvplan(check_lengths=(256,)).check_shape(shape)  # no --check: the lengths are not read


def test_prompts_whose_needle_a_streaming_head_sees_test_nothing(planted, monkeypatch):
    """The query before the answer (29) sees keys 0-3 (sink 4) and 22-29 (recent 8): a needle at 10-12 is hidden
    from it, one at 2-4 or 21-23 is not."""
    assert _prompt(512, 0.5, 1).hidden_from(4, 8)
    assert not _prompt(512, 0.5, 1, needle=(2, 4)).hidden_from(4, 8)
    assert not _prompt(512, 0.5, 1, needle=(21, 23)).hidden_from(4, 8)
    assert _prompt(512, 0.5, 1, needle=(4, 22)).hidden_from(4, 8)  # the edges of both
    monkeypatch.setattr(kvplan_check, "task_prompts", lambda *given: [_prompt(512, 0.5, 1, needle=(21, 23))] * 3)
    with pytest.raises(AttnscopeError, match=r"none of --check's 3 passkey prompts \(512 tokens\) hides its passkey"):
        check_plans(LOADED, _planner(), [0.5], 4, 8, [512], 1, seed=0)
    monkeypatch.setattr(
        kvplan_check, "task_prompts", lambda *given: [_prompt(512, d, 1, needle=(19 + k, 21 + k)) for k, d in
                                                        enumerate(kvplan_check.DEPTHS)]
    )  # fmt: skip
    document = summary(check_plans(LOADED, _planner(), [0.5], 4, 8, [512], 1, seed=0), 0.5, [512], 1, 0)
    assert (
        document["prompts"] == 3 and document["prompts_hidden"] == 2
    )  # needles ending at 21 and 22 are hidden, not 23


def test_a_check_where_every_plan_retrieves_alike_says_it_cannot_tell_plans_apart(planted, monkeypatch):
    checked = check_plans(LOADED, _planner(), [0.0, 0.5, 1.0], 4, 8, [512], 1, seed=0)
    assert tells_apart(checked)  # the retrieval head: random plans of 4 of 8 lose it (seed 0) while the plan keeps it
    assert any(not all(outcome) for outcome in checked["shares"][1]["random"])
    monkeypatch.setattr(kvplan_check, "passkey_results", lambda loaded, prompts, *given: [True] * len(prompts))
    alike = check_plans(LOADED, _planner(), [0.0, 0.5, 1.0], 4, 8, [512], 1, seed=0)
    assert not tells_apart(alike)  # every plan retrieves every prompt
    # all heads streaming losing the passkey tells the budget's limit, not one plan from another
    monkeypatch.setattr(
        kvplan_check, "passkey_results", lambda loaded, prompts, streaming=None, *given: [
            streaming is None or sum(map(len, streaming.values())) < 2 * N_HEAD] * len(prompts)
    )  # fmt: skip
    every = check_plans(LOADED, _planner(), [0.0, 0.5, 1.0], 4, 8, [512], 1, seed=0)
    assert not all(every["shares"][2]["plan"]) and not tells_apart(every)


def test_each_accuracy_has_wilsons_interval_as_scipy_computes_it(planted):
    """Issue 40, item 2: a share retrieved over n prompts is reported with its 95 % Wilson interval; scipy's
    binomtest(...).proportion_ci(method="wilson") is the independent reference. 12 of 12 is [0.758, 1], not a
    point."""
    from scipy.stats import binomtest

    for successes, trials in [(12, 12), (0, 12), (4, 12), (1, 3), (50, 100)]:
        expected = binomtest(successes, trials).proportion_ci(confidence_level=0.95, method="wilson")
        assert np.allclose(kvplan_check.wilson(successes, trials), (expected.low, expected.high), atol=1e-12)
    checked = check_plans(LOADED, _planner(), [0.0, 0.5, 1.0], 4, 8, [512], 4, seed=0)
    document = summary(checked, 0.5, [512], 4, 0)
    assert document["prompts"] == 12 and document["full"] == 1.0
    assert np.allclose(document["full_interval"], [0.757506, 1.0], atol=1e-6)
    assert np.allclose(document["shares"][2]["plan_interval"], [0.0, 0.242494], atol=1e-6)  # every head streams


def test_each_task_has_its_accuracies_and_the_combined_ones_count_both(monkeypatch):
    """Passkey prompts retrieved unless the retrieval head streams; multi-key prompts only while no head of layer 0
    streams either: the plan keeps the passkey at 1/2 but loses the multi-key needle, and the combined numbers are
    the mean over both tasks' prompts."""

    def prompts(tokenizer, lengths, depths, trials, seed):
        made = _prompts(tokenizer, lengths, depths, trials, seed)
        return made + [replace(prompt, task="multikey") for prompt in made]

    def results(loaded, prompts, streaming=None, sink=0, recent=0):
        layer, kv_head = RETRIEVAL
        streaming = streaming or {}
        lost = any(head // 2 == kv_head for head in streaming.get(layer, []))
        return [not lost and not (prompt.task == "multikey" and streaming.get(0)) for prompt in prompts]

    monkeypatch.setattr(kvplan_check, "task_prompts", prompts)
    monkeypatch.setattr(kvplan_check, "passkey_results", results)
    document = summary(check_plans(LOADED, _planner(), [0.0, 0.5], 4, 8, [512], 2, seed=0), 0.5, [512], 2, 0)
    assert document["prompts"] == 12 and document["full"] == 1.0
    tasks = document["tasks"]
    assert list(tasks) == ["passkey", "multikey"] and tasks["multikey"]["prompts"] == 6
    assert tasks["passkey"]["lengths"] == [512] and tasks["passkey"]["prompts_hidden"] == 6
    assert [share["plan"] for share in tasks["passkey"]["shares"]] == [1.0, 1.0]
    assert [share["plan"] for share in tasks["multikey"]["shares"]] == [1.0, 0.0]  # the plan streams layer 0's heads
    assert document["shares"][1]["plan"] == 0.5
    assert tasks["multikey"]["shares"][1]["plan_interval"] == list(kvplan_check.wilson(0, 6))
    assert "multi-key needle (RULER" in document["task"]


def test_a_task_none_of_whose_prompts_hides_its_needle_is_refused(planted, monkeypatch):
    hidden, seen = _prompt(512, 0.5, 1), replace(_prompt(512, 0.5, 1, needle=(21, 23)), task="multikey")
    monkeypatch.setattr(kvplan_check, "task_prompts", lambda *given: [hidden] * 3 + [seen] * 3)
    with pytest.raises(AttnscopeError, match=r"^none of --check's 3 multikey prompts \(512 tokens\) hides its needle"):
        check_plans(LOADED, _planner(), [0.5], 4, 8, [512], 1, seed=0)


def test_auto_takes_the_largest_share_within_full_attentions_interval():
    """12 of 12 prompts with full attention: Wilson's interval is [0.758, 1] (scipy's binomtest agrees:
    test_each_accuracy_has_wilsons_interval_as_scipy_computes_it), so 10 of 12 (0.83) lies within it and 9 of 12
    (0.75) does not."""
    full = [True] * 12
    checked = {
        "full": full,
        "shares": [
            {"streaming": 0.0, "plan": full},
            {"streaming": 0.25, "plan": [True] * 10 + [False] * 2},
            {"streaming": 0.5, "plan": [True] * 9 + [False] * 3},
            {"streaming": 0.625, "plan": [True] * 11 + [False]},  # a larger share that holds again: it is taken
            {"streaming": 0.75, "plan": [False] * 12},
        ],
    }
    assert kvplan_check.wilson(12, 12)[0] == pytest.approx(0.7575, abs=1e-4)
    assert chosen_share(checked) == 0.625
    checked["shares"][3]["plan"] = [True] * 9 + [False] * 3
    assert chosen_share(checked) == 0.25


def test_the_uniform_plan_streams_as_many_kv_heads_in_every_layer():
    scores = np.array([[0.9, 0.1, 0.2, 0.8], [0.05, 0.04, 0.03, 0.02], [0.5, 0.6, 0.7, 0.3]])  # (L, H_kv)
    # 6 of 12: two in every layer, each layer's two lowest
    assert (~uniform_plan(scores, 0.5)).tolist() == [
        [False, True, True, False], [False, False, True, True], [True, False, False, True],
    ]  # fmt: skip
    # 4 of 12: one in every layer, and one more where the next-lowest score is lowest (layer 1's 0.03)
    streaming = ~uniform_plan(scores, 0.34)  # floor(0.34 × 12) = 4
    assert streaming.sum(axis=1).tolist() == [1, 2, 1]
    assert streaming.tolist()[1] == [False, False, True, True]
    # the global plan takes layer 1 whole at the same budget: it is not the uniform one
    assert (~plan(scores, 0.34)).sum(axis=1).tolist() == [0, 4, 0]
    assert uniform_plan(scores, 0.0).all() and not uniform_plan(scores, 1.0).any()


def test_the_curve_runs_the_uniform_plan_only_where_it_differs(planted):
    scores = _scores()  # (2, 4): the retrieval head 1.2 scores highest; layer 0 lowest
    checked = check_plans(
        LOADED, lambda share: plan(scores, share), CURVE_FRACTIONS, 4, 8, [512], 1, seed=0,
        uniform_of=lambda share: uniform_plan(scores, share),
    )  # fmt: skip
    differs = [
        share for share in CURVE_FRACTIONS
        if not np.array_equal(plan(scores, share), uniform_plan(scores, share)) and not plan(scores, share).all()
    ]  # fmt: skip
    streams = [share for share in CURVE_FRACTIONS if not plan(scores, share).all()]
    assert len(planted) == 1 + len(streams) * (1 + kvplan_check.RANDOM_PLANS) + len(differs)
    for share in checked["shares"]:
        uniform = uniform_plan(scores, share["streaming"])
        # planted: retrieved unless a query head of KV head 1.2 streams
        assert all(share["uniform"]) == bool(uniform[RETRIEVAL])
    document = summary(checked, 0.5, [512], 1, 0)
    assert document["curve"] and all(share["uniform_interval"] is not None for share in document["shares"])
    assert [share["streaming"] for share in document["shares"]] == list(CURVE_FRACTIONS)


def test_curve_and_auto_run_the_check():
    assert settings.Kvplan(curve=True).check and settings.Kvplan(streaming="auto").curve
    assert kvplan_check.fractions("auto") == [k / 8 for k in range(8)]
    assert kvplan_check.fractions(0.3, curve=True) == sorted([k / 8 for k in range(8)] + [0.3])
    assert kvplan_check.fractions(0.3) == [0.0, 0.25, 0.3, 0.5, 0.75, 1.0]
