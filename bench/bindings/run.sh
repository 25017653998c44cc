#!/usr/bin/env bash
# The cost of a binding (issue 29 §6): uncontended acquire + release on redis:// through the C++
# API, the C API (distlock-bench-bindings, one process, alternating rounds) and the Go module
# (bench/bindings/go), against one redis-server started here on a free loopback port (stopped by
# pid on exit). Server on CPU $SERVER_CPU, clients on CPU $CLIENT_CPU. Prints JSON lines, then
# each binding's p50 over the C++ one.
# Usage: bench/bindings/run.sh BUILD_DIR [OPS] [ROUNDS]   (BUILD_DIR built with distlock-bench-bindings)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR [OPS] [ROUNDS]}" && pwd)
ops=${2:-5000}
rounds=${3:-3}
client_cpu=${CLIENT_CPU:-1}
server_cpu=${SERVER_CPU:-0}
bench=$build/bindings/c/distlock-bench-bindings
[[ -x $bench ]] || { echo "run.sh: no $bench (build target distlock-bench-bindings)" >&2; exit 1; }

work=$(mktemp -d /tmp/distlock-bindings-bench.XXXXXX)
pid=
cleanup() {
  [[ -n $pid ]] && kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
taskset -c "$server_cpu" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  --logfile "$work/redis.log" &
pid=$!
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
url="redis://127.0.0.1:$port"

export PKG_CONFIG_PATH=$build/bindings/go/pkgconfig GOCACHE=$build/bindings/go/gocache GOPATH=$build/bindings/go/gopath
export GOPROXY=off GOFLAGS=
(cd "$here/go" && go build -o "$work/go-bench" .)
{
  taskset -c "$client_cpu" "$bench" "$url" "$ops" "$rounds"
  taskset -c "$client_cpu" "$work/go-bench" "$url" "$ops" "$rounds"
} | tee "$work/out.jsonl"
python3 - "$work/out.jsonl" <<'PY'
import json, sys
rows = {r["binding"]: r for r in map(json.loads, open(sys.argv[1]))}
base = rows["cpp"]["p50_us"]
for b in ("c", "go"):
    print(json.dumps({"binding": b, "p50_over_cpp": round(rows[b]["p50_us"] / base, 3)}))
PY
