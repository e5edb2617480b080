"""End to end: the controller in agent mode (controller.processSource: agent) as a real process
against the devcluster: real apiserver and kwok nodes, a real Prometheus scraping the fake
dcgm-exporter's GPU series and, as a target of its own, the node agent's series it serves for the
test's pods (the one double; the agent itself is tested on the real node by its own tests).

Faults: per container a missing, a stale and two unseen reports, then the agent's target down in
Prometheus: none of them reclaimed, each UNKNOWN with its reason on the verdict's evidence and in
`ghostgpu_workloads_without_process_signal`, and no exec at all. The path works: a workload whose
counts say finished is reclaimed, and one that goes idle while the target is down only once it is
back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from test_controller import LEASE_NS, REPO, Controller, controller_config, deployment, opt_in, wait_for

from ghostgpu.devcluster import DevCluster, FakeDcgmClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

FAULTS = ("missing", "stale", "unseen", "not-running")
WORKLOADS = ("finished", *FAULTS, "held-back")
# What each fault shows on its first verdict (the evidence's "procs").
EXPECTED = {
    "missing": "!missing",  # no series for the container: agent not reporting it
    "stale": "!stale",
    "unseen": "!no-cgroup-match",
    "not-running": "!not-running",
}


def prom_series(prometheus_url: str, selector: str) -> list[dict[str, str]]:
    """The label sets of the series Prometheus holds for `selector` over the last 30 s."""
    params = {"match[]": selector, "start": f"{time.time() - 30:.3f}"}
    r = httpx.get(f"{prometheus_url}/api/v1/series", params=params, timeout=10)
    r.raise_for_status()
    return list(r.json()["data"])


def agent_config(tmp: Path, prometheus_url: str) -> Path:
    example = yaml.safe_load((REPO / "examples" / "ghostgpu.yaml").read_text())
    assert example["controller"]["processSource"] == "agent"  # the example's own setting
    return controller_config(tmp, prometheus_url, "enforce", process_source="agent")


def test_agent_faults_never_reclaim_and_say_why(
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    kube = devcluster.kube
    core, apps = client.CoreV1Api(kube.api_client), client.AppsV1Api(kube.api_client)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    ns = make_namespace({}, prefix="agent")
    for name in WORKLOADS:
        kube.apply(deployment(name, ns))

    def running(name: str) -> Any:
        pods = core.list_namespaced_pod(ns, label_selector=f"app={name}").items
        live = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return live[0] if len(live) == 1 else None

    pods = {n: wait_for(lambda n=n: running(n), 90, f"{n} running") for n in WORKLOADS}
    for name, pod in pods.items():
        # held-back is busy until the agent's target is down
        dcgm.set(ns, pod.metadata.name, util=90.0 if name == "held-back" else 0.0, fb_used_mib=0)
        seen = {"namespace": ns, "pod": pod.metadata.name, "uid": pod.metadata.uid}
        if name in ("finished", "held-back"):  # `sh -c "train.py; sleep infinity"` after training
            dcgm.agent(**seen, roles={"wrapper": 1, "holder": 1})
        elif name == "stale":  # an agent whose scans stopped an hour ago
            dcgm.agent(**seen, roles={"wrapper": 1, "holder": 1}, scan_timestamp=time.time() - 3600)
        elif name == "unseen":
            dcgm.agent(**seen, unseen="no-cgroup-match")
        elif name == "not-running":
            dcgm.agent(**seen, unseen="not-running")
    opt_in(devcluster, ns)

    def annotations(name: str) -> dict[str, str]:
        return apps.read_namespaced_deployment(name, ns).metadata.annotations or {}

    def verdict(name: str) -> str | None:
        return annotations(name).get("ghostgpu.io/verdict")

    def evidence(name: str) -> dict[str, Any]:
        return dict(json.loads(annotations(name).get("ghostgpu.io/evidence", "{}")))

    def replicas(name: str) -> int:
        return int(apps.read_namespaced_deployment(name, ns).spec.replicas)

    ctrl = Controller(devcluster.kubeconfig, agent_config(tmp_path, prometheus_url), tmp_path, "agent")
    try:
        # 1. Each container's own series decide: finished is reclaimed, every fault is UNKNOWN with
        # its reason on the verdict's evidence.
        wait_for(lambda: replicas("finished") == 0, 120, "the finished workload reclaimed")
        wait_for(lambda: all(verdict(n) == "UNKNOWN" for n in FAULTS), 60, "every fault UNKNOWN")
        for name, procs in EXPECTED.items():
            ev = evidence(name)
            assert "processes-failed" in ev["reasons"] and ev["procs"] == procs, (name, ev)
        assert verdict("finished") == "FINISHED_IDLE" and "holders-only" in evidence("finished")["reasons"]
        # What Prometheus holds for it: the roles with processes and the scan time, no zero series.
        finished = pods["finished"].metadata.name
        held = prom_series(
            prometheus_url, f'{{__name__=~"ghostgpu_agent_container_.+", tracked_pod="{finished}"}}'
        )
        assert sorted((m["__name__"], m.get("role", "")) for m in held) == [
            ("ghostgpu_agent_container_processes", "holder"),
            ("ghostgpu_agent_container_processes", "wrapper"),
            ("ghostgpu_agent_container_scan_timestamp_seconds", ""),
        ], held
        for procs in EXPECTED.values():
            reason = procs[1:]
            assert ctrl.metric("ghostgpu_workloads_without_process_signal", reason=reason) == 1, reason

        # 2. Prometheus misses the agent's target (every scrape of it fails) as held-back goes idle:
        # no series for any container, so held-back is UNKNOWN (missing) and is not reclaimed.
        dcgm.agent_down(True)
        dcgm.set(ns, pods["held-back"].metadata.name, util=0.0, fb_used_mib=0)
        wait_for(lambda: verdict("held-back") == "UNKNOWN", 90, "held-back UNKNOWN with the target down")
        assert evidence("held-back")["procs"] == "!missing"
        ctrl.wait_polls(3)
        assert ctrl.metric("ghostgpu_workloads_without_process_signal", reason="missing") == 1 + len(FAULTS)
        assert all(replicas(n) == 1 for n in (*FAULTS, "held-back"))

        # 3. The target back: held-back's counts say finished, and only now is it reclaimed.
        dcgm.agent_down(False)
        wait_for(lambda: replicas("held-back") == 0, 90, "held-back reclaimed once the target is up")
        assert all(replicas(n) == 1 for n in FAULTS)
        assert ctrl.metric("ghostgpu_reclaims_total") == 2  # finished and held-back, once each
        # That agent mode never execs is shown where nothing else shares the count: a whole
        # reconciler in agent mode through a counting executor (tests/unit/test_signals_agent.py,
        # test_agent_mode_wires_no_exec_and_exec_mode_still_does).
        # The apiserver's exec count here is cluster-wide, and other tests' processes in this
        # worker's cluster may exec meanwhile (151 against 150 in one CI run).
    finally:
        ctrl.stop()
