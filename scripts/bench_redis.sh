#!/usr/bin/env bash
# Benchmarks distlock on Redis beside a raw hiredis baseline, in the same run and with
# the same CPU pinning, and prints the ratios the design targets:
#   uncontended p50        vs the raw SET NX PX + EVALSHA compare-and-delete lock (<= 1.15x)
#   contended handoff p50  vs the raw direct hand-off (queue + grant in the release
#                          script + PUBLISH to the head waiter), at 2 and 16 clients (<= 1.3x),
#                          and 16 clients vs 2 clients                              (<= 1.3x)
#   renewal of 10,000 held leases: round trips per renewer tick                   (<= 100)
#   many keys: one client shared by 16 threads over 10,000 keys, acquire+release pairs/s,
#                          vs 16 raw threads with a connection each                (>= 2.5x)
# It starts its own redis-server on a free loopback port (stopped by pid on exit),
# pins the server to one CPU and the clients to another with taskset, and prints the
# JSON lines of every workload, then the ratios. Measurements only: nothing fails on
# a slow figure.
#
# Usage: ./scripts/bench_redis.sh [BUILD_DIR]   (default build-bench; configured and
#        built in Release if distlock-bench is missing there)
# Env:   OPS (default 20000), CLIENTS (4), SERVER_CPU (0), CLIENT_CPU (1), OUT (file for the JSON lines),
#        PEERS=1: also the peers, uncontended, pinned like the rest: redis-py's Lock (Debian's
#        python3-redis) and node-redlock 4.2.0 on ioredis (installed with npm into a temporary
#        directory, removed on exit; bench/redis_peers/).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build-bench}
ops=${OPS:-20000}
clients=${CLIENTS:-4}
server_cpu=${SERVER_CPU:-0}
client_cpu=${CLIENT_CPU:-1}
out=${OUT:-$(mktemp /tmp/distlock-bench.XXXXXX.jsonl)}
peers=${PEERS:-0}

for tool in redis-server redis-cli taskset python3; do
  command -v "$tool" >/dev/null || { echo "bench_redis.sh: $tool is missing (run ./scripts/bootstrap.sh)" >&2; exit 1; }
done

if [ ! -x "$build/bench/distlock-bench" ] || [ ! -x "$build/bench/distlock-bench-raw-redis" ]; then
  echo "bench_redis.sh: building distlock-bench in $build (Release)" >&2
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDISTLOCK_BUILD_TESTS=OFF -DDISTLOCK_BUILD_TOOLS=OFF \
    -DDISTLOCK_COMPONENTS="file;redis" >/dev/null
  cmake --build "$build" -j2 --target distlock-bench distlock-bench-raw-redis >/dev/null
fi
bench="$build/bench/distlock-bench"
raw="$build/bench/distlock-bench-raw-redis"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
if [ "$peers" = 1 ]; then
  /usr/bin/python3 -c 'import redis' 2>/dev/null || { echo "bench_redis.sh: python3-redis is missing (apt-get install python3-redis)" >&2; exit 1; }
  command -v node >/dev/null && command -v npm >/dev/null || { echo "bench_redis.sh: node and npm are missing" >&2; exit 1; }
fi
dir=$(mktemp -d /tmp/distlock-bench-redis.XXXXXX)
redis_pid=""
cleanup() {
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM

taskset -c "$server_cpu" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$dir" --logfile "$dir/redis.log" &
redis_pid=$!
for _ in $(seq 1 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.05
done
redis-cli -p "$port" ping >/dev/null || { echo "bench_redis.sh: redis-server did not start" >&2; cat "$dir/redis.log" >&2; exit 1; }

url="redis://127.0.0.1:$port"
evalsha_calls() { redis-cli -p "$port" info commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p'; }
run() { taskset -c "$client_cpu" "$@" | tee -a "$out"; }

echo "# redis-server pid $redis_pid on CPU $server_cpu, clients on CPU $client_cpu, $url" >&2
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs; figures are only meaningful on a quiet machine)" >&2
: >"$out"
run "$raw" --port "$port" --ops "$ops" --handoff-clients 2,16 --many-keys-threads 16 --keys 10000
redis-cli -p "$port" config resetstat >/dev/null
run "$bench" --url "$url" --workload uncontended --ops "$ops"
# Server-side cost of the lock scripts (acquire and release are one EVALSHA each).
evalsha_usec=$(redis-cli -p "$port" info commandstats | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\),.*/\1/p')
run "$bench" --url "$url" --workload contended --clients 2 --ops "$((ops / 4))"
run "$bench" --url "$url" --workload contended --clients 16 --ops "$((ops / 4))"
run "$bench" --url "$url" --workload many-keys --clients "$clients" --keys 1000 --ops "$ops"
run "$bench" --url "$url" --workload many-keys --clients 1 --threads 16 --keys 10000 --ops "$ops"
before=$(evalsha_calls)
run "$bench" --url "$url" --workload renew --keys 10000 --rounds 5 --warmup 0
after=$(evalsha_calls)
# The renew workload makes 10,000 acquires and 10,000 releases (one EVALSHA each) around
# 6 renew ticks (1 warm-up): what is left is the renewer's calls per tick, server side.
renew_evalsha=$(( (after - before - 20000) / 6 ))
if [ "$peers" = 1 ]; then
  (cd "$dir" && npm install --silent --no-audit --no-fund redlock@4.2.0 ioredis@5 >/dev/null)
  run /usr/bin/python3 bench/redis_peers/redis_py_lock.py --port "$port" --ops "$((ops / 4))"
  run env NODE_PATH="$dir/node_modules" node bench/redis_peers/node_redlock.js "$port" "$((ops / 4))" 500
fi

python3 - "$out" "$renew_evalsha" "$evalsha_usec" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        j = json.loads(line)
        rows.setdefault(j["workload"], j)
        rows.setdefault((j["workload"], j.get("clients")), j)
        rows.setdefault((j["workload"], j.get("clients"), j.get("threads")), j)
renew_evalsha = int(sys.argv[2])
evalsha_usec = sys.argv[3]
raw_lock, ping = rows["raw-lock"], rows["raw-ping"]
unc, ren = rows["uncontended"], rows["renew"]
con2, con16 = rows[("contended", 2)], rows[("contended", 16)]
raw2, raw16 = rows[("raw-handoff", 2)], rows[("raw-handoff", 16)]
def verdict(ok): return "meets target" if ok else "MISSES target"
r1 = unc["p50_us"] / raw_lock["p50_us"]
r2a = con2["p50_us"] / raw2["p50_us"]
r2b = con16["p50_us"] / raw16["p50_us"]
r2c = con16["p50_us"] / con2["p50_us"]
r3 = ren["round_trips_per_call"]
mk, rawmk = rows[("many-keys", 1, 16)], rows["raw-many-keys"]
r4 = mk["ops_per_s"] / rawmk["ops_per_s"]
print()
print(f"uncontended p50 {unc['p50_us']} us / raw lock p50 {raw_lock['p50_us']} us = {r1:.2f}x  (target <= 1.15x: {verdict(r1 <= 1.15)})")
print(f"contended handoff, 2 clients: p50 {con2['p50_us']} us / raw direct hand-off p50 {raw2['p50_us']} us = {r2a:.2f}x  (target <= 1.3x: {verdict(r2a <= 1.3)})")
print(f"contended handoff, 16 clients: p50 {con16['p50_us']} us / raw direct hand-off p50 {raw16['p50_us']} us = {r2b:.2f}x  (target <= 1.3x: {verdict(r2b <= 1.3)})")
print(f"contended handoff, 16 clients vs 2 clients: {con16['p50_us']} us / {con2['p50_us']} us = {r2c:.2f}x  (target <= 1.3x: {verdict(r2c <= 1.3)})")
print(f"(one raw round trip, PING: p50 {ping['p50_us']} us; server time per lock script call in the uncontended run: {evalsha_usec} us)")
print(f"renew {ren['leases']} leases: {r3:g} round trips per tick ({renew_evalsha} EVALSHA calls per tick on the server, pipelined), "
      f"p50 {ren['p50_us']} us per tick  (target <= 100: {verdict(r3 <= 100)})")
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{") and '"peer-uncontended"' in line:
        j = json.loads(line)
        print(f"peer {j['impl']}: uncontended p50 {j['p50_us']} us ({j['p50_us'] / raw_lock['p50_us']:.2f}x the raw lock; distlock {r1:.2f}x)")
print(f"many keys, one client shared by 16 threads: {mk['ops_per_s']:.0f} pairs/s / raw 16 threads with a connection each "
      f"{rawmk['ops_per_s']:.0f} pairs/s = {r4:.2f}x  (target >= 2.5x: {verdict(r4 >= 2.5)})")
PY
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "# JSON lines in $out" >&2
