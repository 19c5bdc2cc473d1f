"""`kvplan` without a model: the reducer against hand-built attention maps whose attention outside the sink and the
recent window is known (computed by hand, row by row), the KV heads' scores (the largest of each group), the plan
(floor(F × N), the lowest, ties by layer then head), the memory by hand, and DuoAttention's files read back the way
its loader and kvpress read them (numpy.loadtxt), on a hand-built result."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from attnscope import settings
from attnscope.analyses.kv_plans import cache_bytes, group_max, plan, streaming_heads
from attnscope.analyses.kvplan import KvplanResult, probe_tokens
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape
from attnscope.output.kvplan import PLAN_FILE, byte_size, memory_line, plan_config, plan_tsv
from attnscope.output.notebook import html
from attnscope.output.views import view_of
from attnscope.pipeline import block_path
from attnscope.pipeline.blocks import AttentionBlock, LayerRows
from attnscope.pipeline.reducers import DistantAttention
from tests.support import first_token_map, previous_token_map, uniform_map

N = 20  # tokens of the hand-built windows


def _distant(maps: torch.Tensor, sink: int, recent: int, lengths=None, cut: int | None = None) -> DistantAttention:
    """The reducer fed `maps` (B, H, n, n) as the capture feeds it: the block path's sums over the keys it asks for
    (`summed_keys`), of causal blocks of rows (split at `cut`), each with the keys up to its last row, then the
    layer's rows."""
    B, H, n, _ = maps.shape
    lengths = torch.full((B,), n) if lengths is None else torch.tensor(lengths)
    reducer = DistantAttention(1, H, torch.device("cpu"), sink, recent)
    summed = []
    for start, stop in ((0, cut), (cut, n)) if cut else ((0, n),):
        block = AttentionBlock.from_probs(maps[:, :, start:stop, :stop], torch.arange(start, stop), lengths)
        summed.append(block_path._summed(block.exp_logits, block.normalizer, block.positions, reducer.summed_keys))
    zeros = torch.zeros(B, H, n)
    reducer.add_layer(0, LayerRows(zeros, zeros, None, lengths, torch.ones(B, n), None, summed=torch.cat(summed, -1)))
    return reducer


def _by_hand(rows, sink: int, recent: int, n: int = N) -> float:
    """The mean over rows i >= sink + recent of the weight on keys sink..i - recent, from rows as lists."""
    scored = [sum(rows(i)[j] for j in range(sink, i - recent + 1)) for i in range(sink + recent, n)]
    return sum(scored) / len(scored)


@pytest.mark.parametrize("cut", [None, 7, 11])
def test_the_reducer_against_heads_whose_distant_attention_is_known(cut):
    maps = torch.cat([previous_token_map(N), uniform_map(N), first_token_map(N)], dim=1)  # (1, 3, n, n)
    sink, recent = 3, 4
    reducer = _distant(maps, sink, recent, cut=cut)
    assert int(reducer.row_count) == N - sink - recent  # rows 7..19
    uniform = np.mean([(i - sink - recent + 1) / (i + 1) for i in range(sink + recent, N)])
    assert uniform == pytest.approx(_by_hand(lambda i: [1 / (i + 1)] * (i + 1), sink, recent))
    expected = torch.tensor([[0.0, uniform, 0.0]], dtype=torch.float64)
    assert torch.allclose(reducer.means(), expected, atol=1e-6)
    assert reducer.sliding_windows == {0: None}


def test_keys_at_the_edges_of_the_sink_and_of_the_recent_window():
    """recent 1 keeps the row's own key alone: the previous token is dropped (weight 1); sink 0 keeps no first
    token: attention on token 0 is dropped too; a head on the key just past the sink is all distant."""
    maps = torch.cat([previous_token_map(N), first_token_map(N)], dim=1)
    assert torch.allclose(_distant(maps, 3, 1).means(), torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    assert torch.allclose(_distant(maps, 0, 2).means(), torch.tensor([[0.0, 1.0]], dtype=torch.float64))
    on_sink_end = torch.zeros(1, 1, N, N)
    on_sink_end[0, 0, :3, 0] = 1.0
    on_sink_end[0, 0, 3:, 3] = 1.0  # key 3: the first after a sink of 3
    assert float(_distant(on_sink_end, 3, 4).means()) == pytest.approx(1.0)
    assert float(_distant(on_sink_end, 4, 4).means()) == pytest.approx(0.0)


def test_padded_rows_and_short_windows_are_not_scored():
    maps = torch.cat([uniform_map(N), uniform_map(N)], dim=0)  # (2, 1, n, n): two windows
    reducer = _distant(maps, 2, 3, lengths=[N, 8], cut=9)
    assert int(reducer.row_count) == (N - 5) + (8 - 5)
    rows = [(i - 4) / (i + 1) for i in range(5, N)] + [(i - 4) / (i + 1) for i in range(5, 8)]
    assert float(reducer.means()) == pytest.approx(np.mean(rows))
    assert torch.isnan(_distant(uniform_map(5), 2, 3).means()).all()  # no row with a distant key


def test_a_kv_heads_score_is_the_largest_of_its_query_heads():
    scores = np.array([[0.1, 0.5, 0.2, 0.3], [0.0, 0.0, 0.9, 0.05]])  # (L, H): 4 query heads over 2 KV heads
    assert group_max(scores, 2).tolist() == [[0.5, 0.3], [0.0, 0.9]]  # query heads (0, 1) read KV head 0
    assert group_max(scores, 1).tolist() == [[0.5], [0.9]]
    assert group_max(scores, 4).tolist() == scores.tolist()


def test_the_plan_streams_the_floor_of_the_share_the_lowest_first_ties_by_layer_then_head():
    kv_scores = np.array([[0.30, 0.10, 0.10], [0.10, 0.50, 0.20]])
    assert streaming_heads(6, 0.5) == 3 and streaming_heads(6, 0.49) == 2 and streaming_heads(100, 0.29) == 29
    assert streaming_heads(7, 1.0) == 7 and streaming_heads(7, 0.0) == 0
    full = plan(kv_scores, 0.5)
    assert full.tolist() == [[True, False, False], [False, True, True]]  # the three 0.10s
    assert plan(kv_scores, 0.34).tolist() == [[True, False, False], [True, True, True]]  # floor(2.04): ties by layer
    assert not plan(kv_scores, 1.0).any() and plan(kv_scores, 0.0).all()
    # the scores as the JSON writes them: a difference past the 6th decimal is a tie
    assert plan(np.array([[0.2000001, 0.2]]), 0.5).tolist() == [[False, True]]


def test_the_memory_by_hand():
    """GPT-2 small's shape: 12 layers × 12 KV heads × d_head 64 in float32 at 1,024 tokens is 2 × 12 × 12 × 64 ×
    1024 × 4 B = 72 MiB; streaming 72 of the 144 heads with sink + recent = 384 positions."""
    full = np.ones((12, 12), dtype=bool)
    full[:, :6] = False
    every, planned = cache_bytes(full, [None] * 12, 64, 4, 1024, 384)
    assert every == 2 * 12 * 12 * 64 * 1024 * 4 == 72 * 2**20
    assert planned == 2 * 64 * 4 * 12 * (6 * 1024 + 6 * 384)
    # a context within sink + recent: a streaming head holds all of it, like a full one
    assert cache_bytes(full, [None] * 12, 64, 4, 300, 384) == (2 * 12 * 12 * 64 * 300 * 4,) * 2
    # a layer that slides with its own window of 100 holds 100 positions, full or streaming (min(100, 384))
    every, planned = cache_bytes(full[:2], [100, None], 64, 2, 1024, 384)
    assert every == 2 * 64 * 2 * 12 * (100 + 1024)
    assert planned == 2 * 64 * 2 * (12 * 100 + 6 * 1024 + 6 * 384)
    assert byte_size(72 * 2**20) == "72.0 MiB" and byte_size(1.5 * 2**30) == "1.50 GiB" and byte_size(512) == "512 B"


def test_probe_length():
    assert probe_tokens(256, 16, 64) == 256  # the model's context
    assert probe_tokens(131072, 128, 256) == settings.PROBE_TOKENS
    assert probe_tokens(131072, 2048, 2048) == 8192  # twice sink + recent: half its rows scored


def test_settings_refuse_an_encoder_and_a_context_the_sink_and_window_fill():
    plan_settings = settings.Kvplan(sink=16, recent=64)
    plan_settings.check_shape(Shape(2, 4, "decoder", 81))
    with pytest.raises(AttnscopeError, match="^kvplan plans the KV cache a decoder keeps .* this model is an encoder"):
        plan_settings.check_shape(Shape(2, 4, "encoder", 512))
    with pytest.raises(AttnscopeError, match=r"^sink 16 \+ recent 64 \(--sink, --recent\) = 80 tokens hold the mo"):
        plan_settings.check_shape(Shape(2, 4, "decoder", 80))
    for given, message in (
        ({"streaming": 1.5}, "^streaming 1.5: expected a number from 0 to 1, or 'auto'$"),
        ({"sink": -1}, "^sink -1: must be a whole number from 0 to 100,000$"),
        ({"recent": 0}, "^recent 0: must be a whole number from 1 to 100,000$"),
        ({"context": 0}, "^context 0: must be a whole number from 1 to 1,000,000,000$"),
    ):
        with pytest.raises(AttnscopeError, match=message):
            settings.Kvplan(**given)


# ------------------------------------------------------------------------------------------- files and faces

MODEL = {"name": "tiny <b>", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_head": 8, "n_ctx": 64, "dtype": "float32"}


def kvplan_result() -> KvplanResult:
    scores = np.array([[0.1, 0.5, 0.2, 0.3], [0.0, 0.01, 0.9, 0.05]])
    kv_scores = group_max(scores, 2)  # [[0.5, 0.3], [0.01, 0.9]]
    full = plan(kv_scores, 0.5)  # 1.0 and 0.1 stream
    every, planned = cache_bytes(full, [None, 16], 8, 4, 1024, 24)
    memory = {
        "context": 1024, "dtype": "float32", "bytes_per_element": 4, "full_bytes": every, "plan_bytes": planned,
        "ratio": planned / every,
    }  # fmt: skip
    settings_ = {"streaming": 0.5, "sink": 8, "recent": 16, "context": 1024, "batch_size": 8, "max_tokens": 16384}
    inputs = {"n_texts": 1, "n_windows": 1, "n_tokens": 64, "bos": True, "sources": ["a"], "scored_rows": 40}
    return KvplanResult(MODEL, inputs, settings_, scores, kv_scores, full, [None, 16], memory, ["a <note>"])


def test_duoattentions_files_read_back_as_its_loader_reads_them(tmp_path):
    result = kvplan_result()
    assert result.full.tolist() == [[True, False], [False, True]]
    written = result.save(tmp_path)
    names = sorted(path.name for path in written)
    assert names == "config.json full_attention_heads.tsv head_score.json kvplan.csv kvplan.json kvplan.png".split()
    # duo_attn.utils.load_attn_pattern and kvpress's DuoAttentionPress.load_attention_pattern, as they read them
    pattern = np.clip(np.loadtxt(tmp_path / PLAN_FILE, dtype=float, delimiter="\t"), 0, 1)
    assert pattern.shape == (2, 2) and pattern.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["sink_size"], config["recent_size"], config["sparsity"]) == (8, 16, 0.5)
    written_by_numpy = tmp_path / "savetxt.tsv"
    np.savetxt(written_by_numpy, result.full.astype(float), delimiter="\t")  # DuoAttention's save_full_attention_heads
    assert (tmp_path / PLAN_FILE).read_text() == written_by_numpy.read_text()
    document = json.loads((tmp_path / "kvplan.json").read_text())
    assert document == json.loads(result.to_json())
    assert document["heads"] == [
        {"layer": 0, "kv_head": 0, "score": 0.5, "full": True},
        {"layer": 0, "kv_head": 1, "score": 0.3, "full": False},
        {"layer": 1, "kv_head": 0, "score": 0.01, "full": False},
        {"layer": 1, "kv_head": 1, "score": 0.9, "full": True},
    ]
    assert document["query_heads"][5] == {"layer": 1, "head": 1, "kv_head": 0, "score": 0.01}
    assert document["plan"] == {**document["plan"], "kv_heads": 4, "streaming": 2, "full": 2}
    assert document["layers"][1] == {"layer": 1, "sliding_window": 16, "full": 1, "streaming": 1, "max_score": 0.9}
    # by hand: layer 0 holds 1024 positions per head, layer 1 its window of 16 (a streaming head min(16, 24))
    assert document["memory"]["full_bytes"] == 2 * 8 * 4 * 2 * (1024 + 16)
    assert document["memory"]["plan_bytes"] == 2 * 8 * 4 * (1024 + 24 + 16 + 16)
    assert [record["full"] for record in result.to_records()] == [True, False, False, True]


def test_one_layer_and_one_kv_head_round_trip_with_ndmin():
    """numpy.loadtxt squeezes a single line or column: a plan of one layer reads back with ndmin=2."""
    full = np.array([[True, False, True]])
    assert np.loadtxt(io.StringIO(plan_tsv(full)), delimiter="\t", ndmin=2).tolist() == [[1.0, 0.0, 1.0]]


def test_the_faces_say_the_plan_and_the_memory():
    result = kvplan_result()
    line = memory_line(result)
    assert line == "KV cache at 1,024 tokens (float32): 130 KiB full, 67.5 KiB with this plan (52 %)"
    assert plan_config(result)["model_name"] == "tiny <b>"
    text = repr(result)
    assert text.startswith("<KvplanResult tiny <b>: 2 layers × 4 heads") and "2 of 4 KV heads streaming" in text
    assert "streaming (layer.kv_head score): 1.0 .010 · 0.1 .300" in text
    fragment = html(view_of(result))
    assert "<b>" not in fragment and "&lt;note&gt;" in fragment and "(.300)" in fragment
    from rich.console import Console

    console = Console(width=100, record=True, color_system=None)
    for item in view_of(result).terminal([]):
        console.print(item)
    shown = console.export_text()
    assert "KV cache plan: 2 of 4 KV heads streaming (the first 8 + last 16 tokens), 2 full" in shown
    rows = [line.split() for line in shown.splitlines()]
    assert ["0", "-", "1/2", ".500", "(.300)"] in rows and ["1", "16", "1/2", "(.010)", ".900"] in rows


def test_a_model_of_many_kv_heads_gets_one_line_per_layer_with_the_plans_margin():
    """Past 16 KV heads (a multi-head model of 32), each layer shows the largest score that streams and the smallest
    that keeps the full cache, not 32 columns."""
    from rich.console import Console

    scores = np.arange(40, dtype=float).reshape(2, 20) / 100  # layer 0: .00-.19, layer 1: .20-.39
    full = plan(scores, 0.6)  # the 24 lowest: all of layer 0 and 1.0-1.3
    memory = {"context": 8, "dtype": "float32", "bytes_per_element": 4, "full_bytes": 1, "plan_bytes": 1, "ratio": 1}
    result = KvplanResult({"name": "wide"}, {}, {"sink": 1, "recent": 2}, scores, scores, full, [None, None], memory)
    console = Console(width=100, record=True, color_system=None)
    for item in view_of(result).terminal([]):
        console.print(item)
    rows = [line.split() for line in console.export_text().splitlines()]
    assert ["L", "full", "highest", "streaming", "lowest", "full"] in rows
    assert ["0", "0/20", "(.190)", "-"] in rows and ["1", "16/20", "(.230)", ".240"] in rows


@pytest.mark.parametrize(("sink", "recent", "band"), [(4, 8, 16), (0, 5, 7), (3, 1, 64)])
def test_the_distant_share_from_the_logsumexp_is_the_sum_over_the_dropped_keys(sink, recent, band, monkeypatch):
    """pipeline.distant: 1 less a row's weights on its sink and recent keys, from the fused kernel's logsumexp, in
    bands of rows (a last band shorter; no sink; a window of the row alone), against the weights on the keys
    S <= j <= i - R summed in float64 from a softmax written here; 3 query heads over each of 2 KV heads."""
    from attnscope.pipeline import distant

    monkeypatch.setattr(distant, "BAND_ROWS", band)
    generator = torch.Generator().manual_seed(0)
    n, d = 70, 8
    query, key = torch.randn(1, 6, n, d, generator=generator), torch.randn(1, 2, n, d, generator=generator)
    logits = (query.double() @ key.double().repeat_interleave(3, dim=1).transpose(-1, -2)) * d**-0.5
    logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    weights = logits.softmax(dim=-1)  # (1, 6, n, n)
    expected = torch.zeros(1, 6, n, dtype=torch.float64)
    for i in range(sink + recent, n):
        expected[..., i] = weights[..., i, sink : i - recent + 1].sum(dim=-1)
    lse = torch.logsumexp(logits, dim=-1).float()  # the kernel's, in float32
    summed = distant.distant_share(query, key, lse, d**-0.5, (sink, recent))
    assert summed.dtype == torch.float32 and summed.shape == (1, 6, n)
    assert torch.allclose(summed.double(), expected, atol=2e-6)
    assert expected[..., sink + recent :].min() > 0.01  # the rows scored carry weight beyond their kept keys
