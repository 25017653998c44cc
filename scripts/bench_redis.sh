#!/usr/bin/env bash
# Benchmarks distlock on Redis beside a raw hiredis baseline, in the same run and with
# the same CPU pinning, and prints the ratios the design targets:
#   uncontended p50        vs the raw SET NX PX + EVALSHA compare-and-delete lock (<= 1.15x)
#   contended handoff p50  vs the raw direct hand-off (queue + grant in the release
#                          script + PUBLISH to the head waiter), at 2 and 16 clients (<= 1.3x),
#                          and 16 clients vs 2 clients                              (<= 1.3x)
#   renewal of 10,000 held leases: round trips per renewer tick                   (<= 100)
#   many keys: one client shared by 16 threads over 10,000 keys, acquire+release pairs/s,
#                          vs 16 raw threads with a connection each                (>= 1.5x)
#   per acquire + release pair, for every workload beside its raw counterpart:
#     client CPU (getrusage user + sys of the benchmark process, all threads)   (<= 1.5x)
#     server CPU (INFO cpu used_cpu_user + used_cpu_sys of redis-server)        (<= 2x)
#     server command time (INFO commandstats usec of the commands the client sent:
#                          the scripts, with what they run inside, and SET, SUBSCRIBE...) (<= 2x)
#     client context switches (voluntary + involuntary, getrusage)
# It starts its own redis-server on a free loopback port (stopped by pid on exit) and
# runs everything under each pinning of PINNINGS (server CPU:client CPU, taskset; the
# server is re-pinned between them). Every workload runs in its own process beside its
# raw counterpart (raw, then distlock, in ROUNDS interleaved rounds), so the server's
# counters are read around each one and a noisy spell on this shared machine hits both
# sides of a ratio; each ratio is the median over the rounds with its range, and judged
# by the median. The load average is printed with every round. Measurements only:
# nothing fails on a slow figure. scripts/plot_bench.py draws p50/p99 against clients
# from the JSON lines.
#
# Usage: ./scripts/bench_redis.sh [BUILD_DIR]   (default build-bench; configured and
#        built in Release if distlock-bench is missing there)
# Env:   OPS (default 20000), ROUNDS (3), CLIENTS (4), HANDOFF_CLIENTS (2,16),
#        PINNINGS ("0:1 0:0": the server on CPU 0 and the clients on CPU 1, then all on CPU 0),
#        OUT (file for the JSON lines),
#        PEERS=1: also the peers, uncontended, pinned like the rest: redis-py's Lock (Debian's
#        python3-redis) and node-redlock 4.2.0 on ioredis (installed with npm into a temporary
#        directory, removed on exit; bench/redis_peers/).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build-bench}
ops=${OPS:-20000}
rounds=${ROUNDS:-3}
clients=${CLIENTS:-4}
handoff_clients=${HANDOFF_CLIENTS:-2,16}
pinnings=${PINNINGS:-0:1 0:0}
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

taskset -c "${pinnings%%:*}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$dir" --logfile "$dir/redis.log" &
redis_pid=$!
for _ in $(seq 1 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.05
done
redis-cli -p "$port" ping >/dev/null || { echo "bench_redis.sh: redis-server did not start" >&2; cat "$dir/redis.log" >&2; exit 1; }

url="redis://127.0.0.1:$port"
evalsha_calls() { redis-cli -p "$port" info commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p'; }
# The server's counters: command calls summed over INFO commandstats; the time of the
# commands a client sent (usec of the scripts, EVAL*/FCALL*, which includes the commands
# they run, and of SUBSCRIBE, UNSUBSCRIBE, PING), and apart the time of SET, which the raw
# lock sends itself (a command run inside a script is counted on its own line too, so
# summing every line would count it twice); and the server's process CPU
# (used_cpu_user + used_cpu_sys), in microseconds.
server_counters() {
  redis-cli -p "$port" info all | python3 -c '
import re, sys
calls = sent = sets = 0
cpu = 0.0
top = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro", "subscribe", "unsubscribe", "ping"}
for line in sys.stdin:
    m = re.match(r"cmdstat_([^:]+):calls=(\d+),usec=(\d+),", line)
    if m:
        calls += int(m.group(2))
        if m.group(1) in top:
            sent += int(m.group(3))
        elif m.group(1) == "set":
            sets += int(m.group(3))
    m = re.match(r"used_cpu_(user|sys):([0-9.]+)", line)
    if m:
        cpu += float(m.group(2))
print(calls, sent, sets, round(cpu * 1e6))'
}
# run_in ROUND CMD...: runs CMD on the client CPU and tags its JSON lines with the round,
# the pinning and the load average; a line with "pairs" (one workload per process) also
# gets the server's counters per pair, read around the process. SET counts as sent by the
# client on the raw lines only: distlock's redis:// lock calls are all scripts (its SETs
# run inside them).
run_in() {
  local round=$1 before after tmp load
  shift
  tmp="$dir/run.jsonl"
  before=$(server_counters)
  taskset -c "$client_cpu" "$@" >"$tmp"
  after=$(server_counters)
  load=$(cut -d' ' -f1 /proc/loadavg)
  python3 - "$tmp" "$round" "$server_cpu:$client_cpu" "$load" $before $after <<'PY' | tee -a "$out"
import json, sys
path, rnd, pin, load = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
c0, u0, s0, p0, c1, u1, s1, p1 = map(int, sys.argv[5:13])
for line in open(path):
    line = line.strip()
    if not line.startswith("{"):
        continue
    j = {"round": rnd, "pinning": pin, "loadavg": load, **json.loads(line)}
    if j.get("pairs"):
        n = j["pairs"]
        j["server_cpu_us_per_pair"] = round((p1 - p0) / n, 2)
        sets = s1 - s0 if j["workload"].startswith("raw-") else 0
        j["server_cmd_us_per_pair"] = round((u1 - u0 + sets) / n, 2)
        j["server_calls_per_pair"] = round((c1 - c0) / n, 2)
    print(json.dumps(j))
PY
}
run() { run_in 0 "$@"; }

echo "# redis-server pid $redis_pid, $url; pinnings (server CPU:client CPU): $pinnings" >&2
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs; figures are only meaningful on a quiet machine)" >&2
: >"$out"
for pin in $pinnings; do
  server_cpu=${pin%%:*}
  client_cpu=${pin##*:}
  taskset -apc "$server_cpu" "$redis_pid" >/dev/null
  echo "# pinning: redis-server on CPU $server_cpu, clients on CPU $client_cpu" >&2
  for round in $(seq 1 "$rounds"); do
    echo "# round $round of $rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    run_in "$round" "$raw" --port "$port" --ops "$ops" --workload raw-lock,raw-ping
    run_in "$round" "$bench" --url "$url" --workload uncontended --ops "$ops"
    for n in ${handoff_clients//,/ }; do
      run_in "$round" "$raw" --port "$port" --ops "$ops" --workload raw-handoff --handoff-clients "$n"
      run_in "$round" "$bench" --url "$url" --workload contended --clients "$n" --ops "$((ops / 4))"
    done
    run_in "$round" "$raw" --port "$port" --ops "$ops" --workload raw-many-keys --many-keys-threads 16 --keys 10000
    run_in "$round" "$bench" --url "$url" --workload many-keys --clients 1 --threads 16 --keys 10000 --ops "$ops"
  done
done
# The renewal and many-clients figures once, under the first pinning.
server_cpu=${pinnings%%:*}
client_cpu=${pinnings%% *}
client_cpu=${client_cpu##*:}
taskset -apc "$server_cpu" "$redis_pid" >/dev/null
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

python3 - "$out" "$renew_evalsha" "$handoff_clients" <<'PY'
import json, statistics, sys
rows = {}   # first line of each (workload, clients, threads), for the untagged workloads
runs = {}   # pinning -> round -> {key: row}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    j = json.loads(line)
    keys = [j["workload"], (j["workload"], j.get("clients")), (j["workload"], j.get("clients"), j.get("threads"))]
    target = runs.setdefault(j["pinning"], {}).setdefault(j["round"], {}) if j.get("round") else rows
    for k in keys:
        target.setdefault(k, j)
renew_evalsha = int(sys.argv[2])
handoff = [int(n) for n in sys.argv[3].split(",") if n]
def verdict(ok): return "meets target" if ok else "MISSES target"
def show(by_round, label, f, target=None, upper=True, unit="x"):
    try:
        vals = [f(r) for _, r in sorted(by_round.items())]
    except (KeyError, ZeroDivisionError):
        print(f"{label}: not measured")
        return
    med, lo, hi = statistics.median(vals), min(vals), max(vals)
    each = ", ".join(f"{v:.2f}" for v in vals)
    judged = ""
    if target is not None:
        ok = med <= target if upper else med >= target
        judged = f"  (target {'<=' if upper else '>='} {target}{unit}: {verdict(ok)})"
    print(f"{label}: median {med:.2f}{unit} over {len(vals)} rounds (range {lo:.2f}-{hi:.2f}: {each}){judged}")
# (label, distlock key, raw key)
pairs = [("uncontended", "uncontended", "raw-lock")]
pairs += [(f"hand-off, {n} clients", ("contended", n), ("raw-handoff", n)) for n in handoff]
pairs += [("many keys, 16 threads", ("many-keys", 1, 16), "raw-many-keys")]
for pin, by_round in runs.items():
    server, client = pin.split(":")
    print(f"\n== redis-server on CPU {server}, clients on CPU {client}"
          f"{' (everything on one CPU)' if server == client else ''}; load averages per round: "
          + ", ".join(f"{r['uncontended']['loadavg']:.2f}" for _, r in sorted(by_round.items()))
          + " (a busy shared machine: latencies move with the load, CPU per pair much less)")
    for k, r in sorted(by_round.items()):
        print(f"round {k}: raw lock p50 {r['raw-lock']['p50_us']} us, uncontended p50 {r['uncontended']['p50_us']} us; "
              + "; ".join(f"raw hand-off {n} p50 {r[('raw-handoff', n)]['p50_us']} us, contended {n} p50 "
                          f"{r[('contended', n)]['p50_us']} us" for n in handoff)
              + f"; many keys {r[('many-keys', 1, 16)]['ops_per_s']:.0f} vs raw {r['raw-many-keys']['ops_per_s']:.0f} pairs/s")
    show(by_round, "uncontended p50 / raw lock p50", lambda r: r["uncontended"]["p50_us"] / r["raw-lock"]["p50_us"], 1.15)
    for n in handoff:
        show(by_round, f"contended handoff p50, {n} clients / raw direct hand-off",
             lambda r, n=n: r[("contended", n)]["p50_us"] / r[("raw-handoff", n)]["p50_us"], 1.3)
    if len(handoff) >= 2:
        lo_n, hi_n = handoff[0], handoff[-1]
        show(by_round, f"contended handoff p50, {hi_n} clients / {lo_n} clients",
             lambda r: r[("contended", hi_n)]["p50_us"] / r[("contended", lo_n)]["p50_us"], 1.3)
    show(by_round, "many keys, one client shared by 16 threads / raw 16 threads with a connection each (pairs/s)",
         lambda r: r[("many-keys", 1, 16)]["ops_per_s"] / r["raw-many-keys"]["ops_per_s"], 1.5, upper=False)
    print("per acquire + release pair (medians over the rounds; distlock / raw):")
    for label, d, w in pairs:
        def med(key, field):
            return statistics.median(r[key][field] for _, r in sorted(by_round.items()))
        try:
            cs = lambda key: med(key, "vcsw_per_pair") + med(key, "ivcsw_per_pair")
            print(f"  {label}: client CPU {med(d, 'cpu_us_per_pair'):.1f} / {med(w, 'cpu_us_per_pair'):.1f} us, "
                  f"server CPU {med(d, 'server_cpu_us_per_pair'):.1f} / {med(w, 'server_cpu_us_per_pair'):.1f} us, "
                  f"server command time {med(d, 'server_cmd_us_per_pair'):.1f} / {med(w, 'server_cmd_us_per_pair'):.1f} us, "
                  f"client context switches {cs(d):.2f} / {cs(w):.2f}")
        except (KeyError, statistics.StatisticsError):
            print(f"  {label}: not measured")
        show(by_round, f"    {label}, client CPU per pair / raw",
             lambda r: r[d]["cpu_us_per_pair"] / r[w]["cpu_us_per_pair"], 1.5)
        show(by_round, f"    {label}, server CPU per pair / raw",
             lambda r: r[d]["server_cpu_us_per_pair"] / r[w]["server_cpu_us_per_pair"], 2)
        show(by_round, f"    {label}, server command time per pair / raw",
             lambda r: r[d]["server_cmd_us_per_pair"] / r[w]["server_cmd_us_per_pair"], 2)
print()
first = runs[next(iter(runs))]
last = first[max(first)]
ren = rows["renew"]
r3 = ren["round_trips_per_call"]
print(f"(one raw round trip, PING: p50 {last['raw-ping']['p50_us']} us in the last round of the first pinning)")
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
