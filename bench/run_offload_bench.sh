#!/usr/bin/env bash
# Optimizer offload figures (issue 16): step time of one rank with the optimizer's states on
# the device (none), in host memory (cpu, ZeRO-Offload) and in the NVMe swap store (nvme,
# ZeRO-Infinity's optimizer offload), each its own process, the three alternating.
#
# Usage: bench/run_offload_bench.sh BUILD_DIR
# Needs BUILD_DIR/bin/training_bench. Environment (optional):
#   CONFIG     tiny (default), gpt2-small, ...
#   STEPS      timed steps (default 10), WARMUP untimed steps before them (default 2)
#   ROUNDS     rounds of the three (default 2); the fastest step of each mode is kept
#   THREADS    threads (default 2)
#   ZERO_STAGE the ZeRO stage of every mode (default 1; at 2 and 3 CPU offload's gradient copies
#              are queued during the backward, at 1 as the reduce-scatters after it land)
#   NVME_PATH  the swap store's directory (default: a temporary directory under the build
#              directory, removed at the end: it should be on the disk being measured)
#   BUFFER_COUNT  offload.buffer_count for nvme (default 6)
#   BUFFER_SIZE   offload.buffer_size in bytes for cpu and nvme (default: the job's, 200 MB:
#                 DeepSpeed's default, far more than a small model's unit needs)
#   DELAYED    1: a fourth mode, cpu+dpu: cpu with ZeRO-Offload's one-step delayed parameter
#              update (offload.delayed_update) from the first timed step on (after WARMUP
#              serial steps), its host step beside the next step's compute (default 0)
# Raw JSON lines go to stderr; the table to stdout.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build_dir=$1
bench_bin="$build_dir/bin/training_bench"
if [[ ! -x $bench_bin ]]; then
  echo "$bench_bin is missing (build target training_bench)" >&2
  exit 2
fi
config=${CONFIG:-tiny}
steps=${STEPS:-10}
warmup=${WARMUP:-2}
rounds=${ROUNDS:-2}
threads=${THREADS:-2}
zero_stage=${ZERO_STAGE:-1}
buffer_count=${BUFFER_COUNT:-6}
buffer_size=${BUFFER_SIZE:-0}
if [[ -n ${NVME_PATH:-} ]]; then
  swap=$NVME_PATH
  mkdir -p "$swap"
else
  swap=$(mktemp -d -p "$build_dir" zt_offload_bench.XXXXXX)
  trap 'rm -rf "$swap"' EXIT
fi
raw=$(mktemp -t zt_offload_bench_raw.XXXXXX)
modes="none cpu nvme"
if [[ ${DELAYED:-0} == 1 ]]; then
  modes="$modes cpu+dpu"
fi

for round in $(seq 1 "$rounds"); do
  for mode in $modes; do
    echo "[$(date +%T)] round $round $mode" >&2
    extra=()
    offload=$mode
    if [[ $mode == cpu+dpu ]]; then
      offload=cpu
      extra=(--delayed-update "$warmup")
    fi
    line=$("$bench_bin" --config "$config" --steps "$steps" --warmup "$warmup" \
      --threads "$threads" --offload "$offload" --nvme-path "$swap" --zero-stage "$zero_stage" \
      --buffer-count "$buffer_count" --buffer-size "$buffer_size" "${extra[@]}" |
      grep -E '^\{.*\}$' | tail -n 1)
    if [[ -z $line ]]; then
      echo "  $mode failed" >&2
      continue
    fi
    echo "$line" >&2
    echo "$line" >>"$raw"
  done
done

/usr/bin/python3 - "$raw" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    m = j["offload"] + ("+dpu" if "delayed_update_after_steps" in j else "")
    if m not in best or j["step_ms"] < best[m]["step_ms"]:
        best[m] = j
print("| offload | step ms | vs none | optimizer ms | gradient copies: ms (queued in backward) | swap in / out per step | plan device / pinned host / nvme (MiB) | peak RSS (MiB) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
base = best.get("none", {}).get("step_ms")
for m in ("none", "cpu", "nvme", "cpu+dpu"):
    if m not in best:
        continue
    j = best[m]
    mib = lambda b: "%.1f" % (b / 2**20)
    swap = "%s / %s MiB in %.1f / %.1f ms" % (mib(j["swap_bytes_in_last"]), mib(j["swap_bytes_out_last"]),
                                            j["swap_in_ms_last"], j["swap_out_ms_last"]) if m == "nvme" else "—"
    copies = "%.1f (%d of %d)" % (j["gradient_copy_ms_last"], j["gradient_copies_queued_in_backward"],
                                  j["gradient_copies"]) if j.get("gradient_copies") else "—"
    print("| %s | %.1f | %s | %.1f | %s | %s | %s / %s / %s | %s |" % (
        m, j["step_ms"], "%.2f×" % (j["step_ms"] / base) if base else "—", j["optimizer_ms"], copies, swap,
        mib(j["plan_device_bytes"]), mib(j["plan_pinned_host_bytes"]), mib(j["plan_nvme_bytes"]),
        mib(j["peak_rss_bytes"])))
PY
rm -f "$raw"
