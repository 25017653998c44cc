"""A cancelled wait leaves nothing on the server (issue 29 §4): Ctrl-C (SIGINT ->
KeyboardInterrupt) on the main thread and asyncio cancellation, on redis:// and etcd://."""

import asyncio
import os
import signal
import subprocess
import time

import pytest

import distlock
from conftest import python_child, read_line, wait_until

WAITER = r"""
import sys, time, distlock
client = distlock.connect(sys.argv[1])
print("connected", flush=True)
try:
    client.lock(sys.argv[2], ttl=10.0)     # waits for ever: the test holds the lock
    print("acquired", flush=True)
except KeyboardInterrupt:
    print("interrupted", time.monotonic(), flush=True)
sys.stdin.readline()                       # stay connected while the test counts keys
"""


@pytest.fixture(params=["redis", "etcd"])
def server(request):
    return request.getfixturevalue(request.param + "_server")


def waiters(client, name):
    return client.status(name)["waiters"]


def test_ctrl_c_ends_a_wait_within_100ms_and_leaves_nothing_queued(server):
    name = "cancel/ctrl-c"
    with distlock.connect(server.url) as client:
        with client.lock(name, ttl=10.0) as lease:
            keys_held = server.keys()
            child = python_child(WAITER, server.url, name, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE)
            try:
                assert read_line(child, 10.0).strip() == "connected"
                # The queued wait is visible on the server: in the waiter count and in the keys.
                wait_until(lambda: waiters(client, name) == 1 and server.keys() != keys_held, 10.0,
                           "the child to queue")
                # And in the queue status lists, at position 1, without a description.
                queue = client.status(name)["waiter_list"]
                assert [w["position"] for w in queue] == [1]
                assert queue[0]["owner"] and queue[0]["holder_info"] is None
                sent = time.monotonic()            # CLOCK_MONOTONIC: the same clock as the child's
                os.kill(child.pid, signal.SIGINT)
                word, stamp = read_line(child, 10.0).split()
                assert word == "interrupted"
                # The bound: from the signal to KeyboardInterrupt in the child, on one clock.
                print(f"{server.url}: SIGINT to KeyboardInterrupt {1000 * (float(stamp) - sent):.1f} ms")
                assert float(stamp) - sent < 0.100
                # Nothing left queued while the child is still connected: the library withdraws
                # the entry (one round trip, on the binding's helper thread) as the exception
                # is raised.
                wait_until(lambda: waiters(client, name) == 0 and server.keys() == keys_held, 5.0,
                           "the queued entry to go")
                assert lease.held
            finally:
                child.stdin.close()
                try:
                    assert child.wait(10) == 0
                finally:
                    if child.poll() is None:
                        child.kill()
                        child.wait()


DYING_WAITER = r"""
import sys, distlock
client = distlock.connect(sys.argv[1])
print("connected", flush=True)
client.lock(sys.argv[2], ttl=10.0)         # Ctrl-C: uncaught, the program ends
"""


def test_a_program_ended_by_ctrl_c_leaves_nothing_queued(server):
    """The interpreter's exit waits for the withdrawal of a wait that Ctrl-C ended."""
    name = "cancel/ctrl-c-exit"
    with distlock.connect(server.url) as client:
        with client.lock(name, ttl=10.0):
            keys_held = server.keys()
            child = python_child(DYING_WAITER, server.url, name, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
            try:
                assert read_line(child, 10.0).strip() == "connected"
                wait_until(lambda: waiters(client, name) == 1 and server.keys() != keys_held, 10.0,
                           "the child to queue")
                os.kill(child.pid, signal.SIGINT)
                _, err = child.communicate(timeout=10)
                assert "KeyboardInterrupt" in err
                # Checked at once: the child has exited, nothing of its wait may remain.
                assert waiters(client, name) == 0
                assert server.keys() == keys_held
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()


def test_asyncio_cancel_ends_the_wait_without_blocking_the_loop(server):
    name = "cancel/asyncio"

    async def scenario():
        with distlock.connect(server.url) as holder, distlock.connect(server.url) as client:
            with holder.lock(name, ttl=10.0):
                keys_held = server.keys()
                ticks = 0

                async def ticker():
                    nonlocal ticks
                    while True:
                        await asyncio.sleep(0.01)
                        ticks += 1

                tick_task = asyncio.create_task(ticker())

                async def take():
                    async with client.alock(name, ttl=10.0):
                        raise AssertionError("acquired a held lock")

                task = asyncio.create_task(take())
                loop = asyncio.get_running_loop()
                end = loop.time() + 10.0
                while await loop.run_in_executor(None, waiters, holder, name) != 1:
                    assert loop.time() < end, "the waiter never queued"
                    await asyncio.sleep(0.01)
                before = ticks
                await asyncio.sleep(0.3)
                assert ticks - before >= 10  # the loop kept running while the wait was queued
                start = loop.time()
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=5.0)
                assert task in done, "the cancelled wait did not end"
                assert task.cancelled()
                assert loop.time() - start < 1.0
                tick_task.cancel()
                assert waiters(holder, name) == 0
                assert server.keys() == keys_held
            # Released by the holder: the lock is free and the binding can take it again.
            async with client.alock(name, ttl=10.0, wait=5.0) as lease:
                assert lease.held

    asyncio.run(scenario())


def test_asyncio_lock_waits_for_a_release_on_another_thread(redis_server):
    name = "async/handoff"

    async def scenario():
        with distlock.connect(redis_server.url) as client:
            first = client.lock(name, ttl=10.0)
            loop = asyncio.get_running_loop()
            loop.call_later(0.2, first.release)
            start = loop.time()
            async with client.alock(name, ttl=10.0, wait=5.0) as lease:
                assert loop.time() - start >= 0.15
                assert lease.token > first.token

    asyncio.run(scenario())


PRIMITIVE_WAITER = r"""
import sys, time, distlock
client = distlock.connect(sys.argv[1])
kind, name = sys.argv[2], sys.argv[3]
print("connected", flush=True)
try:
    if kind == "semaphore":
        client.semaphore(name, 1, ttl=10.0).acquire()
    else:
        client.rwlock(name, ttl=10.0).write()
    print("acquired", flush=True)
except KeyboardInterrupt:
    print("interrupted", time.monotonic(), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("kind", ["semaphore", "rwlock"])
def test_ctrl_c_ends_a_semaphore_or_rwlock_wait_on_etcd(etcd_server, kind):
    """etcd queues the waiters of a semaphore's permits and a read-write lock's parts: a Ctrl-C
    takes them out again."""
    name = f"cancel/{kind}"
    with distlock.connect(etcd_server.url) as client:
        held = (client.semaphore(name, 1, ttl=10.0).acquire() if kind == "semaphore"
                else client.rwlock(name, ttl=10.0).read())
        with held:
            keys_held = etcd_server.keys()
            child = python_child(PRIMITIVE_WAITER, etcd_server.url, kind, name,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            try:
                assert read_line(child, 10.0).strip() == "connected"
                wait_until(lambda: etcd_server.keys() != keys_held, 10.0, "the child to queue")
                sent = time.monotonic()
                os.kill(child.pid, signal.SIGINT)
                word, stamp = read_line(child, 10.0).split()
                assert word == "interrupted"
                print(f"{kind}: SIGINT to KeyboardInterrupt {1000 * (float(stamp) - sent):.1f} ms")
                assert float(stamp) - sent < 0.100
                # What the wait held or queued goes (a writer gives back the intent lock and the
                # 31 reader slots it had collected: one request each).
                wait_until(lambda: etcd_server.keys() == keys_held, 5.0, "the queued entries to go")
                assert held.held
            finally:
                child.stdin.close()
                try:
                    assert child.wait(10) == 0
                finally:
                    if child.poll() is None:
                        child.kill()
                        child.wait()
