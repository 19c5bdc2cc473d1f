"""Per-head scores (scores.kinds, scores.rows) on hand-built attention maps whose scores are known exactly, against a
slow loop that spells out the definitions, and the capture's fast per-row form against the reference form; for
decoders (causal) and encoders (bidirectional) alike."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from attnscope.pipeline.blocks import AttentionBlock
from attnscope.pipeline.reducers import DiversityStatistics, ProbeStatistics
from attnscope.scores import catalog, rows
from attnscope.scores.kinds import DECODER, ENCODER
from tests.support import band_map, causal_rows, first_token_map, identity_map, previous_token_map, uniform_map

KINDS = [DECODER, ENCODER]
N = 10  # decoder: rows 1..9 are scored; encoder: [CLS] + 8 text tokens + [SEP], rows 1..8 are scored

# --------------------------------------------------------------------------- encoder maps, built by hand


def _full_map(rows_: list[list[float]]) -> torch.Tensor:
    """(1, 1, n, n) from n rows of n weights each (every key visible)."""
    return torch.tensor(rows_, dtype=torch.float32)[None, None]


def _one_hot_map(n: int, target) -> torch.Tensor:
    """Row i puts all its weight on key target(i)."""
    return _full_map([[1.0 if j == target(i) else 0.0 for j in range(n)] for i in range(n)])


def _encoder_uniform_map(n: int) -> torch.Tensor:
    return _full_map([[1.0 / n] * n for _ in range(n)])


def _encoder_band_map(n: int, window: int) -> torch.Tensor:
    """Uniform over max(1, i-w) .. min(n-2, i+w) on every scored row (uniform elsewhere)."""
    built = []
    for i in range(n):
        low, high = max(1, i - window), min(n - 2, i + window)
        scored = 1 <= i <= n - 2
        built.append([1.0 / (high - low + 1) if low <= j <= high else 0.0 for j in range(n)] if scored else [1 / n] * n)
    return _full_map(built)


UNIFORM = {DECODER.name: uniform_map, ENCODER.name: _encoder_uniform_map}
BAND = {DECODER.name: band_map, ENCODER.name: _encoder_band_map}
PREVIOUS = {DECODER.name: previous_token_map, ENCODER.name: lambda n: _one_hot_map(n, lambda i: max(i - 1, 0))}


def _scores_of(kind, attn, length=None, window=3) -> dict[str, float]:
    n = attn.shape[-1]
    lengths = torch.tensor([n if length is None else length])
    return {name: float(value[0]) for name, value in rows.head_scores(kind, attn, lengths, window).items()}


# ------------------------------------------------------------------------------------ hand-built maps

HAND_BUILT = [
    # decoder: 9 scored rows; row 1's previous token is token 0, which is never inside the local window
    pytest.param(
        DECODER,
        previous_token_map(N),
        dict(previous_token=1, first_token=1 / 9, self=0, confidence=1, entropy=0, entropy_normalized=0, local=8 / 9),
        id="decoder-previous",
    ),
    pytest.param(
        DECODER,
        first_token_map(N),
        dict(first_token=1, previous_token=1 / 9, local=0, confidence=1),
        id="decoder-first",
    ),
    pytest.param(
        DECODER,
        identity_map(N),
        dict(self=1, previous_token=0, first_token=0, local=1, local_lift=1),
        id="decoder-identity",
    ),
    # encoder: 8 scored rows; row 8's next token is [SEP], row 1's previous is [CLS], neither ever local
    pytest.param(
        ENCODER,
        _one_hot_map(N, lambda i: min(i + 1, N - 1)),
        dict(next_token=1, previous_token=0, self=0, last_token=1 / 8, local=7 / 8, confidence=1, entropy=0),
        id="encoder-next",
    ),
    pytest.param(
        ENCODER,
        _one_hot_map(N, lambda i: max(i - 1, 0)),
        dict(previous_token=1, next_token=0, first_token=1 / 8, local=7 / 8),
        id="encoder-previous",
    ),
    pytest.param(
        ENCODER,
        _one_hot_map(N, lambda i: N - 1),
        dict(last_token=1, first_token=0, next_token=1 / 8, local=0),
        id="encoder-last",
    ),
    pytest.param(
        ENCODER,
        _one_hot_map(N, lambda i: 0),
        dict(first_token=1, last_token=0, local=0),
        id="encoder-first",
    ),
    pytest.param(
        ENCODER,
        _one_hot_map(N, lambda i: i),
        dict(self=1, local=1, local_lift=1, next_token=0, previous_token=0),
        id="encoder-identity",
    ),
]


@pytest.mark.parametrize("kind, attn, expected", HAND_BUILT)
def test_hand_built_heads_have_their_known_scores(kind, attn, expected):
    s = _scores_of(kind, attn)
    for name, value in expected.items():
        assert s[name] == pytest.approx(value, abs=1e-7), name


def _uniform_expectations(kind, n, window=3) -> dict[str, float]:
    """What uniform attention scores, from the definitions by hand."""
    if kind is DECODER:
        scored = range(1, n)
        mean = lambda f: sum(f(i) for i in scored) / len(scored)  # noqa: E731
        local = mean(lambda i: (i - max(1, i - window) + 1) / (i + 1))
        prev = mean(lambda i: 1 / (i + 1))
        return dict(
            entropy=mean(lambda i: math.log(i + 1)),
            entropy_normalized=1.0,
            previous_token=prev,
            first_token=prev,
            self=prev,
            confidence=prev,
            local=local,
            local_uniform=local,
            local_lift=0.0,
        )
    scored = range(1, n - 1)
    local = sum((min(n - 2, i + window) - max(1, i - window) + 1) / n for i in scored) / len(scored)
    share = dict.fromkeys(("previous_token", "next_token", "first_token", "last_token", "self", "confidence"), 1 / n)
    return dict(entropy=math.log(n), entropy_normalized=1.0, local=local, local_uniform=local, local_lift=0.0, **share)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_uniform_head_is_broad_with_no_local_lift(kind):
    """Uniform attention puts exactly the uniform share in the window: no lift; its entropy is ln(visible keys)."""
    s = _scores_of(kind, UNIFORM[kind.name](N))
    for name, value in _uniform_expectations(kind, N).items():
        assert s[name] == pytest.approx(value, rel=1e-6, abs=1e-7), name


@pytest.mark.parametrize("window", [1, 2, 3, 5])
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_local_band_head(kind, window):
    s = _scores_of(kind, BAND[kind.name](N, window), window=window)
    assert s["local"] == pytest.approx(1.0)
    assert s["local_lift"] == pytest.approx(1.0)
    assert s["first_token"] == pytest.approx(0.0)
    if kind is ENCODER:
        assert s["last_token"] == pytest.approx(0.0)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_padding_is_ignored_whatever_it_holds(kind):
    """Two windows right-padded into one batch, padded rows and keys full of garbage (even NaN): the scores are the
    two windows' scores pooled over their scored rows."""
    short, long = PREVIOUS[kind.name](6)[0, 0], UNIFORM[kind.name](9)[0, 0]
    batch = torch.full((2, 1, 9, 9), float("nan"))
    batch[0, 0, :6, :6] = short
    batch[0, 0, :6, 6:] = 0.0  # rows of real tokens never see padded keys
    batch[1, 0] = long
    got = rows.head_scores(kind, batch, torch.tensor([6, 9]))
    solo_short, solo_long = _scores_of(kind, PREVIOUS[kind.name](6)), _scores_of(kind, UNIFORM[kind.name](9))
    a, b = (5, 8) if kind is DECODER else (4, 7)  # scored rows of each window
    for name in kind.row_score_names:
        expected = (a * solo_short[name] + b * solo_long[name]) / (a + b)
        assert float(got[name][0]) == pytest.approx(expected), name


# ------------------------------------------------------------------------------------- the slow loop


def _slow_scores(kind, attn: torch.Tensor, length: int, window: int) -> tuple[dict[str, float], int]:
    """The definitions of scores.kinds' docstring, row by row in plain Python: (sums over scored rows, row count)."""
    a = attn.tolist()
    causal = kind is DECODER
    scored = range(1, length) if causal else range(1, length - 1)
    totals: dict[str, float] = {}

    def add(name, value):
        totals[name] = totals.get(name, 0.0) + value

    for i in scored:
        row = a[i][: i + 1] if causal else a[i][:length]
        visible = len(row)
        low, high = max(1, i - window), (i if causal else min(length - 2, i + window))
        entropy = -sum(p * math.log(p) for p in row if p > 0)
        add("previous_token", row[i - 1])
        add("first_token", row[0])
        add("self", row[i])
        add("local", sum(row[low : high + 1]))
        add("entropy", entropy)
        add("entropy_normalized", entropy / math.log(visible))
        add("confidence", max(row))
        add("local_uniform", (high - low + 1) / visible)
        if not causal:
            add("next_token", row[i + 1])
            add("last_token", row[length - 1])
    return totals, len(scored)


def _random_maps(kind, seed: int, lengths: list[int], heads: int = 3, scale: float = 3.0):
    """(B, H, n, n) softmax maps of right-padded windows (keys a row cannot see masked) with an exact zero column;
    returns (probs, logits)."""
    generator = torch.Generator().manual_seed(seed)
    B, n = len(lengths), max(lengths)
    logits = torch.randn(B, heads, n, n, generator=generator) * scale
    allowed = (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None])[:, None, :].expand(B, n, n)  # (B, n, n)
    if kind.causal:
        allowed = allowed & torch.tril(torch.ones(n, n, dtype=torch.bool))
    logits = logits.masked_fill(~allowed[:, None], float("-inf"))
    logits[..., 4] = logits[..., 4].masked_fill(torch.arange(n) >= 4, -1e9)  # key 4 weighs exactly 0 from row 4 on
    return torch.softmax(logits, dim=-1), logits


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_random_padded_maps_match_the_slow_loop(kind, seed):
    lengths, window = [12, 7, 3], 2
    attn, _ = _random_maps(kind, seed, lengths)
    assert float(attn[0, 0, 6, 4]) == 0.0  # the zero column, where 0·ln 0 matters
    got = rows.head_scores(kind, attn, torch.tensor(lengths), window)
    assert set(got) == {
        s.name for s in catalog.scores_for(kind.name) if s.source not in catalog.PROBES
    }  # neither probe reads the texts
    for head in range(3):
        pooled: dict[str, float] = {}
        count = 0
        for b, length in enumerate(lengths):
            sums, scored = _slow_scores(kind, attn[b, head], length, window)
            count += scored
            for name, value in sums.items():
                pooled[name] = pooled.get(name, 0.0) + value
        expected = {name: value / count for name, value in pooled.items()}
        uniform = expected["local_uniform"]
        expected["local_lift"] = (expected["local"] - uniform) / (1 - uniform)
        for name, value in expected.items():
            assert float(got[name][head]) == pytest.approx(value, rel=1e-5, abs=1e-6), (head, name)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_blocks_of_rows_sum_to_the_whole(kind):
    """The capture hands the reducers one block of query rows at a time; the sums must not depend on the blocks."""
    attn, _ = _random_maps(kind, 5, [7, 5])
    lengths, positions = torch.tensor([7, 5]), torch.arange(7)

    def summed(a, b):
        scores = kind.row_scores(attn[:, :, a:b], positions[a:b], lengths)
        return rows.sum_scored_rows(kind, scores, positions[a:b], lengths)

    whole, uniform, count = summed(0, 7)
    parts = [summed(a, b) for a, b in [(0, 2), (2, 3), (3, 7)]]
    assert torch.allclose(sum(p[0] for p in parts), whole)
    assert float(sum(p[1] for p in parts)) == pytest.approx(float(uniform))
    assert int(sum(p[2] for p in parts)) == int(count) == ((6 + 4) if kind is DECODER else (5 + 3))


def test_scored_rows_of_each_kind():
    lengths, positions = torch.tensor([10, 3, 2]), torch.arange(10)
    encoder = ENCODER.scored_rows(lengths, positions)
    assert encoder[0].tolist() == [False] + [True] * 8 + [False]  # all but [CLS] and [SEP]
    assert encoder[1].tolist() == [False, True] + [False] * 8
    assert not encoder[2].any()  # [CLS] [SEP]: nothing to score
    decoder = DECODER.scored_rows(lengths, positions)
    assert decoder[0].tolist() == [False] + [True] * 9  # every row but the first, which sees only itself
    assert decoder[1].tolist() == [False, True, True] + [False] * 7
    assert decoder[2].tolist() == [False, True] + [False] * 8


@pytest.mark.parametrize(
    "kind, attn, length",
    [(DECODER, torch.ones(1, 1, 1, 1), 1), (ENCODER, _encoder_uniform_map(2), 2)],
    ids=["decoder-BOS-only", "encoder-CLS-SEP-only"],
)
def test_windows_with_no_scored_rows_are_refused(kind, attn, length):
    with pytest.raises(ValueError, match="no scored rows"):
        rows.head_scores(kind, attn, torch.tensor([length]))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_sums_have_a_column_per_row_score_and_finish_adds_the_derived_ones(kind):
    """An encoder sums two more row scores (next_token, last_token) than a decoder; `finish` gives every score of
    the kind that does not come from the probe."""
    attn = UNIFORM[kind.name](5)
    positions, lengths = torch.arange(5), torch.tensor([5])
    sums, uniform, count = rows.sum_scored_rows(kind, kind.row_scores(attn, positions, lengths), positions, lengths)
    extra = 2 if kind is ENCODER else 0
    assert sums.shape == (1, 7 + extra) and int(count) == (4 if kind is DECODER else 3)
    finished = rows.finish(kind, sums, float(uniform), int(count))
    assert set(finished) == {
        s.name for s in catalog.scores_for(kind.name) if s.source not in catalog.PROBES
    }  # neither probe reads the texts


# --------------------------------------------------------------------------------- the capture's fast form


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_layer_row_scores_equal_row_scores(kind, seed):
    """The capture's fast form (per-row Z, expected logit and logits gathered at a few keys) against the
    definitions applied to the probabilities, on padded windows of different lengths."""
    lengths = torch.tensor([11, 6, 4])
    probs, logits = _random_maps(kind, seed, lengths.tolist(), scale=4.0)
    B, H, n, _ = probs.shape
    shifted = logits - logits.amax(-1, keepdim=True)  # each row's maximum 0, masked keys -inf
    normalizer = shifted.exp().sum(-1)
    expected = (probs * shifted.nan_to_num(neginf=0.0)).sum(-1)
    positions = torch.arange(n)
    scored = kind.scored_rows(lengths, positions)[:, None].expand(B, H, n)
    for window in (1, 3):
        keys = kind.gathered_keys(positions, lengths, window)  # (n, m) or (B, n, m)
        keys = keys.expand(B, n, keys.shape[-1])
        width = window + 2 if kind is DECODER else 2 * window + 3
        assert keys.shape == (B, n, width)
        gathered = shifted.gather(-1, keys[:, None].expand(B, H, n, width))
        reference = kind.row_scores(probs, positions, lengths, window)
        visible = kind.visible_mask(positions, lengths, n)  # (B, n, n)
        summary = SimpleNamespace(
            normalizer=normalizer, expected_logit=expected, gathered=gathered, lengths=lengths,
            visible=visible.sum(-1), gathered_visible=visible.gather(-1, keys), peak=None, mass=None,
        )  # fmt: skip
        got = kind.layer_row_scores(summary, window)
        assert set(got) == {*kind.row_score_names, "local_uniform"}
        for name in kind.row_score_names:
            assert torch.allclose(got[name][scored], reference[name][scored], atol=2e-5), (name, window)
        uniform_rows = scored[:, 0]
        assert torch.allclose(got["local_uniform"][uniform_rows], reference["local_uniform"][uniform_rows])


# ------------------------------------------------------------------------------------------- the probe


def _probe_map(period: int, offset: int) -> torch.Tensor:
    """(1, 1, n, n) for BOS + 2 copies of `period` tokens: second-copy rows put all weight at key i + offset,
    every other row on its previous token."""
    n = 1 + 2 * period
    built = [[1.0]]
    for i in range(1, n):
        target = i + offset if i >= 1 + period else i - 1
        built.append([1.0 if j == target else 0.0 for j in range(i + 1)])
    return causal_rows(built)


def _probe_scores_of(attn, period):
    statistics = ProbeStatistics(1, 1, torch.device("cpu"), period, first_query=1 + period)
    n = attn.shape[-1]
    statistics.add_block(0, AttentionBlock.from_probs(attn, torch.arange(n), torch.tensor([n])))
    assert int(statistics.row_count) == period  # the second copy only
    return {name: float(value[0, 0]) for name, value in statistics.means().items()}


def test_planted_induction_and_duplicate_heads():
    period = 7
    induction = _probe_scores_of(_probe_map(period, -(period - 1)), period)
    assert induction == pytest.approx({"induction": 1.0, "duplicate_token": 0.0})
    duplicate = _probe_scores_of(_probe_map(period, -period), period)
    assert duplicate == pytest.approx({"induction": 0.0, "duplicate_token": 1.0})
    # a previous-token head on the probe scores nothing on either
    previous = _probe_scores_of(previous_token_map(1 + 2 * period), period)
    assert previous == pytest.approx({"induction": 0.0, "duplicate_token": 0.0})


def test_offset_attention_before_the_start_is_zero():
    got = rows.offset_attention(uniform_map(5), torch.arange(5), -3)
    assert got[0, 0].tolist() == pytest.approx([0.0, 0.0, 0.0, 1 / 4, 1 / 5])


# -------------------------------------------------------------------------------- diversity of an encoder


def test_encoder_diversity_uses_encoder_rows_and_every_key():
    """Two heads identical on the scored rows but different on the first and last rows, and one whose attention
    is only on keys after the query: an encoder's statistics ignore the first/last rows and see every key."""
    n = 6
    a = _encoder_uniform_map(n)[0, 0]
    b = a.clone()
    b[0] = torch.tensor([1.0, 0, 0, 0, 0, 0])
    b[n - 1] = torch.tensor([0, 0, 0, 0, 0, 1.0])
    c = _one_hot_map(n, lambda i: min(i + 1, n - 1))[0, 0]  # only keys after the query
    attn = torch.stack([a, b, c])[None]  # (1, 3, n, n)
    statistics = DiversityStatistics(ENCODER, [0], 3, torch.device("cpu"))
    statistics.add_block(0, AttentionBlock.from_probs(attn, torch.arange(n), torch.tensor([n])))
    result = statistics.results()
    assert int(statistics.row_count) == n - 2
    assert float(result["js"][0, 1]) == pytest.approx(0.0, abs=1e-6)
    # uniform over 6 keys against one-hot: JSD = H(m) - H(p)/2 in bits, the same on every row
    m = torch.tensor([1 / 12] * 5 + [1 / 12 + 1 / 2])
    jsd = float(-(m * m.log2()).sum() - math.log2(6) / 2)
    assert float(result["js"][0, 2]) == pytest.approx(jsd, rel=1e-5)
    assert float(result["cosine"][0, 1]) == pytest.approx(1.0)
