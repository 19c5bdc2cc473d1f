"""What a plain REPL shows of a result (`repr`, `print`): a few short lines with the model, the headline numbers of
the command's terminal view and where to see more, never an array nor a nested result's fields; and the `L.H`
labels every result gives for the heads it names by (layer, head). On hand-built results with known numbers."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from attnscope import registry
from attnscope.analyses.ablate import AblationResult
from attnscope.analyses.attend import AttendResult
from attnscope.analyses.bench import BenchResult
from attnscope.analyses.circuit import CircuitResult
from attnscope.analyses.compare import CompareHead, CompareResult
from attnscope.analyses.discover import DiscoverResult
from attnscope.analyses.diversity import DiversityResult
from attnscope.analyses.info import InfoResult
from attnscope.analyses.kvplan import KvplanResult
from attnscope.analyses.maps import AttentionMap
from attnscope.analyses.patch import PatchResult
from attnscope.analyses.random_mha import RandomMhaResult
from attnscope.analyses.report import ReportModel, ReportResult
from attnscope.analyses.result import Result
from attnscope.analyses.scoring import HeadRecord, HeadsResult
from attnscope.analyses.show import ShowResult
from attnscope.models.graph import Graph
from attnscope.output.views import SUMMARY_WIDTH, View, fitted
from attnscope.pipeline.labels import Labels
from attnscope.scores import catalog
from attnscope.scores.kinds import DECODER
from attnscope.scores.roles import Role

MAX_LINES = 10
MAX_CHARS = 1000
# what a dataclass's own repr, numpy, torch or a nested record would write
DUMPS = ("array(", "tensor(", "[[", "HeadRecord(", "Labels(", "AttentionMap(", "HeadsResult(", "np.float", "dtype=")

MODEL = {
    "name": "tiny", "family": "GPT-2", "model_type": "gpt2", "kind": "decoder", "n_layer": 2, "n_head": 2,
    "n_kv_head": 2, "d_model": 8, "d_head": 4, "n_ctx": 16, "vocab_size": 50, "n_params": 1234,
    "attention_params": 100, "attention_params_formula": 100, "device": "cpu", "dtype": "float32",
}  # fmt: skip
INPUTS = {"n_texts": 2, "n_windows": 2, "n_tokens": 20, "bos": True, "sources": ["a", "b"], "scored_rows": 18}
SHOWN = ["<bos>", "The", "cat", "sat"]
LABELS = Labels(["<bos>", "The", " cat", " sat"], SHOWN, [range(k, k + 1) for k in range(4)], SHOWN)


def _record(layer: int, head: int, role: str, score: float) -> HeadRecord:
    metric = catalog.ROLE[role].score or "entropy_normalized"
    scores = {name: 0.1 for name in catalog.SCORE_NAMES} | {metric: score}
    return HeadRecord(layer, head, scores, Role(role, metric, score))


def heads_result(n_layer: int = 2, n_head: int = 2, roles: dict | None = None) -> HeadsResult:
    """Heads with the roles given ((layer, head) -> (role, deciding score)), mixed at 0.3 elsewhere."""
    roles = roles or {(0, 0): ("previous-token", 0.8), (1, 0): ("induction", 0.9), (1, 1): ("induction", 0.6)}
    heads = [
        _record(layer, head, *roles.get((layer, head), ("mixed", 0.3)))
        for layer in range(n_layer)
        for head in range(n_head)
    ]
    model = MODEL | {"n_layer": n_layer, "n_head": n_head, "n_kv_head": n_head}
    return HeadsResult(model, DECODER, INPUTS, {}, heads, catalog.SCORE_NAMES, plotted=[(1, 0)])


def show_result() -> ShowResult:
    maps = np.tril(np.full((2, 4, 4), 0.25))  # (H, n, n)
    return ShowResult(MODEL, AttentionMap(1, maps, LABELS, 0), None, 0, True)


def diversity_result() -> DiversityResult:
    labels = ["0.0", "0.1", "1.0", "1.1"]
    js = np.array([[0, 0.05, 0.6, 0.7], [0.05, 0, 0.5, 0.8], [0.6, 0.5, 0, 0.3], [0.7, 0.8, 0.3, 0]])
    settings = {"redundant": 0.1, "cluster_at": 0.3, "top": 2}
    return DiversityResult(
        MODEL, INPUTS, settings, None, labels, 1 - js, js, np.sqrt(js), {0: 0.05, 1: 0.3},
        [["0.0", "0.1"]], [1, 0, 3, 2], [["0.0", "0.1"]],
    )  # fmt: skip


def attend_result() -> AttendResult:
    rows = np.zeros((2, 2, 4))  # (L, H, n)
    rows[..., 0] = 0.5
    rows[1, 1] = [0.1, 0.1, 0.7, 0.1]
    rows[0, 1] = [0.4, 0.1, 0.3, 0.2]
    settings = {"from_index": 0, "to_index": None, "tokens": 2, "top": 3, "index": 0}
    return AttendResult(MODEL, settings, LABELS, "sat", [3], rows, "cat", [range(2, 3)], rows[..., 2])


def ablation_result(n_layer: int = 2, n_head: int = 2) -> AblationResult:
    count = n_layer * n_head
    importance = (count - 1 - np.arange(count, dtype=float)).reshape(n_layer, n_head) / 10  # in layer.head order
    settings = {"method": "loss", "top": 3}
    prune = [{"removed": 1, "head": "1.1", "loss": 2.25}]
    inputs = INPUTS | {"predicted_tokens": 18}
    model = MODEL | {"n_layer": n_layer, "n_head": n_head, "n_kv_head": n_head}
    return AblationResult(model, inputs, settings, 2.0, importance, 2.0 + importance, prune=prune)


def circuit_result() -> CircuitResult:
    changes = np.zeros((2, 2, 2))  # (explained, L, H)
    changes[0, 0, 0] = -0.4  # 1.0 needs 0.0
    changes[1, 0, 1] = -0.2  # 1.1 needs 0.1
    heads = [
        {"label": f"{layer}.{head}", "layer": layer, "head": head, "role": "mixed", "explained": layer == 1,
         "score": "induction", "value": 0.5, "copying": 0.1 * head, "direct_effect": None}
        for layer in range(2) for head in range(2)
    ]  # fmt: skip
    explained = [(1, 0, "induction"), (1, 1, "previous_token")]
    settings = {"method": "removal", "top": 2}
    return CircuitResult(MODEL, INPUTS, settings, explained, np.array([0.9, 0.7]), changes, heads)


def compare_result() -> CompareResult:
    heads = [
        CompareHead(0, 0, {"induction": [0.1, 0.9]}, ["previous-token", "induction"], {"induction": "late"}, 0.25),
        CompareHead(0, 1, {"induction": [0.0, 0.0]}, ["mixed", "mixed"], {"induction": None}, 0.0),
    ]
    model = MODEL | {"n_layer": 1, "compared": []}
    settings = {"thresholds": {"induction": 0.5}, "top": 5}
    return CompareResult(model, DECODER, ["early", "late"], INPUTS, settings, heads, ("induction",), "induction")


def report_result() -> ReportResult:
    heads = heads_result()
    characteristic = [heads.heads[0], heads.heads[2]]
    return ReportResult(
        heads, diversity_result(), characteristic, {"induction": [heads.heads[2]]}, ablation=ablation_result(),
        dependencies=[{"label": "1.0", "on": "0.0", "score": "induction", "with": 0.9, "without": 0.5, "change": -0.4}],
    )  # fmt: skip


def bench_result() -> BenchResult:
    def row(method: str, seq: int, seconds: float, **ratios) -> dict:
        return {"method": method, "batch": 1, "seq": seq, "runs": 1, "median_s": seconds, "min_s": seconds,
                "max_s": seconds, "tokens_per_s": seq / seconds, "time_vs_floor": None} | ratios  # fmt: skip

    rows = [
        row("floor", 128, 0.01, time_vs_floor=1.0),
        row("attnscope", 128, 0.02, time_vs_floor=2.0, speedup_vs_tutorial=3.0),
        row("tutorial", 128, 0.06),
        row("floor", 512, 0.08, time_vs_floor=1.0),
        row("attnscope", 512, 0.04, time_vs_floor=0.5, speedup_vs_tutorial=5.0),
        row("tutorial", 512, 0.2),
    ]
    settings = {"device": "cpu", "device_name": "cpu", "cpu_threads": 2, "dtype": "float32", "repeats": 1}
    return BenchResult({"name": "gpt2", "n_layer": 12, "n_head": 12}, settings, rows, [])


def random_mha_result() -> RandomMhaResult:
    rows = [
        {"heads": 1, "d_head": 64, "js": None, "js_distance": None, "cosine": None, "entropy_normalized": 0.85},
        {"heads": 4, "d_head": 16, "js": 0.245, "js_distance": 0.48, "cosine": 0.558, "entropy_normalized": 0.84},
    ]
    return RandomMhaResult({"d_model": 64, "head_counts": [1, 4], "seq_len": 32, "trials": 4, "seed": 0}, rows)


def patch_result() -> PatchResult:
    pair = {"index": 0, "source": "the pair given", "answer": " Mary", "wrong": " John"}
    restored, removed = np.array([[0.1, -0.05], [0.7, 0.2]]), np.array([[0.0, 0.1], [0.6, 0.3]])
    settings = {"top": None, "batch_size": 8, "max_tokens": 16384}
    inputs = {"source": "the pair given", "n_pairs": 1, "n_tokens": 15, "bos": True}
    return PatchResult(
        MODEL, inputs, settings, [pair], 3.5, -1.5, restored, removed, np.zeros((1, 2, 2)), np.zeros((1, 2, 2))
    )


def kvplan_result() -> KvplanResult:
    scores = np.array([[0.02, 0.4], [0.3, 0.001]])
    full = np.array([[True, True], [True, False]])
    memory = {
        "context": 1024, "dtype": "float32", "bytes_per_element": 4, "full_bytes": 2**20, "plan_bytes": 3 * 2**18,
        "ratio": 0.75,
    }  # fmt: skip
    settings = {"streaming": 0.25, "sink": 4, "recent": 8, "context": 1024, "batch_size": 8, "max_tokens": 16384}
    inputs = {"n_texts": 1, "n_windows": 1, "n_tokens": 16, "bos": True, "sources": ["a"], "scored_rows": 4}
    return KvplanResult(MODEL, inputs, settings, scores, scores, full, [None, None], memory)


def discover_result() -> DiscoverResult:
    graph = Graph(1, 2, 2)  # 13 edges: embed into 6 head inputs, 3 into mlp 0, 4 into the logits
    scores = np.zeros(graph.n_edges)
    scores[[0, 12, 9]] = [0.5, -2.0, 1.25]  # embed → 0.0 q, mlp 0 → logits, embed → logits
    pair = {"index": 0, "source": "the pair given", "answer": " Mary", "wrong": " John"}
    curve = [{"percent": 50.0, "edges": 6, "kept": 2, "f": 0.9}, {"percent": 100.0, "edges": 13, "kept": 13, "f": 1.0}]
    settings = {"method": "eap-ig", "steps": 5, "ablation": "corrupt", "target": 0.8, "budgets": [50.0, 100.0],
                "top": None, "batch_size": 8, "max_tokens": 16384}  # fmt: skip
    inputs = {"source": "the pair given", "n_pairs": 1, "n_tokens": 15, "bos": True}
    circuit = {"percent": 50.0, "f": 0.9, "edges": np.array([9, 12])}
    return DiscoverResult(
        MODEL, inputs, settings, [pair], graph, scores, 3.5, -1.5, -1.5, curve, curve, 0.45, 0.05, circuit
    )


# result class -> a hand-built result and what its summary must say (the headline numbers of its terminal view)
BUILT = {
    "HeadsResult": (
        heads_result,
        [
            "tiny: 2 layers × 2 heads, 2 texts (20 tokens)",
            "previous-token 1 · induction 2 · mixed 1",
            "1.0 induction 0.90",
            "0.0 previous-token 0.80",
            "maps in .attention: 1.0",
        ],
    ),
    "ShowResult": (show_result, ["tiny: layer 1 (heads 1.0-1.1), text 0 (4 tokens)", "<bos> The cat sat", "2 × 4 × 4"]),
    "DiversityResult": (
        diversity_result,
        ["tiny: all 4 heads", "0.0 ~ 0.1 0.050", "0.1 ~ 1.1 0.800", "near-duplicates (JSD < 0.1): 0.0, 0.1"],
    ),
    "AttendResult": (attend_result, ["tiny: from sat@3 to cat@2, text 0 (4 tokens)", "1.1 0.700 · 0.1 0.300"]),
    "AblationResult": (
        ablation_result,
        [
            "loss method over 2 texts (18 predicted tokens)",
            "baseline loss 2.0000",
            "0.0 +0.300 · 0.1 +0.200 · 1.0 +0.100",
            "the 1 least important head: loss 2.2500 (+0.2500)",
        ],
    ),
    "CircuitResult": (
        circuit_result,
        ["2 heads explained by removal", "0.0 → 1.0 -0.400 · 0.1 → 1.1 -0.200", "most copying head 0.1"],
    ),
    "CompareResult": (
        compare_result,
        [
            "of 2 models (early, late): 1 layer × 2 heads each",
            "roles in early: previous-token 1 · mixed 1",
            "largest divergence (JSD bits): 0.0 0.250 · 0.1 0.000",
            "0.0 previous-token → induction (late)",
        ],
    ),
    "ReportResult": (
        report_result,
        [
            "tiny: 2 layers × 2 heads",
            "characteristic heads: 0.0 previous-token · 1.0 induction",
            "baseline loss 2.0000",
            "1 dependency",
            "report.html",
        ],
    ),
    "BenchResult": (
        bench_result,
        [
            "gpt2 on cpu, 2 CPU threads, float32",
            "floor at 1 · attnscope at 1",
            "0.50-2.00× the floor's time",
            "speed-up over tutorial 3.00-5.00×",
        ],
    ),
    "PatchResult": (
        patch_result,
        [
            "tiny: 2 layers × 2 heads; 1 pair",
            "logit difference (' Mary' − ' John'): clean 3.500, corrupted -1.500",
            "restore the most (restored/removed): 1.0 0.70/0.60 · 1.1 0.20/0.30",
        ],
    ),
    "KvplanResult": (
        kvplan_result,
        [
            "tiny: 2 layers × 2 heads",
            "1 of 4 KV heads streaming (the first 4 + last 8 tokens), 3 full",
            "KV cache at 1,024 tokens (float32): 1.00 MiB full, 768 KiB with this plan (75 %)",
            "streaming (layer.kv_head score): 1.1 .001",
        ],
    ),
    "DiscoverResult": (
        discover_result,
        [
            "tiny: 2 layers × 2 heads; 1 pair, eap-ig",
            "logit difference (' Mary' − ' John'): clean 3.500, corrupted -1.500, every edge ablated -1.500",
            "strongest edges: mlp 0→logits -2.00 · embed→logits 1.25 · embed→0.0(q) 0.50",
            "circuit: 2 edges of 13 (50 % budget), f = 0.900 (target 0.8), 3 nodes",
        ],
    ),
    "InfoResult": (lambda: InfoResult(MODEL), ["tiny: 2 layers × 2 heads", "1,234 parameters", "context 16 tokens"]),
    "RandomMhaResult": (random_mha_result, ["d_model 64", "1 - · 4 0.245", "4 0.558"]),
}


def _check_brief(text: str, name: str) -> None:
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES and len(text) <= MAX_CHARS, text
    assert max(len(line) for line in lines) <= SUMMARY_WIDTH, text
    assert text.startswith(f"<{name} ") and text.endswith(">"), text
    assert not any(dump in text for dump in DUMPS), text
    assert "no summary" not in text, text


def test_every_result_class_has_a_view_and_prints_through_it():
    """Every command's result (its record in attnscope.registry) is built here by hand, names its view, and keeps
    Result's __repr__ (the dataclass decorator writes its own unless told not to)."""
    classes = {}
    for command in registry.COMMANDS:
        module, _, name = command.result.rpartition(".")
        classes[name] = getattr(importlib.import_module(module), name)
    assert set(classes) == set(BUILT) == {cls.__name__ for cls in Result.__subclasses__()}
    for name, cls in classes.items():
        assert cls.__repr__ is Result.__repr__, name
        assert issubclass(cls.view_class, View), name


@pytest.mark.parametrize("name", sorted(BUILT))
def test_a_result_prints_a_few_short_lines_with_its_headline_numbers(name):
    build, facts = BUILT[name]
    result = build()
    text = repr(result)
    _check_brief(text, name)
    assert str(result) == text  # print shows the same
    assert text.splitlines()[-1].startswith("  see ") and ".to_json()" in text  # where to see more
    for fact in facts:
        assert fact in text, (fact, text)


def test_a_large_model_prints_as_briefly_with_what_was_left_out_counted():
    roles = {(layer, head): ("induction", 0.5 + head / 100) for layer in range(48) for head in range(0, 25, 2)}
    big = heads_result(48, 25, roles)
    _check_brief(repr(big), "HeadsResult")
    assert "induction 624 · mixed 576" in repr(big)
    ranked = repr(ablation_result(48, 25))
    _check_brief(ranked, "AblationResult")
    assert "tiny: 48 layers × 25 heads" in ranked and "0.0 +119.900 · 0.1 +119.800" in ranked
    assert "more" in ranked  # 1,200 heads ranked, the first that fit shown


def test_nested_results_print_briefly_too():
    report = report_result()
    _check_brief(repr(report), "ReportResult")
    for nested, name in ((report.heads, "HeadsResult"), (report.diversity, "DiversityResult")):
        _check_brief(repr(nested), name)
        assert repr(nested) not in repr(report)  # the report says what it holds, not its parts' summaries
    _check_brief(repr(report.ablation), "AblationResult")
    listed = repr([report.heads, report.ablation])
    assert len(listed) <= 2 * MAX_CHARS and not any(dump in listed for dump in DUMPS)
    page = ReportModel("late", report.heads, report.characteristic, [])
    assert repr(page) == (
        "<ReportModel late: characteristic heads 0.0 previous-token, 1.0 induction; maps on 0 texts; see .heads>"
    )


def test_a_note_or_a_name_with_line_breaks_stays_on_its_line():
    result = heads_result()
    result.notes = ["first line\nsecond line\n" * 40, "another"]
    result.model = result.model | {"name": "a\nname"}
    text = repr(result)
    _check_brief(text, "HeadsResult")
    assert "<HeadsResult a name: 2 layers" in text
    assert "  2 notes (.notes): first line second line first line" in text


def test_a_summary_that_fails_says_so_rather_than_raising():
    broken = ablation_result()
    broken.importance = np.zeros(3)  # not a grid of heads: the summary cannot be written
    text = repr(broken)
    assert text.startswith("<AblationResult (no summary: ") and text.endswith(">") and "\n" not in text


def test_an_ablation_that_scored_no_head_shows_its_losses():
    """`ablate --remove --save` alone scores no head (importance None): the losses, no ranking."""
    result = ablation_result()
    result.importance, result.ablated_loss, result.prune, result.intact_loss = None, None, [], 1.5
    text = repr(result)
    _check_brief(text, "AblationResult")
    assert "no head scored" in text and "baseline loss 2.0000 nats/token (1.5000 with every head)" in text
    assert result.to_records() == [] and result.ranked_labels() == []


def test_fitted_keeps_whole_items_and_counts_the_rest():
    items = [f"{k}.0 0.5" for k in range(40)]
    line = fitted("heads: ", items)
    assert len(line) <= SUMMARY_WIDTH - 2 and line.startswith("heads: 0.0 0.5 · 1.0 0.5")
    shown = line.removeprefix("heads: ").split(" · ")
    assert shown[-1] == f"… {40 - len(shown) + 1} more" and all(item in items for item in shown[:-1])
    assert fitted("heads: ", items[:2]) == "heads: 0.0 0.5 · 1.0 0.5" and fitted("heads: ", []) == ""


# ---------------------------------------------------------------------------------------------------- labels


def test_every_head_given_as_layer_and_head_has_its_label_beside():
    heads = heads_result()
    assert heads.plotted == [(1, 0)] and heads.plotted_labels == ["1.0"]
    assert [record.label for record in heads.heads] == ["0.0", "0.1", "1.0", "1.1"]
    show = show_result()
    assert show.head_labels == ["1.0", "1.1"]
    show.head = 1
    assert show.head_labels == ["1.1"]
    diversity = diversity_result()
    assert diversity.ordered_labels == ["0.1", "0.0", "1.1", "1.0"]
    attend = attend_result()
    assert attend.strongest() == [(1, 1), (0, 1), (0, 0)] and attend.strongest_labels() == ["1.1", "0.1", "0.0"]
    assert attend.strongest_labels(1) == ["1.1"]
    ablation = ablation_result()
    assert ablation.ranked_labels() == [f"{layer}.{head}" for layer, head in ablation.ranked()]
    assert ablation.ranked_labels() == ["0.0", "0.1", "1.0", "1.1"]
    circuit = circuit_result()
    assert circuit.explained_labels == ["1.0", "1.1"]
    assert {record["label"] for record in circuit.dependencies()} == {"1.0", "1.1"}
    assert [head.label for head in compare_result().role_changes()] == ["0.0"]
