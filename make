#!/usr/bin/env bash
# The front door on a machine that has nothing yet: `./make demo`, `./make test`.
# A fresh Debian 12 has no `make` (nor a compiler, nor cmake): when make is missing this runs
# scripts/install-deps.sh, whose base set (build-essential) brings it, then hands over to make,
# whose targets install the rest. Where GNU make is installed, `./make X` and `make X` are the
# same.
set -euo pipefail
cd "$(dirname "$0")"
command -v make >/dev/null || scripts/install-deps.sh
exec make "$@"
