"""`report`: one self-contained HTML page, checked as text and in a real headless browser."""

import json
import re
import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from attnscope.report import characteristic_heads, top_heads_per_role
from attnscope.roles import Role

BROWSER = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None)


def record(layer, head, role, score, **scores):
    values = {"previous_token": 0.0, "first_token": 0.0, "self": 0.0, "local_lift": 0.0, "entropy_normalized": 0.0,
              "induction": None, "duplicate_token": None, **scores}
    return SimpleNamespace(layer=layer, head=head, label=f"{layer}.{head}", role=Role(role, "x", score), scores=values)


def test_characteristic_and_top_heads():
    heads = [
        record(0, 0, "previous-token", 0.6, previous_token=0.6),
        record(0, 1, "previous-token", 0.9, previous_token=0.9),
        record(1, 0, "broad", 0.85, entropy_normalized=0.85),
        record(1, 1, "mixed", 0.3, previous_token=0.3),
    ]
    assert [r.label for r in characteristic_heads(heads)] == ["0.1", "1.0"]  # best per role, mixed left out
    top = top_heads_per_role(heads, k=2)
    assert "induction" not in top  # not measured
    assert [r.label for r in top["previous-token"]] == ["0.1", "0.0"]
    assert [r.label for r in top["broad"]] == ["1.0", "0.0"]  # ties (0.0) in layer.head order


@pytest.fixture(scope="module")
def page(tiny_model_dir, tmp_path_factory):
    from attnscope.cli import run

    folder = tmp_path_factory.mktemp("report")
    assert run(["report", "-m", str(tiny_model_dir), "--out", str(folder / "a"), "-q"]) == 0
    assert run(["report", "-m", str(tiny_model_dir), "--out", str(folder / "b"), "-q"]) == 0
    return folder


def test_page_is_self_contained_deterministic_and_carries_the_numbers(page, cli, tiny_model_dir):
    text = (page / "a" / "report.html").read_text(encoding="utf-8")
    assert (page / "b" / "report.html").read_text(encoding="utf-8") == text  # byte-identical
    assert sorted(p.name for p in (page / "a").iterdir()) == ["report.html"]
    assert not re.search(r"(src|href)\s*=\s*[\"'](?!data:)", text)  # every resource is embedded
    assert "http://" not in text and "https://" not in text
    images = re.findall(r'src="data:image/png;base64,', text)
    assert len(images) >= 1 + 10 + 1  # role map, score heatmaps, diversity plot, at least
    data = json.loads(re.search(r'<script type="application/json" id="attnscope-data">(.*?)</script>', text, re.S).group(1))
    code, out, _ = cli("heads", "-m", tiny_model_dir, "--json")
    assert code == 0
    assert data["heads"]["heads"] == json.loads(out)["heads"]
    assert data["diversity"]["command"] == "diversity" and len(data["diversity"]["labels"]) == 8
    for head in data["heads"]["heads"]:
        assert f"<td>{head['label']}</td><td>{head['role']}</td>" in text  # the sortable table of every head


def run_browser(url, *args):
    return subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", *args, url],
        capture_output=True, text=True, timeout=120,
    )


def console_lines(stderr):
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.skipif(BROWSER is None, reason="no headless browser (Debian: apt-get install chromium); .ci/run installs it")
def test_page_in_headless_chromium(page, tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>notDefined();</script></body></html>")
    assert console_lines(run_browser(broken.as_uri(), "--dump-dom").stderr)  # the check below can see an error

    url = (page / "a" / "report.html").as_uri()
    dom = run_browser(url, "--dump-dom")
    assert console_lines(dom.stderr) == []
    assert 'data-ready="yes"' in dom.stdout  # the page's script ran to its end

    shot = tmp_path / "shot.png"
    run_browser(url, f"--screenshot={shot}", "--window-size=1200,1600", "--hide-scrollbars")
    import matplotlib.image

    pixels = (matplotlib.image.imread(shot)[..., :3] * 255).round().astype(int)  # (height, width, 3)
    data = json.loads(re.search(r'id="attnscope-data">(.*?)</script>', (page / "a" / "report.html").read_text(), re.S).group(1))
    from attnscope.plots import ROLE_COLOURS

    for role in {head["role"] for head in data["heads"]["heads"]}:  # every role on the map shows in its colour
        colour = np.array([int(ROLE_COLOURS[role][k : k + 2], 16) for k in (1, 3, 5)])
        assert (pixels == colour).all(-1).sum() > 2000, role
