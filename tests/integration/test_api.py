"""The Python API on tiny models: what it takes as texts and as a model, what its results give (records, documents,
DataFrames, files, notebook HTML), and its errors, each one line before anything costly runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.pipeline.inputs import Text
from tests.support import CAT, DOCTOR

HOSTILE = "The <script>alert(1)</script> cat & the mat"


# ---------------------------------------------------------------------------------------------------- texts


def test_texts_as_a_string_a_list_text_objects_or_a_file(tiny, tmp_path):
    """Each form reaches the analysis as the CLI's would: a string is the TEXT argument (source "argument"), a
    list's k-th text "argument#k", a Text keeps its source, a file is read as --file reads it."""
    one = attnscope.heads(tiny, CAT, probe=False)
    assert one.inputs["n_texts"] == 1 and one.inputs["sources"] == ["argument"]
    listed = attnscope.heads(tiny, [CAT, DOCTOR], probe=False)
    assert listed.inputs["n_texts"] == 2 and listed.inputs["sources"] == ["argument#0", "argument#1"]
    mixed = attnscope.heads(tiny, [Text(CAT, "mine"), DOCTOR], probe=False)
    assert mixed.inputs["sources"] == ["mine", "argument#1"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"{CAT}\n\n{DOCTOR}\n", encoding="utf-8")
    from_file = attnscope.heads(tiny, file=corpus, probe=False)
    assert from_file.inputs["sources"] == [f"{corpus}#0", f"{corpus}#1"]
    # the same texts give the same scores whichever way they came
    assert [record.scores for record in from_file.heads] == [record.scores for record in listed.heads]


def test_no_texts_means_the_bundled_samples(tiny):
    result = attnscope.heads(tiny, probe=False)
    assert result.inputs["n_texts"] == 6 and result.inputs["sources"][0] == "sample:01_cat.txt"


@pytest.mark.parametrize(
    "texts, file, message",
    [
        (CAT, "corpus.txt", "texts and file (TEXT, --file): give one or the other"),
        ("   ", None, "the text given (TEXT) holds no text"),
        ([], None, "the texts given holds no text"),
        (["fine", 3], None, "text 1 of the list: expected a string or a Text of a string, not an int"),
        (42, None, "texts: expected a string or a list of strings, not a int"),
        (b"bytes", None, "texts: expected a string or a list of strings, not a bytes"),
        (None, "no-such-file.txt", "no such file: no-such-file.txt"),
    ],
)
def test_bad_texts_are_one_line_before_the_model_is_used(tiny, texts, file, message, monkeypatch):
    monkeypatch.setattr(type(tiny), "info", lambda self: pytest.fail("the model was used"))
    with pytest.raises(AttnscopeError) as raised:
        attnscope.heads(tiny, texts, file=file)
    assert str(raised.value).startswith(message)


# ---------------------------------------------------------------------------------------------------- models


@pytest.mark.slow
def test_a_model_by_name_is_loaded_with_the_keywords_given(tiny_model_dir, tiny):
    by_name = attnscope.heads(str(tiny_model_dir), CAT, device="cpu", dtype="float32", probe=False)
    loaded = attnscope.heads(tiny, CAT, probe=False)
    assert by_name.to_document() == loaded.to_document()
    assert attnscope.info(tiny_model_dir, device="cpu").model == tiny.info()  # a Path names a folder too


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_load_takes_the_clis_model_options(tiny_model_dir):
    model = attnscope.load(tiny_model_dir, "cpu", "bfloat16")
    assert model.info()["dtype"] == "bfloat16" and model.info()["device"] == "cpu"
    with pytest.raises(AttnscopeError, match="device_map 'everywhere': use one of auto, balanced, sequential"):
        attnscope.load(tiny_model_dir, device_map="everywhere")


@pytest.mark.parametrize(
    "model, keywords, message",
    [
        ("loaded", {"device": "cuda"}, "device='cuda': for a model given by name; this one is already loaded"),
        ("loaded", {"dtype": "float16", "revision": "main"}, "dtype='float16', revision='main': for a model given"),
        (object(), {}, "model: expected a model from attnscope.load or a name ('demo', a Hub id, a folder), not a"),
    ],
)
def test_a_loaded_model_takes_no_loading_keywords(tiny, model, keywords, message):
    with pytest.raises(AttnscopeError) as raised:
        attnscope.heads(tiny if model == "loaded" else model, CAT, **keywords)
    assert str(raised.value).startswith(message)


@pytest.mark.slow
def test_ablate_asks_for_the_language_model_head(tiny, tiny_model_dir):
    with pytest.raises(AttnscopeError, match=r"loaded without it: load it with attnscope.load\('.*'\) \(lm_head=False"):
        attnscope.ablate(tiny, CAT)
    with_head = attnscope.load(tiny_model_dir, "cpu", lm_head=True)
    by_name = attnscope.ablate(str(tiny_model_dir), CAT, device="cpu", method="gradient")
    assert attnscope.ablate(with_head, CAT, method="gradient").to_document() == by_name.to_document()
    # a model loaded with its head analyses like any other
    assert attnscope.heads(with_head, CAT).to_document() == attnscope.heads(tiny, CAT).to_document()


def test_settings_are_checked_before_the_texts_are_read(tiny):
    with pytest.raises(AttnscopeError, match="window 0: must be a whole number from 1 to 100,000"):
        attnscope.heads(tiny, file="no-such-file.txt", window=0)
    with pytest.raises(AttnscopeError, match="layer 'some': expected a layer number"):
        attnscope.diversity(tiny, CAT, layer="some")


# --------------------------------------------------------------------------------------------------- results


def test_records_documents_and_json_are_the_views(tiny):
    result = attnscope.heads(tiny, CAT, sort="prev", top=3)
    records = result.to_records()
    assert [record["label"] for record in records] == [record.label for record in result.selected]
    assert records[0]["previous_token"] == result.selected[0].scores["previous_token"]  # unrounded
    document = result.to_document()
    assert [head["label"] for head in document["heads"]] == [record["label"] for record in records]
    assert json.loads(result.to_json()) == document and result.to_json().endswith("}\n")


def test_to_dataframe_has_the_records_as_rows(tiny):
    pandas = pytest.importorskip("pandas")
    result = attnscope.diversity(tiny, CAT, layer=0)
    frame = result.to_dataframe()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns) == result.pair_columns()
    assert frame.to_dict("records") == result.to_records()


def test_without_pandas_to_dataframe_says_how_to_install_it(tiny, monkeypatch):
    result = attnscope.heads(tiny, CAT, probe=False)
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now raises ImportError
    with pytest.raises(AttnscopeError, match=r"to_dataframe needs pandas, .*: pip install pandas$"):
        result.to_dataframe()


def test_save_writes_the_files_of_out(tiny, tmp_path):
    written = attnscope.info(tiny).save(tmp_path / "made" / "here")
    assert [path.name for path in written] == ["info.json", "info.csv"]
    assert json.loads(written[0].read_text(encoding="utf-8"))["model"] == tiny.info()
    with pytest.raises(AttnscopeError, match="cannot write to"):
        attnscope.info(tiny).save(written[0] / "inside-a-file")


@pytest.mark.slow
def test_save_draws_the_pictures_of_out(tiny, tmp_path):
    result = attnscope.heads(tiny, CAT, plot=["1.2"])
    written = result.save(tmp_path / "results")
    names = sorted(path.name for path in written)
    assert names[:3] == ["attention_1.2.png", "heads.csv", "heads.json"] and "role_map.png" in names
    assert all(path.parent == tmp_path / "results" and path.stat().st_size > 0 for path in written)


def test_notebook_html_of_every_command_escapes_the_texts(tiny, tmp_path):
    """Tokens of a text holding markup are shown as text in every fragment that lists them, and no fragment has a
    script, a link or a picture."""
    fragments = {
        "attend": attnscope.attend(tiny, HOSTILE, from_token="cat", to_token="script")._repr_html_(),
        "show": attnscope.show(tiny, HOSTILE, layer=1)._repr_html_(),
        "heads": attnscope.heads(tiny, HOSTILE)._repr_html_(),
        "diversity": attnscope.diversity(tiny, HOSTILE, layer=0)._repr_html_(),
        "report": attnscope.report(tiny, HOSTILE)._repr_html_(),
        "info": attnscope.info(tiny)._repr_html_(),
        "random-mha": attnscope.random_mha(d_model=8, head_counts=[1, 2], seq_len=4, trials=1)._repr_html_(),
    }
    show = fragments["show"]  # the viewer: its data and its one script, after a static fallback
    fallback, _, viewer = show.partition('<div class="asv-panel"')
    assert "<script" not in fallback.lower() and "&lt;" in fallback and "&amp;" in fallback  # the tokens "<" and " &"
    assert viewer.count("<script") == 2 and viewer.count("</script>") == 2  # the JSON cannot close its element
    data = json.loads(re.search(r'class="asv-data">(.*?)</script>', viewer, re.S).group(1))
    assert "<" in data["viewer"]["texts"][0]["labels"]
    fragments["show"] = fallback
    for command, fragment in fragments.items():
        assert "<script" not in fragment.lower() and "<img" not in fragment and "http" not in fragment, command
        assert fragment.startswith('<div class="attnscope"'), command
        assert fragment.endswith("</div>") or command == "show", command
    assert "to script@" in fragments["attend"]  # the target named as the terminal names it


def test_show_lists_at_most_a_bounded_number_of_tokens(tiny):
    from attnscope.output.show import MAX_MAP_TOKENS

    long_text = " ".join(["word"] * (MAX_MAP_TOKENS + 10))
    fragment = attnscope.show(tiny, long_text, head="0.1")._repr_html_()
    assert f"the first {MAX_MAP_TOKENS} of {MAX_MAP_TOKENS + 11} tokens are shown" in fragment
    assert fragment.count("<tr>") == MAX_MAP_TOKENS + 1  # a header row and one per query
    data = json.loads(re.search(r'class="asv-data">(.*?)</script>', fragment, re.S).group(1))["viewer"]
    assert data["head_ids"] == [1] and data["layer_ids"] == [0]  # the viewer draws the head asked for
    assert data["texts"][0]["n"] == data["texts"][0]["length"] == MAX_MAP_TOKENS + 11  # all of them, up to 256


@pytest.mark.slow
def test_results_faces_import_no_matplotlib_unless_a_picture_is_drawn(tiny_model_dir):
    """In a fresh process: records, documents and notebook HTML never import matplotlib; `save` does."""
    code = (
        "import sys, attnscope\n"
        f"result = attnscope.heads({str(tiny_model_dir)!r}, 'The cat sat.', device='cpu')\n"
        "result.to_records(); result.to_json(); result._repr_html_()\n"
        "print('matplotlib' in sys.modules)\n"
    )
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=Path.cwd())
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == "False"


@pytest.mark.slow
def test_bench_times_the_model_named_with_the_settings_given(tiny_model_dir, tiny):
    result = attnscope.bench(
        tiny_model_dir,
        device="cpu",
        seq_lens=[8, 16],
        batch_sizes=[2],
        repeats=1,
        warmup=0,
        methods="floor",
        micro=False,
    )
    settings = result.to_document()["settings"]
    assert (settings["seq_lens"], settings["batch_sizes"], settings["methods"]) == ([8, 16], [2], ["floor"])
    assert [(row["method"], row["batch"], row["seq"]) for row in result.to_records()] == [
        ("floor", 2, 8),
        ("floor", 2, 16),
    ]
    with pytest.raises(AttnscopeError, match="bench loads the model itself"):
        attnscope.bench(tiny)


@pytest.mark.slow
def test_plot_gives_the_figures_that_save_writes(tiny, tmp_path):
    """`plot()` is `save`'s pictures as Figures, by file stem: the same names, and each Figure draws that file."""
    from matplotlib.figure import Figure

    result = attnscope.heads(tiny, CAT, plot=["1.2"])
    figures = result.plot()
    assert all(isinstance(figure, Figure) for figure in figures.values())
    assert {"role_map", "score_previous_token", "attention_1.2"} <= set(figures)
    written = result.save(tmp_path, format="svg", dpi=72)
    pictures = {path.stem for path in written if path.suffix == ".svg"}
    assert pictures == set(figures)
    assert attnscope.info(tiny).plot() == {}  # info draws nothing


def test_python_errors_name_the_keyword_not_the_command_lines_option(tiny, tmp_path):
    """The promise: from Python a line names the keyword (issue 38: `save` and `result.save` spoke of --out and
    --save)."""
    result = attnscope.heads(tiny, CAT)
    (tmp_path / "file").write_text("x")
    for folder, message in (
        (tmp_path / "results.json", r"^out .*results\.json is named like a file \(\.json\), but out is a folder"),
        (tmp_path / "file", r"^cannot write to out .*file: it is a file, not a folder$"),
    ):
        with pytest.raises(AttnscopeError, match=message) as raised:
            result.save(folder)
        assert "--" not in str(raised.value)
    with pytest.raises(AttnscopeError, match=r"^save 5: expected a folder's path, not an int; give a folder, e.g. "):
        attnscope.ablate(tiny, CAT, save=5)
