"""The needle probe's retrieval score (scores.rows.retrieval_hits, pipeline.reducers.RetrievalStatistics) on
hand-built attention with planted strongest keys, whose scores are known exactly, fed in blocks as the capture feeds
them. The probe's windows and the score on a real model: tests/integration/test_needle.py."""

from __future__ import annotations

import pytest
import torch

from attnscope.pipeline.blocks import AttentionBlock
from attnscope.pipeline.reducers import RetrievalStatistics
from attnscope.scores import rows

# A small probe of two windows: BOS, a haystack of 8 with a cue and a needle of 4 inside, the cue and the needle
# again. Window 0 has its needle at 3 (haystack[:1], cue at 2), window 1 at 7 (haystack[:5], cue at 6).
NEEDLE, HAYSTACK = 4, 8
LENGTH = 1 + HAYSTACK + 2 * (1 + NEEDLE)  # 19
FIRST_QUERY = LENGTH - NEEDLE - 1  # 14: the second cue; rows 14..17 predict the copy's 4 tokens, row 18 nothing
STARTS = torch.tensor([3, 7])


def _planted(targets: list[list[int]]) -> torch.Tensor:
    """(2, H, LENGTH, LENGTH) causal attention: every row of every head on its previous token (row 0 on itself),
    except the copy's rows of head h, window w, whose k-th puts all its weight on key targets[h][w][k]."""
    heads = len(targets)
    attn = torch.zeros(2, heads, LENGTH, LENGTH)
    for i in range(LENGTH):
        attn[:, :, i, max(i - 1, 0)] = 1.0
    for head, per_window in enumerate(targets):
        for window, keys in enumerate(per_window):
            for k, key in enumerate(keys):
                row = FIRST_QUERY + k
                attn[window, head, row] = 0.0
                attn[window, head, row, key] = 1.0
    return attn


def _scores(attn: torch.Tensor, block_rows: int, lengths=(LENGTH, LENGTH)) -> tuple[list[float], int]:
    """Retrieval of each head of `attn`, fed to the reducer in blocks of `block_rows` query rows (a causal block
    holds the keys up to its last row, as the capture's do)."""
    statistics = RetrievalStatistics(1, attn.shape[1], torch.device("cpu"), FIRST_QUERY, STARTS)
    for first in range(0, LENGTH, block_rows):
        last = min(LENGTH, first + block_rows)
        block = attn[:, :, first:last, :last]  # (B, H, b, k)
        statistics.add_block(0, AttentionBlock.from_probs(block, torch.arange(first, last), torch.tensor(lengths)))
    return statistics.means()["retrieval"][0].tolist(), int(statistics.row_count)


def _copy_targets(window: int, shift: int = 0) -> list[int]:
    return [int(STARTS[window]) + k + shift for k in range(NEEDLE)]


@pytest.mark.parametrize("block_rows", [LENGTH, 5, 1, 15])
def test_planted_heads_have_exact_retrieval_scores_whatever_the_blocks(block_rows):
    """A head planted on the needle token being copied scores 1; a previous-token head 0; a duplicate-token head
    (on the earlier occurrence of the current token, one before the copied one) 0; one right on half the rows 0.5.
    Blocks of 15 rows straddle the copy's first row; blocks that end before it are skipped."""
    retrieval = [_copy_targets(0), _copy_targets(1)]
    previous = [[FIRST_QUERY + k - 1 for k in range(NEEDLE)]] * 2
    duplicate = [_copy_targets(0, -1), _copy_targets(1, -1)]  # k = 0: the cue's earlier occurrence
    half = [[key if k % 2 == 0 else 0 for k, key in enumerate(_copy_targets(w))] for w in range(2)]
    scores, rows_counted = _scores(_planted([retrieval, previous, duplicate, half]), block_rows)
    assert rows_counted == 2 * NEEDLE  # the copy's rows of both windows, counted once (layer 0)
    assert scores == [1.0, 0.0, 0.0, 0.5]


def test_the_targets_move_with_each_windows_needle():
    """Window 1's head looking where window 0's needle is (the right offset, the wrong window) scores nothing there."""
    swapped = [_copy_targets(0), _copy_targets(0)]
    scores, _ = _scores(_planted([swapped]), LENGTH)
    assert scores == [0.5]  # window 0's 4 rows hit, window 1's miss


def test_a_tie_goes_to_the_first_key_of_maximal_weight():
    """Two keys of equal weight: the earlier is the strongest (torch.argmax), as exact as any other key."""
    attn = _planted([[_copy_targets(0), _copy_targets(1)], [_copy_targets(0), _copy_targets(1)]])
    for k in range(NEEDLE):
        row = FIRST_QUERY + k
        for window in range(2):
            target = int(STARTS[window]) + k
            attn[window, 0, row, target] = 0.5
            attn[window, 0, row, 1] = 0.5  # an earlier key as strong: head 0 misses every row
            attn[window, 1, row, target] = 0.5
            attn[window, 1, row, row] = 0.5  # a later key as strong: head 1 hits every row
    scores, _ = _scores(attn, LENGTH)
    assert scores == [0.0, 1.0]


def test_only_real_rows_of_the_copy_are_scored():
    """A right-padded window scores the copy's rows before its last token only: row 18 predicts nothing, and rows
    past a shorter window's end are padding."""
    planted = [_copy_targets(0), _copy_targets(1)]
    scores, counted = _scores(_planted([planted]), LENGTH, lengths=(LENGTH, LENGTH - 2))
    assert counted == NEEDLE + (NEEDLE - 2)
    assert scores == [1.0]
    hits, copy = rows.retrieval_hits(
        _planted([planted]), torch.arange(LENGTH), torch.tensor([LENGTH, LENGTH]), FIRST_QUERY, STARTS
    )
    assert hits.tolist() == [2 * NEEDLE] and int(copy) == 2 * NEEDLE and hits.dtype == torch.int64


def test_several_layers_keep_their_own_hits():
    statistics = RetrievalStatistics(2, 1, torch.device("cpu"), FIRST_QUERY, STARTS)
    hit, miss = (_planted([[_copy_targets(w) for w in range(2)]]), _planted([[[0] * NEEDLE] * 2]))
    for layer, attn in enumerate((hit, miss)):
        statistics.add_block(layer, AttentionBlock.from_probs(attn, torch.arange(LENGTH), torch.tensor([LENGTH] * 2)))
    assert statistics.hits.tolist() == [[2 * NEEDLE], [0]]
    assert statistics.means()["retrieval"].tolist() == [[1.0], [0.0]]
