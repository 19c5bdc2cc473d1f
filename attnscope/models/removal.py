"""A model with heads removed in its weights, and written to a folder (`attnscope ablate --remove ... --save DIR`).

Removing head h of layer l changes only what the output projection W_O of layer l makes of h's output z_h (its slice
of W_O's input: columns h·d_head .. (h+1)·d_head of an `nn.Linear`'s weight (out, in), rows of GPT-2's `Conv1D`, whose
weight is (in, out)), so the removal the analyses make with a hook (`pipeline.interventions.HeadGates`) can be written
into the weights:

    zero:  W_O[:, h] = 0                          W_O z + b with z_h = 0
    mean:  b ← b + W_O[:, h] m_h, W_O[:, h] = 0   W_O z + b with z_h = m_h, its mean (`pipeline.ablation`)

Both are exact at every position, as the hook's replacement is. The mean needs a bias to hold it: a family whose
output projection has none (Llama's `o_proj`, most recent decoders) can be saved with zero ablation only. Resample
ablation replaces z_h by another text's output, which no weight can hold.

The weights are changed in place for as long as `removed` lasts, and put back after, however it ends: a model the
caller loaded is left as it was. `save` writes the model with its tokenizer to a hidden folder beside the destination
and renames it into place once everything is written: an error leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnscope import options
from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    from attnscope.models.loading import LoadedModel


def check_destination(path: str | os.PathLike) -> Path:
    """The folder `save` may write: new, or empty (a model's files are not mixed with others'), in a folder this
    process can write to; else one line saying why. Checked before any work is done."""
    folder = options.expanded_path(path, "save (--save)")
    shown = os.fspath(path)
    if folder.exists() and not folder.is_dir():
        raise AttnscopeError(f"save (--save) {shown}: it is a file; give a new folder for the model")
    if folder.is_dir() and any(folder.iterdir()):
        raise AttnscopeError(
            f"save (--save) {shown}: the folder exists and is not empty; give a new folder (a model's files are "
            "not mixed with others')"
        )
    existing = next(parent for parent in (folder.absolute(), *folder.absolute().parents) if parent.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise AttnscopeError(f"save (--save) {shown}: cannot write in {existing}")
    return folder


def check_removable(loaded: LoadedModel, mode: str) -> None:
    """Whether the weights can hold `mode`'s removal: zero always, mean where every output projection has a bias
    (and is an nn.Linear or a Conv1D), resample never."""
    if mode == "resample":
        raise AttnscopeError(
            "resample ablation takes each head's output from another text, which no weight can hold: save with "
            "ablation mean or zero"
        )
    for projection in loaded.family.output_projections(loaded.model):
        _input_side(projection)
        if mode == "mean" and getattr(projection, "bias", None) is None:
            raise AttnscopeError(
                f"mean ablation is saved in the bias of the output projection, and this {loaded.family.name} model's "
                f"({loaded.family.output_projection}) has none: save with ablation zero"
            )


def _input_side(projection: Any) -> int:
    """The dimension of the projection's weight that its input (the heads' outputs side by side) indexes: 1 for an
    nn.Linear (out, in), 0 for GPT-2's Conv1D (in, out)."""
    import torch

    if isinstance(projection, torch.nn.Linear):
        return 1
    if type(projection).__name__ == "Conv1D":
        return 0
    raise AttnscopeError(f"the output projection is a {type(projection).__name__}: attnscope cannot edit its weights")


@contextlib.contextmanager
def removed(
    loaded: LoadedModel, heads: Sequence[tuple[int, int]], means: Mapping[int, Any] | None = None
) -> Iterator[None]:
    """`loaded`'s weights with `heads` (layer, head) removed, in place, for the block: zero ablation, or with `means`
    (layer -> (H, d_head), the heads' mean outputs) mean ablation. Put back exactly after, however the block ends."""
    import torch

    d_head = loaded.d_head
    projections = loaded.family.output_projections(loaded.model)
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []  # (a view of a parameter, its values before) to put back
    try:
        with torch.no_grad():
            for layer, head in heads:
                projection = projections[layer]
                columns = slice(head * d_head, (head + 1) * d_head)
                side = _input_side(projection)
                weight = projection.weight
                part = weight[:, columns] if side == 1 else weight[columns]  # (out, d_head) or (d_head, out): a view
                if means is not None:
                    bias = projection.bias  # (out,)
                    mean = means[layer][head].to(torch.float64)  # (d_head,)
                    moved = part.to(torch.float64) @ mean if side == 1 else mean @ part.to(torch.float64)  # (out,)
                    kept.append((bias, bias.detach().clone()))
                    bias += moved.to(bias.dtype)
                kept.append((part, part.detach().clone()))
                part.zero_()
        yield
    finally:
        with torch.no_grad():
            for view, before in reversed(kept):
                view.copy_(before)


def save(loaded: LoadedModel, path: str | os.PathLike) -> Path:
    """Write `loaded`'s model (with its language-model head) and tokenizer to the new folder `path`, as
    `save_pretrained` writes them: all of it or nothing (a hidden folder beside it, renamed into place)."""
    folder = check_destination(path)
    network = loaded.lm_model if loaded.lm_model is not None else loaded.model
    parent = folder.absolute().parent
    made = [directory for directory in (parent, *parent.parents) if not directory.exists()]
    stage = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=parent, prefix=f".{folder.name}.attnscope-"))
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(stage, 0o777 & ~mask)  # mkdtemp makes 0700; give the folder the permissions mkdir would
        network.save_pretrained(stage)
        loaded.tokenizer.save_pretrained(stage)
        os.rename(stage, folder)  # onto nothing, or onto an empty folder: one step
        stage = None
    except OSError as error:
        raise AttnscopeError(
            f"save (--save) {os.fspath(path)}: cannot write: {error.strerror or error}; nothing was written"
        ) from None
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
            for directory in made:  # deepest first: the folders this made, if nothing else went in
                try:
                    directory.rmdir()
                except OSError:
                    break
    return folder
