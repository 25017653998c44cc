"""Revoke on redis:// (docs/design.md "Revoke"): the holder's lease is lost with reason "revoked"
and the reason text within its renewal interval (1 s at ttl 3 s) plus 1 s, measured on this
process's monotonic clock; the next holder's token is larger; a free lock is revoked == False;
file:// raises NotSupported."""
import time

import pytest

import distlock


def test_revoke_ends_the_holders_lease_with_its_reason(redis_server, tmp_path):
    with distlock.connect(redis_server.url) as holder, distlock.connect(redis_server.url) as ops:
        lease = holder.lock("py-revoke", ttl=3.0)
        token = lease.token
        assert ops.revoke("py-revoke", "ticket 12") is True
        at = time.monotonic()
        assert lease.lost.wait(10.0), "the holder was never told"
        assert time.monotonic() - at <= 2.0
        assert lease.loss_reason == "revoked"
        assert "ticket 12" in lease.loss_detail
        nxt = ops.lock("py-revoke", ttl=3.0, wait=5.0)
        assert nxt.token > token
        nxt.release()
        assert ops.revoke("py-revoke", "again") is False
    with distlock.connect("file://" + str(tmp_path)) as local:
        with pytest.raises(distlock.NotSupported):
            local.revoke("py-revoke", "why")
