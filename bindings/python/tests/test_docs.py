"""Every Python example in docs/python.md and the README runs (against a real Redis through
$DISTLOCK_URL)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR


def python_blocks(path):
    with open(path) as f:
        text = f.read()
    return re.findall(r"```python\n(.*?)```", text, re.S)


DOCS = [(doc, i, block) for doc in ("docs/python.md", "README.md")
        for i, block in enumerate(python_blocks(os.path.join(SOURCE_DIR, doc)))]


def test_the_docs_have_examples():
    assert sum(1 for d in DOCS if d[0] == "docs/python.md") >= 4
    assert any(d[0] == "README.md" for d in DOCS)


@pytest.mark.parametrize("doc,index,block", DOCS, ids=[f"{d}#{i}" for d, i, _ in DOCS])
def test_doc_example_runs(redis_server, doc, index, block):
    env = dict(os.environ, DISTLOCK_URL=redis_server.url, DISTLOCK_LOG="error")
    r = subprocess.run([sys.executable, "-c", block], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, f"{doc} example {index} failed:\n{block}\n{r.stdout}\n{r.stderr}"
