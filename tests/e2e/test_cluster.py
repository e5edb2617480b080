"""The devcluster itself: control plane version, kwok GPU nodes, scheduling, the exec path with
scripted process tables, and fake dcgm-exporter metrics scraped by the real Prometheus."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from kubernetes import client
from polling import eventually

from ghostgpu.devcluster import DevCluster, FakeDcgmClient, ProcessRow, ProcessTables
from ghostgpu.devcluster.nodes import GpuNodeSpec, node_manifest
from ghostgpu.devcluster.paths import read_versions

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _core(dc: DevCluster) -> client.CoreV1Api:
    return client.CoreV1Api(dc.kube.api_client)


def gpu_pod(name: str, gpus: int = 1, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {resource: str(gpus)}}}
            ],
            "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def running_pod(dc: DevCluster, ns: str, manifest: dict[str, Any]) -> client.V1Pod:
    _core(dc).create_namespaced_pod(ns, manifest)
    name = manifest["metadata"]["name"]
    try:
        return eventually(
            lambda: (p := _core(dc).read_namespaced_pod(name, ns)).status.phase == "Running" and p,
            what=f"pod {ns}/{name} Running",
        )
    except AssertionError as e:
        p = _core(dc).read_namespaced_pod(name, ns)
        events = _core(dc).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
        raise AssertionError(f"{e}\nstatus: {p.status}\nevents: {[ev.message for ev in events]}") from None


def test_apiserver_reports_the_pinned_release(devcluster: DevCluster) -> None:
    info = client.VersionApi(devcluster.kube.api_client).get_code()
    assert info.git_version == read_versions()["KUBERNETES_VERSION"]


def test_kwok_gpu_nodes_are_ready_with_gpu_and_mig_capacity(devcluster: DevCluster) -> None:
    nodes = {n.metadata.name: n for n in _core(devcluster).list_node().items}
    assert set(devcluster.state.nodes) <= set(nodes)
    for name in (n for n in devcluster.state.nodes if n.startswith("gpu-")):
        n = nodes[name]
        assert any(c.type == "Ready" and c.status == "True" for c in n.status.conditions), name
        assert any(t.key.startswith("nvidia.com/") for t in n.spec.taints or []), name
    # One node pair per flavor of examples/ghostgpu.yaml: its labels, taints and resource.
    h100, mig = nodes["gpu-h100-0"], nodes["gpu-mig-1g-10gb-0"]
    assert h100.status.allocatable["nvidia.com/gpu"] == "8"
    assert h100.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert mig.status.allocatable["nvidia.com/mig-1g.10gb"] == "14"
    assert mig.metadata.labels["nvidia.com/mig.config"] == "all-1g.10gb"
    assert [t.key for t in mig.spec.taints] == ["nvidia.com/mig"]
    assert "nvidia.com/gpu" not in mig.status.allocatable


def test_a_node_kwok_initialises_again_keeps_its_address(devcluster: DevCluster) -> None:
    """A node whose lease kwok renewed late (Ready lost, as under a 50,000-pod load) is initialised
    again by kwok; it must keep its address, or every exec to its pods fails ("no preferred
    addresses found"). kwok's own node-initialize stage dropped it (components.kwok_stage_config)."""
    core = _core(devcluster)
    name = "gpu-reinit-0"
    core.create_node(node_manifest(GpuNodeSpec(name=name, gpus=8)))
    try:

        def ready() -> client.V1Node | None:
            n = core.read_node(name)
            conditions = n.status.conditions or []
            return n if any(c.type == "Ready" and c.status == "True" for c in conditions) else None

        def addressed() -> client.V1Node | None:
            n = ready()
            return n if n is not None and n.status.addresses else None

        node = eventually(addressed, 60, "kwok to initialise the node")
        addresses = [(a.type, a.address) for a in node.status.addresses]
        assert ("InternalIP", "127.0.0.1") in addresses
        # What the node-lifecycle controller writes when the lease is late: Ready -> Unknown.
        conditions = [
            {
                "type": c.type,
                "status": "Unknown" if c.type == "Ready" else c.status,
                "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
                "lastHeartbeatTime": c.last_heartbeat_time.isoformat(),
                "lastTransitionTime": c.last_transition_time.isoformat(),
            }
            for c in node.status.conditions
        ]
        core.patch_node_status(name, {"status": {"conditions": conditions}})
        again = eventually(ready, 60, "kwok to initialise the node again")
        assert [(a.type, a.address) for a in again.status.addresses] == addresses
        port = node.status.daemon_endpoints.kubelet_endpoint.port
        assert port and again.status.daemon_endpoints.kubelet_endpoint.port == port
    finally:
        core.delete_node(name)


def test_gpu_pods_are_scheduled_onto_matching_kwok_nodes(devcluster: DevCluster, namespace: str) -> None:
    whole = running_pod(devcluster, namespace, gpu_pod("whole", gpus=2))
    assert whole.spec.node_name in {"gpu-h100-0", "gpu-h100-1"}
    mig = running_pod(devcluster, namespace, gpu_pod("mig", resource="nvidia.com/mig-1g.10gb"))
    assert mig.spec.node_name.startswith("gpu-mig-1g-10gb-")
    # More GPUs than any node has: the real scheduler must leave it Pending.
    _core(devcluster).create_namespaced_pod(namespace, gpu_pod("too-big", gpus=9))
    time.sleep(3)
    p = _core(devcluster).read_namespaced_pod("too-big", namespace)
    assert p.status.phase == "Pending" and not p.spec.node_name


def test_exec_through_the_apiserver_prints_the_scripted_process_table(
    devcluster: DevCluster, namespace: str, process_tables: ProcessTables
) -> None:
    running_pod(devcluster, namespace, gpu_pod("worker"))
    with pytest.raises(RuntimeError, match=r"no exec found"):
        process_tables.probe(namespace, "worker")  # nothing scripted: the probe must fail
    rows = [
        ProcessRow(pid=1, stat="Ss", args="python serve.py", etimes=90),
        ProcessRow(pid=42, stat="Z", args="[dataloader] <defunct>", etimes=5),
    ]
    process_tables.set(namespace, "worker", rows)
    out = process_tables.probe(namespace, "worker")
    assert out.splitlines() == [
        "    PID    PPID STAT ELAPSED COMMAND",
        "      1       0 Ss        90 python serve.py",
        "     42       1 Z          5 [dataloader] <defunct>",
    ]
    process_tables.set(namespace, "worker", [ProcessRow(pid=1, stat="S", args="sleep infinity")])
    assert process_tables.probe(namespace, "worker").splitlines()[1:] == [
        "      1       0 S        600 sleep infinity"
    ]
    process_tables.set(namespace, "worker", "boom\n", exit_code=3)
    with pytest.raises(RuntimeError, match=r"\(exit 3\): boom"):
        process_tables.probe(namespace, "worker")
    process_tables.clear(namespace, "worker")

    def probe_fails() -> bool:
        try:
            process_tables.probe(namespace, "worker")
        except RuntimeError:
            return True
        return False

    eventually(probe_fails, timeout=20, what="probe to fail again after clear")


def _prom_value(url: str, query: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=5)
    r.raise_for_status()
    return list(r.json()["data"]["result"])


def test_fake_dcgm_metrics_reach_prometheus(dcgm: FakeDcgmClient, prometheus_url: str) -> None:
    dcgm.set("team-a", "nb-0", util=37, fb_used_mib=2048, xid=0, node="gpu-h100-1", gpu=3)
    series = eventually(
        lambda: _prom_value(prometheus_url, 'DCGM_FI_DEV_GPU_UTIL{namespace="team-a",pod="nb-0"} == 37'),
        timeout=30,
        what="utilization 37 in Prometheus",
    )
    labels = series[0]["metric"]
    assert labels["container"] == "main" and labels["Hostname"] == "gpu-h100-1" and labels["gpu"] == "3"
    assert labels["UUID"].startswith("GPU-") and labels["modelName"]
    fb = _prom_value(prometheus_url, 'DCGM_FI_DEV_FB_USED{namespace="team-a",pod="nb-0"}')
    assert fb[0]["value"][1] == "2048"
    dcgm.set("team-a", "nb-0", util=0, xid=79)
    eventually(
        lambda: (
            _prom_value(prometheus_url, 'DCGM_FI_DEV_XID_ERRORS{pod="nb-0"} == 79')
            and _prom_value(prometheus_url, 'DCGM_FI_DEV_GPU_UTIL{pod="nb-0"} == 0')
        ),
        timeout=30,
        what="xid 79 and utilization 0 in Prometheus",
    )
