"""Which kernel computes a layer's attention: the one decision, made in one place and read by every caller.

Two kernels, peers with one interface (`(state, call, query, key, value, attention_mask)`): the block path
(`pipeline.block_path`, PyTorch, one block of query rows at a time: every reducer can use it) and the fused Triton
kernel (`pipeline.fused_path` around `pipeline.fused`: the output and the per-row summaries in one pass over the
keys, without the logits ever leaving the chip). The setting (`--kernel`, `load(kernel=)`, KERNELS) is `auto`
(fused on a CUDA device when Triton imports, blocks otherwise), `fused` or `blocks`.

`decide(setting, device)` is the decision. The CLI's settings and `api.load` call it before any weights are read,
so that `--kernel fused` where it cannot run is one line at once; the capture calls it for each layer's device and
reads the same answer: it is memoized, since what it depends on (whether Triton imports, and whether it runs
interpreted) is fixed for a process once Triton is imported. A layer may still leave the fused kernel for the block
path (full maps wanted, a mask it cannot derive: `fused_path`), which the run's notes say.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from typing import Any

import torch

from attnscope import options
from attnscope.errors import AttnscopeError

KERNELS = options.KERNELS
# Notes: why the run's layers left the fused kernel (said only when the fused kernel was asked for by name, unless
# the reason concerns the layer itself), and the interpreter's slowness.
# Notes: why the run's layers left the fused kernel (reasons said only when the fused kernel was asked for by name
# are marked so), and the interpreter's slowness.
INTERPRETER_NOTE = (
    "the fused kernel ran under Triton's interpreter (on the CPU, or with TRITON_INTERPRET=1): exact but very slow, "
    "meant for testing; the block path (kernel blocks, the default there) is the fast one"
)


BLOCKS_WANTED = (
    "full attention weights (maps, diversity, one query's row, the induction probe) come from the block path: the "
    "fused kernel gives per-row summaries only"
)


def check_setting(setting: str) -> str:
    """`setting` when it is one of KERNELS; one line naming them otherwise."""
    if setting not in KERNELS:
        raise AttnscopeError(f"kernel '{setting}': use one of {', '.join(KERNELS)}")
    return setting


@functools.cache
def decide(setting: str, device: torch.device | str) -> str:
    """The kernel that computes attention on `device`, 'fused' or 'blocks', for the setting: 'blocks'; 'fused' (an
    error where it cannot run: no Triton, a device it does not run on); 'auto': fused on a CUDA device when Triton
    imports, blocks otherwise. Decided once per setting and device in a process (an error is not remembered)."""
    check_setting(setting)
    device = torch.device(device)
    if setting == "blocks" or (setting == "auto" and device.type != "cuda"):
        return "blocks"
    _, why = import_fused(device)
    if why is None:
        return "fused"
    if setting == "auto":
        return "blocks"
    raise AttnscopeError(f"kernel fused: {why}")


def old_interpreter() -> str | None:
    """Why Triton's interpreter cannot run here, or None: before Triton 3.7 it fails with numpy 2 at the kernel's
    first loop (`only 0-dimensional arrays can be converted to Python scalars`), seen with Triton 3.6."""
    import numpy
    import triton

    version = tuple(int(part) for part in re.findall(r"\d+", triton.__version__)[:2])
    if version < (3, 7) and int(numpy.__version__.split(".")[0]) >= 2:
        return (
            f"on the CPU it runs under Triton's interpreter, and Triton {triton.__version__}'s fails with numpy "
            f"{numpy.__version__}: pip install 'triton>=3.7'"
        )
    return None


def import_fused(device: torch.device) -> tuple[Any, str | None]:
    """(pipeline.fused, None), or (None, why the fused kernel cannot run on `device` in this process).

    On the CPU the kernel runs under Triton's interpreter, which Triton reads from TRITON_INTERPRET when it is
    imported (triton.language decorates its own functions, tl.sum and the like, as compiled or interpreted then):
    it is set here when Triton is not imported yet, and a process that imported Triton without it cannot run the
    kernel on the CPU."""
    if device.type not in ("cpu", "cuda"):
        return None, f"it runs on CUDA GPUs (and on the CPU under Triton's interpreter), not on {device.type}"
    if device.type == "cpu" and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        from attnscope.pipeline import fused
    except Exception as error:  # ImportError, or a broken install failing in its own way
        return None, f"Triton cannot be imported ({error}); install it with: pip install 'attnscope[gpu]'"
    if device.type == "cpu" and (why := old_interpreter()) is not None:
        return None, why
    if device.type == "cpu" and not fused.interpreted():
        return None, (
            "on the CPU it runs under Triton's interpreter, which must be switched on before Triton is imported, and "
            "this process imported it without (transformers does, at its own import): set TRITON_INTERPRET=1 before "
            "importing transformers"
        )
    return fused, None
