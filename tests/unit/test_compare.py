"""compare without a model: when a role formed (planted role sequences), labels, revisions, the refusal of models
that cannot be compared (hand-made tokenizers), the JSD the divergence sums (against scipy), and the JSON and long CSV
of a hand-built result."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from attnscope.analyses.compare import Compare, CompareHead, CompareResult, Step, formation, head_change, transition
from attnscope.errors import AttnscopeError
from attnscope.models.checks import check_comparable
from attnscope.output.documents import to_csv, to_json
from attnscope.scores import pairs
from attnscope.scores.kinds import DECODER, ENCODER

LABELS = ["s0", "s1", "s2", "s3", "s4"]


@pytest.mark.parametrize(
    "held, expected",
    [
        (["mixed", "mixed", "induction", "induction", "induction"], {"induction": "s2", "broad": None}),
        (["mixed", "induction", "mixed", "induction", "induction"], {"induction": "s3", "broad": None}),  # lost once
        (["induction", "induction", "induction", "induction", "mixed"], {"induction": None, "broad": None}),  # lost
        (["induction"] * 5, {"induction": "s0", "broad": None}),  # held all along
        (["broad", "broad", "mixed", "mixed", "induction"], {"induction": "s4", "broad": None}),  # at the last
    ],
)
def test_a_role_formed_at_the_first_model_from_which_the_head_holds_it_to_the_end(held, expected):
    assert formation(held, LABELS, ["induction", "broad"]) == expected


@pytest.mark.parametrize(
    "values, expected",
    [
        # a phase change: a steep rise (0.17 into s3), then a slow climb past the threshold of 0.5 at s6
        ([0.02, 0.03, 0.07, 0.24, 0.36, 0.49, 0.51], "s3"),
        ([0.5, 0.4, 0.3, 0.2, 0.1, 0.0, 0.0], None),  # never rises
        ([0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1], None),  # flat
        ([0.0, 0.2, 0.2, 0.4, 0.4, 0.4, 0.4], "s1"),  # two equal rises: the earlier
        ([0.0, 0.9, 0.1, 0.3, 0.35, 0.4, 0.45], "s1"),  # a rise lost again is still the largest rise
        ([None, 0.1, 0.2, None, 0.9, 0.95, 0.96], "s2"),  # steps from or to an unmeasured model are skipped
    ],
)
def test_a_transition_is_the_model_that_ends_the_largest_rise(values, expected):
    labels = [f"s{k}" for k in range(len(values))]
    assert transition(values, labels) == expected
    pairs = enumerate(zip(values[:-1], values[1:], strict=True), start=1)
    rises = [(b - a, k) for k, (a, b) in pairs if a is not None and b is not None]
    best = max(rises, key=lambda rise: (rise[0], -rise[1]))  # by hand: the largest rise, the earliest on a tie
    assert expected == (f"s{best[1]}" if best[0] > 0 else None)


def test_a_heads_change_is_the_largest_step_of_its_last_roles_score_else_of_a_role_it_held():
    labels = ["a", "b", "c", "d"]
    scores = {"induction": [0.0, 0.1, 0.6, 0.7], "entropy_normalized": [0.95, 0.9, 0.2, 0.2]}
    # ends induction: its induction score's largest step (+0.5 into c), not the larger fall of its entropy
    assert head_change(scores, ["broad", "broad", "induction", "induction"], labels) == Step("induction", 0.5, "c")
    # ends mixed: the largest step of the roles it held before (broad: -0.7 into c)
    change = head_change(scores, ["broad", "broad", "mixed", "mixed"], labels)
    assert (change.score, change.model) == ("entropy_normalized", "c") and change.value == pytest.approx(-0.7)
    assert head_change(scores, ["mixed"] * 4, labels) is None


def test_compare_takes_two_models_or_more_and_divergence_takes_two():
    with pytest.raises(AttnscopeError, match="compare needs at least two models, 1 given"):
        Compare().check_models(1)
    with pytest.raises(AttnscopeError, match=r"\(--divergence\) sets the maps of two models side by side; 3 given"):
        Compare(divergence=True).check_models(3)
    Compare(divergence=True).check_models(2)
    Compare().check_models(5)


class _Tokenizer(SimpleNamespace):
    """A tokenizer as check_comparable reads it: a vocabulary, special token ids, no fast backend."""

    def get_vocab(self):
        return dict(self.vocab)

    def convert_ids_to_tokens(self, index):
        return {i: t for t, i in self.vocab.items()}[index]


def _model(n_layer=2, n_head=4, kind=DECODER, n_ctx=64, vocab=None, bos=0):
    vocab = vocab or {"<s>": 0, "a": 1, "b": 2}
    tokenizer = _Tokenizer(vocab=vocab, bos_token_id=bos, eos_token_id=0, pad_token_id=None)
    return SimpleNamespace(n_layer=n_layer, n_head=n_head, kind=kind, n_ctx=n_ctx, tokenizer=tokenizer)


@pytest.mark.parametrize(
    "other, message",
    [
        (_model(n_layer=3), "models 'A' and 'B' differ in shape: 2 layers × 4 heads against 3 × 4"),
        (_model(n_head=8), "differ in shape: 2 layers × 4 heads against 2 × 8"),
        (_model(kind=ENCODER), "models 'A' and 'B' differ in kind: decoder against encoder"),
        (_model(n_ctx=128), "differ in context: 64 tokens against 128"),
        (_model(vocab={"<s>": 0, "a": 1}), "different tokenizers: 'A' has 3 tokens, 'B' 2"),
        (_model(vocab={"<s>": 0, "a": 1, "c": 2}), "different tokenizers: token 2 is \"b\" in 'A', \"c\" in 'B'"),
        (_model(bos=1), "different tokenizers: bos token is \"<s>\" (id 0) in 'A', \"a\" (id 1) in 'B'"),
    ],
)
def test_models_that_cannot_be_compared_are_refused_naming_what_differs(other, message):
    with pytest.raises(AttnscopeError) as refused:
        check_comparable(_model(), other, "A", "B")
    assert message in str(refused.value) and "\n" not in str(refused.value)
    check_comparable(_model(), _model(), "A", "B")  # the same: nothing to say


def test_the_divergence_of_a_row_is_scipys_jensen_shannon_divergence_in_bits_and_exactly_0_for_equal_rows():
    generator = torch.Generator().manual_seed(0)
    p = torch.rand(6, 9, generator=generator) ** 3
    q = torch.rand(6, 9, generator=generator) ** 3
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    expected = [jensenshannon(a.double().numpy(), b.double().numpy(), base=2) ** 2 for a, b in zip(p, q, strict=True)]
    assert np.allclose(pairs.js_divergence(p, q).numpy(), expected, atol=2e-6)
    assert torch.equal(pairs.js_divergence(p, p.clone()), torch.zeros(6))


def _result(divergence: bool = True) -> CompareResult:
    heads = [
        CompareHead(0, 0, {"induction": [0.1, 0.9], "previous_token": [0.7, 0.2]}, ["previous-token", "induction"],
                    {"induction": "b", "previous-token": None}, 0.25 if divergence else None,
                    {"induction": "b", "previous-token": None}, Step("induction", 0.8, "b")),
        CompareHead(0, 1, {"induction": [0.0, 0.0], "previous_token": [0.1, 0.1]}, ["mixed", "mixed"],
                    {"induction": None, "previous-token": None}, 0.0 if divergence else None,
                    {"induction": None, "previous-token": None}, None),
    ]  # fmt: skip
    model = {"name": "a", "kind": "decoder", "n_layer": 1, "n_head": 2, "compared": []}
    settings = {"thresholds": {"induction": 0.5}, "top": 5}
    inputs = {"n_texts": 1, "n_tokens": 9}
    return CompareResult(
        model, DECODER, ["a", "b"], inputs, settings, heads, ("previous_token", "induction"), "induction",
        losses=[4.5, 3.25],
    )  # fmt: skip


def test_the_json_holds_a_value_per_model_and_the_csv_a_row_per_head_and_model():
    result = _result()
    document = json.loads(result.to_json())
    assert document["models"] == ["a", "b"] and document["command"] == "compare"
    assert document["loss"] == [4.5, 3.25]  # one per model, at the top level
    first = document["heads"][0]
    assert first == {
        "layer": 0, "head": 0, "label": "0.0", "scores": {"induction": [0.1, 0.9], "previous_token": [0.7, 0.2]},
        "roles": ["previous-token", "induction"], "formed": {"induction": "b", "previous-token": None},
        "transition": {"induction": "b", "previous-token": None},
        "change": {"score": "induction", "value": 0.8, "model": "b"}, "divergence": 0.25,
    }  # fmt: skip
    assert document["heads"][1]["change"] is None
    assert result.to_json() == to_json(result.to_document())
    rows = result.to_records()
    assert [(row["label"], row["model"], row["role"]) for row in rows] == [
        ("0.0", "a", "previous-token"), ("0.0", "b", "induction"), ("0.1", "a", "mixed"), ("0.1", "b", "mixed"),
    ]  # fmt: skip
    assert rows[1]["induction"] == 0.9 and rows[1]["divergence"] == 0.25
    assert to_csv(rows).splitlines()[0] == "layer,head,label,model,model_index,role,induction,previous_token,divergence"
    assert "divergence" not in json.dumps(json.loads(_result(divergence=False).to_json())["heads"])


def test_the_spool_finds_rows_by_position_whatever_the_blocks_and_removes_its_file():
    """Rows written in blocks 0:3 and 3:7 are read back in blocks 0:5 and 5:7 (causal: only the keys each row sees
    are stored; encoder: every key)."""
    from attnscope.pipeline.blocks import AttentionBlock
    from attnscope.pipeline.divergence import AttentionSpool

    generator = torch.Generator().manual_seed(1)
    for kind in (DECODER, ENCODER):
        probs = torch.rand(2, 3, 7, 7, generator=generator)  # (B, H, n, n)
        if kind.causal:
            probs = probs.tril()
        lengths = torch.tensor([7, 5])
        with AttentionSpool(kind) as spool:
            for start, stop in ((0, 3), (3, 7)):
                keys = stop if kind.causal else 7
                block = AttentionBlock.from_probs(probs[:, :, start:stop, :keys], torch.arange(start, stop), lengths)
                block.n_keys = 7
                spool.write(0, 0, block)
            spool.finish()
            for start, stop in ((0, 5), (5, 7)):
                keys = stop if kind.causal else 7
                block = AttentionBlock.from_probs(probs[:, :, start:stop, :keys], torch.arange(start, stop), lengths)
                block.n_keys = 7
                expected = block.probs * spool.stored_keys(block.positions, keys)
                assert torch.equal(spool.read(0, 0, block), expected), (kind.name, start)
            path = spool.path
            assert path.exists()
        assert not path.exists()


def test_the_terminal_and_the_notebook_rank_heads_by_divergence_and_list_role_changes():
    from rich.console import Console

    from attnscope.output.views import view_of

    result = _result()
    console = Console(width=100, record=True)
    for item in view_of(result).terminal([]):
        console.print(item)
    text = console.export_text()
    assert text.index("0.0") < text.index("0.1") and "Heads ranked by divergence" in text
    assert "previous-token → induction (b)" in text and "induction from b" in text
    fragment = result._repr_html_()
    assert "Heads ranked by divergence" in fragment and "<script" not in fragment
    assert "Heads whose role changes" in fragment


def test_top_keeps_the_heads_whose_role_changed_most_not_the_first_labels():
    """Three heads change role; in label order 0.0, 0.1, 0.2, by the size of their change 0.2 (0.6), 0.0 (-0.4),
    0.1 (0.1): --top 2 keeps 0.2 and 0.0, in that order, on the terminal and in a notebook."""
    from rich.console import Console

    from attnscope.output.compare import role_change_rows
    from attnscope.output.views import view_of

    sizes = {0: ("previous_token", -0.4), 1: ("induction", 0.1), 2: ("induction", 0.6)}
    heads = [
        CompareHead(0, h, {"induction": [0.0, 0.0], "previous_token": [0.0, 0.0]}, ["mixed", "induction"],
                    {"induction": "b"}, None, {"induction": "b"}, Step(sizes[h][0], sizes[h][1], "b"))
        for h in range(3)
    ]  # fmt: skip
    model = {"name": "a", "kind": "decoder", "n_layer": 1, "n_head": 3, "compared": []}
    result = CompareResult(
        model, DECODER, ["a", "b"], {"n_texts": 1, "n_tokens": 9}, {"thresholds": {"induction": 0.5}, "top": 2},
        heads, ("previous_token", "induction"), "induction",
    )  # fmt: skip
    assert [head.label for head in result.role_changes()] == ["0.2", "0.0", "0.1"]
    assert [row["head"] for row in role_change_rows(result)] == ["0.2", "0.0", "0.1"]
    console = Console(width=160, record=True)
    for item in view_of(result).terminal([]):
        console.print(item)
    text = console.export_text()
    assert "the 2 that changed most of 3" in text and "+0.600 induc (b)" in text and "-0.400 prev (b)" in text
    assert "0.1 " not in text.split("Heads whose role changes")[1]
    fragment = result._repr_html_()
    table = fragment.split("Heads whose role changes")[1]
    assert table.index(">0.2<") < table.index(">0.0<") and ">0.1<" not in table


def test_line_end_labels_are_moved_apart_where_lines_end_together():
    """Heads whose scores end at the same value (a phase change forms several heads at once) get labels that do not
    print over each other: at least the gap apart, in the order of their values, the lowest where its line ends."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from attnscope.output.compare_figures import _name_line_ends

    axes = Figure().add_subplot()
    axes.set_ylim(0, 1)
    _name_line_ends(axes, [(0.56, "1.2", "red"), (0.58, "1.0", "blue"), (0.57, "1.3", "green"), (0.2, "0.1", "k")], 16)
    placed = {text.get_text(): text.get_position()[1] for text in axes.texts}
    assert placed["0.1"] == 0.2 and placed["1.2"] == 0.56  # alone, or the lowest of a bunch: where the line ends
    assert placed["1.2"] < placed["1.3"] < placed["1.0"]
    assert placed["1.3"] - placed["1.2"] >= 0.07 - 1e-9 and placed["1.0"] - placed["1.3"] >= 0.07 - 1e-9


def test_the_sink_rate_is_a_percentage_with_one_decimal():
    """A share of heads: 74.4, once printed 74.400 by the table's three decimals for floats."""
    from rich.console import Console

    from attnscope.output.views import view_of
    from attnscope.scores.roles import SinkRate

    result = _result()
    result.sink_rates = [SinkRate(0.3, 0.744, (0.744,)), SinkRate(0.3, 0.5, (0.5,))]
    console = Console(width=120, record=True)
    for item in view_of(result).terminal([]):
        console.print(item)
    text = console.export_text()
    assert "sink rate %" in text and "74.4 " in text and "74.400" not in text and "50.0" in text
