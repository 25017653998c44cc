#!/usr/bin/env bash
# Runs distlock-ids-bench pinned to CPU 0 against a redis-server it starts itself on a
# free loopback port, pinned to CPU 1, in a temporary directory; stops it by pid.
#   bench/ids/run.sh [BUILD_DIR] [extra distlock-ids-bench flags...]
set -euo pipefail
build=${1:-build}
shift || true
bench=$(find "$build" -name distlock-ids-bench -type f -perm -u+x | head -n1)
[[ -n $bench ]] || { echo "run.sh: distlock-ids-bench not found under $build (build target distlock-ids-bench)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "run.sh: redis-server not found" >&2; exit 1; }

dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
taskset -c 1 redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --logfile "$dir/redis.log" &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null; wait "$redis_pid" 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.05
done
taskset -c 0 "$bench" --redis-url "redis://127.0.0.1:$port" --lock-url "file://$dir/locks" "$@"
