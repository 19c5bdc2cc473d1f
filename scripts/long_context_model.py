"""A long-context model to time attnscope on, with no download: a Llama-architecture model of SmolLM2-135M's widths
(d_model 576, 9 query heads over 3 key/value heads, d_head 64, MLP 1,536) with a context of --context tokens (8,192
by default) cut to --layers layers (8), with random weights (seed 0) and the GPT-2 tokenizer of tests/data, saved
with save_pretrained into FOLDER.

    python scripts/long_context_model.py /tmp/llama8k
    attnscope bench -m /tmp/llama8k --device cpu --seq-lens 2048,4096,8192 --batch-sizes 1 --repeats 2 \
        --methods floor,attnscope
    python scripts/long_context_model.py /tmp/llama32k --context 32768 --layers 2
    python scripts/long_context_model.py /tmp/llama16k --context 16384 --layers 2   # kvplan --check at 4k-16k
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import GPT2TokenizerFast, LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]


def main(folder: str, layers: int = 8, context: int = 8192) -> None:
    """The model of SmolLM2-135M's widths with `layers` layers and a context of `context` tokens, saved in `folder`
    (scripts/discover_cost.py takes 30 layers, SmolLM2-135M's own number)."""
    config = LlamaConfig(
        vocab_size=50257, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=context, bos_token_id=50256, eos_token_id=50256,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    GPT2TokenizerFast.from_pretrained(ROOT / "tests" / "data" / "gpt2-tokenizer").save_pretrained(folder)
    print(f"saved to {folder}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--context", type=int, default=8192, help="max_position_embeddings (default 8192)")
    parser.add_argument("--layers", type=int, default=8, help="num_hidden_layers (default 8)")
    arguments = parser.parse_args()
    main(arguments.folder, arguments.layers, arguments.context)
