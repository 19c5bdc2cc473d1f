"""`attnscope info`, shown: the model's facts as JSON, one CSV row, a terminal table and a notebook table.

Reads an InfoResult (analyses.info) by duck typing: `model` (models.facts.model_facts), `notes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import document
from attnscope.output.views import View, model_shape, summary
from attnscope.scores.catalog import counted


class InfoView(View):
    command = "info"

    def document(self) -> dict:
        return document("info", self.result.model, {}, {}, self.result.notes)

    def records(self) -> list[dict]:
        return [self.result.model]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        facts = self.result.model
        heads = str(facts["n_head"])
        if facts["n_kv_head"] != facts["n_head"]:  # grouped- or multi-query attention
            heads += f" (sharing {counted(facts['n_kv_head'], 'key/value head')})"
        formula = facts["attention_params_formula"]
        if facts["attention_params"] == formula:
            attention = f"{facts['attention_params']:,} (W_Q, W_K, W_V, W_O and any biases)"
        else:  # what W_Q, W_K, W_V, W_O leave out: QK-norms, sinks
            attention = f"{facts['attention_params']:,} (W_Q, W_K, W_V, W_O and any biases: {formula:,})"
        rows = [
            ("model", facts["name"]),
            ("family", f"{facts['family']} ({facts['model_type']}), {facts['kind']}"),
            ("layers", str(facts["n_layer"])),
            ("heads per layer", heads),
            ("width (d_model)", str(facts["d_model"])),
            ("head width (d_head)", str(facts["d_head"])),
            ("context", counted(facts["n_ctx"], "token")),
            ("vocabulary", counted(facts["vocab_size"], "token")),
            ("parameters", f"{facts['n_params']:,} (without the language-model head)"),
            ("attention per layer", attention),
            ("device", facts["device"]),
            ("dtype", facts["dtype"]),
        ]
        return [terminal.key_value_table(rows, "Model")]

    def notebook(self) -> str:
        rows = [
            [notebook.cell(key, "text-align:left;font-weight:bold"), notebook.cell(value)]
            for key, value in self.result.model.items()
        ]
        return notebook.fragment(notebook.table(["what", "value"], rows, "Model"))

    def summary(self) -> str:
        """The model's name and shape, family, widths, context, size, device and number format."""
        facts = self.result.model
        heads = ""
        if facts.get("n_kv_head", facts.get("n_head")) != facts.get("n_head"):  # grouped- or multi-query attention
            heads = f" (sharing {counted(facts['n_kv_head'], 'key/value head')})"
        lines = [
            f"{facts.get('family')} ({facts.get('model_type')}), {facts.get('kind')}; d_model {facts.get('d_model')}, "
            f"d_head {facts.get('d_head')}; context {counted(facts.get('n_ctx', 0), 'token')}",
            f"{facts.get('n_params', 0):,} parameters (without the language-model head); "
            f"{facts.get('device')}, {facts.get('dtype')}",
        ]
        return summary(self, model_shape(facts) + heads, lines, [".model"])
