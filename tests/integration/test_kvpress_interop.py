"""kvpress (NVIDIA/kvpress) reads attnscope's plan as it reads DuoAttention's published ones: a `DuoAttentionPress`
whose `load_attention_pattern` opens the plan folder (as kvpress's own tests load patterns of their own), set up on a
tiny Llama-style model with grouped-query heads, streams exactly the plan's KV heads with its sink and recent window.

Skipped without kvpress. kvpress 0.5.5 pins transformers < 5.3 and pulls datasets and peft; it imports with this
project's transformers when installed with `pip install --no-deps kvpress cachetools datasets fire` (what this was
run with), but its generation hooks fail there (they read a `past_key_values` keyword that transformers 5.24 no
longer passes), so generation is not tested here: docs/kvplan.md says so."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attnscope
from tests.support import FAMILY_TEXTS

kvpress = pytest.importorskip(
    "kvpress", reason="needs kvpress (pip install --no-deps kvpress cachetools datasets fire)"
)


def test_kvpress_streams_exactly_the_plans_kv_heads(family_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = family_dir("llama")
    result = attnscope.kvplan(str(folder), list(FAMILY_TEXTS), sink=2, recent=4, streaming=0.5)
    result.save(tmp_path / "plan")
    plan = tmp_path / "plan"

    class PlannedPress(kvpress.DuoAttentionPress):
        @staticmethod
        def load_attention_pattern(model):
            config = json.loads((plan / "config.json").read_text())
            pattern = np.loadtxt(plan / "full_attention_heads.tsv", dtype=float, delimiter="\t", ndmin=2)
            return config["sink_size"], config["recent_size"], np.clip(pattern, 0, 1)

    sparsity = json.loads((plan / "config.json").read_text())["sparsity"]
    press = PlannedPress(head_compression_ratio=sparsity)
    press.post_init_from_model(AutoModelForCausalLM.from_pretrained(folder))
    assert (press.sink_size, press.recent_size) == (2, 4)
    assert press.streaming_mask.cpu().numpy().tolist() == (~result.full).tolist()
    assert 0 < int(press.streaming_mask.sum()) < result.full.size
