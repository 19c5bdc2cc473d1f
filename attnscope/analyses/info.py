"""`attnscope info`: the model's shape and size, from the loaded model (see `LoadedModel.info`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnscope.analyses.result import Result
from attnscope.models.loading import LoadedModel


@dataclass
class InfoResult(Result):
    model: dict[str, Any]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Info:
    def run(self, model: LoadedModel, texts: Any = None, progress: Any = None) -> InfoResult:
        return InfoResult(model.info())
