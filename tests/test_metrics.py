"""Metric functions on hand-built attention matrices whose scores are known exactly, and against a slow loop."""

import math

import pytest
import torch

from attnscope import metrics
from attnscope.capture import AttentionBlock


def causal_rows(rows: list[list[float]]) -> torch.Tensor:
    """(1, 1, n, n) from lower-triangular rows given as lists (row i has i+1 entries)."""
    n = len(rows)
    attn = torch.zeros(1, 1, n, n, dtype=torch.float32)
    for i, row in enumerate(rows):
        attn[0, 0, i, : i + 1] = torch.tensor(row)
    return attn


def previous_token_map(n):
    return causal_rows([[1.0]] + [[1.0 if j == i - 1 else 0.0 for j in range(i + 1)] for i in range(1, n)])


def first_token_map(n):
    return causal_rows([[1.0 if j == 0 else 0.0 for j in range(i + 1)] for i in range(n)])


def identity_map(n):
    return causal_rows([[1.0 if j == i else 0.0 for j in range(i + 1)] for i in range(n)])


def uniform_map(n):
    return causal_rows([[1.0 / (i + 1)] * (i + 1) for i in range(n)])


def band_map(n, window):
    """Uniform over the local window {max(1, i-w) .. i} of every row i >= 1."""
    rows = [[1.0]]
    for i in range(1, n):
        low = max(1, i - window)
        rows.append([1.0 / (i - low + 1) if low <= j <= i else 0.0 for j in range(i + 1)])
    return causal_rows(rows)


def scores_of(attn, length=None, window=3):
    n = attn.shape[-1]
    lengths = torch.tensor([n if length is None else length])
    return {name: float(value[0]) for name, value in metrics.head_scores(attn, lengths, window).items()}


N = 10  # rows 1..9 are scored


def test_perfect_previous_token_head():
    s = scores_of(previous_token_map(N))
    assert s["previous_token"] == pytest.approx(1.0)
    assert s["first_token"] == pytest.approx(1 / (N - 1))  # only row 1, whose previous token is token 0
    assert s["self"] == pytest.approx(0.0)
    assert s["confidence"] == pytest.approx(1.0)
    assert s["entropy"] == pytest.approx(0.0, abs=1e-7)
    assert s["entropy_normalized"] == pytest.approx(0.0, abs=1e-7)
    # A[i, i-1] is inside the window unless i-1 = 0 (row 1): 8 of 9 rows
    assert s["local"] == pytest.approx(8 / 9)


def test_perfect_first_token_head():
    s = scores_of(first_token_map(N))
    assert s["first_token"] == pytest.approx(1.0)
    assert s["previous_token"] == pytest.approx(1 / (N - 1))
    assert s["local"] == pytest.approx(0.0)  # token 0 is never part of the local window
    assert s["confidence"] == pytest.approx(1.0)


def test_identity_head():
    s = scores_of(identity_map(N))
    assert s["self"] == pytest.approx(1.0)
    assert s["previous_token"] == pytest.approx(0.0)
    assert s["first_token"] == pytest.approx(0.0)
    assert s["local"] == pytest.approx(1.0)
    assert s["local_lift"] == pytest.approx(1.0)


def test_uniform_head():
    s = scores_of(uniform_map(N))
    rows = range(1, N)
    assert s["entropy_normalized"] == pytest.approx(1.0)
    assert s["entropy"] == pytest.approx(sum(math.log(i + 1) for i in rows) / 9)
    assert s["previous_token"] == pytest.approx(sum(1 / (i + 1) for i in rows) / 9)
    assert s["confidence"] == pytest.approx(s["previous_token"])
    # uniform attention puts exactly the uniform share in the window: no lift
    expected_local = sum((i - max(1, i - 3) + 1) / (i + 1) for i in rows) / 9
    assert s["local"] == pytest.approx(expected_local)
    assert s["local_uniform"] == pytest.approx(expected_local)
    assert s["local_lift"] == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("window", [1, 3, 5])
def test_local_band_head(window):
    s = scores_of(band_map(N, window), window=window)
    assert s["local"] == pytest.approx(1.0)
    assert s["local_lift"] == pytest.approx(1.0)
    assert s["first_token"] == pytest.approx(0.0)


def test_padding_is_ignored_whatever_it_holds():
    """Two windows right-padded into one batch, padded rows and keys full of garbage (even NaN)."""
    short, long = previous_token_map(6)[0, 0], uniform_map(9)[0, 0]
    batch = torch.full((2, 1, 9, 9), float("nan"))
    batch[0, 0, :6, :6] = short
    batch[0, 0, :6, 6:] = 0.0  # causal rows of real tokens never see padded keys
    batch[1, 0] = long
    got = metrics.head_scores(batch, torch.tensor([6, 9]))
    # pooled over the 5 + 8 scored rows
    solo_short, solo_long = scores_of(previous_token_map(6)), scores_of(uniform_map(9))
    for name in ("previous_token", "first_token", "self", "local", "entropy", "confidence"):
        expected = (5 * solo_short[name] + 8 * solo_long[name]) / 13
        assert float(got[name][0]) == pytest.approx(expected), name


def slow_scores(attn: torch.Tensor, length: int, window: int) -> dict[str, float]:
    """The definitions of the metrics module docstring, row by row in plain Python."""
    a = attn.tolist()
    rows = range(1, length)
    totals = dict.fromkeys(["previous_token", "first_token", "self", "local", "entropy", "entropy_normalized", "confidence"], 0.0)
    for i in rows:
        row = a[i][: i + 1]
        entropy = -sum(p * math.log(p) for p in row if p > 0)
        totals["previous_token"] += row[i - 1]
        totals["first_token"] += row[0]
        totals["self"] += row[i]
        totals["local"] += sum(row[max(1, i - window) : i + 1])
        totals["entropy"] += entropy
        totals["entropy_normalized"] += entropy / math.log(i + 1)
        totals["confidence"] += max(row)
    return {name: value / len(rows) for name, value in totals.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_maps_match_slow_loop(seed):
    generator = torch.Generator().manual_seed(seed)
    n, window = 12, 2
    logits = torch.randn(1, 3, n, n, generator=generator) * 3
    logits = logits.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), float("-inf"))
    logits[..., 4] = logits[..., 4].masked_fill(torch.arange(n)[None, None, :] >= 4, -1e9)  # an exact zero column
    attn = torch.softmax(logits, dim=-1).to(torch.float64).to(torch.float32)
    got = metrics.head_scores(attn, torch.tensor([n]), window)
    for head in range(3):
        expected = slow_scores(attn[0, head], n, window)
        for name, value in expected.items():
            assert float(got[name][head]) == pytest.approx(value, rel=1e-5, abs=1e-6), (head, name)


def test_blocks_of_rows_sum_to_the_whole():
    """The capture hands metrics one block of query rows at a time; the sums must not depend on the blocks."""
    attn = torch.softmax(torch.randn(2, 3, 7, 7).masked_fill(~torch.tril(torch.ones(7, 7, dtype=torch.bool)), -1e9), -1)
    lengths = torch.tensor([7, 5])
    whole, uniform, count = metrics.weighted_row_sums(attn, torch.arange(7), lengths)
    parts = [metrics.weighted_row_sums(attn[:, :, a:b], torch.arange(a, b), lengths) for a, b in [(0, 2), (2, 3), (3, 7)]]
    assert torch.allclose(sum(p[0] for p in parts), whole)
    assert float(sum(p[1] for p in parts)) == pytest.approx(float(uniform))
    assert int(sum(p[2] for p in parts)) == int(count) == 6 + 4


def test_single_token_windows_have_no_scored_rows():
    with pytest.raises(ValueError):
        metrics.head_scores(torch.ones(1, 1, 1, 1), torch.tensor([1]))


def probe_map(period: int, offset: int) -> torch.Tensor:
    """(1, 1, n, n) for BOS + 2 copies of `period` tokens: second-copy rows put all weight at key i + offset,
    every other row on its previous token."""
    n = 1 + 2 * period
    rows = [[1.0]]
    for i in range(1, n):
        target = i + offset if i >= 1 + period else i - 1
        rows.append([1.0 if j == target else 0.0 for j in range(i + 1)])
    return causal_rows(rows)


def probe_scores_of(attn, period):
    from attnscope.stats import ProbeStatistics

    statistics = ProbeStatistics(1, 1, torch.device("cpu"), period, first_query=1 + period)
    n = attn.shape[-1]
    statistics.add_block(0, AttentionBlock.from_probs(attn, torch.arange(n), torch.tensor([n])))
    return {name: float(value[0, 0]) for name, value in statistics.means().items()}


def test_planted_induction_and_duplicate_heads():
    period = 7
    assert probe_scores_of(probe_map(period, -(period - 1)), period) == pytest.approx({"induction": 1.0, "duplicate_token": 0.0})
    assert probe_scores_of(probe_map(period, -period), period) == pytest.approx({"induction": 0.0, "duplicate_token": 1.0})
    # a previous-token head on the probe scores nothing on either
    assert probe_scores_of(previous_token_map(1 + 2 * period), period) == pytest.approx({"induction": 0.0, "duplicate_token": 0.0})


def test_offset_attention_before_the_start_is_zero():
    attn = uniform_map(5)
    got = metrics.offset_attention(attn, torch.arange(5), -3)
    assert got[0, 0].tolist() == pytest.approx([0.0, 0.0, 0.0, 1 / 4, 1 / 5])


@pytest.mark.parametrize("seed", [0, 1])
def test_layer_row_scores_equal_row_scores(seed):
    """The capture's fast form (per-row Z, expected logit and a few gathered logits) against the definitions
    applied to the probabilities."""
    generator = torch.Generator().manual_seed(seed)
    B, H, n = 2, 3, 11
    logits = torch.randn(B, H, n, n, generator=generator) * 4
    logits = logits.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    shifted = logits - logits.amax(-1, keepdim=True)  # each row's maximum 0, masked keys -inf
    normalizer = shifted.exp().sum(-1)
    expected = (probs * shifted.nan_to_num(neginf=0.0)).sum(-1)
    positions = torch.arange(n)
    for window in (1, 3):
        keys = metrics.gathered_keys(positions, window)  # (n, w+2)
        gathered = shifted.gather(-1, keys.expand(B, H, *keys.shape))
        reference = metrics.row_scores(probs, positions, window)
        got = metrics.layer_row_scores(normalizer, expected, gathered, window)
        for name in metrics.ROW_SCORES:
            assert torch.allclose(got[name][..., 1:], reference[name][..., 1:], atol=2e-5), (name, window)
