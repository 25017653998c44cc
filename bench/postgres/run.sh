#!/bin/sh
# Uncontended postgres:// lock+unlock beside a raw libpq pg_advisory_lock/unlock loop,
# in one run against one PostgreSQL started here on a free loopback port in a
# temporary directory (as the "postgres" user when run as root), the server pinned to
# CPU 0 and the client to CPU 1. Usage: bench/postgres/run.sh BUILD_DIR [--ops N]
set -eu
build=${1:?usage: run.sh BUILD_DIR [bench options]}
shift
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
dir=$(mktemp -d /tmp/distlock-pg-bench-XXXXXX)
as=""
if [ "$(id -u)" -eq 0 ]; then
  chown postgres "$dir"
  as="setpriv --reuid=postgres --regid=postgres --init-groups --"
fi
echo bench > "$dir/pw"
[ -z "$as" ] || chown postgres "$dir/pw"
$as "$bin/initdb" -D "$dir/data" -U bench --auth=scram-sha-256 --pwfile="$dir/pw" --no-sync --no-instructions >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
taskset -c 0 $as "$bin/postgres" -D "$dir/data" -p "$port" -k "$dir" -c listen_addresses=127.0.0.1 \
  >"$dir/server.log" 2>&1 &
pid=$!
trap 'kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 300); do
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" && break
  sleep 0.1
done
taskset -c 1 "$build/bench/postgres/distlock-bench-postgres" --url "postgres://bench:bench@127.0.0.1:$port/postgres" "$@"
