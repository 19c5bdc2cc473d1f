"""`report` end to end: the numbers it prints and embeds are `heads`' and `diversity`'s under the same settings; the
page is one self-contained file, the same on every run, and works in a real headless browser."""

from __future__ import annotations

import base64
import json
import re
import shutil

import numpy as np
import pytest

from attnscope.output.scales import SCALES
from tests.support import CAT

BROWSER = shutil.which("chromium")
PROBE_NOTE = "the probes (repeated tokens, needle) measure left-to-right copying; skipped for encoder models"
# role settings that move roles on the tiny models (a lower `broad` threshold, a narrower local window)
SETTINGS = ["--window", "1", "--threshold", "broad=0.4", "--probe-len", "8", "--probe-seed", "3"]


def _embedded(text: str) -> dict:
    found = re.search(r'<script type="application/json" id="attnscope-data"[^>]*>(.*?)</script>', text, re.S)
    return json.loads(found.group(1).replace("<\\/", "</"))


def _json(cli, *args):
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def _roles(doc):
    return {h["label"]: h["role"] for h in doc["heads"]}


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
def test_report_json_is_heads_and_diversity_and_writes_no_page(cli, model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc = _json(cli, "report", CAT, "-m", model_dir)
    assert doc["command"] == "report" and doc["settings"] == {"diversity": True, "ablate": False, "circuit": False}
    assert doc["ablation"] is None and doc["models"] is None and doc["by_model"] is None and doc["dependencies"] is None
    assert doc["heads"]["command"] == "heads" and doc["diversity"]["command"] == "diversity"
    heads = _json(cli, "heads", CAT, "-m", model_dir)
    assert doc["heads"]["heads"] == heads["heads"]
    diversity = _json(cli, "diversity", CAT, "-m", model_dir, "--layer", "all")
    assert doc["diversity"]["matrices"] == diversity["matrices"]
    assert doc["diversity"]["labels"] == [f"{layer}.{head}" for layer in range(2) for head in range(4)]
    assert list(tmp_path.iterdir()) == []  # no attnscope-report/ without --out
    code, out, _ = cli("report", CAT, "-m", model_dir, "--csv", "--no-diversity")
    assert code == 0 and list(tmp_path.iterdir()) == []
    _, heads_csv, _ = cli("heads", CAT, "-m", model_dir, "--csv")
    assert out == heads_csv  # one row per head, as `heads`' CSV
    assert _json(cli, "report", CAT, "-m", model_dir, "--no-diversity")["diversity"] is None


@pytest.mark.slow  # over 0.9 s in the quick loop (its minute): the full suite runs it
def test_report_roles_follow_the_role_settings_as_heads_does(cli, tiny_model_dir):
    """--window, --threshold, --probe-len and --probe-seed change the report's roles exactly as they change
    `heads`' (and they do change them: the defaults give other roles)."""
    report = _json(cli, "report", CAT, "-m", tiny_model_dir, "--no-diversity", *SETTINGS)["heads"]
    heads = _json(cli, "heads", CAT, "-m", tiny_model_dir, *SETTINGS)
    assert report["heads"] == heads["heads"]
    assert report["settings"]["window"] == 1 and report["settings"]["thresholds"]["broad"] == 0.4
    assert report["input"]["probe"] == {"period": 8, "sequences": 4, "seed": 3, "scored_rows": 32}
    default = _json(cli, "heads", CAT, "-m", tiny_model_dir)
    assert _roles(heads) != _roles(default)
    assert [h["local_lift"] for h in heads["heads"]] != [h["local_lift"] for h in default["heads"]]


@pytest.mark.slow
def test_report_prints_the_page_path_and_quiet_prints_nothing_else(cli, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(
        "report", "Hello world, hello again", "-m", tiny_model_dir, "--no-diversity", "--no-probe", "-q"
    )
    assert code == 0 and err == ""
    assert out == "attnscope-report/report.html\n"  # the default folder, in the current one
    assert [p.name for p in (tmp_path / "attnscope-report").iterdir()] == ["report.html"]


@pytest.fixture(scope="module")
def page(tiny_model_dir, tmp_path_factory):
    from attnscope.cli import run

    folder = tmp_path_factory.mktemp("report")
    for name in ("a", "b"):
        assert run(["report", "-m", str(tiny_model_dir), "--out", str(folder / name), "-q", *SETTINGS]) == 0
    return folder


def _decoded_matrix(text: str, size: int) -> np.ndarray:
    """A diversity matrix of the page: the pairs i < j as uint16, read back here (output/viewer.py's layout)."""
    codes = np.frombuffer(base64.b64decode(text), dtype="<u2") / 65535
    matrix = np.zeros((size, size))
    matrix[np.triu_indices(size, k=1)] = codes
    return matrix + matrix.T


def _decoded_maps(entry: dict, n_layer: int, n_head: int, causal: bool) -> np.ndarray:
    """(L, H, n, n) a text's maps read back (the keys after a causal query are NaN)."""
    n = entry["n"]
    codes = np.frombuffer(base64.b64decode(entry["maps"]), dtype=np.uint8)
    cells = n * (n + 1) // 2 if causal else n * n
    assert codes.size == n_layer * n_head * cells
    maps = np.full((n_layer, n_head, n, n), np.nan)
    rows, columns = np.tril_indices(n) if causal else np.indices((n, n)).reshape(2, -1)
    scale = np.array(entry["scale"])[..., None]
    maps[:, :, rows, columns] = scale * (codes.reshape(n_layer, n_head, cells) / 255) ** 2
    return maps


@pytest.mark.slow
def test_page_is_self_contained_deterministic_and_carries_the_numbers(page, cli, tiny_model_dir):
    text = (page / "a" / "report.html").read_text(encoding="utf-8")
    assert (page / "b" / "report.html").read_text(encoding="utf-8") == text  # byte-identical
    assert sorted(p.name for p in (page / "a").iterdir()) == ["report.html"]
    assert not re.search(r"(src|href)\s*=\s*[\"'](?!#)", text)  # no resource at all: links only within the page
    assert "http://" not in text and "https://" not in text and "data:image" not in text  # drawn, not pictures
    assert len(re.findall(r"<script", text)) == 2  # the data, and the one script
    assert "eval(" not in text and "new Function" not in text
    data = _embedded(text)
    heads = _json(cli, "heads", "-m", tiny_model_dir, *SETTINGS)  # the same texts (the samples), the same settings
    assert data["heads"]["heads"] == heads["heads"]
    diversity = _json(cli, "diversity", "-m", tiny_model_dir, "--layer", "all")
    assert data["diversity"]["command"] == "diversity" and "matrices" not in data["diversity"]
    assert data["diversity"]["order"] == diversity["order"]
    viewer = data["viewer"]
    assert viewer["scales"] == {name: scale.as_data() for name, scale in SCALES.items()}  # the pictures' colours
    for name in ("js", "cosine"):
        expected = np.array(diversity["matrices"][name])
        np.fill_diagonal(expected, 0.0)
        assert np.abs(_decoded_matrix(viewer["matrices"][name], 8) - expected).max() <= 1 / 131070 + 1e-6
    for head in data["heads"]["heads"]:
        assert f'<tr data-head="{head["label"]}"><td>{head["label"]}</td>' in text  # the table of every head
    # every head's maps of a text are `show`'s, read back within the square-root bound
    names = [entry["name"] for entry in viewer["texts"]]
    assert names[:6] == [
        f"sample:0{k}_{name}.txt" for k, name in enumerate(("cat", "doctor", "fox", "prose", "repeat", "code"), start=1)
    ] and names[6].startswith("probe: 8 random")
    for index in (0, 3):
        entry = viewer["texts"][index]
        decoded = _decoded_maps(entry, 2, 4, causal=True)
        for layer in range(2):
            shown = np.array(_json(cli, "show", "-m", tiny_model_dir, "--layer", layer, "--index", index)["maps"])
            assert (
                entry["n"] == shown.shape[-1]
                and entry["labels"]
                == _json(cli, "show", "-m", tiny_model_dir, "--layer", layer, "--index", index)["input"]["labels"]
            )
            lower = np.tril(np.ones(shown.shape[-2:], dtype=bool))
            assert np.isnan(decoded[layer][:, ~lower]).all()
            assert np.abs(decoded[layer][:, lower] - shown[:, lower]).max() <= 2 * 0.5 / 255 + 1e-6


@pytest.mark.slow
def test_encoder_page(cli, tiny_bert_dir, tmp_path):
    code, out, err = cli("report", CAT, "-m", tiny_bert_dir, "--out", tmp_path, "-q")
    assert code == 0, err
    assert out == f"{tmp_path / 'report.html'}\n" and err.strip() == f"note: {PROBE_NOTE}"
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    data = _embedded(text)
    assert data["heads"]["model"]["kind"] == "encoder"
    assert all(h["next_token"] is not None and h["induction"] is None for h in data["heads"]["heads"])
    assert "next_token" in text and PROBE_NOTE in text


# --------------------------------------------------------------------------------------------- in a browser
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"]  # fmt: skip
DEMO_BUDGET = 1_000_000  # bytes: the demo model's page, with the diversity and the ablation


def _playwright():
    """Playwright's Python package, driving the system's chromium (never a browser of its own): skips, saying why,
    where either is missing."""
    if BROWSER is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium; .ci/run installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install -e '.[test]')")
    return sync_playwright


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory):
    from attnscope.cli import run

    folder = tmp_path_factory.mktemp("demo-report")
    assert run(["report", "-m", "demo", "--ablate", "--out", str(folder), "-q"]) == 0
    return folder / "report.html"


@pytest.mark.slow
def test_the_demo_models_page_is_small(demo_page):
    assert demo_page.stat().st_size <= DEMO_BUDGET


@pytest.fixture(scope="module")
def browser():
    """Headless chromium driven by playwright, one for the module (playwright's sync API runs one at a time)."""
    sync_playwright = _playwright()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=BROWSER, args=BROWSER_ARGS)
        yield launched
        launched.close()


def _open(browser, path):
    """A new tab on `path` (file://), with every console message, page error and request recorded."""
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    seen = {"console": [], "requests": []}
    page.on("console", lambda message: seen["console"].append(f"{message.type}: {message.text}"))
    page.on("pageerror", lambda error: seen["console"].append(f"pageerror: {error}"))
    page.on("request", lambda request: seen["requests"].append(request.url))
    page.goto(path.as_uri())
    return page, seen


@pytest.fixture(scope="module")
def browser_page(browser, demo_page):
    """The demo page opened from file:// in headless chromium."""
    page, seen = _open(browser, demo_page)
    page.wait_for_selector("body[data-ready=yes]", timeout=20_000)
    return page, seen


def _painted(page, selector: str) -> int:
    """How many pixels of the canvas `selector` are not white: 0 for a map that was never drawn."""
    return page.eval_on_selector(
        selector,
        """canvas => { const d = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            let k = 0; for (let i = 0; i < d.length; i += 4) { if (d[i] + d[i + 1] + d[i + 2] < 740) { k++; } }
            return k; }""",
    )


@pytest.mark.slow
def test_clicking_a_head_shows_its_map_and_the_arrows_move(browser_page):
    page, _ = browser_page
    data = _embedded(page.content())
    induction = next(h for h in data["heads"]["heads"] if h["role"] == "induction")["label"]
    page.click(f'table.rolemap td[data-head="{induction}"]')
    panel = page.locator('[data-viewer="head"]')
    assert panel.get_attribute("data-head") == induction
    assert f"Head {induction}" in panel.locator(".asv-title").first.inner_text()
    assert "induction" in panel.locator(".asv-reason").inner_text()
    probe = len(data["viewer"]["texts"]) - 1  # an induction head is shown on the probe first
    assert panel.get_attribute("data-text") == str(probe)
    assert _painted(page, '[data-viewer="head"] .asv-view .asv-heat canvas') > 1000
    page.keyboard.press("ArrowRight")
    layer, head = (int(part) for part in induction.split("."))
    right = f"{layer}.{head + 1}" if head + 1 < 4 else f"{(layer + 1) % 2}.0"
    assert panel.get_attribute("data-head") == right
    page.keyboard.press("ArrowUp")
    assert panel.get_attribute("data-head") == f"0.{right.split('.')[1]}"
    assert page.locator(f'table.rolemap td.sel[data-head="0.{right.split(".")[1]}"]').count() == 1
    page.click('tr[data-head="0.2"]')  # a row of a table shows that head too
    assert panel.get_attribute("data-head") == "0.2"


@pytest.mark.slow
def test_a_long_texts_map_keeps_its_labels_thinned_as_the_pictures_do(browser_page):
    """The probe (101 tokens) is too long for a label per token: every k-th token is labelled with its position
    (`40 river`), the first and the last kept, as output/figures.py thins a PNG's, none overlapping another."""
    from attnscope.output.figures import thinned_ticks

    page, _ = browser_page
    data = _embedded(page.content())
    induction = next(h for h in data["heads"]["heads"] if h["role"] == "induction")["label"]
    page.click(f'table.rolemap td[data-head="{induction}"]')  # shown on the probe
    probe = data["viewer"]["texts"][-1]
    heat = page.locator('[data-viewer="head"] .asv-view .asv-heat').first
    for side, along in (("cols", "x"), ("rows", "y")):
        spans = heat.locator(f".asv-{side}.asv-thin span")
        texts = spans.all_inner_texts()
        positions = [int(text.split(" ")[0]) for text in texts]
        assert len(positions) >= 5 and positions[0] == 0 and positions[-1] == probe["n"] - 1
        assert positions == thinned_ticks(probe["n"], len(positions))  # the pictures' rule
        assert all(text == f"{i} {probe['labels'][i]}" for i, text in zip(positions, texts, strict=True))
        boxes = [spans.nth(k).bounding_box() for k in range(len(texts))]
        extent = "width" if along == "x" else "height"
        for before, after in zip(boxes, boxes[1:], strict=False):  # none overlaps the next
            assert after[along] >= before[along] + before[extent] - 0.5


@pytest.mark.slow
def test_hovering_a_token_highlights_its_row_and_what_it_looks_at(browser_page):
    page, _ = browser_page
    page.click('table.rolemap td[data-head="0.2"]')  # the previous-token head
    page.hover('[data-viewer="head"] .asv-strip span[data-i="5"]')
    heat = page.locator('[data-viewer="head"] .asv-view .asv-heat').first
    assert heat.get_attribute("data-row") == "5"
    strip = page.locator('[data-viewer="head"] .asv-strip span')
    assert "q" in strip.nth(5).get_attribute("class")
    weights = [float(strip.nth(k).get_attribute("data-weight") or "nan") for k in range(6)]
    assert weights[4] == max(weights)  # a previous-token head looks at the token before
    assert "looks most at" in page.locator('[data-viewer="head"] .asv-readout').inner_text()
    page.click('[data-viewer="head"] .asv-toggle button[data-value="layer"]')  # every head of the layer
    page.hover('[data-viewer="head"] .asv-strip span[data-i="3"]')
    rows = page.locator('[data-viewer="head"] .asv-view .asv-heat')
    assert rows.count() == 4 and all(rows.nth(k).get_attribute("data-row") == "3" for k in range(4))
    page.click('[data-viewer="head"] .asv-toggle button[data-value="lines"]')
    page.hover('[data-viewer="head"] .asv-lines .side.left span >> nth=3')
    assert page.locator('[data-viewer="head"] .asv-lines').get_attribute("data-row") == "3"
    assert _painted(page, '[data-viewer="head"] .asv-lines canvas') > 50
    page.click('[data-viewer="head"] .asv-toggle button[data-value="head"]')
    page.click('[data-viewer="head"] .asv-toggle button[data-value="map"]')


@pytest.mark.slow
def test_a_matrix_cell_names_two_heads_and_compares_them(browser_page):
    page, _ = browser_page
    matrix = page.locator('[data-viewer="matrix"] canvas')
    matrix.scroll_into_view_if_needed()
    box = matrix.bounding_box()
    page.mouse.move(box["x"] + box["width"] - 5, box["y"] + box["height"] - 45)  # a cell near the bottom right
    named = page.locator(".asv-matrix-readout").inner_text()
    assert re.search(r"\d\.\d .*~ \d\.\d .*JSD [\d.]+ bits, cosine [\d.]+", named)
    page.mouse.click(box["x"] + box["width"] - 5, box["y"] + box["height"] - 45)
    compare = page.locator(".asv-compare")
    pair = compare.get_attribute("data-pair").split()
    assert len(pair) == 2 and all(label in named for label in pair)
    assert compare.locator(".asv-card").count() == 2
    for k in range(2):
        assert _painted(page, f".asv-compare .asv-card >> nth={k} >> canvas") > 500


@pytest.mark.slow
def test_no_console_error_no_request_and_the_ablation_grid(browser_page, demo_page):
    page, seen = browser_page
    cells = page.locator("table.asv-ablation td[data-head]")
    assert cells.count() == 8
    data = _embedded(page.content())
    strongest = max(data["ablation"]["heads"], key=lambda h: h["importance"])
    # every cell in the colour importance.png gives its value (output.scales' loss_change): the largest rise red
    from types import SimpleNamespace

    from attnscope.output.ablate import ablate_importance

    importance = np.zeros((2, 4))
    for head in data["ablation"]["heads"]:
        importance[head["layer"], head["head"]] = head["importance"]
    picture = ablate_importance(
        SimpleNamespace(model={"name": "demo"}, inputs={}, importance=importance, method="loss")
    )
    image = picture.axes[0].images[0]
    for head in data["ablation"]["heads"]:
        colour = page.locator(f'table.asv-ablation td[data-head="{head["label"]}"]').evaluate(
            "cell => getComputedStyle(cell).backgroundColor"
        )
        shown = np.array([int(c) for c in re.findall(r"\d+", colour)])
        assert np.abs(shown - np.array(image.cmap(image.norm(head["importance"]))[:3]) * 255).max() <= 1.5, head
        if head is strongest:
            assert shown[0] > 150 > shown[2]  # red: the model needs this head most
    page.click(f'table.asv-ablation td[data-head="{strongest["label"]}"]')
    assert page.locator('[data-viewer="head"]').get_attribute("data-head") == strongest["label"]
    assert seen["console"] == []
    assert seen["requests"] == [demo_page.as_uri()]  # the page itself, nothing else


@pytest.mark.slow
def test_the_same_viewer_in_a_notebook(browser, tiny, tmp_path):
    """Two `show` results in one notebook page: each draws its own heads from its own data (no shared id), hovering
    a token in one leaves the other alone, and nothing is fetched."""
    import attnscope

    every_head = attnscope.show(tiny, CAT, layer=1)._repr_html_()
    one_head = attnscope.show(tiny, "Hello world, hello again", head="0.2", words=True)._repr_html_()
    notebook = tmp_path / "notebook.html"
    notebook.write_text(f"<!DOCTYPE html><html><body>{every_head}<p>between</p>{one_head}</body></html>", "utf-8")
    page, seen = _open(browser, notebook)
    page.wait_for_selector(".asv-fragment[data-ready=yes] >> nth=1", timeout=20_000)
    panels = page.locator('[data-viewer="head"]')
    assert [panels.nth(k).get_attribute("data-head") for k in range(2)] == ["1.0", "0.2"]
    assert page.locator(".asv-fallback").first.is_hidden()  # the static tables give way to the viewer
    assert panels.nth(0).locator(".asv-heads button").count() == 4  # every head of the layer
    panels.nth(0).locator(".asv-heads button >> nth=3").click()
    assert panels.nth(0).get_attribute("data-head") == "1.3"
    second = panels.nth(1)
    assert second.locator(".asv-toggle button.on").first.inner_text() == "words"  # show(words=True)
    second.locator('.asv-strip span[data-i="2"]').hover()
    assert second.locator(".asv-view .asv-heat").get_attribute("data-row") == "2"
    assert panels.nth(0).locator(".asv-view .asv-heat").get_attribute("data-row") == ""
    assert seen["console"] == [] and seen["requests"] == [notebook.as_uri()]
    page.close()


@pytest.mark.slow
def test_a_gpt2_small_sized_page_is_within_five_megabytes(tmp_path):
    """144 heads (GPT-2 small's shape, random weights, the real tokenizer) on the bundled samples: the quantised
    maps are as large whatever the weights, so random weights give the real size."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    from attnscope.cli import run
    from tests.support import TOKENIZER_DIR

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).save_pretrained(tmp_path / "model")
    GPT2TokenizerFast.from_pretrained(TOKENIZER_DIR).save_pretrained(tmp_path / "model")
    assert run(["report", "-m", str(tmp_path / "model"), "--out", str(tmp_path / "page"), "-q"]) == 0
    page = tmp_path / "page" / "report.html"
    data = _embedded(page.read_text(encoding="utf-8"))
    assert len(data["viewer"]["texts"]) == 7 and not any(text["n"] < text["length"] for text in data["viewer"]["texts"])
    assert page.stat().st_size <= 5_000_000


# ------------------------------------------------------------------------------------------ several models


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The demo model and a copy of it with head 0.2 (its previous-token head) removed by hand; the page of both
    (twice) and the page of each alone, as (folder, {name: embedded data})."""
    from attnscope.cli import run
    from attnscope.models.loading import demo_model_dir
    from tests.support import save_without_head

    folder = tmp_path_factory.mktemp("pair")
    without = save_without_head(demo_model_dir(), folder / "demo-without-0.2", 0, 2)
    pages = {}
    runs = {"both": ["demo", without], "again": ["demo", without], "demo": ["demo"], "without": [without]}
    for name, models in runs.items():
        given = [part for model in models for part in ("-m", str(model))]
        assert run(["report", *given, "--no-diversity", "--out", str(folder / name), "-q"]) == 0
        pages[name] = _embedded((folder / name / "report.html").read_text(encoding="utf-8"))
    return folder, pages


@pytest.mark.slow
def test_a_page_of_several_models_carries_each_models_own_report(pair):
    """Each model's records and maps on the page are those of its own one-model page; the last model's maps are
    the texts' own (the page opens on it: `primary`); head 0.2 removed leaves layer 0's maps alone and changes layer
    1's; the page is the same on every run."""
    folder, pages = pair
    both, demo, without = pages["both"], pages["demo"], pages["without"]
    assert (folder / "both" / "report.html").read_bytes() == (folder / "again" / "report.html").read_bytes()
    viewer = both["viewer"]
    assert [m["label"] for m in viewer["models"]] == ["demo", "demo-without-0.2"] and viewer["primary"] == 1
    assert viewer["models"][0]["heads"] == demo["heads"]["heads"]
    assert viewer["models"][1]["heads"] == without["heads"]["heads"] == both["heads"]["heads"]
    assert viewer["models"][0]["characteristic"] == demo["viewer"]["characteristic"]
    assert viewer["models"][1]["maps"] is None and viewer["texts"] == without["viewer"]["texts"]
    entries = demo["viewer"]["texts"]
    assert viewer["models"][0]["maps"] == [{"scale": t["scale"], "maps": t["maps"]} for t in entries]
    changed = 0
    for text, other in zip(viewer["texts"], viewer["models"][0]["maps"], strict=True):
        first = _decoded_maps({**text, **other}, 2, 4, causal=True)
        second = _decoded_maps(text, 2, 4, causal=True)
        np.testing.assert_array_equal(first[0], second[0])  # below the head removed: the same attention
        changed += np.nanmax(np.abs(first[1] - second[1])) > 0.01
    assert changed == len(viewer["texts"])
    roles = [{h["label"]: h["role"] for h in m["heads"]} for m in viewer["models"]]
    assert roles[0]["1.0"] == "induction" and roles[1]["1.0"] != "induction"  # the circuit broken by hand
    assert (folder / "both" / "report.html").stat().st_size <= 2 * (folder / "demo" / "report.html").stat().st_size


@pytest.mark.slow
def test_several_models_json_and_csv_are_each_models_heads(cli, fresh_loads, tiny_model_dir, tmp_path):
    """`--json`: the models' labels in order and each model's `heads` document as `heads --json` gives it; `--csv`:
    one row per head and model. (fresh_loads: a report of several frees each model it loaded.)"""
    from tests.support import save_without_head

    without = save_without_head(tiny_model_dir, tmp_path / "tiny-without-0.1", 0, 1)
    given = ["-m", tiny_model_dir, "-m", without, "--no-diversity"]
    doc = _json(cli, "report", CAT, *given)
    assert doc["models"] == [tiny_model_dir.name, "tiny-without-0.1"]
    assert doc["settings"] == {"diversity": False, "ablate": False, "circuit": False}
    for heads, model in zip(doc["by_model"], (tiny_model_dir, without), strict=True):
        assert heads["heads"] == _json(cli, "heads", CAT, "-m", model)["heads"]
    assert doc["heads"] == doc["by_model"][-1]  # the page's own tables are the last model's
    notes = " ".join(doc["notes"])
    assert "the tables are the last model's (tiny-without-0.1)" in notes
    assert "ablation" not in notes and "diversity" not in notes  # neither ran
    code, out, err = cli("report", CAT, *given, "--csv")
    assert code == 0, err
    rows = out.splitlines()
    assert rows[0].startswith("model,layer,head,label") and len(rows) == 1 + 2 * 8
    assert [row.split(",")[0] for row in rows[1:]] == [tiny_model_dir.name] * 8 + ["tiny-without-0.1"] * 8


@pytest.fixture(scope="module")
def other_shapes(tmp_path_factory):
    from tests.support import build_tiny_gpt2

    return {
        "three-layers": build_tiny_gpt2(tmp_path_factory.mktemp("three-layers"), n_layer=3),
        "two-heads": build_tiny_gpt2(tmp_path_factory.mktemp("two-heads"), n_head=2),
    }


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize(
    "given, says",
    [
        (
            ["-m", "{tiny}", "-m", "{three-layers}"],
            "'{tiny_name}' and '{three_name}' differ in shape: 2 layers × 4 heads against 3 × 4",
        ),
        (["-m", "{tiny}", "-m", "{two-heads}"], "'{two_name}' differ in shape: 2 layers × 4 heads against 2 × 2"),
        (["-m", "{tiny}", "-m", "{bert}"], "'{bert_name}' differ in kind: decoder against encoder"),
        (["-m", "{tiny}", "-m", "{tiny}"], "is given twice"),
        (["-m", "{tiny}", "-m", "demo", "--revisions", "a,b"], "revisions (--revisions) are revisions of one model"),
        (
            ["-m", "gpt2", "--revision", "main", "--revisions", "a,b"],
            "(--revision, --revisions): give one or the other",
        ),
        (["-m", "gpt2", "--revisions", "a,,b"], "a revision is empty"),
    ],
)
def test_models_that_cannot_share_a_page_are_refused_in_one_line(
    cli, tiny_model_dir, tiny_bert_dir, other_shapes, tmp_path, given, says
):
    """Refused before any weight loads: other layers × heads, another kind of attention, a model twice, revisions
    of several models (each line names what differs)."""
    folders = {"tiny": tiny_model_dir, "bert": tiny_bert_dir, **other_shapes}
    names = {
        "tiny_name": tiny_model_dir.name,
        "two_name": other_shapes["two-heads"].name,
        "three_name": other_shapes["three-layers"].name,
        "bert_name": tiny_bert_dir.name,
    }
    arguments = [part.format(**folders) for part in given]
    code, out, err = cli("report", CAT, *arguments, "--out", tmp_path / "page", "-q")
    assert code == 2 and out == "" and err.startswith("attnscope: error: ")
    assert len(err.strip().splitlines()) == 1 and says.format(**names) in err, err
    assert not (tmp_path / "page" / "report.html").exists()


def test_circuit_with_several_models_is_refused_in_one_line(cli, tiny_model_dir, monkeypatch):
    from tests.support import circuit_stand_in

    circuit_stand_in(monkeypatch)
    code, out, err = cli("report", CAT, "-m", tiny_model_dir, "-m", "demo", "--circuit", "-q")
    assert code == 2 and out == ""
    assert err == (
        "attnscope: error: circuit (--circuit) explains one model's heads: give one model (a page of several would "
        "need a circuit pass per model, and its arrows would belong to one of them)\n"
    )


@pytest.mark.slow
def test_revisions_of_one_repository_are_the_models_of_a_page(cli, fresh_loads, monkeypatch, tmp_path):
    """--revisions: a cache holding two revisions of one repository (different weights); each revision is a model
    of the page, labelled by its revision, its heads those of `heads --revision`."""
    import shutil

    from huggingface_hub import constants

    from tests.support import build_tiny_gpt2

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = "EleutherAI/pythia-tiny"
    for seed, revision in enumerate(("step0", "step1000")):
        source = build_tiny_gpt2(tmp_path / f"rev-{revision}", seed=seed)
        commit = f"{seed + 1}" * 40
        folder = tmp_path / "hub" / f"models--{repo.replace('/', '--')}"
        (folder / "snapshots" / commit).mkdir(parents=True)
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / revision).write_text(commit)
        for file in source.iterdir():
            shutil.copy(file, folder / "snapshots" / commit / file.name)
    doc = _json(cli, "report", CAT, "-m", repo, "--revisions", "step0,step1000", "--no-diversity", "--no-probe")
    assert doc["models"] == ["step0", "step1000"]
    for heads, revision in zip(doc["by_model"], ("step0", "step1000"), strict=True):
        alone = _json(cli, "heads", CAT, "-m", repo, "--revision", revision, "--no-probe")
        assert heads["heads"] == alone["heads"]
    assert doc["by_model"][0]["heads"] != doc["by_model"][1]["heads"]


# ----------------------------------------------------------------------------------------------- --circuit


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
def test_circuit_records_travel_in_the_json_and_the_page(cli, tiny_model_dir, monkeypatch, tmp_path):
    from tests.support import DEPENDENCIES, circuit_stand_in

    circuit_stand_in(monkeypatch)
    doc = _json(cli, "report", CAT, "-m", tiny_model_dir, "--no-diversity", "--circuit")
    assert doc["settings"]["circuit"] is True and doc["dependencies"] == DEPENDENCIES
    code, _, err = cli("report", CAT, "-m", tiny_model_dir, "--no-diversity", "--circuit", "--out", tmp_path, "-q")
    assert code == 0, err
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert _embedded(text)["viewer"]["dependencies"] == DEPENDENCIES
    rows = re.findall(r'<tr data-head="([\d.]+)"><td>[\d.]+</td><td>([\d.]+)</td>', text.split('id="circuit"')[1])
    assert rows[:3] == [("1.3", "0.2"), ("1.0", "0.2"), ("1.0", "0.1")]  # the table, largest change first


# ------------------------------------------------------------------------------- several models, --circuit: browser


def _background(page, selector):
    colour = page.locator(selector).evaluate("cell => getComputedStyle(cell).backgroundColor")
    return tuple(int(c) for c in re.findall(r"\d+", colour)[:3])


def _hex(colour):
    return tuple(int(colour[k : k + 2], 16) for k in (1, 3, 5))


def _pixels(page, selector):
    """A fingerprint of a canvas's pixels (the sum of each channel), to tell two drawings apart."""
    return page.eval_on_selector(
        selector,
        """canvas => { const d = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            let s = [0, 0, 0];
            for (let i = 0; i < d.length; i += 4) { s[0] += d[i]; s[1] += d[i + 1]; s[2] += d[i + 2]; }
            return s.join(","); }""",
    )


@pytest.mark.slow
def test_the_model_slider_redraws_the_role_map_and_keeps_the_head(browser, pair):
    folder, pages = pair
    viewer = pages["both"]["viewer"]
    roles = {role["name"]: role for role in viewer["roles"]}
    records = [{h["label"]: h["role"] for h in m["heads"]} for m in viewer["models"]]
    differing = [label for label in records[0] if records[0][label] != records[1][label]]
    assert differing  # head 0.2 removed moves some later head's role
    head = differing[0]
    page, seen = _open(browser, folder / "both" / "report.html")
    page.wait_for_selector("body[data-ready=yes]", timeout=20_000)
    cell = f'table.rolemap td.cell[data-head="{head}"]'
    # it opens on the last model: the slider, the role map and the panel show it
    assert page.locator("body").get_attribute("data-model") == "demo-without-0.2"
    assert page.locator('[data-viewer="models"] input[type="range"]').input_value() == "1"
    assert page.locator(cell).get_attribute("data-role") == records[1][head]
    page.click(cell)
    panel = page.locator('[data-viewer="head"]')
    assert panel.get_attribute("data-model") == "demo-without-0.2"
    map_canvas = '[data-viewer="head"] .asv-view .asv-heat canvas'
    page.select_option('[data-viewer="head"] select[aria-label="text"]', "0")  # one text for both models
    page.click('[data-viewer="models"] button[data-value="0"]')
    drawn = _pixels(page, map_canvas)  # the first model's map
    for model in (0, 1, 0):
        if model == 1:
            page.locator('[data-viewer="models"] input[type="range"]').fill("1")  # the slider itself
        else:
            page.click('[data-viewer="models"] button[data-value="0"]')  # a model's labelled button
        role = roles[records[model][head]]
        assert page.locator(cell).get_attribute("data-role") == role["name"]
        assert _background(page, cell) == _hex(role["colour"])
        assert page.locator(cell).inner_text() == role["short"]
        assert panel.get_attribute("data-head") == head  # the head stays chosen
        assert panel.get_attribute("data-model") == viewer["models"][model]["label"]
        assert panel.get_attribute("data-text") == "0"
        assert role["name"] in panel.locator(".asv-title").first.inner_text()
        now = _pixels(page, map_canvas)
        assert (now == drawn) == (model == 0)  # the map of the model shown
    page.select_option(".colour-by select", "induction")  # coloured by a score: the model's own values
    for model in (1, 0):
        page.click(f'[data-viewer="models"] button[data-value="{model}"]')
        value = next(h["induction"] for h in viewer["models"][model]["heads"] if h["label"] == head)
        assert page.locator(cell).inner_text() == f"{value:.2f}"
    page.select_option(".colour-by select", "role")
    unchanged = next(label for label in records[0] if label.startswith("0."))  # layer 0: the same in both
    page.click(f'table.rolemap td.cell[data-head="{unchanged}"]')
    first = _pixels(page, map_canvas)
    page.locator('[data-viewer="models"] input[type="range"]').fill("1")
    assert _pixels(page, map_canvas) == first
    assert page.title() == "attnscope report: demo, demo-without-0.2 (2 models)"  # the labels, not the paths
    assert seen["console"] == [] and len(seen["requests"]) == 1
    page.close()


@pytest.fixture(scope="module")
def circuit_page(tmp_path_factory):
    """The demo model's page with the circuit stand-in's records (tests.support.DEPENDENCIES)."""
    from attnscope.cli import run
    from tests.support import circuit_stand_in

    folder = tmp_path_factory.mktemp("circuit")
    with pytest.MonkeyPatch.context() as patch:
        circuit_stand_in(patch)
        assert run(["report", "-m", "demo", "--no-diversity", "--circuit", "--out", str(folder), "-q"]) == 0
    return folder / "report.html"


@pytest.mark.slow
def test_clicking_a_head_shows_its_dependencies_and_marks_them_in_the_role_map(browser, circuit_page):
    from tests.support import DEPENDENCIES

    page, seen = _open(browser, circuit_page)
    page.wait_for_selector("body[data-ready=yes]", timeout=20_000)
    top = max(abs(d["change"]) for d in DEPENDENCIES)
    page.click('table.rolemap td.cell[data-head="1.0"]')
    upstream = page.locator('[data-viewer="head"] .asv-deps[data-direction="upstream"] .asv-dep')
    assert upstream.evaluate_all("items => items.map(item => item.dataset.head)") == ["0.2", "0.1"]  # largest first
    assert "0.96 → 0.43 (−0.53)" in upstream.first.inner_text()
    marked = 'table.rolemap td.cell[data-head="0.2"]'
    assert page.locator(marked).get_attribute("data-circuit") == "upstream"
    outline = page.locator(marked).evaluate("cell => getComputedStyle(cell).outlineColor")
    expected = SCALES["score_change"].rgb(-0.53, top)  # the diverging scale of output/scales.py
    assert np.abs(np.array([int(c) for c in re.findall(r"\d+", outline)[:3]]) - expected).max() <= 1
    assert "asv-faded" in page.locator('table.rolemap td.cell[data-head="1.1"]').get_attribute("class")
    assert "asv-faded" not in page.locator(marked).get_attribute("class")
    assert page.locator("canvas.asv-edges").get_attribute("data-edges") == "0.2>1.0 0.1>1.0"
    assert _painted(page, "canvas.asv-edges") > 20
    page.click('table.rolemap td.cell[data-head="0.2"]')
    downstream = page.locator('[data-viewer="head"] .asv-deps[data-direction="downstream"] .asv-dep')
    assert downstream.evaluate_all("items => items.map(item => item.dataset.head)") == ["1.3", "1.0"]
    assert page.locator('table.rolemap td.cell[data-head="1.3"]').get_attribute("data-circuit") == "downstream"
    assert page.locator('table.rolemap td.cell[data-head="0.1"]').get_attribute("data-circuit") is None
    downstream.first.click()  # a dependency in the panel selects its head
    assert page.locator('[data-viewer="head"]').get_attribute("data-head") == "1.3"
    page.click('#circuit tr[data-head="1.0"]')  # and a row of the circuit's table
    assert page.locator('[data-viewer="head"]').get_attribute("data-head") == "1.0"
    assert seen["console"] == [] and len(seen["requests"]) == 1
    page.close()


@pytest.mark.slow
def test_the_circuits_arrows_never_cover_a_cells_label(browser, circuit_page):
    """On the demo's small role map (2 × 4 cells, where arrows between neighbours cross other cells), every cell's
    label reads the same with the arrows drawn and with the arrows' canvas hidden: the arrows pass under the labels.
    The arrows are there (the map differs outside the labels)."""
    import io

    from PIL import Image

    page, seen = _open(browser, circuit_page)
    page.wait_for_selector("body[data-ready=yes]", timeout=20_000)
    table = page.locator("table.rolemap")
    for head in ("1.0", "0.2", "1.3"):
        page.click(f'table.rolemap td.cell[data-head="{head}"]')
        assert page.locator("canvas.asv-edges").get_attribute("data-edges")
        drawn = np.asarray(Image.open(io.BytesIO(table.screenshot())).convert("RGB"), dtype=int)
        page.eval_on_selector("canvas.asv-edges", "canvas => { canvas.style.visibility = 'hidden'; }")
        bare = np.asarray(Image.open(io.BytesIO(table.screenshot())).convert("RGB"), dtype=int)
        page.eval_on_selector("canvas.asv-edges", "canvas => { canvas.style.visibility = ''; }")
        assert drawn.shape == bare.shape and np.abs(drawn - bare).sum() > 0  # the arrows show somewhere
        boxes = page.eval_on_selector_all(
            "table.rolemap td.cell .asv-label",
            """labels => { const t = labels[0].closest("table").getBoundingClientRect();
                return labels.map(l => { const b = l.getBoundingClientRect();
                    return [b.left - t.left, b.top - t.top, b.right - t.left, b.bottom - t.top]; }); }""",
        )
        assert len(boxes) == 8
        for left, top, right, bottom in boxes:  # each label's box, less its anti-aliased edge
            box = (slice(int(np.ceil(top)) + 1, int(bottom) - 1), slice(int(np.ceil(left)) + 1, int(right) - 1))
            # within 3 of 255 per channel: a faded cell's white veil is a gradient, which chromium dithers; an
            # arrow (its white halo on the veil's grey, 12 apart at least, or its colour) would differ more
            assert np.abs(drawn[box] - bare[box]).max() <= 3, (head, left, top)
    assert seen["console"] == []
    page.close()
