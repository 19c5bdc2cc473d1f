"""Words: tokens grouped into words from hand-written vocabulary pieces of each style, their labels, and word maps
from hand-built token maps with known word values."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope.pipeline.labels import BYTE_LEVEL, SENTENCEPIECE, WORDPIECE, group_words, label_pieces
from attnscope.scores.words import to_words, word_map


def _spans(words):
    return [list(word) for word in words]


def _group(pieces, style, special=()):
    return _spans(group_words(pieces, [i in special for i in range(len(pieces))], style))


def _label(pieces, style, special=()):
    marks = [piece if i in special else None for i, piece in enumerate(pieces)]
    shown, words, word_text = label_pieces(pieces, marks, style)
    return shown, _spans(words), word_text


# ------------------------------------------------------------------------------------------------- grouping


def test_byte_level_words_start_at_a_space():
    # the demo model's tokens of "<bos>The doctor said that she would help the patient."
    pieces = ["<|endoftext|>", "The", "Ġdo", "ct", "or", "Ġsa", "id", "Ġthat", "Ġshe", "Ġpa", "ti", "ent", "."]
    assert _group(pieces, BYTE_LEVEL, special={0}) == [
        [0], [1], [2, 3, 4], [5, 6], [7], [8], [9, 10, 11], [12],
    ]  # fmt: skip
    shown, _, word_text = _label(pieces, BYTE_LEVEL, special={0})
    assert shown == [
        "<|endoftext|>",
        "The",
        "do",
        "##ct",
        "##or",
        "sa",
        "##id",
        "that",
        "she",
        "pa",
        "##ti",
        "##ent",
        ".",
    ]
    assert word_text == ["<|endoftext|>", "The", "doctor", "said", "that", "she", "patient", "."]


def test_sentencepiece_words_start_at_the_space_mark():
    # Llama 2's way: BOS added by the tokenizer, "▁" for a space, bytes as <0xNN>
    pieces = ["<s>", "▁The", "▁doc", "tor", "▁said", ":", "<0x0A>", "▁", "2", "0", "2", "4", "▁caf", "é"]
    assert _group(pieces, SENTENCEPIECE, special={0}) == [
        [0], [1], [2, 3], [4], [5], [6], [7], [8, 9, 10, 11], [12, 13],
    ]  # fmt: skip
    shown, _, word_text = _label(pieces, SENTENCEPIECE, special={0})
    assert shown[:8] == ["<s>", "The", "doc", "##tor", "said", ":", "\\n", "␣"]
    assert shown[8:] == ["2", "##0", "##2", "##4", "caf", "##é"]
    assert word_text == ["<s>", "The", "doctor", "said", ":", "\\n", "␣", "2024", "café"]


def test_wordpiece_words_are_pieces_without_the_continuation_mark():
    pieces = ["[CLS]", "the", "doc", "##tor", "said", ",", "she", "##s", "[SEP]"]
    assert _group(pieces, WORDPIECE, special={0, 8}) == [[0], [1], [2, 3], [4], [5], [6, 7], [8]]
    shown, _, word_text = _label(pieces, WORDPIECE, special={0, 8})
    assert shown == ["[CLS]", "the", "doc", "##tor", "said", ",", "she", "##s", "[SEP]"]  # WordPiece's own marks
    assert word_text == ["[CLS]", "the", "doctor", "said", ",", "shes", "[SEP]"]


def test_special_tokens_are_words_of_their_own_wherever_they_are():
    # an EOS between two texts, a [SEP] followed by a continuation-looking piece: still boundaries
    pieces = ["Ġcat", "<|endoftext|>", "s", "Ġsat"]
    assert _group(pieces, BYTE_LEVEL, special={1}) == [[0], [1], [2], [3]]
    assert _group(["[CLS]", "##x", "y", "[SEP]"], WORDPIECE, special={0, 3}) == [[0], [1], [2], [3]]


def test_punctuation_and_symbols_stand_alone_but_an_apostrophe_piece_continues():
    # "cat's (U.S.) x=1 — ok" in GPT-2's style
    pieces = ["cat", "'s", "Ġ(", "U", ".", "S", ".)", "Ġx", "=", "1", "ĠâĢĶ", "Ġok"]
    assert _group(pieces, BYTE_LEVEL) == [[0, 1], [2], [3], [4], [5], [6], [7], [8], [9], [10], [11]]
    _, _, word_text = _label(pieces, BYTE_LEVEL)
    assert word_text == ["cat's", "(", "U", ".", "S", ".)", "x", "=", "1", "—", "ok"]


def test_whitespace_tokens_stand_alone_and_are_shown():
    # "a\n  b" and two spaces before a word: GPT-2 writes a newline Ċ and a lone space Ġ
    pieces = ["a", "ĊĠ", "Ġb", "Ġ", "Ġc", "ĉ", "d"]
    assert _group(pieces, BYTE_LEVEL) == [[0], [1], [2], [3], [4], [5], [6]]
    shown, _, _ = _label(pieces, BYTE_LEVEL)
    assert shown == ["a", "\\n␣", "b", "␣", "c", "\\t", "d"]


def test_a_character_split_over_byte_tokens_is_one_word():
    # 日本 is six UTF-8 bytes; GPT-2 may split them anywhere: the word still reads 日本
    pieces = ["Ġ", "æ", "Ĺ", "¥", "æľ¬", "Ġcaf", "Ã", "©"]
    assert _group(pieces, BYTE_LEVEL) == [[0], [1, 2, 3, 4], [5, 6, 7]]
    shown, _, word_text = _label(pieces, BYTE_LEVEL)
    assert word_text == ["␣", "日本", "café"]
    assert shown[1:5] == ["\\xe6", "##\\x97", "##\\xa5", "##本"]  # a byte alone shows its value


def test_the_first_token_always_starts_a_word():
    # a later window of a long text may start in the middle of a word: that piece starts a word there
    assert _group(["ct", "or", "Ġsaid"], BYTE_LEVEL) == [[0, 1], [2]]
    assert _group(["##ct", "said"], WORDPIECE) == [[0], [1]]
    assert _group([], BYTE_LEVEL) == []


def test_byte_level_and_sentencepiece_marks_mean_nothing_in_another_style():
    # "Ġ" is a letter in a SentencePiece vocabulary (Maltese), "##" an ordinary piece in a byte-level one
    assert _group(["▁Ġar", "ra"], SENTENCEPIECE) == [[0, 1]]
    assert _group(["Ġfoo", "##", "bar"], BYTE_LEVEL) == [[0], [1], [2]]  # "##" is punctuation there


# ------------------------------------------------------------------------------------------------ word maps

WORDS = [range(0, 1), range(1, 3), range(3, 4)]  # BOS | a two-token word | a one-token word


def _causal_map():
    """A causal 4-token map whose word values are worked out by hand below."""
    return np.array(
        [
            [1.0, 0.0, 0.0, 0.0],
            [0.6, 0.4, 0.0, 0.0],
            [0.2, 0.3, 0.5, 0.0],
            [0.1, 0.2, 0.3, 0.4],
        ]
    )


def test_word_map_sums_keys_and_averages_queries():
    expected = np.array(
        [
            [1.0, 0.0, 0.0],  # BOS sees only itself
            [(0.6 + 0.2) / 2, (0.4 + 0.0 + 0.3 + 0.5) / 2, 0.0],  # mean of rows 1 and 2, keys 1-2 summed
            [0.1, 0.2 + 0.3, 0.4],
        ]
    )
    np.testing.assert_allclose(word_map(_causal_map(), WORDS), expected, atol=1e-12)


def test_word_rows_keep_their_sums_and_a_causal_map_stays_causal():
    maps = _causal_map()
    words = word_map(maps, WORDS)
    np.testing.assert_allclose(words.sum(-1), 1.0, atol=1e-12)
    assert np.all(np.triu(words, k=1) == 0)  # no word attends to a later word
    # rows that sum to less than 1 (learned sinks) keep the mean of their sums
    shrunk = maps * np.array([1.0, 0.8, 0.6, 0.9])[:, None]
    np.testing.assert_allclose(word_map(shrunk, WORDS).sum(-1), [1.0, (0.8 + 0.6) / 2, 0.9], atol=1e-12)


def test_one_token_per_word_gives_the_map_back():
    rng = np.random.default_rng(0)
    maps = rng.dirichlet(np.ones(5), size=(3, 5))  # (H, n, n)
    np.testing.assert_array_equal(word_map(maps, [range(i, i + 1) for i in range(5)]), maps)


def test_a_stack_of_heads_is_mapped_head_by_head():
    rng = np.random.default_rng(1)
    maps = rng.dirichlet(np.ones(4), size=(2, 3, 4))  # (L, H, n, n)
    stacked = word_map(maps, WORDS)
    assert stacked.shape == (2, 3, 3, 3)
    for layer in range(2):
        for head in range(3):
            np.testing.assert_allclose(stacked[layer, head], word_map(maps[layer, head], WORDS), atol=1e-15)


def test_to_words_sums_a_rows_keys_per_word():
    rows = np.array([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])  # (2, n)
    np.testing.assert_allclose(to_words(rows, WORDS), [[0.1, 0.5, 0.4], [0.25, 0.5, 0.25]], atol=1e-15)


@pytest.mark.parametrize(
    "words",
    [
        [range(0, 2), range(3, 4)],  # a gap
        [range(0, 2), range(1, 4)],  # an overlap
        [range(0, 3)],  # too short
        [range(0, 5)],  # too long
        [range(0, 0), range(0, 4)],  # an empty word
    ],
)
def test_words_must_cover_the_tokens_exactly_once(words):
    with pytest.raises(ValueError):
        word_map(_causal_map(), words)
