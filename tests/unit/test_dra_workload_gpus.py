"""A DRA workload's own GPU count is the devices its pods hold through their ResourceClaims (its
template names a ResourceClaimTemplate, no GPU): the decision log's GPUs, the risk gate's GPU count,
the escalation's facts and the GPU-hours a reclaim recovers count them like device-plugin GPUs; the
ghost gauge labels each device with the flavor of its own class."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_controller_reconciler import FINISHED, IS_GPU, NS, Harness, deployment, pod_for
from test_dra_count import FLAVORS, claim, exactly

from ghostgpu.config import ControllerConfig
from ghostgpu.controller.app import _escalator
from ghostgpu.controller.books.accounting import node_labels_for_books
from ghostgpu.controller.claims import DraCounter, claim_view
from ghostgpu.controller.inventory import WorkloadRef, dra_gpus_of, pod_view, workload_from
from ghostgpu.controller.judge.planner import facts_for
from ghostgpu.controller.reconciler import Snapshot


def dra_deployment(name: str) -> dict[str, Any]:
    d = deployment(name)
    d["spec"]["template"]["spec"] = {
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}],
        "containers": [{"name": "main", "resources": {"claims": [{"name": "gpus"}]}}],
    }
    return d


def dra_pod(name: str) -> dict[str, Any]:
    p = pod_for(name)
    p["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}]
    p["spec"]["containers"] = [{"name": "main", "resources": {"claims": [{"name": "gpus"}]}}]
    p["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}]
    return p


class DraHarness(Harness):
    """The reconciler harness with ResourceClaims: the snapshot counts the pods' DRA devices as
    the controller's Informers do."""

    def __init__(self, tmp: Path, **cfg: Any) -> None:
        super().__init__(tmp, **cfg)
        self.claims: dict[tuple[str, str], Any] = {}
        # the harness's pods run on gpu-0: a node of the DRA flavors h100-dra and mig-dra
        node = {"metadata": {"name": "gpu-0", "labels": {"pool": "dra"}}, "status": {"allocatable": {}}}
        self.nodes = [{**node, **node_labels_for_books(node, FLAVORS)}]

    def add_dra(self, name: str, *, devices: int, table: str, migs: int = 0) -> None:
        self.objects[WorkloadRef("Deployment", NS, name)] = dra_deployment(name)
        pod = dra_pod(name)
        self.pods.append(pod)
        self.util.values[name] = 0.0
        self.exec.tables[name] = table
        gpus = [("gpus", f"gpu-{i}") for i in range(devices)] + [("migs", f"mig-{i}") for i in range(migs)]
        requests = [exactly("gpus", "gpu.nvidia.com", devices), exactly("migs", "mig.nvidia.com", migs)]
        c = claim(f"{name}-gpus", gpus, requests, [pod["metadata"]["uid"]])
        self.claims[(NS, f"{name}-gpus")] = claim_view(c)

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        snap.pods = DraCounter(["gpu.nvidia.com", "mig.nvidia.com"]).pods(snap.pods, self.claims)
        snap.nodes = self.nodes
        return snap


def decision_rows(h: Harness) -> dict[str, float]:
    return {
        row["workload"].rsplit("/", 1)[-1]: row["gpus"]
        for row in map(json.loads, h.log.read_bytes().decode().splitlines())
        if "workload" in row
    }


def test_a_dra_workloads_template_asks_for_no_gpu_its_pods_hold_them() -> None:
    wl = workload_from("Deployment", dra_deployment("x"), IS_GPU)
    assert dict(wl.gpus_per_pod) == {}
    c = claim_view(
        claim(
            "x-gpus",
            [("gpus", "gpu-0"), ("gpus", "gpu-1")],
            [exactly("gpus", "gpu.nvidia.com", 2)],
            ["uid-pod-x"],
        )
    )
    (pod,) = DraCounter(["gpu.nvidia.com"]).pods([pod_view(dra_pod("x"), IS_GPU)], {(NS, "x-gpus"): c})
    assert pod.dra_gpus == 2.0 and dra_gpus_of([pod, pod]) == 4.0
    assert facts_for(wl, None, dra_gpus_of([pod])).gpus == 2.0
    plugin = pod_view(pod_for("y"), IS_GPU)
    assert plugin.dra_gpus == 0.0  # a device-plugin pod: its GPUs come from the template


async def test_a_dra_workload_of_8_gpus_is_logged_and_gated_like_a_device_plugin_one(tmp_path: Path) -> None:
    h = DraHarness(tmp_path, mode="enforce", autonomy={"tau": 0.0})  # tau 0: every reclaim escalates
    h.add_dra("dra", devices=8, table=FINISHED)
    h.add("plugin", table=FINISHED)  # 2 device-plugin GPUs per pod
    result = await h.polls(3)
    assert decision_rows(h) == {"dra": 8.0, "plugin": 2.0}

    def gpu_term(name: str) -> tuple[float, str]:
        decision = result.judged[WorkloadRef("Deployment", NS, name)].plan.decision
        (term,) = [t for t in decision.breakdown.terms if t.name == "gpus"]
        return term.value, term.detail

    assert gpu_term("dra") == (1.0, "8 GPUs / 8")  # one full GPU node: the gate's GPU scale
    assert gpu_term("plugin") == (0.25, "2 GPUs / 8")
    assert sorted(h.escalations) == ["dra", "plugin"]


async def test_the_escalation_names_the_dra_gpus_its_pods_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Any] = []

    async def send(decision: Any, facts: Any, settings: Any) -> Any:
        sent.append(facts)
        return type("R", (), {"ok": True})()

    monkeypatch.setattr("ghostgpu.escalation.send_escalation", send)
    c = claim_view(
        claim(
            "x-gpus",
            [("gpus", f"gpu-{i}") for i in range(8)],
            [exactly("gpus", "gpu.nvidia.com", 8)],
            ["uid-pod-x"],
        )
    )
    pods = DraCounter(["gpu.nvidia.com"]).pods([pod_view(dra_pod("x"), IS_GPU)], {(NS, "x-gpus"): c})
    await _escalator(ControllerConfig())(None, workload_from("Deployment", dra_deployment("x"), IS_GPU), pods)
    assert [f.gpus for f in sent] == [8.0]


async def test_the_gpu_hours_a_reclaim_of_a_dra_workload_recovers_are_its_devices(tmp_path: Path) -> None:
    h = DraHarness(tmp_path, mode="enforce")
    h.add_dra("dra", devices=8, table=FINISHED)
    h.add("plugin", table=FINISHED)
    await h.polls(3)
    assert sorted(r.name for r, n in h.cluster.scaled) == ["dra", "plugin"]
    recovered = h.metrics.gpu_hours_recovered.labels(NS, "all")
    before = recovered._value.get()
    await h.polls(2)  # nothing runs: each poll adds the freed GPUs for one poll interval
    assert recovered._value.get() - before == pytest.approx(2 * (8 + 2) * 60 / 3600)


async def test_the_ghost_gauge_labels_each_dra_device_with_the_flavor_of_its_class(tmp_path: Path) -> None:
    h = DraHarness(tmp_path)  # shadow
    h.add_dra("mixed", devices=1, migs=2, table=FINISHED)
    await h.polls(4)
    gauge = h.metrics.registry.get_sample_value

    def ghosts(flavor: str) -> float | None:
        return gauge("ghostgpu_ghost_gpus", {"namespace": NS, "flavor": flavor, "verdict": "FINISHED_IDLE"})

    # one node serves both DRA flavors: the MIG devices are mig-dra's, not the node's first flavor's
    assert (ghosts("h100-dra"), ghosts("mig-dra")) == (1.0, 2.0)
    hours = {
        f: gauge("ghostgpu_gpu_hours_reclaimable_total", {"namespace": NS, "flavor": f})
        for f in ("h100-dra", "mig-dra")
    }
    assert hours["mig-dra"] == pytest.approx(2 * hours["h100-dra"]) and hours["h100-dra"] > 0
