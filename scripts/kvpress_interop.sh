#!/usr/bin/env bash
# attnscope's KV-cache plan in kvpress's DuoAttentionPress, generating (docs/kvplan.md): a virtual environment of its
# own, with kvpress and the transformers it pins (kvpress 0.5.5: < 5.3; its hooks fail with later ones, such as the
# project's own venv has), attnscope installed from this checkout, and tests/integration/test_kvpress_interop.py
# (attnscope.interop.kvpress's press generating) and tests/unit/test_kvplan_formats.py (the folder it reads; its
# one-line error where kvpress is missing, with kvpress hidden) run there. Fails if a test fails or skips.
#     bash scripts/kvpress_interop.sh [VENV]      (default /tmp/attnscope-kvpress; reused when it is there)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-/tmp/attnscope-kvpress}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet)
"${pip[@]}" torch==2.13.0
"${pip[@]}" transformers==5.2.0 kvpress==0.5.5 "pytest>=7" "pytest-xdist>=3.5"
"${pip[@]}" -e .  # attnscope's range, transformers >= 5.0, < 6, takes 5.2.0
"$venv/bin/python" -c "import sys, torch, transformers, kvpress, importlib.metadata as m
print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__,
      'kvpress', m.version('kvpress'), 'attnscope', m.version('attnscope'))"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$venv/bin/python" -m pytest tests/integration/test_kvpress_interop.py tests/unit/test_kvplan_formats.py -n 0 -q -rs \
  -p no:cacheprovider | tee "$log"
if grep -q "skipped" "$log"; then
  echo "kvpress_interop: a test skipped, for the reason above" >&2
  exit 1
fi
