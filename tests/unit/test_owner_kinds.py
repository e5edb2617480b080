"""The batch and serving owner kinds of the actuator table: KubeRay RayJob and RayService, JobSet,
Kubeflow Trainer v2 TrainJob, the Training Operator's PyTorchJob, KServe's LLMInferenceService.
The chain resolves through them (Pod -> RayCluster -> RayJob/RayService, Pod -> Job -> JobSet ->
TrainJob, Pod -> PyTorchJob), each is one workload at the top, a kind with no stop (RayService) or
an object its stop does not apply to (a RayJob KubeRay would fail) is escalated, never written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_managers import NS, TABLE, FakeApi, obj_of, owned, pod, reconciler, tracked

from ghostgpu.actuators import Actuator, gpu_cel
from ghostgpu.controller.act.stops import stop
from ghostgpu.controller.inventory import OwnerRef, WorkloadRef, gpu_predicate, pods_by_workload
from ghostgpu.controller.managers import Resolver, manager_workload
from ghostgpu.controller.reconciler import Snapshot

IS_GPU = gpu_predicate(["nvidia.com/gpu"])


def mgr(obj: dict[str, Any]) -> Any:
    return manager_workload(TABLE.only(obj["kind"]), obj, IS_GPU)


def test_rayjob_workers_are_one_workload_at_the_rayjob() -> None:
    rj = mgr(tracked("RayJob", "rj"))
    rc = mgr(owned(tracked("RayCluster", "rj-abcde"), "RayJob", "rj"))  # KubeRay's, labelled too
    pods = [pod("rj-abcde-gpu-a", "RayCluster", "rj-abcde"), pod("rj-abcde-gpu-b", "RayCluster", "rj-abcde")]
    res = Resolver(TABLE).resolve({}, {}, {rj.ref: rj, rc.ref: rc}, pods)
    assert list(res.workloads) == [rj.ref] and {res.top_of(p) for p in pods} == {rj.ref}
    assert not rj.no_actuator and rj.replicas == 2 and rj.gpus_per_pod == {"nvidia.com/gpu": 1.0}
    assert pods_by_workload(res.workloads, pods, res.top_of)[rj.ref] == sorted(pods, key=lambda p: p.name)


def test_an_untracked_rayjob_is_still_reached_through_its_labelled_raycluster() -> None:
    rj = mgr(obj_of("RayJob", "rj"))  # created before the policy: only its RayCluster is labelled
    rc = mgr(owned(tracked("RayCluster", "rj-abcde"), "RayJob", "rj"))
    p = pod("rj-abcde-gpu-a", "RayCluster", "rj-abcde")
    res = Resolver(TABLE).resolve({}, {}, {rj.ref: rj, rc.ref: rc}, [p])
    assert list(res.workloads) == [rj.ref]


def test_a_rayjob_kuberay_would_fail_if_suspended_is_escalated_not_stopped() -> None:
    o = tracked("RayJob", "rj")
    o["spec"]["shutdownAfterJobFinishes"] = False  # KubeRay: "not allowed to be suspended"
    assert mgr(o).no_actuator
    assert not TABLE.only("RayJob").can_stop(o) and TABLE.only("RayJob").can_stop(tracked("RayJob", "x"))


async def test_the_stop_rereads_the_requirement_before_it_writes() -> None:
    o = obj_of("RayJob", "rj")
    o["spec"]["shutdownAfterJobFinishes"] = False  # changed since the cache saw it
    api = FakeApi([o])
    assert (await stop(api, FakeApi.ref(o), TABLE.only("RayJob"), is_leader=True)).outcome == "unstoppable"
    assert api.writes == []


def test_rayservice_is_tracked_and_judged_but_has_no_stop() -> None:
    a = TABLE.only("RayService")
    rs = mgr(tracked("RayService", "serve"))
    rc = mgr(owned(tracked("RayCluster", "serve-raycluster-x"), "RayService", "serve"))
    p = pod("serve-raycluster-x-gpu-a", "RayCluster", "serve-raycluster-x")
    res = Resolver(TABLE).resolve({}, {}, {rs.ref: rs, rc.ref: rc}, [p])
    assert list(res.workloads) == [rs.ref] and rs.no_actuator
    assert a.writes == [] and a.rbac_rules() == [] and not a.is_stopped(rs.raw) and a.track


def test_trainjob_through_its_jobset_and_jobs() -> None:
    tj = mgr(tracked("TrainJob", "tj"))
    js = mgr(owned(obj_of("JobSet", "tj"), "TrainJob", "tj"))
    owners = {("Job", NS, "tj-node-0"): OwnerRef("JobSet", "tj", "jobset.x-k8s.io/v1alpha2", "uid-tj")}
    pods = [pod("tj-node-0-0-abcde", "Job", "tj-node-0"), pod("tj-node-0-1-fghij", "Job", "tj-node-0")]
    res = Resolver(TABLE).resolve({}, owners, {tj.ref: tj, js.ref: js}, pods)
    assert list(res.workloads) == [tj.ref] and {res.top_of(p) for p in pods} == {tj.ref}
    # the GPU of a TrainJob is in trainer.resourcesPerNode: counted there, per node
    assert tj.gpus_per_pod == {"nvidia.com/gpu": 1.0} and tj.replicas == 2


def test_a_trainjob_whose_gpu_lives_in_its_runtime_is_found_through_its_labelled_jobset() -> None:
    o = obj_of("TrainJob", "tj")
    o["spec"]["trainer"].pop("resourcesPerNode")
    tj = mgr(o)
    js = mgr(owned(tracked("JobSet", "tj"), "TrainJob", "tj"))  # the runtime put the GPU in its template
    owners = {("Job", NS, "tj-node-0"): OwnerRef("JobSet", "tj", "", "")}
    res = Resolver(TABLE).resolve(
        {}, owners, {tj.ref: tj, js.ref: js}, [pod("tj-node-0-0", "Job", "tj-node-0")]
    )
    assert list(res.workloads) == [tj.ref]


def test_a_plain_job_is_no_workload_and_a_jobset_alone_is_one() -> None:
    js = mgr(tracked("JobSet", "js"))
    owners = {("Job", NS, "js-w-0"): OwnerRef("JobSet", "js", "", ""), ("Job", NS, "plain"): None}
    job_pod, js_pod = pod("plain-abcde", "Job", "plain"), pod("js-w-0-0", "Job", "js-w-0")
    res = Resolver(TABLE).resolve({}, owners, {js.ref: js}, [job_pod, js_pod])
    assert list(res.workloads) == [js.ref] and res.top_of(js_pod) == js.ref and res.top_of(job_pod) is None
    assert res.holder_of(job_pod) == WorkloadRef("Job", NS, "plain")  # counted as UNTRACKED_OWNER


def test_pytorchjob_pods_are_one_workload_over_master_and_workers() -> None:
    pj = mgr(tracked("PyTorchJob", "pt"))
    pods = [pod("pt-master-0", "PyTorchJob", "pt"), pod("pt-worker-0", "PyTorchJob", "pt")]
    res = Resolver(TABLE).resolve({}, {}, {pj.ref: pj}, pods)
    assert list(res.workloads) == [pj.ref] and {res.top_of(p) for p in pods} == {pj.ref}
    assert not pj.no_actuator and pj.replicas == 2


def test_llminferenceservice_above_its_deployment() -> None:
    from ghostgpu.controller.inventory import workload_from

    child = owned(tracked("Deployment", "llm-kserve"), "LLMInferenceService", "llm")
    dep = workload_from("Deployment", child, IS_GPU)
    llm = mgr(obj_of("LLMInferenceService", "llm"))
    p = pod("llm-kserve-abc12-x", "ReplicaSet", "llm-kserve-abc12", app="llm-kserve",
            **{"pod-template-hash": "abc12"})  # fmt: skip
    res = Resolver(TABLE).resolve({dep.ref: dep}, {}, {llm.ref: llm}, [p])
    assert list(res.workloads) == [llm.ref] and not llm.no_actuator


@pytest.mark.parametrize(
    "row,message",
    [
        ({"stop": "none", "field": "/spec/x", "value": True}, "stop none writes nothing"),
        ({"stop": "none", "requires": {"/spec/a": True}}, "stop none writes nothing"),
        ({"stop": "field", "field": "/spec/s", "value": True, "requires": {"spec/a": True}}, "JSON pointer"),
    ],
)
def test_bad_rows_of_the_new_fields_are_clear_errors(row: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Actuator.model_validate({"group": "x.io", "version": "v1", "kind": "X", "plural": "xs", **row})


def test_the_tracking_test_reads_bare_resource_requirements() -> None:
    cel = gpu_cel(TABLE.only("TrainJob"), "['nvidia.com/gpu']")
    assert cel == (
        "[object.?spec.?trainer.?resourcesPerNode.orValue({})].exists(c, ['nvidia.com/gpu'].exists(r, "
        "r in c.?limits.orValue({}) || r in c.?requests.orValue({})))"
    )


def snapshot(api: FakeApi, pods: list[Any], owners: dict[tuple[str, str, str], OwnerRef | None]) -> Snapshot:
    managers = {r: manager_workload(TABLE.only(r.kind), o, IS_GPU) for r, o in api.objects.items()}
    res = Resolver(TABLE).resolve({}, owners, managers, pods)
    return Snapshot({NS: {"ghostgpu.io/reclaim": "enabled"}}, res.workloads, pods, [], top_of=res.top_of)


async def test_a_finished_trainjob_is_suspended_once_at_the_top(tmp_path: Path) -> None:
    tj = tracked("TrainJob", "tj", creationTimestamp="2026-11-29T07:00:00Z")
    js = owned(obj_of("JobSet", "tj"), "TrainJob", "tj")
    api = FakeApi([tj, js])
    owners = {("Job", NS, "tj-node-0"): OwnerRef("JobSet", "tj", "", "")}
    pods = [pod(f"tj-node-0-{i}", "Job", "tj-node-0") for i in range(2)]
    rec = reconciler(tmp_path, api, [])
    for _ in range(4):
        await rec.poll_once(snapshot(api, pods, owners))
    ref = WorkloadRef("TrainJob", NS, "tj")
    assert api.objects[ref]["spec"]["suspend"] is True
    # the verdict and the stop land on the TrainJob only: never the JobSet, a Job or a pod
    assert {r for r, _ in api.writes} == {ref} and [w for w in api.writes if w[1] == "patch"] == [
        (ref, "patch")
    ]
    assert ("TrainJob", "tj", "Reclaimed") in api.events


async def test_a_finished_rayservice_gets_zero_writes_and_one_escalation(tmp_path: Path) -> None:
    rs = tracked("RayService", "serve", creationTimestamp="2026-11-29T07:00:00Z")
    rc = owned(tracked("RayCluster", "serve-rc"), "RayService", "serve")
    api = FakeApi([rs, rc])
    escalations: list[str] = []
    rec = reconciler(tmp_path, api, escalations)
    pods = [pod("serve-rc-gpu-a", "RayCluster", "serve-rc")]
    for _ in range(8):
        await rec.poll_once(snapshot(api, pods, {}))
    assert api.writes == [] and escalations == [f"RayService/{NS}/serve"]
    assert [e for e in api.events if e[2] == "ReclaimEscalated"] == [
        ("RayService", "serve", "ReclaimEscalated")
    ]
