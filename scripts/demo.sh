#!/usr/bin/env bash
# `make demo`: the product end to end on one machine. Starts `ztd --dev` (coordinator and
# node on loopback), submits examples/tiny.yaml (a 3.3M-parameter GPT-2) with
# `zt submit --watch` — a progress bar while the loss falls from ln(256) ≈ 5.5 to about 2.6 on
# the fortune cookies of Debian's `fortunes` package, one token per byte — then prints text
# sampled from the trained checkpoint and stops the daemon.
set -euo pipefail
build_dir=${1:-build}
zt="$build_dir/bin/zt"
ztd="$build_dir/bin/ztd"
corpus_dir=/usr/share/games/fortunes

mkdir -p .demo
if [[ ! -f .demo/train.bin || ! -f .demo/val.bin ]]; then
  # The plain-text files only: the .dat indexes and .u8 links are not text.
  mapfile -t inputs < <(find "$corpus_dir" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
  "$zt" prepare --tokenizer bytes --out .demo/train.bin --val-out .demo/val.bin \
    --val-fraction 0.05 "${inputs[@]}"
fi
# A fresh run: the job's checkpoint.dir must not hold an earlier run's checkpoints.
rm -rf .demo/checkpoints .demo/ztd

# One CPU device: the single rank of tiny.yaml computes with every core.
"$ztd" --dev --cpu-devices 1 --state-dir .demo/ztd --listen 127.0.0.1:0 \
  --metrics-addr 127.0.0.1:0 --run-root .demo/runs 2> .demo/ztd.log &
ztd_pid=$!
stop_daemon() {
  kill -TERM "$ztd_pid" 2>/dev/null || true
  wait "$ztd_pid" 2>/dev/null || true
}
trap stop_daemon EXIT
for _ in $(seq 300); do
  [[ -s .demo/ztd/address ]] && grep -q registered .demo/ztd.log && break
  kill -0 "$ztd_pid" 2>/dev/null || { cat .demo/ztd.log; exit 1; }
  sleep 0.1
done
export ZT_STATE_DIR=.demo/ztd
metrics_url=$(grep -o 'http://[^ ]*/metrics' .demo/ztd.log | head -n 1)
echo "ztd --dev: coordinator $(cat .demo/ztd/address), metrics $metrics_url (log: .demo/ztd.log)"

"$zt" submit examples/tiny.yaml --watch
echo
echo "metrics were served at $metrics_url; the job's run directory is under .demo/runs"
echo "sample from the trained checkpoint (.demo/checkpoints):"
"$zt" train examples/tiny.yaml --resume .demo/checkpoints --run-dir .demo/sample --quiet \
  --sample 400 --prompt $'Q: What is the meaning of life?\nA:'
echo
