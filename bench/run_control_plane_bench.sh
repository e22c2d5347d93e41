#!/usr/bin/env bash
# Control-plane figures (issue 6): submit-to-first-step latency against `ztd --dev` (with
# `zt train` of the same job beside it), a `ztd --coordinator` under 1,000 simulated nodes
# (Heartbeat and SubmitJob calls/s and latency, coordinator RSS), and the job API under mixed
# load from 64 and 256 concurrent clients while nodes heartbeat (issue 20: calls/s, p50/p99,
# failures, coordinator RSS over time). About 2–3 minutes; MIXED_SECONDS=3600 for the hour.
#
# Usage: bench/run_control_plane_bench.sh BUILD_DIR
# Needs BUILD_DIR/bin/control_plane_bench and BUILD_DIR/bin/ztd; BUILD_DIR/bin/zt for the
# `zt train` reference (the row is left out without it).
# Environment (optional):
#   JOBS            jobs submitted one after another for the latency (default 5)
#   STEPS           steps of each tiny job (default 20)
#   NODES           simulated nodes (default 1000)
#   THREADS         client threads driving the coordinator (default 12)
#   SECONDS_HB      seconds of Heartbeat load (default 10)
#   SECONDS_SUBMIT  seconds of SubmitJob load (default 5)
#   CLIENTS         client counts of the mixed load, comma-separated (default 64,256)
#   MIXED_SECONDS   seconds of mixed load per client count (default 20)
#   MIXED_NODES     simulated nodes heartbeating once a second during it (default 100)
#   LIVE_JOBS       jobs each mixed-load client keeps before it retires its oldest (cancel,
#                   its ranks' exits, delete); 0: no limit (default 0; 32 for the hour)
#   RSS_INTERVAL    seconds between coordinator RSS samples (default 10)
#   WORK_DIR        state directories and logs (default: a temporary directory, removed)
#   RAW_OUT         file to which the raw JSON lines are appended (default: a temporary file)
# Progress goes to stderr; the table to stdout.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build_dir=$1
bench_bin="$build_dir/bin/control_plane_bench"
ztd_bin="$build_dir/bin/ztd"
zt_bin="$build_dir/bin/zt"
for bin in "$bench_bin" "$ztd_bin"; do
  if [[ ! -x $bin ]]; then
    echo "$bin is missing (build targets control_plane_bench and ztd)" >&2
    exit 2
  fi
done
if [[ -n ${WORK_DIR:-} ]]; then
  work=$WORK_DIR
  mkdir -p "$work"
else
  work=$(mktemp -d -t zt_control_plane_bench.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
raw=${RAW_OUT:-$(mktemp -t zt_control_plane_bench_raw.XXXXXX)}
: >"$raw"

zt_args=()
if [[ -x $zt_bin ]]; then
  zt_args=(--zt "$zt_bin")
else
  echo "NOTE: $zt_bin is missing: no zt train reference" >&2
fi

echo "[$(date +%T)] latency: ${JOBS:-5} jobs of ${STEPS:-20} steps on ztd --dev" >&2
"$bench_bin" --mode latency --ztd "$ztd_bin" "${zt_args[@]}" --dir "$work/latency" \
  --jobs "${JOBS:-5}" --steps "${STEPS:-20}" >>"$raw" || echo "latency run failed" >&2
echo "[$(date +%T)] throughput: ${NODES:-1000} nodes, ${THREADS:-12} client threads" >&2
"$bench_bin" --mode throughput --ztd "$ztd_bin" --dir "$work/throughput" \
  --nodes "${NODES:-1000}" --threads "${THREADS:-12}" --seconds "${SECONDS_HB:-10}" \
  --submit-seconds "${SECONDS_SUBMIT:-5}" >>"$raw" || echo "throughput run failed" >&2
echo "[$(date +%T)] mixed: ${CLIENTS:-64,256} clients, ${MIXED_SECONDS:-20} s each" >&2
"$bench_bin" --mode mixed --ztd "$ztd_bin" --dir "$work/mixed" --nodes "${MIXED_NODES:-100}" \
  --clients "${CLIENTS:-64,256}" --seconds "${MIXED_SECONDS:-20}" --live-jobs "${LIVE_JOBS:-0}" \
  --rss-interval "${RSS_INTERVAL:-10}" >>"$raw" || echo "mixed run failed" >&2
echo "raw results: $raw" >&2

/usr/bin/python3 - "$raw" <<'PY'
import json
import sys

runs = {}
with open(sys.argv[1]) as f:
    for line in f:
        if line.startswith("{"):
            d = json.loads(line)
            runs[d["mode"]] = d
MIB = 1024 ** 2
print("| figure | value | reference |")
print("| --- | --- | --- |")
lat = runs.get("latency")
if lat:
    ref = lat["zt_train_to_first_step_ms"]
    n = lat["jobs"]
    print(f"| SubmitJob RPC (median / max of {n}) | {lat['submit_rpc_ms']['median']:.1f} / "
          f"{lat['submit_rpc_ms']['max']:.1f} ms | — |")
    for key, what in (("to_placed_ms", "SubmitJob return → PLACED (event time)"),
                      ("to_running_ms", "SubmitJob return → RUNNING (event time)"),
                      ("to_first_step_ms", "SubmitJob return → first step ≥ 1 (event time)"),
                      ("to_first_step_received_ms",
                       "SubmitJob return → first step received by WatchJob")):
        r = lat[key]
        cell = f"{r['median']:.0f} / {r['max']:.0f} ms"
        other = (f"zt train, process start → first metrics line: {ref['median']:.0f} / "
                 f"{ref['max']:.0f} ms" if key == "to_first_step_received_ms" and ref["max"]
                 else "—")
        print(f"| {what} (median / max of {n}) | {cell} | {other} |")
    print(f"| duration of step 1 itself (median) | "
          f"{lat['first_step_duration_ms']['median']:.1f} ms | — |")
    print(f"| ztd --dev start → node registered | {lat['daemon_ready_ms']:.0f} ms | — |")
tp = runs.get("throughput")
if tp:
    for key, what in (("register", "Register"), ("heartbeat", "Heartbeat"),
                      ("submit", "SubmitJob (world size 8)")):
        r = tp[key]
        extra = ""
        if key == "submit":
            extra = (f"; {r['placed_on_return']} PLACED, {r['not_placed_on_return']} PENDING "
                     f"on return")
        err = f"; {r['errors']} errors ({r.get('first_error', '')})" if r["errors"] else ""
        print(f"| {what}: {tp['nodes']} nodes, {tp['client_threads']} client threads | "
              f"{r['calls_per_s']:,.0f} calls/s; p50 {r['p50_ms']:.2f} ms, p99 "
              f"{r['p99_ms']:.2f} ms | {r['calls']:,} calls in {r['seconds']:.1f} s{extra}{err} |")
    rss = tp["rss_bytes"]
    for key, what in (("idle", "started"), ("after_registration", "after registration"),
                      ("after_load", "after the load")):
        print(f"| coordinator RSS {what} (VmRSS / VmHWM) | {rss[key]['vm_rss'] / MIB:.0f} / "
              f"{rss[key]['vm_hwm'] / MIB:.0f} MiB | — |")
mx = runs.get("mixed")
if mx:
    for run in mx["runs"]:
        a = run["all"]
        first = f" (first: {run['first_failure']})" if run["failures"] else ""
        print(f"| mixed job API, {run['clients']} clients, {mx['nodes']} nodes heartbeating | "
              f"{a['calls_per_s']:,.0f} calls/s; p50 {a['p50_ms']:.2f} ms, p99 {a['p99_ms']:.2f} ms"
              f" | {a['calls']:,} calls in {run['seconds']:.0f} s; failures {run['failures']}"
              f"{first} |")
        for call, r in run["by_call"].items():
            print(f"| — {call}, {run['clients']} clients | p50 {r['p50_ms']:.2f} ms, p99 "
                  f"{r['p99_ms']:.2f} ms | {r['calls']:,} calls |")
    samples = mx["rss"]
    if samples:
        series = ", ".join(f"{s['t_s']:.0f} s: {s['vm_rss'] / MIB:.0f} MiB ({s['jobs']} jobs)"
                           for s in samples)
        print(f"| coordinator VmRSS over the mixed load | {series} | — |")
PY
