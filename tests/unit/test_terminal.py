"""The terminal views, rendered by rich at a fixed width (Console(width=..., record=True)) and read back as text:
the heads table and its key, the role map and its legend at 40, 80 and 120 columns, bench's tables, plurals."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from attnscope.output import bench as bench_room
from attnscope.output import heads as heads_room
from attnscope.output import terminal
from attnscope.scores import catalog
from attnscope.scores.catalog import DECODER, ENCODER, SCORE, counted, roles_for, table_columns
from attnscope.scores.roles import classify

WIDTHS = (40, 80, 120)


def render(*items, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    for item in items:
        console.print(item)
    return console.export_text()


def head(layer, number, **given):
    """A head with the catalog's scores (those not given: 0.1, lift 0, Hnorm 0.5, retrieval 0: each below its
    role's threshold, retrieval's being 0.1), its role classified."""
    from attnscope.analyses.scoring import HeadRecord

    below = {"local_lift": 0.0, "entropy_normalized": 0.5, "retrieval": 0.0}
    scores = {name: 0.1 for name in catalog.SCORE_NAMES} | below | given
    return HeadRecord(layer, number, scores, classify(scores))


HEADS = [  # one head of every kind of decision: a pattern, a shape, mixed (closest: Hnorm at 0.72 / 0.8)
    head(0, 0, previous_token=0.83),
    head(0, 1, local_lift=0.58),
    head(0, 2, entropy_normalized=0.72),
    head(1, 0, induction=0.96, first_token=0.68),
    head(11, 11, first_token=0.9),
]


def rows_of(text: str) -> dict[str, str]:
    """label -> the table's line for that head."""
    return {line.split()[0]: line for line in text.splitlines() if re.match(r"\s*\d+\.\d+\s", line)}


# ------------------------------------------------------------------------------------------------ heads table


def test_a_kv_column_says_which_key_value_head_a_head_reads_only_under_grouped_query_attention():
    shared = render(heads_room.HeadsTable(HEADS, "Heads", DECODER, group=4), width=120)
    assert re.search(r"^\s*head\s+kv\s+role\s", shared, re.M)
    for label, line in rows_of(shared).items():
        assert line.split()[1] == str(int(label.split(".")[1]) // 4)  # 11.11 reads key/value head 2
    assert "kv the key/value head it reads (4 query heads share each)" in " ".join(shared.split())
    alone = render(heads_room.HeadsTable(HEADS, "Heads", DECODER), width=120)
    assert re.search(r"^\s*head\s+role\s", alone, re.M) and " kv " not in alone


@pytest.mark.parametrize("width", WIDTHS)
def test_every_row_names_its_head_and_role_at_any_width(width):
    text = render(heads_room.HeadsTable(HEADS, "Heads", DECODER), width=width)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    assert "…" not in text  # nothing cut
    lines = rows_of(text)
    assert sorted(lines) == sorted(record.label for record in HEADS)
    for record in HEADS:
        cells = lines[record.label].split()
        assert cells[1] == catalog.ROLE[record.role.role].short
        assert cells[2:4] == [SCORE[record.role.metric].short, f"{record.role.score:.2f}"]  # decided by


def test_columns_are_left_out_from_the_right_as_the_width_shrinks_and_the_key_says_which():
    columns = [score.short for score in table_columns(DECODER)]
    shown = {}
    for width in WIDTHS:
        text = render(heads_room.HeadsTable(HEADS, "Heads", DECODER), width=width)
        header = next(line for line in text.splitlines() if line.split()[:2] == ["head", "role"])
        shown[width] = header.split()[4:]  # after head, role, decided by
        assert shown[width] == columns[: len(shown[width])]
        hidden = columns[len(shown[width]) :]
        key = " ".join(text.split())
        if hidden:
            assert f"left out for want of width: {', '.join(hidden)}" in key
        else:
            assert "left out" not in key
    assert len(shown[40]) < len(shown[80]) <= len(shown[120]) == len(columns)
    assert shown[80] == columns  # a plain terminal shows every column


def test_the_sorted_score_is_the_last_column_left_out():
    columns = [score.short for score in table_columns(DECODER)]
    for sort, kept in ((None, False), ("confidence", True)):
        text = render(heads_room.HeadsTable(HEADS, "Heads", DECODER, sort=sort), width=40)
        shown = next(line for line in text.splitlines() if line.split()[:2] == ["head", "role"]).split()[4:]
        assert ("conf" in shown) == kept
        assert shown == [short for short in columns if short in shown]  # in the table's order


@pytest.mark.parametrize("kind", [DECODER, ENCODER])
@pytest.mark.parametrize("sort", [None, "entropy", "local"])
def test_the_key_names_every_header_in_words(kind, sort):
    records = [head(0, 0, previous_token=0.83)] if kind == DECODER else [head(0, 0, next_token=0.7)]
    text = " ".join(render(heads_room.HeadsTable(records, "Heads", kind, sort), width=120).split())
    for score in table_columns(kind, sort):
        assert f"{score.short} {heads_room.SCORE_KEYS[score.name]}" in text
    assert "head layer.head, from 0" in text
    assert "for mixed, the score closest to its threshold" in text
    assert "share: of a row's attention, 0 to 1" in text


def test_every_score_a_table_can_show_has_words_in_the_key():
    shown = {score.name for kind in (DECODER, ENCODER) for s in catalog.SCORE_NAMES for score in table_columns(kind, s)}
    assert shown <= set(heads_room.SCORE_KEYS)


def test_the_key_gives_the_thresholds_the_table_was_decided_with():
    thresholds = dict(catalog.DEFAULT_THRESHOLDS) | {"previous-token": 0.6}
    table = heads_room.HeadsTable(HEADS, "Heads", DECODER, thresholds=thresholds)
    text = " ".join(render(table, width=120).split())
    # a decoder's roles: 0.5 but broad's 0.8 and retrieval's 0.1 (Wu et al.'s)
    assert "the score that passed its threshold, 0.5 (prev 0.6, retr 0.1, Hnorm 0.8)" in text
    default = " ".join(render(heads_room.HeadsTable(HEADS, "Heads", DECODER), width=120).split())
    assert "the score that passed its threshold, 0.5 (retr 0.1, Hnorm 0.8)" in default


# ---------------------------------------------------------------------------------------------------- role map


def grid_heads(n_layer, n_head, kind=DECODER):
    """Every role of the kind in turn over an n_layer × n_head grid."""
    from attnscope.analyses.scoring import HeadRecord
    from attnscope.scores.roles import Role

    given = roles_for(kind)
    return [
        HeadRecord(layer, number, {}, Role(given[(layer * n_head + number) % len(given)].name, "self", 0.5))
        for layer in range(n_layer)
        for number in range(n_head)
    ]


@pytest.mark.parametrize("kind", [DECODER, ENCODER])
@pytest.mark.parametrize("width, cell", [(40, 2), (80, 5), (120, 5), (60, 3)])
def test_the_role_map_fits_gpt2_small_with_codes_that_tell_the_roles_apart(kind, width, cell):
    heads = grid_heads(12, 12, kind)
    text = render(terminal.role_map(heads, 12, 12, "Head roles: gpt2 (1 text, 9 tokens)", kind), width=width)
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width
    codes = terminal.role_codes(roles_for(kind), cell)
    assert len(set(codes.values())) == len(codes)  # still one code per role
    for layer in range(12):
        row = lines[2 + layer].split()
        assert row == [str(layer), *(codes[record.role.role] for record in heads[12 * layer : 12 * layer + 12])]


@pytest.mark.parametrize("width", WIDTHS)
def test_the_legend_breaks_between_entries_and_names_each_role_once(width):
    text = render(terminal.role_map(grid_heads(2, 4), 2, 4, "Head roles", DECODER), width=width)
    lines = text.splitlines()
    legend = lines[lines.index("rows: layers, columns: heads (from 0)".ljust(len(lines[3]))) + 1 :]
    legend = [line.rstrip() for line in legend]
    assert all(len(line) <= width for line in legend)
    codes = terminal.role_codes(roles_for(DECODER), 5)
    for role in roles_for(DECODER):
        entry = codes[role.name] if codes[role.name] == role.name else f"{codes[role.name]}  {role.name}"
        holding = [line for line in legend if re.search(rf"(^|\s){re.escape(entry)}(\s|$)", line)]
        assert len(holding) == 1, (role.name, legend)  # the chip and its name on one line
    words = " ".join(legend).split()
    assert all(words.count(role.name) == 1 for role in roles_for(DECODER))  # no "self=self"
    assert not any("=" in word for word in words)


def test_a_chip_is_never_split_even_with_colour():
    """With colour on, the chip is the code with a space either side, on the role's colour: on one line."""
    console = Console(width=30, record=True, color_system="truecolor", force_terminal=True)
    console.print(terminal.role_map(grid_heads(1, 4), 1, 4, "Head roles", DECODER))
    lines = console.export_text(styles=True).splitlines()
    colour = catalog.ROLE["duplicate-token"].colour.lstrip("#")
    red, green, blue = (int(colour[k : k + 2], 16) for k in (0, 2, 4))
    chip = [line for line in lines if f"48;2;{red};{green};{blue}m dup " in line]
    assert chip, lines  # the whole chip, its spaces included, in one styled run


# ------------------------------------------------------------------------------------------------------ bench


def bench_row(method, median, runs=3, **ratios):
    row = {
        "method": method, "batch": 1, "seq": 128, "runs": runs, "median_s": median, "min_s": median,
        "max_s": median * 1.5, "spread": 0.5 if runs > 1 else 0.0, "tokens_per_s": 128 / median, "peak_mb": 10.0,
        "time_vs_floor": None, "memory_vs_floor": None, "time_vs_tutorial": None, "time_vs_cache": None,
    }  # fmt: skip
    return row | ratios


def test_bench_table_ratios_read_right_whether_faster_or_slower():
    rows = [
        bench_row("floor", 0.010, time_vs_floor=1.0, time_vs_tutorial=0.25),
        bench_row("attnscope", 0.061, time_vs_floor=6.1, time_vs_tutorial=1.525),  # slower than the tutorial
        bench_row("tutorial", 0.040, time_vs_floor=4.0, time_vs_tutorial=1.0),
    ]
    text = render(bench_room.bench_table(rows, "bench"), width=80)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    assert "faster than" not in text and "speed" not in text
    attnscope = next(line for line in text.splitlines() if " attnscope " in line)
    assert "1.52×" in attnscope.split() or "1.53×" in attnscope.split()  # 1.5× the tutorial's time
    caption = " ".join(text.split())
    assert (
        "time ×floor, ×tutorial: this row's median time divided by the floor method's, the tutorial method's at the "
        "same B × n (below 1: faster)" in caption
    )
    assert "'–' where the floor's peak is under 1 MB" in caption
    assert "×cache" not in caption  # no column for a method that was not timed
    assert "spread: (max - min) / median time of the runs (3 runs)" in caption


def test_one_run_has_no_spread():
    text = render(bench_room.bench_table([bench_row("floor", 0.01, runs=1, time_vs_floor=1.0)], "bench"), width=80)
    row = next(line for line in text.splitlines() if " floor " in line).split()
    assert row[5] == "–" and "0%" not in row
    assert "('–': one run only)" in " ".join(text.split())


def test_bench_view_counts_threads_and_shows_the_micro_benchmark_by_shape():
    from attnscope.analyses.bench import BenchResult
    from attnscope.output.views import view_of

    settings = {"device_name": "cpu", "cpu_threads": 1, "dtype": "float32", "repeats": 1, "micro_d_model": 64}
    micro = [
        {"batch": b, "seq": n, "heads": h, "d_head": 64 // h, "numpy_loop_ms": 1.0, "numpy_batched_ms": 2.0,
         "torch_scratch_ms": 3.0, "torch_sdpa_ms": 4.0}
        for b in (1, 2) for n in (8, 16) for h in (1, 4)
    ]  # fmt: skip
    result = BenchResult({"name": "demo"}, settings, [bench_row("floor", 0.01, runs=1)], micro)
    text = render(*view_of(result).terminal([]), width=80)
    assert "demo on cpu, 1 CPU thread, float32" in text and "threads" not in text
    groups = [line.split()[:3] for line in text.splitlines() if re.match(r"\s*\d+ × \d+\s+\d+\s", line)]
    assert groups == [[str(b), "×", str(n)] for b in (1, 2) for n in (8, 16)]  # one group per B × n
    assert "the median of 1 run;" in " ".join(text.split()) and "d_model 64" in text


# ---------------------------------------------------------------------------------------------------- plurals


@pytest.mark.parametrize(
    "count, noun, expected",
    [(0, "text", "0 texts"), (1, "text", "1 text"), (2, "window", "2 windows"), (1200, "token", "1,200 tokens"),
     (1, "CPU thread", "1 CPU thread"), (3, "child", "3 children")],
)  # fmt: skip
def test_counted(count, noun, expected):
    plural = "children" if noun == "child" else None
    assert counted(count, noun, plural) == expected


def test_info_view_says_what_it_counts():
    from attnscope.analyses.info import InfoResult
    from attnscope.output.views import view_of

    facts = {
        "name": "m", "family": "Llama", "model_type": "llama", "kind": "decoder", "n_layer": 1, "n_head": 4,
        "n_kv_head": 1, "d_model": 32, "d_head": 8, "n_ctx": 1, "vocab_size": 1, "n_params": 1000,
        "attention_params": 100, "attention_params_formula": 90, "device": "cpu", "dtype": "float32",
    }  # fmt: skip
    text = " ".join(render(*view_of(InfoResult(facts)).terminal([]), width=120).split())
    assert "4 (sharing 1 key/value head, 4 query heads each)" in text
    assert "1 token" in text and "1 tokens" not in text
    assert "100 (W_Q, W_K, W_V, W_O and any biases: 90)" in text


def _layer(layer, attention="full", window=None, softcap=None, qk_norm=False, sinks=False, kv_heads=8, group=4):
    """One record of `info`'s `layers` (models.families.AttentionTraits.layers)."""
    return {
        "layer": layer, "attention": attention, "window": window, "softcap": softcap, "qk_norm": qk_norm,
        "sinks": sinks, "kv_heads": kv_heads, "query_heads_per_kv_head": group,
    }  # fmt: skip


def test_info_groups_equal_layers_of_an_alternating_model():
    """Gemma 3's shape: five sliding layers, then a full one; soft-capping and QK-norm on every layer."""
    from attnscope.analyses.info import InfoResult
    from attnscope.output.views import view_of

    layers = [
        _layer(layer, "full", None, 50.0, True) if layer % 6 == 5 else _layer(layer, "sliding", 4096, 50.0, True)
        for layer in range(12)
    ]
    facts = {
        "name": "g", "family": "Gemma 3", "model_type": "gemma3_text", "kind": "decoder", "n_layer": 12, "n_head": 32,
        "n_kv_head": 8, "d_model": 64, "d_head": 2, "n_ctx": 8192, "vocab_size": 1, "n_params": 1000,
        "attention_params": 100, "attention_params_formula": 90, "device": "cpu", "dtype": "float32",
    }  # fmt: skip
    result = InfoResult(facts, layers=layers)
    text = render(*view_of(result).terminal([]), width=100)
    rows = [[cell.strip() for cell in line.split("│")[1:3]] for line in text.splitlines() if "│" in line]
    start = rows.index(["attention", "layers 0-4, 6-10: sliding window of 4,096 tokens"])
    assert rows[start - 1 : start + 5] == [
        ["heads per layer", "32 (sharing 8 key/value heads, 4 query heads each)"],
        ["attention", "layers 0-4, 6-10: sliding window of 4,096 tokens"],
        ["", "layers 5, 11: full causal attention"],
        ["", "every layer: logits soft-capped at ±50"],
        ["", "every layer: QK-norm (queries and keys normalised)"],
        ["width (d_model)", "64"],
    ]
    record = result.to_records()[0]
    assert record["attention"] == (
        "layers 0-4, 6-10: sliding window of 4,096 tokens | layers 5, 11: full causal attention | every layer: "
        "logits soft-capped at ±50 | every layer: QK-norm (queries and keys normalised)"
    )
    assert result.to_document()["layers"] == layers
    assert "layers 5, 11: full causal attention" in repr(result) and ".layers" in repr(result)
    assert "layers 5, 11: full causal attention" in result._repr_html_()


@pytest.mark.parametrize(
    "layers, kind, lines",
    [
        ([_layer(0), _layer(1)], DECODER, ["every layer: full causal attention"]),
        ([_layer(0), _layer(1)], ENCODER, ["every layer: full bidirectional attention"]),
        (
            [_layer(0), _layer(1, "sliding", 64), _layer(2)], ENCODER,
            ["layers 0, 2: full bidirectional attention", "layer 1: sliding window of ±64 tokens"],
        ),
        (
            [_layer(n, "sliding" if n % 2 == 0 else "full", 128 if n % 2 == 0 else None, sinks=True) for n in range(8)],
            DECODER,
            ["layers 0, 2, …, 6: sliding window of 128 tokens", "layers 1, 3, …, 7: full causal attention",
             "every layer: a learned attention sink per head"],
        ),
        (
            [_layer(0, qk_norm=True), _layer(1), _layer(2, softcap=30.0)], DECODER,
            ["every layer: full causal attention", "layer 2: logits soft-capped at ±30", "layer 0: QK-norm (queries "
             "and keys normalised)"],
        ),
        ([], DECODER, []),
    ],
)  # fmt: skip
def test_info_attention_lines(layers, kind, lines):
    from attnscope.output.info import attention_lines

    assert attention_lines(layers, kind) == lines


@pytest.mark.parametrize(
    "numbers, shown",
    [
        ([5], "layer 5"), ([0, 1], "layers 0, 1"), ([0, 1, 2, 4], "layers 0-2, 4"), ([1, 3, 5], "layers 1, 3, 5"),
        ([1, 3, 5, 7, 9], "layers 1, 3, …, 9"), ([0, 1, 2, 3], "layers 0-3"), ([0, 6, 7, 9], "layers 0, 6, 7, 9"),
    ],
)  # fmt: skip
def test_info_layer_numbers(numbers, shown):
    from attnscope.output.info import layer_numbers

    assert layer_numbers(numbers) == shown
