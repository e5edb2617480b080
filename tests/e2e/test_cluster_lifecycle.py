"""`up` → `status` → `down` on a second, minimal devcluster: down leaves no process and no port."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.devcluster import DevCluster, down, procs, status
from ghostgpu.devcluster.paths import Toolchain

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CORE = ("etcd", "kube_apiserver", "kube_controller_manager", "kube_scheduler", "kwok")
CORE += ("monitoring_crd_dir", "argocd_crd_dir", "flux_crd_dir", "owner_crd_dir")


def test_up_status_down_leaves_nothing_running(tmp_path: Path) -> None:
    missing = Toolchain.locate().missing(*CORE)
    if missing:
        pytest.skip("devcluster binaries not built (run hack/testbin): " + ", ".join(missing))
    # Minimal: no real node (tests/e2e/test_real_node.py stops and restarts one).
    cluster = DevCluster.up(tmp_path, addons=(), real_node=False)
    try:
        state = status(tmp_path)
        assert state is not None and all(state.running().values())
        assert {p.name for p in state.processes} == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        }
        assert DevCluster.attach(tmp_path) is not None
        assert DevCluster.up(tmp_path, addons=(), real_node=False).state.server == cluster.state.server
        res = CliRunner().invoke(app, ["devcluster", "status", "--state-dir", str(tmp_path)])
        assert res.exit_code == 0 and "kube-apiserver" in res.output and "STOPPED" not in res.output
    finally:
        stopped = down(tmp_path)
    assert "etcd" in stopped and "kube-apiserver" in stopped
    assert not any(procs.alive(p) for p in cluster.state.processes)
    assert not [port for port in cluster.state.ports.values() if procs.port_open(port)]
    assert DevCluster.attach(tmp_path) is None
    res = CliRunner().invoke(app, ["devcluster", "status", "--state-dir", str(tmp_path)])
    assert res.exit_code == 1 and "STOPPED" in res.output
    assert down(tmp_path) == []  # idempotent


def test_status_without_a_cluster_says_so(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["devcluster", "status", "--state-dir", str(tmp_path / "none")])
    assert res.exit_code == 1 and "not started" in res.output
