"""End to end with VictoriaMetrics as the only metrics store: a devcluster of its own whose `prometheus`
addon runs VictoriaMetrics' single-node server (hack/testbin victoriametrics) in Prometheus's place,
scraping the fake dcgm-exporter and the node agent's series with the devcluster's scrape config,
and the unchanged controller pointed at it through `controller.prometheus.url` (docs/victoriametrics.md).

- The poll's one query reads what was scraped last, not what VictoriaMetrics' default
  `-search.latencyOffset` (30 s) would answer, and a series that vanished is a failure, not zero.
- Agent mode, enforce: a ghost (its agent counts say finished) is reclaimed and `ghostgpu restore`
  brings it back; a busy pod and an idle pod whose agent counts say it still works are never touched.

No Kueue, Kyverno, real node or extra CRDs: the controller needs none of them here, and the cluster
starts in a fraction of the full devcluster's time.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cli_runs import restore
from kubernetes import client
from test_controller import LEASE_NS, Controller, controller_config, deployment, opt_in, wait_for

from ghostgpu.config import MetricsConfig
from ghostgpu.devcluster import DevCluster
from ghostgpu.devcluster.paths import Toolchain
from ghostgpu.devcluster.victoriametrics import VICTORIAMETRICS
from ghostgpu.signals.agent import SCAN_METRIC
from ghostgpu.signals.prometheus import QUERY_PARAMS, PrometheusClient
from ghostgpu.signals.utilization import PodKey, QuerySpec, UtilizationSource
from ghostgpu.verdict import SignalFailure

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

# VictoriaMetrics shows a scraped sample to queries up to about 4 s later (docs/victoriametrics.md).
INGEST_DELAY_S = 5


def _missing() -> list[str]:
    try:
        return Toolchain.locate().missing(
            "etcd", "kube_apiserver", "kube_controller_manager", "kube_scheduler", "kwok", "victoriametrics"
        )
    except FileNotFoundError as exc:
        return [str(exc)]


@pytest.fixture(scope="module")
def vm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    missing = _missing()
    if missing:
        pytest.skip("devcluster binaries not built (run hack/testbin): " + ", ".join(missing))
    cluster = DevCluster.up(
        tmp_path_factory.mktemp("vm-devcluster"),
        addons=("prometheus",),
        real_node=False,
        extra_crds=False,
        metrics_store=VICTORIAMETRICS,
    )
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def ns(vm_cluster: DevCluster) -> Iterator[str]:
    name = f"vm-{uuid.uuid4().hex[:8]}"
    vm_cluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    vm_cluster.dcgm.clear()
    vm_cluster.kube.delete("v1", "Namespace", name)


def running_pod(cluster: DevCluster, ns: str, app: str) -> Any:
    pods = client.CoreV1Api(cluster.kube.api_client).list_namespaced_pod(ns, label_selector=f"app={app}")
    live = [p for p in pods.items if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    return live[0] if len(live) == 1 else None


def visible(cluster: DevCluster, selector: str) -> int:
    """How many series of `selector` a query sees now."""
    form = {"query": f"count({selector})", **QUERY_PARAMS}
    r = httpx.post(f"{cluster.state.prometheus_url}/api/v1/query", data=form, timeout=5).json()
    return int(float(r["data"]["result"][0]["value"][1])) if r["data"]["result"] else 0


def test_the_store_is_victoriametrics(vm_cluster: DevCluster) -> None:
    url = vm_cluster.state.prometheus_url
    assert vm_cluster.state.metrics_store == VICTORIAMETRICS
    # What answers at the URL the controller is given: VictoriaMetrics' own build, not Prometheus.
    metrics = httpx.get(f"{url}/metrics", timeout=5).text
    assert "vm_app_version{" in metrics and "prometheus_build_info" not in metrics
    assert [p.name for p in vm_cluster.state.processes if p.name in ("prometheus", "victoriametrics")] == [
        "victoriametrics"
    ]


def test_the_poll_reads_the_newest_samples_and_a_vanished_series_fails(
    vm_cluster: DevCluster, ns: str
) -> None:
    """The controller's query, as its poll sends it: work that resumes shows within seconds
    (VictoriaMetrics' default answer near `now` is 30 s old, which would still read idle), and a pod
    whose series is gone reads as a failure."""
    # As the controller sizes it: two 1 s scrapes and the store's ingest delay (INGEST_DELAY).
    spec = QuerySpec.from_preset(MetricsConfig().dcgm, max_sample_age=10, window=2 + INGEST_DELAY_S)
    pod = PodKey(ns, "train-0")

    async def read() -> Any:
        async with PrometheusClient(vm_cluster.state.prometheus_url, timeout=5) as prom:
            return (await UtilizationSource(prom, spec).poll([pod], now=time.time()))[pod].utilization

    vm_cluster.dcgm.set(ns, pod.name, util=0.0, fb_used_mib=1000)
    wait_for(lambda: asyncio.run(read()) == 0.0, 30, "the idle reading")
    vm_cluster.dcgm.set(ns, pod.name, util=80.0, fb_used_mib=1000)
    t0 = time.monotonic()
    wait_for(lambda: asyncio.run(read()) == 80.0, 20, "the busy reading")
    assert time.monotonic() - t0 < 10, "the busy reading came more than 10 s late: the latency offset is back"
    vm_cluster.dcgm.remove(ns, pod.name)

    def failed() -> SignalFailure | None:
        reading = asyncio.run(read())
        return reading if isinstance(reading, SignalFailure) else None

    failure = wait_for(failed, 30, "a failure")
    assert failure.reason.value in ("missing", "stale"), failure


def test_ghost_reclaimed_and_restored_busy_never_touched(
    vm_cluster: DevCluster, ns: str, tmp_path: Path
) -> None:
    kube = vm_cluster.kube
    apps = client.AppsV1Api(kube.api_client)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    workloads = ("ghost", "busy", "working")
    for name in workloads:
        kube.apply(deployment(name, ns))
    pods = {n: wait_for(lambda n=n: running_pod(vm_cluster, ns, n), 90, f"{n} running") for n in workloads}
    dcgm = vm_cluster.dcgm
    for name, pod in pods.items():
        seen = {"namespace": ns, "pod": pod.metadata.name, "uid": pod.metadata.uid}
        dcgm.set(ns, pod.metadata.name, util=85.0 if name == "busy" else 0.0, fb_used_mib=0)
        # ghost: `sh -c "train.py; sleep infinity"` after training; working: its work process runs
        dcgm.agent(**seen, roles={"wrapper": 1, "holder": 1} if name == "ghost" else {"work": 1})
    # Every series in the store before the controller's first poll: a pod without them would first
    # read UNKNOWN, and the busy pod's ACTIVE after it would then be written.
    for selector in (
        f'DCGM_FI_DEV_GPU_UTIL{{namespace="{ns}"}}',
        f'{SCAN_METRIC}{{tracked_namespace="{ns}"}}',
    ):
        wait_for(lambda s=selector: visible(vm_cluster, s) == 3, 30, f"{selector} in the store")
    opt_in(vm_cluster, ns)

    def annotations(name: str) -> dict[str, str]:
        return apps.read_namespaced_deployment(name, ns).metadata.annotations or {}

    def replicas(name: str) -> int:
        return int(apps.read_namespaced_deployment(name, ns).spec.replicas)

    config = controller_config(tmp_path, vm_cluster.state.prometheus_url, "enforce", process_source="agent")
    doc = yaml.safe_load(config.read_text())
    doc["controller"]["prometheus"]["ingestDelay"] = f"{INGEST_DELAY_S}s"
    config.write_text(yaml.safe_dump(doc))
    ctrl = Controller(vm_cluster.kubeconfig, config, tmp_path, "vm")
    try:
        wait_for(lambda: replicas("ghost") == 0, 90, "the ghost reclaimed")
        assert annotations("ghost")["ghostgpu.io/verdict"] == "FINISHED_IDLE"
        evidence = json.loads(annotations("ghost")["ghostgpu.io/evidence"])
        assert "holders-only" in evidence["reasons"], evidence
        wait_for(lambda: annotations("working").get("ghostgpu.io/verdict") == "IDLE_HELD", 30, "working held")
        ctrl.wait_polls(3)  # more polls: nothing else is touched
        assert {n: replicas(n) for n in workloads} == {"ghost": 0, "busy": 1, "working": 1}
        assert "ghostgpu.io/verdict" not in annotations("busy")  # plainly busy: nothing written
        assert ctrl.metric("ghostgpu_reclaims_total", namespace=ns) == 1
    finally:
        ctrl.stop()
    out = restore(vm_cluster, "deployment/ghost", ns)
    assert out.returncode == 0, out.stderr
    assert replicas("ghost") == 1 and "ghostgpu.io/reclaimed-from-replicas" not in annotations("ghost")
    wait_for(lambda: running_pod(vm_cluster, ns, "ghost"), 60, "the ghost running again")
