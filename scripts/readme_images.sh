#!/usr/bin/env bash
# Draw the pictures of the README and the documentation again, into docs/images/:
#   bash scripts/readme_images.sh [MODEL]      (default: the bundled demo model; run from the repository root)
# The report's picture is a screenshot of report.html in headless chromium (through playwright's Python package and
# the system's chromium, as the tests use them); without either, that picture is left as it is.
set -euo pipefail
model=${1:-demo}
out=docs/images
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
doctor="The doctor said that she would help the patient."
attnscope heads --model "$model" --out "$tmp/heads" --quiet --json > /dev/null
attnscope show "$doctor" --model "$model" --layer 0 --out "$tmp/show" > /dev/null
attnscope diversity --model "$model" --layer all --out "$tmp/diversity" --quiet --json > /dev/null
attnscope attend "$doctor" --model "$model" --from she --to doctor --out "$tmp/attend" --quiet --json > /dev/null
attnscope ablate --model "$model" --out "$tmp/ablate" --quiet --json > /dev/null
attnscope random-mha --d-model 64 --head-counts 1,2,4,8 --out "$tmp/random" --quiet --json > /dev/null
# one thread: on a shared machine two threads make the timings swing with whatever else runs
OMP_NUM_THREADS=1 attnscope bench --model "$model" --device cpu --seq-lens 32,64,128,256 --batch-sizes 1,8 \
  --repeats 5 --warmup 1 --no-micro --out "$tmp/bench" --quiet --json > /dev/null
attnscope report --model "$model" --out "$tmp/report" --quiet > /dev/null
attnscope circuit --model "$model" --out "$tmp/circuit" --quiet --json > /dev/null
repeat="The file and the list hold the value method. The file and the list hold the value"
attnscope patch --model "$model" --clean "$repeat" --corrupt "${repeat/value method/code method}" --answer method \
  --wrong table --out "$tmp/patch" --quiet --json > /dev/null
attnscope discover --model "$model" --clean "$repeat" --corrupt "${repeat/value method/code method}" --answer method \
  --wrong table --out "$tmp/discover" --quiet --json > /dev/null
# kvplan: the demo's context is 256 tokens, so a sink and a recent window that leave rows to measure
attnscope kvplan --model "$model" --sink 16 --recent 64 --out "$tmp/kvplan" --quiet --json > /dev/null
# the budget curve on the passkey model, whose retrieval head is known (docs/kvplan.md, "--check")
attnscope kvplan --model tests/data/passkey-model --file sample_texts/passkey-texts.jsonl --sink 4 --recent 16 \
  --streaming auto --check-lengths 192,256 --out "$tmp/curve" --quiet --json > /dev/null
# compare: the test suite's training run of a tiny GPT-2 on repeated random words (tests.support), its 17 checkpoints
python -c "import sys; from pathlib import Path; from tests.support import train_induction_checkpoints as t; t(Path(sys.argv[1]))" "$tmp/run" 2> /dev/null
words=$(python -c "from tests.support import INDUCTION_WORDS as w; print(' '.join(w[:20] * 2))")
attnscope compare "$words" $(for step in "$tmp"/run/step-*; do echo --model "$step"; done) --out "$tmp/compare" --quiet --json > /dev/null
mkdir -p "$out"
cp "$tmp/heads/role_map.png" "$tmp/heads/score_previous_token.png" "$tmp/heads/score_induction.png" "$out/"
cp "$tmp/show/attention_L0.png" "$tmp/diversity/js_matrix.png" "$tmp/diversity/layer_diversity.png" "$out/"
cp "$tmp/attend/attend.png" "$tmp/ablate/importance.png" "$tmp/random/random_mha.png" "$out/"
cp "$tmp/bench/tokens_per_s.png" "$tmp/circuit/circuit.png" "$out/"
cp "$tmp/circuit/dependencies.png" "$out/circuit_dependencies.png"
cp "$tmp/compare/trajectories.png" "$out/compare_induction_run.png"
cp "$tmp/patch/restored.png" "$out/patch_restored.png"
cp "$tmp/kvplan/kvplan.png" "$out/kvplan.png"
cp "$tmp/curve/kvplan_check.png" "$out/kvplan_curve.png"
cp "$tmp/discover/circuit.png" "$out/discover_circuit.png"
cp "$tmp/discover/faithfulness.png" "$out/discover_faithfulness.png"
python - "$tmp/report/report.html" "$out/report.png" <<'EOF' || echo "report.png left as it was (needs playwright and chromium)" >&2
import shutil, sys
from pathlib import Path
from playwright.sync_api import sync_playwright

page_file, picture = Path(sys.argv[1]).resolve(), sys.argv[2]
chromium = shutil.which("chromium") or shutil.which("chromium-browser")
if chromium is None:
    sys.exit(1)
with sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path=chromium)
    page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    page.goto(page_file.as_uri())
    page.wait_for_timeout(500)
    page.screenshot(path=picture)
    browser.close()
EOF
echo "pictures of $model written to $out"
