"""Real GPT-2 small, where its weights are already on disk: the tool must recover heads the literature names.

Known heads (Wang et al. 2022, "Interpretability in the Wild"; Olsson et al. 2022): previous-token 4.11 and 2.2,
induction 5.5 and 6.9, duplicate-token 3.0. Never downloads: set ATTNSCOPE_GPT2_DIR to a directory saved with
save_pretrained, or have `gpt2` in the Hugging Face cache (HF_HOME); otherwise the test is skipped, saying why.
"""

import os
from pathlib import Path

import pytest

from tests.conftest import REAL_HF_HOME


def real_gpt2_dir() -> Path | None:
    explicit = os.environ.get("ATTNSCOPE_GPT2_DIR")
    if explicit:
        return Path(explicit)
    from huggingface_hub import try_to_load_from_cache

    home = Path(REAL_HF_HOME) if REAL_HF_HOME else Path.home() / ".cache" / "huggingface"
    for repo in ("gpt2", "openai-community/gpt2"):
        names = ("config.json", "model.safetensors", "tokenizer.json", "vocab.json")
        cached = {name: isinstance(try_to_load_from_cache(repo, name, cache_dir=home / "hub"), str) for name in names}
        if cached["config.json"] and cached["model.safetensors"] and (cached["tokenizer.json"] or cached["vocab.json"]):
            return Path(try_to_load_from_cache(repo, "config.json", cache_dir=home / "hub")).parent
    return None


GPT2_DIR = real_gpt2_dir()


@pytest.mark.skipif(GPT2_DIR is None, reason="real GPT-2 weights are not on disk (set ATTNSCOPE_GPT2_DIR or cache gpt2)")
def test_known_gpt2_small_heads_are_recovered():
    from attnscope.analysis import analyze_heads
    from attnscope.inputs import sample_texts
    from attnscope.model import load_model

    result = analyze_heads(load_model(str(GPT2_DIR)), sample_texts())
    by_label = {record.label: record for record in result.heads}

    def top(score, k):
        return [r.label for r in sorted(result.heads, key=lambda r: -r.scores[score])[:k]]

    assert {"4.11", "2.2"} <= set(top("previous_token", 5))
    assert by_label["4.11"].role.role == "previous-token"
    assert {"5.5", "6.9"} <= set(top("induction", 8))
    assert by_label["5.5"].role.role == "induction" and by_label["6.9"].role.role == "induction"
    assert "3.0" in top("duplicate_token", 5)
