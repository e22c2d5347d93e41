#!/usr/bin/env bash
# Tokens/s, communication and per-rank plan of each parallel layout (issue 18) on the same
# cores: one rank, then data parallelism at every ZeRO stage, tensor parallelism and pipeline
# parallelism on 2 ranks (a core each on the project's 2-core machine), and the 4-rank
# layouts (2 ranks a core: oversubscribed there). Every rank is a thread of one sharding_bench
# process with one GEMM thread; each layout runs `ROUNDS` times, the layouts alternating.
# Prints a Markdown table (the median of the rounds' tokens/s, with every round's value).
#
# Usage: bench/run_layout_bench.sh BUILD_DIR
# Environment (optional):
#   CONFIG   tiny (default) | tiny-llama | gpt2-small
#   ROUNDS   rounds (default 2)
#   STEPS    timed steps per run (default 6), WARMUP untimed steps before them (default 2)
#   RAW_OUT  file to which every raw JSON line is appended (default: a temporary file)
set -uo pipefail

# shellcheck source=bench/sharding_bench_args.sh
source "$(dirname "$0")/sharding_bench_args.sh"
parse_sharding_bench_args 6 2 zt_layout_bench "$@"

# label | sharding_bench flags. Every row's micro-batch is the configuration's (tiny: 8 × 256)
# per data-parallel replica; pipeline rows run 4 of them a step. tokens/s counts them all.
rows=(
  "1 rank|--world-size 1 --stage 0"
  "DP2 ZeRO-0|--world-size 2 --stage 0"
  "DP2 ZeRO-1|--world-size 2 --stage 1"
  "DP2 ZeRO-2|--world-size 2 --stage 2"
  "DP2 ZeRO-3|--world-size 2 --stage 3"
  "TP2|--world-size 2 --tensor-parallel 2 --stage 0"
  "TP2 + SP|--world-size 2 --tensor-parallel 2 --sequence-parallel 1 --stage 0"
  "PP2 1F1B m4|--world-size 2 --pipeline-parallel 2 --micro-batches 4 --schedule 1f1b --stage 0"
  "DP4 ZeRO-1|--world-size 4 --stage 1"
  "TP2 x DP2 ZeRO-1|--world-size 4 --tensor-parallel 2 --stage 1"
  "PP2 x DP2 ZeRO-1 m4|--world-size 4 --pipeline-parallel 2 --micro-batches 4 --schedule 1f1b --stage 1"
  "TP4|--world-size 4 --tensor-parallel 4 --stage 0"
  "PP4 1F1B m4|--world-size 4 --pipeline-parallel 4 --micro-batches 4 --schedule 1f1b --stage 0"
)
for ((round = 1; round <= rounds; ++round)); do
  for row in "${rows[@]}"; do
    label=${row%%|*}
    flags=${row#*|}
    echo "round $round: $label" >&2
    # shellcheck disable=SC2086  # flags are words
    line=$("$bin" --config "$config" $flags --steps "$steps" --warmup "$warmup" \
      --threads-per-rank 1) || {
      echo "sharding_bench failed for $label" >&2
      exit 1
    }
    printf '%s\t%s\n' "$label" "$line" >>"$raw"
  done
done

python3 - "$raw" <<'EOF'
import json, statistics, sys
rows = {}
order = []
for text in open(sys.argv[1]):
    label, line = text.rstrip("\n").split("\t", 1)
    if label not in rows:
        rows[label] = []
        order.append(label)
    rows[label].append(json.loads(line))
print("| layout | ranks | tokens/s, median (rounds) | step ms | comm bytes sent / step / rank "
      "| TP count (Megatron) | bubble (formula) | plan / rank (MB) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for label in order:
    runs = rows[label]
    tps = [r["tokens_per_s"] for r in runs]
    first = runs[0]
    formula = first.get("tp_comm_bytes_formula_per_step_per_rank")
    bubble = first.get("pipeline_bubble")
    bubble_text = "—" if bubble is None else "%.3f (%.3f)" % (
        statistics.median(r["pipeline_bubble"] for r in runs), first["pipeline_bubble_formula"])
    print("| %s | %d | %.0f (%s) | %.0f | %s | %s | %s | %.1f |" % (
        label, first["world_size"], statistics.median(tps), ", ".join("%.0f" % t for t in tps),
        statistics.median(r["step_ms"] for r in runs),
        "{:,.0f}".format(first["comm_bytes_per_step_per_rank"]),
        "—" if formula is None else "{:,.0f}".format(formula), bubble_text,
        first["plan_total_bytes_max_rank"] / 1e6))
EOF
