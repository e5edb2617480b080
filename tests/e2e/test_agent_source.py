"""End to end: the controller in agent mode (controller.processSource: agent) as a real process
against the devcluster: real apiserver and kwok nodes, a real Prometheus scraping the fake
dcgm-exporter's GPU series and, as a target of its own, the node agent's series it serves for the
test's pods (the one double; the agent itself is tested on the real node by its own tests).

Faults: the agent's target down in Prometheus from the start, then per container a missing,
a stale, and two unseen reports: 0 reclaims, each workload UNKNOWN with its reason on the
verdict's evidence and in `ghostgpu_workloads_without_process_signal`, and no exec at all; one
workload whose counts say finished is reclaimed once the target is up (the path works).
"""

from __future__ import annotations

import json
import ssl
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from test_controller import LEASE_NS, REPO, Controller, deployment, opt_in, wait_for

from ghostgpu.devcluster import DevCluster, FakeDcgmClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

WORKLOADS = ("finished", "missing", "stale", "unseen", "not-running")
# What each shows once the agent's target is up (the evidence's "procs"), and its verdict.
EXPECTED = {
    "finished": ("FINISHED_IDLE", None),
    "missing": ("UNKNOWN", "!missing"),
    "stale": ("UNKNOWN", "!stale"),
    "unseen": ("UNKNOWN", "!no-cgroup-match"),
    "not-running": ("UNKNOWN", "!not-running"),
}


def agent_config(tmp: Path, prometheus_url: str) -> Path:
    cfg = yaml.safe_load((REPO / "examples" / "ghostgpu.yaml").read_text())
    assert cfg["controller"]["processSource"] == "agent"  # the example's own setting
    cfg["controller"].update(
        mode="enforce",
        leaseName=f"ghostgpu-{uuid.uuid4().hex[:8]}",
        pollInterval="2s",
        window=3,
        longWindow=7,
        startupGrace="1s",
        staleAfter="30s",
        prometheus={"url": prometheus_url, "timeout": "5s"},
        autonomy={"tau": 0.4},
    )
    path = tmp / "ghostgpu-agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def apiserver_exec_requests(dc: DevCluster) -> float:
    """Exec requests the apiserver has served (apiserver_request_total, subresource exec)."""
    pki = Path(dc.state.state_dir) / "pki"
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    text = httpx.get(f"{dc.state.server}/metrics", verify=ctx, timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiserver_request_total{") and 'subresource="exec"' in line
    )


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
    dcgm.agent_down(True)  # Prometheus misses the agent's target: every scrape of it fails
    for name, pod in pods.items():
        dcgm.set(ns, pod.metadata.name, util=0.0, fb_used_mib=0)
        seen = {"namespace": ns, "pod": pod.metadata.name, "uid": pod.metadata.uid}
        if name == "finished":  # `sh -c "train.py; sleep infinity"` after training
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

    def procs(name: str) -> object:
        return json.loads(annotations(name).get("ghostgpu.io/evidence", "{}")).get("procs")

    execs_before = apiserver_exec_requests(devcluster)
    ctrl = Controller(devcluster.kubeconfig, agent_config(tmp_path, prometheus_url), tmp_path, "agent")
    try:
        # Target down: no agent series at all, so every workload is UNKNOWN (missing), none reclaimed.
        wait_for(
            lambda: all(annotations(n).get("ghostgpu.io/verdict") == "UNKNOWN" for n in WORKLOADS),
            120,
            "every workload UNKNOWN while the agent's target is down",
        )
        assert {n: procs(n) for n in WORKLOADS} == dict.fromkeys(WORKLOADS, "!missing")
        for name in WORKLOADS:
            evidence = json.loads(annotations(name)["ghostgpu.io/evidence"])
            assert "processes-failed" in evidence["reasons"], (name, evidence)
        assert ctrl.metric("ghostgpu_workloads_without_process_signal", reason="missing") == len(WORKLOADS)
        assert all(apps.read_namespaced_deployment(n, ns).spec.replicas == 1 for n in WORKLOADS)

        # The target up: each container's own series decide.
        dcgm.agent_down(False)
        wait_for(
            lambda: all(
                annotations(n).get("ghostgpu.io/verdict") == verdict and (want is None or procs(n) == want)
                for n, (verdict, want) in EXPECTED.items()
            ),
            120,
            "each workload's verdict from its own agent series",
        )
        wait_for(lambda: apps.read_namespaced_deployment("finished", ns).spec.replicas == 0, 60, "reclaim")
        ctrl.wait_polls(3)
        for name, (verdict, want) in EXPECTED.items():
            replicas = apps.read_namespaced_deployment(name, ns).spec.replicas
            assert replicas == (0 if name == "finished" else 1), (name, replicas, annotations(name))
            if want is not None:
                assert procs(name) == want and annotations(name)["ghostgpu.io/verdict"] == verdict
        assert ctrl.metric("ghostgpu_reclaims_total") == 1  # the finished one, once
        for reason in ("missing", "stale", "no-cgroup-match", "not-running"):
            assert ctrl.metric("ghostgpu_workloads_without_process_signal", reason=reason) == 1, reason
        # agent mode never execs: the apiserver served no exec while this controller ran
        assert apiserver_exec_requests(devcluster) == execs_before
    finally:
        ctrl.stop()
