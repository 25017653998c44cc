"""on_queue_position= of Client.lock on redis://: four waiters queued one after another behind a
holder are told their places 1..4 (the one ahead by its holder_info), later reports only move
forward, and they acquire in that order; an exception from the callable goes to
sys.unraisablehook and the wait goes on. Every wait is bounded (20 s to be listed, 60 s to
acquire)."""
import sys
import threading

import distlock

from conftest import wait_until


def test_four_waiters_are_told_their_place_and_acquire_in_that_order(redis_server):
    waiters = 4
    reports = {i: [] for i in range(1, waiters + 1)}
    order = []
    errors = []
    mu = threading.Lock()
    with distlock.connect(redis_server.url) as holder, distlock.connect(redis_server.url) as observer:
        held = holder.lock("queue/order", holder_info="holder")
        clients = [distlock.connect(redis_server.url) for _ in range(waiters)]
        threads = []
        try:
            for i in range(1, waiters + 1):
                def wait_in_line(i=i):
                    def report(position, ahead):
                        with mu:
                            reports[i].append((position, ahead["position"], ahead["holder_info"]))
                    try:
                        lease = clients[i - 1].lock("queue/order", wait=60.0,
                                                    holder_info=f"waiter={i}",
                                                    on_queue_position=report)
                        with mu:
                            order.append(i)
                        lease.release()
                    except Exception as e:  # reported below
                        errors.append(e)
                t = threading.Thread(target=wait_in_line)
                t.start()
                threads.append(t)

                def listed_last(i=i):
                    q = observer.status("queue/order")["waiter_list"]
                    return len(q) == i and q[-1]["holder_info"] == f"waiter={i}"
                wait_until(listed_last, 20.0, f"waiter {i} listed last in the queue")
            wait_until(lambda: all(reports[i] for i in reports), 20.0,
                       "every waiter's first queue position")
            with mu:
                for i in range(1, waiters + 1):
                    ahead = "holder" if i == 1 else f"waiter={i - 1}"
                    assert reports[i][0] == (i, i - 1, ahead), f"waiter {i}: {reports[i]}"
        finally:
            held.release()  # on a failed check the waiters end too
            for t in threads:
                t.join(60.0)
            for c in clients:
                c.close()
        assert not any(t.is_alive() for t in threads), "a waiter did not end within 60 s"
        assert errors == []
        assert order == [1, 2, 3, 4], "the waiters did not acquire in the order reported"
        for i in range(1, waiters + 1):
            positions = [r[0] for r in reports[i]]
            assert positions == sorted(positions, reverse=True) and len(set(positions)) == len(positions), \
                f"waiter {i}: a later report did not move forward: {positions}"


def test_an_exception_from_the_callable_goes_to_unraisablehook_and_the_wait_goes_on(redis_server):
    seen = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u)
    try:
        with distlock.connect(redis_server.url) as holder, distlock.connect(redis_server.url) as waiter:
            held = holder.lock("queue/raises")
            got = []

            def raises(position, ahead):
                raise RuntimeError(f"callback at position {position}")

            def wait():
                with waiter.lock("queue/raises", wait=30.0, on_queue_position=raises) as lease:
                    got.append(lease.token)
            t = threading.Thread(target=wait)
            t.start()
            try:
                wait_until(lambda: seen, 20.0, "the callable's exception at sys.unraisablehook")
            finally:
                held.release()
                t.join(30.0)
            assert not t.is_alive()
            assert got and got[0] > held.token, "the wait did not go on after the exception"
            assert isinstance(seen[0].exc_value, RuntimeError)
            assert "callback at position 1" in str(seen[0].exc_value)
    finally:
        sys.unraisablehook = old_hook


def test_no_report_reaches_the_callable_after_lock_returned(redis_server):
    """A report queued on the client's event thread while it is blocked (an on_lost callback of
    another lease of the same client, the compiled Lease's own hook) and still queued when lock()
    returns is dropped: after the thread is let go and a later marker callback has run, the
    callable was called 0 times. Bounded waits: 20 s, 30 s."""
    entered, release_thread, marker_ran = threading.Event(), threading.Event(), threading.Event()
    with distlock.connect(redis_server.url) as c, distlock.connect(redis_server.url) as holder, \
            distlock.connect(redis_server.url) as ops:
        blocker = c.lock("gate/blocker", ttl=1.0)
        marker = c.lock("gate/marker", ttl=1.0)
        blocker._impl.on_lost(lambda: (entered.set(), release_thread.wait(30.0)))
        marker._impl.on_lost(marker_ran.set)
        try:
            assert ops.revoke("gate/blocker", "block the event thread")
            assert entered.wait(20.0), "the on_lost callback never ran"
            held = holder.lock("gate/q")
            reports = []
            got = []
            t = threading.Thread(target=lambda: got.append(
                c.lock("gate/q", wait=30.0, holder_info="gated",
                       on_queue_position=lambda p, ahead: reports.append(p))))
            t.start()
            wait_until(lambda: any(w["holder_info"] == "gated"
                                   for w in ops.status("gate/q")["waiter_list"]),
                       20.0, "the waiter listed in the queue")
            held.release()
            t.join(30.0)
            assert not t.is_alive() and got, "the waiter did not get the lock"
            assert reports == [], "a report ran while the event thread was blocked"
        finally:
            release_thread.set()
        assert ops.revoke("gate/marker", "after the reports")
        assert marker_ran.wait(20.0), "the marker callback never ran"
        assert reports == [], f"{len(reports)} report(s) reached the callable after lock() returned"
        got[0].release()
