"""lock_delay= of Client.lock and Client.lock_all on redis:// (docs/design.md "Lock-delay"): a
revoked holder (a loss, not a release) holds the name back for its delay; a release hands it on at
once; bad values raise the library's InvalidArgument naming lock_delay; file:// cannot enforce it
and raises NotSupported. Times are this process's monotonic clock."""
import datetime
import time

import pytest

import distlock


def test_a_revoked_holder_holds_the_name_back_and_a_release_does_not(redis_server):
    ttl, delay = 1.0, 2.5  # the delay above the TTL: a grant at the lease's end is too early
    with distlock.connect(redis_server.url) as holder, distlock.connect(redis_server.url) as other:
        held = holder.lock("ld/revoked", ttl=ttl, lock_delay=datetime.timedelta(seconds=delay))
        revoking = time.monotonic()
        assert other.revoke("ld/revoked", "lock-delay test") is True
        revoke_took = time.monotonic() - revoking
        granted = None
        for _ in range(500):  # 500 x 20 ms = 10 s
            lease = other.try_lock("ld/revoked", ttl=ttl)
            if lease is not None:
                granted = time.monotonic() - revoking
                lease.release()
                break
            time.sleep(0.02)
        print(f"revoked holder with lock_delay {delay} s, ttl {ttl} s: next granted {granted} s "
              "after the revoke")
        assert granted is not None, "never granted within 10 s"
        # The server expires on a millisecond clock: up to 1 ms early against this clock.
        assert granted >= delay - 0.001, "granted before the revoked holder's lock-delay ended"
        assert granted <= revoke_took + ttl + delay + 1.0, "granted too late after the delay"
        assert held.lost.wait(5.0) and held.loss_reason == "revoked"

        released = holder.lock("ld/released", ttl=10.0, lock_delay=5.0)
        released.release()
        nxt = other.try_lock("ld/released")
        assert nxt is not None, "a release held the name back"
        nxt.release()


def test_bad_values_and_a_backend_that_cannot_enforce_it_are_refused(redis_server, tmp_path):
    with distlock.connect(redis_server.url) as client:
        for bad in (-1.0, -0.0001, 60.001, datetime.timedelta(seconds=-3)):
            with pytest.raises(distlock.InvalidArgument, match="lock_delay"):
                client.lock("ld/bad", wait=0, lock_delay=bad)
            with pytest.raises(distlock.InvalidArgument, match="lock_delay"):
                client.lock_all(["ld/bad", "ld/bad2"], wait=0, lock_delay=bad)
        with client.lock("ld/bad", wait=0, lock_delay=60.0) as lease:
            assert lease.held
    with distlock.connect("file://" + str(tmp_path)) as local:
        with pytest.raises(distlock.NotSupported, match="lock_delay"):
            local.lock("ld/file", lock_delay=1.0)
