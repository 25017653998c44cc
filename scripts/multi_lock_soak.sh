#!/usr/bin/env bash
# The full load of Client::acquire_all: 2 groups x 8 clients x ROUNDS (default 10,000) calls on
# overlapping name sets written in opposite orders, on each backend of the build in BUILD_DIR
# (default build/dev), checked by the per-name history of holds
# (tests/conformance/multi_lock_conformance_test.cpp). One backend at a time, under nice 19.
#   ./scripts/multi_lock_soak.sh [ROUNDS] [BUILD_DIR]
# Environment:
#   SOAK_BACKENDS   labels to run, space-separated (default: every backend of the build, as listed
#                   by the test: file redis sentinel rediscluster3 redlock3 etcd1 etcd3 zk1 zk3
#                   postgres mysql)
#   SOAK_TIMEOUT_S  bound of one backend's run, in seconds (default 900). The test gets a time
#                   budget 60 s shorter (DISTLOCK_MULTI_LOCK_SECONDS): past it no client starts
#                   another round, and the history of the calls made is checked and reported, so
#                   a backend too slow for ROUNDS in the bound reports the rounds that fitted.
#                   A run killed by the bound itself is a hang.
# Each backend's output goes to BUILD_DIR/multi_lock_soak/LABEL.log; its "[ multi-lock ]" line
# (calls made, calls/s, p50/p99/max of a call, calls over the wait, failed calls, violations)
# is printed, then one line per backend with its exit status.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-10000}"
build="${2:-build/dev}"
bound="${SOAK_TIMEOUT_S:-900}"
if ((bound <= 90)); then
  echo "SOAK_TIMEOUT_S must be above 90 s (the test's budget is 60 s shorter)" >&2
  exit 64
fi
nice -n 10 cmake --build "$build" -j2 --target multi_lock_conformance_test
bin="$build/tests/conformance/multi_lock_conformance_test"
test_name='Backends/MultiLock.OverlappingSetsInOppositeOrdersNeitherDeadlockNorOverlap'
if [[ -n "${SOAK_BACKENDS:-}" ]]; then
  read -r -a labels <<<"$SOAK_BACKENDS"
else
  mapfile -t labels < <("$bin" --gtest_list_tests --gtest_filter="$test_name/*" |
    sed -n 's/^  OverlappingSetsInOppositeOrdersNeitherDeadlockNorOverlap\/\([^ ]*\).*/\1/p')
fi
logs="$build/multi_lock_soak"
mkdir -p "$logs"
export DISTLOCK_MULTI_LOCK_ROUNDS="$rounds"
export DISTLOCK_MULTI_LOCK_SECONDS=$((bound - 60))
summary=()
worst=0
for label in "${labels[@]}"; do
  echo "== $label: $rounds rounds per client, bound ${bound} s ($(date -u +%H:%M:%S) UTC)"
  start=$(date +%s)
  status=0
  nice -n 19 timeout --kill-after=30 "$bound" "$bin" --gtest_filter="$test_name/$label" \
    >"$logs/$label.log" 2>&1 || status=$?
  took=$(($(date +%s) - start))
  grep -F '[ multi-lock ]' "$logs/$label.log" || true
  case "$status" in
    0) verdict="passed" ;;
    124 | 137) verdict="HANG: killed by the ${bound} s bound" ;;
    *) verdict="FAILED (exit $status; see $logs/$label.log)" ;;
  esac
  summary+=("$label: $verdict in $took s")
  ((status == 0)) || worst=1
done
printf '%s\n' "${summary[@]}"
exit "$worst"
