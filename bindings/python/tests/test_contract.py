"""The bindings' contract (issue 29 §4) on file://, redis:// and etcd://: exclusion across
processes and threads with tokens that follow the order of the critical sections."""

import os
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PROCESSES, THREADS, ROUNDS = 4, 8, 63  # 2,016 critical sections


def test_exclusion_hammer_four_processes_eight_threads(backend):
    name = f"hammer/{time.monotonic_ns()}"
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "cs.log")
        env = dict(os.environ, DISTLOCK_LOG="error")
        procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "hammer_worker.py"), backend.url,
                                   name, log, str(THREADS), str(ROUNDS)], env=env,
                                  stderr=subprocess.PIPE, text=True)
                 for _ in range(PROCESSES)]
        for p in procs:
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, err
        with open(log) as f:
            lines = [line.split() for line in f]

    assert len(lines) == 2 * PROCESSES * THREADS * ROUNDS
    check_sections(lines, PROCESSES)


def check_sections(lines, processes):
    """Fails unless the log shows critical sections one after another (each begin followed by
    the same holder's end, stamps in log order) with strictly increasing tokens, from every
    process."""
    tokens = []
    pids = set()
    last_end = 0
    for i in range(0, len(lines), 2):
        begin, end = lines[i], lines[i + 1]
        # Never two inside at once: every begin is followed by the same holder's end.
        assert begin[0] == "B" and end[0] == "E", f"overlap at line {i}: {begin} {end}"
        assert begin[1:4] == end[1:4], f"overlap at line {i}: {begin} {end}"
        # The stamps (CLOCK_MONOTONIC, one clock for every process) agree with the log order.
        assert last_end <= int(begin[4]) <= int(end[4])
        last_end = int(end[4])
        tokens.append(int(begin[3]))
        pids.add(begin[1])
    assert len(pids) == processes
    # Tokens strictly increase in the order the sections ran.
    assert all(a < b for a, b in zip(tokens, tokens[1:])), "tokens out of section order"


def test_the_section_check_catches_overlaps_and_token_disorder():
    good = [l.split() for l in ("B 1 0 5 10", "E 1 0 5 20", "B 2 0 6 30", "E 2 0 6 40")]
    check_sections(good, 2)
    bad = {
        "overlap": ["B 1 0 5 10", "B 2 0 6 15", "E 1 0 5 20", "E 2 0 6 40"],
        "interleaved ends": ["B 1 0 5 10", "E 2 0 6 20", "B 2 0 6 30", "E 1 0 5 40"],
        "token disorder": ["B 1 0 6 10", "E 1 0 6 20", "B 2 0 5 30", "E 2 0 5 40"],
        "stamps disorder": ["B 1 0 5 10", "E 1 0 5 35", "B 2 0 6 30", "E 2 0 6 40"],
    }
    for what, log in bad.items():
        with pytest.raises(AssertionError):
            check_sections([l.split() for l in log], 2)
            raise RuntimeError(f"the check missed: {what}")
