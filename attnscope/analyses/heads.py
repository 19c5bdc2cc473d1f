"""`attnscope heads`: every head's scores over the texts, its role, the probes (repeated tokens, a needle in a
haystack) and the model's sink rate. The pass itself is `analyses.scoring`'s, which `circuit`, `compare` and
`report` share; its result, `HeadsResult`, is defined there."""

from __future__ import annotations

from collections.abc import Sequence

from attnscope import settings
from attnscope.analyses.common import Progress
from attnscope.analyses.scoring import HeadsResult, score_heads
from attnscope.models.loading import LoadedModel
from attnscope.pipeline.blocks import Reducer
from attnscope.pipeline.inputs import Text, Texts


class Heads(settings.Heads):
    """Every head's statistics over the texts and its role (the settings: attnscope.settings.Heads)."""

    def run(
        self,
        model: LoadedModel,
        texts: Texts | Sequence[Text],
        progress: Progress | None = None,
        also: Reducer | None = None,
    ) -> HeadsResult:
        """Every head's statistics over `texts` and its role; full maps of the plotted heads' layers. `also`: a
        reducer fed by the same capture of the texts (not the probe's), as `compare` feeds its spool."""
        return score_heads(model, texts, self, progress, also)
