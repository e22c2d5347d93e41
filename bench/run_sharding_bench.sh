#!/usr/bin/env bash
# The ZeRO stages side by side: one rank against two ranks (threads of one process) at stages
# 0–3, and stage 3 with and without prefetch, each rank training the same micro-batch. Prints
# a Markdown table of throughput, per-rank memory and communication, then the per-rank memory
# by category.
#
# Usage: bench/run_sharding_bench.sh BUILD_DIR
# Environment (optional):
#   CONFIG            gpt2-small (default) | tiny | tiny-llama
#   ROUNDS            rounds (default 2); each round runs every row once, in the table's order,
#                     so drift in the machine's load hits every row alike
#   STEPS             timed steps per run (default 4)
#   WARMUP            untimed steps before them (default 2)
#   WORLD             ranks of the sharded rows (default 2)
#   THREADS_PER_RANK  default 0: the machine's cores divided among a run's ranks (the single
#                     rank then has all of them)
#   RAW_OUT           file to which every raw JSON line is appended (default: a temporary file)
# Progress and raw JSON lines go to stderr; the tables go to stdout.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
bin="$1/bin/sharding_bench"
config=${CONFIG:-gpt2-small}
rounds=${ROUNDS:-2}
steps=${STEPS:-4}
warmup=${WARMUP:-2}
world=${WORLD:-2}
threads=${THREADS_PER_RANK:-0}
for knob in ROUNDS:$rounds STEPS:$steps WORLD:$world; do
  if ! [[ ${knob#*:} =~ ^[1-9][0-9]*$ ]]; then
    echo "${knob%%:*} is '${knob#*:}'; it must be a positive integer" >&2
    exit 2
  fi
done
for knob in WARMUP:$warmup THREADS_PER_RANK:$threads; do
  if ! [[ ${knob#*:} =~ ^[0-9]+$ ]]; then
    echo "${knob%%:*} is '${knob#*:}'; it must be a non-negative integer" >&2
    exit 2
  fi
done
if [[ ! -x $bin ]]; then
  echo "$bin is missing: build the target sharding_bench first" >&2
  exit 2
fi

raw=${RAW_OUT:-$(mktemp -t zt_sharding_bench.XXXXXX)}
: >"$raw"
# Other work on the machine skews every figure; the footer says how loaded it was.
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# label|sharding_bench arguments. The first row is the reference the ratios are taken against.
rows=(
  "1 rank|--world-size 1 --stage 0"
  "$world ranks, stage 0|--world-size $world --stage 0"
  "$world ranks, stage 1|--world-size $world --stage 1"
  "$world ranks, stage 2|--world-size $world --stage 2"
  "$world ranks, stage 3, prefetch 1|--world-size $world --stage 3 --prefetch 1"
  "$world ranks, stage 3, prefetch 0|--world-size $world --stage 3 --prefetch 0"
)

for ((r = 1; r <= rounds; r++)); do
  for row in "${rows[@]}"; do
    label=${row%%|*}
    args=${row#*|}
    # shellcheck disable=SC2206  # args is a list of words on purpose
    cmd=("$bin" --config "$config" $args --steps "$steps" --warmup "$warmup"
      --threads-per-rank "$threads")
    echo "[$(date +%T)] round $r, $label: ${cmd[*]}" >&2
    out=$("${cmd[@]}" 2>&1)
    rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^\{.*\}$' | tail -n 1)
    if [[ $rc -ne 0 || -z $line ]]; then
      echo "  failed (exit $rc):" >&2
      printf '%s\n' "$out" | tail -n 20 | sed 's/^/    /' >&2
      printf '%s\t{"failed": true, "exit": %d}\n' "$label" "$rc" >>"$raw"
      continue
    fi
    echo "  $line" >&2
    printf '%s\t%s\n' "$label" "$line" >>"$raw"
  done
done
echo "raw results: $raw" >&2
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

/usr/bin/python3 - "$raw" "$config" "$load_start" "$load_end" <<'PY'
import json
import sys

raw_path, config, load_start, load_end = sys.argv[1:5]
GIB, MIB = 1024 ** 3, 1024 ** 2
runs, order = {}, []
with open(raw_path) as f:
    for line in f:
        label, text = line.rstrip("\n").split("\t", 1)
        if label not in runs:
            runs[label] = []
            order.append(label)
        runs[label].append(json.loads(text))


def best(results):
    """The fastest successful run of a row, with the lowest peak RSS of its runs, or None."""
    ok = [r for r in results if not r.get("failed")]
    if not ok:
        return None
    fastest = dict(max(ok, key=lambda r: r["tokens_per_s"]))
    leanest = min(ok, key=lambda r: r["peak_rss_bytes"])
    fastest["peak_rss_bytes"] = leanest["peak_rss_bytes"]
    fastest["baseline_rss_bytes"] = leanest["baseline_rss_bytes"]
    fastest["runs"] = len(ok)
    return fastest


rows = [(label, best(runs[label])) for label in order]
reference = rows[0][1] if rows else None
print(f"| {config} | tokens/s | vs 1 rank | step ms | arena high water / rank (GiB) "
      "| plan / rank (GiB) | peak RSS − baseline (GiB) | comm MB/step/rank | comm s/step "
      "| wait s/step | hidden |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for label, b in rows:
    if b is None:
        print(f"| {label} | failed | — | — | — | — | — | — | — | — | — |")
        continue
    ratio = (f"{b['tokens_per_s'] / reference['tokens_per_s']:.2f}×"
             if reference is not None else "—")
    hidden = "—" if b["hidden_fraction"] is None else f"{b['hidden_fraction']:.0%}"
    used = b["peak_rss_bytes"] - b["baseline_rss_bytes"]
    print(f"| {label} | {b['tokens_per_s']:,.0f} | {ratio} | {b['step_ms']:,.0f} "
          f"| {b['arena_high_water_bytes_max_rank'] / GIB:.3f} "
          f"| {b['plan_total_bytes_max_rank'] / GIB:.3f} | {used / GIB:.3f} "
          f"| {b['comm_bytes_per_step_per_rank'] / 1e6:,.1f} | {b['comm_s_per_step']:.2f} "
          f"| {b['wait_s_per_step']:.2f} | {hidden} |")

# Per-rank memory by category: the largest rank's arena high water (MiB) of each category.
categories = []
for _, b in rows:
    if b is None:
        continue
    for name in b["ranks"][0]["arena_high_water_by_category"]:
        if name not in categories:
            categories.append(name)
shown = [c for c in categories
         if any(b is not None and any(r["arena_high_water_by_category"].get(c, 0) > 0
                                      for r in b["ranks"]) for _, b in rows)]
print()
print("| arena high water / rank (MiB) | " + " | ".join(shown) + " |")
print("| --- |" + " --- |" * len(shown))
for label, b in rows:
    if b is None:
        continue
    cells = [max(r["arena_high_water_by_category"].get(c, 0) for r in b["ranks"]) / MIB
             for c in shown]
    print(f"| {label} | " + " | ".join(f"{x:,.0f}" for x in cells) + " |")

print()
threads = rows[0][1]["threads_per_rank"] if reference else "?"
gemm = reference["gemm"] if reference else "?"
print(f"Best tokens/s of {max(len(v) for v in runs.values())} round(s) per row (its step time, "
      "memory and communication beside it), lowest peak RSS; every rank trains the same "
      f"micro-batch; 1 rank with {threads} thread(s), GEMM {gemm}. comm = seconds the "
      "communicator worked per step per rank, wait = seconds compute blocked on it, "
      "hidden = 1 − wait/comm.")
print()
print(f"Load average (1, 5, 15 min) at the start: {load_start}; at the end: {load_end}.")
PY
