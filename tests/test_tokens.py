"""BOS handling, context windows and padded batches."""

import torch
from transformers import GPT2TokenizerFast

from attnscope.inputs import Text
from attnscope.tokens import batches, token_labels, tokenize
from tests.conftest import TOKENIZER_DIR

TOKENIZER = GPT2TokenizerFast.from_pretrained(TOKENIZER_DIR)


def test_bos_is_prepended_by_default_for_gpt2():
    tokenized = tokenize(TOKENIZER, [Text("The cat sat", "t")], n_ctx=1024)
    assert tokenized.bos
    assert tokenized.windows[0].ids == (50256, 464, 3797, 3332)  # real GPT-2 ids, <|endoftext|> first
    assert tokenize(TOKENIZER, [Text("The cat sat", "t")], n_ctx=1024, bos=False).windows[0].ids == (464, 3797, 3332)


def test_long_texts_are_split_into_windows_each_starting_with_bos():
    text = " ".join(["word"] * 40)  # 40 tokens
    tokenized = tokenize(TOKENIZER, [Text(text, "t")], n_ctx=16)
    assert [len(w.ids) for w in tokenized.windows] == [16, 16, 11]  # 15 + 15 + 10 text tokens, BOS each
    assert all(w.ids[0] == 50256 for w in tokenized.windows)
    assert [w.start for w in tokenized.windows] == [0, 15, 30]
    assert len(tokenized.notes) == 1 and "split" in tokenized.notes[0]


def test_batches_are_right_padded_and_length_bucketed():
    texts = [Text(t, str(i)) for i, t in enumerate(["a b", "a b c d e f", "a", "a b c d"])]
    windows = tokenize(TOKENIZER, texts, n_ctx=64).windows
    got = list(batches(windows, 2, torch.device("cpu"), pad_id=0))
    assert [b.indices for b in got] == [[1, 3], [0, 2]]  # longest first
    first = got[0]
    assert first.lengths.tolist() == [7, 5]
    assert first.attention_mask.tolist() == [[1] * 7, [1] * 5 + [0] * 2]
    assert first.input_ids[1, 5:].tolist() == [0, 0]


def test_token_labels():
    ids = tokenize(TOKENIZER, [Text("The cat\nsat", "t")], n_ctx=64).windows[0].ids
    assert token_labels(TOKENIZER, ids) == ["<bos>", "The", " cat", "\\n", "sat"]


def test_a_token_holding_part_of_a_character_is_labelled_by_its_bytes():
    ids = TOKENIZER("日 café")["input_ids"]
    labels = token_labels(TOKENIZER, ids)
    assert "".join(labels) != TOKENIZER.decode(ids)  # 日 is 3 bytes in GPT-2's vocabulary: split over tokens
    # the labels spell the UTF-8 bytes of 日 (e6 97 a5), whatever the split, then the whole-character tokens
    assert "".join(labels).startswith("\\xe6\\x97\\xa5") and labels[-1] == " café"


def test_probe_windows_repeat_distinct_ordinary_tokens():
    from attnscope.tokens import PROBE_SEQUENCES, probe_windows

    windows = probe_windows(TOKENIZER, period=20, n_ctx=1024, seed=3)
    assert len(windows) == PROBE_SEQUENCES
    for window in windows:
        ids = window.ids
        assert len(ids) == 41 and ids[0] == 50256
        first, second = ids[1:21], ids[21:]
        assert first == second and len(set(first)) == 20
        for token_id in first:
            text = TOKENIZER.decode([token_id])
            assert text.startswith(" ") and text[1:].isalpha() and text[1:].islower() and len(text) >= 4
    assert windows[0].ids != windows[1].ids
    assert probe_windows(TOKENIZER, period=20, n_ctx=1024, seed=3) == windows  # seeded
    assert probe_windows(TOKENIZER, period=20, n_ctx=1024, seed=4) != windows


def test_probe_must_fit_the_context():
    import pytest

    from attnscope.errors import AttnscopeError
    from attnscope.tokens import probe_windows

    with pytest.raises(AttnscopeError, match="context"):
        probe_windows(TOKENIZER, period=10, n_ctx=16)
