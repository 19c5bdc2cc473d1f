"""The formats of `kvplan --out` that other tools read, without a model and without those tools: Retrieval Head's
head_score.json read back with Retrieval Head's own reading code (re-implemented below, cited), and the plan folder
as attnscope.interop.kvpress hands it to kvpress (the press itself, with kvpress installed, is tested in
tests/integration/test_kvpress_interop.py); without kvpress, the press fails in one line that says how to get it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnscope.analyses.kv_plans import cache_bytes, group_max, plan
from attnscope.analyses.kvplan import KvplanResult
from attnscope.errors import AttnscopeError
from attnscope.interop import kvpress as interop
from attnscope.output.kvplan import HEAD_SCORE_FILE, head_score_json

ROOT = Path(__file__).resolve().parents[2]
MODEL = {"name": "tiny", "n_layer": 3, "n_head": 4, "n_kv_head": 2, "d_head": 8, "n_ctx": 64, "dtype": "float32"}
# (L, H): 3 layers of 4 query heads on 2 KV heads; ties across heads and layers, and a score past 6 decimals
SCORES = np.array([[0.1, 0.5, 0.2, 0.3], [0.0, 0.01, 0.9, 0.05], [0.3, 0.1234567891, 0.05, 0.3]])


def result(streaming: float = 0.5) -> KvplanResult:
    kv_scores = group_max(SCORES, 2)  # [[.5, .3], [.01, .9], [.3, .3]]
    full = plan(kv_scores, streaming)
    every, planned = cache_bytes(full, [None] * 3, 8, 4, 1024, 24)
    memory = {
        "context": 1024, "dtype": "float32", "bytes_per_element": 4, "full_bytes": every, "plan_bytes": planned,
        "ratio": planned / every,
    }  # fmt: skip
    settings_ = {"streaming": streaming, "sink": 8, "recent": 16, "context": 1024, "batch_size": 8, "max_tokens": 1}
    inputs = {"n_texts": 1, "n_windows": 1, "n_tokens": 64, "bos": True, "sources": ["a"], "scored_rows": 40}
    return KvplanResult(MODEL, inputs, settings_, SCORES, kv_scores, full, [None] * 3, memory, [], streaming)


def retrieval_head_ranking(path) -> list[tuple[list[int], float]]:
    """nightdessert/Retrieval_Head's read of its `head_score/<model>.json`, as its README's "Directly load a results
    for Analysis" writes it (and `needle_in_haystack_with_mask.py` builds its list of heads to mask): the first line
    as JSON, each head's mean retrieval score, the highest first ([layer, head], score)."""
    with open(path) as file:
        head_list = json.loads(file.readline())
    head_score_list = [([int(ll) for ll in l[0].split("-")], np.mean(l[1])) for l in head_list.items()]  # noqa: E741
    return sorted(head_score_list, key=lambda x: x[1], reverse=True)


# ------------------------------------------------------------------------------------------ Retrieval Head


def test_head_score_json_reads_back_with_retrieval_heads_own_code(tmp_path):
    written = result().save(tmp_path)
    assert tmp_path / HEAD_SCORE_FILE in written
    text = (tmp_path / HEAD_SCORE_FILE).read_text()
    assert text.count("\n") == 1 and text.endswith("}\n")  # one line: their readers take file.readline()
    heads = json.loads(text)
    # keys "layer-head", 0-based, layer by layer (the order their retrieval_head_accumulate fills), one score each
    assert list(heads) == [f"{layer}-{head}" for layer in range(3) for head in range(4)]
    assert all(len(scores) == 1 for scores in heads.values())
    document = json.loads((tmp_path / "kvplan.json").read_text())
    assert [[query["score"]] for query in document["query_heads"]] == list(heads.values())  # kvplan.json's, 6 places
    assert heads["2-1"] == [0.123457]

    ranking = retrieval_head_ranking(tmp_path / HEAD_SCORE_FILE)
    assert ranking[0] == ([1, 2], 0.9) and ranking[-1] == ([1, 0], 0.0)
    # their ranking is the query heads by score, highest first, ties in the file's order (sorted() is stable)
    by_score = sorted(document["query_heads"], key=lambda query: -query["score"])
    assert [head for head, _ in ranking] == [[query["layer"], query["head"]] for query in by_score]
    assert [score for _, score in ranking] == pytest.approx([query["score"] for query in by_score], abs=0)
    ties = [head for head, score in ranking if score == 0.3]
    assert ties == [[0, 3], [2, 0], [2, 3]]


def test_head_score_json_is_the_query_heads_not_the_kv_heads():
    scores = np.arange(2 * 6, dtype=float).reshape(2, 6) / 100  # (L, H) = (2, 6): as many keys as query heads
    heads = json.loads(head_score_json(scores))
    assert len(heads) == 12 and heads["1-5"] == [0.11] and heads["0-0"] == [0.0]


# ------------------------------------------------------------------------------- the plan folder for kvpress


def test_the_pattern_streams_the_plans_zeros_at_its_share_and_the_lowest_scores_at_others(tmp_path):
    outcome = result(0.5)
    outcome.save(tmp_path)
    sink, recent, pattern, sparsity = interop.plan_pattern(tmp_path, (3, 2))
    assert (sink, recent, sparsity) == (8, 16, 0.5)
    assert pattern.shape == (3, 2) and ((pattern >= 0) & (pattern < 1)).all()
    assert len(np.unique(pattern)) == pattern.size  # no ties for numpy.argsort to break by chance
    # kvpress: round(ratio × N) KV heads with the lowest values stream (DuoAttentionPress.post_init_from_model)
    order = [tuple(int(i) for i in np.unravel_index(k, pattern.shape)) for k in np.argsort(pattern, axis=None)]
    streaming = {head for head in order[: round(pattern.size * sparsity)]}
    assert streaming == {tuple(int(i) for i in head) for head in np.argwhere(~outcome.full)}
    assert order == outcome.ranked()  # kvplan's order: score, then layer, then KV head ((2, 0) before (2, 1))
    assert (pattern < 0.5).sum() == outcome.streaming_count  # every 0 below every 1


def test_without_kvplan_json_the_tsv_is_read_as_kvpress_reads_it(tmp_path):
    (tmp_path / "full_attention_heads.tsv").write_text("0.25\t1.5\n-1\t0.75\n")  # DuoAttention's gates, clipped
    # as DuoAttention's published config.json files (attn_patterns/*/config.json) give them, among other keys
    (tmp_path / "config.json").write_text('{"sink_size": 128, "recent_size": 256, "sparsity": null}')
    sink, recent, pattern, sparsity = interop.plan_pattern(tmp_path)
    assert (sink, recent, sparsity) == (128, 256, None)
    assert pattern.tolist() == [[0.25, 1.0], [0.0, 0.75]]
    (tmp_path / "full_attention_heads.tsv").write_text("1\t0\t1\n")  # one layer: a row, not a vector (ndmin=2)
    assert interop.plan_pattern(tmp_path)[2].shape == (1, 3)


def test_a_folder_that_is_no_plan_or_another_models_is_refused_in_one_line(tmp_path):
    with pytest.raises(AttnscopeError, match=r"^no full_attention_heads.tsv in .*attnscope kvplan --out"):
        interop.plan_pattern(tmp_path)
    result().save(tmp_path)
    with pytest.raises(AttnscopeError, match=r"is for 3 layers × 2 KV heads, the model has 32 × 8: a plan of an"):
        interop.plan_pattern(tmp_path, (32, 8))
    (tmp_path / "config.json").write_text('{"sink_size": 4}')
    with pytest.raises(AttnscopeError, match=r"is not a plan that kvpress can read \('recent_size'\)$"):
        interop.plan_pattern(tmp_path)


def test_without_kvpress_the_press_fails_in_one_line_naming_pip_install_kvpress(tmp_path, monkeypatch):
    result().save(tmp_path)
    monkeypatch.setitem(sys.modules, "kvpress", None)  # `import kvpress` raises ImportError, as where it is missing
    interop.press_class.cache_clear()
    try:
        with pytest.raises(AttnscopeError, match=r"^kvpress is not installed: pip install kvpress \(") as raised:
            interop.plan_press(tmp_path)
    finally:
        interop.press_class.cache_clear()
    assert "\n" not in str(raised.value)


def test_the_module_imports_neither_kvpress_nor_torch():
    heavy = ("kvpress", "torch", "transformers")
    code = f"import sys, attnscope.interop.kvpress; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"
