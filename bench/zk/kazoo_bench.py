#!/usr/bin/python3
"""kazoo's Lock recipe, uncontended acquire + release, beside distlock's zk:// backend.

Run by bench/zk/run.sh (Debian's python3-kazoo). Prints one JSON line. A measurement,
not a test.
"""
import argparse
import json
import logging
import time

from kazoo.client import KazooClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", default="127.0.0.1:2181")
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    zk = KazooClient(hosts=args.hosts, timeout=10.0)
    zk.start()
    lock = zk.Lock("/kazoobench/uncontended", "bench")
    for _ in range(args.warmup):
        lock.acquire()
        lock.release()
    lat = []
    t0 = time.perf_counter_ns()
    for _ in range(args.ops):
        a = time.perf_counter_ns()
        lock.acquire()
        lock.release()
        lat.append(time.perf_counter_ns() - a)
    seconds = (time.perf_counter_ns() - t0) / 1e9
    zk.stop()
    zk.close()
    lat.sort()

    def pct(p: float) -> float:
        return round(lat[int(p * (len(lat) - 1))] / 1e3, 1)

    print(json.dumps({"workload": "uncontended", "impl": "kazoo-lock", "url": "zk://" + args.hosts,
                      "ops": args.ops, "ops_per_s": round(args.ops / seconds, 1),
                      "p50_us": pct(0.50), "p99_us": pct(0.99), "p999_us": pct(0.999)}))


if __name__ == "__main__":
    main()
