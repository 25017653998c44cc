#!/usr/bin/env bash
# The cost of a binding (issue 29 §6): uncontended acquire + release on redis:// through the C++
# API, the C API (distlock-bench-bindings: C++ and C in one process), the Go module
# (bench/bindings/go) and the Python package beside redis-py's Lock (bench/python/binding_bench.py:
# C++ timed inside the Python process, distlock-python, redis-py), all against one redis-server
# started here on a free loopback port (stopped by pid on exit). ROUNDS interleaved rounds: each
# round runs the three programs once, so load that comes and goes hits every binding alike.
# Server on CPU $SERVER_CPU, clients on CPU $CLIENT_CPU. Prints every JSON line (with its round),
# then one summary line per binding: the median and range of its per-round p50, and of its
# per-round p50 over the C++ one of the same round.
# Usage: bench/bindings/run.sh BUILD_DIR [OPS] [ROUNDS]
#   BUILD_DIR built with distlock-bench-bindings (DISTLOCK_BUILD_EXAMPLES=ON), distlock_c and,
#   with DISTLOCK_WITH_PYTHON=ON, _distlock; python3-redis installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR [OPS] [ROUNDS]}" && pwd)
ops=${2:-5000}
rounds=${3:-3}
client_cpu=${CLIENT_CPU:-1}
server_cpu=${SERVER_CPU:-0}
bench=$build/bindings/c/distlock-bench-bindings
[[ -x $bench ]] || { echo "run.sh: no $bench (build target distlock-bench-bindings)" >&2; exit 1; }
pydir=$build/bindings/python
ls "$pydir"/distlock/_distlock*.so >/dev/null 2>&1 ||
  { echo "run.sh: no Python module under $pydir (build target _distlock)" >&2; exit 1; }

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
# Tags each JSON line with the round.
tag() { python3 -c 'import json,sys
for l in sys.stdin:
    if l.startswith("{\"workload\""):
        r = json.loads(l); r["round"] = int(sys.argv[1]); print(json.dumps(r), flush=True)' "$1"; }
for r in $(seq "$rounds"); do
  taskset -c "$client_cpu" "$bench" "$url" "$ops" 1 | tag "$r"
  taskset -c "$client_cpu" "$work/go-bench" "$url" "$ops" 1 | tag "$r"
  PYTHONPATH=$pydir taskset -c "$client_cpu" /usr/bin/python3 "$here/../python/binding_bench.py" --url "$url" \
    --ops "$ops" --rounds 1 2>/dev/null | tag "$r"
done | tee "$work/out.jsonl"
python3 - "$work/out.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["binding"], {})[r["round"]] = r["p50_us"]
cpp = by["cpp"]
def stats(xs):
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}
for b in ("cpp", "c", "go", "cpp-in-python", "python", "redis-py", "memory-cpp", "memory-python"):
    if b not in by:
        continue
    p50 = by[b]
    out = {"summary": b, "rounds": len(p50), "p50_us": stats(list(p50.values()))}
    if not b.startswith("memory"):
        out["p50_over_cpp"] = stats([p50[r] / cpp[r] for r in p50 if r in cpp])
    if b == "python":
        out["p50_over_cpp_in_python"] = stats([p50[r] / by["cpp-in-python"][r] for r in p50])
        out["p50_over_redis_py"] = stats([p50[r] / by["redis-py"][r] for r in p50])
    print(json.dumps(out))
PY
