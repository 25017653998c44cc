#!/usr/bin/env bash
# Redlock benchmark: starts 5 redis-server masters on free loopback ports (pinned
# to one CPU), then for 3 and 5 masters runs redlock_bench (distlock beside the
# raw hiredis fan-out baseline, same process, pinned to another CPU) and
# node-redlock (installed with npm into a temporary directory) on the same pin.
# Prints JSON lines. Usage:
#   bench/redlock/run.sh [path/to/redlock_bench] [ops]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bench=${1:-$here/../../build/bench/redlock/redlock_bench}
ops=${2:-6000}
client_cpu=${CLIENT_CPU:-0}
server_cpu=${SERVER_CPU:-1}

[[ -x $bench ]] || { echo "run.sh: no redlock_bench at $bench (build target redlock_bench)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "run.sh: redis-server not found" >&2; exit 1; }

work=$(mktemp -d /tmp/redlock-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

ports=()
for i in 1 2 3 4 5; do
  port=$(free_port)
  mkdir -p "$work/r$i"
  taskset -c "$server_cpu" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work/r$i" --logfile "$work/r$i/log" &
  pids+=($!)
  ports+=("$port")
done
for port in "${ports[@]}"; do
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
done

# node-redlock into a temporary directory (npm's configured registry).
node_ok=0
if command -v npm >/dev/null && command -v node >/dev/null; then
  if (cd "$work" && npm init -y >/dev/null 2>&1 &&
      npm install --no-audit --no-fund --silent redlock@4.2.0 ioredis@4 >/dev/null 2>"$work/npm.err"); then
    cp "$here/node_redlock_bench.js" "$work/"
    node_ok=1
  else
    echo "run.sh: npm install of node-redlock failed: $(tail -3 "$work/npm.err")" >&2
  fi
fi

for n in 3 5; do
  list=$(printf '127.0.0.1:%s,' "${ports[@]:0:$n}")
  list=${list%,}
  taskset -c "$client_cpu" "$bench" --masters "$list" --ops "$ops"
  if [[ $node_ok == 1 ]]; then
    (cd "$work" && taskset -c "$client_cpu" node node_redlock_bench.js "$list" "$ops")
  fi
done
