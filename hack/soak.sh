#!/usr/bin/env bash
# Runs one end-to-end test N times in a row, alone or with the machine's
# cores kept busy, and prints each run's wall time, result and the lab's
# slowest identity settle. Stops at the first failure (its log stays).
#
#   hack/soak.sh [-n RUNS] [-load] TEST_REGEXP [PACKAGE]
#
# -load starts one busy loop per core (`sha256sum /dev/zero`, nice 0, the
# test's own priority) beside each run and stops them after it: a runner
# with less CPU than the test expects. PACKAGE defaults to ./e2e/. Needs
# the tools (make tools) and root, as make e2e does. Logs go to
# $SOAK_DIR (default /tmp/zonewatch-soak).
set -euo pipefail
runs=5 load=0
while [ $# -gt 0 ]; do
  case $1 in
    -n) runs=$2; shift 2 ;;
    -load) load=1; shift ;;
    -*) echo "usage: $0 [-n RUNS] [-load] TEST_REGEXP [PACKAGE]" >&2; exit 2 ;;
    *) break ;;
  esac
done
test=${1:?usage: $0 [-n RUNS] [-load] TEST_REGEXP [PACKAGE]}
pkg=${2:-./e2e/}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=${SOAK_DIR:-/tmp/zonewatch-soak}
mkdir -p "$dir"
bin=${ZONEWATCH_TOOLS_BIN:-$root/.tools/bin}
# One build, N runs: the test binary is built once, outside the timings.
exe=$dir/$(basename "$pkg").test
go test -c -o "$exe" "$pkg"

hogs=()
stop_hogs() {
  for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${hogs[@]}"; do wait "$p" 2>/dev/null || true; done
  hogs=()
}
trap stop_hogs EXIT

name=$(echo "$test" | tr -c 'A-Za-z0-9\n' _)
for i in $(seq 1 "$runs"); do
  if [ "$load" = 1 ]; then
    for _ in $(seq 1 "$(nproc)"); do sha256sum /dev/zero & hogs+=($!); done
  fi
  log=$dir/$name-$([ "$load" = 1 ] && echo load || echo alone)-$i.log
  began=$(date +%s)
  rc=0
  (cd "$pkg" && ZONEWATCH_TOOLS_BIN=$bin ZONEWATCH_REQUIRE_TOOLS=1 "$exe" -test.count=1 -test.v -test.timeout 30m -test.run "$test") >"$log" 2>&1 || rc=$?
  stop_hogs
  settle=$(grep -o 'slowest identity settle of the lab: .*' "$log" | sed 's/.*lab: //' | paste -sd';' - || true)
  echo "run $i/$runs$([ "$load" = 1 ] && echo ' (cores busy)'): rc $rc in $(($(date +%s) - began)) s; slowest settle: ${settle:-none past the first look}; log $log"
  if [ "$rc" != 0 ]; then
    grep -E -- '--- FAIL|^panic' "$log" | head -20 || true
    exit "$rc"
  fi
done
