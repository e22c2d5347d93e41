#!/usr/bin/env bash
# Installs the Debian 12 packages ZeroTrain builds and runs with, only those missing.
# Idempotent: a machine that has them all runs no apt-get at all.
set -euo pipefail

# ocl-icd-opencl-dev: oneDNN's CMake package calls find_package(OpenCL), and the package that
# satisfies it is only a Recommends of libdnnl-dev, which --no-install-recommends skips.
packages=(
  build-essential cmake pkg-config git
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc libabsl-dev
  libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libpcre2-dev
  libdnnl-dev ocl-icd-opencl-dev libopenblas-dev
  prometheus-cpp-dev librocksdb-dev libgloo-dev liburing-dev libzstd-dev
)
test_packages=(python3-torch python3-numpy fortunes python3-grpcio python3-protobuf prometheus openssl
  slurm-wlm munge)
for flag in "$@"; do
  case "$flag" in
    # The demo trains on a real corpus from a Debian text package.
    --demo) packages+=(fortunes) ;;
    # The tests check the model against an independent PyTorch float64 reference and train
    # on the demo corpus; the benchmarks compare against PyTorch's speed and memory.
    # The daemon tests drive the API from a Python gRPC client and check /metrics with promtool.
    # The Slurm recipe test runs deploy/slurm/zerotrain.sbatch on a one-machine Slurm that it
    # starts itself (slurmctld, slurmd, munged; as root).
    --test) packages+=("${test_packages[@]}") ;;
    # The offload benchmark sets the swap store's bandwidth beside fio's on the same path.
    --bench) packages+=("${test_packages[@]}" fio) ;;
    # scripts/gpu-bundle.sh compresses with xz and smoke-runs the PyTorch reference.
    --gpu-bundle) packages+=(xz-utils python3-torch) ;;
    *) echo "install-deps: unknown flag $flag (use --demo, --test, --bench, --gpu-bundle)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if (( ${#missing[@]} == 0 )); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || {
    echo "install-deps: installing needs root or sudo, and this machine has no sudo:" \
      "run the same command as root" >&2
    exit 2
  }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# dpkg's unpacking chatter goes to a log, shown only when the install fails.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "install-deps: apt-get failed (output above)" >&2
  exit 1
fi
