"""`attnscope report`: the heads analysis, the maps of the head that fills each role best, and the diversity of all
heads, for one page (rendered by `output.html`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attnscope.analyses.common import Progress, check_index
from attnscope.analyses.diversity import Diversity, DiversityResult
from attnscope.analyses.heads import HeadRecord, Heads, HeadsResult
from attnscope.analyses.maps import attention_maps
from attnscope.analyses.result import Result
from attnscope.models.loading import LoadedModel
from attnscope.pipeline.inputs import Text, Texts
from attnscope.scores.catalog import ROLES

TOP_PER_ROLE = 3
MAX_MAPS = 8
PAIRS = 5  # most redundant and most distinct pairs listed


def characteristic_heads(heads: Sequence[HeadRecord]) -> list[HeadRecord]:
    """Per role (mixed excluded), the head of that role with the highest deciding score, in role order."""
    chosen = []
    for role in ROLES:
        members = [record for record in heads if record.role.role == role.name and role.score is not None]
        if members:
            chosen.append(max(members, key=lambda record: (record.role.score, -record.layer, -record.head)))
    return chosen[:MAX_MAPS]


def top_heads_per_role(heads: Sequence[HeadRecord], k: int = TOP_PER_ROLE) -> dict[str, list[HeadRecord]]:
    """role -> the k heads with the highest score of that role's rule, whatever role they were given (ties in
    layer.head order); roles whose score was not measured (the probe's, with the probe off) are left out."""
    table = {}
    for role in ROLES:
        if role.score is None or not heads or heads[0].scores.get(role.score) is None:
            continue
        table[role.name] = sorted(heads, key=lambda record: (-record.scores[role.score], record.layer, record.head))[:k]
    return table


@dataclass
class ReportResult(Result):
    heads: HeadsResult  # its `attention` holds the maps of the characteristic heads' layers, first text
    diversity: DiversityResult | None  # None with the diversity pass off
    characteristic: list[HeadRecord]
    top_per_role: dict[str, list[HeadRecord]]
    notes: list[str] = field(default_factory=list)

    @property
    def model(self) -> dict[str, Any]:
        return self.heads.model


@dataclass(frozen=True)
class Report:
    """Everything the report page shows: `heads` (its settings: window, thresholds, probe, batching) and, with
    `diversity`, one more pass for the diversity of all heads."""

    heads: Heads = field(default_factory=Heads)
    diversity: bool = True

    def run(self, model: LoadedModel, texts: Texts | Sequence[Text], progress: Progress | None = None) -> ReportResult:
        heads = self.heads.run(model, texts, progress)
        characteristic = characteristic_heads(heads.heads)
        layers = sorted({record.layer for record in characteristic})
        heads.attention, _ = attention_maps(model, check_index(0, texts), layers, self.heads.bos)
        diversity = None
        if self.diversity:
            settings = Diversity(None, self.heads.bos, self.heads.batch_size, self.heads.max_tokens, top=PAIRS)
            diversity = settings.run(model, texts, progress)
        return ReportResult(heads, diversity, characteristic, top_heads_per_role(heads.heads), list(heads.notes))
