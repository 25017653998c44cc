"""Client.lock_all and MultiLease on redis:// (docs/multi_lock.md): the names sorted with
duplicates dropped, one token per name; a revoke of one name is a loss of the whole (lost set
within 5 s, lost_name and loss_reason say which, release raises Lost); bad input raises the
library's InvalidArgument; a busy name fails the whole call with nothing left held."""
import pytest

import distlock


def test_one_token_per_name_and_the_loss_of_one_is_the_loss_of_the_whole(redis_server):
    with distlock.connect(redis_server.url) as c, distlock.connect(redis_server.url) as other:
        with pytest.raises(distlock.InvalidArgument, match="the list of names is empty"):
            c.lock_all([])
        with pytest.raises(distlock.InvalidArgument):
            c.lock_all(["a", ""])

        m = c.lock_all(["m/c", "m/a", "m/b", "m/a"], ttl=3.0)
        assert m.names == ["m/a", "m/b", "m/c"]
        assert sorted(m.tokens) == ["m/a", "m/b", "m/c"]
        assert all(m.token(n) == m.tokens[n] > 0 for n in m.names)
        with pytest.raises(distlock.InvalidArgument):
            m.token("m/z")
        assert m.held and m.remaining > 0 and m.lost_name is None and m.loss_reason == "none"

        with pytest.raises(distlock.Busy):
            other.lock_all(["m/d", "m/b"], wait=0)
        d = other.try_lock("m/d")
        assert d is not None, "m/d was left held by the failed lock_all"
        d.release()

        assert other.revoke("m/b", "multi test") is True
        assert m.lost.wait(5.0), "lost was not set within 5 s of the revoke of one name"
        assert not m.held
        assert m.lost_name == "m/b" and m.loss_reason == "revoked"
        assert "multi test" in m.loss_detail
        with pytest.raises(distlock.Lost, match="m/b"):
            m.release()
        m.release()  # twice: nothing
        a = other.try_lock("m/a")
        assert a is not None, "m/a still held after the release"
        a.release()


def test_a_with_block_releases_every_name_and_close_releases_what_is_left(redis_server):
    with distlock.connect(redis_server.url) as c, distlock.connect(redis_server.url) as other:
        with c.lock_all(["w/x", "w/y"]) as both:
            assert both.held
        for n in ("w/x", "w/y"):
            lease = other.try_lock(n)
            assert lease is not None, f"{n} still held after the with block"
            lease.release()
        left = c.lock_all(["w/x", "w/y"])
        c.close()
        assert not left.held
        for n in ("w/x", "w/y"):
            lease = other.try_lock(n)
            assert lease is not None, f"{n} still held after close()"
            lease.release()
