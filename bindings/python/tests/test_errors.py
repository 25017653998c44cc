"""Bad input gets the C++ API's clear errors, no password is ever printed, and a client used in
a child after fork() says so (issue 29 §2, §4)."""

import os
import socket

import pytest

import distlock
from conftest import RedisServer, free_port


def test_unknown_scheme_and_bad_url_are_invalid_url():
    with pytest.raises(distlock.InvalidUrl) as e:
        distlock.connect("nosuch://127.0.0.1:1")
    assert "nosuch" in str(e.value)
    assert e.value.code == 8
    with pytest.raises(distlock.InvalidUrl) as e:
        distlock.connect("redis://127.0.0.1:notaport")
    assert "notaport" in str(e.value) or "port" in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, distlock.Error)


def test_empty_name_and_bad_ttls_are_invalid_argument(file_store):
    with distlock.connect(file_store.url) as client:
        with pytest.raises(distlock.InvalidArgument) as e:
            client.lock("", wait=0)
        assert "name" in str(e.value)
        for ttl in (0, -1.0, 0.05):
            with pytest.raises(distlock.InvalidArgument) as e:
                client.lock("x", ttl=ttl, wait=0)
            assert "ttl" in str(e.value)
        with pytest.raises(distlock.InvalidArgument) as e:
            client.lock("x", ttl=float("nan"))
        assert "ttl" in str(e.value)
        assert file_store.keys() == [] or client.try_lock("x") is not None


def test_wait_zero_is_busy_and_a_wait_that_runs_out_is_timeout(redis_server):
    with distlock.connect(redis_server.url) as a, distlock.connect(redis_server.url) as b:
        with a.lock("errors/busy"):
            with pytest.raises(distlock.Busy) as e:
                b.lock("errors/busy", wait=0)
            assert type(e.value) is distlock.Busy
            with pytest.raises(distlock.Timeout) as e:
                b.lock("errors/busy", wait=0.2)
            assert isinstance(e.value, distlock.Busy)
            assert b.try_lock("errors/busy") is None


def test_unreachable_service_is_unavailable_and_hides_the_password():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        url = f"redis://user:s3cretpw@127.0.0.1:{port}?timeout=300ms"
        with pytest.raises(distlock.Unavailable) as e:
            client = distlock.connect(url)
            client.lock("x", wait=0)
        assert "s3cretpw" not in str(e.value) and "s3cretpw" not in repr(e.value)


def test_wrong_password_is_auth_failed_without_the_password():
    server = RedisServer(password="right-pw")
    try:
        with pytest.raises(distlock.AuthFailed) as e:
            client = distlock.connect(f"redis://:wr0ng-pw@127.0.0.1:{server.port}")
            client.lock("x", wait=0)
        assert "wr0ng-pw" not in str(e.value)
        with distlock.connect(server.url) as client:
            assert "right-pw" not in client.url and "right-pw" not in repr(client)
            with client.lock("x", wait=0) as lease:
                assert lease.held
    finally:
        server.stop()


def test_releasing_a_lost_lease_raises_lost(redis_server):
    with distlock.connect(redis_server.url) as client:
        lease = client.lock("errors/lost", ttl=1.0)
        redis_server.redis().flushall()  # the server forgets it: the next renewal is refused
        assert lease.lost.wait(5.0)
        assert lease.loss_reason != "none"
        with pytest.raises(distlock.Lost):
            lease.release()


def test_a_client_used_in_a_forked_child_raises_forked(redis_server):
    with distlock.connect(redis_server.url) as client:
        with client.lock("fork/parent") as lease:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: report what the client says, then leave at once
                os.close(r)
                try:
                    client.lock("fork/child", wait=0)
                    word = "acquired"
                except distlock.Forked as e:
                    word = "forked " + str(e)
                except BaseException as e:
                    word = "other " + repr(e)
                os.write(w, word.encode())
                os._exit(0)
            os.close(w)
            with os.fdopen(r) as f:
                said = f.read()
            os.waitpid(pid, 0)
            assert said.startswith("forked"), said
            assert "fork" in said[len("forked"):]
            assert lease.held  # the parent's lease is untouched
