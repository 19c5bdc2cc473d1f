"""`Attend`: one token's attention row in every layer and head, against the from-scratch attention, on both kinds."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope.analyses.attend import Attend, find_word
from attnscope.errors import AttnscopeError
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.labels import BYTE_LEVEL, SENTENCEPIECE, WORDPIECE, Labels, label_pieces
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from attnscope.settings import parse_occurrence
from tests.support import reference_maps

SENTENCE = "The doctor said that she would help the doctor."
# both tokenizers put "doctor" at 2 and 9, "she" at 5 (after <bos> or [CLS])
DOCTORS = [2, 9]
SHE = 5


def _reference_rows(loaded, text):
    """(L, H, n, n) attention of the one window of `text`, recomputed from each layer's own weights."""
    window = tokenize(loaded, [Text(text, "t")]).windows[0]
    maps = reference_maps(loaded, next(batches([window], 1, loaded.device, pad_id(loaded.tokenizer))))
    return np.stack([maps[layer][0].double().numpy() for layer in range(loaded.n_layer)])


def _labels(pieces, style, special=()):
    """Labels of hand-written vocabulary pieces; `special`: positions of special tokens, shown as their piece."""
    marks = [piece if i in special else None for i, piece in enumerate(pieces)]
    shown, words, word_text = label_pieces(pieces, marks, style)
    return Labels(list(pieces), shown, words, word_text)


def test_find_word_matches_words_exactly_then_ignoring_case_then_single_tokens():
    labels = _labels(["<bos>", "The", "Ġdo", "ct", "or", "Ġsaid", "Ġthe", "ĠDo", "ct", "or", "Ġdo"], BYTE_LEVEL, {0})
    assert labels.word_text == ["<bos>", "The", "doctor", "said", "the", "Doctor", "do"]
    assert find_word(labels, "doctor") == [range(2, 5)]  # exact: "Doctor" is left out
    assert find_word(labels, "DOCTOR") == [range(2, 5), range(7, 10)]  # no exact match: case ignored
    assert find_word(labels, "the") == [range(6, 7)]  # exact match wins over "The"
    assert find_word(labels, " do ") == [range(10, 11)]  # the word "do", not the first piece of "doctor"
    assert find_word(labels, "<bos>") == [range(0, 1)]
    assert find_word(labels, "ct") == [range(3, 4), range(8, 9)]  # no word: single tokens, by their text
    assert find_word(labels, "##or") == [range(4, 5), range(9, 10)]  # or as tables show them
    assert find_word(labels, "nurse") == []
    wordpiece = _labels(["[CLS]", "the", "doc", "##tor", "[SEP]"], WORDPIECE, {0, 4})
    assert find_word(wordpiece, "doctor") == [range(2, 4)] and find_word(wordpiece, "[SEP]") == [range(4, 5)]
    sentencepiece = _labels(["<s>", "▁the", "▁doc", "tor"], SENTENCEPIECE, {0})
    assert find_word(sentencepiece, "doctor") == [range(2, 4)]


@pytest.mark.parametrize(
    "spec, parsed",
    [
        ("doctor", ("doctor", None)),
        ("doctor@1", ("doctor", 1)),
        ("doctor@12", ("doctor", 12)),
        ("@property", ("@property", None)),
        ("a@b", ("a@b", None)),
        ("user@2@0", ("user@2", 0)),
        ("@3", ("@3", None)),  # nothing before the @: the word "@3"
    ],
)
def test_word_at_k_names_an_occurrence(spec, parsed):
    assert parse_occurrence(spec) == parsed


def test_word_at_k_and_the_index_setting_are_one_occurrence():
    assert (Attend(from_token="she@1").from_token, Attend(from_token="she@1").from_index) == ("she", 1)
    to_first = Attend(from_token="she", to_token="doctor@0")
    assert to_first.to_index == 0 and to_first.to_token == "doctor"
    assert Attend(from_token="she@1", from_index=1).from_index == 1  # the same occurrence twice is no conflict
    assert Attend(from_token="she").from_index == 0 and Attend(from_token="she", to_token="doctor").to_index is None
    with pytest.raises(AttnscopeError, match=r"^from word 'she@1' names occurrence 1, and from occurrence is 0"):
        Attend(from_token="she@1", from_index=0)


def test_the_sentence_tokenizes_as_the_tests_expect(model):
    labels = Attend(from_token="she").run(model, [Text(SENTENCE, "t")]).tokens
    assert [i for i, label in enumerate(labels) if label.strip() == "doctor"] == DOCTORS
    assert labels[SHE].strip() == "she"


def test_rows_equal_the_independent_attention(model):
    result = Attend(from_token="she").run(model, [Text(SENTENCE, "t")])
    assert result.from_position == SHE and result.tokens[SHE].strip() == "she"
    expected = _reference_rows(model, SENTENCE)[:, :, SHE]  # (L, H, n)
    assert result.rows.shape == expected.shape == (model.n_layer, model.n_head, len(result.tokens))
    np.testing.assert_allclose(result.rows, expected, atol=1e-5)
    np.testing.assert_allclose(result.rows.sum(-1), 1.0, atol=1e-5)
    assert result.to_weight is None and result.to_token is None and result.to_positions == []
    assert result.model["kind"] == model.kind.name


def test_a_decoder_row_puts_nothing_after_the_query(tiny):
    result = Attend(from_token="she").run(tiny, [Text(SENTENCE, "t")])
    assert np.all(result.rows[..., result.from_position + 1 :] == 0)  # causal: exactly nothing after the query


def test_to_weight_sums_the_occurrences_unless_one_is_picked(model):
    expected = _reference_rows(model, SENTENCE)
    # the last one sees both
    both = Attend(from_token="doctor", to_token="doctor", from_index=1).run(model, [Text(SENTENCE, "t")])
    query = both.from_position
    assert query == DOCTORS[1] and both.to_positions == DOCTORS
    np.testing.assert_allclose(both.to_weight, expected[:, :, query, 2] + expected[:, :, query, query], atol=1e-5)
    first = Attend(from_token="doctor", to_token="doctor", from_index=1, to_index=0).run(model, [Text(SENTENCE, "t")])
    assert first.to_positions == [2]
    np.testing.assert_allclose(first.to_weight, expected[:, :, query, 2], atol=1e-5)
    weights = both.to_weight
    strongest = both.strongest(3)
    assert [weights[lh] for lh in strongest] == sorted(weights.flatten(), reverse=True)[:3]


def test_top_keys_are_the_largest_weights_of_the_row(model):
    result = Attend(from_token="she", tokens=2).run(model, [Text(SENTENCE, "t")])
    for layer in range(model.n_layer):
        for head in range(model.n_head):
            row = result.rows[layer, head]
            order = np.argsort(-row, kind="stable")[:2]
            assert result.top_keys(layer, head) == [(int(j), float(row[j])) for j in order]


def test_a_later_target_is_refused_in_a_causal_model(tiny):
    with pytest.raises(AttnscopeError, match="cannot attend to later tokens"):
        Attend(from_token="doctor", to_token="she").run(tiny, [Text(SENTENCE, "t")])
    earlier_only = Attend(from_token="she", to_token="doctor").run(tiny, [Text(SENTENCE, "t")])
    assert earlier_only.to_positions == [2]  # the occurrence after " she" is out of its sight


def test_attend_sees_later_tokens_in_an_encoder(tiny_bert):
    result = Attend(from_token="cat", to_token="mat").run(tiny_bert, [Text("The cat sat on the mat.", "t")])
    assert result.tokens[result.from_position] == "cat" and result.to_positions == [6]
    assert result.rows[..., result.from_position + 1 :].sum() > 0.1  # keys after the query weigh something
    assert (result.to_weight > 0).all()
    every = Attend(from_token="cat", to_token="the").run(tiny_bert, [Text("The cat sat on the mat.", "t")])
    assert every.to_positions == [1, 5]  # both occurrences, the later one included
    with pytest.raises(AttnscopeError, match="is not in the text"):
        Attend(from_token="cat", to_token="dog").run(tiny_bert, [Text("The cat sat.", "t")])


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"from_token": "she", "to_index": 0},
            r"to occurrence 0 picks one occurrence of the to word: give the to word too \(--to\)",
        ),
        ({"from_token": "she", "tokens": 0}, "tokens 0: must be a whole number from 1 to 1,000,000"),
        ({"from_token": "she", "top": 0}, "top 0: must be a whole number from 1 to 1,000,000"),
        ({"from_token": "she", "from_index": -1}, "from_index -1: must be a whole number from 0 to 2,147,483,647"),
        ({"from_token": 5}, "from_token 5: expected a string, not an int"),
    ],
)
def test_bad_settings_are_refused_on_construction(settings, message):
    with pytest.raises(AttnscopeError, match=f"^{message}$"):
        Attend(**settings)


def test_a_text_index_out_of_range_is_refused(model):
    with pytest.raises(AttnscopeError, match=r"^text index 1 is out of range \(1 text given\)$"):
        Attend(from_token="she", index=1).run(model, [Text(SENTENCE, "t")])
