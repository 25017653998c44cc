#!/usr/bin/env python3
"""acquire_with_timeout — the classic "acquire a lock with a timeout" in Python, on distlock.

    acquire_with_timeout.py [--url URL] [--name NAME] [--wait SECONDS] [--ttl SECONDS] [--hold SECONDS]

Waits up to --wait seconds for the lock NAME (a FIFO wait, woken by the release: no polling),
holds it for --hold seconds of "work" while the lease is renewed in the background, and
releases it. The work checks `lease.lost` and passes the fencing token on, which the posts'
SET NX PX + sleep-and-retry loop could not do. Prints one line:

    acquired NAME token=T waited=0.123s        (exit 0)
    busy NAME: <why> after 0.500s              (exit 3, the wait ran out)
    lost NAME: <why>                           (exit 4, the lease was lost during the work)

--url defaults to $DISTLOCK_URL, else the host-local file:// directory.
"""

import argparse
import sys
import time

import distlock


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None)
    ap.add_argument("--name", default="reports/nightly")
    ap.add_argument("--wait", type=float, default=10.0)
    ap.add_argument("--ttl", type=float, default=10.0)
    ap.add_argument("--hold", type=float, default=0.0)
    args = ap.parse_args()

    with distlock.connect(args.url) as client:
        start = time.monotonic()
        try:
            lease = client.lock(args.name, ttl=args.ttl, wait=args.wait)
        except distlock.Busy as e:
            print(f"busy {args.name}: {e} after {time.monotonic() - start:.3f}s", flush=True)
            return 3
        token = lease.token if lease.has_token else None
        print(f"acquired {args.name} token={token} waited={time.monotonic() - start:.3f}s", flush=True)
        # The work: stop as soon as the lease is lost (lost.wait returns True then).
        lost = lease.lost.wait(args.hold)
        try:
            lease.release()
        except distlock.Lost:
            lost = True
        if lost:
            print(f"lost {args.name}: {lease.loss_detail}", flush=True)
            return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
