#!/usr/bin/env bash
# Regenerate the README's pictures: bash scripts/readme_images.sh [MODEL] (default: the bundled demo model).
set -euo pipefail
model=${1:-demo}
out=docs/images
tmp=$(mktemp -d)
attnscope heads --model "$model" --out "$tmp/heads" --quiet --json > /dev/null
attnscope show "The doctor said that she would help the patient." --model "$model" --layer 0 --out "$tmp/show" > /dev/null
attnscope diversity --model "$model" --layer all --out "$tmp/diversity" --quiet --json > /dev/null
attnscope ablate --model "$model" --out "$tmp/ablate" --quiet --json > /dev/null
mkdir -p "$out"
cp "$tmp/heads/role_map.png" "$tmp/heads/score_previous_token.png" "$tmp/heads/score_induction.png" "$out/"
cp "$tmp/show/attention_L0.png" "$tmp/diversity/js_matrix.png" "$tmp/diversity/layer_diversity.png" "$out/"
cp "$tmp/ablate/importance.png" "$out/"
rm -rf "$tmp"
echo "pictures of $model written to $out"
