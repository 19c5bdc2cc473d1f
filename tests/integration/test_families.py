"""Every supported family, on a tiny random-weight model with its features switched on (tests.support.FAMILY_MODELS):
the capture against the family's own eager attention, every statistic against eager `output_attentions` maps and
the family's visibility rules, batched against one at a time, ablation against zeroed output-projection weights,
and the tokenization of each vocabulary style. A few families run in the everyday loop; all of them in the slow one.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from attnscope import api
from attnscope.analyses.ablate import losses_under
from attnscope.errors import AttnscopeError
from attnscope.models.families import FAMILIES, family_of
from attnscope.models.loading import load_model
from attnscope.pipeline import capture
from attnscope.pipeline.blocks import Reducer
from attnscope.pipeline.loss_windows import IGNORED, LossWindows, masked_windows
from attnscope.pipeline.probe import probe_windows
from attnscope.pipeline.reducers import HeadStatistics
from attnscope.pipeline.tokens import batches, pad_id, tokenize
from attnscope.scores import rows
from tests.support import FAMILY_MODELS, FAMILY_TEXTS, WINDOW, tiles_everywhere, visible_keys

# in the everyday loop: grouped-query attention, a sliding window with soft-capping, sinks, local encoder layers
EVERYDAY = {"llama", "gemma2", "gpt_oss", "modernbert"}
DECODERS = {name for name, (_, style, _) in FAMILY_MODELS.items() if style not in ("wordpiece", "roberta")}
FAMILY_NAMES = [
    pytest.param(name, marks=() if name in EVERYDAY else pytest.mark.slow, id=name) for name in FAMILY_MODELS
]


@pytest.fixture(scope="module")
def loaded(family_dir):
    models = {}

    def model(name, lm_head=False):
        if (name, lm_head) not in models:
            models[name, lm_head] = load_model(str(family_dir(name)), "cpu", lm_head=lm_head)
        return models[name, lm_head]

    return model


def _batch(model):
    """The family texts as one right-padded batch (lengths differ, every text longer than the sliding window)."""
    windows = tokenize(model, FAMILY_TEXTS).windows
    assert min(len(window.ids) for window in windows) > WINDOW + 2
    return next(batches(windows, len(windows), model.device, pad_id(model.tokenizer)))


def _real(batch):
    return torch.arange(batch.input_ids.shape[1])[None, :] < batch.lengths[:, None]  # (B, n)


def test_every_family_of_the_table_is_built_here():
    """The table and the tests cover the same families: a family added to one needs the other."""
    from transformers import AutoConfig

    tested = {family_of(AutoConfig.for_model(name)).name for name in FAMILY_MODELS}
    assert tested == {family.name for family in FAMILIES} - {"GPT-2"}  # GPT-2: the tiny model of tests/conftest.py


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_capture_gives_the_familys_own_eager_output(loaded, name):
    model = loaded(name)
    batch = _batch(model)
    with torch.no_grad():
        eager = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    outputs = []
    hook = model.model.register_forward_hook(lambda module, args, output: outputs.append(output.last_hidden_state))
    try:
        capture.run(model.model, [batch], None)
    finally:
        hook.remove()
    assert model.config._attn_implementation == "eager"  # given back after the capture
    assert float((outputs[0] - eager).abs()[_real(batch)].max()) < 1e-5


@pytest.mark.parametrize("tiled", [False, True], ids=["blocks", "tiles"])
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_every_statistic_equals_the_eager_maps(loaded, name, tiled):
    """Each layer's statistics from the capture against the same statistics computed from transformers' eager
    `output_attentions` maps, with the keys each row sees taken from the family's documented rules (sliding windows
    included); those rules must also be exactly where the eager maps are nonzero. With `tiled`, every block walks
    its keys in tiles of 3 (pipeline.tiles: how long rows go on the CPU), and the layer's output is the eager one."""
    model = loaded(name)
    batch = _batch(model)
    with torch.no_grad():
        eager = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)
    assert len(eager.attentions) == model.n_layer
    statistics = HeadStatistics(model.kind, model.n_layer, model.n_head, model.device)
    outputs = []
    hook = model.model.register_forward_hook(lambda module, args, output: outputs.append(output.last_hidden_state))
    try:
        with tiles_everywhere() if tiled else contextlib.nullcontext([]) as tiled_blocks:
            capture.run(model.model, [batch], statistics)
    finally:
        hook.remove()
    assert bool(tiled_blocks) == tiled
    assert float((outputs[0] - eager.last_hidden_state).abs()[_real(batch)].max()) < 1e-5
    got = statistics.means()
    n = batch.input_ids.shape[1]
    scored = model.kind.scored_rows(batch.lengths, torch.arange(n))  # (B, n)
    for layer, maps in enumerate(eager.attentions):
        visible = visible_keys(model.config, layer, batch.lengths, n, model.kind.causal)  # (B, n, n)
        nonzero = (maps > 0).all(dim=1)  # (B, n, n): every head puts weight on a key it sees
        assert torch.equal(nonzero[scored], visible[scored]), f"layer {layer}: the rules disagree with the model"
        expected = rows.head_scores(model.kind, maps.float(), batch.lengths, visible=visible)
        for score, value in expected.items():
            assert torch.allclose(got[score][layer], value, atol=1e-5), (layer, score)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_batched_equals_one_at_a_time(loaded, name, monkeypatch):
    """Padding leaks into nothing, whichever side the tokenizer itself pads on (attnscope pads its own batches on
    the right, where every real token keeps its position)."""
    model = loaded(name)
    monkeypatch.setattr(model.tokenizer, "padding_side", "left")
    together = api.heads(model, FAMILY_TEXTS, batch_size=len(FAMILY_TEXTS), probe=False)
    alone = api.heads(model, FAMILY_TEXTS, batch_size=1, probe=False)
    for a, b in zip(together.heads, alone.heads, strict=True):
        for score in together.measured:
            assert a.scores[score] == pytest.approx(b.scores[score], abs=1e-5), (a.label, score)


def test_sliding_window_rows_see_only_their_window(loaded):
    """Gemma 2's first layer slides: a row sees W keys, so uniform attention there has normalised entropy 1 over
    ln W, not ln(i + 1); the eager maps put exactly zero on the keys before the window."""
    model = loaded("gemma2")
    batch = _batch(model)
    with torch.no_grad():
        maps = model.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True
        ).attentions
    sliding, full = maps[0][0, 0], maps[1][0, 0]  # layer_types alternate, sliding first
    last = int(batch.lengths[0]) - 1
    assert float(sliding[last, : last - WINDOW + 1].abs().max()) == 0.0
    assert float(full[last, : last - WINDOW + 1].min()) > 0.0


def test_learned_sinks_leave_each_row_less_than_one(loaded):
    """gpt-oss: a softmax over the keys and one learned sink logit per head, the sink's share dropped: the weights
    attnscope scores are the model's, and a row of them sums to less than 1."""
    model = loaded("gpt_oss")
    batch = _batch(model)
    totals = {}

    class Totals(Reducer):
        wants_blocks = True

        def add_block(self, layer, block):
            totals.setdefault(layer, []).append(block.probs.sum(-1))

    capture.run(model.model, [batch], Totals())
    for layer, parts in totals.items():
        row_sums = torch.cat(parts, dim=-1)[..., : int(batch.lengths.min())]  # (B, H, b) real rows
        assert float(row_sums.max()) < 1.0 and float(row_sums.mean()) < 0.95, layer  # the sink took its share
        assert float(row_sums.min()) > 0.0


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_windows_carry_one_bos_or_none_or_the_encoders_wrap(loaded, name):
    """Never two BOS tokens, whether or not the tokenizer adds one itself; none where the tokenizer has none (the
    first token is then the text's own); an encoder's [CLS] … [SEP] (RoBERTa's <s> … </s>)."""
    model = loaded(name)
    tokenizer = model.tokenizer
    text = FAMILY_TEXTS[0].text
    own = tokenizer(text, add_special_tokens=False)["input_ids"]
    [window] = tokenize(model, FAMILY_TEXTS[:1]).windows
    if not model.kind.causal:
        assert window.ids == (tokenizer.cls_token_id, *own, tokenizer.sep_token_id)
    elif tokenizer.bos_token_id is None:
        assert window.ids == tuple(own)
    else:
        assert window.ids == (tokenizer.bos_token_id, *own)
        assert window.ids.count(tokenizer.bos_token_id) == 1


@pytest.mark.parametrize("name", [param for param in FAMILY_NAMES if param.values[0] in DECODERS])
def test_the_probe_finds_ordinary_words_in_every_vocabulary_style(loaded, name):
    model = loaded(name)
    period = 5
    windows = probe_windows(model.tokenizer, period, model.n_ctx)
    for window in windows:
        body = window.ids[len(window.ids) - 2 * period :]
        assert body[:period] == body[period:] and len(set(body[:period])) == period
        words = model.tokenizer.convert_ids_to_tokens(list(body[:period]))
        assert all(word[0] in "Ġ▁" and word[1:].isalpha() and word[1:].islower() for word in words), words


def _zeroed(lm_model, family, layer, head, d_head):
    """A copy of the model whose output projection (an nn.Linear, weight (out, in)) in `layer` ignores `head`: its
    input columns for that head set to zero."""
    copied = copy.deepcopy(lm_model)
    module = family.output_projections(copied.base_model)[layer]
    assert isinstance(module, torch.nn.Linear)
    with torch.no_grad():
        module.weight[:, head * d_head : (head + 1) * d_head] = 0
    return copied


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_removing_a_head_equals_zeroing_its_output_projection(loaded, name):
    """`ablate` gates a head at the input of the family's output projection; the same head removed by zeroing that
    projection's weights gives the same loss, computed by the family's own language-model head and loss one window
    at a time: next-token for a decoder, masked-token for an encoder (the same masked positions)."""
    model = loaded(name, lm_head=True)
    tokenized = tokenize(model, FAMILY_TEXTS).windows
    if model.kind.causal:
        windows = LossWindows(tokenized)
        labels = [window.ids for window in tokenized]  # the model shifts them itself
    else:
        windows = masked_windows(tokenized, model.tokenizer.mask_token_id)
        labels = windows.labels
    layer, head = model.n_layer - 1, model.n_head - 1
    gates = torch.ones(2, model.n_layer, model.n_head)
    gates[1, layer, head] = 0
    losses = losses_under(model, windows, gates, batch_size=2)
    removed = _zeroed(model.lm_model, model.family, layer, head, model.d_head)
    for configuration, network in ((0, model.lm_model), (1, removed)):
        total, count = 0.0, 0
        for window, targets in zip(windows.windows, labels, strict=True):
            predicted = sum(label != IGNORED for label in targets) - (1 if model.kind.causal else 0)
            with torch.no_grad():
                loss = network(input_ids=torch.tensor([window.ids]), labels=torch.tensor([targets])).loss
            total += float(loss) * predicted
            count += predicted
        assert losses[configuration] == pytest.approx(total / count, abs=1e-5), configuration
    assert abs(losses[1] - losses[0]) > 1e-4  # the head mattered: the comparison has teeth


def test_a_layer_the_capture_misses_is_an_error_not_a_wrong_number(loaded, monkeypatch):
    model = loaded("llama")
    attention = model.family.attention_modules(model.model)[1]
    monkeypatch.setattr(attention, "layer_idx", 0)  # layer 1's attention now reports as layer 0's: layer 1 unseen
    with pytest.raises(AttnscopeError, match=r"the attention of layer 1 did not go through"):
        api.heads(model, FAMILY_TEXTS[:1], probe=False)


def test_grouped_query_attention_shows_which_key_value_head_each_head_reads(loaded, tmp_path):
    """A tiny Llama whose 4 query heads share 2 key/value heads: the heads table (terminal and notebook) and the
    report page (its table of every head, its role map) say which key/value head each query head reads, h // 2 as
    transformers' repeat_kv has it; GPT-2 (one key/value head per query head) shows no such column."""
    import re

    from rich.console import Console

    from attnscope.analyses.heads import Heads
    from attnscope.analyses.report import Report
    from attnscope.output.views import view_of

    model = loaded("llama")
    assert (model.n_head, model.n_kv_head) == (4, 2)
    result = Heads(probe=False).run(model, FAMILY_TEXTS[:1])
    console = Console(width=160, record=True, color_system=None)
    for item in view_of(result).terminal([]):
        console.print(item)
    text = console.export_text()
    assert re.search(r"^\s*head\s+kv\s+role", text, re.M)
    rows = [line.split() for line in text.splitlines() if re.match(r"\s*\d+\.\d+\s", line)]
    assert [(row[0], row[1]) for row in rows] == [
        (f"{layer}.{head}", str(head // 2)) for layer in (0, 1) for head in range(4)
    ]
    assert ">kv</th>" in view_of(result).notebook()
    report = Report(probe=False, diversity=False).run(model, FAMILY_TEXTS[:1])
    page = view_of(report).files(tmp_path)[0].read_text()
    for layer in (0, 1):
        for head in range(4):
            assert f'<tr data-head="{layer}.{head}"><td>{layer}.{head}</td><td>{head // 2}</td>' in page
    assert page.count('<th colspan="2" class="kv"') == 2 and "reads key/value head 1" in page
