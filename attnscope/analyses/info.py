"""`attnscope info`: the model's shape and size, and each layer's attention, from its config.json alone (see
`facts.facts_and_layers`), or from a model already loaded (`LoadedModel.info`, `LoadedModel.attention_layers`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnscope import settings
from attnscope.analyses.result import Result
from attnscope.models.facts import facts_and_layers
from attnscope.models.loading import LoadedModel
from attnscope.output.info import InfoView


@dataclass(repr=False)  # the repr is Result's: a summary
class InfoResult(Result):
    view_class = InfoView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    model: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    # one record per layer of what its attention computes (models.families.AttentionTraits.layers)
    layers: list[dict[str, Any]] = field(default_factory=list)


class Info(settings.Info):
    """The facts of a model: of one loaded already, or of one named, as `load` would load it (read from its config
    alone: no weights are loaded or downloaded)."""

    def run(self, model: LoadedModel | str, status: Any = None) -> InfoResult:
        if isinstance(model, LoadedModel):
            return InfoResult(model.info(), layers=model.attention_layers())
        facts, layers = facts_and_layers(model, self.device, self.dtype, self.revision)
        return InfoResult(facts, layers=layers)
