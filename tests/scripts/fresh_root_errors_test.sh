#!/usr/bin/env bash
# scripts/fresh-root.sh refuses, before it creates anything, each thing it cannot work
# without, with a message that says which: not root, too little disk, no reachable mirror.
# A root left behind by a killed run is removed by the next run.
set -uo pipefail
script="$(cd "$(dirname "$0")/../.." && pwd)/scripts/fresh-root.sh"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0

# expect NAME EXIT_CODE PATTERN CMD...: runs CMD, checks its exit code and that stderr matches.
expect() {
  local name=$1 want_rc=$2 pattern=$3
  shift 3
  local err rc
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -ne $want_rc ]] || ! grep -qE "$pattern" <<<"$err"; then
    echo "FAIL $name: exit $rc (want $want_rc), stderr: $err"
    failures=$((failures + 1))
  else
    echo "ok   $name: $err"
  fi
}

if [[ $(id -u) -ne 0 ]]; then
  expect not-root 2 'needs root' "$script" true
  echo "[  SKIPPED ] the disk, mirror and stale-root checks come after the root check: run as root"
  exit $(( failures > 0 ))
fi

# As root, the not-root check runs under an unprivileged uid, on a copy of scripts/ that uid
# can read: the checkout may sit under a directory only root can enter (CI's is in /root).
chmod 755 "$scratch"
cp -r "$(dirname "$script")" "$scratch/scripts"
chmod -R a+rX "$scratch/scripts"
expect not-root 2 'needs root' \
  setpriv --reuid=65534 --regid=65534 --clear-groups "$scratch/scripts/fresh-root.sh" true
expect no-command 2 'usage' "$script"

# A stale root: its owner pid (a process that has exited) is gone.
sh -c 'exit 0' & dead_pid=$!
wait "$dead_pid"
mkdir -p "$scratch/zt-fresh-root.$dead_pid/etc"
expect disk 2 'needs 100000000 GiB free under .*has [0-9]+ GiB' \
  env FRESH_ROOT_BASE="$scratch" FRESH_ROOT_MIN_GIB=100000000 "$script" true
if [[ -e $scratch/zt-fresh-root.$dead_pid ]]; then
  echo "FAIL stale-root: $scratch/zt-fresh-root.$dead_pid was not removed"
  failures=$((failures + 1))
else
  echo "ok   stale-root: removed"
fi

# Port 9 of loopback (discard) answers nothing: the mirror is unreachable.
printf 'Types: deb\nURIs: http://127.0.0.1:9/debian\nSuites: bookworm\nComponents: main\n' \
  >"$scratch/unreachable.sources"
expect mirror 2 'cannot reach the Debian mirror http://127.0.0.1:9/debian' \
  env FRESH_ROOT_BASE="$scratch" FRESH_ROOT_MIN_GIB=0 DEBIAN_SOURCES="$scratch/unreachable.sources" \
  "$script" true
printf 'Types: deb\nSuites: bookworm\n' >"$scratch/no-uris.sources"
expect mirror-not-named 2 'names no mirror' \
  env FRESH_ROOT_BASE="$scratch" FRESH_ROOT_MIN_GIB=0 DEBIAN_SOURCES="$scratch/no-uris.sources" \
  "$script" true
expect base-missing 2 'not a writable directory' \
  env FRESH_ROOT_BASE="$scratch/absent" "$script" true

leftovers=$(find "$scratch" -maxdepth 1 -name 'zt-fresh-root.*' | wc -l)
if (( leftovers != 0 )); then
  echo "FAIL cleanup: a refused run left $leftovers root(s) in $scratch"
  failures=$((failures + 1))
fi
exit $(( failures > 0 ))
