"""Machine-readable output: JSON documents and CSV tables, written atomically.

Every JSON document has the same top-level shape (schema_version 1):

    {"schema_version": 1, "command": "heads", "attnscope_version": "...",
     "model": {...}, "input": {...}, "settings": {...}, "notes": [...], <command-specific keys>}

Floats are rounded to 6 decimals and keys keep a fixed order, so the same command gives byte-identical output.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from attnscope import __version__
from attnscope.errors import AttnscopeError

SCHEMA_VERSION = 1
DECIMALS = 6


def clean(value: Any) -> Any:
    """Round floats (NaN and infinities become null: JSON has no spelling for them), recursively."""
    if isinstance(value, float):
        return round(value, DECIMALS) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(item) for item in value]
    return value


def document(command: str, model: dict, inputs: dict, settings: dict, notes: Sequence[str], **body: Any) -> dict:
    return clean(
        {
            "schema_version": SCHEMA_VERSION,
            "command": command,
            "attnscope_version": __version__,
            "model": model,
            "input": inputs,
            "settings": settings,
            "notes": list(notes),
            **body,
        }
    )


def to_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def to_csv(records: Sequence[dict]) -> str:
    """One row per record, columns in the first record's key order."""
    buffer = io.StringIO()
    if records:
        writer = csv.DictWriter(buffer, fieldnames=list(records[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(clean(list(records)))
    return buffer.getvalue()


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first."""
    return [path for path in (folder, *folder.parents) if not path.exists()]


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders a run created (deepest first) as long as they are empty."""
    for made in folders:
        try:
            made.rmdir()
        except OSError:
            return


def prepare_out_dir(path: str | os.PathLike) -> Path:
    """Prove that `path` can be created and written to before any work is done, and leave the disk as it was: the
    folder is made when the files are written (`write_all`), so a run that fails leaves no empty folder behind."""
    folder = Path(path).expanduser()
    missing = _missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".attnscope-probe-"):
            pass
    except OSError as error:
        raise AttnscopeError(f"cannot write to --out {path}: {error.strerror or error}") from None
    finally:
        _remove_empty(missing)
    return folder


def write_all(folder: Path, write: Callable[[Path], Sequence[Path]]) -> list[Path]:
    """Run `write(stage)`, which writes its files into `stage`, a hidden folder inside `folder`, then move them
    all into `folder`. An error or Ctrl-C while writing leaves nothing behind (no file, no folder this created);
    the moves are renames on one file system, with Ctrl-C held back until the last is done, so the files land
    together. Returns the paths in `folder`."""
    import shutil
    import signal

    missing = _missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=folder, prefix=".attnscope-"))
    except OSError as error:
        _remove_empty(missing)
        raise AttnscopeError(f"cannot write to --out {folder}: {error.strerror or error}") from None
    landed = False
    try:
        written = list(write(stage))
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for path in written:
                os.replace(path, folder / path.name)
            landed = True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if not landed:
            _remove_empty(missing)
    return [folder / path.name for path in written]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write to a temporary name in the same folder, then rename: a reader never sees half a file."""
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if isinstance(data, bytes) else {"encoding": "utf-8", "newline": ""})) as file:
            file.write(data)
        os.chmod(temp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the permissions open() would
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def head_records(heads: Sequence[Any]) -> list[dict]:
    """One flat record per head (the `heads` list of the JSON and the rows of the CSV)."""
    return [
        {
            "layer": record.layer,
            "head": record.head,
            "label": record.label,
            "role": record.role.role,
            "role_metric": record.role.metric,
            "role_score": record.role.score,
            **record.scores,
        }
        for record in heads
    ]


def heads_document(result: Any, heads: Sequence[Any], settings: dict) -> dict:
    """The `heads` command's JSON: metadata, thresholds and one record per selected head."""
    return document(
        "heads",
        result.model,
        result.inputs,
        {"window": result.window, "thresholds": result.thresholds, **settings},
        result.notes,
        heads=head_records(heads),
    )


def diversity_document(result: Any, k: int) -> dict:
    """The `diversity` command's JSON: layer scores, ranked pairs, groups, clusters and the full matrices."""
    return document(
        "diversity",
        result.model,
        result.inputs,
        {"layer": "all" if result.layer is None else result.layer, "redundant": result.redundant,
         "cluster_at": result.cluster_at, "pairs": k, "js_unit": "bits (log base 2)"},
        result.notes,
        layer_scores={str(layer): score for layer, score in result.layer_scores.items()},
        most_redundant=result.ranked_pairs(k, most_similar=True),
        most_distinct=result.ranked_pairs(k, most_similar=False),
        redundant_groups=result.groups,
        clusters=result.clusters,
        labels=result.labels,
        order=[result.labels[i] for i in result.order],
        matrices={name: getattr(result, name).tolist() for name in ("cosine", "js", "js_distance")},
    )


def random_mha_document(rows: list[dict], settings: dict) -> dict:
    return document("diversity", {}, {}, {"random_mha": True, **settings}, [], random_mha=rows)


def attend_records(result: Any, k: int) -> list[dict]:
    """One flat record per head, layer.head order: the weight on the target (when one was given) and the head's `k`
    most attended tokens (position, token, weight)."""
    n_layer, n_head = result.rows.shape[:2]
    records = []
    for layer in range(n_layer):
        for head in range(n_head):
            record: dict[str, Any] = {"layer": layer, "head": head, "label": f"{layer}.{head}"}
            if result.to_weight is not None:
                record["to_weight"] = float(result.to_weight[layer, head])
            for rank, (position, weight) in enumerate(result.top_keys(layer, head, k), start=1):
                record[f"top{rank}_position"] = position
                record[f"top{rank}_token"] = result.tokens[position]
                record[f"top{rank}_weight"] = weight
            records.append(record)
    return records


def attend_document(result: Any, k: int, n_strongest: int, settings: dict) -> dict:
    """The `attend` command's JSON: the query token, the target, one record per head, the strongest heads and the
    full attention row of every head (`rows[layer][head][key]`)."""
    strongest = [f"{layer}.{head}" for layer, head in result.strongest(n_strongest)]
    return document(
        "attend",
        result.model,
        {"tokens": result.tokens, "n_tokens": len(result.tokens), "bos": result.bos},
        settings,
        result.notes,
        **{"from": {"token": result.tokens[result.from_position], "position": result.from_position}},
        to=None if result.to_token is None else {"token": result.to_token, "positions": result.to_positions},
        heads=attend_records(result, k),
        strongest=strongest,
        rows=result.rows.tolist(),
    )


def ablate_records(result: Any) -> list[dict]:
    """One flat record per head, layer.head order: importance, rank (1 = most important) and, with the loss method,
    the loss with the head removed."""
    rank = {lh: k for k, lh in enumerate(result.ranked(), start=1)}
    n_layer, n_head = result.importance.shape
    records = []
    for layer in range(n_layer):
        for head in range(n_head):
            record: dict[str, Any] = {"layer": layer, "head": head, "label": f"{layer}.{head}",
                                      "importance": float(result.importance[layer, head]), "rank": rank[(layer, head)]}
            if result.ablated_loss is not None:
                record["loss_without_head"] = float(result.ablated_loss[layer, head])
            records.append(record)
    return records


def ablate_document(result: Any, settings: dict) -> dict:
    """The `ablate` command's JSON: the baseline loss, one record per head and the pruning curve."""
    return document(
        "ablate",
        result.model,
        result.inputs,
        {**settings, "loss_unit": "nats per predicted token"},
        result.notes,
        baseline_loss=result.baseline_loss,
        heads=ablate_records(result),
        prune=result.prune,
    )
