"""Real GPT-2 small, where its weights are already on disk: the tool must recover heads the literature names.

Known heads (Wang et al. 2022, "Interpretability in the Wild"; Olsson et al. 2022): previous-token 4.11 and 2.2,
induction 5.5 and 6.9, duplicate-token 3.0. Never downloads: set ATTNSCOPE_GPT2_DIR to a directory saved with
save_pretrained, or have `gpt2` in the Hugging Face cache (HF_HOME); otherwise the test is skipped, saying why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def real_gpt2_dir() -> Path | None:
    explicit = os.environ.get("ATTNSCOPE_GPT2_DIR")
    if explicit:
        return Path(explicit)
    from huggingface_hub import try_to_load_from_cache

    real_home = os.environ.get("ATTNSCOPE_REAL_HF_HOME")
    home = Path(real_home) if real_home else Path.home() / ".cache" / "huggingface"
    for repo in ("gpt2", "openai-community/gpt2"):
        names = ("config.json", "model.safetensors", "tokenizer.json", "vocab.json")
        cached = {name: isinstance(try_to_load_from_cache(repo, name, cache_dir=home / "hub"), str) for name in names}
        if cached["config.json"] and cached["model.safetensors"] and (cached["tokenizer.json"] or cached["vocab.json"]):
            return Path(try_to_load_from_cache(repo, "config.json", cache_dir=home / "hub")).parent
    return None


GPT2_DIR = real_gpt2_dir()


@pytest.mark.slow
@pytest.mark.skipif(GPT2_DIR is None, reason="no real GPT-2 weights on disk (set ATTNSCOPE_GPT2_DIR or cache gpt2)")
def test_known_gpt2_small_heads_are_recovered(cli):
    code, out, err = cli("heads", "--model", GPT2_DIR, "--json")  # the bundled sample texts, the default probe
    assert code == 0, err
    heads = json.loads(out)["heads"]
    by_label = {record["label"]: record for record in heads}

    def top(score, k):
        return [r["label"] for r in sorted(heads, key=lambda r: -r[score])[:k]]

    assert {"4.11", "2.2"} <= set(top("previous_token", 5))
    assert by_label["4.11"]["role"] == "previous-token"
    assert {"5.5", "6.9"} <= set(top("induction", 8))
    assert by_label["5.5"]["role"] == "induction" and by_label["6.9"]["role"] == "induction"
    assert "3.0" in top("duplicate_token", 5)
