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
# JSON lines of every workload, then the ratios. The baselines and the workloads they
# are compared with run in ROUNDS interleaved rounds (raw, then distlock, then raw
# again...), so a noisy spell on this shared machine hits both sides of a ratio; each
# ratio is given as the median over the rounds with its range, and judged by the
# median. Measurements only: nothing fails on a slow figure.
#
# Usage: ./scripts/bench_redis.sh [BUILD_DIR]   (default build-bench; configured and
#        built in Release if distlock-bench is missing there)
# Env:   OPS (default 20000), ROUNDS (3), CLIENTS (4), SERVER_CPU (0), CLIENT_CPU (1), OUT (file for the JSON lines),
#        PEERS=1: also the peers, uncontended, pinned like the rest: redis-py's Lock (Debian's
#        python3-redis) and node-redlock 4.2.0 on ioredis (installed with npm into a temporary
#        directory, removed on exit; bench/redis_peers/).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build-bench}
ops=${OPS:-20000}
rounds=${ROUNDS:-3}
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
# The same, each JSON line tagged with the round it belongs to.
run_in() {
  local round=$1
  shift
  taskset -c "$client_cpu" "$@" | sed -u "s/^{/{\"round\":$round,/" | tee -a "$out"
}

echo "# redis-server pid $redis_pid on CPU $server_cpu, clients on CPU $client_cpu, $url" >&2
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs; figures are only meaningful on a quiet machine)" >&2
: >"$out"
for round in $(seq 1 "$rounds"); do
  echo "# round $round of $rounds" >&2
  run_in "$round" "$raw" --port "$port" --ops "$ops" --handoff-clients 2,16 --many-keys-threads 16 --keys 10000
  redis-cli -p "$port" config resetstat >/dev/null
  run_in "$round" "$bench" --url "$url" --workload uncontended --ops "$ops"
  # Server-side cost of the lock scripts (acquire and release are one EVALSHA each).
  evalsha_usec=$(redis-cli -p "$port" info commandstats | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\),.*/\1/p')
  run_in "$round" "$bench" --url "$url" --workload contended --clients 2 --ops "$((ops / 4))"
  run_in "$round" "$bench" --url "$url" --workload contended --clients 16 --ops "$((ops / 4))"
  run_in "$round" "$bench" --url "$url" --workload many-keys --clients 1 --threads 16 --keys 10000 --ops "$ops"
done
run "$bench" --url "$url" --workload many-keys --clients "$clients" --keys 1000 --ops "$ops"
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
import json, statistics, sys
rows = {}        # first line of each (workload, clients, threads), for the untagged workloads
by_round = {}    # round -> {key: row}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    j = json.loads(line)
    keys = [j["workload"], (j["workload"], j.get("clients")), (j["workload"], j.get("clients"), j.get("threads"))]
    target = by_round.setdefault(j["round"], {}) if "round" in j else rows
    for k in keys:
        target.setdefault(k, j)
renew_evalsha = int(sys.argv[2])
evalsha_usec = sys.argv[3]
def verdict(ok): return "meets target" if ok else "MISSES target"
def across(f):
    vals = [f(r) for _, r in sorted(by_round.items())]
    return statistics.median(vals), min(vals), max(vals), vals
def show(label, f, target, upper=True, unit="x"):
    med, lo, hi, vals = across(f)
    ok = med <= target if upper else med >= target
    each = ", ".join(f"{v:.2f}" for v in vals)
    print(f"{label}: median {med:.2f}{unit} over {len(vals)} rounds (range {lo:.2f}-{hi:.2f}: {each})  "
          f"(target {'<=' if upper else '>='} {target}{unit}: {verdict(ok)})")
print()
for k, r in sorted(by_round.items()):
    print(f"round {k}: raw lock p50 {r['raw-lock']['p50_us']} us, uncontended p50 {r['uncontended']['p50_us']} us; "
          f"raw hand-off p50 {r[('raw-handoff', 2)]['p50_us']} / {r[('raw-handoff', 16)]['p50_us']} us, "
          f"contended p50 {r[('contended', 2)]['p50_us']} / {r[('contended', 16)]['p50_us']} us (2 / 16 clients); "
          f"many keys {r[('many-keys', 1, 16)]['ops_per_s']:.0f} vs raw {r['raw-many-keys']['ops_per_s']:.0f} pairs/s")
show("uncontended p50 / raw lock p50", lambda r: r["uncontended"]["p50_us"] / r["raw-lock"]["p50_us"], 1.15)
show("contended handoff p50, 2 clients / raw direct hand-off", lambda r: r[("contended", 2)]["p50_us"] / r[("raw-handoff", 2)]["p50_us"], 1.3)
show("contended handoff p50, 16 clients / raw direct hand-off", lambda r: r[("contended", 16)]["p50_us"] / r[("raw-handoff", 16)]["p50_us"], 1.3)
show("contended handoff p50, 16 clients / 2 clients", lambda r: r[("contended", 16)]["p50_us"] / r[("contended", 2)]["p50_us"], 1.3)
show("many keys, one client shared by 16 threads / raw 16 threads with a connection each (pairs/s)",
     lambda r: r[("many-keys", 1, 16)]["ops_per_s"] / r["raw-many-keys"]["ops_per_s"], 2.5, upper=False)
last = by_round[max(by_round)]
ren = rows["renew"]
r3 = ren["round_trips_per_call"]
print(f"(one raw round trip, PING: p50 {last['raw-ping']['p50_us']} us in the last round; server time per lock script call "
      f"in the last uncontended run: {evalsha_usec} us)")
print(f"renew {ren['leases']} leases: {r3:g} round trips per tick ({renew_evalsha} EVALSHA calls per tick on the server, pipelined), "
      f"p50 {ren['p50_us']} us per tick  (target <= 100: {verdict(r3 <= 100)})")
raw_lock = last["raw-lock"]
unc = last["uncontended"]
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{") and '"peer-uncontended"' in line:
        j = json.loads(line)
        print(f"peer {j['impl']}: uncontended p50 {j['p50_us']} us ({j['p50_us'] / raw_lock['p50_us']:.2f}x the raw lock "
              f"of the last round; distlock {unc['p50_us'] / raw_lock['p50_us']:.2f}x)")
PY
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "# JSON lines in $out" >&2
