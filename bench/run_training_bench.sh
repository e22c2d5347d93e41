#!/usr/bin/env bash
# Runs ZeroTrain's training_bench and the PyTorch reference on the same configurations,
# alternating them (ours, torch, ours, torch, ...) so that drift in the machine's load hits
# both alike, and prints a Markdown table with the issue's gates marked met / not met.
#
# Usage: bench/run_training_bench.sh BUILD_DIR
# Environment (optional):
#   ROUNDS    runs of each implementation per configuration (default 2)
#   CONFIGS   configurations to run, space separated (default "tiny gpt2-small"; also
#             "tiny-llama", which has no gate)
#   THREADS   threads for both implementations (default 2)
#   TORCH_PY  interpreter with PyTorch (default /usr/bin/python3, Debian's torch 1.13)
#   RAW_OUT   file to which every raw JSON line is appended (default: a temporary file)
#   TORCH_EXTRA_ARGS  more arguments for pytorch_reference.py, e.g. "--omp-wait-policy unset"
#             to measure PyTorch with libgomp's default spinning (about 2x slower on 2 cores)
# Progress and raw JSON lines go to stderr; the table goes to stdout.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build_dir=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rounds=${ROUNDS:-2}
configs=${CONFIGS:-"tiny gpt2-small"}
threads=${THREADS:-2}
torch_py=${TORCH_PY:-/usr/bin/python3}
ours_bin="$build_dir/bin/training_bench"

if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
  echo "ROUNDS is '$rounds'; it must be a positive integer" >&2
  exit 2
fi
if ! "$torch_py" -c 'import torch' 2>/dev/null; then
  echo "TORCH_PY=$torch_py cannot import torch; install python3-torch or set TORCH_PY" >&2
  exit 2
fi

raw=${RAW_OUT:-$(mktemp -t zt_training_bench.XXXXXX)}
: >"$raw"

have_ours=1
if [[ ! -x $ours_bin ]]; then
  have_ours=0
  echo "NOTE: $ours_bin is missing (build target training_bench); running PyTorch only." >&2
fi

# The PyTorch arguments that describe each configuration; training_bench knows the same
# configurations by name. gpt2-small keeps GPT-2's 1024-row position table.
torch_args() {
  case $1 in
    tiny)
      echo "--family gpt2 --n-layer 4 --n-head 4 --d-model 256 --vocab 256" \
        "--seq-len 256 --batch 8 --steps 20 --tied"
      ;;
    tiny-llama)
      echo "--family llama --n-layer 4 --n-head 4 --n-kv-head 2 --d-model 256 --vocab 256" \
        "--seq-len 256 --batch 8 --steps 20 --untied"
      ;;
    gpt2-small)
      echo "--family gpt2 --n-layer 12 --n-head 12 --d-model 768 --vocab 50257" \
        "--seq-len 256 --max-seq-len 1024 --batch 4 --steps 6 --tied"
      ;;
    *)
      return 1
      ;;
  esac
}
ours_steps() {
  case $1 in
    tiny | tiny-llama) echo 20 ;;
    gpt2-small) echo 6 ;;
  esac
}

# Runs one benchmark command and appends its JSON line, tagged with the configuration, to
# the raw file; a failed run is recorded as such so the table can say so.
run_one() {
  local config=$1 impl=$2
  shift 2
  local out rc
  echo "[$(date +%T)] $config $impl: $*" >&2
  out=$("$@" 2>&1)
  rc=$?
  local line
  line=$(printf '%s\n' "$out" | grep -E '^\{.*\}$' | tail -n 1)
  if [[ $rc -ne 0 || -z $line ]]; then
    echo "  failed (exit $rc):" >&2
    printf '%s\n' "$out" | tail -n 20 | sed 's/^/    /' >&2
    printf '{"config": "%s", "impl": "%s", "failed": true, "exit": %d}\n' \
      "$config" "$impl" "$rc" >>"$raw"
    return
  fi
  echo "  $line" >&2
  "$torch_py" -c 'import json,sys; d=json.loads(sys.argv[1]); d["config"]=sys.argv[2]; \
d["impl"]=sys.argv[3]; print(json.dumps(d))' "$line" "$config" "$impl" >>"$raw"
}

for config in $configs; do
  if ! targs=$(torch_args "$config"); then
    echo "unknown configuration '$config' in CONFIGS (known: tiny tiny-llama gpt2-small)" >&2
    exit 2
  fi
  for ((r = 1; r <= rounds; r++)); do
    if [[ $have_ours -eq 1 ]]; then
      run_one "$config" zerotrain "$ours_bin" --config "$config" \
        --steps "$(ours_steps "$config")" --threads "$threads" --json
    fi
    # shellcheck disable=SC2086  # targs is a list of words on purpose
    run_one "$config" pytorch "$torch_py" "$here/pytorch_reference.py" $targs \
      --threads "$threads" ${TORCH_EXTRA_ARGS:-}
  done
done

echo "raw results: $raw" >&2

"$torch_py" - "$raw" "$have_ours" "$ours_bin" <<'PY'
import json
import sys

raw_path, have_ours, ours_bin = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
GIB = 1024 ** 3
# The issue's gates: minimum tokens/s ratio and maximum peak-RSS ratio against PyTorch.
GATES = {"tiny": (1.5, 1.0), "gpt2-small": (1.3, 0.8)}
PLAN_TOLERANCE = 0.05

runs = {}
order = []
with open(raw_path) as f:
    for line in f:
        d = json.loads(line)
        key = d["config"]
        if key not in runs:
            runs[key] = {"zerotrain": [], "pytorch": []}
            order.append(key)
        runs[key][d["impl"]].append(d)


def best(results):
    """Best tokens/s and lowest peak RSS over the successful runs, or None."""
    ok = [r for r in results if not r.get("failed")]
    if not ok:
        return None
    fastest = max(ok, key=lambda r: r["tokens_per_s"])
    leanest = min(ok, key=lambda r: r["peak_rss_bytes"])
    return {"tokens_per_s": fastest["tokens_per_s"], "step_ms": fastest["step_ms"],
            "peak": leanest["peak_rss_bytes"], "baseline": leanest["baseline_rss_bytes"],
            "plan": leanest.get("plan_total_bytes"), "gemm": fastest.get("gemm"),
            "runs": len(ok), "failed": len(results) - len(ok)}


def mark(ok):
    return "met" if ok else "not met"


print("| config | impl | tokens/s | ratio vs PyTorch | peak RSS (GiB) | RSS ratio "
      "| plan total vs (peak RSS − baseline) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
gate_lines = []
for config in order:
    ours, torch = best(runs[config]["zerotrain"]), best(runs[config]["pytorch"])
    min_speed, max_rss = GATES.get(config, (None, None))
    for impl, b in (("zerotrain", ours), ("pytorch", torch)):
        if b is None:
            why = "missing binary" if impl == "zerotrain" and not have_ours else "failed"
            print(f"| {config} | {impl} | {why} | — | — | — | — |")
            continue
        speed_ratio = rss_ratio = plan_cell = "—"
        if impl == "zerotrain" and torch is not None:
            speed_ratio = f"{b['tokens_per_s'] / torch['tokens_per_s']:.2f}×"
            rss_ratio = f"{b['peak'] / torch['peak']:.2f}×"
        if impl == "zerotrain" and b["plan"] is not None:
            used = b["peak"] - b["baseline"]
            dev = (b["plan"] - used) / used if used > 0 else float("inf")
            plan_cell = f"{b['plan'] / GIB:.3f} vs {used / GIB:.3f} GiB ({dev:+.1%})"
        name = impl if impl == "pytorch" or not b["gemm"] else f"{impl} ({b['gemm']})"
        print(f"| {config} | {name} | {b['tokens_per_s']:,.0f} | {speed_ratio} "
              f"| {b['peak'] / GIB:.3f} | {rss_ratio} | {plan_cell} |")
    if min_speed is None:
        gate_lines.append(f"- {config}: no gate in the issue")
        continue
    if ours is None or torch is None:
        missing = "ZeroTrain" if ours is None else "PyTorch"
        gate_lines.append(f"- {config}: gates not evaluated ({missing} has no result)")
        continue
    speed = ours["tokens_per_s"] / torch["tokens_per_s"]
    rss = ours["peak"] / torch["peak"]
    gate_lines.append(f"- {config}: tokens/s ≥ {min_speed}× PyTorch: {speed:.2f}× — "
                      f"{mark(speed >= min_speed)}")
    limit = "≤ PyTorch's" if max_rss == 1.0 else f"≤ {max_rss}× PyTorch's"
    gate_lines.append(f"- {config}: peak RSS {limit}: {rss:.2f}× — {mark(rss <= max_rss)}")
    if ours["plan"] is None:
        gate_lines.append(f"- {config}: plan within 5% of peak − baseline: not met "
                          "(training_bench printed no plan_total_bytes)")
    else:
        used = ours["peak"] - ours["baseline"]
        dev = abs(ours["plan"] - used) / used if used > 0 else float("inf")
        gate_lines.append(f"- {config}: plan within 5% of peak − baseline: {dev:.1%} — "
                          f"{mark(dev <= PLAN_TOLERANCE)}")

print()
if not have_ours:
    print(f"ZeroTrain's {ours_bin} is missing: only the PyTorch side ran.")
    print()
print("Gates:")
for line in gate_lines:
    print(line)
print()
print("Best tokens/s and lowest peak RSS of each implementation over its runs; "
      "figures from a shared machine are noisy.")
PY
