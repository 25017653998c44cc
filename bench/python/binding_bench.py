#!/usr/bin/python3
"""Cost of the Python binding: uncontended acquire + release on redis:// through the C++ call,
through distlock's Python package and through redis-py's Lock (Debian's python3-redis), on the
same server, in interleaved rounds. Prints one JSON line per round and workload, then a summary
line with the p50 ratios (medians over the rounds). The binding's own cost is also measured
without a network, on the in-process memory:// backend (the same two calls). A measurement, not a
test.

    PYTHONPATH=<build>/bindings/python bench/python/binding_bench.py [--url redis://...] [--ops N] [--rounds R]

Without --url it starts its own redis-server on a free loopback port (stopped by pid on exit).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time

import redis

import distlock
from distlock import _distlock


def pct(lat_ns, p):
    return round(lat_ns[int(p * (len(lat_ns) - 1))] / 1e3, 1)


def summary(workload, impl, url, lat_ns, seconds):
    lat_ns = sorted(lat_ns)
    return {"workload": workload, "binding": None, "impl": impl, "url": url, "ops": len(lat_ns),
            "ops_per_s": round(len(lat_ns) / seconds, 1), "p50_us": pct(lat_ns, 0.50),
            "p99_us": pct(lat_ns, 0.99), "p999_us": pct(lat_ns, 0.999)}


def run_cpp(client, url, ops):
    t0 = time.perf_counter()
    lat = _distlock._bench_cpp_acquire_release(client._impl, "bench/py/cpp", ops, False)
    return summary("uncontended", "c++ Client::acquire + Lease::release", url, lat, time.perf_counter() - t0)


def run_python(client, url, ops):
    lat = []
    t0 = time.perf_counter()
    for _ in range(ops):
        a = time.perf_counter_ns()
        with client.lock("bench/py/python"):
            pass
        lat.append(time.perf_counter_ns() - a)
    return summary("uncontended", "python: with client.lock(name)", url, lat, time.perf_counter() - t0)


def run_redis_py(r, url, ops):
    lock = r.lock("bench/py/redis-py", timeout=30, blocking=False)
    lat = []
    t0 = time.perf_counter()
    for _ in range(ops):
        a = time.perf_counter_ns()
        if not lock.acquire():
            raise SystemExit("redis-py lock: found the lock held")
        lock.release()
        lat.append(time.perf_counter_ns() - a)
    return summary("uncontended", "redis-py Lock " + redis.__version__, url, lat, time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--ops", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    server = None
    workdir = None
    url = args.url
    if url is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        workdir = tempfile.mkdtemp(prefix="distlock-pybench-")
        server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
                                   "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}"
    try:
        host, port = url[len("redis://"):].split("/")[0].split("?")[0].rsplit(":", 1)
        r = redis.Redis(host=host, port=int(port))
        end = time.monotonic() + 10
        while True:
            try:
                r.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.02)
        results = {"cpp": [], "python": [], "redis-py": []}
        with distlock.connect(url) as client:
            for name, fn, arg in (("cpp", run_cpp, client), ("python", run_python, client),
                                  ("redis-py", run_redis_py, r)):
                fn(arg, url, max(args.ops // 10, 100))  # warm-up
            for rnd in range(args.rounds):
                for name, fn, arg in (("cpp", run_cpp, client), ("python", run_python, client),
                                      ("redis-py", run_redis_py, r)):
                    line = fn(arg, url, args.ops)
                    line["binding"] = {"cpp": "cpp-in-python"}.get(name, name)
                    line["round"] = rnd + 1
                    results[name].append(line)
                    print(json.dumps(line), flush=True)
        # The binding's own cost, without a network: the in-process memory:// backend.
        with distlock.connect("memory://binding-bench") as mem:
            for rnd in range(args.rounds):
                for name, fn in (("memory-cpp", run_cpp), ("memory-python", run_python)):
                    line = fn(mem, "memory://binding-bench", args.ops * 4)
                    line["binding"] = name
                    line["round"] = rnd + 1
                    results.setdefault(name, []).append(line)
                    print(json.dumps(line), flush=True)
        med = {k: statistics.median(x["p50_us"] for x in v) for k, v in results.items()}
        print(json.dumps({"summary": "uncontended p50 (median of rounds)", "url": url, "ops": args.ops,
                          "rounds": args.rounds, "cpp_p50_us": med["cpp"], "python_p50_us": med["python"],
                          "redis_py_p50_us": med["redis-py"],
                          "python_over_cpp": round(med["python"] / med["cpp"], 3),
                          "binding_cost_us": round(med["memory-python"] - med["memory-cpp"], 2),
                          "binding_cost_over_cpp_redis": round((med["memory-python"] - med["memory-cpp"]) / med["cpp"], 3),
                          "python_over_redis_py": round(med["python"] / med["redis-py"], 3)}))
    finally:
        if server is not None:
            os.kill(server.pid, signal.SIGTERM)
            server.wait(10)
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
