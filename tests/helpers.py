"""What the decoder and encoder capture tests share: the texts, and the maps exactly as the capture hands them over."""

import torch

from attnscope import capture
from attnscope.inputs import Text

TEXTS = [
    Text("The cat sat on the mat because it was tired.", "a"),
    Text("The doctor said that she would help the patient.", "b"),
    Text("Hello world", "c"),
    Text("Colourless green ideas sleep furiously, and the quick brown fox jumps over the lazy dog.", "d"),
]


def captured_maps(loaded, batch, block_bytes=capture.BLOCK_BYTES):
    """layer -> (B, H, n, n) as the capture hands them to its reducer, block by block (a causal block stops at its
    last query's key: the keys after it are filled with 0). With block_bytes=1 each block must be one query row."""
    blocks = {}

    class Collect(capture.Reducer):
        wants_blocks = True
        count = 0

        def add_block(self, layer, block):
            self.count += 1
            padded = torch.nn.functional.pad(block.probs, (0, block.n_keys - block.probs.shape[-1]))
            blocks.setdefault(layer, []).append(padded)

    reducer = Collect()
    original, capture.BLOCK_BYTES = capture.BLOCK_BYTES, block_bytes
    try:
        capture.run(loaded.model, [batch], reducer)
    finally:
        capture.BLOCK_BYTES = original
    if block_bytes == 1:  # one row per block: the blocking itself is under test
        assert reducer.count == batch.input_ids.shape[1] * len(blocks)
    return {layer: torch.cat(parts, dim=2) for layer, parts in blocks.items()}
