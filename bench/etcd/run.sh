#!/usr/bin/env bash
# Uncontended acquire+release latency of the distlock etcd backend beside etcd's own
# Go concurrency.Mutex and the npm `etcd3` client's Lock: same run, same etcd
# (started here on a free loopback port, pinned to CPU 0), clients pinned to CPU 1.
# Prints one JSON line per implementation, then one line with the ratios.
#
#   bench/etcd/run.sh [--ops N] [--warmup N] [--rounds R] [--build-dir DIR]
#
# distlock and the Go mutex run R times, alternating, so drift in the machine's
# load hits both alike; the summary line compares the medians of their p50s.
# The npm client (about 30x slower) runs once.
#
# Installs what it needs and is missing: golang-go (apt-get; the etcd Go sources
# come from golang-etcd-server-dev, built offline in GOPATH mode) and `etcd3`
# (npm, into a temporary directory). A baseline that cannot be built is reported
# as a JSON line with an "error" field instead of a figure.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
ops=2000
warmup=200
rounds=3
build="$root/build-bench-etcd"
while [ $# -gt 0 ]; do
  case "$1" in
    --ops) ops="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    *) echo "usage: $0 [--ops N] [--warmup N] [--rounds R] [--build-dir DIR]" >&2; exit 64 ;;
  esac
done

server_cpu=0
client_cpu=1
if [ "$(nproc)" -lt 2 ]; then client_cpu=0; fi

tmp="$(mktemp -d /tmp/distlock-bench-etcd.XXXXXX)"
etcd_pid=""
cleanup() {
  if [ -n "$etcd_pid" ]; then kill "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# --- distlock-bench -----------------------------------------------------------
if [ ! -x "$build/bench/distlock-bench" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDISTLOCK_COMPONENTS=etcd \
    -DDISTLOCK_BUILD_TESTS=OFF -DDISTLOCK_BUILD_TOOLS=OFF -DDISTLOCK_BUILD_EXAMPLES=ON >/dev/null
  cmake --build "$build" -j2 --target distlock-bench >/dev/null
fi

# --- baselines ----------------------------------------------------------------
go_bin=""
go_error=""
if ! command -v go >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends golang-go >/dev/null 2>&1 ||
    go_error="golang-go could not be installed with apt-get"
fi
if [ -z "$go_error" ]; then
  if (cd "$here/go_mutex" && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$tmp/gocache" GOFLAGS= \
        go build -o "$tmp/go-mutex" . ) >"$tmp/go-build.log" 2>&1; then
    go_bin="$tmp/go-mutex"
  else
    go_error="go build failed: $(tr '\n"' ' ' <"$tmp/go-build.log" | cut -c1-400)"
  fi
fi

node_error=""
if ! (cd "$tmp" && npm install --prefix "$tmp/node" --no-audit --no-fund --silent etcd3 >"$tmp/npm.log" 2>&1); then
  node_error="npm install etcd3 failed: $(tr '\n"' ' ' <"$tmp/npm.log" | cut -c1-400)"
fi

# --- etcd ---------------------------------------------------------------------
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
peer="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
taskset -c "$server_cpu" etcd --name bench --data-dir "$tmp/etcd" \
  --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "bench=http://127.0.0.1:$peer" --logger zap --log-level error >"$tmp/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 100); do
  etcdctl --endpoints="127.0.0.1:$port" endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done

endpoint="127.0.0.1:$port"
pin=(taskset -c "$client_cpu")

ours_lines=()
go_lines=()
for _ in $(seq "$rounds"); do
  line="$("${pin[@]}" "$build/bench/distlock-bench" --url "etcd://$endpoint" --workload uncontended \
    --ops "$ops" --warmup "$warmup" --ttl-ms 30000)"
  echo "$line"
  ours_lines+=("$line")
  if [ -n "$go_bin" ]; then
    line="$("${pin[@]}" "$go_bin" --endpoints "$endpoint" --ops "$ops" --warmup "$warmup" --ttl 30)"
  else
    line="{\"workload\":\"uncontended\",\"impl\":\"go-concurrency-mutex\",\"error\":\"$go_error\"}"
  fi
  echo "$line"
  go_lines+=("$line")
done
if [ -z "$node_error" ]; then
  node_line="$(NODE_PATH="$tmp/node/node_modules" "${pin[@]}" node "$here/etcd3_lock.js" --endpoints "$endpoint" \
    --ops "$ops" --warmup "$warmup" --ttl 30)"
else
  node_line="{\"workload\":\"uncontended\",\"impl\":\"npm-etcd3-lock\",\"error\":\"$node_error\"}"
fi
echo "$node_line"

python3 - "$node_line" "${#ours_lines[@]}" "${ours_lines[@]}" "${go_lines[@]}" <<'PY'
import json, statistics, sys
node = json.loads(sys.argv[1])
n = int(sys.argv[2])
ours = [json.loads(a) for a in sys.argv[3:3 + n]]
go = [json.loads(a) for a in sys.argv[3 + n:3 + 2 * n]]
med = lambda rows: statistics.median(r["p50_us"] for r in rows) if all("p50_us" in r for r in rows) else None
out = {"workload": "uncontended", "rounds": n, "distlock_p50_us": med(ours)}
for name, value in (("go_concurrency_mutex", med(go)), ("npm_etcd3_lock", node.get("p50_us"))):
    if value:
        out[name + "_p50_us"] = value
        out["ratio_vs_" + name] = round(out["distlock_p50_us"] / value, 3)
print(json.dumps(out))
PY
