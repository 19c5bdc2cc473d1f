"""The fused kernel compiled by Triton for a GPU: against the from-scratch float64 attention and against the block path
on the same GPU. Skipped without one (tests/integration/test_fused.py runs the same kernel under Triton's interpreter
there)."""

from __future__ import annotations

import pytest
import torch

from attnscope.models.loading import load_model
from attnscope.pipeline import capture
from attnscope.pipeline.reducers import HeadStatistics
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from tests.support import FAMILY_TEXTS, TEXTS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _means(loaded, batch, kernel):
    statistics = HeadStatistics(loaded.kind, loaded.n_layer, loaded.n_head, loaded.device)
    notes = capture.run(loaded.model, [batch], statistics, kernel=kernel).notes
    return statistics.means(), notes


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_compiled_kernel_equals_the_block_path(model_dir, dtype):
    loaded = load_model(str(model_dir), "cuda", dtype)
    windows = tokenize(loaded, TEXTS).windows
    batch = next(batches(windows, len(windows), loaded.device, pad_id(loaded.tokenizer)))
    fused, notes = _means(loaded, batch, "fused")
    blocks, _ = _means(loaded, batch, "blocks")
    assert notes == []  # compiled, and no layer fell back
    tolerance = 1e-5 if dtype == "float32" else 2e-2  # the block path rounds bfloat16 logits (docs/gpu.md)
    for score, value in blocks.items():
        assert torch.allclose(fused[score], value, atol=tolerance), score


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss", "modernbert"])
def test_windows_softcaps_and_sinks_compile(family_dir, family):
    loaded = load_model(str(family_dir(family)), "cuda")
    windows = tokenize(loaded, FAMILY_TEXTS).windows
    batch = next(batches(windows, len(windows), loaded.device, pad_id(loaded.tokenizer)))
    fused, notes = _means(loaded, batch, "fused")
    blocks, _ = _means(loaded, batch, "blocks")
    assert notes == []
    for score, value in blocks.items():
        assert torch.allclose(fused[score], value, atol=1e-5), score
