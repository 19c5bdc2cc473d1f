"""auto-circuit (UFO-101/auto-circuit 1.0.1, on TransformerLens) scores every edge of a GPT-2 as `discover --method
eap` does, within float tolerance: the same random-weight GPT-2 (tests.support's, the real GPT-2 vocabulary), the same
IOI-style pairs, the same 110 edges with the same scores, from both of its EAP scorers; each side's time is printed.

Two environments. auto-circuit imports `transformer_lens.past_key_value_caching`, gone from TransformerLens 3, and
TransformerLens 2 wants transformers 4; attnscope needs transformers 5. So this file runs in attnscope's environment:
it builds the model and the pairs and scores them with `Discover` in process; scripts/discover_interop_peer.py, run
with the peer's Python (ATTNSCOPE_DISCOVER_PEER), reads the same folder and pairs file and writes auto-circuit's scores
as JSON (its docstring says how the model is loaded into TransformerLens: no weight processing at all).

The conventions, converted:
    graph    auto-circuit's factorized graph with separate q, k, v inputs (`factorized_src_nodes`,
             `factorized_dest_nodes`, model_utils/transformer_lens_utils.py): `Resid Start` (blocks.0.hook_resid_pre)
             is `embed`, `A1.2` is `1.2` (hook_result: z W_O without b_O, whose difference between runs is 0), `MLP 0`
             is `mlp 0` (hook_mlp_out; its input hook_mlp_in, before the LayerNorm), `A1.2.K` is `1.2` input `k`,
             `Resid End` (the last block's hook_resid_post, before ln_final) is `logits`: the same 110 edges
    metric   `batch_avg_answer_diff` (utils/tensor_ops.py) on the logits at the last position (`slice_output=
             "last_seq"`), one answer and one wrong token per pair: the mean over the batch of LD = logit(answer) −
             logit(wrong); every pair in one batch, so its mean is attnscope's mean over the pairs
    sign     auto-circuit differentiates loss = −mean LD and multiplies by (corrupt − clean) (EAP) or by the mask's
             move from clean to corrupt (mask gradient): the two signs cancel, and its score is attnscope's
             Σ_positions (clean − corrupt) · ∂LD/∂r_v, positive where the edge carries the answer (no conversion)
    tokens   `<|endoftext|>` before each prompt on both sides (attnscope's GPT-2 default; `to_tokens(prepend_bos=True)`)

EAP-IG is not compared: auto-circuit's integrated gradients (`mask_gradient_prune_scores`, integrated_grad_samples=n)
move every edge's mask at once through α = 0, 1/n, …, 1, each node's input a mix of its clean and corrupted sums,
where attnscope's eap-ig moves the embeddings alone through α = (j + ½)/steps and computes every node from them: two
different integrals, not the same points of one.

Times: each side's scoring call on one thread, the fastest of 10 after 3 s of calls to warm up. One thread and the
fastest call, because on a machine of 2 cores shared with other processes two thread pools spin against each other
(measured: 64 to 1,500 ms a call on 2 threads, 37 to 54 ms on one, in the same minute) and what others take only
ever adds. attnscope's is `Discover.run` with the one budget 100 %: its scores and, beside them, the two baselines and
the empty and full circuits, which auto-circuit's scorers do not run.

Skipped without the peer's Python (CI's environment): `bash scripts/discover_interop.sh` builds a venv with auto-circuit
and runs this file with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support import build_tiny_gpt2

PEER_PYTHON = os.environ.get("ATTNSCOPE_DISCOVER_PEER")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not PEER_PYTHON,
        reason="needs auto-circuit in an environment of its own: `bash scripts/discover_interop.sh` builds one and "
        "runs this file with it",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
PEER_SCRIPT = ROOT / "scripts" / "discover_interop_peer.py"
BOS = 50256  # <|endoftext|>
PAIRS = [  # IOI: the clean prompt names the indirect object last; the corrupted one swaps who gives
    ("When Mary and John went to the store, John gave a drink to", "Mary", "John"),
    ("When Tom and Sarah went to the park, Sarah gave a book to", "Tom", "Sarah"),
    ("When Anna and Paul went to the school, Paul gave a ball to", "Anna", "Paul"),
    ("When James and Lisa went to the store, Lisa gave a book to", "James", "Lisa"),
]
WARM_S, REPEATS = 3.0, 10
RELATIVE_TOLERANCE = 1e-5  # of the largest |score|: float32 on both sides (measured: 5e-7)


def timed(call):
    """The call's last result and the seconds of the fastest of REPEATS calls on one thread, after calls for WARM_S
    seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        while time.perf_counter() - start < WARM_S:
            call()
        seconds = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            result = call()
            seconds.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return result, min(seconds)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny GPT-2's folder and the pairs file (attnscope's JSON lines), written once."""
    folder = build_tiny_gpt2(tmp_path_factory.mktemp("gpt2"), n_positions=64)
    pairs = folder.parent / "pairs.jsonl"
    rows = [
        {"clean": clean, "corrupt": clean.replace(f", {wrong} ", f", {answer} "), "answer": answer, "wrong": wrong}
        for clean, answer, wrong in PAIRS
    ]
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return folder, pairs


@pytest.fixture(scope="module")
def attnscope_side(inputs):
    """attnscope's DiscoverResult (method eap) and its time."""
    import attnscope
    from attnscope.analyses.discover import Discover

    folder, pairs = inputs
    loaded = attnscope.load(str(folder), "cpu", lm_head=True)
    analysis = Discover(method="eap", file=str(pairs), budgets=[100.0])
    return timed(lambda: analysis.run(loaded))


@pytest.fixture(scope="module")
def peer_side(inputs) -> dict:
    """scripts/discover_interop_peer.py's JSON: the versions, each pair as auto-circuit read it, each scorer's edges
    and time."""
    folder, pairs = inputs
    out = folder.parent / "auto-circuit.json"
    run = subprocess.run(
        [PEER_PYTHON, str(PEER_SCRIPT), str(folder), str(pairs), str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(out.read_text(encoding="utf-8"))


def test_both_sides_read_the_same_tokens_and_logits(attnscope_side, peer_side):
    result, _ = attnscope_side
    assert len(result.pairs) == len(peer_side["pairs"]) == len(PAIRS)
    for ours, theirs in zip(result.pairs, peer_side["pairs"], strict=True):
        assert (ours["answer_id"], ours["wrong_id"]) == (theirs["answer_id"], theirs["wrong_id"])
        assert ours["n_tokens"] == len(theirs["clean"]) == len(theirs["corrupt"])
        assert theirs["clean"][0] == theirs["corrupt"][0] == BOS and result.inputs["bos"]
        assert ours["clean_logit_diff"] == pytest.approx(theirs["clean_logit_diff"], abs=1e-4)
        assert ours["corrupt_logit_diff"] == pytest.approx(theirs["corrupt_logit_diff"], abs=1e-4)


@pytest.mark.parametrize("scorer", ["eap", "mask_gradient"])
def test_the_edge_scores_agree(attnscope_side, peer_side, scorer):
    result, seconds = attnscope_side
    ours = {result.edge(index): float(score) for index, score in enumerate(result.scores)}
    method = peer_side["methods"][scorer]
    theirs = {(edge["from"], edge["to"], edge["input"]): edge["score"] for edge in method["edges"]}
    assert len(ours) == 110 and theirs.keys() == ours.keys()
    scale = max(abs(score) for score in ours.values())
    difference = max(abs(ours[edge] - theirs[edge]) for edge in ours)  # no sign turned: the conventions agree
    versions = ", ".join(f"{name} {version}" for name, version in peer_side["versions"].items())
    print(
        f"\n{scorer} ({versions}) against attnscope eap, {len(ours)} edges, {len(PAIRS)} pairs: max |difference| "
        f"{difference:.2e}, largest |score| {scale:.3f}, median |score| {np.median(np.abs(result.scores)):.4f}"
        f"\n    time per call: attnscope {seconds * 1e3:.1f} ms, auto-circuit {method['seconds'] * 1e3:.1f} ms",
        file=sys.stderr,
    )
    assert scale > 0.01  # the corruption moves the logits: there is something to compare
    assert difference <= RELATIVE_TOLERANCE * scale
