#!/usr/bin/env bash
# The front door on a machine that has nothing yet: `./make demo`, `./make test`.
# A fresh Debian 12 has no `make` (nor a compiler, nor cmake): this installs GNU make with
# apt-get when it is missing, then hands over to it. The Makefile's targets install the rest
# (scripts/install-deps.sh). Where GNU make is installed, `./make X` and `make X` are the same.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v make >/dev/null; then
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || {
      echo "./make: GNU make is not installed, and installing it needs root or sudo:" \
        "run 'apt-get install make' as root, or run ./make as root" >&2
      exit 2
    }
    sudo=(sudo)
  fi
  echo "./make: installing GNU make (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends make >/dev/null
fi
exec make "$@"
