"""Inventory: pods attributed to workloads through owners + selectors, exemptions, GPU requests."""

from __future__ import annotations

from typing import Any

from ghostgpu.controller.books.accounting import FlavorSpec, account
from ghostgpu.controller.inventory import (
    WorkloadRef,
    gpu_predicate,
    owner_workload,
    pod_view,
    pods_by_workload,
    selector_matches,
    workload_from,
)

IS_GPU = gpu_predicate(["nvidia.com/gpu"])


def deployment(
    name: str, ns: str = "team-a", *, gpus: int = 1, replicas: int = 1, ann: dict | None = None
) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "labels": {"ghostgpu.io/tracked": "true"},
            "annotations": ann or {},
            "creationTimestamp": "2026-11-29T08:00:00Z",
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {"name": "sidecar"},
                        {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "2"}}},
                    ]
                },
            },
        },
    }


def pod(
    name: str,
    ns: str = "team-a",
    *,
    app: str | None = None,
    owner: tuple[str, str] | None = None,
    hash_: str | None = None,
    gpus: int = 1,
    phase: str = "Running",
    node: str | None = "gpu-0",
) -> dict[str, Any]:
    labels = {"app": app} if app else {}
    if hash_:
        labels["pod-template-hash"] = hash_
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels}
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": phase, "startTime": "2026-11-29T08:01:00Z"},
    }


def test_deployment_pods_are_found_through_replicaset_name_and_selector() -> None:
    wl = workload_from("Deployment", deployment("train"), IS_GPU)
    assert wl.gpus_per_pod == {"nvidia.com/gpu": 1.0} and wl.replicas == 1 and not wl.exempt
    good = pod_view(
        pod("train-5d9f-abcde", app="train", owner=("ReplicaSet", "train-5d9f"), hash_="5d9f"), IS_GPU
    )
    # Owned by a ReplicaSet whose name looks right, but labels do not match the selector.
    imposter = pod_view(
        pod("train-5d9f-zzz", app="other", owner=("ReplicaSet", "train-5d9f"), hash_="5d9f"), IS_GPU
    )
    # A prefix lookalike from another deployment "train-5d9f-x" must not be attributed.
    other = pod_view(pod("trainer-1", app="train", owner=("ReplicaSet", "trainer-77"), hash_="77"), IS_GPU)
    got = pods_by_workload({wl.ref: wl}, [good, imposter, other])
    assert [p.name for p in got[wl.ref]] == ["train-5d9f-abcde"]
    assert good.gpu_container == "main" and good.gpu_requests == {"nvidia.com/gpu": 1.0}


def test_statefulset_and_bare_pod_owners() -> None:
    sts = pod_view(pod("db-0", app="db", owner=("StatefulSet", "db")), IS_GPU)
    assert owner_workload(sts) == WorkloadRef("StatefulSet", "team-a", "db")
    bare = pod_view(pod("notebook"), IS_GPU)
    assert owner_workload(bare) == WorkloadRef("Pod", "team-a", "notebook")
    job = pod_view(pod("job-x", owner=("Job", "job")), IS_GPU)
    assert owner_workload(job) is None


def test_exemption_annotations() -> None:
    assert workload_from(
        "Deployment", deployment("a", ann={"ghostgpu.io/reclaim-policy": "never"}), IS_GPU
    ).exempt
    assert workload_from("Deployment", deployment("b", ann={"gpu-eviction-policy": "never"}), IS_GPU).exempt
    assert not workload_from(
        "Deployment", deployment("c", ann={"ghostgpu.io/reclaim-policy": "always"}), IS_GPU
    ).exempt


def test_selector_semantics() -> None:
    assert not selector_matches(None, {"a": "1"})
    assert not selector_matches({}, {"a": "1"}), "an empty selector must not match everything"
    sel = {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "In", "values": ["x"]}]}
    assert selector_matches(sel, {"a": "1", "b": "x"})
    assert not selector_matches(sel, {"a": "1", "b": "y"})
    assert selector_matches({"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]}, {"a": "1"})
    assert not selector_matches({"matchExpressions": [{"key": "c", "operator": "Bogus"}]}, {"c": "1"})


def test_accounting_gap_per_flavor() -> None:
    flavors = [FlavorSpec("h100", "nvidia.com/gpu", {"gpu": "h100"})]
    nodes = [
        {
            "metadata": {"name": "gpu-0", "labels": {"gpu": "h100"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        },
        {"metadata": {"name": "cpu-0", "labels": {}}, "status": {"allocatable": {"cpu": "8"}}},
    ]
    pods = [
        pod_view(pod("ghost", gpus=2), IS_GPU),
        pod_view(pod("live", gpus=1), IS_GPU),
        pod_view(pod("kueue-job", gpus=4), IS_GPU),
        pod_view(pod("done", gpus=4, phase="Succeeded"), IS_GPU),  # finished: holds nothing
        pod_view(pod("pending", gpus=4, node=None), IS_GPU),  # unscheduled: holds nothing
    ]
    cq = {
        "spec": {
            "resourceGroups": [
                {"flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}
            ]
        },
        "status": {
            "flavorsUsage": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "4"}]}]
        },
    }
    (acc,) = account(
        flavors, nodes, pods, [cq], {("team-a", "ghost"): "FINISHED_IDLE", ("team-a", "live"): "ACTIVE"}
    )
    assert acc.allocatable == 8 and acc.kueue_admitted == 4 and acc.in_use == 7
    assert acc.outside_kueue == {"FINISHED_IDLE": 2.0, "ACTIVE": 1.0}
    assert acc.truly_free == 1 and acc.kueue_believes_free == 4 and acc.gap == 3
