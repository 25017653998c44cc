#!/usr/bin/env bash
# Installs the Debian 12 packages distlock needs to build, test and run its demo.
# Idempotent and fast when everything is present (one dpkg-query, no network).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libhiredis-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc golang-etcd-server-dev
  libzookeeper-mt-dev libssl-dev openssl libcurator-recipes-java python3-kazoo
  redis-server redis-sentinel redis-tools etcd-server etcd-client zookeeper default-jre-headless
  libpq-dev postgresql
  libmariadb-dev mariadb-server
  lld clang-format clang-tidy util-linux procps iproute2 python3 python3-prometheus-client spin
  golang-go
  python3-dev pybind11-dev python3-pybind11 python3-pytest python3-redis python3-matplotlib
)

missing=()
while read -r pkg status; do
  [ "$status" = "installed" ] || missing+=("$pkg")
done < <(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${PACKAGES[@]}" 2>/dev/null || true)
# dpkg-query prints nothing for packages it has never seen.
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
done
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u | sed '/^$/d')

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "bootstrap: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian's packaged servers may start themselves; tests start their own on free ports.
for svc in redis-server redis-sentinel etcd zookeeper postgresql mariadb; do
  if command -v systemctl >/dev/null && systemctl is-active --quiet "$svc" 2>/dev/null; then
    $SUDO systemctl stop "$svc" || true
  fi
done
echo "bootstrap: done" >&2
