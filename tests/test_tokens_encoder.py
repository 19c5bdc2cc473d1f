"""[CLS] … [SEP] wrapping of an encoder's windows, and token labels."""

import pytest

from attnscope.attend import attend
from attnscope.errors import AttnscopeError
from attnscope.inputs import Text
from attnscope.tokens import default_bos, special_tokens, token_labels, tokenize


def test_windows_are_wrapped_by_default_and_not_with_no_bos(tiny_bert):
    tokenizer = tiny_bert.tokenizer
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert default_bos(tokenizer) and special_tokens(tokenizer, True) == ((cls,), (sep,))
    words = tokenizer("the cat sat", add_special_tokens=False)["input_ids"]
    tokenized = tokenize(tokenizer, [Text("The cat sat", "t")], n_ctx=64)
    assert tokenized.bos and tokenized.windows[0].ids == (cls, *words, sep)
    assert tokenize(tokenizer, [Text("The cat sat", "t")], n_ctx=64, bos=False).windows[0].ids == tuple(words)


def test_long_texts_are_split_into_windows_each_wrapped(tiny_bert):
    tokenizer = tiny_bert.tokenizer
    tokenized = tokenize(tokenizer, [Text(" ".join(["cat"] * 30), "t")], n_ctx=16)
    assert [len(w.ids) for w in tokenized.windows] == [16, 16, 4]  # 14 + 14 + 2 text tokens, [CLS] and [SEP] each
    assert all(w.ids[0] == tokenizer.cls_token_id and w.ids[-1] == tokenizer.sep_token_id for w in tokenized.windows)
    assert [w.start for w in tokenized.windows] == [0, 14, 28]
    assert len(tokenized.notes) == 1 and "split" in tokenized.notes[0]


def test_labels_show_cls_and_sep_as_decoded(tiny_bert):
    window = tokenize(tiny_bert.tokenizer, [Text("The cat sat.", "t")], n_ctx=64).windows[0]
    assert token_labels(tiny_bert.tokenizer, window.ids) == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]


def test_attend_sees_later_tokens_in_an_encoder(tiny_bert):
    result = attend(tiny_bert, Text("The cat sat on the mat.", "t"), "cat", "mat")
    assert result.tokens[result.from_position] == "cat" and result.to_positions == [6]
    assert result.rows[..., result.from_position + 1 :].sum() > 0.1  # keys after the query weigh something
    assert (result.to_weight > 0).all()
    every = attend(tiny_bert, Text("The cat sat on the mat.", "t"), "cat", "the")
    assert every.to_positions == [1, 5]  # both occurrences, the later one included
    with pytest.raises(AttnscopeError, match="is not a token"):
        attend(tiny_bert, Text("The cat sat.", "t"), "cat", "dog")
