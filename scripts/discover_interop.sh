#!/usr/bin/env bash
# attnscope's `discover --method eap` against auto-circuit's edge attribution patching, on the same GPT-2 and pairs
# (tests/integration/test_discover_interop.py says what is compared and how conventions were converted). auto-circuit
# 1.0.1 runs on TransformerLens 2 (it imports transformer_lens.past_key_value_caching, gone from 3), which wants
# transformers 4; attnscope needs 5. So the peer gets a virtual environment of its own, and the test runs in
# attnscope's: it scores with attnscope in process and runs scripts/discover_interop_peer.py with the peer's Python,
# the two exchanging a model folder, a pairs file and a JSON of scores. Fails if a test fails or skips.
#     bash scripts/discover_interop.sh [VENV]      (default /tmp/attnscope-discover-peer; reused when it is there)
# attnscope's Python: $ATTNSCOPE_PYTHON (absolute, or from the checkout's root), else the checkout's .venv/bin/python,
# else the active venv's; it runs attnscope from this checkout (python -m puts the checkout first on sys.path).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-/tmp/attnscope-discover-peer}
ours=${ATTNSCOPE_PYTHON:-.venv/bin/python}
if [ -z "${ATTNSCOPE_PYTHON:-}" ] && [ ! -x "$ours" ] && [ -n "${VIRTUAL_ENV:-}" ]; then
  ours=$VIRTUAL_ENV/bin/python
fi
if [ ! -x "$ours" ]; then
  echo "discover_interop: no Python with attnscope: make .venv (docs/development.md) or give ATTNSCOPE_PYTHON" >&2
  exit 1
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet)
"${pip[@]}" torch==2.13.0
# attrs: auto_circuit/data.py imports it without declaring it; pyarrow: datasets' (through TransformerLens), the last
# one measured to read numpy 1 (TransformerLens 2 pins numpy < 2; pyarrow 26 refuses it on import)
"${pip[@]}" auto-circuit==1.0.1 transformer-lens==2.18.0 transformers==4.57.6 pyarrow==23.0.1 attrs
"$venv/bin/python" -c "import sys, torch, transformers, importlib.metadata as m
print('peer: python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__,
      'transformer-lens', m.version('transformer-lens'), 'auto-circuit', m.version('auto-circuit'))"
"$ours" -c "import sys, torch, transformers, attnscope
print('attnscope: python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__,
      'attnscope', attnscope.__file__)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ATTNSCOPE_DISCOVER_PEER="$venv/bin/python" "$ours" -m pytest tests/integration/test_discover_interop.py \
  -n 0 -q -s -rs -p no:cacheprovider | tee "$log"
if grep -q "skipped" "$log"; then
  echo "discover_interop: a test skipped, for the reason above" >&2
  exit 1
fi
