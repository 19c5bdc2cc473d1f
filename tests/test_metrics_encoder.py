"""Encoder (bidirectional) metrics on hand-built maps whose scores are known exactly, against a slow loop, and the
fast per-row form against the reference form."""

import math

import pytest
import torch

from attnscope import metrics
from attnscope.stats import DiversityStatistics
from attnscope.capture import AttentionBlock


def full_map(rows: list[list[float]]) -> torch.Tensor:
    """(1, 1, n, n) from n rows of n weights each (every key visible)."""
    return torch.tensor(rows, dtype=torch.float32)[None, None]


def one_hot_map(n: int, target) -> torch.Tensor:
    """Row i puts all its weight on key target(i)."""
    return full_map([[1.0 if j == target(i) else 0.0 for j in range(n)] for i in range(n)])


def uniform_map(n: int) -> torch.Tensor:
    return full_map([[1.0 / n] * n for _ in range(n)])


def scores_of(attn, length=None, window=3):
    n = attn.shape[-1]
    lengths = torch.tensor([n if length is None else length])
    return {name: float(value[0]) for name, value in metrics.head_scores(attn, lengths, window, causal=False).items()}


N = 10  # [CLS] + 8 text tokens + [SEP]: rows 1..8 are scored


def test_scored_rows_are_all_but_the_first_and_last():
    scored = metrics.scored_rows(torch.tensor([10, 3, 2]), torch.arange(10), causal=False)
    assert scored[0].tolist() == [False] + [True] * 8 + [False]
    assert scored[1].tolist() == [False, True] + [False] * 8
    assert not scored[2].any()  # [CLS] [SEP]: nothing to score
    causal = metrics.scored_rows(torch.tensor([10]), torch.arange(10))
    assert causal[0].tolist() == [False] + [True] * 9  # decoders unchanged


def test_perfect_next_token_head():
    s = scores_of(one_hot_map(N, lambda i: min(i + 1, N - 1)))
    assert s["next_token"] == pytest.approx(1.0)
    assert s["previous_token"] == pytest.approx(0.0)
    assert s["self"] == pytest.approx(0.0)
    assert s["last_token"] == pytest.approx(1 / 8)  # row 8's next token is [SEP]
    # the next token is inside the symmetric window unless it is [SEP] (row 8): 7 of 8 rows
    assert s["local"] == pytest.approx(7 / 8)
    assert s["confidence"] == pytest.approx(1.0)
    assert s["entropy"] == pytest.approx(0.0, abs=1e-7)


def test_perfect_previous_token_head():
    s = scores_of(one_hot_map(N, lambda i: max(i - 1, 0)))
    assert s["previous_token"] == pytest.approx(1.0)
    assert s["next_token"] == pytest.approx(0.0)
    assert s["first_token"] == pytest.approx(1 / 8)  # row 1's previous token is [CLS]
    assert s["local"] == pytest.approx(7 / 8)


def test_perfect_last_token_head():
    s = scores_of(one_hot_map(N, lambda i: N - 1))
    assert s["last_token"] == pytest.approx(1.0)
    assert s["first_token"] == pytest.approx(0.0)
    assert s["next_token"] == pytest.approx(1 / 8)
    assert s["local"] == pytest.approx(0.0)  # the last token is never local, like the first


def test_perfect_first_token_head():
    s = scores_of(one_hot_map(N, lambda i: 0))
    assert s["first_token"] == pytest.approx(1.0)
    assert s["last_token"] == pytest.approx(0.0)
    assert s["local"] == pytest.approx(0.0)


def test_identity_head():
    s = scores_of(one_hot_map(N, lambda i: i))
    assert s["self"] == pytest.approx(1.0)
    assert s["local"] == pytest.approx(1.0)
    assert s["local_lift"] == pytest.approx(1.0)


def test_uniform_head():
    s = scores_of(uniform_map(N))
    rows = range(1, N - 1)
    assert s["entropy"] == pytest.approx(math.log(N))
    assert s["entropy_normalized"] == pytest.approx(1.0)  # divided by ln(length): every key is visible
    for name in ("previous_token", "next_token", "first_token", "last_token", "self", "confidence"):
        assert s[name] == pytest.approx(1 / N), name
    expected_local = sum((min(N - 2, i + 3) - max(1, i - 3) + 1) / N for i in rows) / len(rows)
    assert s["local"] == pytest.approx(expected_local)
    assert s["local_uniform"] == pytest.approx(expected_local)
    assert s["local_lift"] == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("window", [1, 2, 4])
def test_symmetric_band_head(window):
    """Uniform over max(1, i-w) .. min(n-2, i+w) on every scored row: all of it local."""
    rows = []
    for i in range(N):
        low, high = max(1, i - window), min(N - 2, i + window)
        rows.append([1.0 / (high - low + 1) if low <= j <= high else 0.0 for j in range(N)] if 1 <= i <= N - 2 else [1.0 / N] * N)
    s = scores_of(full_map(rows), window=window)
    assert s["local"] == pytest.approx(1.0)
    assert s["local_lift"] == pytest.approx(1.0)
    assert s["first_token"] == s["last_token"] == pytest.approx(0.0)


def slow_scores(attn: torch.Tensor, length: int, window: int) -> dict[str, float]:
    """The encoder definitions of the metrics module docstring, row by row in plain Python."""
    a = attn.tolist()
    rows = range(1, length - 1)
    names = ["previous_token", "first_token", "self", "local", "entropy", "entropy_normalized", "confidence",
             "next_token", "last_token"]
    totals = dict.fromkeys(names, 0.0)
    for i in rows:
        row = a[i][:length]
        entropy = -sum(p * math.log(p) for p in row if p > 0)
        totals["previous_token"] += row[i - 1]
        totals["next_token"] += row[i + 1]
        totals["first_token"] += row[0]
        totals["last_token"] += row[length - 1]
        totals["self"] += row[i]
        totals["local"] += sum(row[max(1, i - window) : min(length - 2, i + window) + 1])
        totals["entropy"] += entropy
        totals["entropy_normalized"] += entropy / math.log(length)
        totals["confidence"] += max(row)
    return {name: value / len(rows) for name, value in totals.items()}


def random_padded_maps(seed: int, lengths: list[int], heads: int = 3, scale: float = 3.0):
    """(B, H, n, n) softmax maps of right-padded windows, padded keys masked; returns (probs, logits)."""
    generator = torch.Generator().manual_seed(seed)
    B, n = len(lengths), max(lengths)
    logits = torch.randn(B, heads, n, n, generator=generator) * scale
    real_key = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (B, n)
    logits = logits.masked_fill(~real_key[:, None, None, :], float("-inf"))
    return torch.softmax(logits, dim=-1), logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_maps_match_slow_loop(seed):
    lengths = [12, 7, 3]
    attn, _ = random_padded_maps(seed, lengths)
    window = 2
    got = metrics.head_scores(attn, torch.tensor(lengths), window, causal=False)
    pooled = {}
    rows = [length - 2 for length in lengths]
    for head in range(3):
        for b, length in enumerate(lengths):
            for name, value in slow_scores(attn[b, head], length, window).items():
                pooled.setdefault((head, name), 0.0)
                pooled[(head, name)] += value * rows[b] / sum(rows)
    for (head, name), value in pooled.items():
        assert float(got[name][head]) == pytest.approx(value, rel=1e-5, abs=1e-6), (head, name)


@pytest.mark.parametrize("seed", [0, 1])
def test_layer_row_scores_equal_row_scores(seed):
    """The capture's fast form (per-row Z, expected logit and logits gathered at per-window keys) against the
    definitions applied to the probabilities, on padded windows of different lengths."""
    lengths = torch.tensor([11, 6, 4])
    probs, logits = random_padded_maps(seed, lengths.tolist(), scale=4.0)
    B, H, n, _ = probs.shape
    shifted = logits - logits.amax(-1, keepdim=True)
    normalizer = shifted.exp().sum(-1)
    expected = (probs * shifted.nan_to_num(neginf=0.0)).sum(-1)
    positions = torch.arange(n)
    scored = metrics.scored_rows(lengths, positions, causal=False)[:, None].expand(B, H, n)
    for window in (1, 3):
        keys = metrics.encoder_gathered_keys(positions, lengths, window)  # (B, n, 2w+3)
        assert keys.shape == (B, n, 2 * window + 3)
        gathered = shifted.gather(-1, keys[:, None].expand(B, H, n, keys.shape[-1]))
        reference = metrics.row_scores(probs, positions, window, lengths, causal=False)
        got = metrics.layer_row_scores(normalizer, expected, gathered, window, lengths, causal=False)
        for name in metrics.row_score_names(causal=False):
            assert torch.allclose(got[name][scored], reference[name][scored], atol=2e-5), (name, window)


def test_encoder_sums_have_the_two_extra_scores():
    attn = uniform_map(5)
    sums, uniform, count = metrics.weighted_row_sums(attn, torch.arange(5), torch.tensor([5]), causal=False)
    assert sums.shape == (1, len(metrics.ROW_SCORES) + 2) and int(count) == 3
    assert set(metrics.finish(sums, float(uniform), int(count), causal=False)) == set(metrics.ALL_SCORES)
    with pytest.raises(ValueError):
        metrics.head_scores(uniform_map(2), torch.tensor([2]), causal=False)  # [CLS] [SEP] only


def test_diversity_uses_encoder_rows_and_every_key():
    """Two heads identical on the scored rows but different on the first and last rows and on keys after the
    query: an encoder's statistics ignore the first/last rows and see every key."""
    n = 6
    a = uniform_map(n)[0, 0]
    b = a.clone()
    b[0] = torch.tensor([1.0, 0, 0, 0, 0, 0])
    b[n - 1] = torch.tensor([0, 0, 0, 0, 0, 1.0])
    c = one_hot_map(n, lambda i: min(i + 1, n - 1))[0, 0]  # only keys after the query
    attn = torch.stack([a, b, c])[None]  # (1, 3, n, n)
    statistics = DiversityStatistics([0], 3, torch.device("cpu"), causal=False)
    statistics.add_block(0, AttentionBlock.from_probs(attn, torch.arange(n), torch.tensor([n])))
    result = statistics.results()
    assert int(statistics.row_count) == n - 2
    assert float(result["js"][0, 1]) == pytest.approx(0.0, abs=1e-6)
    # uniform over 6 keys against one-hot: JSD = H(m) - H(p)/2 in bits, the same on every row
    m = torch.tensor([1 / 12] * 5 + [1 / 12 + 1 / 2])
    jsd = float(-(m * m.log2()).sum() - math.log2(6) / 2)
    assert float(result["js"][0, 2]) == pytest.approx(jsd, rel=1e-5)
