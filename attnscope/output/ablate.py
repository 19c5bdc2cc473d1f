"""`attnscope ablate`, shown: every head's importance as JSON and CSV, the importance grid and the pruning curve as
pictures, the terminal's and notebook's grid and tables.

Reads an AblationResult (analyses.ablate) by duck typing: `model`, `inputs`, `settings` (`ablation`, `remove`),
`notes`, `method`, `baseline_loss`, `intact_loss`, `importance` (L, H), `ablated_loss`, `prune`, `ranked()`. Where no
head was scored (`--save` alone: `importance` None) the views show the losses and the notes, no head and no picture.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import result_document
from attnscope.output.views import TopView, fitted, model_shape, shown_rows, summary
from attnscope.scores.catalog import counted

SHOWN = 10  # the most important heads the terminal and a notebook list without --top


def _how(result: Any) -> str:
    """The method, and the ablation where one was recorded: `loss, mean ablation`."""
    ablation = result.settings.get("ablation")
    return result.method + (f", {ablation} ablation" if ablation else "")


def ablate_records(result: Any, ranked: bool = False) -> list[dict]:
    """One flat record per head, layer.head order (`ranked`: the most important first, the first --top): importance,
    rank (1 = most important) and, with the loss method, the loss with the head removed."""
    if result.importance is None:  # no head scored
        return []
    rank = {lh: k for k, lh in enumerate(result.ranked(), start=1)}
    n_layer, n_head = result.importance.shape
    records = []
    for layer in range(n_layer):
        for head in range(n_head):
            record: dict[str, Any] = {
                "layer": layer,
                "head": head,
                "label": f"{layer}.{head}",
                "importance": float(result.importance[layer, head]),
                "rank": rank[(layer, head)],
            }
            if result.ablated_loss is not None:
                record["loss_without_head"] = float(result.ablated_loss[layer, head])
            records.append(record)
    if ranked:
        records.sort(key=lambda record: record["rank"])
        records = records[: result.settings["top"]]
    return records


class AblateView(TopView):
    command = "ablate"
    columns = ("layer", "head", "label", "importance", "rank")  # the CSV's header where no head was scored

    def document(self, every: bool = False) -> dict:
        """The baseline loss (with `remove`, of the model without those heads; `intact_loss` the whole model's, else
        null), one record per head, the most important heads (the ranked list: the first --top, or all) and the
        pruning curve."""
        result = self.result
        top = None if every else result.settings["top"]
        return result_document(
            "ablate",
            result,
            baseline_loss=result.baseline_loss,
            intact_loss=getattr(result, "intact_loss", None),
            heads=ablate_records(result),
            most_important=[f"{layer}.{head}" for layer, head in result.ranked()[:top]],
            prune=result.prune,
        )

    def rows(self, every: bool) -> list[dict]:
        """--csv's rows: the heads, the most important first (the first --top); `every` (ablate.csv): every head,
        layer.head order."""
        return ablate_records(self.result, ranked=not every)

    def figures(self) -> dict[str, Any]:
        """importance (layer × head) and, with pruning, prune (the loss against the heads removed); none where no
        head was scored."""
        if self.result.importance is None:
            return {}
        drawn = {"importance": ablate_importance(self.result)}
        if self.result.prune:
            drawn["prune"] = prune_curve(self.result)
        return drawn

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        result = self.result
        unit = "loss increase (nats)" if result.method == "loss" else "|dL/d gate|"
        by_label = {record["label"]: record for record in ablate_records(result)}
        ranked = [by_label[f"{layer}.{head}"] for layer, head in result.ranked()[: shown_rows(result, SHOWN)]]
        shown = [
            f"baseline loss {result.baseline_loss:.4f} nats/token over {result.inputs['predicted_tokens']} predicted "
            "tokens" + (f"; {result.settings['ablation']} ablation" if result.settings.get("ablation") else ""),
        ]
        if result.importance is not None:
            shown.append(terminal.layer_head_grid(result.importance, f"Head importance, {unit}", unit_range=False))
            shown.append(terminal.records_table(ranked, f"Most important heads ({_how(result)})"))
        if result.prune:
            shown.append(terminal.records_table(result.prune, "Loss as the least important heads are removed"))
        return shown

    def notebook(self) -> str:
        result = self.result
        parts = [
            notebook.note_lines(self.notes),
            notebook.paragraph(
                f"baseline loss {result.baseline_loss:.4f} nats/token over {result.inputs['predicted_tokens']} "
                "predicted tokens"
            ),
        ]
        if result.importance is None:  # no head scored
            return notebook.fragment(*parts)
        unit = "loss increase (nats)" if result.method == "loss" else "|dL/d gate|"
        scale = max(float(abs(result.importance).max()), 1e-300)
        by_label = {record["label"]: record for record in ablate_records(result)}
        ranked = [by_label[f"{layer}.{head}"] for layer, head in result.ranked()[: shown_rows(result, SHOWN)]]
        parts += [
            notebook.layer_head_grid(
                result.importance.tolist(),
                f"Head importance, {unit}",
                scale,
                "loss_change" if result.method == "loss" else "score",  # as importance.png
            ),
            notebook.records_table(ranked, f"Most important heads ({_how(result)})"),
        ]
        if result.prune:
            parts.append(notebook.records_table(result.prune, "Loss as the least important heads are removed"))
        return notebook.fragment(*parts)

    def summary(self) -> str:
        """The model, the method and the tokens predicted, the baseline loss, the most important heads (the
        terminal's ranked table) and, with pruning, the loss once the last head is removed."""
        result = self.result
        inputs = result.inputs
        read = f" over {counted(inputs['n_texts'], 'text')}" if "n_texts" in inputs else ""
        read += f" ({counted(inputs['predicted_tokens'], 'predicted token')})" if "predicted_tokens" in inputs else ""
        ablation = f", {result.settings['ablation']} ablation" if result.settings.get("ablation") else ""
        headline = f"{model_shape(result.model)}; {result.method} method{ablation}{read}"
        if result.importance is None:  # no head scored: the losses
            intact = "" if result.intact_loss is None else f" ({result.intact_loss:.4f} with every head)"
            headline = f"{model_shape(result.model)}; no head scored{ablation}{read}"
            return summary(self, headline, [f"baseline loss {result.baseline_loss:.4f} nats/token{intact}"], [])
        if result.method == "loss":
            important = [f"{layer}.{head} {result.importance[layer, head]:+.3f}" for layer, head in result.ranked()]
            ranked = fitted("most important (loss change, nats): ", important)
        else:
            important = [f"{layer}.{head} {result.importance[layer, head]:.3g}" for layer, head in result.ranked()]
            ranked = fitted("most important (|dL/d gate|): ", important)
        lines = [f"baseline loss {result.baseline_loss:.4f} nats/token", ranked]
        if result.prune:
            last = result.prune[-1]
            lines.append(
                f"pruned the {counted(last['removed'], 'least important head')}: loss {last['loss']:.4f} "
                f"({last['loss'] - result.baseline_loss:+.4f}) in .prune"
            )
        return summary(self, headline, lines, [".ranked()", ".importance"])


# -------------------------------------------------------------------------------------------------------------- figures


def ablate_importance(result: Any) -> Any:
    """An AblationResult's importance per head: the loss change (signed, centred at 0: red where the loss rises
    without the head, blue where it falls; output.scales' loss_change) or |dL/d gate| (from 0)."""
    from attnscope.output import figures, head_grids

    subtitle = figures.describe_input(result.model, result.inputs)
    if result.method == "loss":
        label = "loss change (nats/token)"
        title = "Head importance: loss change when each head is removed"
        return head_grids.score_heatmap(
            result.importance, title, label, subtitle, vmin=None, vmax=None, signed=True, scale="loss_change"
        )
    label = "|dL/d gate| (nats/token per unit)"
    title = "Head importance: gradient of the loss by each head's gate"
    return head_grids.score_heatmap(result.importance, title, label, subtitle, vmin=0.0, vmax=None)


def prune_curve(result: Any) -> Any:
    """An AblationResult's pruning: the loss increase over the full model as the least important heads go."""
    from attnscope.output import figures, line_plots

    removed = [0] + [step["removed"] for step in result.prune]
    increase = [0.0] + [step["loss"] - result.baseline_loss for step in result.prune]
    subtitle = (
        f"{figures.describe_input(result.model, result.inputs)}; full model {result.baseline_loss:.3f} nats/token"
    )
    return line_plots.line_plot(
        removed,
        {"loss increase": increase},
        "heads removed (least important first)",
        "loss increase over the full model (nats/token)",
        "Loss as heads are pruned",
        subtitle,
    )
