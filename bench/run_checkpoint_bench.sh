#!/usr/bin/env bash
# Checkpoint figures (issue 5) for one rank: synchronous and asynchronous saves against a run
# that never saves, a resume from the synchronous run's checkpoint, and `zt export` of it.
# Each run is its own process (its own VmHWM); one round of each.
#
# Usage: bench/run_checkpoint_bench.sh BUILD_DIR
# Needs BUILD_DIR/bin/checkpoint_bench; the `zt export` row also BUILD_DIR/bin/zt and
# /usr/bin/time (without them only the library's export row, measured in a forked child).
# Environment (optional):
#   CONFIG    gpt2-small (default), gpt2-medium or tiny
#   STEPS     timed steps per training run (default 6)
#   WARMUP    untimed steps before them (default 1)
#   INTERVAL  checkpoint.interval_steps (default 3: saves after steps 3 and 6)
#   THREADS   threads (default 2)
#   WORK_DIR  where the checkpoints and the export go (default: a temporary directory,
#             removed at the end); GPT-2 small needs ~3.5 GB there
#   RAW_OUT   file to which every raw JSON line is appended (default: a temporary file)
# Progress and raw JSON lines go to stderr; the table goes to stdout.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build_dir=$1
config=${CONFIG:-gpt2-small}
steps=${STEPS:-6}
warmup=${WARMUP:-1}
interval=${INTERVAL:-3}
threads=${THREADS:-2}
bench_bin="$build_dir/bin/checkpoint_bench"
zt_bin="$build_dir/bin/zt"
py=/usr/bin/python3

if [[ ! -x $bench_bin ]]; then
  echo "$bench_bin is missing (build target checkpoint_bench)" >&2
  exit 2
fi
if [[ -n ${WORK_DIR:-} ]]; then
  work=$WORK_DIR
  mkdir -p "$work"
else
  work=$(mktemp -d -t zt_checkpoint_bench.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
raw=${RAW_OUT:-$(mktemp -t zt_checkpoint_bench_raw.XXXXXX)}
: >"$raw"

# Runs one command, appends its last JSON line to the raw file; a failure is recorded.
run_one() {
  local mode=$1
  shift
  local out rc line
  echo "[$(date +%T)] $mode: $*" >&2
  out=$("$@" 2>&1)
  rc=$?
  line=$(printf '%s\n' "$out" | grep -E '^\{.*\}$' | tail -n 1)
  if [[ $rc -ne 0 || -z $line ]]; then
    echo "  failed (exit $rc):" >&2
    printf '%s\n' "$out" | tail -n 20 | sed 's/^/    /' >&2
    printf '{"mode": "%s", "failed": true, "exit": %d}\n' "$mode" "$rc" >>"$raw"
    return
  fi
  echo "  $line" >&2
  echo "$line" >>"$raw"
}

common=(--config "$config" --steps "$steps" --warmup "$warmup" --interval "$interval"
  --threads "$threads")
rm -rf "$work/sync" "$work/async" "$work/export"
run_one none "$bench_bin" --mode none "${common[@]}"
run_one sync "$bench_bin" --mode sync --dir "$work/sync" "${common[@]}"
run_one async "$bench_bin" --mode async --dir "$work/async" "${common[@]}"
rm -rf "$work/async"
run_one load "$bench_bin" --mode load --dir "$work/sync" "${common[@]}"

# The export: checkpoint_bench's forked child running ExportCheckpoint (what `zt export`
# calls; its line also carries the model's sizes for the reference), then the real
# `zt export` under GNU time when both are there (ru_maxrss of the whole process).
run_one export "$bench_bin" --mode export --config "$config" --dir "$work/sync" \
  --out "$work/export-library"
rm -rf "$work/export-library"
if [[ -x $zt_bin && -x /usr/bin/time ]]; then
  echo "[$(date +%T)] export: $zt_bin export $work/sync --out $work/export" >&2
  start=$(date +%s.%N)
  if /usr/bin/time -v -o "$work/time.txt" "$zt_bin" export "$work/sync" --out "$work/export" \
    --quiet 2>&1 | sed 's/^/    /' >&2; then
    end=$(date +%s.%N)
    kb=$(sed -n 's/^[[:space:]]*Maximum resident set size (kbytes): //p' "$work/time.txt")
    bytes=$(du -sb "$work/export" | cut -f1)
    line=$(printf '{"mode": "export-zt", "peak_rss_bytes": %d, "export_s": %s, "export_bytes": %d}' \
      "$((kb * 1024))" "$(echo "$end - $start" | bc | sed 's/^\./0./')" "$bytes")
    echo "  $line" >&2
    echo "$line" >>"$raw"
  else
    echo "  zt export failed" >&2
    echo '{"mode": "export-zt", "failed": true}' >>"$raw"
  fi
else
  echo "NOTE: $zt_bin or /usr/bin/time is missing: the export row is the library's" >&2
fi
echo "raw results: $raw" >&2

"$py" - "$raw" <<'PY'
import json
import sys

runs = {}
with open(sys.argv[1]) as f:
    for line in f:
        d = json.loads(line)
        runs[d["mode"]] = d
GIB, MIB = 1024 ** 3, 1024 ** 2


def ok(mode):
    return mode in runs and not runs[mode].get("failed")


def mib(b):
    return "—" if b is None else f"{b / MIB:,.0f} MiB"


none = runs.get("none") if ok("none") else None
model = next((runs[m]["model_fp32_bytes"] for m in ("none", "sync", "async", "load") if ok(m)),
             None)
print("| figure | value | reference |")
print("| --- | --- | --- |")
if none:
    print(f"| step time without checkpointing (mean of {none['steps_without_save']}) "
          f"| {none['step_ms_without_save']:,.0f} ms | — |")
for mode in ("sync", "async"):
    if not ok(mode):
        print(f"| {mode} | failed | — |")
        continue
    r = runs[mode]
    saves = r["steps_with_save"]
    ref = f"{none['step_ms_without_save']:,.0f} ms (no checkpointing)" if none else "—"
    print(f"| {mode}: step + save (mean of {saves}) | {r['step_ms_with_save']:,.0f} ms | {ref} |")
    print(f"| {mode}: steps without a save (mean of {r['steps_without_save']}) "
          f"| {r['step_ms_without_save']:,.0f} ms | {ref} |")
    if none:
        stall = (r["timed_s"] - none["timed_s"]) / saves * 1e3 if saves else 0
        print(f"| {mode}: wall time added per save (timed run − no-checkpoint run) / saves "
              f"| {stall:,.0f} ms | {none['timed_s']:,.1f} s for {none['steps']} steps |")
    print(f"| {mode}: extra peak RSS of a step with a save "
          f"| {mib(r['peak_extra_rss_save_step_bytes'])} "
          f"| {mib(r['peak_extra_rss_plain_step_bytes'])} for a step without; model "
          f"{mib(model)} |")
    if mode == "async":
        print(f"| async: staging buffer (planned, held for the run) | {mib(r['staging_bytes'])} "
              f"| checkpoint {mib(r['checkpoint_bytes'])} |")
    if mode == "sync":
        print(f"| sync: bytes written per checkpoint | {r['checkpoint_bytes']:,} "
              f"| model fp32 {model:,} (parameters + 2 AdamW moments: 3×) |")
if ok("load"):
    r = runs["load"]
    ref = f"{none['create_s']:.1f} s without resuming" if none else "—"
    print(f"| load: Trainer::Create resuming (verify checksums, read) | {r['create_s']:.1f} s "
          f"| {ref} |")
    print(f"| load: peak RSS − baseline | {mib(r['peak_rss_bytes'] - r['baseline_rss_bytes'])} "
          f"| plan {mib(r['plan_total_bytes'])}; checkpoint {mib(r['checkpoint_bytes'])} |")
lib = runs["export"] if ok("export") else None
for mode, what in (("export-zt", "`zt export` (GNU time)"),
                   ("export", "ExportCheckpoint in a forked child (wait4)")):
    if not ok(mode):
        continue
    r = runs[mode]
    ref = (f"model fp32 {mib(lib['model_fp32_bytes'])}; largest tensor "
           f"{mib(lib['largest_tensor_fp32_bytes'])}" if lib else "—")
    print(f"| {what}: peak RSS (whole process) | {mib(r['peak_rss_bytes'])} | {ref} |")
    print(f"| {what}: wall time, bytes written | {r['export_s']:.1f} s, "
          f"{r['export_bytes']:,} | — |")
PY
