# Sourced by the scripts that build Debian 12 roots with mmdebstrap (fresh-root.sh,
# build-image.sh): the checks that turn a missing tool or an unreachable mirror into one clear
# sentence before mmdebstrap hides the reason in its own log. The caller sets `log_prefix`.

debian_suite=bookworm
# The host's apt sources name the mirrors (`mmdebstrap ... -` reads them on stdin): Debian 12
# installs debian.sources; a root made by mmdebstrap, where CI runs the tests, has
# 0000main.sources; older machines the one-line sources.list. DEBIAN_SOURCES names another.
debian_sources=${DEBIAN_SOURCES:-}
if [[ -z $debian_sources ]]; then
  debian_sources=/etc/apt/sources.list.d/debian.sources
  for candidate in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
    if [[ -s $candidate ]]; then
      debian_sources=$candidate
      break
    fi
  done
  unset candidate
fi

fail() {
  echo "$log_prefix: $*" >&2
  exit 2
}

# Installs each Debian package whose command is missing: `ensure_commands CMD=PACKAGE ...`.
ensure_commands() {
  local pair cmd pkg
  for pair in "$@"; do
    cmd=${pair%%=*}
    pkg=${pair#*=}
    command -v "$cmd" >/dev/null && continue
    echo "$log_prefix: installing $pkg" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null; } ||
      fail "could not install $pkg with apt-get (is the Debian mirror reachable?)"
  done
}

# Prints why the first mirror of the host's apt sources does not serve the suite, and returns
# 1; returns 0 when it does. The roots are built from those mirrors (`mmdebstrap ... -`).
debian_mirror_problem() {
  if [[ ! -r $debian_sources ]]; then
    echo "no $debian_sources on this host: it names the Debian mirrors the root is built from"
    return 1
  fi
  local mirror probe
  mirror=$(awk '/^URIs:/ {print $2; exit}
    /^deb / {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) {print $i; exit}}' "$debian_sources")
  if [[ -z $mirror ]]; then
    echo "$debian_sources names no mirror (no URIs: line, no deb line)"
    return 1
  fi
  probe=$(mktemp)
  if ! timeout 60 /usr/lib/apt/apt-helper download-file "$mirror/dists/$debian_suite/Release" "$probe" >/dev/null 2>&1; then
    rm -f "$probe"
    echo "cannot reach the Debian mirror $mirror (from $debian_sources): $mirror/dists/$debian_suite/Release did not download"
    return 1
  fi
  rm -f "$probe"
}
