#!/usr/bin/env bash
# `make demo`: train examples/tiny.yaml (a 3.3M-parameter GPT-2) on a real corpus — the
# fortune cookies of Debian's `fortunes` package, one token per byte — then print text
# sampled from the trained model. The loss falls from ln(256) ≈ 5.5 to about 2.6.
set -euo pipefail
build_dir=${1:-build}
zt="$build_dir/bin/zt"
corpus_dir=/usr/share/games/fortunes

mkdir -p .demo
if [[ ! -f .demo/train.bin || ! -f .demo/val.bin ]]; then
  # The plain-text files only: the .dat indexes and .u8 links are not text.
  mapfile -t inputs < <(find "$corpus_dir" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
  "$zt" prepare --tokenizer bytes --out .demo/train.bin --val-out .demo/val.bin \
    --val-fraction 0.05 "${inputs[@]}"
fi

"$zt" train examples/tiny.yaml --run-dir .demo/run --export .demo/tiny-gpt2.safetensors \
  --sample 400 --prompt $'Q: What is the meaning of life?\nA:'
echo
echo "metrics: .demo/run/metrics.jsonl   weights (Hugging Face GPT-2 layout): .demo/tiny-gpt2.safetensors"
