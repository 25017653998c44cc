#!/usr/bin/env bash
# libdistlock_c's dynamic symbol table holds the C API only: every defined symbol is a
# distlock_* function of include/distlock/distlock.h under the version DISTLOCK_C_0, and every
# function the header declares is there.
# Usage: check_symbols.sh LIBDISTLOCK_C HEADER
set -euo pipefail
lib=${1:?usage: check_symbols.sh LIB HEADER}
header=${2:?usage: check_symbols.sh LIB HEADER}
defined=$(objdump -T "$lib" | awk '$0 !~ /\*UND\*/ && NF >= 7 { print $(NF-1), $NF }' | grep -v '^DISTLOCK_C_0 DISTLOCK_C_0$' | sort)
bad=$(printf '%s\n' "$defined" | awk '$1 != "DISTLOCK_C_0" || $2 !~ /^distlock_/' || true)
if [ -n "$bad" ]; then
  echo "check_symbols: exported symbols outside distlock_*@DISTLOCK_C_0:" >&2
  printf '%s\n' "$bad" >&2
  exit 1
fi
exported=$(printf '%s\n' "$defined" | awk '{ print $2 }' | sort -u)
declared=$(grep -v '#define' "$header" | grep -o 'DISTLOCK_C_API [^(]*(' | sed -E 's/.*[ *](distlock_[a-z0-9_]+)\($/\1/' | sort -u)
missing=$(comm -23 <(printf '%s\n' "$declared") <(printf '%s\n' "$exported"))
if [ -n "$missing" ]; then
  echo "check_symbols: declared in $header but not exported: $missing" >&2
  exit 1
fi
echo "check_symbols: $(printf '%s\n' "$exported" | wc -l) symbols, all distlock_*@DISTLOCK_C_0, every declared one present"
