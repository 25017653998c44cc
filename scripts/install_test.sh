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

# The installed tool links the installed library (found through its RUNPATH, not the build tree).
if [ -x "$prefix/bin/distlock" ]; then
  echo "install_test: the installed distlock tool"
  env -u LD_LIBRARY_PATH "$prefix/bin/distlock" --version >/dev/null
  if [ -n "$(find "$prefix" -name 'libdistlock.so*' | head -n1)" ]; then
    loaded=$(env -u LD_LIBRARY_PATH ldd "$prefix/bin/distlock" | awk '/libdistlock[.]so/ {print $3}')
    [ -n "$loaded" ] && [ "$(dirname "$(realpath "$loaded")")" = "$(realpath "$libdir")" ] ||
      { echo "install_test.sh: $prefix/bin/distlock loads '$loaded', not $libdir/libdistlock.so" >&2; exit 1; }
  fi
fi

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

# The C API (when built): a C99 program using only the installed header and libdistlock_c,
# through pkg-config (distlock-c) and through find_package (distlock::distlock_c).
if [ -f "$pcdir/distlock-c.pc" ]; then
  echo "install_test: C program with pkg-config distlock-c"
  cpc=(env PKG_CONFIG_PATH="$pcdir" pkg-config --define-variable=prefix="$prefix" distlock-c)
  read -r -a ccflags <<<"$("${cpc[@]}" --cflags)"
  read -r -a clibs <<<"$("${cpc[@]}" --libs)"
  cc -std=c99 -Wall -Wextra -Wpedantic -Werror "${ccflags[@]}" bindings/c/tests/example.c -o "$work/example-c" \
    "${clibs[@]}" -Wl,-rpath,"$libdir"
  mkdir -p "$work/locks"
  "$work/example-c" "file://$work/locks"

  echo "install_test: C program with find_package(distlock CONFIG)"
  mkdir -p "$work/c-consumer"
  cp bindings/c/tests/example.c "$work/c-consumer/"
  cat >"$work/c-consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(distlock_c_consumer LANGUAGES C CXX)
find_package(distlock CONFIG REQUIRED)
add_executable(example example.c)
set_target_properties(example PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON)
target_link_libraries(example PRIVATE distlock::distlock_c)
CMAKE
  cmake -S "$work/c-consumer" -B "$work/c-consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$work/c-consumer/build" >/dev/null
  "$work/c-consumer/build/example" "file://$work/locks"

  # The Go module over the installed library (pkg-config distlock-c), as docs/go.md shows a
  # service using it: examples/go with its replace line pointing at bindings/go.
  if command -v go >/dev/null; then
    echo "install_test: Go program over the installed library"
    cp -r examples/go "$work/go-examples"
    sed -i "s#=> ../../bindings/go#=> $PWD/bindings/go#" "$work/go-examples/go.mod"
    (cd "$work/go-examples" &&
      PKG_CONFIG_PATH="$pcdir" GOCACHE="$work/gocache" GOPATH="$work/gopath" GOPROXY=off GOFLAGS= \
        CGO_CFLAGS="-I$prefix/include" CGO_LDFLAGS="-L$libdir -Wl,-rpath,$libdir" \
        go build -o "$work/order_guard" ./order_guard)
    "$work/order_guard" -url "file://$work/locks" -requests 4 | tee "$work/order_guard.out"
    [ "$(grep -c ': processed$' "$work/order_guard.out")" -eq 1 ] ||
      { echo "install_test: order_guard paid the order other than once" >&2; exit 1; }
  fi
fi

if grep -q '^DISTLOCK_WITH_PYTHON:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "install_test: the installed Python package"
  python=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")
  init=$(find "$prefix" -path '*/distlock/__init__.py' | head -n1)
  [ -n "$init" ] || { echo "install_test.sh: no distlock/__init__.py under $prefix" >&2; exit 1; }
  for f in py.typed __init__.pyi ids.pyi; do
    [ -f "$(dirname "$init")/$f" ] || { echo "install_test.sh: $f not installed" >&2; exit 1; }
  done
  mkdir -p "$work/locks"
  (cd "$work" && PYTHONPATH="$(dirname "$(dirname "$init")")" "$python" -c '
import sys, distlock
assert distlock.__file__.startswith(sys.argv[1]), distlock.__file__
with distlock.connect("file://" + sys.argv[1] + "/locks") as client:
    with client.lock("install/check", ttl=5.0, wait=1.0) as lease:
        print("install_test: python", distlock.__version__, "token", lease.token)
' "$work")
fi
echo "install_test: OK"
