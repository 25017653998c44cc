#!/usr/bin/env bash
# Long nemesis soak: each backend under the seeded fault schedule of
# tests/nemesis/nemesis_test.cpp for SECONDS (default 300), one backend at a time.
# Prints, per backend, the seed, the replay command and the run's JSON line (faults,
# sections, losses signalled, stale writes rejected, the unfenced control's stale
# writes, violations). A run fails on any violation and when it did not bite: fewer
# than ceil(30 * SECONDS / 60) signalled losses or ceil(15 * SECONDS / 60) stale writes
# rejected by the fence (docs/testing.md "The nemesis").
#
#   ./scripts/nemesis.sh [SECONDS] [SEED] [BACKEND...]
#
# BACKEND: file redis sentinel rediscluster3 redlock3 etcd3 zk3 postgres mysql (default:
# every one this build has). SEED replays a run: the same faults, durations and gaps
# (which process holds the lock when a fault strikes is up to timing). BUILD_DIR
# (default build/release) is configured with every component unless it exists already.
# Each backend's history files, client log and server logs (where the target has them)
# are kept in $KEEP_DIR/<backend> (default: not kept).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-300}"
seed="${2:-}"
shift $(($# > 2 ? 2 : $#))
build="${BUILD_DIR:-build/release}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  ./scripts/bootstrap.sh
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j2 --target nemesis_test nemesis_worker >/dev/null
bin="$build/tests/nemesis/nemesis_test"
if [ $# -gt 0 ]; then
  backends=("$@")
else
  mapfile -t backends < <("$bin" --gtest_list_tests --gtest_filter='Backends/Nemesis.*' |
    sed -n 's|^  HistoryHasNoViolations/\([a-z0-9]*\).*|\1|p')
fi
export DISTLOCK_NEMESIS_SECONDS="$seconds"
status=0
for backend in "${backends[@]}"; do
  run_seed="${seed:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
  run_seed=$((run_seed & 0x7fffffff))
  echo "== $backend: seed $run_seed (replay: ./scripts/nemesis.sh $seconds $run_seed $backend)"
  keep=()
  if [ -n "${KEEP_DIR:-}" ]; then keep=(env "DISTLOCK_NEMESIS_KEEP=$KEEP_DIR/$backend"); fi
  if ! "${keep[@]}" env DISTLOCK_NEMESIS_SEED="$run_seed" timeout $((seconds + 300)) "$bin" \
    --gtest_filter="Backends/Nemesis.HistoryHasNoViolations/${backend}" >"/tmp/nemesis-$backend.log" 2>&1; then
    status=1
    echo "FAILED (seed $run_seed); the log: /tmp/nemesis-$backend.log"
    grep -E 'Failure|violation|too few|incomplete|unfenced' -A2 "/tmp/nemesis-$backend.log" | head -40 || true
  fi
  grep -E '^\{' "/tmp/nemesis-$backend.log" || true
done
exit $status
