#!/usr/bin/env bash
# Checks the Redis direct hand-off model (model/redis_handoff.pml) exhaustively with
# spin at a bound that finishes in under a minute on 2 cores: 2 clients, time up to
# 3 ticks (TTL 3), 2 queue entries per client. Prints spin's summary; fails on any
# assertion violation or if the search did not complete.
# Usage: scripts/check_model.sh [WORKDIR] [N] [TMAX]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
n="${2:-2}"
tmax="${3:-3}"
mkdir -p "$work"
cd "$work"
spin -DN="$n" -DTMAX="$tmax" -a "$here/model/redis_handoff.pml" >/dev/null
gcc -O2 -DSAFETY -DCOLLAPSE -w -o pan pan.c
./pan -m1000000 -E >pan.out 2>&1 || true
grep -aE "State-vector|states, stored|elapsed|errors:|violated" pan.out
grep -aq "errors: 0" pan.out
# A search cut short by the depth limit is not a proof.
if grep -aq "max search depth too small" pan.out; then echo "search depth too small" >&2; exit 1; fi
echo "model: N=$n TMAX=$tmax: no violation in the complete search"
