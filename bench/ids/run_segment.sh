#!/bin/sh
# Segment ids (distlock-ids-bench --segment-only) against a PostgreSQL and a MariaDB
# started here on free loopback ports in temporary directories (default durability:
# synchronous_commit = on, innodb_flush_log_at_trx_commit = 1), the servers pinned to
# CPU 1 and the bench to CPU 0; both stopped by pid.
#   bench/ids/run_segment.sh BUILD_DIR [extra distlock-ids-bench flags...]
set -eu
build=${1:?usage: run_segment.sh BUILD_DIR [bench options]}
shift
bench=$(find "$build" -name distlock-ids-bench -type f -perm -u+x | head -n1)
[ -n "$bench" ] || { echo "run_segment.sh: distlock-ids-bench not found under $build" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d /tmp/distlock-seg-bench-XXXXXX)
chmod 755 "$dir"
pg_pid=""; my_pid=""
trap '[ -z "$pg_pid" ] || kill -INT $pg_pid 2>/dev/null; [ -z "$my_pid" ] || kill $my_pid 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

# PostgreSQL (as the "postgres" user when run as root)
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
mkdir "$dir/pg"
as=""
if [ "$(id -u)" -eq 0 ]; then
  chown postgres "$dir/pg"
  as="setpriv --reuid=postgres --regid=postgres --init-groups --"
fi
echo bench > "$dir/pg/pw"
[ -z "$as" ] || chown postgres "$dir/pg/pw"
$as "$bin/initdb" -D "$dir/pg/data" -U bench --auth=scram-sha-256 --pwfile="$dir/pg/pw" --no-sync --no-instructions >/dev/null
pg_port=$(free_port)
taskset -c 1 $as "$bin/postgres" -D "$dir/pg/data" -p "$pg_port" -k "$dir/pg" -c listen_addresses=127.0.0.1 \
  >"$dir/pg/server.log" 2>&1 &
pg_pid=$!

# MariaDB
user=""
if [ "$(id -u)" -eq 0 ]; then user="--user=root"; fi
mariadb-install-db --no-defaults --datadir="$dir/my" $user --auth-root-authentication-method=normal \
  --skip-test-db --skip-name-resolve >"$dir/my-install.log" 2>&1
my_port=$(free_port)
taskset -c 1 mariadbd --no-defaults --datadir="$dir/my" --socket="$dir/my.sock" --port="$my_port" \
  --bind-address=127.0.0.1 --skip-name-resolve --skip-log-bin $user --log-error="$dir/my-server.log" &
my_pid=$!

for _ in $(seq 1 300); do
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$pg_port" && break
  sleep 0.1
done
for _ in $(seq 1 300); do
  mariadb-admin --no-defaults -uroot --socket="$dir/my.sock" ping >/dev/null 2>&1 && break
  sleep 0.1
done
mariadb --no-defaults -uroot --socket="$dir/my.sock" -e \
  "CREATE USER 'bench'@'127.0.0.1' IDENTIFIED BY 'bench'; GRANT ALL ON *.* TO 'bench'@'127.0.0.1'; CREATE DATABASE bench"
taskset -c 0 "$bench" --segment-only --segment-url "postgres://bench:bench@127.0.0.1:$pg_port/postgres" \
  --segment-url "mysql://bench:bench@127.0.0.1:$my_port/bench" "$@"
