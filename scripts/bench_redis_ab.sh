#!/usr/bin/env bash
# Compares two builds of libdistlock on the uncontended redis:// workload, beside the raw
# hiredis lock, in interleaved rounds on one redis-server, everything pinned to one CPU.
# Per acquire + release pair it prints, for raw, A and B:
#   p50 latency; client CPU (getrusage of the bench process); server CPU (INFO cpu of
#   redis-server); commands (INFO commandstats calls, the commands scripts run included);
#   client context switches.
# Each round runs raw, A, B in that order (B, A in even rounds), so a noisy spell on this
# shared machine hits both sides; the summary gives the median and range over the rounds
# and the load average of each round. Measurements only: nothing fails on a slow figure.
#
# Usage: ./scripts/bench_redis_ab.sh DIR_A DIR_B
#   DIR_x holds distlock-bench, distlock-bench-raw-redis and libdistlock.so.0 (copied from
#   a Release build's bench/ and src/); each bench runs with LD_LIBRARY_PATH=DIR_x.
# Env: OPS (20000), ROUNDS (3), CPU (0).
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1
b=$2
ops=${OPS:-20000}
rounds=${ROUNDS:-3}
cpu=${CPU:-0}
for tool in redis-server redis-cli taskset python3; do
  command -v "$tool" >/dev/null || { echo "bench_redis_ab.sh: $tool is missing" >&2; exit 1; }
done
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d /tmp/distlock-bench-ab.XXXXXX)
redis_pid=""
cleanup() {
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM
taskset -c "$cpu" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$dir" --logfile "$dir/redis.log" &
redis_pid=$!
for _ in $(seq 1 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.05
done
redis-cli -p "$port" ping >/dev/null || { echo "bench_redis_ab.sh: redis-server did not start" >&2; exit 1; }
counters() {
  redis-cli -p "$port" info all | python3 -c '
import re, sys
calls, cpu = 0, 0.0
for line in sys.stdin:
    m = re.match(r"cmdstat_[^:]+:calls=(\d+),", line)
    if m: calls += int(m.group(1))
    m = re.match(r"used_cpu_(user|sys):([0-9.]+)", line)
    if m: cpu += float(m.group(2))
print(calls, round(cpu * 1e6))'
}
out="$dir/runs.jsonl"
one() {  # one NAME ROUND LIBDIR CMD...
  local name=$1 round=$2 lib=$3 before after
  shift 3
  before=$(counters)
  LD_LIBRARY_PATH="$lib" taskset -c "$cpu" "$@" >"$dir/one.jsonl"
  after=$(counters)
  python3 - "$dir/one.jsonl" "$name" "$round" "$(cut -d' ' -f1 /proc/loadavg)" $before $after <<'PY' >>"$out"
import json, sys
path, name, rnd, load = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
c0, p0, c1, p1 = map(int, sys.argv[5:9])
for line in open(path):
    if line.startswith("{") and '"pairs"' in line:
        j = json.loads(line)
        n = j["pairs"]
        print(json.dumps({"name": name, "round": rnd, "loadavg": load, "p50_us": j["p50_us"],
                          "cpu_us_per_pair": j["cpu_us_per_pair"],
                          "server_cpu_us_per_pair": round((p1 - p0) / n, 2),
                          "commands_per_pair": round((c1 - c0) / n, 2),
                          "csw_per_pair": j["vcsw_per_pair"] + j["ivcsw_per_pair"]}))
PY
}
url="redis://127.0.0.1:$port"
echo "# redis-server pid $redis_pid on CPU $cpu, clients on CPU $cpu; A=$a B=$b; OPS=$ops" >&2
for round in $(seq 1 "$rounds"); do
  echo "# round $round of $rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  one raw "$round" "$a" "$a/distlock-bench-raw-redis" --port "$port" --ops "$ops" --workload raw-lock
  if [ $((round % 2)) -eq 1 ]; then order="A B"; else order="B A"; fi
  for side in $order; do
    if [ "$side" = A ]; then d=$a; else d=$b; fi
    one "$side" "$round" "$d" "$d/distlock-bench" --url "$url" --workload uncontended --ops "$ops"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("loadavg per round: " + ", ".join(f"{r['loadavg']:.2f}" for r in rows if r["name"] == "raw"))
fields = ["p50_us", "cpu_us_per_pair", "server_cpu_us_per_pair", "commands_per_pair", "csw_per_pair"]
def summary(name, f):
    v = [r[f] for r in rows if r["name"] == name]
    return statistics.median(v), min(v), max(v)
print("| run | " + " | ".join(fields) + " |")
for name in ["raw", "A", "B"]:
    cells = []
    for f in fields:
        med, lo, hi = summary(name, f)
        cells.append(f"{med:.2f} ({lo:.2f}-{hi:.2f})")
    print(f"| {name} | " + " | ".join(cells) + " |")
for name in ["A", "B"]:
    print(f"{name} / raw (medians): " + ", ".join(
        f"{f} {summary(name, f)[0] / summary('raw', f)[0]:.2f}x" for f in fields))
PY
