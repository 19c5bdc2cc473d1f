"""Words through the CLI, on the bundled demo model whose 4,096-entry vocabulary splits "doctor" into do|ct|or (the
issue's example): `attend` from and to words of several tokens, WORD@K, errors that list tokens as tables show
them, `--words` in `attend`, `show` and `heads --plot`, `--skip-first` and the sink note. (The docs' examples of
`attend` and `show` run in tests/e2e/test_docs_examples.py.)"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from attnscope.models.loading import load_model
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.labels import token_labels
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from tests.support import DOCTOR, png_size, reference_maps

DEMO = ("-m", "demo", "--device", "cpu")
TWICE = "The doctor said that she would help the doctor."


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", "cpu")


def _reference(model, text):
    """(L, H, n, n) float64 from-scratch attention of the one window of `text` (GPT-2's own weights), and its
    tokens' exact text."""
    window = tokenize(model, [Text(text, "t")]).windows[0]
    maps = reference_maps(model, next(batches([window], 1, model.device, pad_id(model.tokenizer))))
    return np.stack([maps[layer][0].double().numpy() for layer in range(model.n_layer)]), token_labels(
        model.tokenizer, window.ids
    )


def _json(cli, *args):
    code, out, err = cli(*args, *DEMO, "--json")
    assert code == 0, err
    return json.loads(out), err


def test_the_readmes_example_finds_the_word_doctor(cli, demo):
    doc, _ = _json(cli, "attend", DOCTOR, "--from", "she", "--to", "doctor")
    maps, tokens = _reference(demo, DOCTOR)
    assert tokens[2:5] == [" do", "ct", "or"]  # three tokens of the demo vocabulary: the case
    she = tokens.index(" she")
    assert doc["from"] == {"token": " she", "position": she, "positions": [she], "word": "she"}
    assert doc["to"] == {"token": "doctor", "positions": [2, 3, 4], "words": [[2, 3, 4]]}
    weights = {record["label"]: record["to_weight"] for record in doc["heads"]}
    for layer in range(2):
        for head in range(4):
            expected = maps[layer, head, she, 2:5].sum()  # to a word: the sum over its tokens' keys
            assert weights[f"{layer}.{head}"] == pytest.approx(expected, abs=1e-5)
    assert doc["input"]["tokens"] == tokens  # the exact token text, as before
    assert doc["input"]["labels"][2:5] == ["do", "##ct", "##or"]  # and as tables show it
    code, table, _ = cli("attend", DOCTOR, "--from", "she", "--to", "doctor", *DEMO)
    assert code == 0 and f"Attention from she@{she} to doctor@2-4" in table


def test_from_a_word_of_several_tokens_and_word_at_k(cli, demo):
    doc, _ = _json(cli, "attend", TWICE, "--from", "doctor@1", "--to", "doctor")
    maps, tokens = _reference(demo, TWICE)
    last = [i for i, token in enumerate(tokens) if token == " do"][1]
    second = [last, last + 1, last + 2]
    assert doc["from"]["positions"] == second and doc["from"]["word"] == "doctor" and doc["from"]["token"] == " doctor"
    assert doc["settings"]["from_index"] == 1 and doc["to"]["words"] == [[2, 3, 4], second]
    row = maps[:, :, second].mean(axis=2)  # (L, H, n): from a word, the mean of its tokens' rows
    np.testing.assert_allclose(np.array(doc["rows"]), row, atol=1e-5)
    weights = np.array(
        [[record["to_weight"] for record in doc["heads"][4 * layer : 4 * layer + 4]] for layer in (0, 1)]
    )
    np.testing.assert_allclose(weights, row[..., [2, 3, 4, *second]].sum(-1), atol=1e-5)
    # --from-index names the same occurrence; WORD@K for --to picks one occurrence
    same, _ = _json(cli, "attend", TWICE, "--from", "doctor", "--from-index", "1", "--to", "doctor@0")
    assert same["from"] == doc["from"] and same["to"]["positions"] == [2, 3, 4]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--from", "she", "--to", "nurse"], "its tokens are <bos>@0 The@1 do@2 ##ct@3 ##or@4 sa@5 ##id@6 that@7"),
        (["--from", "she", "--to", "nurse", "--words"], "its words are <bos>@0 The@1 doctor@2-4 said@5-6 that@7"),
        (["--from", "nurse"], "from word 'nurse' is not in the text; its tokens are <bos>@0 The@1 do@2 ##ct@3"),
        (["--from", "doctor@2"], "from occurrence 2: 'doctor' occurs 1 time (doctor@2-4)"),
        (["--from", "she", "--to", "patient"], "to word 'patient' (patient@12-14) comes after from word 'she'"),
        (["--from", "she@1", "--from-index", "0"], "names occurrence 1, and from occurrence is 0: give one"),
    ],
)
def test_a_word_that_is_not_there_lists_the_text_as_tables_show_it(cli, args, message):
    code, out, err = cli("attend", DOCTOR, *args, *DEMO)
    assert code == 2 and out == ""
    assert err.startswith("attnscope: error: ") and len(err.strip().splitlines()) == 1 and message in err, err


def test_attend_words_ranks_words_and_says_which_tokens_make_them(cli, demo):
    doc, _ = _json(cli, "attend", DOCTOR, "--from", "patient", "--words", "--tokens", "2")
    maps, tokens = _reference(demo, DOCTOR)
    assert doc["view"] == "words" and doc["settings"]["words"] is True
    words = doc["words"]
    assert [word["text"] for word in words] == ["<bos>", "The", "doctor", "said", "that", "she", "would", "help",
                                               "the", "patient", "."]  # fmt: skip
    assert [position for word in words for position in word["positions"]] == list(range(len(tokens)))
    source = words[9]["positions"]
    assert doc["from"]["positions"] == source
    row = maps[:, :, source].mean(axis=2)  # (L, H, n)
    expected = np.stack([row[..., word["positions"]].sum(-1) for word in words], axis=-1)  # (L, H, W)
    np.testing.assert_allclose(np.array(doc["word_rows"]), expected, atol=1e-5)
    np.testing.assert_allclose(np.array(doc["rows"]), row, atol=1e-5)  # the token rows stay
    for record in doc["heads"]:
        ranked = sorted(range(len(words)), key=lambda w: (-expected[record["layer"], record["head"], w], w))[:2]
        assert [record["top1_word"], record["top2_word"]] == ranked
        assert record["top1_text"] == words[ranked[0]]["text"] and "top1_position" not in record
    code, out, _ = cli("attend", DOCTOR, "--from", "patient", "--words", *DEMO, "--csv")
    assert out.splitlines()[0].startswith("layer,head,label,top1_word,top1_text,top1_weight")


def test_skip_first_leaves_the_sink_out_and_the_note_says_when_it_wins(cli, demo):
    plain, err = _json(cli, "attend", DOCTOR, "--from", "she")
    maps, _ = _reference(demo, DOCTOR)
    row = maps[:, :, 8]  # (L, H, n): " she"
    on_sink = [f"{layer}.{head}" for layer in range(2) for head in range(4) if row[layer, head].argmax() == 0]
    assert on_sink  # the demo model's heads park on <bos>: what the issue saw
    note = [line for line in plain["notes"] if "attention sink" in line]
    assert len(note) == 1 and f"{len(on_sink)} of the 8 strongest heads" in note[0] and "(<bos>)" in note[0]
    assert "--skip-first" in note[0] and note[0] in err
    skipped, err = _json(cli, "attend", DOCTOR, "--from", "she", "--skip-first")
    assert skipped["settings"]["skip_first"] is True
    strength = row[..., 1:].max(-1)  # (L, H): the largest weight on any key but the first
    order = sorted(((layer, head) for layer in range(2) for head in range(4)), key=lambda lh: (-strength[lh], lh))
    assert skipped["strongest"] == [f"{layer}.{head}" for layer, head in order]
    for record in skipped["heads"]:
        assert 0 not in [record[f"top{k}_position"] for k in (1, 2, 3)]
    assert np.array(skipped["rows"]) == pytest.approx(np.array(plain["rows"]))  # the weights are the model's
    assert not any("attention sink" in line for line in skipped["notes"])
    assert any("is left out of the ranking" in line for line in skipped["notes"])


def test_show_words_prints_word_maps_and_their_tokens(cli, demo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc, _ = _json(cli, "show", DOCTOR, "--layer", "0", "--words")
    maps, tokens = _reference(demo, DOCTOR)
    assert doc["view"] == "words" and doc["settings"]["words"] is True
    words = [word["positions"] for word in doc["words"]]
    assert words[2] == [2, 3, 4] and doc["words"][2]["text"] == "doctor"
    by_hand = np.array([[[maps[0, h][np.ix_(a, b)].sum(1).mean() for b in words] for a in words] for h in range(4)])
    np.testing.assert_allclose(np.array(doc["word_maps"]), by_hand, atol=1e-5)
    np.testing.assert_allclose(np.array(doc["maps"]), maps[0], atol=1e-5)  # the token maps stay
    tokens_view, _ = _json(cli, "show", DOCTOR, "--layer", "0")
    assert tokens_view["view"] == "tokens" and "word_maps" not in tokens_view and "words" not in tokens_view
    code, out, _ = cli("show", DOCTOR, "--head", "0.1", "--words", *DEMO, "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["layer", "head", "query", "key", "query_word", "key_word", "weight"]
    assert [(int(r["query"]), int(r["key"])) for r in rows] == [(a, b) for a in range(11) for b in range(a + 1)]
    named = {(int(r["query"]), int(r["key"])): (r["query_word"], r["key_word"]) for r in rows}
    assert named[10, 2] == (".", "doctor") and named[0, 0] == ("<bos>", "<bos>")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_word_pictures_of_show_and_heads_plot(cli, tmp_path):
    for args in (
        ["show", DOCTOR, "--layer", "1", "--words"],
        ["show", DOCTOR, "--head", "1.0", "--words"],
        ["show", DOCTOR, "--layer", "1"],  # the token picture, beside the words' (not over it)
    ):
        code, out, err = cli(*args, *DEMO, "--out", tmp_path / "show")
        assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "show").iterdir()) == [
        "attention_1.0_words.png",
        "attention_L1.png",
        "attention_L1_words.png",
    ]
    for path in (tmp_path / "show").iterdir():
        png_size(path)
    code, out, err = cli("heads", DOCTOR, *DEMO, "--plot", "0.2", "--words", "--out", tmp_path / "heads")
    assert code == 0, err
    png_size(tmp_path / "heads" / "attention_0.2_words.png")
    code, out, err = cli("heads", DOCTOR, *DEMO, "--words")
    assert code == 2 and "words (--words) draws the maps of plot (--plot L.H) word by word: give plot too" in err
