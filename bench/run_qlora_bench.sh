#!/usr/bin/env bash
# Runs qlora_bench (bench/qlora_bench.cc) and prints, beside its JSON lines, `zt estimate` of
# the QLoRA job and of full fine-tuning of the same model (the job files the bench writes next
# to the model), and the process's peak RSS as /usr/bin/time reports it.
#
# Usage: bench/run_qlora_bench.sh BUILD_DIR [qlora_bench flags...]
#   e.g. bench/run_qlora_bench.sh build --shape 7b --steps 3 --seq-len 512
# The model is written under /work/bench-data (13.5 GB for the 7b shape) unless --model-dir
# says otherwise, and reused when present. NICE (default 10) sets the run's niceness.
set -uo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR [qlora_bench flags...]" >&2
  exit 2
fi
build_dir=$1
shift
log=$(mktemp -t zt_qlora_bench.XXXXXX)
echo "# $(date -u '+%F %T UTC'), commit $(git -C "$(dirname "$0")" rev-parse --short HEAD)," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"
nice -n "${NICE:-10}" /usr/bin/time -v "$build_dir/bin/qlora_bench" "$@" 2> "$log.err" | tee "$log"
status=${PIPESTATUS[0]}
grep -E "Maximum resident set size|Elapsed \(wall clock\)" "$log.err"
model_dir=$(sed -n 's/.*"model_dir":"\([^"]*\)".*/\1/p' "$log" | head -n1)
if [[ -n $model_dir ]]; then
  for job in qlora_job full_ft_job; do
    echo "## zt estimate $model_dir/$job.json"
    "$build_dir/bin/zt" estimate "$model_dir/$job.json"
  done
fi
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
[[ $status -ne 0 ]] && cat "$log.err" >&2
rm -f "$log" "$log.err"
exit "$status"
