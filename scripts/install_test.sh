#!/usr/bin/env bash
# Installs a distlock build into a temporary prefix and builds the consumer project
# (examples/consumer) against it twice — with find_package(distlock CONFIG) and with
# pkg-config — then runs both binaries.
# Usage: ./scripts/install_test.sh BUILD_DIR   (an already built tree, e.g. build/release)
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:?usage: install_test.sh BUILD_DIR}
[ -f "$build/CMakeCache.txt" ] || { echo "install_test.sh: $build is not a configured build tree" >&2; exit 1; }
work=$(mktemp -d /tmp/distlock-install-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

echo "install_test: installing $build into $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libdistlock.so*' -o -name 'libdistlock.a' | head -n1)")
[ -d "$libdir" ] || { echo "install_test.sh: no libdistlock under $prefix" >&2; exit 1; }

echo "install_test: consumer with find_package(distlock CONFIG)"
cmake -S examples/consumer -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-build" -j2 >/dev/null
"$work/cmake-build/consumer"

echo "install_test: consumer with pkg-config"
pcdir=$(dirname "$(find "$prefix" -name distlock.pc | head -n1)")
# The .pc names the configure-time prefix; relocate it to where we installed.
pc=(env PKG_CONFIG_PATH="$pcdir" pkg-config --define-variable=prefix="$prefix" distlock)
read -r -a cflags <<<"$("${pc[@]}" --cflags)"
read -r -a libs <<<"$("${pc[@]}" --libs)"
c++ "${cflags[@]}" examples/consumer/main.cpp -o "$work/consumer-pc" "${libs[@]}" -Wl,-rpath,"$libdir"
"$work/consumer-pc"
if grep -q '^DISTLOCK_WITH_PYTHON:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "install_test: the installed Python package"
  python=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")
  init=$(find "$prefix" -path '*/distlock/__init__.py' | head -n1)
  [ -n "$init" ] || { echo "install_test.sh: no distlock/__init__.py under $prefix" >&2; exit 1; }
  for f in py.typed __init__.pyi ids.pyi; do
    [ -f "$(dirname "$init")/$f" ] || { echo "install_test.sh: $f not installed" >&2; exit 1; }
  done
  mkdir "$work/locks"
  (cd "$work" && PYTHONPATH="$(dirname "$(dirname "$init")")" "$python" -c '
import sys, distlock
assert distlock.__file__.startswith(sys.argv[1]), distlock.__file__
with distlock.connect("file://" + sys.argv[1] + "/locks") as client:
    with client.lock("install/check", ttl=5.0, wait=1.0) as lease:
        print("install_test: python", distlock.__version__, "token", lease.token)
' "$work")
fi
echo "install_test: OK"
