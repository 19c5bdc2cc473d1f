"""The fused Triton kernel (pipeline.fused) and the capture's dispatch to it. Without a GPU Triton's interpreter runs
the kernel on CPU tensors (tests/conftest.py switches it on before transformers imports Triton): its output and
per-row summaries against a from-scratch float64 computation, every family's statistics through it against the
block path and against the from-scratch or eager maps, and the dispatcher's fallbacks with their notes. A GPU, where
there is one, compiles the kernel instead (the last test)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from attnscope import api
from attnscope.errors import AttnscopeError
from attnscope.models.loading import load_model
from attnscope.pipeline import block_path, capture, kernels
from attnscope.pipeline.blocks import Reducer
from attnscope.pipeline.reducers import HeadStatistics
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from attnscope.scores import rows
from tests.support import FAMILY_MODELS, FAMILY_TEXTS, TEXTS, reference_maps, visible_keys

fused = pytest.importorskip("attnscope.pipeline.fused", reason="needs triton: pip install 'attnscope[gpu]'")
if torch.cuda.is_available() or not fused.interpreted():
    pytest.skip("the interpreter is off in this process (a GPU compiles the kernel)", allow_module_level=True)

UNBOUNDED = fused.UNBOUNDED
INTERPRETER_NOTES = [kernels.INTERPRETER_NOTE]  # what a run wholly through the fused kernel says


# ------------------------------------------------------------------------------- the kernel, from scratch


def reference(q, k, v, scaling, limits, left, right, wanted, softcap=None, sinks=None):
    """The kernel's results computed from scratch in float64: queries (B, H, n, d) over keys and values (B, H_kv,
    n, d) read by query head h // G; row i of window b sees key j when j < limits[b], i - left < j < i + right."""
    B, H, n, _ = q.shape
    G = H // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    s = q @ k.transpose(-1, -2) * scaling  # (B, H, n, n)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    seen = ((j[None] < limits[:, None, None]) & (j > i - left) & (j < i + right))[:, None]  # (B, 1, n, n)
    peak = s.masked_fill(~seen, float("-inf")).amax(-1)  # (B, H, n)
    shift = peak if sinks is None else torch.maximum(peak, sinks.double().view(1, H, 1))
    shifted = s - shift[..., None]
    weights = torch.where(seen, torch.exp(shifted), 0.0)  # exp(s - shift) on the keys seen
    normalizer = weights.sum(-1) + (0.0 if sinks is None else torch.exp(sinks.double().view(1, H, 1) - shift))
    attention = weights / normalizer[..., None]
    index = wanted.expand(B, n, -1)[:, None].expand(B, H, n, -1)  # (B, H, n, m)
    gathered = torch.where(seen.expand(B, H, n, n).gather(-1, index), shifted.gather(-1, index), -87.0).clamp(min=-87)
    return {
        "output": (attention @ v).transpose(1, 2),  # (B, n, H, d)
        "normalizer": normalizer,
        "expected_logit": torch.where(seen, attention * shifted, 0.0).sum(-1),
        "gathered": gathered,
        "peak": peak - shift,
        "mass": attention.sum(-1),
    }


def _inputs(dtype=torch.float32, n=37, d=24, seed=0):
    """Random queries (B=2, H=4), keys and values (2 key/value heads: grouped-query attention), window 1 padded."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, heads, n, d, generator=generator).to(dtype) for heads in (4, 2, 2))
    positions = torch.arange(n)
    wanted = torch.stack(
        [positions, (positions - 1).clamp(min=0), (positions + 2).clamp(max=n - 1), torch.zeros_like(positions)], -1
    )  # (n, 4): self, previous, two ahead (a causal row never sees it), first
    return q, k, v, torch.tensor([n, n - 7]), wanted


CASES = {  # name -> (left, right, softcap, sinks): causal rows have right = 1
    "causal": (UNBOUNDED, 1, None, False),
    "bidirectional": (UNBOUNDED, UNBOUNDED, None, False),
    "causal window, soft-capping": (5, 1, 2.0, False),
    "bidirectional window": (4, 4, None, False),
    "sinks, causal window": (5, 1, None, True),
}


@pytest.mark.parametrize(
    "case", [pytest.param(name, marks=() if name == "causal" else pytest.mark.slow) for name in CASES]
)
def test_the_kernel_equals_attention_from_scratch(case, monkeypatch):
    """Tiles of 16 rows and 16 keys over 37 tokens: several row blocks and key tiles, the running maximum moving
    between tiles, a window starting mid-tile, padded rows and keys; both ways of gathering logits."""
    monkeypatch.setattr(fused, "INTERPRETER_BLOCK", 16)
    left, right, softcap, with_sinks = CASES[case]
    q, k, v, limits, wanted = _inputs()
    sinks = torch.tensor([0.5, -1.0, 3.0, 0.0]) if with_sinks else None
    expected = reference(q, k, v, 0.3, limits, left, right, wanted, softcap, sinks)
    real = torch.arange(q.shape[2])[None, :] < limits[:, None]  # (B, n): padded rows may hold anything
    for by_slot in (False, True):
        got = fused.fused_attention(q, k, v, 0.3, limits, left, right, wanted, softcap, sinks, by_slot=by_slot)
        assert got.output.shape == (2, 37, 4, 24) and got.output.dtype == torch.float32
        assert float((got.output - expected["output"])[real].abs().max()) < 1e-5
        for name in ("normalizer", "expected_logit", "gathered") + (("peak", "mass") if with_sinks else ()):
            value = getattr(got, name)
            assert value.dtype == torch.float32, name
            difference = (value.double() - expected[name]).transpose(1, 2)[real].abs()  # (real rows, H, ...)
            assert float(difference.max()) < 1e-5, (name, by_slot)
        if not with_sinks:
            assert got.peak is None and got.mass is None


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_keep_float32_statistics(dtype):
    """bfloat16 and float16 queries, keys and values: the logits and every statistic are float32 sums of exact
    products of the inputs, so they equal the from-scratch values of the same (rounded) inputs to 1e-5; the output
    has the input's dtype and is off by its rounding and the weights' (each rounded to that dtype before A·V, as
    tensor cores take them): at most 2^-7 of the largest value (the bound docs/gpu.md states)."""
    q, k, v, limits, wanted = _inputs(dtype)
    expected = reference(q, k, v, 0.3, limits, 5, 1, wanted)
    got = fused.fused_attention(q, k, v, 0.3, limits, 5, 1, wanted)
    real = torch.arange(q.shape[2])[None, :] < limits[:, None]
    assert got.output.dtype == dtype and got.normalizer.dtype == torch.float32
    bound = 2**-7 * float(v.abs().max())
    assert float((got.output.double() - expected["output"])[real].abs().max()) < bound
    for name in ("normalizer", "expected_logit", "gathered"):
        assert float((getattr(got, name).double() - expected[name]).transpose(1, 2)[real].abs().max()) < 1e-5, name


# ----------------------------------------------------------------------------- models through the kernel


def _through(loaded, batch, kernel):
    """(statistics' means, the model's last hidden state, the capture's notes) with `kernel`."""
    outputs = []
    hook = loaded.model.register_forward_hook(lambda module, args, output: outputs.append(output.last_hidden_state))
    statistics = HeadStatistics(loaded.kind, loaded.n_layer, loaded.n_head, loaded.device)
    try:
        captured = capture.run(loaded.model, [batch], statistics, kernel=kernel)
    finally:
        hook.remove()
    return statistics.means(), outputs[0], captured.notes


def _one_batch(loaded, texts):
    windows = tokenize(loaded, texts).windows
    return next(batches(windows, len(windows), loaded.device, pad_id(loaded.tokenizer)))


def _compare(loaded, batch, maps):
    """The fused kernel against the block path (output and every statistic) and against `maps` (layer -> (B, H, n,
    n), an independent computation of the weights): every layer through the kernel, none left to the block path."""
    kernel_means, kernel_output, notes = _through(loaded, batch, "fused")
    block_means, block_output, _ = _through(loaded, batch, "blocks")
    assert notes == INTERPRETER_NOTES  # no layer fell back: the comparison is of the kernel
    real = torch.arange(batch.input_ids.shape[1])[None, :] < batch.lengths[:, None]  # (B, n)
    assert float((kernel_output - block_output).abs()[real].max()) < 1e-5
    n = batch.input_ids.shape[1]
    for layer, attention in maps.items():
        visible = visible_keys(loaded.config, layer, batch.lengths, n, loaded.kind.causal)  # (B, n, n)
        expected = rows.head_scores(loaded.kind, attention.float(), batch.lengths, visible=visible)
        for score, value in expected.items():
            assert torch.allclose(kernel_means[score][layer], value, atol=1e-5), (layer, score)
            assert torch.allclose(kernel_means[score][layer], block_means[score][layer], atol=1e-5), (layer, score)


def test_a_tiny_gpt2_through_the_kernel_equals_from_scratch_attention(tiny):
    batch = _one_batch(tiny, TEXTS[1:3])  # two windows of different lengths
    _compare(tiny, batch, reference_maps(tiny, batch))


@pytest.mark.slow
def test_a_tiny_bert_through_the_kernel_equals_from_scratch_attention(tiny_bert):
    batch = _one_batch(tiny_bert, TEXTS[1:3])
    _compare(tiny_bert, batch, reference_maps(tiny_bert, batch))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILY_MODELS))
def test_every_family_through_the_kernel_equals_its_eager_maps(family_dir, name):
    """Grouped- and multi-query attention, sliding windows (causal, and ModernBERT's bidirectional local layers),
    soft-capping, sinks, QK-norm, custom scaling: the kernel covers every family, on a window of 20-odd tokens, five
    times the sliding window (one window: the interpreter's time goes with the batch; padding is the GPT-2 and BERT
    tests' and the kernel's own)."""
    loaded = load_model(str(family_dir(name)), "cpu")
    batch = _one_batch(loaded, FAMILY_TEXTS[2:])
    with torch.no_grad():
        eager = loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
    _compare(loaded, batch, dict(enumerate(eager.attentions)))


# ------------------------------------------------------------------------------------ dispatch, fallbacks


def test_reducers_that_want_blocks_take_the_block_path_with_a_note(tiny):
    """Full probabilities (maps, diversity, a query row, the probe) come from the block path, also when the fused
    kernel is asked for by name; asked for automatically, it goes unsaid."""
    batch = _one_batch(tiny, TEXTS[1:3])

    class Blocks(Reducer):
        wants_blocks = True

        def __init__(self):
            self.layers = []

        def add_block(self, layer, block):
            self.layers.append(layer)

    for kernel, notes in (("fused", [kernels.BLOCKS_WANTED]), ("auto", [])):
        reducer = Blocks()
        assert capture.run(tiny.model, [batch], reducer, kernel=kernel).notes == notes
        assert sorted(set(reducer.layers)) == [0, 1]  # every layer's blocks arrived


@pytest.mark.slow
def test_kept_maps_take_the_block_path_and_the_other_layers_the_kernel(tiny):
    """heads --plot keeps layer 1's maps: that layer goes through the block path, layer 0 through the kernel, and
    every score equals the block path's."""
    fused_model = dataclasses.replace(tiny, kernel="fused")
    got = api.heads(fused_model, TEXTS[1:3], plot=("1.2",), probe=False)
    expected = api.heads(tiny, TEXTS[1:3], plot=("1.2",), probe=False)
    assert got.notes == [kernels.INTERPRETER_NOTE, kernels.BLOCKS_WANTED]  # layer 0 came first
    assert torch.allclose(got.attention[1].maps, expected.attention[1].maps, atol=1e-5)  # layer 0 fed it
    for a, b in zip(got.heads, expected.heads, strict=True):
        for score in got.measured:
            assert a.scores[score] == pytest.approx(b.scores[score], abs=1e-5), (a.label, score)


def test_a_mask_the_kernel_cannot_derive_falls_back_to_blocks_with_a_note(tiny_bert):
    """A hole in the middle of a window's real tokens is no rule of lengths, causality and a window: each layer
    goes through the block path, which applies the model's mask as it is, and says so."""
    batch = _one_batch(tiny_bert, TEXTS[1:3])
    batch.attention_mask[0, 3] = 0
    kernel_means, _, notes = _through(tiny_bert, batch, "fused")
    block_means, _, block_notes = _through(tiny_bert, batch, "blocks")
    reason = "an attention mask the fused kernel cannot derive from lengths, causality and a window"
    assert notes == [f"layers 0, 1: {reason}; computed by the block path"] and block_notes == []
    for score, value in block_means.items():
        assert torch.equal(kernel_means[score], value), score


def test_the_kernel_is_decided_per_device_once_in_a_process(monkeypatch, request):
    kernels.decide.cache_clear()  # decide anew, as a fresh process would
    request.addfinalizer(kernels.decide.cache_clear)  # and keep no decision made under the stubs below
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert kernels.decide("auto", cpu) == "blocks"  # the CPU's fast path
    assert kernels.decide("blocks", cuda) == "blocks"
    assert kernels.decide("fused", cpu) == "fused"  # under the interpreter
    with pytest.raises(AttnscopeError, match="kernel 'flash': use one of auto, fused, blocks"):
        kernels.decide("flash", cpu)
    with pytest.raises(AttnscopeError, match="not on mps"):
        kernels.decide("fused", torch.device("mps"))
    # Triton missing: fused is an error naming the extra to install, auto quietly the block path
    import attnscope.pipeline

    monkeypatch.delattr(attnscope.pipeline, "fused")
    monkeypatch.delitem(sys.modules, "attnscope.pipeline.fused")
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now fails
    assert kernels.decide("fused", cpu) == "fused"  # decided once: the process's first answer stands
    kernels.decide.cache_clear()  # a process without Triton
    assert kernels.decide("auto", cuda) == "blocks"
    with pytest.raises(
        AttnscopeError, match=r"kernel fused: Triton cannot be imported .*pip install 'attnscope\[gpu\]'"
    ):
        kernels.decide("fused", cpu)


def test_the_block_path_sizes_its_blocks_from_the_gpus_free_memory(monkeypatch):
    """On the CPU the measured constant; on a GPU an eighth of the free memory (torch's cache included) for the
    batch, within [BLOCK_BYTES per window, GPU_BLOCK_MAX]."""
    cuda = torch.device("cuda")
    assert block_path.block_bytes(torch.device("cpu"), 8) == block_path.BLOCK_BYTES
    memory = {"free": 64 * 2**30, "reserved": 2 * 2**30, "allocated": 2**30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (memory["free"], 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: memory["reserved"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: memory["allocated"])
    assert block_path.block_bytes(cuda, 8) == block_path.GPU_BLOCK_MAX // 8  # 65 GiB / 8 is over the cap
    memory["free"] = 7 * 2**30
    assert block_path.block_bytes(cuda, 4) == 2**30 // 4  # (7 + 1) GiB / 8, over 4 windows
    memory["free"], memory["reserved"] = 0, memory["allocated"]
    assert block_path.block_bytes(cuda, 64) == block_path.BLOCK_BYTES  # never below the CPU's block
