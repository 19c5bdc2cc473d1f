"""Special tokens (a decoder's BOS, an encoder's [CLS] … [SEP]), context windows, padded batches, token labels and the
repeated-token probe, on the tiny models' real tokenizers."""

from __future__ import annotations

import pytest
import torch

from attnscope.errors import AttnscopeError
from attnscope.models.loading import load_model
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.labels import token_labels
from attnscope.pipeline.probe import PROBE_SEQUENCES, probe_windows
from attnscope.pipeline.tokens import batches, default_bos, pad_id, special_tokens, tokenize
from attnscope.scores.kinds import DECODER, ENCODER
from tests.support import TEXTS, build_tiny_bert

GPT2_BOS = 50256  # <|endoftext|> in the real GPT-2 vocabulary


def _expected_special_tokens(tokenizer, kind: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What wraps a window of each kind, read from the tokenizer itself: (BOS,) before a decoder's window,
    ([CLS],) and ([SEP],) around an encoder's."""
    if kind == "decoder":
        return (tokenizer.bos_token_id,), ()
    return (tokenizer.cls_token_id,), (tokenizer.sep_token_id,)


@pytest.fixture(scope="module")
def short_context_models(short_context_model_dir, tmp_path_factory):
    """kind -> a tiny model with a context of 16 tokens, so that ordinary sentences are split into windows."""
    bert_dir = build_tiny_bert(tmp_path_factory.mktemp("tiny-bert-ctx16"), seed=1, max_position_embeddings=16)
    return {"decoder": load_model(str(short_context_model_dir), "cpu"), "encoder": load_model(str(bert_dir), "cpu")}


def test_special_tokens_are_added_by_default_and_not_with_bos_off(model, kind):
    tokenizer = model.tokenizer
    prefix, suffix = _expected_special_tokens(tokenizer, kind)
    assert default_bos(tokenizer, model.kind)
    assert special_tokens(tokenizer, model.kind, True) == (prefix, suffix)
    assert special_tokens(tokenizer, model.kind, False) == ((), ())
    words = tuple(tokenizer("The cat sat", add_special_tokens=False)["input_ids"])
    assert len(words) == 3
    tokenized = tokenize(model, [Text("The cat sat", "t")])
    assert tokenized.bos and tokenized.windows[0].ids == prefix + words + suffix
    assert tokenized.notes == [] and tokenized.n_tokens == len(prefix + words + suffix)
    plain = tokenize(model, [Text("The cat sat", "t")], bos=False)
    assert not plain.bos and plain.windows[0].ids == words


def test_bos_is_prepended_by_default_for_gpt2(tiny):
    assert tokenize(tiny, [Text("The cat sat", "t")]).windows[0].ids == (GPT2_BOS, 464, 3797, 3332)  # real GPT-2 ids
    assert tokenize(tiny, [Text("The cat sat", "t")], bos=False).windows[0].ids == (464, 3797, 3332)


def test_special_tokens_a_tokenizer_lacks_are_off_by_default_and_an_error_when_asked_for(tiny, tiny_bert):
    """A tokenizer under the other kind: BERT's has no BOS, GPT-2's no [CLS] or [SEP]."""
    assert tiny_bert.tokenizer.bos_token_id is None
    assert not default_bos(tiny_bert.tokenizer, DECODER)
    with pytest.raises(AttnscopeError, match="^this model's tokenizer has no BOS token to prepend; turn bos off$"):
        special_tokens(tiny_bert.tokenizer, DECODER, True)
    assert tiny.tokenizer.cls_token_id is None
    assert not default_bos(tiny.tokenizer, ENCODER)
    with pytest.raises(AttnscopeError, match=r"^this model's tokenizer has no \[CLS\] and \[SEP\] tokens"):
        special_tokens(tiny.tokenizer, ENCODER, True)


# 40 text tokens ("cat" is one token in both vocabularies) in a context of 16: a decoder's window holds BOS and 15,
# an encoder's [CLS], 14 and [SEP]
SPLITS = {"decoder": ([16, 16, 11], [0, 15, 30]), "encoder": ([16, 16, 14], [0, 14, 28])}


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_long_texts_are_split_into_windows_each_wrapped(short_context_models, kind):
    loaded = short_context_models[kind]
    assert loaded.n_ctx == 16
    text = " ".join(["cat"] * 40)
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 40
    prefix, suffix = _expected_special_tokens(loaded.tokenizer, kind)
    tokenized = tokenize(loaded, [Text(text, "t")])
    lengths, starts = SPLITS[kind]
    assert [len(w.ids) for w in tokenized.windows] == lengths
    assert [w.start for w in tokenized.windows] == starts
    for window in tokenized.windows:
        assert window.ids[: len(prefix)] == prefix and window.ids[len(window.ids) - len(suffix) :] == suffix
        assert window.text_index == 0
    inner = [window.ids[len(prefix) : len(window.ids) - len(suffix)] for window in tokenized.windows]
    assert [token for part in inner for token in part] == ids  # every text token once, in order
    assert len(tokenized.notes) == 1 and "split" in tokenized.notes[0] and "3 windows" in tokenized.notes[0]


def test_an_empty_text_is_refused(model):
    with pytest.raises(AttnscopeError, match=r"text 1 \(empty\) has no tokens"):
        tokenize(model, [Text("The cat", "a"), Text("", "empty")])


def test_batches_are_right_padded_and_length_bucketed(tiny):
    texts = [Text(t, str(i)) for i, t in enumerate(["a b", "a b c d e f", "a", "a b c d"])]
    windows = tokenize(tiny, texts).windows
    got = list(batches(windows, 2, torch.device("cpu"), pad_id=0))
    assert [b.indices for b in got] == [[1, 3], [0, 2]]  # longest first
    first = got[0]
    assert first.lengths.tolist() == [7, 5]
    assert first.attention_mask.tolist() == [[1] * 7, [1] * 5 + [0] * 2]
    assert first.input_ids[0].tolist() == list(windows[1].ids)
    assert first.input_ids[1, :5].tolist() == list(windows[3].ids) and first.input_ids[1, 5:].tolist() == [0, 0]


def test_windows_are_padded_with_the_tokenizers_pad_token(model, kind):
    """GPT-2 has no pad token (its EOS pads); BERT pads with [PAD]. The mask hides it either way."""
    expected = model.tokenizer.eos_token_id if kind == "decoder" else model.tokenizer.pad_token_id
    assert expected is not None and pad_id(model.tokenizer) == expected


def test_token_labels(tiny):
    ids = tokenize(tiny, [Text("The cat\nsat", "t")]).windows[0].ids
    assert token_labels(tiny.tokenizer, ids) == ["<bos>", "The", " cat", "\\n", "sat"]


def test_labels_show_cls_and_sep_as_decoded(tiny_bert):
    window = tokenize(tiny_bert, [Text("The cat sat.", "t")]).windows[0]
    assert token_labels(tiny_bert.tokenizer, window.ids) == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]


def test_encoder_windows_of_the_test_texts_are_wrapped_without_unknown_tokens(tiny_bert):
    tokenizer = tiny_bert.tokenizer
    windows = tokenize(tiny_bert, TEXTS).windows
    assert len(windows) == len(TEXTS)
    for window in windows:
        assert window.ids[0] == tokenizer.cls_token_id and window.ids[-1] == tokenizer.sep_token_id
        assert tokenizer.unk_token_id not in window.ids


def test_a_token_holding_part_of_a_character_is_labelled_by_its_bytes(tiny):
    tokenizer = tiny.tokenizer
    ids = tokenizer("日 café")["input_ids"]
    labels = token_labels(tokenizer, ids)
    assert "".join(labels) != tokenizer.decode(ids)  # 日 is 3 bytes in GPT-2's vocabulary: split over tokens
    # the labels spell the UTF-8 bytes of 日 (e6 97 a5), whatever the split, then the whole-character tokens
    assert "".join(labels).startswith("\\xe6\\x97\\xa5") and labels[-1] == " café"


def test_probe_windows_repeat_distinct_ordinary_tokens(tiny):
    tokenizer = tiny.tokenizer
    windows = probe_windows(tokenizer, period=20, n_ctx=1024, seed=3)
    assert len(windows) == PROBE_SEQUENCES
    for window in windows:
        ids = window.ids
        assert len(ids) == 41 and ids[0] == GPT2_BOS
        first, second = ids[1:21], ids[21:]
        assert first == second and len(set(first)) == 20
        for token_id in first:
            text = tokenizer.decode([token_id])
            assert text.startswith(" ") and text[1:].isalpha() and text[1:].islower() and len(text) >= 4
    assert windows[0].ids != windows[1].ids
    assert probe_windows(tokenizer, period=20, n_ctx=1024, seed=3) == windows  # seeded
    assert probe_windows(tokenizer, period=20, n_ctx=1024, seed=4) != windows


@pytest.mark.parametrize(
    "period, n_ctx, seed, message",
    [
        (10, 16, 0, r"probe period 10: BOS \+ twice the period \(21 tokens\) must fit the model's context of 16"),
        (2, 1024, 0, "probe period 2: must be at least 3"),
        (5, 1024, -1, "probe seed -1: must be 0 or more"),
    ],
)
def test_bad_probe_settings_are_one_line_errors(tiny, period, n_ctx, seed, message):
    with pytest.raises(AttnscopeError, match=message) as raised:
        probe_windows(tiny.tokenizer, period=period, n_ctx=n_ctx, seed=seed)
    assert "\n" not in str(raised.value)
