"""The Python API over the C++ one: connect, lock/try_lock, leases, semaphore, read-write lock,
election, ids, the docstrings help() shows, the GIL released while waiting."""

import os
import pydoc
import subprocess
import sys
import threading
import time

import pytest

import distlock
import distlock.ids
from conftest import wait_until


def test_connect_none_uses_distlock_url(file_store, monkeypatch):
    monkeypatch.setenv("DISTLOCK_URL", file_store.url)
    assert distlock.default_url() == file_store.url
    with distlock.connect() as client:
        assert client.url == file_store.url and client.scheme == "file"
        with client.lock("api/default", ttl=5.0) as lease:
            assert lease.held and lease.token >= 1
    assert client.closed
    with pytest.raises(ValueError):
        client.lock("api/default")


def test_status_says_when_the_backend_keeps_no_queue(file_store):
    with distlock.connect(file_store.url) as client:
        with client.lock("api/queue", ttl=5.0):
            st = client.status("api/queue")
            assert st["held"] and st["waiter_list"] is None


def test_lease_fields_and_release(redis_server):
    with distlock.connect(redis_server.url) as client:
        lease = client.lock("api/fields", ttl=10.0, wait=5.0)
        assert isinstance(lease.lost, threading.Event) and not lease.lost.is_set()
        assert 8.0 < lease.remaining <= 10.0
        assert lease.name == "api/fields" and lease.loss_reason == "none"
        st = client.status("api/fields")
        assert st["held"] and st["token"] == lease.token
        lease.release()
        assert not lease.held and lease.remaining == 0.0 and not lease.lost.is_set()
        lease.release()  # twice: nothing
        again = client.try_lock("api/fields", ttl=10.0)
        assert again is not None and again.token > lease.token
        again.release()


def test_close_releases_what_is_still_held(redis_server):
    client = distlock.connect(redis_server.url)
    client.lock("api/close", ttl=30.0)
    client.close()
    client.close()
    with distlock.connect(redis_server.url) as other:
        assert other.try_lock("api/close") is not None


def test_close_releases_leases_still_referenced(redis_server):
    """close() releases the leases it returned that are still held, also while the program keeps
    references to them (a semaphore permit and an election's leadership alike)."""
    client = distlock.connect(redis_server.url)
    kept = client.lock("api/close-kept", ttl=30.0)
    permit = client.semaphore("api/close-sem", 1).acquire(wait=0)
    lead = client.election("api/close-elect").campaign("v", wait=0)
    released = client.lock("api/close-released", ttl=30.0)
    released.release()
    assert kept.held and permit.held and lead.held
    client.close()
    assert not kept.held and not permit.held and not lead.held
    assert not kept.lost.is_set()  # an orderly release, not a loss
    with distlock.connect(redis_server.url) as other:
        assert other.try_lock("api/close-kept") is not None
        assert other.semaphore("api/close-sem", 1).try_acquire() is not None
        assert other.election("api/close-elect").leader() is None


def test_other_threads_run_while_one_waits(redis_server):
    """The GIL is released while waiting: a counting thread keeps counting."""
    with distlock.connect(redis_server.url) as client:
        held = client.lock("api/gil", ttl=10.0)
        count = 0
        stop = threading.Event()

        def counter():
            nonlocal count
            while not stop.is_set():
                count += 1

        t = threading.Thread(target=counter)
        t.start()
        try:
            timer = threading.Timer(0.5, held.release)
            timer.start()
            before = count
            with client.lock("api/gil", ttl=10.0, wait=5.0):
                pass
            assert count - before > 10_000
        finally:
            stop.set()
            t.join()


def test_semaphore_admits_permits_holders(redis_server):
    with distlock.connect(redis_server.url) as client:
        sem = client.semaphore("api/sem", 2, ttl=10.0)
        assert sem.permits == 2
        a, b = sem.acquire(wait=1.0), sem.acquire(wait=1.0)
        assert sem.try_acquire() is None
        with pytest.raises(distlock.Busy):
            sem.acquire(wait=0.2)
        assert sem.available() == 0
        a.release()
        with sem as c:
            assert c.held
        b.release()
        with pytest.raises(distlock.InvalidArgument):
            client.semaphore("api/sem", 3)


def test_rwlock_readers_share_and_the_writer_is_alone(redis_server):
    with distlock.connect(redis_server.url) as client, distlock.connect(redis_server.url) as other:
        rw, rw2 = client.rwlock("api/rw", ttl=10.0), other.rwlock("api/rw", ttl=10.0)
        with rw.read() as r1, rw2.read(wait=1.0) as r2:
            assert r1.held and r2.held
            with pytest.raises(distlock.Busy):
                rw2.write(wait=0.2)
        with rw.write(wait=2.0) as w:
            assert w.token >= 1
            with pytest.raises(distlock.Busy):
                rw2.read(wait=0.2)
        with rw2.write(wait=2.0) as w2:
            assert w2.token > w.token


def test_election_campaign_leader_resign(redis_server):
    with distlock.connect(redis_server.url) as a, distlock.connect(redis_server.url) as b:
        ea, eb = a.election("api/elect", ttl=10.0), b.election("api/elect", ttl=10.0)
        assert ea.leader() is None
        lead = ea.campaign("host-a")
        leader = eb.leader()
        assert leader.term == lead.token and leader.value == b"host-a" and leader.value_known
        ea.proclaim(lead, "host-a:8080")
        assert eb.leader().value == b"host-a:8080"
        with pytest.raises(distlock.Busy):
            eb.campaign("host-b", wait=0)
        ea.resign(lead)
        lead_b = eb.campaign("host-b", wait=5.0)
        assert lead_b.token > lead.token
        seen = ea.observe(lead.token, wait=5.0)
        assert seen.term == lead_b.token and seen.value == b"host-b"
        eb.resign(lead_b)


def test_ids(redis_server):
    with distlock.connect(redis_server.url) as client:
        with distlock.ids.Snowflake(client, prefix="api") as gen:
            ids = [gen.next() for _ in range(1000)] + gen.next_batch(100)
            assert all(a < b for a, b in zip(ids, ids[1:]))
            parts = distlock.ids.decode_snowflake(ids[0])
            assert parts.worker == gen.worker_id and abs(parts.unix_ms / 1000 - time.time()) < 60
        second = distlock.ids.Snowflake(client, prefix="api")
        assert second.leased
        second.close()
    daily = distlock.ids.RedisDaily(redis_server.url, prefix="api", reserve=10)
    d = [daily.next() for _ in range(20)]
    assert all(a < b for a, b in zip(d, d[1:]))
    assert distlock.ids.decode_redis_daily(d[0]).counter >= 1
    u = [distlock.ids.uuid7() for _ in range(100)]
    assert all(x.version == 7 for x in u) and u == sorted(u) and len(set(u)) == 100


def test_help_shows_the_docstrings():
    text = pydoc.render_doc(distlock, renderer=pydoc.plaintext)
    for needle in ("fencing token", "connect(", "KeyboardInterrupt", "class Lease", "lock(self, name",
                   "Busy", "alock"):
        assert needle in text, needle
    assert "Snowflake" in pydoc.render_doc(distlock.ids, renderer=pydoc.plaintext)


def test_package_ships_type_hints():
    pkg = os.path.dirname(distlock.__file__)
    for f in ("py.typed", "__init__.pyi", "ids.pyi"):
        assert os.path.isfile(os.path.join(pkg, f)), f


def test_leases_still_held_at_exit_are_released(redis_server):
    code = ("import sys, distlock\n"
            "client = distlock.connect(sys.argv[1])\n"
            "lease = client.lock('api/at-exit', ttl=30.0)\n"
            "print(lease.token)\n")
    r = subprocess.run([sys.executable, "-c", code, redis_server.url], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    with distlock.connect(redis_server.url) as client:
        lease = client.try_lock("api/at-exit")  # free at once, not after the 30 s TTL
        assert lease is not None and lease.token > int(r.stdout)
