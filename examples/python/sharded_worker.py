#!/usr/bin/env python3
"""sharded_worker — one member of a shard group: many machines run one job, each shard on one.

    sharded_worker.py [--url URL] [--job JOB] [--shards M] [--member-id ID] [--ttl SECONDS]
                      [--period SECONDS]

Joins the group JOB of M shards and prints one JSON line each time what it owns changes:

    {"member": "w1", "version": 3, "members": 2, "shards": {"0": 17, "2": 18}}

(shard index -> the shard's fencing token: pass it to every write the shard makes). A shard it
gives up or loses has its `stopped` event set before anyone else can own it. Runs until stdin
is closed (or a line is read), then leaves the group at once (its shards go to the others) and
prints {"left": "w1"}.

--url defaults to $DISTLOCK_URL, else the host-local file:// directory.
"""

import argparse
import json
import sys
import threading

import distlock


def report(member: distlock.ShardGroup) -> None:
    """Prints each assignment as it changes, until the member leaves."""
    version = 0
    while True:
        try:
            now = member.wait_change(after_version=version)  # no limit, no polling
        except distlock.NotOwner:
            return
        version = now.version
        # Each shard's work would start here, checking shard.stopped and writing with
        # shard.token; this worker only reports what it owns.
        print(json.dumps({"member": member.member_id, "version": now.version,
                          "members": now.members,
                          "shards": {str(i): s.token for i, s in now.items()}}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None)
    ap.add_argument("--job", default="reindex")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--member-id", default=None)
    ap.add_argument("--ttl", type=float, default=10.0)
    ap.add_argument("--period", type=float, default=1.0)
    args = ap.parse_args()

    with distlock.connect(args.url) as client:
        with client.shard_group(args.job, args.shards, ttl=args.ttl, rebalance_period=args.period,
                                member_id=args.member_id) as member:
            reporter = threading.Thread(target=report, args=(member,))
            reporter.start()
            sys.stdin.readline()  # a line or the end of stdin: leave
            member.leave()        # the reporter's wait then raises NotOwner
            reporter.join()
        print(json.dumps({"left": member.member_id}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
