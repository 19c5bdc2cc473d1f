"""Words on real tokenizers of every vocabulary style (byte-level GPT-2 and the demo model's BPE, SentencePiece-style
Llama, WordPiece BERT, RoBERTa), and word maps and word rows of tiny models of several families against word maps
summed by hand from the family's own eager attention."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, GPT2TokenizerFast, PreTrainedTokenizerFast

from attnscope.analyses.attend import Attend
from attnscope.analyses.show import Show
from attnscope.errors import AttnscopeError
from attnscope.models.loading import demo_model_dir, load_model
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.labels import BYTE_LEVEL, SENTENCEPIECE, WORDPIECE, label_window, token_labels, vocabulary_style
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from tests.support import DOCTOR, TOKENIZER_DIR, TOKENIZERS

SENTENCES = [
    DOCTOR,
    "Green ideas sleep, and the quick brown fox jumps over the lazy dog!",
    "Hello world, again and again.",
    "The zorblat said that she quibbled, the zorblat slept.",  # words no vocabulary here holds whole
]
STYLES = {  # tokenizer -> (vocabulary style, special tokens around a text)
    "gpt2": BYTE_LEVEL,
    "demo": BYTE_LEVEL,
    "sentencepiece": SENTENCEPIECE,
    "wordpiece": WORDPIECE,
    "roberta": BYTE_LEVEL,
}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    found = {
        "gpt2": GPT2TokenizerFast.from_pretrained(TOKENIZER_DIR),
        "demo": AutoTokenizer.from_pretrained(demo_model_dir()),
    }
    for style in ("sentencepiece", "wordpiece", "roberta"):
        folder = tmp_path_factory.mktemp(style)
        TOKENIZERS[style](folder)
        found[style] = PreTrainedTokenizerFast.from_pretrained(folder)
    return found


def _written_words(text: str) -> list[str]:
    """The words of a text as a reader counts them, found without any tokenizer: runs of letters and digits, and
    each punctuation mark alone."""
    return re.findall(r"\w+|[^\w\s]", text)


@pytest.mark.parametrize("name", sorted(STYLES))
def test_the_style_is_read_from_the_tokenizer(tokenizers, name):
    assert vocabulary_style(tokenizers[name]) == STYLES[name]


@pytest.mark.parametrize("name", sorted(STYLES))
@pytest.mark.parametrize("text", SENTENCES)
def test_words_are_the_words_of_the_text_in_every_style(tokenizers, name, text):
    tokenizer = tokenizers[name]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = [i for i in (tokenizer.bos_token_id, tokenizer.cls_token_id) if i is not None][:1]
    closing = [tokenizer.sep_token_id] if name in ("wordpiece", "roberta") else []
    labels = label_window(tokenizer, special + ids + closing)
    inner = slice(len(special), len(labels.word_text) - len(closing))
    expected = _written_words(text.lower() if name == "wordpiece" else text)  # BERT's vocabulary is lowercase
    # a token of spaces alone (SentencePiece's "▁" before a piece without one: "▁ z or b l at") is a word of its own
    assert [word for word in labels.word_text[inner] if word.strip("␣")] == expected
    assert [list(word) for word in labels.words] == [
        list(range(word.start, word.stop)) for word in labels.words
    ]  # consecutive spans
    assert [position for word in labels.words for position in word] == list(range(len(labels.tokens)))
    # a special token is a word of its own, shown as the JSON's token text shows it
    if special:
        assert list(labels.words[0]) == [0] and labels.shown[0] == labels.tokens[0]
    # every piece after a word's first is marked ##; every word's first piece is not
    for word in labels.words:
        assert not labels.shown[word.start].startswith("##") or labels.tokens[word.start].startswith("##")
        assert all(labels.shown[position].startswith("##") for position in word[1:])


def test_the_demo_model_splits_the_readmes_words_into_pieces(tokenizers):
    """The issue's example: "doctor" is three tokens of the demo model's 4,096-entry vocabulary, and "cat" reads
    differently from the piece "at" of c|at."""
    tokenizer = tokenizers["demo"]
    labels = label_window(tokenizer, [tokenizer.bos_token_id] + tokenizer(DOCTOR)["input_ids"])
    doctor = labels.word_text.index("doctor")
    assert len(labels.words[doctor]) == 3
    assert [labels.shown[p] for p in labels.words[doctor]] == ["do", "##ct", "##or"]
    assert labels.describe(labels.words[doctor]) == "doctor@2-4"
    cat = label_window(tokenizer, tokenizer(" cat c at cat")["input_ids"])
    assert cat.word_text == ["cat", "c", "at", "cat"]
    assert "at" in cat.shown  # the word " at"
    pieces = label_window(tokenizer, tokenizer(" concatenate")["input_ids"])
    assert len(pieces.words) == 1 and all(label.startswith("##") for label in pieces.shown[1:])


# -------------------------------------------------------------------------------- word maps on tiny models

# byte-level GPT-2 and WordPiece BERT (the tiny models of tests/conftest.py), SentencePiece-style Llama
FAMILIES = {"gpt2": "decoder", "bert": "encoder", "llama": None}


@pytest.fixture(scope="module")
def family_models(family_dir, model_dirs):
    found = {}

    def model(name):
        if name not in found:
            folder = family_dir(name) if FAMILIES[name] is None else model_dirs[FAMILIES[name]]
            found[name] = load_model(str(folder), "cpu")
        return found[name]

    return model


def _eager_maps(model, text):
    """(L, H, n, n) float64: the family's own eager attention of the one window of `text`, and that window."""
    window = tokenize(model, [Text(text, "t")]).windows[0]
    batch = next(batches([window], 1, model.device, pad_id(model.tokenizer)))
    with torch.no_grad():
        out = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
    return np.stack([maps[0].double().numpy() for maps in out.attentions]), window


def _summed_by_hand(maps, words):
    """(..., W, W) by loops over the words: mean over a word's query rows of the sum over another's keys."""
    result = np.zeros((*maps.shape[:-2], len(words), len(words)))
    for a, query in enumerate(words):
        for b, key in enumerate(words):
            result[..., a, b] = maps[..., list(query), :][..., list(key)].sum(-1).mean(-1)
    return result


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_show_words_equals_the_eager_maps_summed_by_hand(family_models, name):
    model = family_models(name)
    text = "Colourless green ideas sleep furiously."
    result = Show(layer=1, words=True).run(model, [Text(text, "t")])
    attention = result.attention
    eager, window = _eager_maps(model, text)
    labels = label_window(model.tokenizer, window.ids)
    assert attention.view == "words" and attention.labels == labels
    expected = _summed_by_hand(eager[1], labels.words)  # (H, W, W)
    np.testing.assert_allclose(attention.word_maps, expected, atol=1e-5)
    np.testing.assert_allclose(attention.word_maps.sum(-1), 1.0, atol=1e-5)
    if model.kind.causal:
        assert np.abs(np.triu(attention.word_maps, k=1)).max() < 1e-6
    # the same text, token by token: the maps are the view's
    assert Show(layer=1).run(model, [Text(text, "t")]).attention.view == "tokens"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_attend_from_and_to_words_of_several_tokens(family_models, name):
    """From a word of several tokens: the mean of its tokens' rows; to one: the sum over its tokens' keys."""
    model = family_models(name)
    text = "The zorblat said that she quibbled, the zorblat slept."
    eager, window = _eager_maps(model, text)
    labels = label_window(model.tokenizer, window.ids)
    # the test's words must have several tokens in this vocabulary for it to mean anything
    source, target = "quibbled", "Zorblat"  # the target matched ignoring case
    source_span = labels.words[labels.word_text.index(source)]
    target_span = labels.words[[text.lower() for text in labels.word_text].index(target.lower())]
    assert len(source_span) > 1 and len(target_span) > 1, (labels.shown, name)
    result = Attend(from_token=source, to_token=target + "@0", words=True).run(model, [Text(text, "t")])
    assert result.from_positions == list(source_span) and result.to_positions == list(target_span)
    rows = eager[:, :, list(source_span)].mean(axis=2)  # (L, H, n)
    np.testing.assert_allclose(result.rows, rows, atol=1e-5)
    np.testing.assert_allclose(result.to_weight, rows[..., list(target_span)].sum(-1), atol=1e-5)
    np.testing.assert_allclose(
        result.word_rows, _summed_by_hand(eager, labels.words)[:, :, labels.words.index(source_span)], atol=1e-5
    )
    # the keys ranked as words: a word's weight is its tokens' summed
    for layer, head in result.strongest(3):
        for key, weight in result.top_keys(layer, head):
            assert weight == pytest.approx(float(rows[layer, head, list(labels.words[key])].sum()), abs=1e-5)


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_attend_finds_words_in_any_window_of_a_long_text(short_context_model_dir):
    """A context of 16 tokens: the from word in a later window; the to word's occurrences counted over the whole
    text, and only those of the from word's window can be looked at."""
    model = load_model(str(short_context_model_dir), "cpu")
    text = Text(" ".join(["the cat sat on the mat."] * 6), "t")
    windows = [token_labels(model.tokenizer, window.ids) for window in tokenize(model, [text]).windows]
    where = {word: [(n, p) for n, tokens in enumerate(windows) for p, token in enumerate(tokens) if token == f" {word}"]
             for word in ("cat", "mat")}  # fmt: skip
    number, position = where["mat"][3]
    assert number > 0
    result = Attend(from_token="mat@3", to_token="cat").run(model, [text])
    assert result.tokens == windows[number] and result.from_positions == [position]
    assert any(f"is in window {number}" in note for note in result.notes)
    seen = [p for n, p in where["cat"] if n == number and p < position]
    assert seen and result.to_positions == seen  # every occurrence the query sees in its window
    before = sum(n < number for n, _ in where["cat"])
    assert Attend(from_token="mat@3", to_token=f"cat@{before}").run(model, [text]).to_positions == seen[:1]
    with pytest.raises(AttnscopeError, match=r"^to occurrence 0: that 'cat' is in a window before the from word's"):
        Attend(from_token="mat@3", to_token="cat@0").run(model, [text])
    with pytest.raises(AttnscopeError, match=r"^to occurrence 99: 'cat' occurs \d+ times up to the end of window"):
        Attend(from_token="mat@3", to_token="cat@99").run(model, [text])
    with pytest.raises(AttnscopeError, match=r"^from occurrence 9: 'mat' occurs 6 times \(window 0: mat@"):
        Attend(from_token="mat@9").run(model, [text])
