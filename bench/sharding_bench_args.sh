# shellcheck shell=bash
# Sourced by the run_*_bench.sh scripts that drive sharding_bench: reads BUILD_DIR (the
# script's one argument) and the environment's CONFIG, ROUNDS, STEPS and WARMUP into bin,
# config, rounds, steps and warmup, with the caller's defaults for STEPS and WARMUP, and the
# raw output file (RAW_OUT, else a temporary file named after `raw_name`) into raw, emptied.
# Exits 2 naming the argument or variable that is wrong.
#
# Usage: parse_sharding_bench_args DEFAULT_STEPS DEFAULT_WARMUP RAW_NAME "$@"
parse_sharding_bench_args() {
  local default_steps=$1 default_warmup=$2 raw_name=$3
  shift 3
  if [[ $# -ne 1 ]]; then
    echo "usage: $0 BUILD_DIR" >&2
    exit 2
  fi
  bin="$1/bin/sharding_bench"
  # shellcheck disable=SC2034  # read by the sourcing script
  config=${CONFIG:-tiny}
  rounds=${ROUNDS:-2}
  steps=${STEPS:-$default_steps}
  warmup=${WARMUP:-$default_warmup}
  local knob
  for knob in ROUNDS:$rounds STEPS:$steps; do
    if ! [[ ${knob#*:} =~ ^[1-9][0-9]*$ ]]; then
      echo "${knob%%:*} is '${knob#*:}'; it must be a positive integer" >&2
      exit 2
    fi
  done
  if ! [[ $warmup =~ ^[0-9]+$ ]]; then
    echo "WARMUP is '$warmup'; it must be a non-negative integer" >&2
    exit 2
  fi
  if [[ ! -x $bin ]]; then
    echo "$bin is missing: build the target sharding_bench first" >&2
    exit 2
  fi
  raw=${RAW_OUT:-$(mktemp -t "$raw_name.XXXXXX")}
  : >"$raw"
}
