#!/usr/bin/env bash
# deploy/prometheus/: the scrape config loads the rule files, `promtool check rules` accepts
# them, and `promtool test rules` runs each alert's unit test (tests/deploy/prometheus/: fires
# when it should, stays quiet when it should not). promtool comes with Debian's `prometheus`
# (scripts/install-deps.sh --test).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if ! command -v promtool >/dev/null; then
  echo "[  SKIPPED ] no promtool (apt-get install prometheus)"
  exit 0
fi
failures=0
run() {
  local out
  if ! out=$("$@" 2>&1); then
    echo "FAIL: $*"
    echo "$out"
    failures=$((failures + 1))
  fi
}
run promtool check config "$root/deploy/prometheus/prometheus.yml"
run promtool check rules "$root"/deploy/prometheus/zerotrain-*.yml
# Relative rule_files resolve from the test file's folder.
for test_file in "$root"/tests/deploy/prometheus/*_test.yml; do
  run promtool test rules "$test_file"
done
# Every alert has a unit test: its name appears as an alertname in a test file.
for alert in $(sed -n 's/^ *- alert: *//p' "$root/deploy/prometheus/zerotrain-alerts.yml"); do
  if ! grep -qE "alertname: *$alert\$" "$root"/tests/deploy/prometheus/*_test.yml; then
    echo "FAIL: alert $alert has no promtool unit test"
    failures=$((failures + 1))
  fi
done
[[ $failures -eq 0 ]] && echo "prometheus rules: OK"
exit $((failures > 0))
