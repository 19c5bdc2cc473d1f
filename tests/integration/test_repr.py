"""The bundled demo model's results as a plain REPL prints them: a few short lines each, with the model's name, its
known heads (previous-token 0.2, induction 1.0, 1.2 and 1.3) where the command names heads, and no array; and the
`L.H` labels beside every (layer, head) the results give."""

from __future__ import annotations

import pytest

import attnscope
from attnscope.output.views import SUMMARY_WIDTH
from tests.support import CAT

DUMPS = ("array(", "tensor(", "[[", "HeadRecord(", "Labels(", "dtype=")


@pytest.fixture(scope="module")
def demo() -> dict:
    """Every command's result on the demo model (bench aside: it times, for seconds), each computed once."""
    model = attnscope.load("demo", "cpu", lm_head=True)
    return {
        "heads": attnscope.heads(model, plot=["1.0", "0.2"]),
        "show": attnscope.show(model, CAT, layer=1),
        "one head": attnscope.show(model, CAT, head="1.2"),
        "diversity": attnscope.diversity(model, layer="all"),
        "attend": attnscope.attend(model, CAT, from_token="it", to_token="cat"),
        "ablate": attnscope.ablate(model),
        "circuit": attnscope.circuit(model),
        "report": attnscope.report(model),
        "info": attnscope.info("demo"),
        "random-mha": attnscope.random_mha(head_counts=[1, 2]),
        "kvplan": attnscope.kvplan(model, sink=16, recent=64),
    }


def _brief(result) -> str:
    text = repr(result)
    lines = text.splitlines()
    name = type(result).__name__
    assert len(lines) <= 10 and max(len(line) for line in lines) <= SUMMARY_WIDTH, text
    assert text.startswith(f"<{name} ") and text.endswith(">") and "no summary" not in text, text
    assert not any(dump in text for dump in DUMPS), text
    return text


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
def test_every_demo_result_prints_briefly_with_its_headline(demo):
    for result in demo.values():
        _brief(result)
    heads = repr(demo["heads"])
    assert "<HeadsResult demo: 2 layers × 4 heads, 6 texts" in heads
    assert "roles: previous-token 1 · induction 3" in heads and "0.2 previous-token" in heads
    assert "1.0 induction" in heads and "maps in .attention: 1.0, 0.2" in heads
    shown = repr(demo["show"])
    assert "demo: layer 1 (heads 1.0-1.3)" in shown and "tokens: <bos> The" in shown
    assert "demo: head 1.2" in repr(demo["one head"])
    diversity = repr(demo["diversity"])
    assert "demo: all 8 heads" in diversity and "most redundant (JSD bits): " in diversity
    attend = repr(demo["attend"])
    assert "demo: from it@" in attend and "strongest heads (weight on the target): " in attend
    ablation = repr(demo["ablate"])
    most = demo["ablate"].ranked_labels()[0]
    assert "baseline loss " in ablation and f"most important (loss change, nats): {most} +" in ablation
    circuit = repr(demo["circuit"])
    assert "4 heads explained by removal" in circuit and "removing A changes B: 0.2 → 1.3" in circuit
    info = repr(demo["info"])
    assert "<InfoResult demo: 2 layers × 4 heads" in info and "953,856 parameters" in info
    assert "JS divergence between heads" in repr(demo["random-mha"])
    kvplan = repr(demo["kvplan"])
    assert "<KvplanResult demo: 2 layers × 4 heads" in kvplan and "4 of 8 KV heads streaming" in kvplan
    assert "KV cache at 32,768 tokens (float32): 64.0 MiB full, " in kvplan
    assert "streaming (layer.kv_head score): 1.3 .202" in kvplan  # the lowest of the passkey probe's (docs/kvplan.md)


def test_a_demo_report_and_what_it_holds_print_briefly(demo):
    report = demo["report"]
    text = repr(report)
    assert "characteristic heads: 0.2 previous-token · 1.0 induction" in text and "report.html" in text
    for nested in (report.heads, report.diversity):
        _brief(nested)


def test_the_demo_results_name_heads_by_label(demo):
    assert demo["heads"].plotted_labels == ["1.0", "0.2"]
    assert demo["show"].head_labels == ["1.0", "1.1", "1.2", "1.3"] and demo["one head"].head_labels == ["1.2"]
    attend = demo["attend"]
    assert attend.strongest_labels(3) == [f"{layer}.{head}" for layer, head in attend.strongest(3)]
    ablation = demo["ablate"]
    assert ablation.ranked_labels() == [f"{layer}.{head}" for layer, head in ablation.ranked()]
    assert demo["circuit"].explained_labels == ["1.0", "1.1", "1.2", "1.3"]
    diversity = demo["diversity"]
    assert sorted(diversity.ordered_labels) == sorted(diversity.labels)
