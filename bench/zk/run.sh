#!/usr/bin/env bash
# Uncontended acquire+release on one ZooKeeper server, same run, same CPU pinning:
#   distlock zk://  (distlock-bench --workload uncontended, and contended handoff)
#   raw C client    (create ephemeral-sequential + delete: the two-round-trip floor)
#   Curator         (InterProcessMutex, compiled here with javac against Debian's jars)
#   kazoo           (Lock recipe, Debian's python3-kazoo)
# The server runs pinned to CPU $SERVER_CPU, every client to CPU $CLIENT_CPU. Prints the
# JSON lines, then the p50 ratios. A measurement: it asserts nothing.
#
# Usage: [ROUNDS=3] bench/zk/run.sh [BUILD_DIR] [OPS]   (BUILD_DIR: a build with the zk
#        component and -DDISTLOCK_BUILD_EXAMPLES=ON, containing distlock-bench)
set -euo pipefail

BUILD=${1:-build}
OPS=${2:-5000}
WARMUP=${WARMUP:-1000}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=$(find "$BUILD" -name distlock-bench -type f -perm -u+x | head -1)
[ -n "$BENCH" ] || { echo "run.sh: build distlock-bench in $BUILD first (cmake --build $BUILD --target distlock-bench)" >&2; exit 1; }
for f in /usr/share/java/zookeeper.jar /usr/share/java/curator-recipes.jar; do
  [ -r "$f" ] || { echo "run.sh: $f missing (apt-get install zookeeper libcurator-recipes-java)" >&2; exit 1; }
done
/usr/bin/python3 -c 'import kazoo' 2>/dev/null || { echo "run.sh: python3-kazoo missing" >&2; exit 1; }

WORK=$(mktemp -d /tmp/distlock-zkbench.XXXXXX)
# The raw C-client baseline: the CMake target distlock-bench-raw-zk (bench/zk/CMakeLists.txt)
# if the build has it, else compiled here.
RAW=$(find "$BUILD" -name distlock-bench-raw-zk -type f -perm -u+x | head -1)
if [ -z "$RAW" ]; then
  RAW="$WORK/distlock-bench-raw-zk"
  g++ -O2 -std=c++20 -DTHREADED "$HERE/raw_zk_bench.cpp" -o "$RAW" -lzookeeper_mt -lpthread
fi
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$WORK/data"
cat > "$WORK/zoo.cfg" <<CFG
tickTime=2000
dataDir=$WORK/data
clientPort=$PORT
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=srvr
maxClientCnxns=0
# Client-side comparison: take the disk fsync (identical for every client) out of the figures.
forceSync=no
CFG
taskset -c "$SERVER_CPU" java -Xms256m -Xmx512m -cp /usr/share/java/zookeeper.jar:/usr/share/java/slf4j-nop.jar \
  org.apache.zookeeper.server.ZooKeeperServerMain "$WORK/zoo.cfg" > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 200); do
  if { exec 3<>"/dev/tcp/127.0.0.1/$PORT"; } 2>/dev/null; then
    echo srvr >&3; if timeout 1 cat <&3 | grep -q Mode; then exec 3>&-; break; fi; exec 3>&-
  fi
  sleep 0.1
done
HOSTS="127.0.0.1:$PORT"

CP=/usr/share/java/curator-recipes.jar:/usr/share/java/curator-framework.jar:/usr/share/java/curator-client.jar
CP=$CP:/usr/share/java/zookeeper.jar:/usr/share/java/zookeeper-jute.jar:/usr/share/java/guava.jar
CP=$CP:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-nop.jar
javac -d "$WORK/classes" -cp "$CP" "$HERE/CuratorBench.java"

pin() { taskset -c "$CLIENT_CPU" "$@"; }
# The machine is shared and noisy: ROUNDS interleaved rounds, the median p50 per
# implementation is what the ratios use.
ROUNDS=${ROUNDS:-3}
for round in $(seq "$ROUNDS"); do
  pin "$BENCH" --url "zk://$HOSTS?session_timeout=10s" --workload uncontended --ops "$OPS" --warmup "$WARMUP" --ttl-ms 10000 | sed "s/^{/{\"impl\":\"distlock\",\"round\":$round,/"
  pin "$RAW" --hosts "$HOSTS" --ops "$OPS" --warmup "$WARMUP" | sed "s/^{/{\"round\":$round,/"
  pin java -cp "$WORK/classes:$CP" CuratorBench --hosts "$HOSTS" --ops "$OPS" --warmup "$WARMUP" | sed "s/^{/{\"round\":$round,/"
  pin /usr/bin/python3 "$HERE/kazoo_bench.py" --hosts "$HOSTS" --ops "$OPS" --warmup "$WARMUP" | sed "s/^{/{\"round\":$round,/"
done | tee "$WORK/results.jsonl"
pin "$BENCH" --url "zk://$HOSTS?session_timeout=10s" --workload contended --clients 4 --ops "$((OPS / 5))" --warmup 100 --ttl-ms 10000 | sed 's/^{/{"impl":"distlock",/'

/usr/bin/python3 - "$WORK/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
p50 = {}
for r in rows:
    p50.setdefault(r["impl"], []).append(r["p50_us"])
med = {k: statistics.median(v) for k, v in p50.items()}
for impl, v in med.items():
    print(json.dumps({"impl": impl, "median_p50_us": round(v, 1), "rounds": len(p50[impl])}))
base = med.get("distlock")
for impl, v in med.items():
    if impl != "distlock" and base:
        print(json.dumps({"ratio": f"distlock/{impl}", "median_p50": round(base / v, 3)}))
PY
