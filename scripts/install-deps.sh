#!/usr/bin/env bash
# Installs the Debian 12 packages ZeroTrain builds and runs with, only those missing.
# Idempotent: a machine that has them all runs no apt-get at all.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc libabsl-dev
  libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libpcre2-dev
  libdnnl-dev libopenblas-dev
  prometheus-cpp-dev librocksdb-dev libgloo-dev liburing-dev libzstd-dev
)
# The demo trains on a real corpus from a Debian text package.
if [[ "${1:-}" == "--demo" ]]; then
  packages+=(fortunes)
fi
# Benchmarks compare against PyTorch from Debian.
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3-torch python3-numpy)
fi

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
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
