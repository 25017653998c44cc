"""The Python examples (examples/python, issue 29 §5), run end to end against a real Redis."""

import os
import subprocess
import sys
import json

from conftest import SOURCE_DIR, read_line

EXAMPLES = os.path.join(SOURCE_DIR, "examples", "python")


def run_example(script, *args, **kw):
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args],
                          capture_output=True, text=True, timeout=120, **kw)


def test_acquire_with_timeout_waits_gives_up_and_hands_over(redis_server):
    name = "examples/acquire"
    # The hold must outlast the start of a second interpreter that then waits 0.3 s: a 1.5 s
    # hold was too short on a loaded machine (load 16: the "busy" run acquired after it).
    holder = subprocess.Popen([sys.executable, os.path.join(EXAMPLES, "acquire_with_timeout.py"),
                               "--url", redis_server.url, "--name", name, "--hold", "6"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert read_line(holder, 10.0).startswith(f"acquired {name} token=")
        busy = run_example("acquire_with_timeout.py", "--url", redis_server.url, "--name", name,
                           "--wait", "0.3")
        assert busy.returncode == 3, busy
        assert busy.stdout.startswith(f"busy {name}:"), busy.stdout
        waited = run_example("acquire_with_timeout.py", "--url", redis_server.url, "--name", name,
                             "--wait", "30")
        assert waited.returncode == 0, waited
        assert waited.stdout.startswith(f"acquired {name} token="), waited.stdout
        assert holder.wait(30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_flash_sale_locked_books_balance(redis_server):
    r = run_example("flash_sale.py", "--url", redis_server.url, "--stock", "60", "--requests", "80",
                    "--processes", "4", "--threads", "4", "--think-ms", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["sold"] == 60 and result["left"] == 0 and result["violations"] == []


def test_flash_sale_without_the_lock_oversells_and_is_caught(redis_server):
    r = run_example("flash_sale.py", "--url", redis_server.url, "--stock", "60", "--requests", "80",
                    "--processes", "4", "--threads", "4", "--think-ms", "2", "--no-lock")
    assert r.returncode == 1, r.stdout + r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["violations"], result
    assert "VIOLATION" in r.stdout
