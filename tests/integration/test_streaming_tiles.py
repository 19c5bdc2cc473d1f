"""Streaming heads tile by tile (pipeline.streaming) against the mask-narrowing hook it replaced (tests.support.
StreamingHeads, with the family's eager attention: an (n × n) mask per head, the definition written out): the same
logits on tiny random models of several families (grouped-query attention, sliding windows, Gemma 2's soft cap,
gpt-oss's sinks), with and without a padding mask, at lengths of many tiles; full attention unchanged; and no tensor
of n × n elements made by the streaming attention at any point (every operation's outputs seen by a dispatch mode)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnscope.models.loading import load_model
from attnscope.pipeline import streaming
from attnscope.pipeline.interventions import attention, hooks
from tests.support import StreamingHeads, build_family_model

pytestmark = pytest.mark.slow  # a model per family, four forwards each way

SINK, RECENT, N = 3, 9, 90  # 6 blocks of BLOCK_ROWS rows
BLOCK_ROWS = 16
FAMILIES = ["llama", "mistral", "qwen2", "gemma2", "gemma3_text", "gpt_oss", "gpt_neox"]


@pytest.fixture(scope="module", params=FAMILIES)
def loaded(request, tmp_path_factory):
    settings = {"max_position_embeddings": 256}
    if request.param in ("mistral", "qwen2", "gemma2", "gemma3_text", "gpt_oss"):
        settings["sliding_window"] = 30  # longer than SINK + RECENT: the band and the window both cut
    folder = build_family_model(request.param, tmp_path_factory.mktemp(request.param), **settings)
    return load_model(str(folder), "cpu", lm_head=True)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(streaming, "BLOCK", BLOCK_ROWS)


def _masks(n: int) -> dict[str, torch.Tensor | None]:
    ones = torch.ones(2, n, dtype=torch.long)
    right, left = ones.clone(), ones.clone()
    right[1, -7:] = 0
    left[1, :7] = 0
    return {"none": None, "ones": ones, "right padding": right, "left padding": left}


def _reference(loaded, ids, mask, plan):
    kept = [StreamingHeads(plan, SINK, RECENT)] if plan else []
    inputs = {} if mask is None else {"attention_mask": mask}
    with torch.inference_mode(), attention(loaded, "eager"), hooks(loaded, *kept):
        return loaded.lm_model(input_ids=ids, **inputs).logits  # (B, n, V)


def _tiled(loaded, ids, mask, plan):
    inputs = {} if mask is None else {"attention_mask": mask}
    with torch.inference_mode(), streaming.streaming(loaded):
        return streaming.forward(
            loaded.lm_model, streaming.StreamingPlan.of(plan, SINK, RECENT), loaded.n_layer, input_ids=ids, **inputs
        ).logits  # (B, n, V)


def test_tiles_equal_the_mask_hook_with_and_without_padding(loaded):
    ids = torch.randint(3, loaded.tokenizer.vocab_size, (2, N), generator=torch.Generator().manual_seed(0))
    plan = {0: [1, 2], loaded.n_layer - 1: [0, 3]}  # a grouped-query pair and two heads of different groups
    for name, mask in _masks(N).items():
        real = torch.ones(2, N, dtype=torch.bool) if mask is None else mask.bool()  # (B, n) rows compared
        expected, got = _reference(loaded, ids, mask, plan), _tiled(loaded, ids, mask, plan)
        torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=1e-4, msg=name)
        plain, full = _reference(loaded, ids, mask, {}), _tiled(loaded, ids, mask, {})
        torch.testing.assert_close(full[real], plain[real], atol=1e-4, rtol=1e-4, msg=name)
        assert not torch.allclose(got[real], plain[real], atol=1e-2)  # the streaming did something


def test_a_band_that_holds_every_key_is_full_attention(loaded):
    ids = torch.randint(3, loaded.tokenizer.vocab_size, (1, N), generator=torch.Generator().manual_seed(1))
    everyone = {layer: list(range(loaded.n_head)) for layer in range(loaded.n_layer)}
    inputs = {"input_ids": ids}
    with torch.inference_mode(), streaming.streaming(loaded):
        wide = streaming.forward(loaded.lm_model, streaming.StreamingPlan.of(everyone, N, 0), loaded.n_layer, **inputs)
    torch.testing.assert_close(wide.logits, _reference(loaded, ids, None, {}), atol=1e-4, rtol=1e-4)


class _Sizes(TorchDispatchMode):
    """The largest number of elements of any tensor an operation returns inside the block."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        for tensor in output if isinstance(output, (tuple, list)) else [output]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return output


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_no_operation_makes_an_n_by_n_tensor(softcap, monkeypatch):
    """At n = 4,096 keys, 4 query heads over 2 KV heads, every head streaming but one: an (n × n) map of one head
    would be 16.8 M elements; the largest tensor made is a few blocks' worth. With a soft cap the full head goes
    through the blocks too (BLOCK × n logits)."""
    monkeypatch.setattr(streaming, "BLOCK", 256)
    n, d = 4096, 8
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(1, 4, n, d, generator=generator)  # (B, H, n, d)
    key, value = torch.randn(1, 2, n, d, generator=generator), torch.randn(1, 2, n, d, generator=generator)
    module = SimpleNamespace(layer_idx=0, is_causal=True, num_key_value_groups=2, training=False)
    plan = streaming.StreamingPlan.of({0: [0, 1, 2]}, 128, 256)
    sizes = _Sizes()
    with torch.inference_mode(), sizes:
        output, _ = streaming.streaming_attention(
            module, query, key, value, None, scaling=d**-0.5, softcap=softcap, attnscope_streaming=plan
        )
    assert output.shape == (1, n, 4, d)
    assert sizes.largest < n * n // 8, sizes.largest  # (1, 3, 256, 639) logits of a block: 490,752
    # the last row of head 0 sees keys 0-127 and 3840-4095: its output from those alone
    keys = torch.cat([torch.arange(128), torch.arange(n - 256, n)])
    logits = query[0, 0, -1] @ key[0, 0, keys].T * d**-0.5  # (384,)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    torch.testing.assert_close(output[0, -1, 0], logits.softmax(-1) @ value[0, 0, keys], atol=1e-5, rtol=1e-5)
