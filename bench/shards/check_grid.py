#!/usr/bin/env python3
"""Checks the JSON lines of `distlock-shard-bench --quick` (read on stdin): the grid is complete,
every line has its figures, and the invariants hold in every round: every shard owned by exactly
one live member at the end, balanced, no phase timed out, and on the backends whose server is
probed (redis, etcd, zk) the keys/znodes a group added are at most KEYS_PER * (M + W) + KEYS_FIXED.

usage: check_grid.py BACKEND[,BACKEND...] W[,W...] M[,M...] < lines
"""
import json
import sys

KEYS_PER = 3     # per shard: its lock record, its token counter, one spare (zk: the lock's parent)
KEYS_FIXED = 8   # per group: the job's parent records (zk: /distlock/<job>..., etcd/redis: none)
PROBED = {"redis", "etcd", "zk"}


def fail(msg):
    print("check_grid: " + msg, file=sys.stderr)
    sys.exit(1)


def number(line, key):
    v = line.get(key)
    if isinstance(v, dict):
        v = v.get("median")
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        fail(f"{line['backend']} W={line['members']} M={line['shards']}: {key} is not a number: {v!r}")
    return v


def main():
    backends = sys.argv[1].split(",")
    ws = [int(x) for x in sys.argv[2].split(",")]
    ms = [int(x) for x in sys.argv[3].split(",")]
    lines = [json.loads(l) for l in sys.stdin.read().splitlines() if l.strip()]
    for l in lines:
        print(json.dumps({k: v for k, v in l.items() if k != "per_round"}))
    want = {(b, w, m) for b in backends for w in ws for m in ms}
    got = {(l["backend"], l["members"], l["shards"]) for l in lines}
    if got != want or len(lines) != len(want):
        fail(f"grid cells {sorted(got)} (and {len(lines)} lines), expected {sorted(want)}")
    for l in lines:
        cell = f"{l['backend']} W={l['members']} M={l['shards']}"
        if "skipped" in l:
            fail(f"{cell}: skipped: {l['skipped']}")
        if l["timeouts"] != 0:
            fail(f"{cell}: {l['timeouts']} phases timed out")
        if l["final_owned_once"] is not True:
            fail(f"{cell}: not every shard owned by exactly one live member at the end")
        w, m = l["members"], l["shards"]
        for key in ("join_ms", "kill_ms", "max_unowned_ms", "moved_shards_join", "moved_shards_kill"):
            number(l, key)
        if (w >= 3) != ("leave_ms" in l):
            fail(f"{cell}: leave_ms is measured with W >= 3 only")
        if w >= 3:
            number(l, "leave_ms")
        rounds = l["per_round"]
        if len(rounds) != l["rounds"]:
            fail(f"{cell}: {len(rounds)} rounds reported, {l['rounds']} run")
        for i, r in enumerate(rounds):
            if "error" in r:
                fail(f"{cell} round {i}: {r['error']}")
            if r.get("final_owned_once") is not True or r.get("final_balanced") is not True:
                fail(f"{cell} round {i}: the end state is not every shard owned once, balanced: {r}")
            if r["moved_shards_join"] not in (m // w, -(-m // w)):
                fail(f"{cell} round {i}: the joiner owns {r['moved_shards_join']} shards, not floor/ceil of M/W")
            if l["backend"] in PROBED:
                keys = r.get("server_keys")
                if not isinstance(keys, int):
                    fail(f"{cell} round {i}: server_keys missing: {r}")
                bound = KEYS_PER * (m + w) + KEYS_FIXED
                if not 0 < keys <= bound:
                    fail(f"{cell} round {i}: {keys} server keys after balance, bound {bound} = "
                         f"{KEYS_PER}*(M+W)+{KEYS_FIXED}")
                for key in ("steady_ops_per_s", "join_ops_per_moved_shard"):
                    if not isinstance(r.get(key), (int, float)):
                        fail(f"{cell} round {i}: {key} missing: {r}")
                if r["steady_ops_per_s"] <= 0:
                    fail(f"{cell} round {i}: the balanced members cost the server nothing? {r}")
    print(f"check_grid: {len(lines)} cells ok")


main()
