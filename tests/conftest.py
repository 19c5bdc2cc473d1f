"""Shared fixtures: tiny random-weight GPT-2 and BERT models saved to disk and loaded by path, like real ones.

The tokenizer is the real GPT-2 BPE vocabulary, copied into tests/data/gpt2-tokenizer (MIT, see its LICENSE).
Weights use a large initializer range so that heads differ clearly from each other and from uniform attention:
with GPT-2's default 0.02 every head of a tiny model is nearly uniform, and a test that swapped heads would pass.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
REAL_HF_HOME = os.environ.get("HF_HOME")  # before HF_HOME is pointed at an empty folder, below
# No test may touch the network: the Hub is off and the cache is an empty folder. Set here, when pytest loads this
# file and before any test module imports transformers: huggingface_hub reads both variables once, on import.
OFFLINE_HF_HOME = tempfile.mkdtemp(prefix="attnscope-tests-hf-home-")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = OFFLINE_HF_HOME
TOKENIZER_DIR = DATA / "gpt2-tokenizer"


def build_tiny_gpt2(folder: Path, seed: int = 0, **config) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    torch.manual_seed(seed)
    settings = dict(n_layer=2, n_head=4, n_embd=32, n_positions=128, initializer_range=0.3)
    settings.update(config)
    GPT2LMHeadModel(GPT2Config(**settings)).save_pretrained(folder)
    GPT2TokenizerFast.from_pretrained(TOKENIZER_DIR).save_pretrained(folder)
    return folder


BERT_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Whole words for the test sentences and the bundled samples, then single characters and ##-continuations so that
# any lowercase ASCII text tokenizes without [UNK].
BERT_WORDS = (
    "the a an and or but of to in on at by for with from as is was are were be been it its this that these those "
    "he she they we you i him her them his their our my your who what which when where why how not no yes "
    "cat sat mat because tired doctor said would help patient hello world again short one two three colourless "
    "green ideas sleep furiously quick brown fox jumps over lazy dog there here then than so if do did does done "
    "has have had will can could should may might must go went come came see saw look looked make made take took "
    "house river tree water fire light dark day night time year man woman child children people city road "
    "def return print import class self none true false code function value list"
).split()


def build_tiny_bert(folder: Path, seed: int = 0, **config) -> Path:
    """A 2-layer, 4-head random-weight BertForMaskedLM with a small WordPiece vocabulary, saved with
    save_pretrained (large initializer range, as for GPT-2, so that heads differ)."""
    import string

    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    pieces = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = list(dict.fromkeys([*BERT_SPECIAL, *BERT_WORDS, *pieces, *(f"##{c}" for c in string.ascii_lowercase + string.digits)]))
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    torch.manual_seed(seed)
    settings = dict(
        num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64,
        max_position_embeddings=64, vocab_size=len(vocab), initializer_range=0.3,
    )
    settings.update(config)
    BertForMaskedLM(BertConfig(**settings)).save_pretrained(folder)
    # transformers v5 takes the vocabulary file as `vocab` (v4 called it `vocab_file`)
    BertTokenizerFast(vocab=str(vocab_file), do_lower_case=True).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def offline():
    """The empty cache stays empty (a test that downloaded would fill it), and goes at the end."""
    yield
    leftovers = [path for path in Path(OFFLINE_HF_HOME).rglob("*") if path.is_file()]
    shutil.rmtree(OFFLINE_HF_HOME, ignore_errors=True)
    assert not leftovers, f"tests wrote into the offline Hugging Face cache: {leftovers[:5]}"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))


@pytest.fixture(scope="session")
def short_context_model_dir(tmp_path_factory) -> Path:
    """Context of 16 tokens, so that ordinary sentences must be split into windows."""
    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2-ctx16"), seed=1, n_positions=16)


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    from attnscope.model import load_model

    return load_model(str(tiny_model_dir), "cpu")


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_bert(tiny_bert_dir):
    from attnscope.model import load_model

    return load_model(str(tiny_bert_dir), "cpu")


@pytest.fixture
def cli(capsys):
    """Run the real CLI in-process: returns (exit status, stdout, stderr)."""
    from attnscope.cli import run

    def invoke(*args: str):
        code = run([str(arg) for arg in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke
