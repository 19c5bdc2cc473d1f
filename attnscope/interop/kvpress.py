"""A plan folder of `attnscope kvplan --out` as a kvpress press (NVIDIA/kvpress, on the package index).

kvpress's `DuoAttentionPress` (0.5.5, `presses/duo_attention_press.py`) calls `self.load_attention_pattern(model)`
when it is applied (`post_init_from_model`) and takes back `(sink_size, recent_size, head_scores)`, head_scores
shaped (num_hidden_layers, num_key_value_heads); it then streams the round(head_compression_ratio × N) KV heads with
the lowest values (`numpy.argsort`). Its own method downloads DuoAttention's plan for six named checkpoints from a
fixed table of URLs; `plan_press(folder)` gives a subclass whose method reads the folder instead:

    from attnscope.interop.kvpress import plan_press

    press = plan_press("plan")  # streams the plan's 0s; head_compression_ratio=... streams another share
    answer = pipe(context, question=question, press=press)["answer"]

kvpress is imported when a press is made, never by `import attnscope`; without it the call fails in one line that
says `pip install kvpress`. `plan_pattern` reads a folder without kvpress.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.output.kvplan import CONFIG_FILE, PLAN_FILE

DOCUMENT_FILE = "kvplan.json"
INSTALL = (
    "pip install kvpress (0.5.5 runs with transformers < 5.3; `bash scripts/kvpress_interop.sh` builds such an "
    "environment)"
)


def plan_pattern(folder: str | Path, shape: tuple[int, int] | None = None) -> tuple[int, int, Any, float | None]:
    """(sink_size, recent_size, pattern (L, H_kv) float64, sparsity or None) from a plan folder.

    The pattern is full_attention_heads.tsv read as DuoAttention's `load_attn_pattern` and kvpress read it
    (`numpy.loadtxt`, clipped to [0, 1]; `ndmin=2` for a model of one layer or one KV head). Where kvplan.json is
    beside it (a folder of `attnscope kvplan --out`), the values are made distinct, kvplan's order inside the 0s and
    inside the 1s: (value + rank / N) / 2, the rank of each KV head in kvplan's order (score as written, then
    layer, then KV head). Every 0 stays below every 1, so kvpress streams the plan's 0s at its own share
    (config.json's sparsity), and at another share the lowest scores first instead of the ties numpy.argsort
    leaves to chance. A DuoAttention folder (its trained gates, no kvplan.json) is read as kvpress reads it.
    `shape`: the model's (layers, KV heads), checked against the plan's."""
    import numpy as np

    root = Path(folder)
    for name in (PLAN_FILE, CONFIG_FILE):
        if not (root / name).is_file():
            raise AttnscopeError(f"no {name} in {root}: a folder that `attnscope kvplan --out` wrote holds it")
    try:
        config = json.loads((root / CONFIG_FILE).read_text(encoding="utf-8"))
        pattern = np.clip(np.loadtxt(root / PLAN_FILE, dtype=float, delimiter="\t", ndmin=2), 0, 1)  # (L, H_kv)
        sink, recent = int(config["sink_size"]), int(config["recent_size"])
    except (ValueError, KeyError, TypeError) as error:
        raise AttnscopeError(f"{root} is not a plan that kvpress can read ({error})") from error
    if shape is not None and pattern.shape != tuple(shape):
        raise AttnscopeError(
            f"the plan in {root} is for {pattern.shape[0]} layers × {pattern.shape[1]} KV heads, the model has "
            f"{shape[0]} × {shape[1]}: a plan of another model"
        )
    if (root / DOCUMENT_FILE).is_file():
        pattern = (pattern + _ranks(json.loads((root / DOCUMENT_FILE).read_text(encoding="utf-8")), pattern)) / 2
    return sink, recent, pattern, config.get("sparsity")


def _ranks(document: dict, pattern: Any) -> Any:
    """(L, H_kv) each KV head's rank in kvplan's order (score, layer, KV head), divided by N: in [0, 1)."""
    import numpy as np

    heads = sorted(document["heads"], key=lambda head: (head["score"], head["layer"], head["kv_head"]))
    ranks = np.zeros_like(pattern)  # (L, H_kv)
    if len(heads) != pattern.size:
        raise AttnscopeError(f"kvplan.json lists {len(heads)} KV heads, {PLAN_FILE} {pattern.size}: not one plan")
    for rank, head in enumerate(heads):
        ranks[head["layer"], head["kv_head"]] = rank / pattern.size
    return ranks


@functools.cache
def press_class() -> type:
    """`PlanPress`, kvpress's `DuoAttentionPress` with `folder` and a `load_attention_pattern` that reads it."""
    try:
        from kvpress import DuoAttentionPress
    except ImportError as error:
        if importlib.util.find_spec("kvpress") is None:
            raise AttnscopeError(f"kvpress is not installed: {INSTALL}") from error
        raise AttnscopeError(f"kvpress is installed but does not import ({error}): {INSTALL}") from error
    from dataclasses import dataclass

    @dataclass
    class PlanPress(DuoAttentionPress):
        """DuoAttentionPress with the plan of `folder` (attnscope kvplan --out) instead of a download."""

        folder: str = ""

        def load_attention_pattern(self, model: Any) -> tuple[int, int, Any]:
            shape = (model.config.num_hidden_layers, model.config.num_key_value_heads)
            sink, recent, pattern, _ = plan_pattern(self.folder, shape)
            return sink, recent, pattern

    PlanPress.__module__ = __name__
    PlanPress.__qualname__ = "PlanPress"
    return PlanPress


def plan_press(folder: str | Path, head_compression_ratio: float | None = None) -> Any:
    """A `DuoAttentionPress` (a `PlanPress`) that streams the KV heads of the plan in `folder`, with its sink and
    recent window. `head_compression_ratio`: the share of KV heads to stream, by default the plan's own
    (config.json's `sparsity`, which streams exactly its 0s)."""
    cls = press_class()
    _, _, _, sparsity = plan_pattern(folder)
    ratio = sparsity if head_compression_ratio is None else head_compression_ratio
    if ratio is None:
        raise AttnscopeError(f"{Path(folder) / CONFIG_FILE} gives no sparsity: pass head_compression_ratio=")
    if not 0 <= float(ratio) <= 1:
        raise AttnscopeError(f"head_compression_ratio {ratio} is not a share between 0 and 1")
    return cls(head_compression_ratio=float(ratio), folder=str(folder))
