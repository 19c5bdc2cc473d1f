"""`attnscope info`: the model's shape and size, from its config.json alone (see `facts.model_facts`), or from a
model already loaded (`LoadedModel.info`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnscope import options
from attnscope.analyses.result import Result
from attnscope.models.facts import model_facts
from attnscope.models.loading import LoadedModel


@dataclass(repr=False)  # the repr is Result's: a summary
class InfoResult(Result):
    model: dict[str, Any]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Info:
    """The facts of model `name` as `load_model(name, device, dtype, revision=revision)` would load it."""

    name: str
    device: str = "auto"
    dtype: str = "auto"
    revision: str | None = None

    def __post_init__(self) -> None:
        options.check_text(self.name, "model")
        options.check_text(self.device, "device")
        options.check_fields(self, {"dtype": options.DTYPE})
        options.check_text(self.revision, "revision", optional=True)

    def run(self, model: LoadedModel | None = None, texts: Any = None, progress: Any = None) -> InfoResult:
        """The facts of `model` when one is given (loaded already), else read from the config of `name`."""
        if model is not None:
            return InfoResult(model.info())
        return InfoResult(model_facts(self.name, self.device, self.dtype, self.revision))
