"""`attnscope patch`, shown: every head's restored and removed shares as JSON and CSV, the two layer × head grids as
pictures (a diverging scale centred at 0: output.scales' logit_diff_share), the terminal's and notebook's grids and
the table of the heads that restore the most.

Reads a PatchResult (analyses.patch) by duck typing: `model`, `inputs`, `settings`, `notes`, `pairs`,
`clean_logit_diff`, `corrupt_logit_diff`, `restored` (L, H), `removed` (L, H), `ranked()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import result_document
from attnscope.output.views import TopView, fitted, model_shape, shown_rows, summary
from attnscope.scores.catalog import counted

SHOWN = 10  # the heads that restore the most, listed on the terminal and in a notebook without --top
METRIC = "logit difference: logit(answer) − logit(wrong) at the last position, in logits"
COMBINED = "ratio of sums over pairs: Σ(patched − baseline) / Σ(clean − corrupted)"
SCALE = "logit_diff_share"
DIRECTIONS = {  # the share -> (what it is, in words; the picture's title)
    "restored": (
        "share of the logit difference restored",
        "Activation patching: each head's clean output into the corrupted run (denoising)",
    ),
    "removed": (
        "share of the logit difference removed",
        "Activation patching: each head's corrupted output into the clean run (noising)",
    ),
}


def patch_records(result: Any, every: bool = False) -> list[dict]:
    """One record per head, the largest restored share first (the first --top unless `every`): label, layer, head,
    restored, removed and rank (1 = restores the most)."""
    records = [
        {
            "label": f"{layer}.{head}",
            "layer": layer,
            "head": head,
            "restored": float(result.restored[layer, head]),
            "removed": float(result.removed[layer, head]),
            "rank": rank,
        }
        for rank, (layer, head) in enumerate(result.ranked(), start=1)
    ]
    return records if every else records[: result.settings["top"]]


def baselines(result: Any, brief: bool = False) -> str:
    """The baseline logit differences in one line, with the tokens of a single pair (`brief`: a summary's line)."""
    pairs = result.pairs
    tokens = f" ({pairs[0]['answer']!r} − {pairs[0]['wrong']!r})" if len(pairs) == 1 else ""
    mean = "" if len(pairs) == 1 else f", mean over {counted(len(pairs), 'pair')}"
    clean, corrupt = result.clean_logit_diff, result.corrupt_logit_diff
    if brief:
        return f"logit difference{tokens}: clean {clean:.3f}, corrupted {corrupt:.3f}"
    return (
        f"logit difference{tokens} at the last position{mean}: clean {clean:.3f}, corrupted {corrupt:.3f}; "
        f"difference {clean - corrupt:.3f} logits"
    )


class PatchView(TopView):
    command = "patch"

    def document(self, every: bool = False) -> dict:
        """The metric, the baseline logit differences (means over pairs), every pair, and the heads (the first
        --top, or all), the largest restored share first."""
        result = self.result
        return result_document(
            "patch",
            result,
            metric=METRIC,
            combined=COMBINED,
            clean_logit_diff=result.clean_logit_diff,
            corrupt_logit_diff=result.corrupt_logit_diff,
            pairs=result.pairs,
            heads=patch_records(result, every),
        )

    def rows(self, every: bool) -> list[dict]:
        """--csv's rows: the heads, the largest restored share first (the first --top, or all)."""
        return patch_records(self.result, every=every)

    def figures(self) -> dict[str, Any]:
        """restored and removed: layer × head grids of the shares."""
        return {name: share_grid(self.result, name) for name in DIRECTIONS}

    def _ranked(self) -> list[dict]:
        """The rows of the terminal's and the notebook's table: label, restored, removed, rank."""
        shown = patch_records(self.result, every=True)[: shown_rows(self.result, SHOWN)]
        return [{key: record[key] for key in ("label", "restored", "removed", "rank")} for record in shown]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result = self.result
        return [
            baselines(result),
            *(
                terminal.layer_head_grid(
                    getattr(result, name), f"{what.capitalize()}, % (100 = all of it)", percent=True
                )
                for name, (what, _) in DIRECTIONS.items()
            ),
            terminal.records_table(self._ranked(), "Heads that restore the most"),
        ]

    def notebook(self) -> str:
        result = self.result
        grids = [
            notebook.layer_head_grid(
                getattr(result, name).tolist(),
                f"{what.capitalize()} (1 = all of it)",
                max(1.0, float(abs(getattr(result, name)).max())),
                SCALE,
            )
            for name, (what, _) in DIRECTIONS.items()
        ]
        return notebook.fragment(
            notebook.note_lines(self.notes),
            notebook.paragraph(baselines(result)),
            *grids,
            notebook.records_table(self._ranked(), "Heads that restore the most"),
        )

    def summary(self) -> str:
        """The model and the pairs, the baseline logit differences, the heads that restore the most."""
        result = self.result
        headline = f"{model_shape(result.model)}; {counted(len(result.pairs), 'pair')}"
        ranked = [
            f"{layer}.{head} {result.restored[layer, head]:.2f}/{result.removed[layer, head]:.2f}"
            for layer, head in result.ranked()
        ]
        lines = [baselines(result, brief=True), fitted("restore the most (restored/removed): ", ranked)]
        return summary(self, headline, lines, [".ranked()", ".restored", ".removed", ".pairs"])


# -------------------------------------------------------------------------------------------------------------- figures


def share_grid(result: Any, name: str) -> Any:
    """A PatchResult's `restored` or `removed` share per head, on a diverging scale centred at 0 whose ends are ± the
    largest magnitude, at least 1 (red: a share of the difference; blue: the other way)."""
    from attnscope.output import head_grids

    what, title = DIRECTIONS[name]
    subtitle = (
        f"{result.model.get('name', '')}, {counted(len(result.pairs), 'pair')}; logit difference clean "
        f"{result.clean_logit_diff:.2f}, corrupted {result.corrupt_logit_diff:.2f}"
    )
    label = f"{what} (1 = all)"
    return head_grids.score_heatmap(
        getattr(result, name), title, label, subtitle, vmin=None, vmax=1.0, signed=True, scale=SCALE
    )
