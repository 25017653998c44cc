#!/bin/sh
# Uncontended mysql:// lock+unlock beside a raw libmariadb GET_LOCK/RELEASE_LOCK loop, in
# one run against one MariaDB started here on a free loopback port in a temporary
# directory (default durability: innodb_flush_log_at_trx_commit = 1), the server pinned
# to CPU 0 and the client to CPU 1. Usage: bench/mysql/run.sh BUILD_DIR [--ops N]
set -eu
build=${1:?usage: run.sh BUILD_DIR [bench options]}
shift
dir=$(mktemp -d /tmp/distlock-my-bench-XXXXXX)
user=""
if [ "$(id -u)" -eq 0 ]; then user="--user=root"; fi
mariadb-install-db --no-defaults --datadir="$dir/data" $user --auth-root-authentication-method=normal \
  --skip-test-db --skip-name-resolve >"$dir/install.log" 2>&1
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
taskset -c 0 mariadbd --no-defaults --datadir="$dir/data" --socket="$dir/s" --port="$port" \
  --bind-address=127.0.0.1 --skip-name-resolve --skip-log-bin $user --log-error="$dir/server.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 300); do
  mariadb-admin --no-defaults -uroot --socket="$dir/s" ping >/dev/null 2>&1 && break
  sleep 0.1
done
mariadb --no-defaults -uroot --socket="$dir/s" -e \
  "CREATE USER 'bench'@'127.0.0.1' IDENTIFIED BY 'bench'; GRANT ALL ON *.* TO 'bench'@'127.0.0.1'; CREATE DATABASE bench"
taskset -c 1 "$build/bench/mysql/distlock-bench-mysql" --url "mysql://bench:bench@127.0.0.1:$port/bench" "$@"
