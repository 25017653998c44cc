"""One process of the exclusion hammer: THREADS threads each take the lock ROUNDS times and
write a begin and an end line (with the fencing token and a CLOCK_MONOTONIC stamp) to an
O_APPEND log inside the critical section. Usage: hammer_worker.py URL NAME LOG THREADS ROUNDS"""

import os
import sys
import threading
import time

import distlock

url, name, log_path, threads, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
errors = []


def run(client: distlock.Client, t: int) -> None:
    try:
        for _ in range(rounds):
            with client.lock(name, ttl=10.0, wait=60.0) as lease:
                token = lease.token if lease.has_token else 0
                os.write(fd, f"B {os.getpid()} {t} {token} {time.monotonic_ns()}\n".encode())
                if lease.lost.is_set():
                    raise AssertionError("lost inside the critical section")
                os.write(fd, f"E {os.getpid()} {t} {token} {time.monotonic_ns()}\n".encode())
    except BaseException as e:  # reported to the test through the exit status
        errors.append(repr(e))


with distlock.connect(url) as client:
    workers = [threading.Thread(target=run, args=(client, t)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
