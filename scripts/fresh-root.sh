#!/usr/bin/env bash
# Runs commands in a fresh Debian 12 root: what a new user's machine is (bash, apt, coreutils,
# git and ca-certificates; no make, no compiler, no sudo). It proves that the README's commands
# install everything they need, which a developer's machine with packages installed by hand
# cannot.
#
#   scripts/fresh-root.sh [--user] CMD [CMD ...]
#
# Each CMD is one shell command line, run with bash in a copy of this checkout (the files git
# tracks and the untracked ones it does not ignore: no build directory, no .git). The commands
# run in order; the first that fails ends the run with its exit status. With --user they run as
# a non-root user `dev` who has sudo (installed first), as a developer on their workstation.
#
# Needs root (mmdebstrap, chroot and bind mounts), FRESH_ROOT_MIN_GIB (16) of free disk under
# FRESH_ROOT_BASE (/var/tmp), and the Debian mirrors of the host's apt sources
# (DEBIAN_SOURCES, see scripts/lib/debian-root.sh); each missing one is an error
# that says which, exit 2. The root is unmounted
# and removed on every exit path; a run killed with SIGKILL leaves it behind, and the next run
# removes it before it starts.
set -euo pipefail
# One brace group, read whole before it runs: editing this file during a run (a checkout
# that moves) cannot make bash execute a different part of it.
{

log_prefix=fresh-root
source "$(dirname "$0")/lib/debian-root.sh"

base=${FRESH_ROOT_BASE:-/var/tmp}
min_gib=${FRESH_ROOT_MIN_GIB:-16}
checkout=$(cd "$(dirname "$0")/.." && pwd)

as_user=0
if [[ ${1:-} == --user ]]; then
  as_user=1
  shift
fi
(( $# > 0 )) || fail "usage: scripts/fresh-root.sh [--user] CMD [CMD ...] (e.g. 'make demo' 'make test')"
[[ $(id -u) -eq 0 ]] || fail "needs root to create the root, chroot and bind-mount /proc, /sys and /dev (run it as root, or with sudo)"
[[ -d $base && -w $base ]] || fail "FRESH_ROOT_BASE=$base is not a writable directory"

# The mounts of a root, innermost first: the order they are unmounted in.
mount_points=(dev/shm dev/pts dev sys proc)

unmount_and_remove() {
  local root=$1
  for m in "${mount_points[@]}"; do
    if mountpoint -q "$root/$m" 2>/dev/null; then
      umount -l "$root/$m" || true
    fi
  done
  # Only once nothing is mounted below it: rm must never reach the host's /dev or /proc.
  if grep -q " $root/" /proc/self/mounts; then
    echo "fresh-root: $root still has mounts; left in place" >&2
    return 1
  fi
  rm -rf --one-file-system "$root"
}

# Roots of runs that died without their trap (SIGKILL, power loss): their owner's pid is gone.
for stale in "$base"/zt-fresh-root.*; do
  [[ -d $stale ]] || continue
  owner=${stale##*.}
  if ! kill -0 "$owner" 2>/dev/null; then
    echo "fresh-root: removing $stale, left by a run that did not finish" >&2
    unmount_and_remove "$stale" || true
  fi
done

avail_kib=$(df --output=avail -k "$base" | tail -n 1 | tr -d ' ')
if (( avail_kib < min_gib * 1024 * 1024 )); then
  fail "needs ${min_gib} GiB free under $base for the root, its packages and a build; $base has $(( avail_kib / 1024 / 1024 )) GiB (set FRESH_ROOT_BASE to another disk)"
fi

ensure_commands mmdebstrap=mmdebstrap
why=$(debian_mirror_problem) || fail "$why"

root="$base/zt-fresh-root.$$"
trap 'status=$?; trap - EXIT INT TERM HUP; unmount_and_remove "$root" || status=1; exit $status' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

echo "fresh-root: creating a minimal Debian 12 root in $root" >&2
start=$(date +%s)
mkdir "$root"
if ! mmdebstrap --quiet --variant=apt --include=ca-certificates,git "$debian_suite" "$root" - <"$debian_sources" \
  >"$root.log" 2>&1; then
  cat "$root.log" >&2
  rm -f "$root.log"
  fail "mmdebstrap failed (log above)"
fi
rm -f "$root.log"
echo "fresh-root: root ready in $(( $(date +%s) - start )) s" >&2

for m in proc sys dev dev/pts dev/shm; do
  mkdir -p "$root/$m"
  mount --bind "/$m" "$root/$m"
done
cp /etc/resolv.conf "$root/etc/resolv.conf"

workdir=/root/zerotrain
mkdir -p "$root$workdir"
# The checkout as a fresh clone has it, without build outputs.
(cd "$checkout" && git ls-files -z --cached --others --exclude-standard |
  xargs -0 -I{} sh -c 'test -e "$1" && printf "%s\0" "$1"' _ {} |
  tar --null -T - -cf -) | tar -xf - -C "$root$workdir"

run_in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    TERM=dumb LANG=C.UTF-8 bash -c "$1"
}

if (( as_user )); then
  run_in_root 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sudo >/dev/null &&
    useradd --create-home --shell /bin/bash dev && echo "dev ALL=(ALL) NOPASSWD:ALL" >/etc/sudoers.d/dev &&
    cp -r '"$workdir"' /home/dev/zerotrain && chown -R dev:dev /home/dev/zerotrain'
  workdir=/home/dev/zerotrain
fi

for cmd in "$@"; do
  echo "fresh-root: \$ $cmd" >&2
  cmd_start=$(date +%s)
  if (( as_user )); then
    line="su - dev -c $(printf %q "cd $workdir && $cmd")"
  else
    line="cd $workdir && $cmd"
  fi
  set +e
  run_in_root "$line"
  rc=$?
  set -e
  echo "fresh-root: '$cmd' exited $rc after $(( $(date +%s) - cmd_start )) s" >&2
  (( rc == 0 )) || exit "$rc"
done
exit 0
}
