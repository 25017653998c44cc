"""distlock.ids.Segment (segment ids over the C++ SegmentGenerator) against real PostgreSQL and
MariaDB servers started by with_servers (conftest.segment_db): ids strictly increase in one
generator, generators of one tag (threads and processes) never share an id, a step change takes
effect at the next range, the context manager closes, and each failure is its own exception class
with the C++ message, never the password. The class docstring's example runs here too."""

from __future__ import annotations

import doctest
import re
import socket
import subprocess
import threading
import uuid
from typing import List

import pytest

import distlock
import distlock.ids
from conftest import python_child, read_line


def fresh_tag(name: str) -> str:
    """A tag no other test (or earlier run on the same server) has used."""
    return f"{name}-{uuid.uuid4().hex[:12]}"


def closed_port() -> int:
    """A loopback port with nothing listening on it (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def increasing(ids: List[int]) -> bool:
    return all(a < b for a, b in zip(ids, ids[1:]))


def test_ids_strictly_increase_in_one_generator_one_round_trip_per_step(segment_db):
    tag = fresh_tag("inc")
    with distlock.ids.Segment(segment_db, tag, step=10) as gen:
        assert gen.tag == tag
        assert gen.step == 10
        ids = [gen.next() for _ in range(1000)]
        # A fresh row starts at 1; one generator alone on its tag hands out 1..1000 densely.
        assert ids == list(range(1, 1001))
        # 100 ranges used; at most one more taken ahead in the background (double buffering).
        assert 100 <= gen.round_trips <= 101


def test_two_generators_on_one_tag_never_share_an_id(segment_db):
    tag = fresh_tag("share")
    per_thread = 3000
    a = distlock.ids.Segment(segment_db, tag, step=7)
    b = distlock.ids.Segment(segment_db, tag)  # the row's step (7, set by the row's creator)
    got = {"a": [], "b": []}
    errors = []

    def draw(name, gen):
        try:
            got[name] = [gen.next() for _ in range(per_thread)]
        except Exception as e:  # reported below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=draw, args=("a", a)), threading.Thread(target=draw, args=("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a generator thread did not finish within 120 s"
    assert errors == []
    a.close()
    b.close()
    assert increasing(got["a"]) and increasing(got["b"])
    assert len(got["a"]) == len(got["b"]) == per_thread
    assert set(got["a"]).isdisjoint(got["b"])


def test_a_generator_in_another_process_never_shares_an_id(segment_db):
    tag = fresh_tag("proc")
    n = 2000
    child = python_child(
        "import sys, distlock.ids\n"
        "g = distlock.ids.Segment(sys.argv[1], sys.argv[2], step=50)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        f"print(' '.join(str(g.next()) for _ in range({n})), flush=True)\n",
        segment_db, tag, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert read_line(child, 60.0).strip() == "ready"
        with distlock.ids.Segment(segment_db, tag, step=50) as mine:
            child.stdin.write("go\n")
            child.stdin.flush()
            local = [mine.next() for _ in range(n)]
            theirs = [int(x) for x in read_line(child, 60.0).split()]
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert len(theirs) == n and increasing(theirs) and increasing(local)
    assert set(local).isdisjoint(theirs)


def test_set_step_takes_effect_at_the_next_range_and_shows_in_step(segment_db):
    with distlock.ids.Segment(segment_db, fresh_tag("step"), step=5) as gen:
        assert gen.next() == 1
        gen.set_step(20)
        assert gen.step == 20
        ids = [gen.next() for _ in range(25)]
        # The first range (0, 5] stays; the next one is (5, 25].
        assert ids == list(range(2, 27))
        with pytest.raises(distlock.InvalidArgument, match="step -5 is outside"):
            gen.set_step(-5)
        assert gen.step == 20


def test_closing_ends_the_generator(segment_db):
    with distlock.ids.Segment(segment_db, fresh_tag("close"), step=10) as gen:
        assert gen.next() == 1
    with pytest.raises(ValueError, match="closed"):
        gen.next()
    gen.close()  # a second close is harmless


def error_of(call):
    with pytest.raises(distlock.Error) as info:
        call()
    return info.value


def test_bad_step_bad_url_and_server_down_are_distinct_errors(segment_db):
    kind = "postgres" if segment_db.startswith("postgres") else "mysql"
    # A bad step: InvalidArgument (also a ValueError) naming the step, before any connection.
    bad_step = error_of(lambda: distlock.ids.Segment(segment_db, fresh_tag("t"), step=-1))
    assert type(bad_step) is distlock.InvalidArgument and isinstance(bad_step, ValueError)
    assert "segment step -1 is outside [0, 1000000000]" in str(bad_step)
    too_big = error_of(lambda: distlock.ids.Segment(segment_db, fresh_tag("t"), step=10**9 + 1))
    assert type(too_big) is distlock.InvalidArgument
    bad_tag = error_of(lambda: distlock.ids.Segment(segment_db, "two words"))
    assert type(bad_tag) is distlock.InvalidArgument and "tag" in str(bad_tag)

    # A URL that is not a database's: InvalidUrl naming what is expected.
    bad_url = error_of(lambda: distlock.ids.Segment("redis://127.0.0.1:6379", "t"))
    assert type(bad_url) is distlock.InvalidUrl
    assert "segment ids need a database URL" in str(bad_url)
    unknown_key = error_of(lambda: distlock.ids.Segment(segment_db + "?bogus=1", "t"))
    assert type(unknown_key) is distlock.InvalidUrl and "bogus" in str(unknown_key)

    # Nothing listening: Unavailable, without the password.
    down_url = f"{kind}://u:pw-down-9x@127.0.0.1:{closed_port()}/db?timeout=500ms"
    down = error_of(lambda: distlock.ids.Segment(down_url, "t"))
    assert type(down) is distlock.Unavailable
    assert "pw-down-9x" not in str(down)
    assert "127.0.0.1" in str(down)

    # A wrong password: AuthFailed, without the password.
    wrong = re.sub(r"^(\w+://[^:]+):[^@]*@", r"\1:wrong-pw-7q@", segment_db)
    assert wrong != segment_db
    refused = error_of(lambda: distlock.ids.Segment(wrong, "t"))
    assert type(refused) is distlock.AuthFailed
    assert "wrong-pw-7q" not in str(refused)

    assert len({type(e) for e in (bad_step, bad_url, down, refused)}) == 4


def test_the_docstring_example_runs(segment_db):
    examples = doctest.DocTestParser().get_examples(distlock.ids.Segment.__doc__)
    assert len(examples) >= 3
    test = doctest.DocTestParser().get_doctest(distlock.ids.Segment.__doc__,
                                               {"url": segment_db}, "Segment", None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted == len(examples)
    assert result.failed == 0
