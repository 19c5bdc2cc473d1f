"""A model with heads removed in its weights, and written to a folder (`attnscope ablate --remove ... --save DIR`).

Removing head h of layer l changes only what the output projection W_O of layer l makes of h's output z_h (its slice
of W_O's input: columns h·d_head .. (h+1)·d_head of an `nn.Linear`'s weight (out, in), rows of GPT-2's `Conv1D`, whose
weight is (in, out)), so the removal the analyses make with a hook (`pipeline.interventions.HeadGates`) can be written
into the weights:

    zero:  W_O[:, h] = 0                          W_O z + b with z_h = 0
    mean:  b ← b + W_O[:, h] m_h, W_O[:, h] = 0   W_O z + b with z_h = m_h, its mean (`pipeline.ablation`)

Both are exact at every position, as the hook's replacement is. The mean needs a bias to hold it. Where the output
projection has none (Llama's `o_proj`, most recent decoders), the family's config often has a setting that gives it
one (`BIAS_SETTINGS`: Llama's, Gemma's, Qwen3's, OLMo's `attention_bias`, Seed-OSS's `attention_out_bias`): the
setting is switched on in the saved config and the biases it adds are put in, the output projection's holding the
means and the others (Llama's q, k and v projections) 0, which changes nothing they compute. Which biases a setting
adds is read from the family's own code: the model built again with it, on the meta device (no memory), its new
parameters compared with the model's. A family with no such setting (Mistral, Qwen2, Phi-3) is saved with zero
ablation only. Resample ablation replaces z_h by another text's output, which no weight can hold.

The weights (and any bias added, and the config's setting) are changed in place for as long as `removed` lasts, and
put back after, however it ends: a model the caller loaded is left as it was. `save` writes the model with its
tokenizer to a hidden folder beside the destination and renames it into place once everything is written: an error
leaves nothing behind.
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


# The config settings that give a family's output projection a bias (switched from False to True); each adds only
# biases, and which ones is read from the family's code (`_bias_setting`).
BIAS_SETTINGS = ("attention_out_bias", "attention_bias")


def check_removable(loaded: LoadedModel, mode: str) -> None:
    """Whether the weights can hold `mode`'s removal: zero always, mean where every output projection has a bias
    or the config has a setting that gives it one (and is an nn.Linear or a Conv1D), resample never."""
    if mode == "resample":
        raise AttnscopeError(
            "resample ablation takes each head's output from another text, which no weight can hold: save with "
            "ablation mean or zero"
        )
    projections = loaded.family.output_projections(loaded.model)
    for projection in projections:
        _input_side(projection)
    if mode == "mean" and any(projection.bias is None for projection in projections) and not _bias_setting(loaded):
        raise AttnscopeError(
            f"mean ablation is saved in the bias of the output projection, and this {loaded.family.name} model's "
            f"({loaded.family.output_projection}) has none, nor a setting of its config that adds one: save with "
            "ablation zero (--ablation zero), which every family can hold"
        )


def _network(loaded: LoadedModel) -> Any:
    return loaded.lm_model if loaded.lm_model is not None else loaded.model


def _bias_setting(loaded: LoadedModel) -> tuple[str, dict[str, tuple[int, ...]]] | None:
    """For a model whose output projections lack a bias: the config's setting (of BIAS_SETTINGS, False now) that
    gives each one, and every parameter it adds (name -> shape), all biases of an nn.Linear that has none; None where
    no setting does. The family's code decides: the model is built again with the setting on, on the meta device."""
    import copy

    import torch

    network = _network(loaded)
    config = network.config
    mine = {name: tuple(parameter.shape) for name, parameter in network.named_parameters()}
    names = {id(module): name for name, module in network.named_modules()}
    wanted = {f"{names[id(projection)]}.bias" for projection in loaded.family.output_projections(loaded.model)}
    for flag in BIAS_SETTINGS:
        if getattr(config, flag, None) is not False:
            continue
        changed = copy.deepcopy(config)
        setattr(changed, flag, True)
        with torch.device("meta"):
            built = type(network)(changed)
        theirs = {name: tuple(parameter.shape) for name, parameter in built.named_parameters()}
        added = {name: shape for name, shape in theirs.items() if name not in mine}
        holders = [network.get_submodule(name.rpartition(".")[0]) for name in added]
        if (
            wanted <= added.keys()
            and all(theirs.get(name) == shape for name, shape in mine.items())
            and all(name.endswith(".bias") for name in added)
            and all(isinstance(module, torch.nn.Linear) and module.bias is None for module in holders)
        ):
            return flag, added
    return None


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
) -> Iterator[str | None]:
    """`loaded`'s weights with `heads` (layer, head) removed, in place, for the block: zero ablation, or with `means`
    (layer -> (H, d_head), the heads' mean outputs) mean ablation, an output projection without a bias given one by
    its config's setting (`_bias_setting`). Yields a line saying what was added (None: nothing). Put back exactly
    after, however the block ends."""
    import torch

    d_head = loaded.d_head
    projections = loaded.family.output_projections(loaded.model)
    network, added, flag = _network(loaded), [], None
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []  # (a view of a parameter, its values before) to put back
    try:
        with torch.no_grad():
            if means is not None and any(projection.bias is None for projection in projections):
                setting = _bias_setting(loaded)
                if setting is None:
                    check_removable(loaded, "mean")  # its line
                flag, biases = setting
                for name in biases:
                    module = network.get_submodule(name.rpartition(".")[0])
                    weight = module.weight
                    module.bias = torch.nn.Parameter(weight.new_zeros(weight.shape[0]), requires_grad=False)
                    added.append(module)
                setattr(network.config, flag, True)
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
        yield None if flag is None else _added_note(loaded, flag, added, network)
    finally:
        with torch.no_grad():
            for view, before in reversed(kept):
                view.copy_(before)
        for module in added:
            module.bias = None
        if flag is not None:
            setattr(network.config, flag, False)


def _added_note(loaded: LoadedModel, flag: str, added: Sequence[Any], network: Any) -> str:
    """The line saying which biases the config's setting `flag` added (`removed`)."""
    names = {id(module): name for name, module in network.named_modules()}
    kinds = sorted({names[id(module)].rpartition(".")[2] for module in added})
    output = loaded.family.output_projection.rpartition(".")[2]
    others = [kind for kind in kinds if kind != output]
    zeros = f"; the others it adds ({', '.join(others)}) are 0, which changes nothing" if others else ""
    return (
        f"this {loaded.family.name} model's output projection ({loaded.family.output_projection}) has no bias to hold "
        f"the means: the saved config sets {flag}, which gives it one{zeros}"
    )


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
