"""Every panel of the Grafana dashboard (ghostgpu/dashboard/panels.py) against the devcluster's
real Prometheus, scraping real `ghostgpu controller` processes (registered as file_sd targets):
first a shadow controller, then an enforce one with the default risk gate, over test_controller's
fleet, with the rendered bundles applied (Kueue's ClusterQueues give the accounting gap its
nominal quota). The devcluster's h100 nodes (two kwok nodes and the real node) hold more GPUs than
the example's teams have as quota, so the run adds a ClusterQueue with the rest, as in a cluster
whose quota is its capacity: Kueue then believes every h100 GPU free that no Kueue workload holds,
and the h100 gap is what the fleet holds outside Kueue; it narrows when the ghosts are reclaimed.
Each query must return series; the one exception is the reverts query, whose
metric (ghostgpu_reclaim_reverts_total) the controller does not export yet.

The PNG preview is drawn from the same run through `ghostgpu dashboard preview`. With
GHOSTGPU_DASHBOARD_PREVIEW=docs/dashboard.png the run lasts longer and the PNG (and the query
results, as .json beside it) go there: that is how docs/dashboard.png is made.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from test_controller import H100, LEASE_NS, REPO, Controller, Scenario, controller_config, wait_for

from ghostgpu.dashboard.preview import Preview
from ghostgpu.devcluster import DevCluster, FakeDcgmClient, ProcessTables
from ghostgpu.quantity import Quantity

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

PREVIEW = os.environ.get("GHOSTGPU_DASHBOARD_PREVIEW")
GPU = "nvidia.com/gpu"
REST_QUEUE = "dashboard-h100-rest"
CQ = "kueue.x-k8s.io/v1beta2"


def _h100_rest(devcluster: DevCluster) -> int:
    """The h100 GPUs the nodes have beyond every ClusterQueue's h100 nominal quota."""
    core = client.CoreV1Api(devcluster.kube.api_client)
    selector = ",".join(f"{k}={v}" for k, v in H100.items())
    nodes = core.list_node(label_selector=selector).items
    capacity = sum(int(Quantity(str((n.status.allocatable or {}).get(GPU, "0"))).value) for n in nodes)
    quota = 0.0
    for cq in devcluster.kube.resource(CQ, "ClusterQueue").get().to_dict()["items"]:
        for group in cq["spec"].get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                if flavor["name"] != "h100":
                    continue
                for r in flavor["resources"]:
                    if r["name"] == GPU:
                        quota += float(Quantity(str(r["nominalQuota"])).value)
    return max(0, capacity - int(quota))


def _rest_queue(gpus: int) -> dict:
    flavors = [{"name": "h100", "resources": [{"name": GPU, "nominalQuota": str(gpus)}]}]
    return {
        "apiVersion": CQ,
        "kind": "ClusterQueue",
        "metadata": {"name": REST_QUEUE},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": [GPU], "flavors": flavors}],
        },
    }


def _start(devcluster: DevCluster, config: Path, tmp_path: Path, name: str) -> Controller:
    c = Controller(devcluster.kubeconfig, config, tmp_path, name)
    wait_for(lambda: c.port or c.proc.poll() is not None, 60, f"{name} to bind its port")
    assert c.port, c.log_path.read_text()[-2000:]
    devcluster.scrape(name, c.port)
    return c


def _stop(devcluster: DevCluster, c: Controller) -> None:
    devcluster.unscrape(c.name)
    c.stop()


def _last(preview: Preview, title_start: str, legend: str) -> dict[str, float]:
    """{series name: last value} of one query of one panel."""
    [panel] = [p for p in preview.panels if p.title.startswith(title_start)]
    [query] = [q for q in panel.queries if q.legend == legend]
    return {s.name: s.points[-1][1] for s in query.series}


def test_every_panel_query_returns_series(
    devcluster: DevCluster,
    applied_bundles: dict[str, list[str]],
    make_namespace: Callable[..., str],
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    assert not any(applied_bundles.values()), applied_bundles
    devcluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    ns = make_namespace({}, prefix="dash")
    sc = Scenario(devcluster, ns, process_tables, dcgm)
    rest = _h100_rest(devcluster)
    if rest:
        devcluster.kube.apply(_rest_queue(rest))
    start = time.time()
    sc.create()
    controllers: list[Controller] = []
    try:
        # Shadow: counts the reclaims it would take.
        shadow = _start(
            devcluster, controller_config(tmp_path, prometheus_url, "shadow"), tmp_path, "dash-shadow"
        )
        controllers.append(shadow)
        wait_for(lambda: shadow.metric("ghostgpu_would_reclaims_total") > 0, 120, "shadow would-reclaims")
        shadow.wait_polls(12 if PREVIEW else 2)
        _stop(devcluster, shadow)

        # Enforce with the default risk gate: Deployments are scaled to 0, bare pods escalated.
        config = controller_config(tmp_path, prometheus_url, "enforce")
        cfg = yaml.safe_load(config.read_text())
        cfg["controller"]["autonomy"] = {}
        config.write_text(yaml.safe_dump(cfg))
        enforce = _start(devcluster, config, tmp_path, "dash-enforce")
        controllers.append(enforce)
        wait_for(
            lambda: (
                enforce.metric("ghostgpu_reclaims_total") > 0
                and enforce.metric("ghostgpu_escalations_total") > 0
            ),
            120,
            "a reclaim and an escalation",
        )
        enforce.wait_polls(30 if PREVIEW else 3)  # every reclaimable workload acted on by now
        reclaims = enforce.metric("ghostgpu_reclaims_total")
        escalations = enforce.metric("ghostgpu_escalations_total")
        time.sleep(2)  # Prometheus scrapes every second: let it take these values
    finally:
        for c in controllers:
            _stop(devcluster, c)
        for name in sc.pods.values():
            process_tables.clear(ns, name)
        if rest:
            devcluster.kube.delete(CQ, "ClusterQueue", REST_QUEUE)
    end = time.time()

    out = Path(PREVIEW) if PREVIEW else tmp_path / "dashboard.png"
    results = out.with_suffix(".json")
    run = subprocess.run(
        [sys.executable, "-m", "ghostgpu.cli", "dashboard", "preview", "--prometheus", prometheus_url,
         "--start", f"{start:.0f}", "--end", f"{end:.0f}", "-o", str(out), "--json-out", str(results)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert out.read_bytes()[:4] == b"\x89PNG"
    preview = Preview.model_validate_json(results.read_text())

    for panel in preview.panels:
        for q in panel.queries:
            if q.empty_ok:  # the reverts query: allowed to be empty until the metric exists
                print(f"{panel.title}: {q.legend}: {len(q.series)} series ({q.empty_ok})")
                continue
            assert q.series, f"{panel.title}: no series for {q.expr}"

    # The numbers are the controller's own, including the first increment of each new series.
    assert sum(_last(preview, "Reclaims", "reclaimed {{verdict}}").values()) == reclaims
    assert sum(_last(preview, "Reclaims", "escalated {{action}}").values()) == escalations
    assert sum(_last(preview, "Reclaims", "would reclaim (shadow) {{verdict}}").values()) > 0
    assert _last(preview, "Signal failures", "{{source}}: {{reason}}").get("utilization: missing", 0) > 0
    outside = _last(preview, "GPUs held outside Kueue", "{{verdict}}")
    assert outside.get("ACTIVE", 0) >= 3, outside
    flavors = _last(preview, "Accounting gap", "{{flavor}} Kueue believes free")
    assert set(flavors) == {"h100 Kueue believes free", "mig-1g-10gb Kueue believes free"}, flavors
    assert flavors["h100 Kueue believes free"] > 0, flavors
    assert max(_last(preview, "Poll duration", "p95").values()) > 0
    # Quota is the h100 capacity, so the gap is what is held outside Kueue, and the reclaims close
    # part of it: the ghosts' GPUs (1 each) come free, the live and escalated workloads keep theirs.
    [gap] = [s for p in preview.panels if p.title.startswith("Accounting gap") for q in p.queries
             if q.legend == "{{flavor}} gap" for s in q.series if s.name == "h100 gap"]  # fmt: skip
    widest, last = max(v for _, v in gap.points), gap.points[-1][1]
    assert widest >= len(Scenario.FLEET) and last < widest, (widest, last)
