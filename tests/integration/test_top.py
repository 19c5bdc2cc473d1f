"""--top means one thing in every command: the first K rows of each ranked list, in --csv (`to_records`) and --json
(`to_document`) as on the terminal; without it --csv and --json hold every row, ranked, and the terminal the
command's usual number; the files of --out (`save`) keep every row whatever --top. On the demo model, whose heads
are known (0.2 previous-token, 1.0/1.2/1.3 induction)."""

from __future__ import annotations

import csv
import json

import pytest

import attnscope
from tests.support import CAT

TEXT = "The cat sat on the mat because it was tired. The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def demo():
    return attnscope.load("demo", "cpu", lm_head=True)


def _saved_rows(result, folder, name):
    result.save(folder)
    with open(folder / name, encoding="utf-8") as file:
        return list(csv.DictReader(file))


def test_ablate_ranks_its_rows_and_top_keeps_the_first_k_everywhere_but_the_files(demo, tmp_path):
    every = attnscope.ablate(demo, TEXT)
    three = attnscope.ablate(demo, TEXT, top=3)
    ranked = every.ranked_labels()
    assert [row["label"] for row in every.to_records()] == ranked  # every head, the most important first
    assert [row["label"] for row in three.to_records()] == ranked[:3]
    assert three.to_document()["most_important"] == ranked[:3] and every.to_document()["most_important"] == ranked
    assert len(three.to_document()["heads"]) == 8  # the records of every head stay in the JSON
    saved = _saved_rows(three, tmp_path / "three", "ablate.csv")
    assert [row["label"] for row in saved] == [f"{layer}.{head}" for layer in range(2) for head in range(4)]
    assert json.loads((tmp_path / "three" / "ablate.json").read_text())["most_important"] == ranked


def test_heads_and_attend_and_circuit_cut_their_rows_alike(demo):
    assert len(attnscope.heads(demo, CAT, top=3).to_records()) == 3
    assert len(attnscope.heads(demo, CAT).to_records()) == 8
    attend = attnscope.attend(demo, TEXT, from_token="tired@1", top=2)
    assert [row["label"] for row in attend.to_records()] == attend.strongest_labels(2)
    assert attend.to_document()["strongest"] == attend.strongest_labels(2)
    every = attnscope.attend(demo, TEXT, from_token="tired@1")
    assert [row["label"] for row in every.to_records()] == every.strongest_labels(8)
    circuit = attnscope.circuit(demo, TEXT, head=["1.0", "1.3"], top=2, weights=False, probe_len=8)
    records = circuit.to_records()
    assert [row["label"] for row in records] == ["1.0", "1.0", "1.3", "1.3"] and records == circuit.dependencies(2)
    assert len(circuit.to_document()["dependencies"]) == 4


def test_the_terminal_shows_the_usual_number_without_top_and_k_with_it(demo):
    from attnscope.output.views import shown_rows, view_of

    diversity = attnscope.diversity(demo, CAT, layer="all")
    assert shown_rows(diversity, 5) == 5 and len(diversity.to_document()["most_redundant"]) == 8 * 7 // 2
    two = attnscope.diversity(demo, CAT, layer="all", top=2)
    assert len(two.to_document()["most_redundant"]) == 2 and len(two.to_document()["most_distinct"]) == 2
    assert len(view_of(two).full_document()["most_redundant"]) == 8 * 7 // 2  # diversity.json in --out: all
    assert len(two.to_records()) == 8 * 7 // 2  # --csv: every pair of heads (the pairs are no ranked list)
