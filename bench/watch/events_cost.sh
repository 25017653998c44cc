#!/usr/bin/env bash
# The cost of the watch events on redis:// (docs/benchmarks.md "Watch events"): uncontended
# acquire + release (`distlock bench --workload uncontended`) of a BEFORE build (without the
# events) and an AFTER build, the latter with nobody watching and with one `distlock watch`
# consuming the events, in ROUNDS interleaved rounds against one redis-server it starts on a free
# loopback port (stopped by pid on exit). After each run it prints the server's INFO commandstats
# lines of EVALSHA, PUBLISH and EXISTS (reset before each run: CONFIG RESETSTAT).
# Usage: bench/watch/events_cost.sh BEFORE_DISTLOCK AFTER_DISTLOCK [ROUNDS (4)] [OPS (20000)]
set -u
main=$1; new=$2
rounds=${3:-4}; ops=${4:-20000}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d /tmp/distlock-events-cost.XXXXXX)
redis-server --port $port --bind 127.0.0.1 --save '' --appendonly no --dir $dir --daemonize no >$dir/log 2>&1 &
rpid=$!
trap 'kill $rpid; wait $rpid 2>/dev/null; rm -rf $dir' EXIT
for i in $(seq 50); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.1; done
url=redis://127.0.0.1:$port
one() { # label binary
  redis-cli -p $port config resetstat >/dev/null
  local j; j=$("$2" bench --url $url --workload uncontended --ops $ops 2>/dev/null | tail -1)
  local es; es=$(redis-cli -p $port info commandstats | tr -d '\r' | grep -E '^cmdstat_(evalsha|publish|exists):')
  echo "$1 $j"; echo "$es" | sed "s/^/$1 /"
}
for r in $(seq $rounds); do
  one before $main
  one after-unwatched $new
  "$new" watch --url $url bench >/dev/null 2>&1 &
  wpid=$!
  for i in $(seq 100); do [ "$(redis-cli -p $port exists distlock:watching)" = 1 ] && break; sleep 0.05; done
  one after-watched $new
  kill $wpid; wait $wpid 2>/dev/null
  redis-cli -p $port del distlock:watching >/dev/null
done
