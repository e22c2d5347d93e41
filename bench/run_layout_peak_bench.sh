#!/usr/bin/env bash
# Measured memory of the 3D layouts on 8 ranks beside the memory plan (issue 18): the layouts
# of bench/layout_memory_bench.cc's plan tables (which plan GPT-2 1.5B and a Llama-7B shape, too
# large to run here) on a model that fits, each trained for real. All 8 ranks are threads of one
# sharding_bench process (as `zt train` runs them); per rank the plan's bytes and the arenas'
# bytes in use once the steps ran, and for the process its peak RSS above the baseline taken
# before any trainer allocated, beside the sum of the ranks' plans.
#
# Usage: bench/run_layout_peak_bench.sh BUILD_DIR
# Environment (optional):
#   CONFIG     tiny (default; GPT-2 family, tied) | tiny-llama (GQA 4/2, untied)
#   N_LAYER    blocks (default 8, so that 8 pipeline stages have a unit each)
#   PRECISION  bf16 (default: the plan tables' bf16 with f32 master weights) | fp32
#   STEPS      steps per run (default 2), WARMUP (default 1)
#   RAW_OUT    file to which every raw JSON line is appended (default: a temporary file)
set -uo pipefail

# shellcheck source=bench/sharding_bench_args.sh
source "$(dirname "$0")/sharding_bench_args.sh"
parse_sharding_bench_args 2 1 zt_layout_peak_bench "$@"
n_layer=${N_LAYER:-8}
precision=${PRECISION:-bf16}
if ! [[ $n_layer =~ ^[1-9][0-9]*$ ]]; then
  echo "N_LAYER is '$n_layer'; it must be a positive integer" >&2
  exit 2
fi

# label | sharding_bench flags. 8 micro-batches a step everywhere (gradient accumulation, or
# the pipeline's micro-batches), as the plan tables; 1F1B.
m="--micro-batches 8"
pp() { echo "--pipeline-parallel $1 $m --schedule 1f1b"; }
rows=(
  "TP1 PP1 DP8 ZeRO-1|--stage 1 $m"
  "TP1 PP1 DP8 ZeRO-3|--stage 3 $m"
  "TP1 PP2 DP4 ZeRO-1|--stage 1 $(pp 2)"
  "TP1 PP4 DP2 ZeRO-1|--stage 1 $(pp 4)"
  "TP1 PP8 DP1 ZeRO-0|--stage 0 $(pp 8)"
  "TP2 PP1 DP4 ZeRO-1|--stage 1 --tensor-parallel 2 $m"
  "TP4 PP1 DP2 ZeRO-1 +SP|--stage 1 --tensor-parallel 4 --sequence-parallel 1 $m"
  "TP2 PP2 DP2 ZeRO-1|--stage 1 --tensor-parallel 2 $(pp 2)"
  "TP2 PP2 DP2 ZeRO-1 +SP|--stage 1 --tensor-parallel 2 --sequence-parallel 1 $(pp 2)"
  "TP4 PP2 DP1 ZeRO-0 +SP|--stage 0 --tensor-parallel 4 --sequence-parallel 1 $(pp 2)"
  "TP2 PP4 DP1 ZeRO-0|--stage 0 --tensor-parallel 2 $(pp 4)"
)
for row in "${rows[@]}"; do
  label=${row%%|*}
  flags=${row#*|}
  echo "$label" >&2
  # shellcheck disable=SC2086  # flags are words
  line=$("$bin" --config "$config" --world-size 8 --n-layer "$n_layer" --precision "$precision" \
    $flags --steps "$steps" --warmup "$warmup" --threads-per-rank 1) || {
    echo "sharding_bench failed for $label" >&2
    exit 1
  }
  printf '%s\t%s\n' "$label" "$line" >>"$raw"
done

python3 - "$raw" <<'EOF'
import json, sys
MB = 1e6
print("| layout | plan, largest rank (MB) | in use, that rank (MB) | plan, smallest rank (MB) "
      "| Σ plans (MB) | peak RSS − baseline (MB) | measured / Σ plans | final loss |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for text in open(sys.argv[1]):
    label, line = text.rstrip("\n").split("\t", 1)
    run = json.loads(line)
    ranks = run["ranks"]
    largest = max(ranks, key=lambda r: r["plan_total_bytes"])
    smallest = min(r["plan_total_bytes"] for r in ranks)
    total = sum(r["plan_total_bytes"] for r in ranks)
    measured = run["peak_rss_bytes"] - run["baseline_rss_bytes"]
    print("| %s | %.2f | %.2f | %.2f | %.1f | %.1f | %.3f | %.3f |" % (
        label, largest["plan_total_bytes"] / MB, largest["arena_high_water_bytes"] / MB,
        smallest / MB, total / MB, measured / MB, measured / total, run["final_loss"]))
EOF
