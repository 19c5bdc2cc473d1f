"""A real phase change: a tiny GPT-2 trained on repeated random words (tests.support.train_induction_checkpoints)
forms an induction head partway. Each checkpoint's induction scores are computed here independently (transformers'
eager attention with output_attentions, on repeated random words drawn here), and `attnscope heads` must agree with
them checkpoint by checkpoint; the checkpoint where the head forms is the one `compare` must report."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from attnscope.analyses.heads import Heads
from attnscope.models.loading import load_model
from attnscope.pipeline.inputs import Text
from attnscope.pipeline.probe import probe_windows
from attnscope.scores import catalog
from tests.support import INDUCTION_CONTEXT, INDUCTION_WORDS, train_induction_checkpoints

pytestmark = pytest.mark.slow

THRESHOLD = catalog.ROLE["induction"].threshold
PERIOD = (INDUCTION_CONTEXT - 1) // 2  # the longest period trained on, and attnscope's probe period here


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    start = time.perf_counter()
    folders = train_induction_checkpoints(tmp_path_factory.mktemp("induction-run"))
    print(f"\ntrained and saved {len(folders)} checkpoints in {time.perf_counter() - start:.1f} s")
    return folders


def _step(folder) -> int:
    return int(folder.name.removeprefix("step-"))


def induction_scores(folder, ids: torch.Tensor, period: int) -> np.ndarray:
    """(n_layer, n_head): mean attention from each token of the second copy to the token after its first
    occurrence, A[i, i - (period - 1)], over sequences `ids` (B, 1 + 2·period) of BOS and a segment repeated once;
    from transformers' own eager attention, nothing of attnscope's."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions  # per layer (B, H, n, n)
    rows = torch.arange(1 + period, 1 + 2 * period)  # the second copy
    return torch.stack([layer[:, :, rows, rows - (period - 1)].mean(dim=(0, 2)) for layer in attentions]).numpy()


def _random_repeats(seed: int, count: int, period: int) -> torch.Tensor:
    """(count, 1 + 2·period): BOS (0), `period` distinct random words (ids 1 .. 64), the same again."""
    generator = np.random.default_rng(seed)
    segments = np.stack([generator.choice(np.arange(1, len(INDUCTION_WORDS) + 1), period, replace=False)
                         for _ in range(count)])  # fmt: skip
    return torch.from_numpy(np.concatenate([np.zeros((count, 1), dtype=np.int64), segments, segments], axis=1))


def _formed(scores: list[np.ndarray]) -> int | None:
    """The index of the first checkpoint from which some layer-1 head holds the induction role to the end."""
    above = [bool((score[1] >= THRESHOLD).any()) for score in scores]
    for index in range(len(above)):
        if all(above[index:]):
            return index
    return None


@pytest.fixture(scope="module")
def independent(checkpoints):
    ids = _random_repeats(seed=12345, count=16, period=PERIOD)
    return [induction_scores(folder, ids, PERIOD) for folder in checkpoints]


def test_an_induction_head_forms_partway(checkpoints, independent):
    steps = [_step(folder) for folder in checkpoints]
    best = [float(score[1].max()) for score in independent]
    print("max layer-1 induction per checkpoint:", dict(zip(steps, np.round(best, 3), strict=True)))
    formed = _formed(independent)
    assert formed is not None, "no induction head formed"
    print(f"induction head formed at {checkpoints[formed].name}")
    assert 0 < formed < len(checkpoints) - 1  # partway: neither at initialisation nor only at the last step
    early = [score for folder, score in zip(checkpoints, independent, strict=True) if _step(folder) <= 300]
    assert early and all(score.max() < 0.1 for score in early)  # no head of either layer before the rise
    # a sharp rise: within two checkpoints (100 steps) the best layer-1 head gains more than 0.25
    assert max(best[k + 2] - best[k] for k in range(len(best) - 2)) > 0.25
    assert all(score[0].max() < THRESHOLD for score in independent)  # layer 0 forms none: it has nothing to compose


def test_attnscope_heads_agrees_checkpoint_by_checkpoint(checkpoints, independent):
    settings = Heads()
    text = [Text(" ".join(INDUCTION_WORDS[:20] * 2), "words")]
    measured = []
    for folder, mine in zip(checkpoints, independent, strict=True):
        loaded = load_model(str(folder), "cpu")
        result = settings.run(loaded, text)
        assert result.inputs["probe"]["period"] == PERIOD
        theirs = np.array([[record.scores["induction"] for record in result.heads if record.layer == layer]
                           for layer in range(2)])  # fmt: skip
        # on attnscope's own probe sequences, transformers' eager attention gives the same numbers
        probe = torch.tensor([window.ids for window in probe_windows(loaded.tokenizer, PERIOD, INDUCTION_CONTEXT)])
        np.testing.assert_allclose(theirs, induction_scores(folder, probe, PERIOD), atol=1e-5)
        # on other random words, the same heads within sampling noise
        np.testing.assert_allclose(theirs, mine, atol=0.05)
        called = {record.label for record in result.heads if record.role.role == "induction"}
        assert called <= {f"{layer}.{head}" for layer, head in zip(*np.nonzero(theirs >= THRESHOLD), strict=True)}
        measured.append(theirs)
    formed, expected = _formed(measured), _formed(independent)
    print(f"attnscope heads: formed at {checkpoints[formed].name}; independent: {checkpoints[expected].name}")
    assert formed is not None and abs(formed - expected) <= 1
