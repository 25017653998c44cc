"""Tracing from Python (docs/tracing.md): a client's tracer gets one dict per span of a wait, a
hold, a renewal and a loss, with the W3C trace context of the client's traceparent; the hold's
context is Lease.traceparent; a tracer that raises does not fail the lock; without a tracer a lease
has no traceparent. On a redis-server and a file:// directory the tests start."""

import sys
import threading
import time

import distlock
from conftest import wait_until

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Recorder:
    def __init__(self):
        self.mu = threading.Lock()
        self.spans = []

    def __call__(self, span):
        with self.mu:
            self.spans.append(span)

    def of(self, kind):
        with self.mu:
            return [s for s in self.spans if s["kind"] == kind]


def test_spans_of_a_hold_on_redis_share_the_parents_trace(redis_server):
    rec = Recorder()
    client = distlock.connect(redis_server.url, tracer=rec, traceparent=PARENT)
    try:
        t0 = time.monotonic()
        lease = client.lock("py/traced", ttl=0.6)  # renewed every 0.2 s
        t1 = time.monotonic()
        hold_tp = lease.traceparent
        time.sleep(0.5)
        t2 = time.monotonic()
        lease.release()
        t3 = time.monotonic()
        wait_until(lambda: len(rec.of("renewal")) >= 1, 5.0, "a renewal span")
    finally:
        client.close()
    (wait,) = rec.of("wait")
    (hold,) = rec.of("hold")
    assert wait["outcome"] == "acquired" and hold["outcome"] == "released"
    for s in (wait, hold):
        assert s["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert s["parent_span_id"] == "00f067aa0ba902b7"
        assert s["lock_name"] == "py/traced"
        assert s["backend"] == "redis"
        assert s["token"] == lease.token
    assert hold_tp == "00-4bf92f3577b34da6a3ce929d0e0e4736-" + hold["span_id"] + "-01"
    for r in rec.of("renewal"):
        assert r["parent_span_id"] == hold["span_id"]
        assert r["trace_id"] == hold["trace_id"]
        assert r["outcome"] == "renewed"
    # The spans' lengths are within what was measured around the calls.
    assert 0.0 <= wait["duration"] <= t1 - t0
    assert t2 - t1 <= hold["duration"] <= t3 - t0
    # The wall-clock times exported have the same length (to the nanosecond).
    assert abs(hold["end_unix_nano"] - hold["start_unix_nano"] - hold["duration"] * 1e9) < 2


def test_a_busy_wait_gives_a_busy_span_and_a_raising_tracer_fails_nothing(file_store, monkeypatch):
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(u))
    rec = Recorder()
    holder = distlock.connect(file_store.url)
    raised = []

    def raising(span):
        rec(span)
        raised.append(span["kind"])
        raise RuntimeError("tracer bug")

    client = distlock.connect(file_store.url, tracer=raising)
    try:
        with holder.lock("py/busy"):
            assert client.try_lock("py/busy") is None
        with client.lock("py/busy") as lease:
            assert lease.held
            assert lease.traceparent is not None
    finally:
        client.close()
        holder.close()
    kinds = [(s["kind"], s["outcome"]) for s in rec.spans]
    assert kinds == [("wait", "busy"), ("wait", "acquired"), ("hold", "released")]
    assert rec.spans[0]["error"] is not None
    assert rec.spans[0]["parent_span_id"] is None  # no traceparent: a root
    assert raised == ["wait", "wait", "hold"]
    assert [type(u.exc_value) for u in unraisable] == [RuntimeError] * 3
    assert all(u.object == "distlock tracer" for u in unraisable)


def test_without_a_tracer_a_lease_has_no_traceparent(file_store):
    client = distlock.connect(file_store.url)
    try:
        with client.lock("py/untraced") as lease:
            assert lease.traceparent is None
    finally:
        client.close()


def test_a_locks_own_traceparent_is_the_parent_of_its_spans(tmp_path):
    per_lock = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    rec = Recorder()
    with distlock.connect("file://" + str(tmp_path), tracer=rec, traceparent=PARENT) as client:
        with client.lock("py/own", traceparent=per_lock) as lease:
            assert lease.traceparent.startswith("00-0af7651916cd43dd8448eb211c80319c-")
        with client.lock("py/client") as lease:
            assert lease.traceparent.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
        wait_until(lambda: len([s for s in rec.of("hold") if s["lock_name"] == "py/own"]) == 1, 5.0,
                   "the hold span of py/own")
        own = [s for s in rec.spans if s["lock_name"] == "py/own"]
        assert {s["kind"] for s in own} == {"wait", "hold"}
        for s in own:
            assert s["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
            assert s["parent_span_id"] == "b7ad6b7169203331"
