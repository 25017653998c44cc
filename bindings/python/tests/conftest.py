"""Servers for the Python binding's tests: redis-server and etcd, started by the tests on free
loopback ports in temporary directories and stopped by pid. Under CI=true a missing server binary
fails the test; elsewhere it is skipped with the reason."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Callable, Iterator, List, Optional

import pytest

import distlock
from distlock import _distlock

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("DISTLOCK_SOURCE_DIR", os.path.abspath(os.path.join(HERE, "..", "..", "..")))


def need_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (scripts/bootstrap.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def need_component(name: str) -> None:
    if not _distlock.components.get(name):
        pytest.skip(f"this build has no {name} component")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    """Polls `pred` every 10 ms until it holds; fails after `timeout` seconds (monotonic)."""
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def stop_pid(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGCONT)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout)
    except ProcessLookupError:
        pass


class RedisServer:
    def __init__(self, password: Optional[str] = None) -> None:
        binary = need_binary("redis-server")
        self.dir = tempfile.mkdtemp(prefix="distlock-py-redis-")
        self.password = password
        failures = []
        for _ in range(5):  # a port free a moment ago may be taken by a parallel test
            self.port = free_port()
            argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                    "--save", "", "--appendonly", "no", "--daemonize", "no"]
            if password:
                argv += ["--requirepass", password]
            log = open(os.path.join(self.dir, "redis.log"), "ab")
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            if self._wait_ready(10.0):
                return
            failures.append(f"port {self.port}: exit {self.proc.poll()}")
            stop_pid(self.proc)
        raise RuntimeError("redis-server did not start: " + "; ".join(failures))

    def _wait_ready(self, timeout: float) -> bool:
        import redis
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                if self.redis().ping():
                    return True
            except redis.exceptions.ConnectionError:
                time.sleep(0.02)
        return False

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}"

    def redis(self):
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                           socket_timeout=5)

    def keys(self) -> List[bytes]:
        return sorted(self.redis().keys("*"))

    def stop(self) -> None:
        stop_pid(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class EtcdServer:
    def __init__(self) -> None:
        binary = need_binary("etcd")
        self.dir = tempfile.mkdtemp(prefix="distlock-py-etcd-")
        failures = []
        for _ in range(5):
            self.port, peer = free_port(), free_port()
            client = f"http://127.0.0.1:{self.port}"
            argv = [binary, "--name", "m0", "--data-dir", os.path.join(self.dir, "m0"),
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-cluster", f"m0=http://127.0.0.1:{peer}",
                    "--initial-cluster-state", "new", "--heartbeat-interval", "50",
                    "--election-timeout", "500", "--logger", "zap", "--log-level", "warn"]
            log = open(os.path.join(self.dir, "etcd.log"), "ab")
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            if self._wait_ready(20.0):
                return
            failures.append(f"port {self.port}: exit {self.proc.poll()}")
            stop_pid(self.proc)
        raise RuntimeError("etcd did not start: " + "; ".join(failures))

    def _wait_ready(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if b'"true"' in r.read():
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.port}"

    def keys(self) -> List[bytes]:
        """Every lock key on the server (through etcd's v3 JSON gateway): the keys of locks,
        queues, records and markers, but not a session's release mark (`%released/`, one per
        session, put by its last release for the prefix watch and gone with the session) nor a
        watch's sync marker (`%sync/`): those say nothing about what is held or queued."""
        import base64
        import json
        body = json.dumps({"key": base64.b64encode(b"\0").decode(),
                           "range_end": base64.b64encode(b"\0").decode(), "keys_only": True})
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v3/kv/range", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            kvs = json.loads(r.read()).get("kvs", [])
        keys = (base64.b64decode(kv["key"]) for kv in kvs)
        return sorted(k for k in keys if b"%released/" not in k and b"%sync/" not in k)

    def stop(self) -> None:
        stop_pid(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class FileStore:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="distlock-py-file-")

    @property
    def url(self) -> str:
        return f"file://{self.dir}"

    def keys(self) -> List[str]:
        return sorted(os.listdir(self.dir))

    def stop(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    need_component("redis")
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def etcd_server() -> Iterator[EtcdServer]:
    need_component("etcd")
    server = EtcdServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def file_store() -> Iterator[FileStore]:
    need_component("file")
    store = FileStore()
    yield store
    store.stop()


@pytest.fixture(params=["file", "redis", "etcd"])
def backend(request):
    """One of the servers above, by name (the contract runs on each)."""
    return request.getfixturevalue({"file": "file_store", "redis": "redis_server",
                                    "etcd": "etcd_server"}[request.param])


def python_child(code: str, *args: str, **kw) -> subprocess.Popen:
    """A Python child process running `code` with the package on its path."""
    env = dict(os.environ)
    env.setdefault("DISTLOCK_LOG", "error")
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, text=True, **kw)


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The child's next stdout line, waiting at most `timeout` seconds (fails the test after)."""
    import select
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no line from pid {proc.pid} within {timeout} s")
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            return proc.stdout.readline()


def segment_database_url(kind: str) -> str:
    """The URL of the PostgreSQL ("postgres") or MariaDB ("mysql") server with_servers started
    (bindings/tests/with_servers.cpp, the C++ harnesses of tests/support), from
    DISTLOCK_TEST_<KIND>_URL. Missing, it fails when DISTLOCK_TEST_SEGMENT_DBS (set by ctest to
    the databases the build has) lists it or under CI=true, and skips otherwise."""
    url = os.environ.get(f"DISTLOCK_TEST_{kind.upper()}_URL")
    if url:
        return url
    listed = os.environ.get("DISTLOCK_TEST_SEGMENT_DBS", "").split()
    message = (f"DISTLOCK_TEST_{kind.upper()}_URL is not set: run through "
               f"distlock_with_servers --{kind} (ctest -R python.test_segment does)")
    if kind in listed or os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
    return ""


@pytest.fixture(params=["postgres", "mysql"])
def segment_db(request) -> str:
    """A database URL for segment ids: each test runs on PostgreSQL and on MariaDB."""
    if not _distlock.components.get("ids"):
        pytest.skip("this build has no ids component")
    if not _distlock.components.get(request.param):
        pytest.skip(f"this build has no {request.param} component")
    return segment_database_url(request.param)
