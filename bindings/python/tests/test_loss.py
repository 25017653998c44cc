"""Loss on redis:// (issue 29 §4): a holder stopped (SIGSTOP) past its TTL sees `lease.lost` set
before it could write again once resumed, and the next holder's token is larger."""

import os
import signal
import subprocess
import time

import distlock
from conftest import python_child, read_line, wait_until

HOLDER = r"""
import os, sys, distlock
client = distlock.connect(sys.argv[1])
lease = client.lock(sys.argv[2], ttl=1.0)
log = os.open(sys.argv[3], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(log, f"W {lease.token}\n".encode())
print("held", lease.token, flush=True)
sys.stdin.readline()                       # "go", after SIGSTOP ... SIGCONT
if lease.lost.is_set():
    print("lost", lease.loss_reason, flush=True)
else:
    os.write(log, f"W {lease.token}\n".encode())
    print("wrote", flush=True)
try:
    lease.release()
    print("released", flush=True)
except distlock.Lost as e:
    print("release: Lost", flush=True)
print("event", lease.lost.wait(5.0), flush=True)
"""


def test_paused_holder_sees_the_loss_before_writing_and_next_token_is_larger(redis_server, tmp_path):
    name = "loss/paused"
    log = str(tmp_path / "writes.log")
    holder = python_child(HOLDER, redis_server.url, name, log, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE)
    try:
        first = read_line(holder, 10.0).split()
        assert first[0] == "held", first
        old_token = int(first[1])
        os.kill(holder.pid, signal.SIGSTOP)
        with distlock.connect(redis_server.url) as client:
            start = time.monotonic()
            with client.lock(name, ttl=5.0, wait=10.0) as lease:
                # The stopped holder's lease ends by its TTL (1 s) on the server.
                assert time.monotonic() - start < 1.0 + 2.0
                assert lease.token > old_token
                os.kill(holder.pid, signal.SIGCONT)
                holder.stdin.write("go\n")
                holder.stdin.flush()
                lines = [read_line(holder, 10.0).strip() for _ in range(3)]
                assert lines[0].startswith("lost"), lines
                assert lines[1] == "release: Lost", lines
                assert lines[2] == "event True", lines
                assert client.status(name)["token"] == lease.token  # the old holder touched nothing
        with open(log) as f:
            assert f.read().split() == ["W", str(old_token)]  # no write after the pause
        assert holder.wait(10) == 0
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.wait()
