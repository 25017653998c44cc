#!/usr/bin/env bash
# The main demo: the seckill flash sale (examples/seckill) — 500 buyers in 2 processes x
# 8 threads competing for 300 items under one distributed lock, every stock write fenced
# by the lock's token — first on the embedded default backend (host-local file:// locks,
# no server), then on a local redis-server this script starts on a free port and stops
# on exit; then once more with a deliberately wrong lock (--lock-per-buyer), which must be
# caught (exit 1). Installs missing Debian packages first (scripts/bootstrap.sh), builds in
# Release into build-demo/. Exits non-zero if a correct sale oversells or fails, or if the
# wrong lock goes unnoticed.
# Usage: ./scripts/demo.sh [extra seckill flags, e.g. --stock 1000 --requests 2000]
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/bootstrap.sh

build=build-demo
echo "==== building seckill (Release, $build/) ===="
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDISTLOCK_BUILD_TESTS=OFF -DDISTLOCK_BUILD_TOOLS=OFF \
  -DDISTLOCK_COMPONENTS="file;redis;fencing" >/dev/null
cmake --build "$build" -j2 --target seckill
seckill="$build/examples/seckill/seckill"

echo
echo "==== seckill on the embedded default (no --url: host-local file:// locks) ===="
env -u DISTLOCK_URL "$seckill" "$@"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d /tmp/distlock-demo-redis.XXXXXX)
redis_pid=""
cleanup() {
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --logfile "$dir/redis.log" &
redis_pid=$!
for _ in $(seq 1 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.05
done
if ! redis-cli -p "$port" ping >/dev/null 2>&1; then
  echo "demo: redis-server did not start:" >&2
  cat "$dir/redis.log" >&2
  exit 1
fi

echo
echo "==== seckill on redis://127.0.0.1:$port (redis-server pid $redis_pid, started by this script) ===="
"$seckill" --url "redis://127.0.0.1:$port" "$@"

echo
echo "==== the same sale with a WRONG lock (--lock-per-buyer: each buyer locks its own name) ===="
echo "==== expected: overselling caught, exit status 1 ===="
set +e
env -u DISTLOCK_URL "$seckill" --lock-per-buyer --stock 100 --requests 200
status=$?
set -e
if [ "$status" -ne 1 ]; then
  echo "demo: the broken lock was NOT caught (exit status $status)" >&2
  exit 1
fi
echo
echo "demo: both sales sold exactly the stock, with no oversold item and no duplicate buyer;"
echo "demo: the wrong lock oversold and was caught"
