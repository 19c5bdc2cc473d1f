"""The settings of the commands that remove or patch heads and edges: `ablate`, `circuit`, `patch`, `discover`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from attnscope import options
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape
from attnscope.models.removal import check_destination
from attnscope.scores import catalog
from attnscope.scores.catalog import counted
from attnscope.scores.faithfulness import MIB_PERCENTS as MIB_BUDGETS
from attnscope.settings.declare import FILE, HEAD_SCORE, Settings, check_measured, optional_setting, setting
from attnscope.settings.groups import (
    Batching,
    DeviceMap,
    Loading,
    Place,
    Reading,
    Removal,
    Revision,
    Scoring,
    top_setting,
)

__all__ = ["Ablate", "Circuit", "Discover", "Patch", "PromptPairs"]


@dataclass(frozen=True, kw_only=True)
class Ablate(Reading, Batching, Removal, Place, Revision, DeviceMap, Settings):
    """`attnscope ablate`: the language-model loss with each head removed; with `remove`, of the model without
    those heads, which `save` writes."""

    torchrun: ClassVar[bool] = True  # every N-th pass of configurations (every N-th batch for the gradient)

    method: str = setting(
        options.ABLATION_METHOD, "loss", "loss: remove each head and measure the loss; gradient: |dL/d gate| (fast)."
    )
    prune: int = setting(options.PRUNE, 0, "Also remove the K least important heads one after another.", metavar="K")
    top: int | None = top_setting("the most important heads (10 on the terminal)")
    remove: Sequence[str] = setting(
        options.HEAD_SET,
        (),
        "Remove these heads first (as --ablation says; not resample): the analysis is of the model without them.",
        metavar="L.H,...",
        many=True,
        python_help="heads 'L.H' removed first (a list, or '0.2,1.0'): the analysis is of the model without them",
    )
    save: str | os.PathLike | None = optional_setting(
        options.MODEL_FOLDER,
        "Write the model without the heads of --remove to this new folder (save_pretrained: weights, config, "
        "tokenizer; zero or mean ablation); the heads are then not scored unless --score, --prune or --method "
        "gradient asks.",
        metavar="DIR",
    )
    score: bool | None = optional_setting(
        options.FLAG,
        "Measure every head's importance (default: yes, except with --save alone, which saves the model and "
        "measures only its loss).",
        python_help="measure every head's importance (None: yes, except with save alone, which saves the model and "
        "measures only its loss)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.remove and self.ablation == "resample":
            raise AttnscopeError(
                "remove (--remove) takes heads out of the model for good, and resample ablation has no fixed value to "
                "put in their place: use ablation mean or zero"
            )
        if self.save is not None:
            if not self.remove:
                raise AttnscopeError("save (--save DIR) writes the model without the heads of remove: give remove too")
            check_destination(self.save)
        if self.score is False and (self.prune or self.method == "gradient"):
            asked = (
                f"prune (--prune {self.prune}) removes the least important heads"
                if self.prune
                else "method gradient (--method gradient) is a way of scoring every head"
            )
            raise AttnscopeError(f"{asked}, and score off (--no-score) scores none: give one or the other")

    @property
    def scoring(self) -> bool:
        """Whether every head's importance is measured: `score` where given; else yes, except with `save` alone
        (saving needs no scoring: the model's loss is measured, and `prune` or method gradient ask for the scores)."""
        if self.score is not None:
            return self.score
        return self.save is None or bool(self.prune) or self.method == "gradient"

    @property
    def needs_lm_head(self) -> bool:
        return True

    def check_shape(self, shape: Shape) -> None:
        for label in self.remove:
            options.head_in(label, shape.n_layer, shape.n_head)
        left = shape.n_layer * shape.n_head - len(self.remove)
        if self.prune > left:
            if self.remove:
                raise AttnscopeError(f"prune {self.prune}: {counted(left, 'head')} left once remove's are removed")
            raise AttnscopeError(f"prune {self.prune}: this model has {left} heads")


@dataclass(frozen=True, kw_only=True)
class Circuit(Scoring, Removal, Loading, Settings):
    """`attnscope circuit`: which earlier heads each head depends on."""

    torchrun: ClassVar[bool] = True  # every N-th removal replayed (circuit_replay), every N-th gradient batch

    head: Sequence[str] | None = setting(
        options.HEADS,
        None,
        "Explain this head, L.H (repeatable); default: every head of layer 1 and above.",
        metavar="L.H",
        many=True,
        python_help="the heads explained, 'L.H' labels (None: every head of layer 1 and above)",
    )
    score: str | None = optional_setting(
        HEAD_SCORE,
        "Explain this score of every head; default: each head's deciding score (the one that gave it its role).",
        metavar="SCORE",
    )
    top: int | None = top_setting("each explained head's dependencies, the largest |change| (10 on the terminal)")
    method: str = setting(
        options.CIRCUIT_METHOD,
        "removal",
        "removal: remove each earlier head and score again (exact); gradient: "
        "attribution patching, the first-order estimate of every removal from one backward pass per explained head "
        "(for large models).",
    )
    steps: int = setting(
        options.STEPS,
        0,
        "With --method gradient: 0, the gradient with every head kept (attribution patching); N, "
        "integrated gradients over N points (N times the cost; closer to exact removal, see the circuit page).",
        metavar="N",
    )
    weights: bool = setting(
        options.FLAG,
        True,
        "Also the composition and copying scores from the weights and each head's direct effect "
        "on the logits (loads the language-model head).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps and self.method != "gradient":
            raise AttnscopeError("steps (--steps) are the gradient's integration points: give method gradient too")
        chosen = None if self.score is None else catalog.score_named(self.score)
        if self.method == "gradient" and chosen is not None and not chosen.differentiable:
            raise AttnscopeError(
                f"score {self.score}: a count of argmax hits has no gradient, so method gradient cannot estimate its "
                "changes; use method removal"
            )

    @property
    def needs_lm_head(self) -> bool:
        return self.weights  # the unembedding of the copying scores, the logits of the direct effects

    def check_shape(self, shape: Shape) -> None:
        if shape.n_layer < 2:
            raise AttnscopeError("this model has one layer: no head has an earlier head to depend on")
        for label in self.head:
            layer, _ = options.head_in(label, shape.n_layer, shape.n_head)
            if layer == 0:
                raise AttnscopeError(f"head {label}: it is in layer 0, and no head comes before it to depend on")
        check_measured(self.score, shape.kind_name, self.probe)


PAIR_FIELDS = ("clean", "corrupt", "answer", "wrong")  # a pair's fields, as --file's JSON lines name them too


@dataclass(frozen=True, kw_only=True)
class PromptPairs(Reading):
    """Clean and corrupted prompts, the answer and the token it is measured against (`patch`, `discover`: no TEXT,
    the pairs come from --clean/--corrupt/--answer/--wrong or from --file), and the contract of a command that reads
    them: a decoder's logits, the language-model head."""

    reads_texts: ClassVar[bool] = False

    clean: str | None = optional_setting(
        options.TEXT, "The clean prompt: the model should continue it with --answer.", metavar="TEXT"
    )
    corrupt: str | None = optional_setting(
        options.TEXT,
        "The corrupted prompt: the clean one with a few tokens changed, as many tokens long.",
        metavar="TEXT",
    )
    answer: str | None = optional_setting(
        options.TEXT,
        "The token the clean prompt predicts, as the next word: Mary means ' Mary' (punctuation as written).",
        metavar="TOKEN",
    )
    wrong: str | None = optional_setting(
        options.TEXT, "The token it is measured against (written as --answer is).", metavar="TOKEN"
    )
    file: str | os.PathLike | None = setting(  # Reading's --file, here a file of pairs
        FILE,
        None,
        "Several pairs: a JSON-lines file, one object per line with clean, corrupt, answer and wrong (combined "
        "as a ratio of sums); '-' reads standard input.",
        flags=("--file", "-f"),
        metavar="PATH",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        given = [name for name in PAIR_FIELDS if getattr(self, name) is not None]
        missing = [name for name in PAIR_FIELDS if name not in given]

        def named(names: list[str]) -> str:  # `clean, answer and file (--clean, --answer, --file)`
            listed = ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]
            return f"{listed} ({', '.join(f'--{name}' for name in names)})"

        if given and self.file is not None:
            raise AttnscopeError(
                f"{named([*given, 'file'])}: give one pair with --clean, --corrupt, --answer and --wrong, or pairs "
                "in a file, not both"
            )
        if self.file is None and not given:
            raise AttnscopeError(
                f"no pair to {self.command_name}: give one with {named(missing)}, or pairs in a file (--file)"
            )
        if self.file is None and missing:
            raise AttnscopeError(
                f"{named(missing)}: a pair needs clean, corrupt, answer and wrong (or give pairs in a file with --file)"
            )

    @property
    def needs_lm_head(self) -> bool:
        return True  # the logits of the answer and the wrong token

    def check_shape(self, shape: Shape) -> None:
        if shape.kind_name is not None and shape.kind_name != "decoder":
            raise AttnscopeError(
                f"{self.command_name} reads the logits of the token that follows each prompt: it needs a decoder (a "
                f"causal language model); this model is an {shape.kind_name}"
            )


@dataclass(frozen=True, kw_only=True)
class Patch(PromptPairs, Batching, Place, Revision, DeviceMap, Settings):
    """`attnscope patch`: activation patching per head, for clean and corrupted prompts."""

    torchrun: ClassVar[bool] = True  # every N-th batch's baselines, then every N-th patched run

    batch_size: int | None = setting(  # Batching's --batch-size, here pairs of one length
        options.BATCH_SIZE.or_none(),
        None,
        "Pairs per batch (of one length); default: as many as let the copies of the batch that patch one layer's "
        "heads fill a forward pass of 8,192 tokens.",
        metavar="N",
        python_help="pairs per batch, of one length (None: as many as let the copies of the batch that patch one "
        "layer's heads fill a forward pass of 8,192 tokens)",
    )
    top: int | None = top_setting("the heads that restore the most (10 on the terminal)")


EXACT_MAX_EDGES = 5_000  # discover --method exact: each edge is one patched run of every batch of pairs


@dataclass(frozen=True, kw_only=True)
class Discover(PromptPairs, Batching, Place, Revision, DeviceMap, Settings):
    """`attnscope discover`: the edges between a decoder's components that carry what the clean and corrupted prompts
    differ in, scored, and the circuits of the top edges run to measure their faithfulness."""

    torchrun: ClassVar[bool] = True  # every N-th batch of pairs, its scores and its circuits' runs

    method: str = setting(
        options.DISCOVER_METHOD,
        "eap-ig",
        "eap-ig: integrated gradients on the inputs, --steps points (Hanna et al. 2024); eap: one gradient at the "
        "clean run (Syed et al. 2023); exact: each edge patched alone, corrupted into the clean run (one run per "
        f"edge: up to {EXACT_MAX_EDGES:,} edges).",
    )
    steps: int | None = optional_setting(
        options.IG_STEPS,
        "With --method eap-ig: the points of the integral, each a forward and a backward pass (default 5).",
        metavar="N",
        python_help="with method eap-ig: the points of the integral, each a forward and a backward pass (None: 5)",
    )
    ablation: str = setting(
        options.EDGE_ABLATION,
        "corrupt",
        "What an edge outside a circuit carries: corrupt, its value in the corrupted prompt's run; mean, its mean "
        "over every position of every pair (clean and corrupted prompts).",
    )
    target: float = setting(
        options.TARGET, 0.8, "The circuit: the fewest top edges (on the budget grid) whose faithfulness reaches this."
    )
    budgets: Sequence[float] = setting(
        options.BUDGETS,
        MIB_BUDGETS,
        "Circuit sizes to run, in percent of the edges (MIB's grid by default; 100 is always run).",
        metavar="P,P,...",
    )
    top: int | None = top_setting("the edges with the largest |score| (20 on the terminal)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps is not None and self.method != "eap-ig":
            raise AttnscopeError(
                f"steps (--steps) are the integral's points of method eap-ig; method {self.method} takes none"
            )
        object.__setattr__(self, "budgets", tuple(sorted({*self.budgets, 100.0})))

    @property
    def ig_steps(self) -> int:
        """The points of the integral: `steps`, or 5 (the EAP-IG README's)."""
        return 5 if self.steps is None else self.steps
