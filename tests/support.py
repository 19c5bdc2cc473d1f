"""What the tests share: tiny model builders, the texts, hand-built attention maps with known scores, independent
references (from-scratch attention from a model's own weights, per family), and small checks. Test modules import
from here, never from each other."""

from __future__ import annotations

import contextlib
import inspect
import string
import struct
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from attnscope.pipeline.inputs import Text

DATA = Path(__file__).parent / "data"
TOKENIZER_DIR = DATA / "gpt2-tokenizer"  # the real GPT-2 BPE vocabulary (MIT, see its LICENSE)

CAT = "The cat sat on the mat because it was tired."
DOCTOR = "The doctor said that she would help the patient."
TEXTS = [
    Text(CAT, "a"),
    Text(DOCTOR, "b"),
    Text("Hello world", "c"),
    Text("Colourless green ideas sleep furiously, and the quick brown fox jumps over the lazy dog.", "d"),
]

# --------------------------------------------------------------------------------------------- tiny models
# Weights use a large initializer range so that heads differ clearly from each other and from uniform attention:
# with the default 0.02 every head of a tiny model is nearly uniform, and a test that swapped heads would pass.


def build_tiny_gpt2(folder: Path, seed: int = 0, **config) -> Path:
    """A 2-layer, 4-head random-weight GPT2LMHeadModel with the real GPT-2 tokenizer, saved with save_pretrained."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    torch.manual_seed(seed)
    settings = dict(n_layer=2, n_head=4, n_embd=32, n_positions=128, initializer_range=0.3)
    settings.update(config)
    GPT2LMHeadModel(GPT2Config(**settings)).save_pretrained(folder)
    GPT2TokenizerFast.from_pretrained(TOKENIZER_DIR).save_pretrained(folder)
    return folder


def with_nan(folder: Path, weight: str, index: tuple[int, ...]) -> Path:
    """The GPT-2 saved in `folder`, saved again with a NaN at `index` of its parameter `weight` (a damaged
    checkpoint)."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder)
    with torch.no_grad():
        model.get_parameter(weight)[index] = float("nan")
    model.save_pretrained(folder)
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


def wordpiece_tokenizer(folder: Path) -> int:
    """BERT's WordPiece over the test vocabulary (see build_tiny_bert), [CLS] … [SEP] around a text."""
    from transformers import BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    pieces = list(string.ascii_lowercase + string.digits + string.punctuation)
    continuations = [f"##{c}" for c in string.ascii_lowercase + string.digits]
    vocab = list(dict.fromkeys([*BERT_SPECIAL, *BERT_WORDS, *pieces, *continuations]))
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab=str(vocab_file), do_lower_case=True)
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def build_tiny_bert(folder: Path, seed: int = 0, **config) -> Path:
    """A 2-layer, 4-head random-weight BertForMaskedLM with a small WordPiece vocabulary, saved with
    save_pretrained."""
    from transformers import BertConfig, BertForMaskedLM

    vocab_size = wordpiece_tokenizer(folder)
    torch.manual_seed(seed)
    settings = dict(
        num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64,
        max_position_embeddings=64, vocab_size=vocab_size, initializer_range=0.3,
    )  # fmt: skip
    settings.update(config)
    BertForMaskedLM(BertConfig(**settings)).save_pretrained(folder)
    return folder


BUILDERS = {"decoder": build_tiny_gpt2, "encoder": build_tiny_bert}  # one tiny model per kind of attention

# ----------------------------------------------------------------------------- independent references


def attention_inputs(loaded, batch) -> dict[int, torch.Tensor]:
    """layer -> the hidden states that enter each layer's attention module, recorded with forward pre-hooks."""
    recorded = {}

    def record(layer):
        def hook(module, args, kwargs):
            recorded[layer] = args[0] if args else kwargs["hidden_states"]

        return hook

    modules = loaded.family.attention_modules(loaded.model)
    hooks = [module.register_forward_pre_hook(record(layer), with_kwargs=True) for layer, module in enumerate(modules)]
    try:
        with torch.no_grad():
            loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    finally:
        for hook in hooks:
            hook.remove()
    return recorded


def _gpt2_reference(loaded, layer, x, lengths):
    from attnscope.scores.reference import multi_head_attention

    c_attn = loaded.family.attention_modules(loaded.model)[layer].c_attn
    return multi_head_attention(x, c_attn.weight, c_attn.bias, loaded.n_head, lengths=lengths)[1]


def _bert_reference(loaded, layer, x, lengths):
    from attnscope.scores.reference import bidirectional_attention

    attention = loaded.family.attention_modules(loaded.model)[layer]
    weights = [(linear.weight, linear.bias) for linear in (attention.query, attention.key, attention.value)]
    return bidirectional_attention(x, *weights, loaded.n_head, lengths=lengths)[1]


# family name -> from-scratch attention weights (B, H, n, n) of one layer from its own weights
REFERENCES = {"GPT-2": _gpt2_reference, "BERT": _bert_reference}


def reference_maps(loaded, batch) -> dict[int, torch.Tensor]:
    """layer -> (B, H, n, n): the from-scratch attention of every layer (padded rows may be NaN: never scored)."""
    compute = REFERENCES[loaded.family.name]
    with torch.no_grad():
        return {layer: compute(loaded, layer, x, batch.lengths) for layer, x in attention_inputs(loaded, batch).items()}


def real_entries(batch, causal: bool) -> torch.Tensor:
    """(B, 1, n, n) bool: query and key both real tokens (and, when causal, the key not after the query)."""
    n = batch.input_ids.shape[1]
    real = torch.arange(n, device=batch.lengths.device)[None, :] < batch.lengths[:, None]  # (B, n)
    entries = real[:, :, None] & real[:, None, :]
    if causal:
        entries = entries & torch.tril(torch.ones(n, n, dtype=torch.bool, device=entries.device))
    return entries[:, None]


@contextlib.contextmanager
def capture_blocks_of(block_bytes: int | None):
    """The capture's blocks sized to `block_bytes` of logits per window (None: as it is) inside the `with`, with no
    minimum of rows (block_path.MIN_BLOCK_ROWS would make the short windows of the tests one block)."""
    from attnscope.pipeline import block_path

    original = block_path.BLOCK_BYTES, block_path.MIN_BLOCK_ROWS
    if block_bytes is not None:
        block_path.BLOCK_BYTES, block_path.MIN_BLOCK_ROWS = block_bytes, 0
    try:
        yield
    finally:
        block_path.BLOCK_BYTES, block_path.MIN_BLOCK_ROWS = original


@contextlib.contextmanager
def tiles_everywhere(key_tile: int = 3, row_tile: int = 2):
    """The block path takes every block in tiles (pipeline.tiles) inside the `with`, whatever the length, in tiles
    of `key_tile` keys and blocks of `row_tile` rows, so that short test windows cross many tiles; yields the list
    of blocks computed in tiles ((start, stop, the thread's name) each), to show that tiles ran, and where."""
    from attnscope.pipeline import tiles

    names = ("TILED_FROM", "KEY_TILE", "ROW_TILE", "MIN_ROW_TILE", "block_in_tiles")
    original = {name: getattr(tiles, name) for name in names}
    seen = []

    def counted(*args):
        seen.append((args[6], args[7], threading.current_thread().name))
        return original["block_in_tiles"](*args)

    for name, value in zip(names, (0, key_tile, row_tile, 1, counted), strict=True):
        setattr(tiles, name, value)
    try:
        yield seen
    finally:
        for name, value in original.items():
            setattr(tiles, name, value)


@contextlib.contextmanager
def sdpa_summed_everywhere(rows: int = 4):
    """kvplan's layers take SDPA's kernel and its log-sum-exp (pipeline.sdpa_summed) inside the `with`, whatever the
    length, with blocks of `rows` rows for the kept keys' logits; yields the list of layers that took it."""
    from attnscope.pipeline import sdpa_summed

    original = sdpa_summed.SDPA_FROM, sdpa_summed.ROWS, sdpa_summed.attention
    seen = []

    def counted(state, call, *args):
        seen.append(call.layer)
        return original[2](state, call, *args)

    sdpa_summed.SDPA_FROM, sdpa_summed.ROWS, sdpa_summed.attention = 0, rows, counted
    try:
        yield seen
    finally:
        sdpa_summed.SDPA_FROM, sdpa_summed.ROWS, sdpa_summed.attention = original


@contextlib.contextmanager
def seeded_on_one_thread(seed: int):
    """Inside the `with`: torch on one thread (a training run is then the same wherever it runs) and seeded with
    `seed`; yields a numpy generator seeded alike."""
    import numpy as np

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        yield np.random.default_rng(seed)
    finally:
        torch.set_num_threads(threads)


def scored_range(kind: str, length: int) -> range:
    """The scored query rows of a window of `length` tokens: after BOS (decoder, row 0 sees only itself), between
    [CLS] and [SEP] (encoder)."""
    return range(1, length) if kind == "decoder" else range(1, length - 1)


def slow_diversity(loaded, texts, layers):
    """Cosine over the concatenated scored rows, mean row JSD (bits) and mean JS distance, with numpy and scipy,
    from the from-scratch maps of each window run alone (no padding), for every head of `layers`: (cosine, js,
    js_distance) (K, K) numpy, and the number of scored rows."""
    import numpy as np
    from scipy.spatial.distance import jensenshannon

    from attnscope.pipeline.tokens import batches, pad_id, tokenize

    windows = tokenize(loaded, texts).windows
    heads = [(layer, h) for layer in layers for h in range(loaded.n_head)]
    rows = {head: [] for head in heads}
    for window in windows:
        batch = next(batches([window], 1, loaded.device, pad_id(loaded.tokenizer)))
        maps = reference_maps(loaded, batch)  # layer -> (1, H, n, n)
        scored = list(scored_range(loaded.kind.name, len(window.ids)))
        for layer, h in heads:
            rows[layer, h].extend(maps[layer][0, h, scored].double().numpy())
    K = len(heads)
    cosine, js, js_distance = np.zeros((K, K)), np.zeros((K, K)), np.zeros((K, K))
    for a in range(K):
        for b in range(K):
            x, y = np.concatenate(rows[heads[a]]), np.concatenate(rows[heads[b]])
            cosine[a, b] = x @ y / np.sqrt((x @ x) * (y @ y))
            distances = [jensenshannon(p, q, base=2) for p, q in zip(rows[heads[a]], rows[heads[b]], strict=True)]
            js[a, b], js_distance[a, b] = np.mean(np.square(distances)), np.mean(distances)
    return cosine, js, js_distance, sum(len(scored_range(loaded.kind.name, len(w.ids))) for w in windows)


def captured_maps(loaded, batch, block_bytes: int | None = None) -> dict[int, torch.Tensor]:
    """layer -> (B, H, n, n) as the capture hands them to its reducer, block by block (a causal block stops at its
    last query's key: the keys after it are filled with 0). With block_bytes=1 each block must be one query row."""
    from attnscope.pipeline import capture
    from attnscope.pipeline.blocks import Reducer

    blocks: dict[int, list[torch.Tensor]] = {}

    class Collect(Reducer):
        wants_blocks = True
        count = 0

        def add_block(self, layer, block):
            self.count += 1
            padded = torch.nn.functional.pad(block.probs, (0, block.n_keys - block.probs.shape[-1]))
            blocks.setdefault(layer, []).append(padded)

    reducer = Collect()
    with capture_blocks_of(block_bytes):
        capture.run(loaded.model, [batch], reducer)
    if block_bytes == 1:  # one row per block: the blocking itself is under test
        assert reducer.count == batch.input_ids.shape[1] * len(blocks)
    return {layer: torch.cat(parts, dim=2) for layer, parts in blocks.items()}


# --------------------------------------------------------------------------------- hand-built attention maps


def causal_rows(rows: list[list[float]]) -> torch.Tensor:
    """(1, 1, n, n) from lower-triangular rows given as lists (row i has i+1 entries)."""
    n = len(rows)
    attn = torch.zeros(1, 1, n, n, dtype=torch.float32)
    for i, row in enumerate(rows):
        attn[0, 0, i, : i + 1] = torch.tensor(row)
    return attn


def previous_token_map(n):
    return causal_rows([[1.0]] + [[1.0 if j == i - 1 else 0.0 for j in range(i + 1)] for i in range(1, n)])


def first_token_map(n):
    return causal_rows([[1.0 if j == 0 else 0.0 for j in range(i + 1)] for i in range(n)])


def identity_map(n):
    return causal_rows([[1.0 if j == i else 0.0 for j in range(i + 1)] for i in range(n)])


def uniform_map(n):
    return causal_rows([[1.0 / (i + 1)] * (i + 1) for i in range(n)])


def band_map(n, window):
    """Uniform over the local window {max(1, i-w) .. i} of every row i >= 1."""
    rows = [[1.0]]
    for i in range(1, n):
        low = max(1, i - window)
        rows.append([1.0 / (i - low + 1) if low <= j <= i else 0.0 for j in range(i + 1)])
    return causal_rows(rows)


# ------------------------------------------------------------------------------------------------- checks


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header, and proof that the picture decodes and is not blank."""
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert pixels.std() > 0.01, f"{path} is blank"
    return width, height


# ------------------------------------------------------------------------------------------- model families
# One tiny random-weight model per family, with the features that make the family different switched on (fewer
# key/value heads, a sliding window shorter than the test texts, soft-capping, QK-norm, partial rotary, sinks) and
# a tokenizer of the family's style (byte-level `Ġ` or SentencePiece-style `▁`; with a BOS the tokenizer adds
# itself, or none at all), saved with save_pretrained and loaded by path like a real model.

WINDOW = 4  # sliding windows of the family tests: shorter than every test text
FAMILY_TEXTS = [
    Text(CAT, "a"),
    Text("Hello world, again and again.", "b"),
    Text("Colourless green ideas sleep furiously, and the quick brown fox jumps over the lazy dog.", "c"),
]


def _corpus() -> list[str]:
    words = " ".join(BERT_WORDS)
    return [text.text for text in [*TEXTS, *FAMILY_TEXTS]] + [words, words.upper(), string.ascii_letters]


def _save_fast_tokenizer(folder: Path, tokenizer, **special) -> int:
    """Save a `tokenizers` tokenizer as transformers' fast tokenizer; returns its vocabulary size."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special)
    fast.save_pretrained(folder)
    return len(fast)


def sentencepiece_tokenizer(folder: Path) -> int:
    """A Llama-style tokenizer: words start with `▁`, BOS `<s>` added by the tokenizer itself (so attnscope must not
    add a second), BPE of ~500 pieces learned from the test texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    alphabet = list(string.ascii_letters + string.digits + string.punctuation)
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=special, initial_alphabet=alphabet, show_progress=False
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return _save_fast_tokenizer(
        folder, tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


def byte_level_tokenizer(folder: Path, bos: bool = True) -> int:
    """GPT-2's byte-level BPE (`Ġ`); with `bos` off, a tokenizer without a BOS token (as Qwen's)."""
    from transformers import GPT2TokenizerFast

    options = {} if bos else {"bos_token": None}
    tokenizer = GPT2TokenizerFast.from_pretrained(TOKENIZER_DIR, **options)
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def roberta_tokenizer(folder: Path) -> int:
    """A RoBERTa-style encoder tokenizer: byte-level BPE learned from the test texts, `<s>` … `</s>` around a text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    return _save_fast_tokenizer(
        folder, tokenizer, bos_token="<s>", cls_token="<s>", eos_token="</s>", sep_token="</s>", pad_token="<pad>",
        unk_token="<unk>", mask_token="<mask>",
    )  # fmt: skip


TOKENIZERS = {
    "sentencepiece": sentencepiece_tokenizer,
    "byte-level": byte_level_tokenizer,
    "byte-level, no BOS": lambda folder: byte_level_tokenizer(folder, bos=False),
    "roberta": roberta_tokenizer,
    "wordpiece": wordpiece_tokenizer,
}
SMALL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64
)
GQA = dict(num_key_value_heads=2)
MOE = dict(num_local_experts=2, num_experts_per_tok=1)
PARTIAL_ROTARY = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}

# family -> (config class, tokenizer style, settings beyond SMALL: the family's features switched on)
FAMILY_MODELS = {
    "llama": ("LlamaConfig", "sentencepiece", GQA),
    "mistral": ("MistralConfig", "sentencepiece", {**GQA, "sliding_window": WINDOW}),
    "qwen2": (
        "Qwen2Config", "byte-level, no BOS",
        {**GQA, "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
    "qwen3": ("Qwen3Config", "byte-level, no BOS", {**GQA, "head_dim": 16}),
    "gemma": ("GemmaConfig", "sentencepiece", {"num_key_value_heads": 1, "head_dim": 16}),
    "gemma2": (
        "Gemma2Config", "sentencepiece",
        {**GQA, "head_dim": 8, "sliding_window": WINDOW, "attn_logit_softcapping": 2.0, "query_pre_attn_scalar": 12},
    ),
    "gemma3_text": (
        "Gemma3TextConfig", "sentencepiece",
        {**GQA, "head_dim": 8, "sliding_window": WINDOW, "query_pre_attn_scalar": 12,
         "layer_types": ["sliding_attention", "full_attention"]},
    ),
    "phi3": ("Phi3Config", "sentencepiece", {**GQA, "pad_token_id": 0, "rope_parameters": PARTIAL_ROTARY}),
    "gpt_neox": ("GPTNeoXConfig", "byte-level", {"rope_parameters": PARTIAL_ROTARY}),
    "opt": ("OPTConfig", "byte-level", {"ffn_dim": 64, "word_embed_proj_dim": 32}),
    "olmo": ("OlmoConfig", "byte-level, no BOS", {"pad_token_id": 0}),
    "olmo2": ("Olmo2Config", "byte-level, no BOS", {"pad_token_id": 0}),
    "starcoder2": ("Starcoder2Config", "byte-level", {**GQA, "sliding_window": WINDOW}),
    "smollm3": ("SmolLM3Config", "byte-level", {**GQA, "pad_token_id": 0, "no_rope_layer_interval": 2}),
    "gpt_oss": (
        "GptOssConfig", "byte-level, no BOS",
        {**GQA, "head_dim": 8, "sliding_window": WINDOW, "num_local_experts": 2, "num_experts_per_tok": 1,
         "layer_types": ["sliding_attention", "full_attention"]},
    ),
    "mixtral": ("MixtralConfig", "sentencepiece", {**GQA, "sliding_window": WINDOW, **MOE}),
    "qwen2_moe": (
        "Qwen2MoeConfig", "byte-level, no BOS",
        {**GQA, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16,
         "shared_expert_intermediate_size": 16},
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig", "byte-level, no BOS",
        {**GQA, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16, "head_dim": 8},
    ),
    "granite": ("GraniteConfig", "byte-level", {**GQA, "attention_multiplier": 0.3}),
    "granitemoe": ("GraniteMoeConfig", "byte-level", {**GQA, **MOE, "attention_multiplier": 0.3}),
    "cohere": ("CohereConfig", "byte-level", GQA),
    "olmoe": ("OlmoeConfig", "byte-level, no BOS", {**GQA, "num_experts": 2, "num_experts_per_tok": 1}),
    "helium": ("HeliumConfig", "sentencepiece", {**GQA, "head_dim": 8}),
    "glm": ("GlmConfig", "byte-level", {**GQA, "head_dim": 8}),
    "exaone4": ("Exaone4Config", "byte-level", {**GQA, "sliding_window": WINDOW}),
    "seed_oss": ("SeedOssConfig", "byte-level", GQA),
    "arcee": ("ArceeConfig", "sentencepiece", GQA),
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", "sentencepiece", {**GQA, "head_dim": 8}),
    "phi": ("PhiConfig", "byte-level", {"rope_parameters": PARTIAL_ROTARY}),
    "bert": ("BertConfig", "wordpiece", {}),
    "roberta": ("RobertaConfig", "roberta", {"pad_token_id": 1}),
    "xlm-roberta": ("XLMRobertaConfig", "roberta", {"pad_token_id": 1}),
    "electra": ("ElectraConfig", "wordpiece", {"embedding_size": 32}),
    "modernbert": (
        "ModernBertConfig", "wordpiece",
        {"num_hidden_layers": 3, "local_attention": WINDOW, "global_attn_every_n_layers": 2, "pad_token_id": 0},
    ),
    "distilbert": ("DistilBertConfig", "wordpiece", {}),
}  # fmt: skip
# names the families use for the same settings
_RENAMED = {
    "GPTNeoXConfig": {},
    "DistilBertConfig": {"hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                         "intermediate_size": "hidden_dim"},
    "OPTConfig": {"intermediate_size": None},
}  # fmt: skip


def family_config(name: str, vocab_size: int):
    """The tiny config of family `name` for a tokenizer of `vocab_size` entries."""
    import transformers

    class_name, _, features = FAMILY_MODELS[name]
    renamed = _RENAMED.get(class_name, {})
    settings = {}
    for key, value in {**SMALL, **features}.items():
        key = renamed.get(key, key)
        if key is not None:
            settings[key] = value
    config = getattr(transformers, class_name)(vocab_size=vocab_size, initializer_range=0.3, **settings)
    for token in ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id", "pad_token_id"):  # the tokenizer's
        value = getattr(config, token, None)
        ids = value if isinstance(value, list) else [value]
        if any(id_ is not None and id_ >= vocab_size for id_ in ids):
            setattr(config, token, None)
    return config


def build_family_model(name: str, folder: Path, seed: int = 0, **settings) -> Path:
    """A tiny random-weight model of family `name` with its language-model head and a tokenizer of its style;
    `settings` change its config (`max_position_embeddings=256`: a longer context)."""
    import transformers

    _, style, _ = FAMILY_MODELS[name]
    vocab_size = TOKENIZERS[style](folder)
    config = family_config(name, vocab_size)
    for key, value in settings.items():
        setattr(config, key, value)
    encoder = style in ("wordpiece", "roberta")
    auto = transformers.AutoModelForMaskedLM if encoder else transformers.AutoModelForCausalLM
    torch.manual_seed(seed)
    model = auto.from_config(config)
    with torch.no_grad():  # heads that differ clearly from each other and from uniform attention
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    return folder


def visible_keys(config, layer: int, lengths: torch.Tensor, n: int, causal: bool) -> torch.Tensor:
    """(B, n, n) bool: the keys each row sees in `layer`, from the family's documented rules (independent of the
    masks transformers builds): real tokens; for a decoder j <= i; in a sliding-window layer a decoder's j > i - W
    (Mistral, Qwen2, Gemma 2/3, StarCoder2, Phi-3, gpt-oss) and ModernBERT's |i - j| <= W / 2."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    allowed = (j < lengths[:, None, None]).expand(len(lengths), n, n).clone()
    if causal:
        allowed &= j <= i
    layer_types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    sliding = window is not None and (layer_types is None or layer_types[layer] == "sliding_attention")
    if config.model_type == "qwen2" and not config.use_sliding_window:
        sliding = False
    if sliding and causal:
        allowed &= j > i - window
    elif sliding:  # ModernBERT: config.sliding_window is half of local_attention
        allowed &= (i - j).abs() <= window
    return allowed


def replaced(args: list, *changes) -> list:
    """`args` with the values of the options in `changes` (flag, value, flag, value, ...) replaced, or the options
    added where `args` lacks them: an option given twice is refused (its last value would win without a word)."""
    args = list(args)
    for flag, value in zip(changes[::2], changes[1::2], strict=True):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return args


def demo_logit_differences(*prompts: str, answer: str = " method", wrong: str = " table") -> list[float]:
    """logit(answer) − logit(wrong) after each prompt with BOS first, by transformers' GPT2LMHeadModel alone on the
    bundled demo model's files (an independent reading of `patch`'s and `discover`'s baselines)."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    import attnscope

    demo = Path(attnscope.__file__).parent / "demo_model"
    model = GPT2LMHeadModel.from_pretrained(demo).eval()
    tokenizer = AutoTokenizer.from_pretrained(demo)
    (answer_id,), (wrong_id,) = tokenizer(answer)["input_ids"], tokenizer(wrong)["input_ids"]
    found = []
    for prompt in prompts:
        ids = torch.tensor([[tokenizer.bos_token_id] + tokenizer(prompt)["input_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]
        found.append(float(logits[answer_id] - logits[wrong_id]))
    return found


# ------------------------------------------------------------------------------------- weights, per family
# `models.weights` against each family's own attention: the norms' parameters randomised first, so that a γ or β
# folded wrongly shows; rotary families run with every position at 0, where the rotation is the identity (or YaRN's
# constant factor).

QK_NORMS = (("q_norm", "k_norm"), ("query_layernorm", "key_layernorm"), ("q_layernorm", "k_layernorm"))


def randomise_norms(model: torch.nn.Module, seed: int = 0) -> None:
    """Every norm's γ to 1 ± 0.5 and β to ±0.3 (random), so that folding them wrongly changes the numbers."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if not type(module).__name__.endswith("Norm"):
                continue
            for name, parameter in module.named_parameters(recurse=False):
                noise = torch.randn(parameter.shape, generator=generator)
                parameter.copy_(1.0 + 0.5 * noise if name == "weight" else 0.3 * noise)


class Recorded:
    """One forward pass with hooks: each layer's attention input, the input of each reading norm, what the family's
    attention function receives and returns, and the output projection's input and output."""

    def __init__(self, loaded, batch, position_ids=None):
        self.calls, self.attention_inputs, self.norm_inputs, self.heads_in, self.heads_out = {}, {}, {}, {}, {}
        family = loaded.family
        handles = []
        for layer, module in enumerate(family.attention_modules(loaded.model)):
            handles.append(module.register_forward_pre_hook(self._keep(self.attention_inputs, layer), with_kwargs=True))
        from attnscope.models.weights import reading_norms

        for layer, norm in enumerate(reading_norms(loaded)):
            if norm is not None:
                handles.append(norm.module.register_forward_pre_hook(self._keep(self.norm_inputs, layer)))
        for layer, module in enumerate(family.output_projections(loaded.model)):
            handles.append(module.register_forward_pre_hook(self._keep(self.heads_in, layer)))
            handles.append(module.register_forward_hook(self._output(layer)))
        modeling = sys.modules[type(family.attention_modules(loaded.model)[0]).__module__]
        original = modeling.eager_attention_forward

        def recording(module, query, key, value, attention_mask, scaling=None, **kwargs):
            output, weights = original(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
            self.calls[module.layer_idx] = dict(query=query, key=key, value=value, scaling=scaling, weights=weights)
            return output, weights

        modeling.eager_attention_forward = recording
        try:
            with torch.no_grad():
                options = {} if position_ids is None else {"position_ids": position_ids}
                loaded.model(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True, **options
                )
        finally:
            modeling.eager_attention_forward = original
            for handle in handles:
                handle.remove()

    @staticmethod
    def _keep(store, layer):
        def hook(module, args, kwargs=None):
            store[layer] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _output(self, layer):
        def hook(module, args, output):
            self.heads_out[layer] = output

        return hook


def _qk_norm(attention, which: int, x: torch.Tensor, heads: int) -> torch.Tensor:
    """The family's QK-norm applied to x (B, heads, n, k): per head (Qwen3, Gemma 3, EXAONE 4, HunYuan) or over all
    heads together before they are split (OLMo 2, OLMoE)."""
    for names in QK_NORMS:
        norm = getattr(attention, names[which], None)
        if norm is None:
            continue
        B, _, n, k = x.shape
        if norm.weight.numel() == k:
            return norm(x)
        joined = x.transpose(1, 2).reshape(B, n, heads * k)
        return norm(joined).view(B, n, heads, k).transpose(1, 2)
    return x


def _rotary_scale(model) -> float | None:
    """None without rotary embeddings; else what the rotation multiplies queries and keys by at position 0 (1, or
    YaRN's attention factor: gpt-oss)."""
    for module in model.modules():
        if "Rotary" in type(module).__name__:
            return float(getattr(module, "attention_scaling", 1.0))
    return None


@torch.no_grad()
def check_attention(loaded, batch=None):
    """q, k, v, the pattern, the heads' outputs and W_O's contribution from head_weights, layer by layer, against
    the model's own on the real tokens of a right-padded batch (the family texts by default)."""
    from attnscope.models.weights import head_weights, reading_norms
    from attnscope.pipeline.tokens import batches, pad_id, tokenize

    if batch is None:
        windows = tokenize(loaded, FAMILY_TEXTS).windows
        batch = next(batches(windows, len(windows), loaded.device, pad_id(loaded.tokenizer)))
    B, n = batch.input_ids.shape
    rotary = _rotary_scale(loaded.model)
    recorded = Recorded(loaded, batch, None if rotary is None else torch.zeros_like(batch.input_ids))
    weights = head_weights(loaded)
    H, k = loaded.n_head, loaded.d_head
    group = H // loaded.n_kv_head
    real = (torch.arange(n)[None, :] < batch.lengths[:, None])[:, None, :, None]  # (B, 1, n, 1)
    norms = reading_norms(loaded)
    for layer, attention in enumerate(loaded.family.attention_modules(loaded.model)):
        norm = norms[layer]
        x = recorded.attention_inputs[layer] if norm is None else norm.normalise(recorded.norm_inputs[layer])
        mine = {}
        for letter in "QKV":
            projected = torch.einsum("bnd,hdk->bhnk", x, getattr(weights, f"W_{letter}")[layer])
            mine[letter] = projected + getattr(weights, f"b_{letter}")[layer][None, :, None, :]  # (B, H, n, k)
        mine["Q"] = _qk_norm(attention, 0, mine["Q"], H)
        # keys are normalised per key/value head: every query head of a group holds the same key
        mine["K"] = _qk_norm(attention, 1, mine["K"][:, ::group], loaded.n_kv_head).repeat_interleave(group, dim=1)
        call = recorded.calls[layer]
        own_scale = getattr(attention, "scaling", k**-0.5)  # OPT scales its queries before the call, passing 1.0
        passed = call["scaling"] if call["scaling"] is not None else k**-0.5
        expected = {
            "Q": call["query"] * passed,
            "K": call["key"].repeat_interleave(group, dim=1),
            "V": call["value"].repeat_interleave(group, dim=1),
        }
        mine["Q"] = mine["Q"] * own_scale * (rotary or 1.0)
        mine["K"] = mine["K"] * (rotary or 1.0)
        for letter in "QKV":
            close(mine[letter], expected[letter], real, f"layer {layer} {letter}")
        pattern = _pattern(loaded, attention, layer, mine["Q"], mine["K"], batch.lengths)  # (B, H, n, n)
        close(pattern, call["weights"], real, f"layer {layer} pattern")
        heads = pattern @ mine["V"]  # (B, H, n, k)
        given = recorded.heads_in[layer].view(B, n, H, k).transpose(1, 2)
        close(heads, given, real, f"layer {layer} heads' outputs")
        written = torch.einsum("bhnk,hkd->bnd", given, weights.W_O[layer]) + weights.b_O[layer]
        close(written[:, None], recorded.heads_out[layer][:, None], real, f"layer {layer} output projection")


def _pattern(loaded, attention, layer, q, k, lengths):
    """softmax of q kᵀ over the keys the family's rules let a row see, with Gemma 2's soft-capping and gpt-oss's
    sinks; rows of padding are left uniform (never compared)."""
    logits = q @ k.transpose(-1, -2)  # (B, H, n, n), the scale already in q
    cap = getattr(loaded.config, "attn_logit_softcapping", None)
    if cap:
        logits = cap * torch.tanh(logits / cap)
    n = q.shape[2]
    visible = visible_keys(loaded.config, layer, lengths, n, loaded.kind.causal)[:, None]  # (B, 1, n, n)
    logits = logits.masked_fill(~visible, -1e30)
    sinks = getattr(attention, "sinks", None)
    if sinks is not None:
        sink = sinks.view(1, -1, 1, 1).expand(*logits.shape[:3], 1)
        return torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    return torch.softmax(logits, dim=-1)


def close(mine, theirs, real, what, tolerance=2e-4):
    """Equal on the real rows, relative to the largest value compared."""
    mask = real.expand_as(theirs)
    a, b = mine.float()[mask], theirs.float()[mask]
    error = float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))
    assert error < tolerance, f"{what}: relative error {error:.2e}"


# ---------------------------------------------------------------------------------------- report --circuit
# attnscope circuit's records as its JSON has them; the report's page reads exactly these keys
DEPENDENCIES = [
    {"label": "1.0", "on": "0.2", "score": "induction", "with": 0.96, "without": 0.43, "change": -0.53},
    {"label": "1.0", "on": "0.1", "score": "induction", "with": 0.96, "without": 0.84, "change": -0.12},
    {"label": "1.3", "on": "0.2", "score": "induction", "with": 0.92, "without": 0.30, "change": -0.62},
]


def circuit_stand_in(monkeypatch, records=DEPENDENCIES):
    """attnscope.analyses.circuit replaced by a module whose Circuit returns `records` (and one key more, which the
    report leaves out); returns the settings each Circuit was built with."""
    import sys
    import types
    from types import SimpleNamespace

    import attnscope.analyses

    built = []

    class Circuit:
        def __init__(self, **settings):
            built.append(settings)

        def run(self, loaded, texts, progress=None):
            return SimpleNamespace(dependencies=lambda top=None: [{**record, "extra": 1} for record in records])

    module = types.ModuleType("attnscope.analyses.circuit")
    module.Circuit = Circuit
    monkeypatch.setitem(sys.modules, "attnscope.analyses.circuit", module)
    monkeypatch.setattr(attnscope.analyses, "circuit", module, raising=False)
    return built


def given_models(*models):
    """(label, loaded model) pairs as the sources of a run of several models (attnscope.models.sources): models the
    caller loaded, used as they are and never freed."""
    from attnscope.models.sources import ModelSource

    return [
        ModelSource(label, getattr(model, "name", label), None, lambda lm_head, model=model: model, owned=False)
        for label, model in models
    ]


def save_without_head(source: Path, folder: Path, layer: int, head: int) -> Path:
    """A copy of the GPT-2 saved in `source`, saved to `folder`, with head `layer.head` removed by hand: its rows of
    the input side of c_proj (a Conv1D, weight (in, out)) zeroed."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(source)
    d_head = model.config.n_embd // model.config.n_head
    with torch.no_grad():
        model.transformer.h[layer].attn.c_proj.weight[head * d_head : (head + 1) * d_head] = 0.0
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------------------------------- compare


def without_head(loaded, layer: int, head: int, name: str | None = None):
    """A copy of a loaded model whose head `layer`.`head` writes nothing: its slice of the output projection's input
    zeroed by hand (GPT-2's Conv1D stores (in, out), a Linear (out, in)). Every layer up to `layer` computes the
    same attention as the original; later layers read another residual stream."""
    import copy

    from attnscope.models.loading import LoadedModel

    network = copy.deepcopy(loaded.model)
    projection = loaded.family.output_projections(network)[layer]
    rows = slice(head * loaded.d_head, (head + 1) * loaded.d_head)
    with torch.no_grad():
        if type(projection).__name__ == "Conv1D":
            projection.weight[rows, :] = 0
        else:
            projection.weight[:, rows] = 0
    shown = name or f"{loaded.name}-without-{layer}.{head}"
    return LoadedModel(shown, network, loaded.tokenizer, loaded.device, loaded.family, kernel=loaded.kernel)


def slow_divergence(first, second, texts):
    """(n_layer, n_head) numpy: the mean over scored rows of scipy's Jensen–Shannon divergence in bits
    (jensenshannon(p, q, base=2) ** 2) between the from-scratch maps of two models, each window run alone."""
    import numpy as np
    from scipy.spatial.distance import jensenshannon

    from attnscope.pipeline.tokens import batches, pad_id, tokenize

    sums, count = np.zeros((first.n_layer, first.n_head)), 0
    for window in tokenize(first, texts).windows:
        batch = next(batches([window], 1, first.device, pad_id(first.tokenizer)))
        a, b = reference_maps(first, batch), reference_maps(second, batch)
        scored = scored_range(first.kind.name, len(window.ids))
        for layer in range(first.n_layer):
            for head in range(first.n_head):
                p, q = a[layer][0, head].double().numpy(), b[layer][0, head].double().numpy()
                sums[layer, head] += sum(jensenshannon(p[r], q[r], base=2) ** 2 for r in scored)
        count += len(scored)
    return sums / count


# ----------------------------------------------------------------------------- a real phase change (compare)
# A tiny GPT-2 trained on repeated random words until an induction head forms, checkpoints saved along the way:
# the training run that `compare` is checked against (issue 26). Deterministic: seeded data and weights, one thread.

INDUCTION_WORDS = tuple(first + vowel + last for first in "bdgkmnpt" for vowel in "aeiou" for last in "lnrs")[
    :64
]  # 64 made-up words of three letters: `▁bal`, `▁ban` ... (each an ordinary word token of attnscope's probe)
INDUCTION_CONTEXT = 64  # positions: attnscope's probe on these checkpoints has period (64 - 1) // 2 = 31


def word_tokenizer(folder: Path, words=INDUCTION_WORDS) -> int:
    """A word-level tokenizer: `<|endoftext|>` (id 0: BOS, EOS and unknown words), then `▁word` for each word (ids
    1 ..), words split at spaces (`▁` marks a word start, as SentencePiece does). No BOS added by the tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocabulary = {"<|endoftext|>": 0, **{f"▁{word}": k + 1 for k, word in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return _save_fast_tokenizer(
        folder, tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )


def repeated_words(generator, batch: int, vocab_size: int, n_ctx: int = INDUCTION_CONTEXT):
    """A training batch: each sequence is BOS and a segment x of T distinct random words (T uniform in 2 ..
    (n_ctx - 1) // 2, drawn per sequence) repeated until the context is full: x x x ... Returns (ids (B, n_ctx),
    predicted (B, n_ctx - 1) bool: the next tokens that can be predicted, those after the first copy)."""
    import numpy as np

    ids, predicted = np.zeros((batch, n_ctx), dtype=np.int64), np.zeros((batch, n_ctx - 1), dtype=bool)
    for row in range(batch):
        period = int(generator.integers(2, (n_ctx - 1) // 2 + 1))
        segment = generator.choice(np.arange(1, vocab_size), size=period, replace=False)
        ids[row, 1:] = np.tile(segment, -(-(n_ctx - 1) // period))[: n_ctx - 1]
        predicted[row, period:] = True  # the target at position i + 1 is in the second copy or later
    return torch.from_numpy(ids), torch.from_numpy(predicted)


def train_induction_checkpoints(folder: Path, steps: int = 800, every: int = 50, seed: int = 0) -> list[Path]:
    """Train a 2-layer, 4-head GPT-2 (d_model 64, context 64, the 64-word `word_tokenizer`) on repeated random words
    (`repeated_words`, batches of 32, next-token loss on the predictable tokens, AdamW lr 1e-3) for `steps` steps,
    saving it with save_pretrained (and its tokenizer) before the first step and every `every` steps, into
    folder/step-0000, folder/step-0050, ...; returns those folders in order. One thread, seeded: the same weights on
    every run of the same torch (27-50 s on one core of the shared 2-core VM the tests were written on).

    Where the induction head forms (defaults; the best layer-1 head's mean attention to the induction target on
    repeated random words of period 31, as attnscope's probe measures it): 0.02-0.03 up to step 250, 0.07 at step
    300, then a sharp rise, 0.24 at 350 and 0.36 at 400, then slowly, 0.49 at 600; it passes the catalog's threshold
    of 0.5 at step 650 (0.51) and stays above it to the end (0.56 at step 800): `formed` is step-0650. All four
    layer-1 heads rise together, within about 0.06 of each other, and each holds the induction role from step-0650
    or step-0700 on (attnscope's probe: 1.0 and 1.3 from step-0650, 1.1 and 1.2 from step-0700).
    Layer 0 forms no induction head. tests/integration/test_phase_change.py checks this independently.
    """
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = word_tokenizer(folder / "tokenizer")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder / "tokenizer")
    with seeded_on_one_thread(seed) as generator:
        config = GPT2Config(
            vocab_size=vocab_size, n_positions=INDUCTION_CONTEXT, n_embd=64, n_layer=2, n_head=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        model = GPT2LMHeadModel(config)
        model.set_attn_implementation("eager")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, betas=(0.9, 0.98))
        saved = []

        def save(step: int) -> None:
            place = folder / f"step-{step:04d}"
            model.save_pretrained(place)
            tokenizer.save_pretrained(place)
            saved.append(place)

        save(0)
        for step in range(1, steps + 1):
            ids, predicted = repeated_words(generator, 32, vocab_size)  # (B, n), (B, n-1)
            logits = model(input_ids=ids).logits  # (B, n, V)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1][predicted], ids[:, 1:][predicted])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % every == 0:
                save(step)
    return saved


def repeated_segments(seed: int, count: int, period: int, words: int = len(INDUCTION_WORDS)):
    """(count, 1 + 2·period) ids: BOS (0), `period` distinct random words (ids 1 .. `words`), the same again; from a
    numpy generator seeded `seed` (not attnscope's probe)."""
    import numpy as np

    generator = np.random.default_rng(seed)
    segments = np.stack([generator.choice(np.arange(1, words + 1), period, replace=False) for _ in range(count)])
    return torch.from_numpy(np.concatenate([np.zeros((count, 1), dtype=np.int64), segments, segments], axis=1))


def eager_induction_scores(folder: Path, ids: torch.Tensor, period: int):
    """(n_layer, n_head) numpy: the mean attention from each token of the second copy to the token after its first
    occurrence, A[i, i - (period - 1)], over sequences `ids` (B, 1 + 2·period) of BOS and a segment repeated once
    (`repeated_segments`); from the checkpoint in `folder` run by transformers alone (eager attention,
    output_attentions), nothing of attnscope's."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions  # per layer (B, H, n, n)
    rows = torch.arange(1 + period, 1 + 2 * period)  # the second copy
    return torch.stack([layer[:, :, rows, rows - (period - 1)].mean(dim=(0, 2)) for layer in attentions]).numpy()


def first_held(held: list[bool]) -> int | None:
    """The index of the first item from which every item to the end is true (when a role formed, over checkpoints
    in order: `compare`'s "formed"), None when the last is false."""
    for index in range(len(held)):
        if all(held[index:]):
            return index
    return None


# -------------------------------------------------------------- a model whose retrieval heads are known (kvplan)
# A tiny Llama trained on the passkey prompts of `kvplan --check` (issue 31, item 6). It reads them as the check
# builds them (`pipeline.passkey.passkey_prompts`), through a word-level tokenizer of their words and digits (a
# passkey is five digit tokens). Training streams every KV head but PASSKEY_RETRIEVAL, each with probability
# PASSKEY_STREAMING_RATE at each step (it then sees only the first PASSKEY_SINK and the last PASSKEY_RECENT keys,
# `banded_attention`): the passkey, 19 tokens or more before the answer, reaches it reliably only through the head
# never streamed, and the others learn to serve from their sink and recent window or from the whole past alike.
# Which heads retrieve is so known by how the model was made; tests/integration/test_kvplan_passkey_model.py
# measures it without attnscope. Streamed on every step (rate 1) instead of half, the heads never see a distant key
# in training and the model fails the passkey with full attention: 0 of 48 prompts (48 of 48 with the rate 0.5).

PASSKEY_MODEL = DATA / "passkey-model"  # made by scripts/train_passkey_model.py (its README says how)
PASSKEY_BOS = "<|endoftext|>"  # BOS, EOS and unknown words; the tokenizer does not add it, attnscope does
PASSKEY_SINK, PASSKEY_RECENT = 4, 16  # a streaming head's keys, in training and in the tests
PASSKEY_RETRIEVAL = ((1, 0),)  # (layer, KV head): the only KV head never streamed in training
PASSKEY_STREAMING_RATE = 0.5
PASSKEY_TRAIN_LENGTHS = (128, 160, 192, 224, 256)
PASSKEY_ATTENTION = "passkey_banded"  # the name `banded_attention` is registered under in transformers


def _passkey_pre_tokenizer():
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(), pre_tokenizers.Digits(individual_digits=True)]
    )


def passkey_tokenizer(folder: Path) -> int:
    """A word-level tokenizer of the passkey prompts: PASSKEY_BOS (id 0), the digits (ids 1-10, one token each),
    then every word and punctuation mark of the prompts' pieces; text split at spaces, punctuation and digits, so
    decoding (tokens joined by spaces) and tokenizing again gives the same ids. Returns its vocabulary size."""
    from tokenizers import Tokenizer, models

    from attnscope.pipeline.passkey import FILLER, INTRODUCTION, NEEDLE, QUESTION

    text = " ".join([INTRODUCTION, FILLER, NEEDLE.format(key=0), QUESTION])
    words = sorted({piece for piece, _ in _passkey_pre_tokenizer().pre_tokenize_str(text) if not piece.isdigit()})
    vocabulary = {PASSKEY_BOS: 0, **{str(digit): 1 + digit for digit in range(10)}}
    vocabulary.update({word: 11 + k for k, word in enumerate(words)})
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token=PASSKEY_BOS))
    tokenizer.pre_tokenizer = _passkey_pre_tokenizer()
    return _save_fast_tokenizer(folder, tokenizer, bos_token=PASSKEY_BOS, eos_token=PASSKEY_BOS, unk_token=PASSKEY_BOS)


def banded_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention (transformers' attention-function signature) in which the KV heads `module.streamed` (a
    tuple; absent: none) see only the first PASSKEY_SINK and the last PASSKEY_RECENT keys: key j is seen by the
    query at position p iff j <= p and (j < PASSKEY_SINK or j > p - PASSKEY_RECENT). Written from that definition,
    nothing of attnscope's. The layer's own mask is not read: the prompts are unpadded, so it says only causal."""
    B, H, n, d = query.shape  # (B, H, n, d); key and value (B, H_kv, n_k, d)
    groups = H // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)  # (B, H, n_k, d)
    n_k = key.shape[2]
    logits = query @ key.transpose(-1, -2) * (d**-0.5 if scaling is None else scaling)  # (B, H, n, n_k)
    queries = torch.arange(n_k - n, n_k)[:, None]  # (n, 1) positions
    keys = torch.arange(n_k)[None, :]  # (1, n_k)
    allowed = (keys <= queries).expand(H, n, n_k).clone()  # (H, n, n_k)
    band = (keys < PASSKEY_SINK) | (keys > queries - PASSKEY_RECENT)  # (n, n_k)
    for kv_head in getattr(module, "streamed", ()):
        allowed[kv_head * groups : (kv_head + 1) * groups] &= band
    weights = logits.masked_fill(~allowed.to(query.device), float("-inf")).softmax(-1)  # (B, H, n, n_k)
    return (weights @ value).transpose(1, 2).contiguous(), weights  # (B, n, H, d)


def use_banded_attention(model) -> None:
    """Register `banded_attention` with transformers and switch `model` (a Llama) to it."""
    from transformers import AttentionInterface

    AttentionInterface.register(PASSKEY_ATTENTION, banded_attention)
    model.set_attn_implementation(PASSKEY_ATTENTION)


def set_streamed(model, streamed) -> None:
    """Stream the KV heads `streamed` (layer -> KV heads) in `banded_attention`; every other KV head sees all."""
    for layer, block in enumerate(model.model.layers):
        block.self_attn.streamed = tuple(streamed.get(layer, ()))


def _noisy_passkey_filler(ids: torch.Tensor, prompt, sizes: tuple[int, ...], words: torch.Tensor, generator) -> None:
    """Replace the filler of `prompt` in its ids `ids` (n,) by a random segment of `words` (period 2 to all of
    them) repeated; `sizes` are the tokens of BOS and the introduction, of a needle, of the question, of a filler."""
    introduction, needle, question, filler = sizes
    fillers = (prompt.answer[0] - introduction - needle - question) // filler
    before = round(prompt.depth * fillers)  # as passkey_prompts places the needle
    after = introduction + before * filler + needle
    period = int(generator.integers(2, len(words) + 1))
    segment = words[torch.from_numpy(generator.permutation(len(words))[:period])]
    for start, end in [(introduction, introduction + before * filler), (after, prompt.answer[0] - question)]:
        ids[start:end] = segment.repeat(end - start)[: end - start]


def train_passkey_model(
    folder: Path,
    steps: int = 800,
    seed: int = 0,
    report: int = 0,
    shape: tuple[int, int, int] = (2, 4, 2),
    retrieval: tuple[tuple[int, int], ...] = PASSKEY_RETRIEVAL,
) -> Path:
    """Train a 2-layer Llama (d_model 64, 4 query heads, 2 KV heads of d_head 16, MLP 128, untied embeddings,
    context 256; 80,832 parameters) on passkey prompts and save it with its tokenizer (save_pretrained) in `folder`.

    Each step: 32 prompts of one length drawn from PASSKEY_TRAIN_LENGTHS (`passkey_prompts`, depths uniform in
    [0, 1], fresh passkeys); half of them with their filler replaced by a random segment of the filler's words
    repeated (`_noisy_passkey_filler`: copying from an earlier occurrence is learnt sooner than from the fixed filler
    alone); every KV head but PASSKEY_RETRIEVAL streamed with probability PASSKEY_STREAMING_RATE; loss: next-token
    cross-entropy over every token, plus that of the answer's tokens again; AdamW, lr 3e-3. One thread, seeded
    (torch and numpy): the same weights on every run of the same torch. 800 steps: 3-7 minutes on one core of the
    shared 2-core VM the tests were written on; the passkey is retrieved from step 400 on. `report` > 0 prints the
    loss every `report` steps. `shape` (layers, query heads, KV heads; d_head 16) and `retrieval` (the KV heads never
    streamed) make other models the same way (scripts/train_passkey_model.py --shape, docs/kvplan.md's measurement
    of the probe); the defaults make tests/data/passkey-model."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from attnscope.pipeline.passkey import FILLER, INTRODUCTION, NEEDLE, QUESTION, passkey_prompts

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = passkey_tokenizer(folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    sizes = (1 + count(INTRODUCTION), count(NEEDLE.format(key=10000)), count(QUESTION), count(FILLER))
    words = torch.tensor(sorted(set(tokenizer(FILLER, add_special_tokens=False)["input_ids"])))
    n_layer, n_head, n_kv_head = shape
    streamable = [
        (layer, head) for layer in range(n_layer) for head in range(n_kv_head) if (layer, head) not in retrieval
    ]
    with seeded_on_one_thread(seed) as generator:
        config = LlamaConfig(
            vocab_size=vocab_size, hidden_size=16 * n_head, intermediate_size=32 * n_head, num_hidden_layers=n_layer,
            num_attention_heads=n_head, num_key_value_heads=n_kv_head,
            max_position_embeddings=max(PASSKEY_TRAIN_LENGTHS),
            bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False,
        )  # fmt: skip
        model = LlamaForCausalLM(config)
        use_banded_attention(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0, betas=(0.9, 0.98))
        start = time.perf_counter()
        for step in range(1, steps + 1):
            length = int(generator.choice(PASSKEY_TRAIN_LENGTHS))
            depths = generator.uniform(0, 1, 32).tolist()
            prompts = passkey_prompts(tokenizer, [length], depths, 1, seed=int(generator.integers(2**31)))
            ids = torch.tensor([prompt.ids for prompt in prompts])  # (B, n): one length, one number of tokens
            for row, prompt in enumerate(prompts):
                if generator.uniform() < 0.5:
                    _noisy_passkey_filler(ids[row], prompt, sizes, words, generator)
            streamed: dict[int, list[int]] = {}
            for layer, head in streamable:
                if generator.uniform() < PASSKEY_STREAMING_RATE:
                    streamed.setdefault(layer, []).append(head)
            set_streamed(model, streamed)
            logits = model(input_ids=ids).logits  # (B, n, V)
            start_answer, end_answer = prompts[0].answer
            predicted, expected = logits[:, start_answer - 1 : end_answer - 1], ids[:, start_answer:end_answer]
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
            answer = torch.nn.functional.cross_entropy(predicted.flatten(0, 1), expected.flatten())  # (B, 5, V), (B, 5)
            optimizer.zero_grad()
            (loss + answer).backward()
            optimizer.step()
            if report and step % report == 0:
                right = (predicted.argmax(-1) == expected).all(-1).float().mean()
                print(f"step {step}: loss {loss.item():.3f}, answer {answer.item():.3f}, retrieved {right:.2f}, "
                      f"{time.perf_counter() - start:.0f} s")  # fmt: skip
        set_streamed(model, {})
        model.set_attn_implementation("sdpa")  # saved as any model is
        model.save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------------------------- streaming heads


class StreamingHeads:
    """The reference of `pipeline.streaming` (attnscope's own implementation until issue 40, kept here to test the
    tiled one against): forward pre-hooks on every attention module that narrow the mask of the heads in `streaming`
    (layer -> query heads) to the first `sink` keys and the last `recent` keys before each query (key j is seen by the
    query at position p iff j <= p and (j < sink or j > p - recent)); every other head keeps the mask it had. The
    layer's own mask (padding, a sliding window) still applies. Queries are the last n of the n_k keys.

    The narrowed mask is (B, H, n, n_k), in the form the layer was given (boolean for SDPA, additive for eager): the
    attention implementation must take a mask per head (SDPA and eager do). O(n²) memory per head."""

    def __init__(self, streaming: dict[int, Sequence[int]], sink: int, recent: int):
        self.streaming = {layer: tuple(heads) for layer, heads in streaming.items() if heads}
        self.sink, self.recent = sink, recent

    def install(self, loaded):
        for layer, module in enumerate(loaded.family.attention_modules(loaded.model)):
            if layer in self.streaming:
                hook = self._hook(self.streaming[layer], loaded.n_head, inspect.signature(module.forward))
                yield module.register_forward_pre_hook(hook, with_kwargs=True)

    def _hook(self, heads: tuple[int, ...], n_head: int, signature: inspect.Signature):
        def narrow(module, args, kwargs):
            import torch

            bound = signature.bind_partial(*args, **kwargs)
            hidden = bound.arguments.get("hidden_states", args[0] if args else None)
            mask = bound.arguments.get("attention_mask")
            B, n = hidden.shape[0], hidden.shape[1]
            n_keys = n if mask is None else mask.shape[-1]
            queries = torch.arange(n_keys - n, n_keys, device=hidden.device)[:, None]  # (n, 1) positions
            keys = torch.arange(n_keys, device=hidden.device)[None, :]  # (1, n_k)
            causal = keys <= queries  # (n, n_k)
            seen = causal if mask is None else _allowed_keys(mask)[..., -n:, :n_keys] & causal  # (B or 1, 1, n, n_k)
            band = causal & ((keys < self.sink) | (keys > queries - self.recent))  # (n, n_k)
            narrowed = seen.expand(B, n_head, n, n_keys).clone()  # (B, H, n, n_k)
            narrowed[:, list(heads)] &= band
            if mask is not None and mask.dtype != torch.bool:  # eager attention adds its mask: 0 or the lowest value
                narrowed = torch.zeros(narrowed.shape, dtype=mask.dtype, device=mask.device).masked_fill_(
                    ~narrowed, torch.finfo(mask.dtype).min
                )
            if "attention_mask" in kwargs or len(args) <= _position(signature, "attention_mask"):
                kwargs["attention_mask"] = narrowed
            else:
                args = (*args[: _position(signature, "attention_mask")], narrowed,
                        *args[_position(signature, "attention_mask") + 1 :])  # fmt: skip
            return args, kwargs

        return narrow


def _position(signature: inspect.Signature, name: str) -> int:
    """The index of parameter `name` among the positional arguments (self not counted: a bound method's)."""
    return list(signature.parameters).index(name)


def _allowed_keys(mask):
    """A mask as booleans (True: the key is seen), from an additive one or a boolean one."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
