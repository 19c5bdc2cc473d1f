"""The settings of the commands that take several models: `report` (one or several) and `compare`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape
from attnscope.settings.declare import (
    HEAD_SCORE,
    REVISIONS,
    SEVERAL,
    Settings,
    check_measured,
    optional_setting,
    setting,
)
from attnscope.settings.groups import DeviceMap, Kernel, Loading, Place, Scoring, top_setting

__all__ = ["Compare", "Report"]


REVISIONS_HELP = (
    "Several revisions of --model (one Hub repository), in order, each a model labelled by its revision (e.g. "
    "Pythia's checkpoints: step0,step512,step1000)."
)


@dataclass(frozen=True, kw_only=True)
class Report(Scoring, Loading, Settings):
    """`attnscope report`: one self-contained HTML page of every head, of one model or several."""

    models: ClassVar[str] = SEVERAL
    draws: ClassVar[bool] = False
    default_out: ClassVar[str | None] = "attnscope-report"

    revisions: Sequence[str] | str | None = setting(REVISIONS, None, REVISIONS_HELP, metavar="REV,REV,...")
    diversity: bool = setting(options.FLAG, True, "Include the diversity of all heads (one more pass).")
    ablate: bool = setting(
        options.FLAG,
        False,
        "Also remove each head in turn and measure the loss (as `ablate`; one pass per head).",
        negatable=False,
    )
    circuit: bool = setting(
        options.FLAG,
        False,
        "Also which heads each head depends on (as `attnscope circuit`): click a head to see "
        "them, marked in the role map. One model.",
        negatable=False,
    )

    @property
    def needs_lm_head(self) -> bool:
        return self.ablate

    # Under torchrun, one model's heads and diversity are shared by window, its circuit by removal, its ablation by
    # pass; several models are shared by model, each whole on one process (the last, with its diversity and
    # ablation, on the first).
    torchrun: ClassVar[bool] = True

    def check_models(self, count: int) -> None:
        if count > 1 and self.circuit:
            raise AttnscopeError(
                "circuit (--circuit) explains one model's heads: give one model (a page of several would need a "
                "circuit pass per model, and its arrows would belong to one of them)"
            )


@dataclass(frozen=True, kw_only=True)
class Compare(Scoring, Place, DeviceMap, Kernel, Settings):
    """`attnscope compare`: the heads of several models side by side (one revision for every model would set a
    model beside itself: compare takes --revisions, not --revision)."""

    models: ClassVar[str] = SEVERAL

    revisions: Sequence[str] | str | None = setting(REVISIONS, None, REVISIONS_HELP, metavar="REV,REV,...")
    divergence: bool | None = optional_setting(
        options.FLAG,
        "Measure how much each head's attention moved: the mean JS divergence (bits) "
        "between the two models' rows on the same tokens (default: on for two models; needs exactly two).",
    )
    loss: bool = setting(
        options.FLAG,
        True,
        "Also each model's language-model loss on the texts (nats per predicted token, as `ablate` measures it; "
        "loads each model's language-model head, where it has one).",
    )
    score: str | None = optional_setting(
        HEAD_SCORE,
        "The score drawn as heads × models (default: induction when the probe ran, else previous_token).",
        metavar="SCORE",
    )
    top: int | None = top_setting(
        "the heads ranked by divergence and the heads whose role changes, the most changed first (20 each on the "
        "terminal)"
    )

    def check_models(self, count: int) -> None:
        if count < 2:
            raise AttnscopeError(
                f"compare needs at least two models, {count} given: --model A --model B, or one --model with "
                "--revisions R1,R2"
            )
        if self.divergence and count != 2:
            raise AttnscopeError(f"divergence (--divergence) sets the maps of two models side by side; {count} given")

    def check_shape(self, shape: Shape) -> None:
        check_measured(self.score, shape.kind_name, self.probe)

    # Under torchrun the models are shared among the processes, each model whole on one (analyses.compare).
    torchrun: ClassVar[bool] = True
