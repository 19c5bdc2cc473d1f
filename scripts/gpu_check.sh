#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script for a lent machine (PyTorch, Triton and transformers installed;
# no network): the CUDA tests, the CLI on cuda against the CPU, and bench's figures on GPT-2-small-sized random
# weights; the circuit and compare timings. Results go to $OUT (default ./gpu-out).
#     bash scripts/gpu_check.sh [tests] [bench] [large] [timings]      (all when none is named)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi -L
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
# GPT-2 small's shape (GPT2Config's defaults) with random weights and the real GPT-2 tokenizer, saved like a real model
python3 - <<'PY'
import shutil, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
GPT2LMHeadModel(GPT2Config()).save_pretrained("/tmp/gpt2s")
# Llama 3.2 1B's shape (GPT-2's vocabulary): a config alone, for --random-weights
from transformers import LlamaConfig
LlamaConfig(vocab_size=50257, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, max_position_embeddings=8192, bos_token_id=50256, eos_token_id=50256,
            tie_word_embeddings=True).save_pretrained("/tmp/llama1b")
for folder in ("/tmp/gpt2s", "/tmp/llama1b"):
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(f"tests/data/gpt2-tokenizer/{name}", folder)
PY
stages=${*:-tests bench timings large}
if [[ $stages == *tests* ]]; then
echo "== CUDA tests"
timeout 240 python3 -m pytest -p no:cacheprovider -n 0 -q --tb=line -m "" tests/integration/test_fused_gpu.py \
  tests/integration/test_capture.py tests/integration/test_loading.py tests/e2e/test_kernel_cli.py \
  tests/integration/test_circuit.py tests/integration/test_compare.py 2>&1 | tail -25
echo "== the same JSON on cuda and cpu"
for device in cpu cuda; do
  timeout 60 python3 -m attnscope heads --model demo --device "$device" --json > "$OUT/heads_$device.json"
done
python3 - "$OUT" <<'PY'
import json, sys
cpu, cuda = (json.load(open(f"{sys.argv[1]}/heads_{d}.json")) for d in ("cpu", "cuda"))
worst = max(abs(a[k] - b[k]) for a, b in zip(cpu["heads"], cuda["heads"]) for k in a if isinstance(a[k], float))
roles = sum(a["role"] != b["role"] for a, b in zip(cpu["heads"], cuda["heads"]))
print(f"heads --model demo, cpu vs cuda: largest score difference {worst:.2e}, roles differing {roles}")
PY
fi
if [[ $stages == *bench* ]]; then
echo "== bench"
timeout 200 python3 -m attnscope bench -m /tmp/gpt2s --random-weights --device cuda --dtype bfloat16 \
  --methods floor,attnscope,fused,blocks,tutorial --seq-lens 128,1024 --batch-sizes 1,8 --repeats 3 --json > "$OUT/bench.json"
python3 - "$OUT" <<'PY'
import json, sys
doc = json.load(open(f"{sys.argv[1]}/bench.json"))
print(json.dumps(doc["model"])[:300])
for row in doc["results"]:
    print({k: row[k] for k in ("method", "batch", "seq", "median_s", "spread", "tokens_per_s", "time_vs_floor", "peak_mb")})
PY
fi
if [[ $stages == *timings* ]]; then
timeout 150 python3 scripts/time_circuit.py --device cuda | tee -a "$OUT/timings.jsonl"
timeout 200 python3 scripts/time_compare.py --device cuda --repeats 2 | tee -a "$OUT/timings.jsonl"
fi
if [[ $stages == *large* ]]; then
echo "== bench, larger shapes"
timeout 120 python3 -m attnscope bench -m /tmp/gpt2s --random-weights --device cuda --dtype bfloat16 \
  --methods floor,fused,blocks --seq-lens 1024 --batch-sizes 32 --repeats 3 --json > "$OUT/bench_gpt2_32.json"
timeout 200 python3 -m attnscope bench -m /tmp/llama1b --random-weights --device cuda --dtype bfloat16 \
  --methods floor,fused,blocks --seq-lens 1024,4096 --batch-sizes 1,8 --repeats 3 --json > "$OUT/bench_llama.json"
python3 - "$OUT" <<'PY'
import json, sys
for name in ("bench_gpt2_32", "bench_llama"):
    doc = json.load(open(f"{sys.argv[1]}/{name}.json"))
    for row in doc["results"]:
        print(name, {k: row[k] for k in ("method", "batch", "seq", "median_s", "spread", "time_vs_floor", "peak_mb")})
PY
fi
exit 0
