#!/usr/bin/env bash
# The memory techniques on one model: peak memory and tokens/s of each configuration beside
# the memory plan's prediction, as one Markdown table (bench/RESULTS.md's second table).
#
# Usage: bench/run_memory_bench.sh BUILD_DIR [CONFIG]   (CONFIG: gpt2-small (default) | tiny)
# Environment: STEPS (timed steps, default 4), THREADS (default 2).
# Rows: fp32 baseline; bf16 params + fp32 master; + FULL checkpointing; + SELECTIVE instead;
# bf16 + FULL + 8-bit AdamW; the same with bf16 gradients and split master weights (8 bytes of
# model state per parameter); bf16 + Adafactor. Each row is one training_bench run.
set -euo pipefail
build_dir=${1:?usage: $0 BUILD_DIR [CONFIG]}
config=${2:-gpt2-small}
steps=${STEPS:-4}
threads=${THREADS:-2}
bin="$build_dir/bin/training_bench"
[[ -x $bin ]] || { echo "$bin is missing: build it first" >&2; exit 2; }

rows=(
  "fp32 baseline|--precision fp32"
  "bf16 params + fp32 master|--precision bf16"
  "bf16 + FULL checkpointing|--precision bf16 --checkpointing full"
  "bf16 + SELECTIVE checkpointing|--precision bf16 --checkpointing selective"
  "bf16 + FULL + 8-bit AdamW|--precision bf16 --checkpointing full --optimizer adamw8bit"
  "bf16 + FULL + 8-bit AdamW, bf16 grads, split master|--precision bf16 --checkpointing full --optimizer adamw8bit --grad-dtype bf16 --master split"
  "bf16 + Adafactor|--precision bf16 --optimizer adafactor"
)
raw=$(mktemp -t zt_memory_bench.XXXXXX)
for row in "${rows[@]}"; do
  label=${row%%|*}
  args=${row#*|}
  echo "[$(date +%T)] $label: $bin --config $config --steps $steps --threads $threads $args" >&2
  # shellcheck disable=SC2086
  line=$("$bin" --config "$config" --steps "$steps" --threads "$threads" $args)
  echo "$line" >&2
  printf '%s\t%s\n' "$label" "$line" >> "$raw"
done

/usr/bin/python3 - "$raw" <<'PY'
import json, sys
rows = [l.rstrip("\n").split("\t", 1) for l in open(sys.argv[1])]
base = None
print("| configuration | tokens/s | time/step vs fp32 | peak RSS − baseline (GiB) | vs fp32 | plan (GiB) | plan vs measured |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for label, line in rows:
    r = json.loads(line)
    used = r["peak_rss_bytes"] - r["baseline_rss_bytes"]
    if base is None:
        base = r
        base_used = used
    print("| %s | %.0f | %.2f× | %.3f | %.0f%% | %.3f | %+.1f%% |" % (
        label, r["tokens_per_s"], r["step_ms"] / base["step_ms"], used / 2**30,
        100.0 * used / base_used, r["plan_total_bytes"] / 2**30,
        100.0 * (r["plan_total_bytes"] - used) / used))
PY
rm -f "$raw"
