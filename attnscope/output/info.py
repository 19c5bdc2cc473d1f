"""`attnscope info`, shown: the model's facts as JSON, one CSV row, a terminal table and a notebook table, each with
what the attention of each layer is (equal layers grouped: `attention_lines`).

Reads an InfoResult (analyses.info) by duck typing: `model` (models.facts.model_facts), `layers`
(models.families.AttentionTraits.layers), `notes`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from attnscope.output import notebook
from attnscope.output.documents import document
from attnscope.output.views import View, model_shape, summary
from attnscope.scores.catalog import counted


class InfoView(View):
    command = "info"

    @property
    def attention(self) -> list[str]:
        return attention_lines(self.result.layers, self.result.model.get("kind", "decoder"))

    def document(self) -> dict:
        return document("info", self.result.model, {}, {}, self.result.notes, layers=self.result.layers)

    def records(self) -> list[dict]:
        return [{**self.result.model, "attention": " | ".join(self.attention)}]

    def terminal(self, written: Sequence[Path]) -> list[Any]:
        from attnscope.output import terminal

        facts = self.result.model
        formula = facts["attention_params_formula"]
        if facts["attention_params"] == formula:
            attention = f"{facts['attention_params']:,} (W_Q, W_K, W_V, W_O and any biases)"
        else:  # what W_Q, W_K, W_V, W_O leave out: QK-norms, sinks
            attention = f"{facts['attention_params']:,} (W_Q, W_K, W_V, W_O and any biases: {formula:,})"
        rows = [
            ("model", facts["name"]),
            ("family", f"{facts['family']} ({facts['model_type']}), {facts['kind']}"),
            ("layers", str(facts["n_layer"])),
            ("heads per layer", str(facts["n_head"]) + _shared(facts)),
            *([("attention", "\n".join(self.attention))] if self.result.layers else []),
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
        attention = [("attention" if number == 0 else "", line) for number, line in enumerate(self.attention)]
        rows = [
            [notebook.cell(key, "text-align:left;font-weight:bold"), notebook.cell(value)]
            for key, value in [*self.result.model.items(), *attention]
        ]
        return notebook.fragment(notebook.table(["what", "value"], rows, "Model"))

    def summary(self) -> str:
        """The model's name and shape, each layer's attention, family, widths, context, size, device and number
        format."""
        facts = self.result.model
        lines = [
            *self.attention,
            f"{facts.get('family')} ({facts.get('model_type')}), {facts.get('kind')}; d_model {facts.get('d_model')}, "
            f"d_head {facts.get('d_head')}; context {counted(facts.get('n_ctx', 0), 'token')}",
            f"{facts.get('n_params', 0):,} parameters (without the language-model head); "
            f"{facts.get('device')}, {facts.get('dtype')}",
        ]
        more = [".model", ".layers"] if self.result.layers else [".model"]
        return summary(self, model_shape(facts) + _shared(facts), lines, more)


def _shared(facts: dict) -> str:
    """` (sharing 8 key/value heads, 4 query heads each)` with grouped- or multi-query attention, else ``."""
    heads, kv_heads = facts.get("n_head"), facts.get("n_kv_head", facts.get("n_head"))
    if not heads or not kv_heads or kv_heads == heads:
        return ""
    return f" (sharing {counted(kv_heads, 'key/value head')}, {counted(heads // kv_heads, 'query head')} each)"


def attention_lines(layers: Sequence[dict], kind: str) -> list[str]:
    """What the attention of each layer is, equal layers grouped: which keys a query sees (full or a sliding window;
    always said), then soft-capping, QK-norm and learned sinks where some layer has them, one line per group:

        layers 0-4, 6-10: sliding window of 4,096 tokens
        layers 5, 11: full causal attention
        every layer: logits soft-capped at ±50

    A model with none of it gets one line: `every layer: full causal attention` (an encoder's: bidirectional)."""

    def keys_seen(record: dict) -> str:
        if record["attention"] == "sliding":
            return f"sliding window of {'±' if kind == 'encoder' else ''}{record['window']:,} tokens"
        return "full bidirectional attention" if kind == "encoder" else "full causal attention"

    def soft_cap(record: dict) -> str:
        return "" if record["softcap"] is None else f"logits soft-capped at ±{record['softcap']:g}"

    def qk_norm(record: dict) -> str:
        return "QK-norm (queries and keys normalised)" if record["qk_norm"] else ""

    def sinks(record: dict) -> str:
        return "a learned attention sink per head" if record["sinks"] else ""

    return [line for words in (keys_seen, soft_cap, qk_norm, sinks) for line in _grouped(layers, words)]


def _grouped(layers: Sequence[dict], words: Callable[[dict], str]) -> list[str]:
    """[`every layer: W`] where every layer has the same words W, else `layers 0, 2: W`, `layer 1: V`, … for the
    layers whose words are not empty, in order of first appearance; [] where no layer has any."""
    groups: dict[str, list[int]] = {}
    for record in layers:
        said = words(record)
        if said:
            groups.setdefault(said, []).append(record["layer"])
    if len(groups) == 1 and len(next(iter(groups.values()))) == len(layers):
        return [f"every layer: {next(iter(groups))}"]
    return [f"{layer_numbers(numbers)}: {said}" for said, numbers in groups.items()]


def layer_numbers(numbers: Sequence[int]) -> str:
    """`layer 5`, `layers 0-4, 6-10, 12`, or `layers 1, 3, …, 25` (four or more layers an even step apart)."""
    if len(numbers) == 1:
        return f"layer {numbers[0]}"
    steps = {later - earlier for earlier, later in zip(numbers, numbers[1:], strict=False)}
    if len(numbers) >= 4 and len(steps) == 1 and steps != {1}:
        return f"layers {numbers[0]}, {numbers[1]}, …, {numbers[-1]}"
    runs: list[list[int]] = []  # [first, last] of each run of consecutive layers
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    shown = [
        str(first) if first == last else f"{first}{'-' if last > first + 1 else ', '}{last}" for first, last in runs
    ]
    return "layers " + ", ".join(shown)
