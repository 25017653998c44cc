#!/usr/bin/env bash
# Vets and tests the Go module (bindings/go) and the Go examples (examples/go) with the race
# detector. Run by ctest (bindings/go/CMakeLists.txt), which sets PKG_CONFIG_PATH to the build
# tree's distlock-c.pc, Go's caches in the build tree and DISTLOCK_TEST_* from with_servers.
# Usage: run_tests.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: run_tests.sh SOURCE_DIR}
go=${DISTLOCK_GO:-go}
# The segment ids' Example runs only with a database to run on (with_servers --postgres/--mysql).
tags=()
if [ -n "${DISTLOCK_TEST_SEGMENT_DBS:-}" ]; then
  tags=(-tags distlock_segment)
fi
for dir in "$src/bindings/go" "$src/examples/go"; do
  [ -f "$dir/go.mod" ] || continue
  echo "== $dir: go vet ${tags[*]}"
  (cd "$dir" && "$go" vet "${tags[@]}" ./...)
  echo "== $dir: go test -race ${tags[*]}"
  (cd "$dir" && "$go" test -race -count=1 -timeout 300s "${tags[@]}" ./...)
done
