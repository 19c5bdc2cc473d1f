#!/usr/bin/env bash
# How much two processes under torchrun save on the CPU (docs/performance.md, "Several processes on the CPU"):
# `circuit` (its removals shared), `circuit --method gradient` (its batches shared: `gradient`) and `compare` of two
# models (one process scores both, with their divergence; the other measures their losses), each timed as one process with one thread, one process with two threads, and
# two processes of one thread each (torchrun --nproc-per-node 2, gloo). The two processes' JSON must be the same
# bytes as one process's (one thread each): the script stops if it is not.
#
#     scripts/torchrun_speedup.sh [FOLDER]     # FOLDER: where the two models are saved (default: a temporary one)
#     COMMANDS="gradient" scripts/torchrun_speedup.sh     # some of them only (default: circuit gradient compare)
#
# The models: two random-weight GPT-2 "checkpoints" (scripts/time_compare.py's), 8 layers × 8 heads, width 512, the
# GPT-2 tokenizer of tests/data; the texts: the bundled samples, COPIES times over (default 3). Each way runs ROUNDS
# times (default 2), in turn; the least time of each is printed (on a shared machine, the least disturbed), as a
# Markdown table. Every time includes starting Python and importing torch (torchrun: its launcher too). Beside the
# wall clock, the CPU time (user + system, from /usr/bin/time) of the one process and of the busier of the two:
# on a machine other work shares, the wall clock of two processes says little, their CPU time what they would take
# on two free cores.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
rounds=${ROUNDS:-2}
copies=${COPIES:-3}
read -r -a names <<< "${COMMANDS:-circuit gradient compare}"
folder=${1:-$(mktemp -d)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$python" - "$folder" <<'EOF'
import sys
from pathlib import Path

sys.path.insert(0, "scripts")
from time_compare import save_checkpoints

save_checkpoints(Path(sys.argv[1]), 2, n_layer=8, n_head=8, n_embd=512, n_positions=512)
EOF
"$python" - "$folder/corpus.jsonl" "$copies" <<'EOF'
import json
import sys

from attnscope.pipeline.inputs import sample_texts

with open(sys.argv[1], "w") as corpus:
    for _ in range(int(sys.argv[2])):
        corpus.writelines(json.dumps({"text": text.text}) + "\n" for text in sample_texts())
EOF

first="$folder/step-00" second="$folder/step-01"
declare -A commands=(
    [circuit]="circuit --file $folder/corpus.jsonl -m $first --device cpu --json"
    [gradient]="circuit --method gradient --file $folder/corpus.jsonl -m $first --device cpu --json"
    [compare]="compare --file $folder/corpus.jsonl -m $first -m $second --device cpu --json"
)
# each process's CPU seconds into $folder/cpu.<its local rank> (one process: cpu.0)
timed='exec /usr/bin/time -f "%U %S" -o "$0.${LOCAL_RANK:-0}" "$@"'
declare -A ways=(
    [one1]="env OMP_NUM_THREADS=1 sh -c '$timed' $folder/cpu $python -m attnscope"
    [one2]="env OMP_NUM_THREADS=2 sh -c '$timed' $folder/cpu $python -m attnscope"
    [two1]="env OMP_NUM_THREADS=1 $python -m torch.distributed.run --standalone --nproc-per-node 2 --no-python \
            sh -c '$timed' $folder/cpu $python -m attnscope"
)
declare -A best=() cpu=()
least() { awk "BEGIN { b = \"$1\"; print (b == \"\" || $2 < b + 0) ? $2 : b }"; }
for round in $(seq "$rounds"); do
    for command in "${names[@]}"; do
        for way in one1 one2 two1; do
            rm -f "$folder"/cpu.*
            start=$(date +%s.%N)
            eval "${ways[$way]} ${commands[$command]}" > "$folder/$command-$way.json" 2> "$folder/$command-$way.err"
            key="$command-$way"
            best[$key]=$(least "${best[$key]:-}" "$(awk "BEGIN { print $(date +%s.%N) - $start }")")
            busiest=$(cat "$folder"/cpu.* | awk '{ s = $1 + $2; if (s > m) m = s } END { print m }')
            cpu[$key]=$(least "${cpu[$key]:-}" "$busiest")
            [[ $way != two1 ]] || cmp -s "$folder/$command-one1.json" "$folder/$command-two1.json" \
                || { echo "$command: the JSON of two processes differs from one process's" >&2; exit 1; }
        done
    done
done

echo "| command | 1 process, 1 thread | 1 process, 2 threads | 2 processes, 1 thread each | speed-up (against 1 thread / 2 threads) | CPU time: 1 process / the busier of 2 |"
echo "|---|---|---|---|---|---|"
for command in "${names[@]}"; do
    one1=${best[$command-one1]} one2=${best[$command-one2]} two1=${best[$command-two1]}
    cpu1=${cpu[$command-one1]} cpu2=${cpu[$command-two1]}
    awk "BEGIN { printf \"| $command | %.1f s | %.1f s | %.1f s | %.2f× / %.2f× | %.1f s / %.1f s (%.2f×) |\\n\", \
        $one1, $one2, $two1, $one1 / $two1, $one2 / $two1, $cpu1, $cpu2, $cpu1 / $cpu2 }"
done
