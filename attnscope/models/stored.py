"""What the checkpoint's own headers say of the model its config describes, read before transformers builds it.

transformers builds the model its config.json describes, then fills it from the checkpoint, and reports (after)
what did not fit (`checks.check_loaded_weights`). A config that claims far more than the weights hold is costly to
find out that way: 9,999 layers over a checkpoint of two allocated until memory ran out (111 s, then MemoryError),
500 layers took 0.8 GB and 16 s before the refusal, a hidden size of 65,536 asked for 64 GiB. The safetensors
headers name every tensor and its shape (a few kilobytes, read by hand: `checks.safetensors_header`), so the
config is compared with them first:

- its layers with the layers the checkpoint holds (`h.0` … `h.N-1`, the family's `layer_list`): more layers than
  stored is refused (fewer is refused after the load, as weights left out, at no cost);
- every tensor of one layer, and the tensors outside the layers (the embeddings), with the shapes a model of the
  config would give them: a one-layer copy of the model is built on torch's `meta` device, which holds no data, so
  a hidden size of 65,536 costs nothing to describe. Names the checkpoint does not use the same way (another
  family's, a conversion transformers applies while loading) are skipped, and left to the loading report.

Only files on this machine are read (a folder, or the Hugging Face cache); a model not downloaded yet is checked
once loaded, as before.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.models.checks import SHAPE_FIELDS, read_raw_config, safetensors_header
from attnscope.models.families import Family

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def stored_shapes(folder: Path, name: str) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape, from the safetensors header of `folder`'s weights (one file, or every shard its index
    lists); None when a header cannot be read (loading then says why)."""
    if (folder / WEIGHTS).is_file():
        files = [folder / WEIGHTS]
    elif (folder / INDEX).is_file():
        try:
            index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as error:
            raise AttnscopeError(
                f"the {INDEX} of model '{name}' is not a valid JSON file ({str(error).splitlines()[0]})"
            ) from None
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(file, str) for file in weight_map.values()):
            raise AttnscopeError(f"the {INDEX} of model '{name}' has no weight_map of tensor names to files")
        files = [folder / file for file in sorted(set(weight_map.values()))]
    else:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        header = safetensors_header(file)
        if header is None:
            return None
        for tensor, entry in header.items():
            shape = entry.get("shape")
            if tensor != "__metadata__" and isinstance(shape, list) and all(isinstance(n, int) for n in shape):
                shapes[tensor] = tuple(shape)
    return shapes


def _described(config: Any, model_class: Any) -> tuple[dict[str, tuple[int, ...]], str] | None:
    """Name -> shape of every parameter of a one-layer model of `config` (on the meta device: no memory), and the
    base model's prefix; None when such a model cannot be built (transformers then says why)."""
    import torch

    one_layer = copy.deepcopy(config)
    one_layer.num_hidden_layers = 1
    if isinstance(getattr(one_layer, "layer_types", None), list):  # one entry per layer (sliding or full)
        one_layer.layer_types = one_layer.layer_types[:1]
    try:
        with torch.device("meta"):
            model = model_class.from_config(one_layer, attn_implementation="eager")
    except Exception:  # a config transformers cannot build from: the load reports it
        return None
    return {key: tuple(value.shape) for key, value in model.named_parameters()}, model.base_model_prefix or ""


def check_stored_shapes(name: str, folder: Path, config: Any, family: Family, model_class: Any) -> None:
    """Refuse, before transformers builds anything, a config that describes more layers than the checkpoint in
    `folder` holds, or weights of other shapes (see the module docstring)."""
    stored = stored_shapes(folder, name)
    if not stored:
        return
    described = _described(config, model_class)
    if described is None:
        return
    shapes, prefix = described

    def bare(key: str) -> str:
        return key.removeprefix(f"{prefix}.") if prefix else key

    checkpoint = {bare(key): shape for key, shape in stored.items()}
    layers = f"{family.layer_list}."
    indices = {
        int(key[len(layers) :].split(".", 1)[0])
        for key in checkpoint
        if key.startswith(layers) and key[len(layers) :].split(".", 1)[0].isdigit()
    }
    if indices and config.num_hidden_layers > max(indices) + 1:
        held = max(indices) + 1
        raise AttnscopeError(
            f"model '{name}': its config.json describes {config.num_hidden_layers:,} layers "
            f"({_spelled(folder, 'n_layer')}), but the checkpoint holds {held:,} ({layers}0 to {layers}{held - 1}); "
            f"transformers would build the other {config.num_hidden_layers - held:,} from random numbers: "
            f"{_damaged(config)}"
        )
    differ = sorted(
        (key, checkpoint[key], shape)
        for key, shape in ((bare(key), shape) for key, shape in shapes.items())
        if key in checkpoint and checkpoint[key] != shape
    )
    if differ:
        key, held, wanted = differ[0]
        raise AttnscopeError(
            f"model '{name}': the checkpoint's {key} has shape {held}, but the config makes it {wanted} "
            f"({len(differ):,} weight{'' if len(differ) == 1 else 's'} of one layer and the embeddings differ); "
            f"transformers would start them from random numbers: {_damaged(config)}"
        )


TOKENIZER_JSON = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
)  # fmt: skip


def check_tokenizer_files(folder: Path, name: str) -> list[str]:
    """The tokenizer's files in `folder` (those of TOKENIZER_JSON it holds, and a vocab.txt), each JSON one parsed:
    one that is not JSON is refused naming it (transformers says only `Expecting value: line 1 column 1`)."""
    present = [file for file in (*TOKENIZER_JSON, "vocab.txt") if (folder / file).is_file()]
    for file in present:
        if file.endswith(".json"):
            try:
                json.loads((folder / file).read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError) as error:
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise AttnscopeError(f"the {file} of model '{name}' is not a valid JSON file ({first})") from None
    return present


def _spelled(folder: Path, field: str) -> str:
    """How config.json spells a shape field (`n_layer` for GPT-2, `num_hidden_layers` for most)."""
    try:
        raw = read_raw_config(folder, "")
    except AttnscopeError:
        raw = {}
    return next((key for key in SHAPE_FIELDS[field] if key in raw), SHAPE_FIELDS[field][0])


def _damaged(config: Any) -> str:
    return (
        f"the checkpoint is damaged, or its config.json (model_type '{getattr(config, 'model_type', '?')}', its "
        "layers and widths) belongs to other weights"
    )
