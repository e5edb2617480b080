"""`ghostgpu devcluster demo` as a person runs it, non-interactively: its own devcluster with a real
node, the fleet's verdicts from the real processes, the Kueue Job admitted once the ghosts are
stopped, one restore, and then nothing of it left on the machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_real_node import host_traces

from ghostgpu.devcluster import realnode
from ghostgpu.devcluster.demo import FLEET, JOB_NAME, RESEARCH, RESTORED

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.real_node, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


def final_table(out: str) -> dict[str, list[str]]:
    """The rows of the demo's last table ("demo result"), by workload: kind, verdict, expected,
    replicas, outcome."""
    assert "demo result" in out, out[-3000:]
    rows: dict[str, list[str]] = {}
    for line in out.rsplit("demo result", 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 6 and "/" in cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def processes_naming(path: Path) -> list[str]:
    """Command lines of running processes that mention path (the demo's cluster and controllers)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if str(path) in cmd:
            found.append(f"{proc.name}: {cmd}")
    return found


def other_kubelets(state: Path) -> list[str]:
    return [c for c in realnode._cmdlines_matching("kubelet").values() if str(state) not in c]


def test_demo_runs_to_completion_and_leaves_the_machine_as_it_was(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    sysctls, others = realnode.read_sysctls(), other_kubelets(state)
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "ghostgpu.cli", "devcluster", "demo", "--state-dir", str(state),
         "--polls", "3"],
        capture_output=True, text=True, cwd=REPO, timeout=540, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    print(r.stdout)
    print(f"demo wall time {time.monotonic() - t0:.0f}s")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stdout + r.stderr

    rows = final_table(r.stdout)
    for w in FLEET:
        kind, verdict, _expected, replicas, outcome = rows[f"{w.namespace}/{w.name}"]
        assert (kind, verdict) == (w.kind, w.expect), rows
        if w is RESTORED:
            assert (replicas, outcome) == ("1", "stopped, restored")
        elif w.expect == "ACTIVE":
            assert (replicas, outcome) == ("1", "kept running")
        else:
            assert (replicas, outcome) == ("0", "stopped")
    assert rows[f"{RESEARCH}/{JOB_NAME}"][-1] == "admitted"
    # After shadow, before the ghosts were stopped, Kueue found the Job did not fit on the node.
    shadow = r.stdout.split("enforce mode", 1)[0]
    assert f"Kueue Job {RESEARCH}/{JOB_NAME} (12 GPUs): waiting" in shadow
    restored = f"{RESTORED.kind.lower()}/{RESTORED.name} in {RESTORED.namespace} to 1 replicas"
    assert f"restored {restored}" in r.stdout
    assert "fake dcgm-exporter (the one double" in r.stdout

    assert "cleaned up" in r.stdout
    assert host_traces(state) == {"mounts": [], "cgroups": [], "shims": [], "kubelet": False}
    assert processes_naming(state) == []
    if not others and not other_kubelets(state):
        # Another real node on the machine (a parallel test session) holds them as its kubelet set
        # them, and the last one to stop puts the host's values back: comparable only when alone.
        assert realnode.read_sysctls() == sysctls


def test_demo_refuses_a_state_dir_whose_cluster_runs_without_touching_it(tmp_path: Path) -> None:
    """A running devcluster in --state-dir is the user's: the demo says so and leaves it be. Here a
    recorded process that is this test's own sleep stands for it (no second cluster needed)."""
    from ghostgpu.devcluster import ClusterState
    from ghostgpu.devcluster.procs import ProcessRecord

    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        rec = ProcessRecord.model_validate(
            {"name": "etcd", "pid": sleeper.pid, "log": str(tmp_path / "etcd.log"), "argv0": "sleep"}
        )
        state = ClusterState(
            state_dir=str(tmp_path), kubeconfig=str(tmp_path / "kubeconfig"), server="https://127.0.0.1:1",
            ports={}, processes=[rec],
        )  # fmt: skip
        (tmp_path / "state.json").write_text(state.model_dump_json())
        r = subprocess.run(
            [sys.executable, "-m", "ghostgpu.cli", "devcluster", "demo", "--state-dir", str(tmp_path)],
            capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert r.returncode == 2, r.stdout + r.stderr
        assert "already runs" in r.stderr
        assert "fix: stop it with `ghostgpu devcluster down --state-dir" in r.stderr
        assert "Traceback" not in r.stderr
        assert sleeper.poll() is None, "the running cluster's process was left alone"
    finally:
        sleeper.kill()
        sleeper.wait()
