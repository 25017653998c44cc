#!/usr/bin/env bash
# Long nemesis soak: every backend under the seeded fault schedule of
# tests/nemesis/nemesis_test.cpp for SECONDS each (default 300), one JSON line per
# backend (faults, sections, writes, losses, violations). Replays a run with SEED.
#   ./scripts/nemesis.sh [SECONDS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
seconds="${1:-300}"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/release -j2 --target nemesis_test nemesis_worker
export DISTLOCK_NEMESIS_SECONDS="$seconds"
if [ -n "${2:-}" ]; then export DISTLOCK_NEMESIS_SEED="$2"; fi
status=0
for backend in file redis redlock3 etcd3 zk3; do
  timeout $((seconds + 300)) build/release/tests/nemesis/nemesis_test \
    --gtest_filter="Backends/Nemesis.HistoryHasNoViolations/${backend}" | grep -E '^\{|seed|Failure|violation' || status=1
done
exit $status
