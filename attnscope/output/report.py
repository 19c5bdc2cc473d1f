"""`attnscope report`, shown: one self-contained HTML page to explore a model's heads, offline; its JSON (the heads,
diversity and ablation documents side by side); in a notebook, the heads' and diversity's fragments.

Rendering only (the analysis is done by `analyses.report`). The page is static HTML (the role map, the tables, the
inputs, the glossary: readable without scripts) plus one inline script, `output/viewer.js`, that draws every map in
the browser from the data embedded as JSON (`<script type="application/json" id="attnscope-data">`: the `heads`
document of `--json`, the `diversity` document without its matrices, the `ablation` document, and the viewer's
data: every head's maps on the texts shown, quantised, and the diversity matrices, see `output.viewer`). No picture,
font, style sheet or script is fetched, and nothing is evaluated: the page reads the same from `file://` with no
network.

Several models (`report --model A --model B`): the page gets a slider over the models (labelled) that redraws the role
map, the examples and the head panel for the model chosen, the selected head staying selected; it opens on the last
model (`primary`: for a training run, the trained one), whose tables, diversity and ablation the page holds; the
viewer's data then carries each model's records and maps (`models`, see `report_viewer`). With `--circuit`, the
records of `attnscope circuit` (`dependencies`) travel in the page, and clicking a head lists what it depends on and
what depends on it, and marks those heads in the role map (its arrows pass under the cells' labels).

Reads a ReportResult (analyses.report) by duck typing: `heads` (a HeadsResult), `diversity`, `ablation`, `model`,
`notes`, `texts` (each: name, kind, ids, labels, maps (L, H, n, n), length, cut), `examples`, `characteristic`,
`top_per_role`, `linkage`, `map_notes`, `token_cap`, `models` (each: label, heads, characteristic, texts; empty for
one model), `dependencies` (None without --circuit).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.output import notebook, viewer
from attnscope.output.ablate import AblateView
from attnscope.output.diversity import DiversityView, diversity_document
from attnscope.output.documents import document
from attnscope.output.heads import HeadsView, head_records, heads_document, role_lines
from attnscope.output.report_page import render, several_models
from attnscope.output.scales import SCALES
from attnscope.output.views import View, fitted, inputs_read, model_shape, picture_paths, summary
from attnscope.scores.catalog import counted
from attnscope.scores.words import CONTINUED_LEGEND


class ReportView(View):
    command = "report"
    names_files = True

    def document(self) -> dict:
        """The `heads` and `diversity` documents of `--json` (every head), side by side, and with `--ablate` the
        `ablate` document (loss method) as `ablation`."""
        result = self.result
        heads = result.heads
        several = several_models(result)
        return document(
            "report",
            heads.model,
            heads.inputs,
            {
                "diversity": result.diversity is not None,
                "ablate": result.ablation is not None,
                "circuit": result.dependencies is not None,
            },
            result.notes,
            heads=heads_document(heads, heads.heads),
            diversity=None if result.diversity is None else diversity_document(result.diversity),
            ablation=None if result.ablation is None else AblateView(result.ablation).document(),
            models=[page.label for page in several] if several else None,
            by_model=[heads_document(page.heads, page.heads.heads) for page in several] if several else None,
            dependencies=result.dependencies,
        )

    def records(self) -> list[dict]:
        """One row per head; with several models, one per head and model (long form, `model` first)."""
        several = several_models(self.result)
        if not several:
            return head_records(self.result.heads.heads, self.result.heads.model)
        return [
            {"model": page.label, **row} for page in several for row in head_records(page.heads.heads, page.heads.model)
        ]

    def files(self, stage: Path) -> list[Path]:
        """report.html: one self-contained page."""
        doc = self.document()
        page = render(self.result, doc["heads"], doc["diversity"], doc["ablation"], report_viewer(self.result))
        return [self.write(stage, "report.html", page)]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        return picture_paths(written)

    def notebook(self) -> str:
        """The heads' fragment and, when computed, the diversity's."""
        result = self.result
        parts = [HeadsView(page.heads).notebook() for page in several_models(result)] or [
            HeadsView(result.heads).notebook()
        ]
        if result.diversity is not None:
            parts.append(DiversityView(result.diversity).notebook())
        return notebook.fragment(*parts)

    def summary(self) -> str:
        """The model (or the models), what was read, the heads per role and the characteristic heads (the last
        model's), the passes the page holds besides the heads, and the texts it draws. Each nested result
        (`.heads`, `.diversity`, `.ablation`) has its own summary."""
        result = self.result
        heads, several = result.heads, several_models(result)
        if several:
            labels = fitted("", [page.label for page in several], ", ", 40)
            shape = model_shape({**heads.model, "name": None})
            headline = f"of {counted(len(several), 'model')} ({labels}): {shape} each{inputs_read(heads.inputs)}"
        else:
            headline = f"{model_shape(heads.model)}{inputs_read(heads.inputs)}"
        first = f" in {several[-1].label}" if several else ""
        characteristic = [f"{record.label} {record.role.role}" for record in result.characteristic]
        lines = [
            role_lines(heads.heads)[0].replace("roles: ", f"roles{first}: ", 1),
            fitted("characteristic heads: ", characteristic),
        ]
        passes, more = [], [".heads", *([".models"] if several else [])]
        if result.diversity is not None:
            passes.append(f"diversity ({counted(len(result.diversity.clusters), 'cluster')})")
            more.append(".diversity")
        if result.ablation is not None:
            passes.append(f"ablation (baseline loss {result.ablation.baseline_loss:.4f})")
            more.append(".ablation")
        if result.dependencies is not None:
            passes.append(f"circuit ({counted(len(result.dependencies), 'dependency', 'dependencies')})")
            more.append(".dependencies")
        lines.append(fitted("with: ", passes) or "with the heads alone (no diversity, ablation or circuit)")
        lines.append(
            f"the page draws every head on {counted(len(result.texts), 'text')} (at most "
            f"{counted(result.token_cap, 'token')} each): .save(dir) writes report.html"
        )
        more.append(".top_per_role")
        return summary(self, headline, lines, more)


# ----------------------------------------------------------------------------------------------- the page's viewer data


def report_viewer(result: Any) -> dict[str, Any]:
    """What the report page's viewer reads beside the heads, diversity and ablation documents: every head's maps
    on the texts shown, which text each role is shown on first, the diversity matrices and their dendrogram."""
    model = result.model
    causal = model["kind"] == "decoder"
    heads = result.heads
    data: dict[str, Any] = {
        "format": viewer.FORMAT,
        "mode": "report",
        "causal": causal,
        "layer_ids": list(range(model["n_layer"])),
        "head_ids": list(range(model["n_head"])),
        "texts": [viewer.text_entry(t.name, t.kind, t.labels, t.maps, causal, t.length) for t in result.texts],
        "examples": result.examples,
        "characteristic": [record.label for record in result.characteristic],
        "continued_legend": CONTINUED_LEGEND,
        **viewer.catalog_entries(model["kind"], heads.settings["thresholds"]),
        "map_notes": list(result.map_notes),
        "scales": {name: scale.as_data() for name, scale in SCALES.items()},  # the pictures' colours (output.scales)
    }
    several = several_models(result)
    if several:  # each model's records and characteristic heads; its maps on the same texts (the last's: `texts`)
        primary = len(several) - 1  # the model the page opens on, whose tables, diversity and ablation it holds
        data["primary"] = primary
        data["models"] = [
            {
                "label": page.label,
                "name": page.heads.model["name"],
                "heads": heads_document(page.heads, page.heads.heads)["heads"],  # as the page's `heads`: rounded
                "characteristic": [record.label for record in page.characteristic],
                "maps": None if k == primary else [_maps_entry(text, causal) for text in page.texts],
            }
            for k, page in enumerate(several)
        ]
    if result.dependencies is not None:
        data["dependencies"] = list(result.dependencies)
    diversity = result.diversity
    if diversity is not None:
        data["matrices"] = {"js": viewer.encode_matrix(diversity.js), "cosine": viewer.encode_matrix(diversity.cosine)}
        data["order"] = [int(k) for k in diversity.order]
        data["linkage"] = [
            [int(a), int(b), round(float(height), 6), int(size)] for a, b, height, size in np.asarray(result.linkage)
        ]
    return data


def _maps_entry(text: Any, causal: bool) -> dict[str, Any]:
    """A text's maps of one more model: `maps` and `scale` encoded as a text entry's (output.viewer)."""
    data, scales = viewer.encode_maps(text.maps, causal)
    return {"scale": scales.tolist(), "maps": viewer.base64_text(data)}
