"""`attnscope random-mha`, shown: the JSON and rows of the untrained layer's diversity by number of heads, its
picture, and the terminal's and notebook's table.

Reads a RandomMhaResult (analyses.random_mha) by duck typing: `settings` (d_model, seq_len, trials), `rows` (one per
head count: heads, js, js_distance, cosine, entropy_normalized), `notes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import document, to_json
from attnscope.output.views import View, fitted, summary
from attnscope.scores.catalog import counted


class RandomMhaView(View):
    command = "random-mha"

    def document(self) -> dict:
        return document("random-mha", {}, {}, self.result.settings, self.result.notes, results=self.result.rows)

    def records(self) -> list[dict]:
        return self.result.rows

    def data_files(self, stage: Path) -> list[Path]:
        return [self.write(stage, "random_mha.json", to_json(self.document()))]

    def figures(self) -> dict[str, Any]:
        """random_mha: each measure against the number of heads."""
        return {"random_mha": random_mha_figure(self.result)}

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        s = self.result.settings
        title = (
            f"Random multi-head attention (d_model {s['d_model']}, {counted(s['seq_len'], 'token')}, "
            f"{counted(s['trials'], 'trial')}): "
            "diversity by heads"
        )
        return [terminal.records_table(self.result.rows, title)]

    def notebook(self) -> str:
        return notebook.fragment(
            notebook.note_lines(self.notes),
            notebook.records_table(self.records(), "Random multi-head attention: diversity by heads"),
        )

    def summary(self) -> str:
        """The untrained layer's settings, and the mean JS divergence and cosine between its heads by their number
        (as the terminal's table)."""
        s, rows = self.result.settings, self.result.rows
        headline = (
            f"untrained layer, d_model {s.get('d_model')}, {counted(s.get('seq_len', 0), 'token')}, "
            f"{counted(s.get('trials', 0), 'trial')}, seed {s.get('seed')}"
        )

        def by_heads(key: str) -> list[str]:
            return [f"{row['heads']} {'-' if row[key] is None else format(row[key], '.3f')}" for row in rows]

        lines = [
            fitted("JS divergence between heads (bits), by heads: ", by_heads("js")),
            fitted("cosine between heads, by heads: ", by_heads("cosine")),
        ]
        return summary(self, headline, lines, [".rows"])


# -------------------------------------------------------------------------------------------------------------- figures


RANDOM_MHA_SERIES = {  # a row's key -> its line's name
    "js": "JS divergence between heads (bits)",
    "js_distance": "JS distance between heads (√bits)",
    "cosine": "cosine similarity between heads",
    "entropy_normalized": "normalised entropy of the rows",
}


def random_mha_figure(result: Any) -> Any:
    """A RandomMhaResult: each measure (all in [0, 1]) against the number of heads."""
    from attnscope.output import line_plots

    rows, settings = result.rows, result.settings
    heads = [row["heads"] for row in rows]
    series = {label: [row[key] for row in rows] for key, label in RANDOM_MHA_SERIES.items()}
    subtitle = (
        f"random weights and inputs: d_model {settings['d_model']}, {settings['seq_len']} tokens, "
        f"{settings['trials']} trials"
    )
    title = "Diversity of an untrained attention layer's heads, by their number"
    return line_plots.line_plot(
        heads, series, "heads (d_head = d_model / heads)", "mean (0 to 1)", title, subtitle, log_x=True, y_top=1.0
    )
