"""Inputs of any size stream: a long text is tokenized in pieces and windowed as it comes, a corpus is batched from
a bounded read-ahead, and the numbers are those of the same text cut into windows by hand."""

from __future__ import annotations

import pytest
import torch

from attnscope import api
from attnscope.analyses.attend import Attend
from attnscope.analyses.heads import Heads
from attnscope.errors import AttnscopeError
from attnscope.models.loading import load_model
from attnscope.pipeline import capture, reading, tokens
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.reducers import HeadStatistics
from attnscope.pipeline.tokens import Window, WindowStream, batches, pad_id, special_tokens
from tests.support import build_tiny_gpt2, sentencepiece_tokenizer

LONG = " ".join(f"The cat number {k} sat on the mat, because it was tired." for k in range(60))


def _windows_by_hand(model, text: str) -> list[Window]:
    """The text tokenized whole in one call, then cut into windows of the context (special tokens around each)."""
    prefix, suffix = special_tokens(model.tokenizer, model.kind, True)
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    span = model.n_ctx - len(prefix) - len(suffix)
    return [Window(0, prefix + tuple(ids[k : k + span]) + suffix, k) for k in range(0, len(ids), span)]


@pytest.fixture
def small_pieces(monkeypatch):
    """Pieces of 50 characters, blocks of 64 bytes, a read-ahead of 40 tokens: everything streams in small steps."""
    monkeypatch.setattr(tokens, "CHUNK_CHARS", 50)
    monkeypatch.setattr(tokens, "BUFFER_TOKENS", 40)
    monkeypatch.setattr(reading, "BLOCK_BYTES", 64)


def test_a_text_tokenized_in_pieces_gives_the_windows_of_the_whole_text(model, small_pieces):
    streamed = list(WindowStream(model, [Text(LONG, "t")]))
    assert len(streamed) > 3
    assert streamed == _windows_by_hand(model, LONG)


def test_a_sentencepiece_tokenizer_is_cut_where_it_tokenizes_as_the_whole(tmp_path, monkeypatch):
    """SentencePiece writes a space as ▁ on the word after it: a cut before a space is exact there too."""
    monkeypatch.setattr(tokens, "CHUNK_CHARS", 50)
    sentencepiece_tokenizer(tmp_path)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokens._cuts_exactly(tokenizer)
    whole = tokenizer(LONG, add_special_tokens=False)["input_ids"]
    stream = WindowStream.__new__(WindowStream)
    stream.tokenizer, stream.vocabulary, stream.unknown_id, stream.exact_cuts = tokenizer, None, None, True
    stream.special_ids = set()
    stream._reset()
    pieced = [
        token
        for chunk in stream._token_chunks(iter([LONG[k : k + 7] for k in range(0, len(LONG), 7)]))
        for token in chunk
    ]
    assert pieced == whole


def test_a_stretch_without_spaces_is_cut_anyway_with_a_note(tiny, monkeypatch):
    monkeypatch.setattr(tokens, "CHUNK_CHARS", 50)
    stream = WindowStream(tiny, [Text("x" * 500, "t")])
    windows = list(stream)
    assert sum(len(window.ids) - 1 for window in windows) >= 500 // 50  # every character tokenized, in pieces
    assert any("no space between words" in note for note in stream.notes())


def test_heads_on_a_streamed_file_equal_the_statistics_of_windows_cut_by_hand(model, kind, small_pieces, tmp_path):
    file = tmp_path / "long.txt"
    file.write_text(LONG + "\n\n" + LONG[:300], encoding="utf-8")
    result = Heads(probe=False, batch_size=3, max_tokens=64).run(model, api.read_texts(None, str(file)))
    by_hand = _windows_by_hand(model, LONG) + [Window(1, w.ids, w.start) for w in _windows_by_hand(model, LONG[:300])]
    assert result.inputs["n_windows"] == len(by_hand) and result.inputs["n_texts"] == 2
    assert result.inputs["n_tokens"] == sum(len(w.ids) for w in by_hand)
    statistics = HeadStatistics(model.kind, model.n_layer, model.n_head, model.device)
    capture.run(model.model, batches(by_hand, len(by_hand), model.device, pad_id(model.tokenizer)), statistics)
    expected = statistics.means()
    for record in result.heads:
        for name, value in expected.items():
            assert record.scores[name] == pytest.approx(float(value[record.layer, record.head]), abs=1e-5), name


def test_the_read_ahead_bounds_what_is_batched_together(tiny):
    windows = [Window(k, (1,) * (2 + k % 5), 0) for k in range(30)]
    got = list(batches(iter(windows), 4, torch.device("cpu"), buffer_tokens=20))
    assert sorted(index for batch in got for index in batch.indices) == list(range(30))  # each window once
    for batch in got:
        assert [windows[i] for i in batch.indices] == batch.windows
        assert max(batch.indices) - min(batch.indices) < 10  # only windows read together are batched together


@pytest.mark.slow
def test_a_tokenizer_with_more_tokens_than_the_model_is_refused(tmp_path):
    folder = build_tiny_gpt2(tmp_path / "small-vocabulary", vocab_size=1000)  # the GPT-2 tokenizer has 50,257
    model = load_model(str(folder), "cpu")
    with pytest.raises(AttnscopeError, match=r"the model has only 1000 token embeddings: this tokenizer does not"):
        Heads(probe=False).run(model, [Text("The cat sat on the mat, happily.", "t")])


def test_unknown_tokens_are_counted_in_a_note(tiny_bert):
    stream = WindowStream(tiny_bert, [Text("the cat ζζζ sat ψψ", "t")])
    list(stream)
    [note] = [note for note in stream.notes() if "unknown token" in note]
    unknown = sum(w.ids.count(tiny_bert.tokenizer.unk_token_id) for w in stream)
    assert unknown >= 2 and note.startswith(f"{unknown:,} of ") and "[UNK]" in note


def test_gpt2s_unknown_token_is_its_bos_and_is_never_counted(tiny):
    stream = WindowStream(tiny, [Text("<|endoftext|> The cat", "t")])
    list(stream)
    assert stream.unknown_id is None and not any("unknown" in note for note in stream.notes())


def test_a_summary_lists_the_first_sources_and_says_how_many(tiny, monkeypatch):
    monkeypatch.setattr(tokens, "SOURCES_LISTED", 3)
    stream = WindowStream(tiny, [Text(f"text {k}", f"s{k}") for k in range(5)])
    list(stream)
    summary = stream.summary()
    assert summary["n_texts"] == 5 and summary["sources"] == ["s0", "s1", "s2"] and summary["sources_listed"] == 3


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_attend_finds_the_token_in_a_later_window(short_context_model_dir):
    loaded = load_model(str(short_context_model_dir), "cpu")  # 16 tokens: BOS + 15
    text = " ".join(["cat"] * 20) + " she sat"
    result = Attend(from_token="she").run(loaded, [Text(text, "t")])
    assert result.tokens[result.from_position] == " she"
    assert any("is in window 1" in note for note in result.notes)
    # the 17th cat: the second window's 2nd
    first = Attend(from_token="cat", from_index=16).run(loaded, [Text(text, "t")])
    assert first.from_position == 2 and any("window 1" in note for note in first.notes)
    with pytest.raises(AttnscopeError, match="occurs 20 time"):
        Attend(from_token="cat", from_index=20).run(loaded, [Text(text, "t")])
