#!/usr/bin/python3
"""redis-py's Lock (Debian's python3-redis), uncontended acquire + release, beside
distlock's redis:// backend. Run by scripts/bench_redis.sh with PEERS=1. Prints one
JSON line. A measurement, not a test.
"""
import argparse
import json
import time

import redis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    args = parser.parse_args()
    r = redis.Redis(host="127.0.0.1", port=args.port)
    lock = r.lock("peerbench:redis-py", timeout=30, blocking=False)
    for _ in range(args.warmup):
        if not lock.acquire():
            raise SystemExit("redis-py lock: found the lock held")
        lock.release()
    lat = []
    t0 = time.perf_counter_ns()
    for _ in range(args.ops):
        a = time.perf_counter_ns()
        if not lock.acquire():
            raise SystemExit("redis-py lock: found the lock held")
        lock.release()
        lat.append(time.perf_counter_ns() - a)
    seconds = (time.perf_counter_ns() - t0) / 1e9
    lat.sort()

    def pct(p: float) -> float:
        return round(lat[int(p * (len(lat) - 1))] / 1e3, 1)

    print(json.dumps({"workload": "peer-uncontended", "impl": "redis-py-lock " + redis.__version__,
                      "url": "redis://127.0.0.1:%d" % args.port, "ops": args.ops,
                      "ops_per_s": round(args.ops / seconds, 1),
                      "p50_us": pct(0.50), "p99_us": pct(0.99), "p999_us": pct(0.999)}))


if __name__ == "__main__":
    main()
