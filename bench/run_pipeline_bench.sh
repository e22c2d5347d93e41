#!/usr/bin/env bash
# The pipeline bubble measured by the trainer (StepRecord::pipeline_bubble) against the
# unit-time formula (p − 1)/(v·m + p − 1), for p = 2, 4 stages and m = 4, 8 micro-batches under
# GPipe and 1F1B, and interleaved 1F1B (v = 2) beside them: sharding_bench's pipeline rows
# (ranks are threads of one process, one thread each). Prints a Markdown table.
#
# Usage: bench/run_pipeline_bench.sh BUILD_DIR
# Environment (optional):
#   CONFIG   tiny (default) | tiny-llama | gpt2-small
#   ROUNDS   rounds (default 2); each round runs every row once, in the table's order
#   STEPS    timed steps per run (default 4)
#   WARMUP   untimed steps before them (default 1)
#   RAW_OUT  file to which every raw JSON line is appended (default: a temporary file)
set -uo pipefail

# shellcheck source=bench/sharding_bench_args.sh
source "$(dirname "$0")/sharding_bench_args.sh"
parse_sharding_bench_args 4 1 zt_pipeline_bench "$@"

# schedule p m v n_layer (the interleaved rows need n_layer divisible by p · v)
rows=(
  "gpipe 2 4 1 4" "gpipe 2 8 1 4" "gpipe 4 4 1 4" "gpipe 4 8 1 4"
  "1f1b 2 4 1 4" "1f1b 2 8 1 4" "1f1b 4 4 1 4" "1f1b 4 8 1 4"
  "interleaved 2 4 2 4" "interleaved 2 8 2 4" "interleaved 4 4 2 8" "interleaved 4 8 2 8"
)
for ((round = 1; round <= rounds; ++round)); do
  for row in "${rows[@]}"; do
    read -r schedule p m v layers <<<"$row"
    echo "round $round: $schedule p $p m $m v $v" >&2
    "$bin" --config "$config" --world-size "$p" --stage 0 --pipeline-parallel "$p" \
      --micro-batches "$m" --schedule "$schedule" --virtual-stages "$v" --n-layer "$layers" \
      --steps "$steps" --warmup "$warmup" --threads-per-rank 1 >>"$raw" || {
      echo "sharding_bench failed for $row" >&2
      exit 1
    }
  done
done

python3 - "$raw" <<'PY'
import json, sys, collections
runs = collections.OrderedDict()
for line in open(sys.argv[1]):
    d = json.loads(line)
    key = (d["schedule"], d["pipeline_parallel"], d["micro_batches"], d["virtual_stages"])
    runs.setdefault(key, []).append(d)
print("| schedule | p | m | v | formula | measured bubble (per round) | step ms (per round) | busy s / stage / step (round 1) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for (schedule, p, m, v), ds in runs.items():
    busy = ", ".join("%.2f" % r["pipeline_busy_s_per_step"] for r in ds[0]["ranks"])
    print("| %s | %d | %d | %d | %.3f | %s | %s | %s |" % (
        schedule, p, m, v, ds[0]["pipeline_bubble_formula"],
        ", ".join("%.3f" % d["pipeline_bubble"] for d in ds),
        ", ".join("%.0f" % d["step_ms"] for d in ds), busy))
PY
