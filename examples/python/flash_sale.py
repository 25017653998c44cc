#!/usr/bin/env python3
"""flash_sale — a flash sale whose stock is protected by a distlock lock, in Python.

    flash_sale.py --url redis://127.0.0.1:6379 [--stock 100] [--requests 150]
                  [--processes 4] [--threads 4] [--think-ms 2] [--no-lock]

`--requests` purchases come from `--processes` OS processes (this script, re-run as a buyer)
x `--threads` threads. A purchase is a plain, non-atomic read-modify-write of the stock, kept in
the Redis server of --url (keys `flashsale:<run>:*`):

    lock -> GET stock -> think (--think-ms) -> fenced write of stock - 1 + the buyer's record -> unlock

The read and the write are separate commands: only the lock keeps two buyers from reading the
same stock and both selling the item; the think pause is the time a real service spends between
them. Every stock write is fenced: a Lua script applies it only if the lease's token is at least
the highest token that has written (a buyer paused past its lease cannot overwrite a newer
holder's write); rejected writes are counted (`fence_rejected`).

At the end the books are checked: sold + left == stock (an item sold twice breaks it), no buyer
recorded twice, nothing sold beyond the stock. It prints a summary and, last, one JSON line, and
exits 1 on any violation. `--no-lock` buys without lock or fence: with two or more buyers it
oversells, and the check catches it.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import redis

import distlock

# KEYS: stock, fence, sold. ARGV: token (-1: no fence), new stock, buyer.
FENCED_WRITE = """
local token = tonumber(ARGV[1])
if token >= 0 then
  local last = tonumber(redis.call('GET', KEYS[2]) or '-1')
  if token < last then return 0 end
  redis.call('SET', KEYS[2], token)
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[3])
return 1
"""


def redis_of(url: str) -> redis.Redis:
    parsed = redis.connection.parse_url(url.split("?")[0])
    return redis.Redis(host=parsed.get("host", "127.0.0.1"), port=parsed.get("port", 6379),
                       password=parsed.get("password"), username=parsed.get("username"),
                       db=parsed.get("db", 0))


def keys(run: str):
    base = f"flashsale:{run}:"
    return base + "stock", base + "fence", base + "sold", base + "stats"


def buyer(args) -> int:
    """One buyer process: --threads threads share --requests purchases."""
    r = redis_of(args.url)
    stock_key, fence_key, sold_key, stats_key = keys(args.run)
    write = r.register_script(FENCED_WRITE)
    errors = []

    def purchase(client, n: int) -> None:
        me = f"{os.getpid()}-{threading.get_ident()}-{n}"
        if client is None:  # --no-lock: the race the lock is for
            left = int(r.get(stock_key))
            if left > 0:
                time.sleep(args.think_ms / 1000)
                write(keys=[stock_key, fence_key, sold_key], args=[-1, left - 1, me])
            return
        with client.lock("flashsale/" + args.run, ttl=10.0, wait=60.0) as lease:
            left = int(r.get(stock_key))
            if left <= 0:
                r.hincrby(stats_key, "sold_out", 1)
                return
            time.sleep(args.think_ms / 1000)
            if lease.lost.is_set():
                r.hincrby(stats_key, "lost", 1)
                return
            if not write(keys=[stock_key, fence_key, sold_key], args=[lease.token, left - 1, me]):
                r.hincrby(stats_key, "fence_rejected", 1)

    def run(client, count: int) -> None:
        try:
            for n in range(count):
                purchase(client, n)
        except Exception as e:  # reported through the exit status
            errors.append(repr(e))

    client = None if args.no_lock else distlock.connect(args.url)
    counts = [args.requests // args.threads + (1 if t < args.requests % args.threads else 0)
              for t in range(args.threads)]
    threads = [threading.Thread(target=run, args=(client, c)) for c in counts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if client is not None:
        client.close()
    for e in errors:
        print("buyer error:", e, file=sys.stderr)
    return 1 if errors else 0


def sale(args) -> int:
    r = redis_of(args.url)
    args.run = uuid.uuid4().hex[:12]
    stock_key, fence_key, sold_key, stats_key = keys(args.run)
    r.set(stock_key, args.stock)
    per_process = [args.requests // args.processes + (1 if p < args.requests % args.processes else 0)
                   for p in range(args.processes)]
    argv = [sys.executable, os.path.abspath(__file__), "--url", args.url, "--run", args.run,
            "--threads", str(args.threads), "--think-ms", str(args.think_ms), "--buyer"]
    if args.no_lock:
        argv.append("--no-lock")
    start = time.monotonic()
    procs = [subprocess.Popen(argv + ["--requests", str(n)]) for n in per_process]
    failed = sum(1 for p in procs if p.wait() != 0)
    seconds = time.monotonic() - start

    left = int(r.get(stock_key))
    buyers = [b.decode() for b in r.lrange(sold_key, 0, -1)]
    stats = {k.decode(): int(v) for k, v in r.hgetall(stats_key).items()}
    sold = len(buyers)
    violations = []
    if sold + left != args.stock:
        violations.append(f"sold {sold} + left {left} != stock {args.stock} (items sold twice)")
    if len(set(buyers)) != sold:
        violations.append("a buyer was recorded twice")
    if sold > args.stock or left < 0:
        violations.append(f"sold {sold} beyond the stock {args.stock}")
    if failed:
        violations.append(f"{failed} buyer processes failed")
    for k in (stock_key, fence_key, sold_key, stats_key):
        r.delete(k)
    print(f"flash sale: stock {args.stock}, {args.requests} requests from {args.processes} processes x "
          f"{args.threads} threads, {'no lock' if args.no_lock else 'locked + fenced'}: sold {sold}, "
          f"left {left}, {seconds:.2f}s")
    for v in violations:
        print("VIOLATION:", v)
    print(json.dumps({"stock": args.stock, "requests": args.requests, "sold": sold, "left": left,
                      "fence_rejected": stats.get("fence_rejected", 0), "lost": stats.get("lost", 0),
                      "no_lock": args.no_lock, "violations": violations, "seconds": round(seconds, 3)}))
    return 1 if violations else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="redis:// URL: the lock and the stock")
    ap.add_argument("--stock", type=int, default=100)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--think-ms", type=float, default=2.0)
    ap.add_argument("--no-lock", action="store_true", help="no lock and no fence (oversells)")
    ap.add_argument("--buyer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.url.startswith("redis://"):
        ap.error("--url must be a redis:// URL (the stock lives in that Redis server)")
    if min(args.stock, args.requests, args.processes, args.threads) < 1:
        ap.error("--stock, --requests, --processes and --threads must be at least 1")
    return buyer(args) if args.buyer else sale(args)


if __name__ == "__main__":
    sys.exit(main())
