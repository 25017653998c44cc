#!/usr/bin/env bash
# The build's component options (cmake/DistlockComponents.cmake), checked by configuring the
# source tree in throw-away build directories:
#   - an enabled component whose dependency is missing fails configuration with a message that
#     names the Debian package and -DDISTLOCK_WITH_<NAME>=OFF (the dependency is hidden from
#     CMake: pkg-config looks into an empty directory, find_path/find_library ignore /usr);
#   - a component that needs another fails clearly without it; an unknown name fails;
#   - a subset configures, and distlock/config.hpp says which components are in it.
# Usage: check_components.sh SOURCE_DIR
set -uo pipefail
src=$1
work=$(mktemp -d /tmp/distlock-components-XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0
n=0

# configure NAME EXPECT(0|fail) NEEDLE... -- CMAKE_ARGS...  (run under "${hide[@]}", if set)
hide=()
configure() {
  local name=$1 expect=$2
  shift 2
  local needles=()
  while [ "$1" != "--" ]; do needles+=("$1"); shift; done
  shift
  n=$((n + 1))
  local dir="$work/$n"
  local out status
  out=$("${hide[@]}" cmake -S "$src" -B "$dir" -DDISTLOCK_BUILD_TESTS=OFF -DDISTLOCK_BUILD_EXAMPLES=OFF \
        -DDISTLOCK_BUILD_TOOLS=OFF "$@" 2>&1)
  status=$?
  local ok=1
  if [ "$expect" = fail ] && [ $status -eq 0 ]; then ok=0; fi
  if [ "$expect" = 0 ] && [ $status -ne 0 ]; then ok=0; fi
  local text="$out"
  [ -f "$dir/include/distlock/config.hpp" ] && text+=$'\n'"$(cat "$dir/include/distlock/config.hpp")"
  text=$(tr -s ' \n' '  ' <<<"$text")  # CMake wraps its messages
  for needle in "${needles[@]}"; do
    if ! grep -qF -- "$needle" <<<"$text"; then
      ok=0
      echo "  missing: $needle"
    fi
  done
  if [ $ok -eq 1 ]; then
    echo "ok   $name"
  else
    echo "FAIL $name (cmake exit $status)"
    sed 's/^/     | /' <<<"$out" | tail -15
    failures=$((failures + 1))
  fi
}

configure "a subset configures; config.hpp says which" 0 \
  "#define DISTLOCK_HAS_FILE 1" "#define DISTLOCK_HAS_REDIS 1" "#define DISTLOCK_HAS_ETCD 0" \
  "#define DISTLOCK_HAS_IDS 0" -- -DDISTLOCK_COMPONENTS="file;redis"
configure "the options alone" 0 "#define DISTLOCK_HAS_POSTGRES 1" "#define DISTLOCK_HAS_MYSQL 1" \
  "#define DISTLOCK_HAS_FILE 0" \
  -- -DDISTLOCK_WITH_FILE=OFF -DDISTLOCK_WITH_REDIS=OFF -DDISTLOCK_WITH_REDISCLUSTER=OFF \
  -DDISTLOCK_WITH_REDLOCK=OFF -DDISTLOCK_WITH_ETCD=OFF -DDISTLOCK_WITH_ZK=OFF -DDISTLOCK_WITH_FENCING=OFF \
  -DDISTLOCK_WITH_IDS=OFF
configure "an unknown component" fail "unknown component 'nope'" -- -DDISTLOCK_COMPONENTS="file;nope"
configure "fencing without redis" fail "DISTLOCK_WITH_FENCING=ON needs DISTLOCK_WITH_REDIS=ON" \
  -- -DDISTLOCK_COMPONENTS="file;fencing"
configure "redlock without redis" fail "DISTLOCK_WITH_REDLOCK=ON needs DISTLOCK_WITH_REDIS=ON" \
  -- -DDISTLOCK_COMPONENTS="file;redlock"
configure "etcd without its .proto files" fail "golang-etcd-server-dev" "-DDISTLOCK_WITH_ETCD=OFF" \
  -- -DDISTLOCK_COMPONENTS=etcd -DDISTLOCK_ETCD_PROTO_ROOT="$work/none"

# pkg-config finds nothing.
mkdir -p "$work/empty"
hide=(env PKG_CONFIG_LIBDIR="$work/empty" PKG_CONFIG_PATH=)
configure "redis without hiredis" fail "libhiredis-dev" "-DDISTLOCK_WITH_REDIS=OFF" -- -DDISTLOCK_COMPONENTS=redis
configure "redlock without hiredis" fail "libhiredis-dev" -- -DDISTLOCK_COMPONENTS="redis;redlock"
configure "etcd without gRPC" fail "libgrpc++-dev libprotobuf-dev" "-DDISTLOCK_WITH_ETCD=OFF" \
  -- -DDISTLOCK_COMPONENTS=etcd
configure "postgres without libpq" fail "libpq-dev" "-DDISTLOCK_WITH_POSTGRES=OFF" -- -DDISTLOCK_COMPONENTS=postgres
configure "mysql without libmariadb" fail "libmariadb-dev" "-DDISTLOCK_WITH_MYSQL=OFF" -- -DDISTLOCK_COMPONENTS=mysql

# find_path/find_library/find_package(OpenSSL) do not look into /usr.
hide=()
ignore="-DCMAKE_IGNORE_PATH=/usr/include;/usr/lib/x86_64-linux-gnu;/usr/lib;/lib/x86_64-linux-gnu"
configure "zk without the ZooKeeper C client" fail "libzookeeper-mt-dev" "-DDISTLOCK_WITH_ZK=OFF" \
  -- -DDISTLOCK_COMPONENTS=zk "$ignore"
configure "file without OpenSSL" fail "libssl-dev" "-DDISTLOCK_WITH_FILE=OFF" -- -DDISTLOCK_COMPONENTS=file "$ignore"

echo "$n configurations, $failures failed"
[ $failures -eq 0 ]
