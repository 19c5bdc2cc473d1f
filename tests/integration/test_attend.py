"""`Attend`: one token's attention row in every layer and head, against the from-scratch attention, on both kinds."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope.analyses.attend import Attend, match_token
from attnscope.errors import AttnscopeError
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.tokens import batches, pad_id, tokenize
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


def test_match_token_exact_then_case_insensitive_then_clear_error():
    labels = ["<bos>", "The", " doctor", " said", " the", " Doctor", " doctor"]
    assert match_token(labels, "doctor", 0, "from") == (2, [2, 6])
    assert match_token(labels, "doctor", 1, "from") == (6, [2, 6])
    assert match_token(labels, "the", 0, "to") == (4, [4])  # exact match wins over "The"
    assert match_token(labels, "THE", 0, "to") == (1, [1, 4])  # no exact match: case ignored
    assert match_token(labels, "<bos>", 0, "to") == (0, [0])
    assert match_token(["[CLS]", "the", "doctor", "[SEP]"], "[SEP]", 0, "to") == (3, [3])
    assert match_token(["▁the", "▁doctor"], "doctor", 0, "to") == (1, [1])  # SentencePiece's space marker
    missing = r"^from token 'nurse' is not a token of the text; its tokens are .*2:'doctor'"
    with pytest.raises(AttnscopeError, match=missing):
        match_token(labels, "nurse", 0, "from")
    too_few = r"^from occurrence 2: 'doctor' occurs 2 time\(s\) \(positions \[2, 6\]\)$"
    with pytest.raises(AttnscopeError, match=too_few):
        match_token(labels, "doctor", 2, "from")


def test_the_sentence_tokenizes_as_the_tests_expect(model):
    labels = Attend("she").run(model, [Text(SENTENCE, "t")]).tokens
    assert [i for i, label in enumerate(labels) if label.strip() == "doctor"] == DOCTORS
    assert labels[SHE].strip() == "she"


def test_rows_equal_the_independent_attention(model):
    result = Attend("she").run(model, [Text(SENTENCE, "t")])
    assert result.from_position == SHE and result.tokens[SHE].strip() == "she"
    expected = _reference_rows(model, SENTENCE)[:, :, SHE]  # (L, H, n)
    assert result.rows.shape == expected.shape == (model.n_layer, model.n_head, len(result.tokens))
    np.testing.assert_allclose(result.rows, expected, atol=1e-5)
    np.testing.assert_allclose(result.rows.sum(-1), 1.0, atol=1e-5)
    assert result.to_weight is None and result.to_token is None and result.to_positions == []
    assert result.model["kind"] == model.kind.name


def test_a_decoder_row_puts_nothing_after_the_query(tiny):
    result = Attend("she").run(tiny, [Text(SENTENCE, "t")])
    assert np.all(result.rows[..., result.from_position + 1 :] == 0)  # causal: exactly nothing after the query


def test_to_weight_sums_the_occurrences_unless_one_is_picked(model):
    expected = _reference_rows(model, SENTENCE)
    both = Attend("doctor", "doctor", from_index=1).run(model, [Text(SENTENCE, "t")])  # the last one sees both
    query = both.from_position
    assert query == DOCTORS[1] and both.to_positions == DOCTORS
    np.testing.assert_allclose(both.to_weight, expected[:, :, query, 2] + expected[:, :, query, query], atol=1e-5)
    first = Attend("doctor", "doctor", from_index=1, to_index=0).run(model, [Text(SENTENCE, "t")])
    assert first.to_positions == [2]
    np.testing.assert_allclose(first.to_weight, expected[:, :, query, 2], atol=1e-5)
    weights = both.to_weight
    strongest = both.strongest(3)
    assert [weights[lh] for lh in strongest] == sorted(weights.flatten(), reverse=True)[:3]


def test_top_keys_are_the_largest_weights_of_the_row(model):
    result = Attend("she", tokens=2).run(model, [Text(SENTENCE, "t")])
    for layer in range(model.n_layer):
        for head in range(model.n_head):
            row = result.rows[layer, head]
            order = np.argsort(-row, kind="stable")[:2]
            assert result.top_keys(layer, head) == [(int(j), float(row[j])) for j in order]


def test_a_later_target_is_refused_in_a_causal_model(tiny):
    with pytest.raises(AttnscopeError, match="cannot attend to later tokens"):
        Attend("doctor", "she").run(tiny, [Text(SENTENCE, "t")])
    earlier_only = Attend("she", "doctor").run(tiny, [Text(SENTENCE, "t")])
    assert earlier_only.to_positions == [2]  # the occurrence after " she" is out of its sight


def test_attend_sees_later_tokens_in_an_encoder(tiny_bert):
    result = Attend("cat", "mat").run(tiny_bert, [Text("The cat sat on the mat.", "t")])
    assert result.tokens[result.from_position] == "cat" and result.to_positions == [6]
    assert result.rows[..., result.from_position + 1 :].sum() > 0.1  # keys after the query weigh something
    assert (result.to_weight > 0).all()
    every = Attend("cat", "the").run(tiny_bert, [Text("The cat sat on the mat.", "t")])
    assert every.to_positions == [1, 5]  # both occurrences, the later one included
    with pytest.raises(AttnscopeError, match="is not a token"):
        Attend("cat", "dog").run(tiny_bert, [Text("The cat sat.", "t")])


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"from_token": "she", "to_index": 0},
            r"to occurrence 0 picks one occurrence of the to token: give the to token too \(--to\)",
        ),
        ({"from_token": "she", "tokens": 0}, "tokens 0: must be at least 1"),
        ({"from_token": "she", "top": 0}, "top 0: must be at least 1"),
        ({"from_token": "she", "from_index": -1}, "from occurrence -1: must be at least 0"),
    ],
)
def test_bad_settings_are_refused_on_construction(settings, message):
    with pytest.raises(AttnscopeError, match=f"^{message}$"):
        Attend(**settings)


def test_a_text_index_out_of_range_is_refused(model):
    with pytest.raises(AttnscopeError, match=r"^text index 1 is out of range \(1 text given\)$"):
        Attend("she", index=1).run(model, [Text(SENTENCE, "t")])
