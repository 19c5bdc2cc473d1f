"""Figures (output.figures, the families built on it, and each command's in its room output/<command>.py): the
properties a reader relies on, checked on the returned Figures, not on pixels.

Each drawing function returns a matplotlib Figure; the tests read its parts (images and their norms, colour bars,
tick labels, legends, axis limits) against values worked out by hand or by scipy.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from types import SimpleNamespace

import numpy as np
import pytest

from attnscope.output import ablate as ablate_room
from attnscope.output import bench as bench_room
from attnscope.output import diversity as diversity_room
from attnscope.output import heads as heads_room
from attnscope.output import random_mha as random_mha_room
from attnscope.scores.catalog import ROLE_NAMES, ROLES, SCORE, SCORE_NAMES

LABELS = [f"{layer}.{head}" for layer in range(12) for head in range(12)]  # GPT-2 small's 144 heads
MODEL = {"name": "tiny", "kind": "decoder", "n_layer": 2, "n_head": 4}
INPUTS = {"n_texts": 3, "n_tokens": 42}
UNIT_WORDS = ("fraction of the row's attention", "nats", "bits", "cosine similarity", "uniform", "|dL/d gate|")


def _colour_bar_labels(figure) -> list[str]:
    """The labels of the colour bars of `figure`'s images; an image without a bar of its own must be on the scale
    of one that has (the panels of a layer grid)."""
    images = [image for axes in figure.axes for image in axes.images]
    with_bar = [image for image in images if image.colorbar is not None]
    scales = {(image.cmap.name, image.norm.vmin, image.norm.vmax) for image in with_bar}
    for image in images:
        assert (image.cmap.name, image.norm.vmin, image.norm.vmax) in scales
    return [image.colorbar.ax.get_ylabel().replace("\n", " ") for image in with_bar]


def _head_record(layer, head, role, **scores):
    from attnscope.analyses.scoring import HeadRecord
    from attnscope.scores.roles import Role

    values = {name: scores.get(name) for name in SCORE_NAMES}
    return HeadRecord(layer, head, values, Role(role, "previous_token", 0.6))


def _heads_result(roles, scores):
    """A HeadsResult-like object: `roles` [layer][head], every score of `scores` (name -> (L, H) array)."""
    heads = [
        _head_record(layer, head, role, **{name: float(value[layer, head]) for name, value in scores.items()})
        for layer, row in enumerate(roles)
        for head, role in enumerate(row)
    ]
    model = {**MODEL, "n_layer": len(roles), "n_head": len(roles[0])}
    return SimpleNamespace(model=model, inputs=INPUTS, heads=heads, measured=tuple(scores))


# --------------------------------------------------------------------------------------------- writing a figure


def _small_figure():
    from attnscope.output import attention_maps, head_grids

    matrix = np.arange(8, dtype=float).reshape(2, 4) / 8
    return head_grids.score_heatmap(matrix, "Some score per head", attention_maps.ATTENTION_LABEL, "tiny, 3 texts")


@pytest.mark.parametrize("format", ["svg", "pdf", pytest.param("png", marks=pytest.mark.slow)])
def test_the_same_figure_gives_the_same_bytes(format):
    """Built twice, a figure renders to identical bytes: no date in SVG or PDF, SVG ids from a fixed salt."""
    from attnscope.output import figures

    first, second = figures.render(_small_figure(), format), figures.render(_small_figure(), format)
    assert first == second


def test_vector_files_are_written_and_parse(tmp_path):
    from attnscope.output import figures

    svg = figures.save(_small_figure(), tmp_path / "score.svg")
    root = ElementTree.fromstring(svg.read_bytes())  # SVG is XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert "Some score per head" in svg.read_text() or root.find(".//{http://www.w3.org/2000/svg}path") is not None
    pdf = figures.save(_small_figure(), tmp_path / "score.pdf")
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")
    assert b"CreationDate" not in data  # nothing that changes from run to run


def test_the_words_view_of_a_map_has_a_file_name_of_its_own():
    """`show --words` (and `heads --plot --words`) writes attention_L1_words.png: the token picture of the same
    layer, in the same folder, is not overwritten."""
    from attnscope.output.show import ShowView

    for head, stem in ((None, "attention_L1"), (2, "attention_1.2")):
        for view, suffix in (("tokens", ""), ("words", "_words")):
            result = SimpleNamespace(head=head, attention=SimpleNamespace(layer=1, view=view))
            assert ShowView(result).stem == stem + suffix


def test_vector_files_keep_their_text_as_text_for_a_paper():
    """A PDF embeds its fonts as TrueType (fonttype 42: a font program, /FontFile2), never as Type 3 (glyphs as
    drawings, which journals' checks refuse); an SVG keeps every text as a <text> element, editable."""
    from attnscope.output import figures

    pdf = figures.render(_small_figure(), "pdf")
    assert b"/Type3" not in pdf and b"/FontFile2" in pdf
    svg = ElementTree.fromstring(figures.render(_small_figure(), "svg"))
    texts = ["".join(text.itertext()) for text in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert "Some score per head" in texts and "tiny, 3 texts" in texts


def _tick_sizes(figure) -> list[float]:
    """The font size of every tick label of `figure` that has text."""
    return [
        label.get_fontsize()
        for axes in figure.axes
        for label in [*axes.get_xticklabels(), *axes.get_yticklabels()]
        if label.get_text() and label.get_visible()
    ]


def test_tick_labels_are_at_least_7_points_at_the_figures_size():
    """At its size in inches (a print's), no figure labels a tick below 7 pt: long texts and many heads thin their
    labels instead (every head of GPT-2 small's 144 still labelled, on a larger matrix: the test after next)."""
    from attnscope.output import attention_maps, figures, head_grids, head_matrices

    rng = np.random.default_rng(0)
    tokens = [f"tok{k}" for k in range(90)]
    drawn = [
        attention_maps.attention_heatmap(rng.random((90, 90)), tokens, "long"),  # thinned at 8 pt
        attention_maps.layer_grid(rng.random((2, 90, 90)), tokens, "layer"),  # thinned at 7 pt
        head_matrices.head_matrix(rng.random((40, 40)), LABELS[:40], "JS", "JS divergence (bits)"),  # 144: below
        head_grids.score_heatmap(rng.random((48, 25)), "many", "fraction"),  # and the role map's axes, the same
        bench_room.bench_figure(_bench_result()),  # and every line plot's axes, the same
    ]
    for figure in drawn:
        sizes = _tick_sizes(figure)
        assert sizes and min(sizes) >= figures.TICK_MIN == 7.0


@pytest.mark.parametrize(
    "dpi", [50, pytest.param(150, marks=pytest.mark.slow), pytest.param(300, marks=pytest.mark.slow)]
)
def test_a_png_is_its_inches_times_its_dpi(tmp_path, dpi):
    import struct

    from attnscope.output import figures

    figure = _small_figure()
    # 2 layers × 4 heads: 4 × 0.6 in + 0.9 in and 2.2 in of margins; 2 × 0.44 + 0.3 in + 0.8 in and 0.7 in
    assert tuple(figure.get_size_inches()) == pytest.approx((5.5, 2.68))
    data = figures.save(figure, tmp_path / "score.png", dpi=dpi).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (round(5.5 * dpi), round(2.68 * dpi))
    assert tuple(figure.get_size_inches()) == pytest.approx((5.5, 2.68))  # rendering left the figure as it was


def test_a_file_name_and_its_format_must_agree(tmp_path):
    from attnscope.output import figures

    with pytest.raises(ValueError, match="must end in .pdf"):
        figures.save(_small_figure(), tmp_path / "score.png", "pdf")
    assert list(tmp_path.iterdir()) == []


def test_pictures_settings_are_checked():
    from attnscope.errors import AttnscopeError
    from attnscope.output.files import DPI_RANGE, Pictures

    assert Pictures(format="svg").file_name("attention_0.1") == "attention_0.1.svg"  # the stem keeps its dot
    with pytest.raises(AttnscopeError, match="jpg"):
        Pictures(format="jpg")
    with pytest.raises(AttnscopeError, match="dpi"):
        Pictures(format="png", dpi=DPI_RANGE[1] + 1)


# ----------------------------------------------------------------------------------------------- colour scales


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_a_signed_score_is_drawn_on_a_diverging_map_centred_at_zero():
    from attnscope.output import figures

    lift = np.array([[-0.3, 0.2, 0.9, 0.0], [-0.1, 0.5, 0.4, 0.1]])  # (L, H)
    result = _heads_result([["local"] * 4, ["mixed"] * 4], {"local_lift": lift, "local": (lift + 1) / 2})
    figure = heads_room.heads_score_heatmap(result, "local_lift")
    image = figure.axes[0].images[0]
    assert image.norm(0.0) == pytest.approx(0.5)  # 0 in the middle of the map
    assert image.norm.vmin == pytest.approx(-image.norm.vmax) and image.norm.vmax >= 0.9
    assert image.cmap.name == figures.DIVERGING_SCALE
    # a fraction stays on a sequential map from 0 to 1
    image = heads_room.heads_score_heatmap(result, "local").axes[0].images[0]
    assert (image.norm.vmin, image.norm.vmax) == (0.0, 1.0) and image.cmap.name == figures.SEQUENTIAL_SCALE


def test_ablation_importance_is_centred_at_zero_for_the_loss_and_from_zero_for_the_gradient():
    importance = np.array([[0.5, -0.2, 0.1, 0.0], [0.05, 0.3, -0.4, 0.2]])
    loss = SimpleNamespace(model=MODEL, inputs=INPUTS, importance=importance, method="loss")
    norm = ablate_room.ablate_importance(loss).axes[0].images[0].norm
    assert norm(0.0) == pytest.approx(0.5) and (norm.vmin, norm.vmax) == pytest.approx((-0.5, 0.5))
    gradient = SimpleNamespace(model=MODEL, inputs=INPUTS, importance=np.abs(importance), method="gradient")
    norm = ablate_room.ablate_importance(gradient).axes[0].images[0].norm
    assert (norm.vmin, norm.vmax) == pytest.approx((0.0, 0.5))


def _rgb(image, value) -> np.ndarray:
    """The colour (0-255) a figure's image gives `value`."""
    return np.array(image.cmap(image.norm(value))[:3]) * 255


def test_ablation_and_similarity_colours_mean_the_same_in_the_pictures_the_page_and_a_notebook():
    """One scale per quantity (output.scales), read by the pictures, sent to the report page in its data, and used
    by the notebook's grid: a loss that rises without a head is red everywhere, a JS divergence of 0 (the same
    rows) and a cosine of 1 are dark everywhere."""
    from attnscope.output.scales import SCALES

    def luminance(rgb):
        return float(np.dot(rgb, [0.2126, 0.7152, 0.0722]) / 255)

    importance = np.array([[0.5, -0.2, 0.1, 0.0], [0.05, 0.3, -0.4, 0.2]])
    loss = SimpleNamespace(model=MODEL, inputs=INPUTS, importance=importance, method="loss", notes=[])
    image = loss_image = ablate_room.ablate_importance(loss).axes[0].images[0]
    for value in (-0.5, -0.4, -0.1, 0.0, 0.05, 0.3, 0.5):
        assert np.abs(_rgb(image, value) - SCALES["loss_change"].rgb(value, 0.5)).max() <= 1, value
    red, _, blue = _rgb(image, 0.5)
    assert red > 150 > blue  # the largest rise: red, as the page says
    red, _, blue = _rgb(image, -0.5)
    assert blue > 150 > red
    result = _clustered_diversity()
    for name, similar, distinct in (("js", 0.0, 1.0), ("cosine", 1.0, 0.0)):
        image = diversity_room.diversity_matrix(result, name).axes[0].images[0]
        for value in (0.0, 0.2, 0.55, 1.0):
            assert np.abs(_rgb(image, value) - SCALES[name].rgb(value, 1.0)).max() <= 1, (name, value)
        assert luminance(_rgb(image, similar)) < 0.2 < 0.6 < luminance(_rgb(image, distinct))  # dark = similar
    # a notebook's ablation grid: each cell in the picture's colour
    view = ablate_room.AblateView(
        SimpleNamespace(
            **{**vars(loss), "inputs": {**INPUTS, "predicted_tokens": 9}}, baseline_loss=1.0, settings={"top": 2},
            ablated_loss=None, prune=[], ranked=lambda: sorted(np.ndindex(2, 4), key=lambda lh: -importance[lh]),
        )
    )  # fmt: skip
    html = view.notebook()
    picture = loss_image
    for value in (0.5, -0.4, 0.0):
        shown = re.search(rf"background:rgb\((\d+),(\d+),(\d+)\)[^>]*>{value:.2f}<", html)
        assert shown is not None, value
        assert np.abs(np.array([int(c) for c in shown.groups()]) - _rgb(picture, value)).max() <= 1, value


def test_every_colour_bar_has_a_label_with_a_unit():
    from attnscope.output import attention_maps, head_matrices

    rng = np.random.default_rng(0)
    scores = {name: rng.random((2, 4)) for name in SCORE_NAMES if SCORE[name].per_head}
    heads = _heads_result([["mixed"] * 4] * 2, scores)
    maps = rng.random((4, 6, 6)).astype(np.float32)
    js = np.abs(rng.random((4, 4)))
    drawn = [heads_room.heads_score_heatmap(heads, name) for name in heads_room.drawn_scores(heads)]
    drawn += [
        attention_maps.attention_heatmap(maps[0], list("abcdef"), "one head"),
        attention_maps.layer_grid(maps, list("abcdef"), "a layer"),
        head_matrices.head_matrix(js, ["0.0", "0.1", "0.2", "0.3"], "JS", "JS divergence (bits)"),
        ablate_room.ablate_importance(SimpleNamespace(model=MODEL, inputs=INPUTS, importance=js[:2], method="loss")),
        ablate_room.ablate_importance(
            SimpleNamespace(model=MODEL, inputs=INPUTS, importance=js[:2], method="gradient")
        ),
    ]
    for figure in drawn:
        labels = _colour_bar_labels(figure)
        assert labels
        for label in labels:
            assert any(word in label for word in UNIT_WORDS), label
    # the layer grid: one colour bar for every panel (one scale), and axis titles
    grid = drawn[-4]
    assert len(_colour_bar_labels(grid)) == 1
    texts = [text.get_text() for text in grid.texts]
    assert any(text.startswith("key") for text in texts) and any(text.startswith("query") for text in texts)


# ------------------------------------------------------------------------------------------------ masked keys


def test_hidden_keys_are_the_causal_triangle_and_what_every_head_gives_zero():
    from attnscope.output import attention_maps

    n = 5
    maps = np.tril(np.full((2, n, n), 0.2, dtype=np.float32))  # (H, n, n)
    maps[:, 4, 0] = 0.0  # a sliding window hides key 0 from query 4, in every head
    maps[1, 3, 1] = 0.0  # one head ignores key 1 of query 3: attention, not a mask
    hidden = attention_maps.hidden_keys(maps, causal=True)
    expected = np.triu(np.ones((n, n), dtype=bool), k=1)
    expected[4, 0] = True
    assert (hidden == expected).all()
    assert not attention_maps.hidden_keys(np.full((2, n, n), 0.2), causal=False).any()  # an encoder sees every key


def test_masked_cells_are_drawn_apart_from_zero_attention():
    from attnscope.output import attention_maps

    n = 6
    attention = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]  # uniform over the keys each row sees
    hidden = np.triu(np.ones((n, n), dtype=bool), k=1)
    figure = attention_maps.attention_heatmap(attention, list("abcdef"), "head", hidden=hidden)
    image = figure.axes[0].images[0]
    assert (np.ma.getmaskarray(image.get_array()) == hidden).all()
    hidden_colour = np.array(image.cmap.get_bad())
    zero_colour = np.array(image.cmap(image.norm(0.0)))
    assert np.abs(hidden_colour - zero_colour)[:3].max() > 0.1  # visibly different, not a shade off
    assert hidden_colour[3] == 1.0  # opaque: the same on any background
    legend = [text.get_text() for legend in figure.legends for text in legend.get_texts()]
    assert legend == [attention_maps.HIDDEN_LABEL]
    # without hidden keys (an encoder), no note
    assert attention_maps.attention_heatmap(attention, list("abcdef"), "head").legends == []


# ------------------------------------------------------------------------------------------------- tick labels


@pytest.mark.parametrize("n, fit", [(300, 64), (300, 48), (101, 10), (12, 64), (2, 2), (1000, 7), (44, 25)])
def test_thinned_ticks_keep_the_first_and_last_and_fit(n, fit):
    from attnscope.output import figures

    ticks = figures.thinned_ticks(n, fit)
    assert len(ticks) <= fit and ticks[0] == 0 and ticks[-1] == n - 1
    assert ticks == sorted(set(ticks))
    if n <= fit:
        assert ticks == list(range(n))
    else:
        steps = {b - a for a, b in zip(ticks[:-1], ticks[1:-1], strict=False)}  # all but the step to the last
        assert len(steps) <= 1  # evenly spaced
        step = steps.pop() if steps else ticks[-1]
        assert str(step)[0] in "125" and set(str(step)[1:]) <= {"0"}  # 1, 2, 5, 10, 20, 50, ...
        assert ticks[-1] - ticks[-2] > step / 2  # the last is not crowded by the one before


def test_token_labels_at_300_tokens_are_thinned_to_a_readable_pitch():
    from attnscope.output import attention_maps

    n = 300
    tokens = [f" word{k}" for k in range(n)]
    attention = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    axes = attention_maps.attention_heatmap(attention, tokens, "head").axes[0]
    labels = [label.get_text() for label in axes.get_xticklabels()]
    # 9 in square at 8 pt, a line and a quarter per label: 9 × 72 / 10 = 64 labels at most
    assert len(labels) <= 64 and labels == [label.get_text() for label in axes.get_yticklabels()]
    assert labels[0] == "0  word0" and labels[-1] == "299  word299"  # the position, then the token
    assert len(labels) >= 30  # thinned, not emptied
    # the layer grid's panels: 5 in at 6 pt → 48 labels at most; keys on the bottom row, queries on the left column
    grid = attention_maps.layer_grid(np.stack([attention] * 4), tokens, "layer")
    panels = [axes for axes in grid.axes if axes.images and axes.get_label() != "<colorbar>"][:4]
    x = [[label.get_text() for label in axes.get_xticklabels()] for axes in panels]
    y = [[label.get_text() for label in axes.get_yticklabels()] for axes in panels]
    assert 0 < len(x[2]) <= 48 and x[0] == x[1] == ["" for _ in x[0]] and x[2] == x[3]
    assert 0 < len(y[0]) <= 48 and y[1] == y[3] == ["" for _ in y[1]] and y[0] == y[2]


def test_every_token_is_labelled_when_they_fit():
    from attnscope.output import attention_maps

    tokens = [f"t{k}" for k in range(20)]
    axes = attention_maps.attention_heatmap(np.eye(20), tokens, "head").axes[0]
    assert [label.get_text() for label in axes.get_xticklabels()] == tokens


# --------------------------------------------------------------------------------------------------- role map


def test_the_role_legend_lists_only_the_roles_drawn_in_catalog_order():
    from attnscope.output import head_grids

    roles = [["mixed", "induction", "previous-token"], ["induction", "mixed", "mixed"]]
    scores = [["0.1"] * 3] * 2
    legend = head_grids.role_map(roles, scores, "Head roles").axes[0].get_legend()
    drawn = [text.get_text() for text in legend.get_texts()]
    assert drawn == [name for name in ROLE_NAMES if name in {"mixed", "induction", "previous-token"}]
    assert drawn == ["previous-token", "induction", "mixed"]
    colours = {role.name: role.colour.lower() for role in ROLES}
    import matplotlib.colors

    for handle, name in zip(legend.legend_handles, drawn, strict=True):
        assert matplotlib.colors.to_hex(handle.get_facecolor()) == colours[name]


# ------------------------------------------------------------------------------------------------- line plots


def _bench_result():
    """Two methods at two sequence lengths, batch 1, each timed in three runs: its median and its extremes."""
    rows = []
    for method, scale in (("floor", 1.0), ("attnscope", 2.0)):
        for seq in (128, 512):
            median = scale * seq / 1e4
            rows.append(
                {"method": method, "batch": 1, "seq": seq, "runs": 3, "median_s": median, "min_s": 0.9 * median,
                 "max_s": 1.25 * median, "tokens_per_s": seq / median}
            )  # fmt: skip
    return SimpleNamespace(
        rows=rows, model={"name": "tiny"}, settings={"device": "cpu", "device_name": "cpu", "cpu_threads": 1}
    )


def test_the_speed_picture_shows_each_lines_spread_from_the_slowest_to_the_fastest_run():
    bench = _bench_result()
    figure = bench_room.bench_figure(bench)
    axes = figure.axes[0]
    bars = {collection.get_gid(): collection for collection in axes.collections if collection.get_gid()}
    assert sorted(bars) == ["spread:attnscope, batch 1", "spread:floor, batch 1"]
    for row in bench.rows:
        segments = bars[f"spread:{row['method']}, batch 1"].get_segments()
        (segment,) = [s for s in segments if abs(np.log2(s[0][0] / row["seq"])) < 0.1]  # the bar at this length
        assert sorted(segment[:, 1]) == pytest.approx([row["seq"] / row["max_s"], row["seq"] / row["min_s"]])
        assert (
            segment[0, 1] < row["tokens_per_s"] < segment[1, 1] or segment[1, 1] < row["tokens_per_s"] < segment[0, 1]
        )
    assert "bars: the slowest to the fastest" in " ".join(text.get_text() for text in figure.texts)
    assert [label.get_text() for label in axes.get_xticklabels()] == ["128", "512"]  # the lengths, where they are


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_random_mha_lines_are_told_apart_by_the_role_palette_and_their_markers():
    import matplotlib.colors

    from attnscope.scores.catalog import PALETTE

    rows = [
        {"heads": h, "js": 0.1 * h, "js_distance": 0.2, "cosine": 0.5, "entropy_normalized": 0.8} for h in (1, 2, 4)
    ]
    figure = random_mha_room.random_mha_figure(
        SimpleNamespace(settings={"d_model": 64, "seq_len": 32, "trials": 2}, rows=rows)
    )
    lines = figure.axes[0].lines
    colours = [matplotlib.colors.to_hex(line.get_color()).upper() for line in lines]
    markers = [line.get_marker() for line in lines]
    assert len(lines) == 4 and len(set(colours)) == 4 and len(set(markers)) == 4
    assert set(colours) <= {colour.upper() for colour in PALETTE.values()}


def test_value_axes_start_at_zero():
    diversity = SimpleNamespace(model=MODEL, inputs=INPUTS, layer_scores={0: 0.512, 1: 0.500, 2: 0.506})
    random_mha = SimpleNamespace(
        settings={"d_model": 64, "seq_len": 32, "trials": 2},
        rows=[
            {"heads": 1, "js": None, "js_distance": None, "cosine": None, "entropy_normalized": 0.85},
            {"heads": 2, "js": 0.24, "js_distance": 0.48, "cosine": 0.56, "entropy_normalized": 0.84},
        ],
    )
    ablation = SimpleNamespace(
        model=MODEL, inputs=INPUTS, baseline_loss=3.2, prune=[{"removed": 1, "loss": 3.25}, {"removed": 2, "loss": 3.4}]
    )
    bench = _bench_result()
    for figure in (
        diversity_room.diversity_per_layer(diversity),
        random_mha_room.random_mha_figure(random_mha),
        ablate_room.prune_curve(ablation),
        bench_room.bench_figure(bench),
    ):
        assert figure.axes[0].get_ylim()[0] == 0.0
    axes = ablate_room.prune_curve(ablation).axes[0]
    assert [line.get_ydata().tolist() for line in axes.lines] == [pytest.approx([0.0, 0.05, 0.2])]  # the increase
    # a negative value takes the axis below 0, with a line at 0
    better = SimpleNamespace(model=MODEL, inputs=INPUTS, baseline_loss=3.2, prune=[{"removed": 1, "loss": 3.1}])
    axes = ablate_room.prune_curve(better).axes[0]
    assert axes.get_ylim()[0] < -0.09 and any(list(line.get_ydata()) == [0.0, 0.0] for line in axes.lines)


# --------------------------------------------------------------------------------------------- head matrices


def _clustered_diversity(n: int = 6, seed: int = 0):
    from attnscope.scores import groups

    rng = np.random.default_rng(seed)
    points = rng.random((n, 3))
    js = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    js /= js.max()
    linkage = groups.average_linkage(js)
    labels = [f"{k // 3}.{k % 3}" for k in range(n)]
    return SimpleNamespace(
        model=MODEL, inputs=INPUTS, layer=None, labels=labels, js=js, cosine=1 - js, order=linkage.order,
        linkage=linkage.merges, cluster_at=0.3,
    )  # fmt: skip


def test_the_clustered_matrix_has_its_dendrogram_in_the_matrix_order():
    from scipy.cluster.hierarchy import dendrogram

    result = _clustered_diversity()
    for name in ("js", "cosine"):
        figure = diversity_room.diversity_matrix(result, name)
        tree = [axes for axes in figure.axes if axes.get_gid() == "dendrogram"]
        assert len(tree) == 1
        matrix_axes = figure.axes[0]
        # the tree's leaves over the matrix's columns, in the same order
        assert dendrogram(result.linkage, no_plot=True)["leaves"] == result.order
        assert [label.get_text() for label in matrix_axes.get_xticklabels()] == [result.labels[k] for k in result.order]
        assert tree[0].get_xlim() == (0, 10 * len(result.labels))
        box, top = matrix_axes.get_position(), tree[0].get_position()
        assert (top.x0, top.x1) == pytest.approx((box.x0, box.x1)) and top.y0 > box.y1
        assert "clustered" in " ".join(text.get_text() for text in figure.texts)
        expected = result.js if name == "js" else result.cosine
        drawn = matrix_axes.images[0].get_array()
        assert np.allclose(drawn, expected[np.ix_(result.order, result.order)])
    # one layer: head order, no dendrogram
    one_layer = SimpleNamespace(**{**vars(result), "layer": 1})
    figure = diversity_room.diversity_matrix(one_layer, "js")
    assert not [axes for axes in figure.axes if axes.get_gid() == "dendrogram"]
    assert "clustered" not in " ".join(text.get_text() for text in figure.texts)


def test_matrix_of_many_heads_gives_each_head_its_label():
    """The figure as drawn, before it is rendered (rendering 144 × 144 cells takes seconds: see the slow test)."""
    from attnscope.output import head_matrices

    matrix = np.random.default_rng(0).random((144, 144))
    figure = head_matrices.head_matrix(matrix, LABELS, "JS", "JS divergence (bits)")
    axes = figure.axes[0]
    assert [label.get_text() for label in axes.get_xticklabels()] == LABELS  # every head labelled, none skipped
    assert [label.get_text() for label in axes.get_yticklabels()] == LABELS
    # 0.13 in per head (a 7 pt label each): 18.72 in, + 2.5 in and 1.8 in of margins
    assert tuple(figure.get_size_inches()) == pytest.approx((21.22, 20.52))
    assert all(label.get_fontsize() == pytest.approx(7.02, abs=0.01) for label in axes.get_xticklabels())  # 7 pt


@pytest.mark.slow
def test_matrix_of_many_heads_renders_at_its_known_size(tmp_path):
    from attnscope.output import figures, head_matrices
    from tests.support import png_size

    matrix = np.random.default_rng(0).random((144, 144))
    figure = head_matrices.head_matrix(matrix, LABELS, "JS", "JS divergence (bits)")
    assert png_size(figures.save(figure, tmp_path / "m.png", dpi=100)) == (2122, 2052)


def test_titles_say_what_in_words_and_the_model_and_input():
    from attnscope.output import figures

    result = _heads_result([["mixed"] * 4] * 2, {"previous_token": np.zeros((2, 4))})
    texts = [text.get_text() for text in heads_room.heads_score_heatmap(result, "previous_token").texts]
    assert texts == ["Previous-token attention per head", "tiny, 3 texts, 42 tokens"]
    assert figures.describe_input({"name": "demo"}, {"n_texts": 1, "n_tokens": 1}) == "demo, 1 text, 1 token"
    assert figures.describe_input({"name": "demo"}, text_index=2, n_tokens=1234) == "demo, text 2, 1,234 tokens"
