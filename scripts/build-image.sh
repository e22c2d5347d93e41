#!/usr/bin/env bash
# Builds the container image the Kubernetes manifests run, zerotrain/ztd:latest, as an OCI
# archive, without pulling from any registry: a Debian 12 root from mmdebstrap holding only the
# packages that zt and ztd load, the two binaries stripped in /usr/local/bin, and ztd as the
# entrypoint (the manifests' args are ztd's flags).
#
#   scripts/build-image.sh [BUILD_DIR [OUT]]     (defaults: build, BUILD_DIR/zerotrain-ztd.oci.tar)
#
# The runtime packages are derived from the binaries (ldd, then dpkg -S), so a library added to
# the link lands in the image without anyone editing a list. A library no Debian package owns
# (the CUDA runtime of a build with nvcc, from /usr/local/cuda) is copied in at its path.
#
# OUT is an OCI layout in a tar (the oci-archive format), tagged docker.io/zerotrain/ztd:latest:
# `skopeo copy oci-archive:OUT docker://REGISTRY/zerotrain/ztd:latest`, `podman load -i OUT`,
# `ctr -n k8s.io images import OUT`, `kind load image-archive OUT` (deploy/README.md).
#
# Needs root (mmdebstrap's root mode keeps file owners; umoci unpack and repack), IMAGE_MIN_GIB
# of free disk under IMAGE_BASE, and the Debian mirrors of the host's own apt sources. Installs
# mmdebstrap and umoci when they are missing. The work directory is removed on every exit path;
# one left by a run killed with SIGKILL is removed by the next run.
set -euo pipefail

log_prefix=build-image
source "$(dirname "$0")/lib/debian-root.sh"

build_dir=${1:-build}
out=${2:-$build_dir/zerotrain-ztd.oci.tar}
base=${IMAGE_BASE:-/var/tmp}
min_gib=${IMAGE_MIN_GIB:-2}
image_name=docker.io/zerotrain/ztd:latest

(( $# <= 2 )) || fail "usage: scripts/build-image.sh [BUILD_DIR [OUT]]"
[[ $(id -u) -eq 0 ]] || fail "needs root: mmdebstrap builds the root as root so its files keep their owners, and umoci unpack/repack need it (run it as root, or with sudo)"
for bin in zt ztd; do
  [[ -x $build_dir/bin/$bin ]] || fail "$build_dir/bin/$bin is missing: build it first (cmake --build $build_dir --target zt ztd)"
done
[[ -d $base && -w $base ]] || fail "IMAGE_BASE=$base is not a writable directory"
avail_kib=$(df --output=avail -k "$base" | tail -n 1 | tr -d ' ')
if (( avail_kib < min_gib * 1024 * 1024 )); then
  fail "needs ${min_gib} GiB free under $base for the root and the layer; $base has $(( avail_kib / 1024 / 1024 )) GiB (set IMAGE_BASE to another disk)"
fi
ensure_commands mmdebstrap=mmdebstrap umoci=umoci strip=binutils
why=$(debian_mirror_problem) || fail "$why"

# Each shared library the binaries load, as ldd resolves it here.
mapfile -t libs < <(ldd "$build_dir/bin/zt" "$build_dir/bin/ztd" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
if missing=$(ldd "$build_dir/bin/zt" "$build_dir/bin/ztd" | grep 'not found'); then
  fail "the binaries need libraries this machine lacks: $missing"
fi

# The package that owns each library, in one dpkg-query. dpkg knows a file by the path its
# package ships it at: /lib/... or /usr/lib/... (Debian 12 merges /usr, and registers libc6's
# files under /lib), and an alternatives link (libopenblas.so.0) only by its target.
candidates() {
  local lib=$1 real
  real=$(realpath "$lib")
  printf '%s\n' "$lib" "$real" "${lib#/usr}" "${real#/usr}" "/usr$lib" "/usr$real"
}
declare -A owner
while IFS= read -r line; do
  [[ $line == diversion\ * ]] && continue
  pkg=${line%%: *}
  owner[${line#*: }]=${pkg%%,*}
done < <(for lib in "${libs[@]}"; do candidates "$lib"; done | sort -u |
  xargs -d '\n' dpkg-query -S 2>/dev/null || true)
packages=()
unpackaged=()
for lib in "${libs[@]}"; do
  pkg=
  while read -r candidate; do
    pkg=${owner[$candidate]:-}
    [[ -n $pkg ]] && break
  done < <(candidates "$lib")
  if [[ -n $pkg ]]; then
    packages+=("$pkg")
  else
    unpackaged+=("$lib")
  fi
done
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
echo "build-image: runtime packages: ${packages[*]}" >&2
(( ${#unpackaged[@]} == 0 )) || echo "build-image: copied in without a package: ${unpackaged[*]}" >&2

# Work directories of runs that died without their trap: their owner's pid is gone.
for stale in "$base"/zt-image.*; do
  [[ -d $stale ]] || continue
  owner=${stale##*.}
  if ! kill -0 "$owner" 2>/dev/null; then
    echo "build-image: removing $stale, left by a run that did not finish" >&2
    rm -rf --one-file-system "$stale"
  fi
done

work="$base/zt-image.$$"
trap 'status=$?; trap - EXIT INT TERM HUP; rm -rf --one-file-system "$work"; rm -f "$out.partial"; exit $status' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
mkdir "$work"
start=$(date +%s)

mkdir "$work/bin"
for bin in zt ztd; do
  strip --strip-unneeded -o "$work/bin/$bin" "$build_dir/bin/$bin"
done

layout="$work/oci"
umoci init --layout "$layout"
umoci new --image "$layout:$image_name"
umoci unpack --image "$layout:$image_name" "$work/bundle" >/dev/null
rootfs="$work/bundle/rootfs"

# minbase: Essential and Priority required packages (bash, coreutils, apt for debugging in a
# pod), plus the runtime packages. Documentation, manual pages and translations are never
# unpacked (the copyright files stay: the licences travel with the binaries); mmdebstrap
# removes apt's lists and caches itself.
if ! mmdebstrap --quiet --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --customize-hook="copy-in $work/bin/zt $work/bin/ztd /usr/local/bin" \
  --customize-hook='rm -rf "$1"/var/log/apt/* "$1"/var/log/dpkg.log "$1"/var/cache/ldconfig/aux-cache' \
  "$debian_suite" "$rootfs" - <"$debian_sources" >"$work/mmdebstrap.log" 2>&1; then
  cat "$work/mmdebstrap.log" >&2
  fail "mmdebstrap failed (log above)"
fi
for lib in "${unpackaged[@]}"; do
  # The file's contents at the path ldd found it at (the binaries' RUNPATH and the soname),
  # which is where the loader looks in the image too.
  mkdir -p "$rootfs$(dirname "$lib")"
  cp --dereference "$lib" "$rootfs$lib"
done

umoci repack --image "$layout:$image_name" "$work/bundle"
umoci config --image "$layout:$image_name" \
  --config.entrypoint /usr/local/bin/ztd \
  --config.workingdir / \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.exposedports 7070/tcp --config.exposedports 9464/tcp --config.exposedports 9465/tcp \
  --config.label org.opencontainers.image.title=zerotrain-ztd \
  --config.label "org.opencontainers.image.revision=$(git -C "$(dirname "$0")" rev-parse HEAD 2>/dev/null || echo unknown)" \
  --history.created_by "scripts/build-image.sh (mmdebstrap --variant=minbase $debian_suite)"
umoci gc --layout "$layout"

# The layout's files in a tar, in a fixed order with root owners: the oci-archive format.
mkdir -p "$(dirname "$out")"
tar --sort=name --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$out.partial" .
mv "$out.partial" "$out"

unpacked_kib=$(du -sk "$rootfs" | cut -f1)
echo "build-image: $image_name in $out ($(( $(stat -c %s "$out") / 1024 / 1024 )) MiB, $(( unpacked_kib / 1024 )) MiB unpacked) in $(( $(date +%s) - start )) s" >&2
