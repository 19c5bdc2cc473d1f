"""`report` end to end: the numbers it prints and embeds are `heads`' and `diversity`'s under the same settings; the
page is one self-contained file, the same on every run, and works in a real headless browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from attnscope.output.figures import ROLE_COLOURS
from tests.support import CAT

BROWSER = shutil.which("chromium")
PROBE_NOTE = "the repeated-token probe measures left-to-right copying; skipped for encoder models"
# role settings that move roles on the tiny models (a lower `broad` threshold, a narrower local window)
SETTINGS = ["--window", "1", "--threshold", "broad=0.4", "--probe-len", "8", "--probe-seed", "3"]


def _embedded(text: str) -> dict:
    found = re.search(r'<script type="application/json" id="attnscope-data">(.*?)</script>', text, re.S)
    return json.loads(found.group(1).replace("<\\/", "</"))


def _json(cli, *args):
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def _roles(doc):
    return {h["label"]: h["role"] for h in doc["heads"]}


def test_report_json_is_heads_and_diversity_and_writes_no_page(cli, model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc = _json(cli, "report", CAT, "-m", model_dir)
    assert doc["command"] == "report" and doc["settings"] == {"diversity": True}
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
    code, out, err = cli("report", "Hello world", "-m", tiny_model_dir, "--no-diversity", "--no-probe", "-q")
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


@pytest.mark.slow
def test_page_is_self_contained_deterministic_and_carries_the_numbers(page, cli, tiny_model_dir):
    text = (page / "a" / "report.html").read_text(encoding="utf-8")
    assert (page / "b" / "report.html").read_text(encoding="utf-8") == text  # byte-identical
    assert sorted(p.name for p in (page / "a").iterdir()) == ["report.html"]
    assert not re.search(r"(src|href)\s*=\s*[\"'](?!data:)", text)  # every resource is embedded
    assert "http://" not in text and "https://" not in text
    images = re.findall(r'src="data:image/png;base64,', text)
    assert len(images) >= 1 + 10 + 1  # role map, score heatmaps, diversity plot, at least
    data = _embedded(text)
    heads = _json(cli, "heads", "-m", tiny_model_dir, *SETTINGS)  # the same texts (the samples), the same settings
    assert data["heads"]["heads"] == heads["heads"]
    diversity = _json(cli, "diversity", "-m", tiny_model_dir, "--layer", "all")
    assert data["diversity"]["command"] == "diversity" and data["diversity"]["matrices"] == diversity["matrices"]
    for head in data["heads"]["heads"]:
        assert f"<td>{head['label']}</td><td>{head['role']}</td>" in text  # the sortable table of every head


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


def _run_browser(url, *args):
    return subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", *args, url],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _console_lines(stderr):
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.slow
@pytest.mark.skipif(BROWSER is None, reason="no headless browser (Debian: apt-get install chromium)")
def test_page_in_headless_chromium(page, tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>notDefined();</script></body></html>")
    assert _console_lines(_run_browser(broken.as_uri(), "--dump-dom").stderr)  # the check below can see an error

    url = (page / "a" / "report.html").as_uri()
    dom = _run_browser(url, "--dump-dom")
    assert _console_lines(dom.stderr) == []
    assert 'data-ready="yes"' in dom.stdout  # the page's script ran to its end

    shot = tmp_path / "shot.png"
    _run_browser(url, f"--screenshot={shot}", "--window-size=1200,1600", "--hide-scrollbars")
    import matplotlib.image

    pixels = (matplotlib.image.imread(shot)[..., :3] * 255).round().astype(int)  # (height, width, 3)
    data = _embedded((page / "a" / "report.html").read_text(encoding="utf-8"))
    for role in {head["role"] for head in data["heads"]["heads"]}:  # every role on the map shows in its colour
        colour = np.array([int(ROLE_COLOURS[role][k : k + 2], 16) for k in (1, 3, 5)])
        assert (pixels == colour).all(-1).sum() > 2000, role
