"""hack/test runs `--dist loadgroup` and tests/e2e/conftest.py keeps a module that shares a module
fixture in one worker with an `xdist_group` mark. pytest 9.2 stopped reading the node id xdist 3.8
rewrites for that, and the groups split silently; this guards the pair of versions installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CONFTEST = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "grouped" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("grouped"))
"""

TESTS = """
import os

def _record(name):
    with open(os.environ["WORKER_LOG"], "a") as f:
        f.write(name + ' ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')

TESTS_HERE
"""


def test_a_grouped_module_runs_in_one_worker(tmp_path: Path) -> None:
    body = "\n".join(f"def test_{i}():\n    _record('{{m}}-{i}')\n" for i in range(4))
    for module in ("grouped", "free"):
        (tmp_path / f"test_{module}.py").write_text(TESTS.replace("TESTS_HERE", body.replace("{m}", module)))
    (tmp_path / "conftest.py").write_text(CONFTEST)
    log = tmp_path / "workers.log"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env={"WORKER_LOG": str(log), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line.split() for line in log.read_text().splitlines()]
    assert len(rows) == 8
    # What loadgroup schedules by: the group's name appended to each grouped test's node id. Which
    # worker runs a free test depends on timing; where the grouped ones ran does not.
    passed = [line for line in run.stdout.splitlines() if "PASSED test_grouped.py::" in line]
    assert len(passed) == 4 and all(line.rstrip().endswith("@grouped") for line in passed), run.stdout
    assert len({worker for name, worker in rows if name.startswith("grouped")}) == 1, rows
