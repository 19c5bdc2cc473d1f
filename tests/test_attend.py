"""`attend`: one token's attention row in every layer and head, against the from-scratch attention."""

import json

import numpy as np
import pytest

from attnscope.attend import attend, match_token
from attnscope.errors import AttnscopeError
from attnscope.inputs import Text
from attnscope.tokens import batches, tokenize
from tests.test_capture import reference_maps

SENTENCE = "The doctor said that she would help the doctor."


def reference_rows(loaded, text):
    """(L, H, n, n) attention of the one window of `text`, recomputed from each layer's own weights."""
    tokenized = tokenize(loaded.tokenizer, [Text(text, "t")], loaded.n_ctx)
    batch = next(batches(tokenized.windows, 1, loaded.device))
    maps = reference_maps(loaded, batch)
    return np.stack([maps[layer][0].double().numpy() for layer in range(loaded.n_layer)])


def test_match_token_exact_then_case_insensitive_then_clear_error():
    labels = ["<bos>", "The", " doctor", " said", " the", " Doctor", " doctor"]
    assert match_token(labels, "doctor", 0, "--from") == (2, [2, 6])
    assert match_token(labels, "doctor", 1, "--from") == (6, [2, 6])
    assert match_token(labels, "the", 0, "--to") == (4, [4])  # exact match wins over "The"
    assert match_token(labels, "THE", 0, "--to") == (1, [1, 4])  # no exact match: case ignored
    assert match_token(labels, "<bos>", 0, "--to") == (0, [0])
    with pytest.raises(AttnscopeError, match=r"--from 'nurse' is not a token of the text; its tokens are .*2:'doctor'"):
        match_token(labels, "nurse", 0, "--from")
    with pytest.raises(AttnscopeError, match=r"--from-index 2: 'doctor' occurs 2 time\(s\) \(positions \[2, 6\]\)"):
        match_token(labels, "doctor", 2, "--from")


def test_rows_equal_the_independent_attention(tiny):
    result = attend(tiny, Text(SENTENCE, "t"), "she")
    assert result.tokens[result.from_position] == " she"
    expected = reference_rows(tiny, SENTENCE)[:, :, result.from_position]  # (L, H, n)
    assert result.rows.shape == expected.shape
    np.testing.assert_allclose(result.rows, expected, atol=1e-5)
    np.testing.assert_allclose(result.rows.sum(-1), 1.0, atol=1e-5)
    assert np.all(result.rows[..., result.from_position + 1 :] == 0)  # causal: nothing after the query
    assert result.to_weight is None


def test_to_weight_sums_the_occurrences_unless_one_is_picked(tiny):
    expected = reference_rows(tiny, SENTENCE)
    both = attend(tiny, Text(SENTENCE, "t"), "doctor", "doctor", from_index=1)  # the last word looks at both
    query = both.from_position
    assert both.to_positions == [2, query]
    np.testing.assert_allclose(both.to_weight, expected[:, :, query, 2] + expected[:, :, query, query], atol=1e-5)
    first = attend(tiny, Text(SENTENCE, "t"), "doctor", "doctor", from_index=1, to_index=0)
    assert first.to_positions == [2]
    np.testing.assert_allclose(first.to_weight, expected[:, :, query, 2], atol=1e-5)
    weights = both.to_weight
    strongest = both.strongest(3)
    assert [weights[lh] for lh in strongest] == sorted(weights.flatten(), reverse=True)[:3]


def test_a_later_target_is_refused_in_a_causal_model(tiny):
    with pytest.raises(AttnscopeError, match="cannot attend to later tokens"):
        attend(tiny, Text(SENTENCE, "t"), "doctor", "she")


def test_cli_json_csv_and_files(cli, tiny, tiny_model_dir, tmp_path):
    code, out, err = cli("attend", SENTENCE, "--from", "she", "--to", "doctor", "-m", tiny_model_dir, "--json", "--top", "2")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "attend" and doc["schema_version"] == 1
    assert doc["from"] == {"token": " she", "position": 5}
    assert doc["to"] == {"token": "doctor", "positions": [2]}  # occurrences after " she" are out of its sight
    expected = reference_rows(tiny, SENTENCE)[:, :, 5]
    records = {record["label"]: record for record in doc["heads"]}
    assert len(records) == 2 * 4
    for layer in range(2):
        for head in range(4):
            record = records[f"{layer}.{head}"]
            assert record["to_weight"] == pytest.approx(expected[layer, head, 2], abs=1e-5)
            top = np.argsort(-expected[layer, head], kind="stable")[:2]
            assert record["top1_position"] == top[0] and record["top2_position"] == top[1]
            assert record["top1_weight"] == pytest.approx(expected[layer, head, top[0]], abs=1e-5)
    assert doc["strongest"][0] == max(records, key=lambda label: records[label]["to_weight"])
    again = cli("attend", SENTENCE, "--from", "she", "--to", "doctor", "-m", tiny_model_dir, "--json", "--top", "2")[1]
    assert again == out  # deterministic

    code, out, err = cli("attend", SENTENCE, "--from", "she", "-m", tiny_model_dir, "--csv")
    assert code == 0, err
    header = out.splitlines()[0].split(",")
    assert header[:3] == ["layer", "head", "label"] and "to_weight" not in header and "top3_weight" in header
    assert len(out.splitlines()) == 1 + 8

    code, out, err = cli("attend", SENTENCE, "--from", "she", "-m", tiny_model_dir, "--out", tmp_path / "att")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "att").iterdir()) == ["attend.csv", "attend.json", "attend.png"]
    assert (tmp_path / "att" / "attend.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "she" in out and "Strongest heads" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--from", "nurse"], "--from 'nurse' is not a token of the text"),
        (["--from", "she", "--to", "would"], "comes after --from"),
        (["--from", "doctor", "--from-index", "5"], "--from-index 5: 'doctor' occurs 2 time(s)"),
        (["--from", "she", "--top", "0"], "--top and --heads must be at least 1"),
        (["--from", "she", "--index", "3"], "--index 3 is out of range"),
        (["--from", "she", "--json", "--csv"], "give --json or --csv, not both"),
        ([], "Missing option '--from'"),
    ],
)
def test_cli_errors_are_one_line(cli, tiny_model_dir, args, message):
    code, out, err = cli("attend", SENTENCE, "-m", tiny_model_dir, *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("attnscope: error: ") and message in err, err
    assert out == ""
