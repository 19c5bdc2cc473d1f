"""What the tests share: tiny model builders, the texts, hand-built attention maps with known scores, independent
references (from-scratch attention from a model's own weights, per family), and small checks. Test modules import
from here, never from each other."""

from __future__ import annotations

import contextlib
import string
import struct
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
    save_pretrained."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    pieces = list(string.ascii_lowercase + string.digits + string.punctuation)
    continuations = [f"##{c}" for c in string.ascii_lowercase + string.digits]
    vocab = list(dict.fromkeys([*BERT_SPECIAL, *BERT_WORDS, *pieces, *continuations]))
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    torch.manual_seed(seed)
    settings = dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=64,
        vocab_size=len(vocab),
        initializer_range=0.3,
    )
    settings.update(config)
    BertForMaskedLM(BertConfig(**settings)).save_pretrained(folder)
    # transformers v5 takes the vocabulary file as `vocab` (v4 called it `vocab_file`)
    BertTokenizerFast(vocab=str(vocab_file), do_lower_case=True).save_pretrained(folder)
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
    """The capture's blocks sized to `block_bytes` of logits per window (None: as it is) inside the `with`."""
    from attnscope.pipeline import capture

    original = capture.BLOCK_BYTES
    capture.BLOCK_BYTES = original if block_bytes is None else block_bytes
    try:
        yield
    finally:
        capture.BLOCK_BYTES = original


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

    blocks: dict[int, list[torch.Tensor]] = {}

    class Collect(capture.Reducer):
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
