"""`--format` and `--dpi` end to end: every command that draws takes them, the files keep their stems and take the
format's suffix, vector files parse and come out byte-identical run after run, a PNG is its inches × dpi."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest

from attnscope.scores import catalog
from tests.support import CAT, png_size

DRAWING = ["heads", "show", "diversity", "random-mha", "attend", "ablate", "circuit", "bench"]


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("command", DRAWING + ["report", "info"])
def test_the_commands_that_draw_take_format_and_dpi(cli, command):
    code, out, _ = cli(command, "--help")
    assert code == 0
    drawing = command in DRAWING
    assert ("--format" in out) == drawing and ("--dpi" in out) == drawing
    if drawing:
        assert "png|svg|pdf" in out and "50<=x<=1200" in out and "[default: 150" in out


@pytest.mark.parametrize(
    "option, value, expected",
    [("--dpi", "20", "--dpi"), ("--dpi", "5000", "--dpi"), ("--format", "jpg", "--format")],
)
def test_a_picture_option_out_of_its_domain_is_one_line(cli, tiny_model_dir, tmp_path, option, value, expected):
    code, out, err = cli("show", CAT, "--layer", "0", "-m", tiny_model_dir, "--out", tmp_path, option, value)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("attnscope: error: ") and expected in line
    assert list(tmp_path.iterdir()) == []


def test_info_has_no_picture_options(cli, tiny_model_dir):
    code, _, err = cli("info", "-m", tiny_model_dir, "--format", "svg")
    assert code == 2 and "No such option" in err


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_random_mha_writes_a_pdf(cli, tmp_path):
    args = ("random-mha", "--d-model", "16", "--head-counts", "1,2", "--trials", "1", "--seq-len", "8")
    args += ("--format", "pdf")
    code, _, err = cli(*args, "--out", tmp_path / "a", "-q")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["random_mha.json", "random_mha.pdf"]
    assert (tmp_path / "a" / "random_mha.pdf").read_bytes().startswith(b"%PDF-")
    cli(*args, "--out", tmp_path / "b", "-q")
    assert (tmp_path / "a" / "random_mha.pdf").read_bytes() == (tmp_path / "b" / "random_mha.pdf").read_bytes()


@pytest.mark.slow
def test_heads_writes_svg_files_that_parse(cli, tiny_model_dir, tmp_path):
    code, _, err = cli(
        "heads", CAT, "-m", tiny_model_dir, "--out", tmp_path, "--plot", "1.2", "--format", "svg", "-q", "--json"
    )
    assert code == 0, err
    measured = [score.name for score in catalog.scores_for("decoder") if score.per_head]
    pictures = ["role_map.svg", "attention_1.2.svg"] + [f"score_{name}.svg" for name in measured]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["heads.json", "heads.csv", *pictures])
    for name in pictures:
        root = ElementTree.fromstring((tmp_path / name).read_bytes())
        assert root.tag == "{http://www.w3.org/2000/svg}svg", name


@pytest.mark.slow
@pytest.mark.parametrize("format", ["svg", "pdf"])
def test_the_same_command_twice_gives_the_same_bytes(cli, tiny_model_dir, tmp_path, format):
    written = {}
    for run in ("first", "second"):
        folder = tmp_path / run
        code, _, err = cli(
            "diversity", CAT, "-m", tiny_model_dir, "--layer", "all", "--out", folder, "--format", format
        )
        assert code == 0, err
        written[run] = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(written["first"]) == sorted(
        ["diversity.json", "diversity_pairs.csv", f"js_matrix.{format}", f"cosine_matrix.{format}",
         f"layer_diversity.{format}"]
    )  # fmt: skip
    assert written["first"] == written["second"]


@pytest.mark.slow
def test_dpi_sets_the_pixels_of_a_png(cli, tiny_model_dir, tmp_path):
    code, out, err = cli("show", CAT, "--layer", "1", "-m", tiny_model_dir, "--out", tmp_path, "--dpi", "300")
    assert code == 0, err
    # 2 × 2 panels of 2.5 in: 1.1 + 2 × 2.5 + 0.2 + 1.3 = 7.6 in wide; 0.8 + 0.36 + 2 × 2.5 + 0.36 + 1.36 = 7.88 in
    assert png_size(tmp_path / "attention_L1.png") == (2280, 2364)
