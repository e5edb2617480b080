"""Managers and actuators without a cluster: the actuator table (writes, is_stopped, stop and
restore patches for every built-in), owner-chain resolution, the planner's gate per actuator, and
the reconcile loop acting on a manager (RayCluster suspend) and refusing to write the child of an
owner it has no actuator for.

What could break and is asserted here: a stop that restore does not undo exactly (value absent
before -> absent after), a pod attributed to its child instead of its manager, two workloads for
one manager, a write to the child of an unknown owner, more than one escalation for it."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ghostgpu.actuators import (
    RECLAIMED_FROM_RECORD,
    Actuator,
    ActuatorTable,
    builtin_actuators,
    get_pointer,
    gpu_cel,
    merge_patch_for,
)
from ghostgpu.config import ControllerConfig
from ghostgpu.controller.act.stops import restore, stop
from ghostgpu.controller.books.decisions import DecisionLog
from ghostgpu.controller.inventory import OwnerRef, WorkloadRef, gpu_predicate, pod_view, workload_from
from ghostgpu.controller.judge.planner import plan
from ghostgpu.controller.kube import Conflict, NotFound
from ghostgpu.controller.managers import Resolver, manager_workload
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.reconciler import Reconciler, Snapshot
from ghostgpu.signals.artifacts import FileArtifactProbe
from ghostgpu.signals.podexec import ExecResult, PodRef
from ghostgpu.signals.processes import ExecProcessSource
from ghostgpu.signals.utilization import PodKey, PodReading
from ghostgpu.verdict import Rule, Verdict, VerdictKind

IS_GPU = gpu_predicate(["nvidia.com/gpu"])
NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
NS = "team-a"
GPU = {"limits": {"nvidia.com/gpu": "1"}}
TABLE = ActuatorTable()


def merge(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch, as the apiserver applies it."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


# --- one object per built-in kind ---------------------------------------------------------------

TEMPLATE = {"spec": {"containers": [{"name": "main", "resources": GPU}]}}
OBJECTS: dict[str, dict[str, Any]] = {
    "Deployment": {"spec": {"replicas": 2, "template": TEMPLATE}},
    "StatefulSet": {"spec": {"replicas": 3, "template": TEMPLATE}},
    "Notebook": {"spec": {"template": TEMPLATE}},
    "Workspace": {"spec": {"kind": "jupyterlab"}},
    "RayCluster": {
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "head"}]}}},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "template": TEMPLATE}],
        }
    },
    "LeaderWorkerSet": {"spec": {"replicas": 2, "leaderWorkerTemplate": {"workerTemplate": TEMPLATE}}},
    "InferenceService": {"spec": {"predictor": {"model": {"modelFormat": {"name": "x"}, "resources": GPU}}}},
    "NIMService": {"spec": {"replicas": 2, "resources": GPU}},
    "ScaledObject": {"spec": {"scaleTargetRef": {"name": "web"}, "minReplicaCount": 0}},
    "RayJob": {
        "spec": {
            "entrypoint": "python train.py",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "head"}]}}},
                "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "template": TEMPLATE}],
            },
        }
    },
    "RayService": {
        "spec": {
            "rayClusterConfig": {
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "head"}]}}},
                "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "template": TEMPLATE}],
            }
        }
    },
    "JobSet": {"spec": {"replicatedJobs": [
        {"name": "w", "replicas": 2, "template": {"spec": {"template": TEMPLATE}}}]}},
    "TrainJob": {"spec": {"runtimeRef": {"name": "torch"},
                          "trainer": {"numNodes": 2, "resourcesPerNode": GPU}}},
    "PyTorchJob": {"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": TEMPLATE},
                                                    "Worker": {"replicas": 2, "template": TEMPLATE}}}},
    "LLMInferenceService": {"spec": {"model": {"uri": "hf://m"}, "replicas": 2,
                                     "template": TEMPLATE["spec"]}},
    "TFJob": {"spec": {"tfReplicaSpecs": {"Chief": {"replicas": 1, "template": TEMPLATE},
                                          "Worker": {"replicas": 2, "template": TEMPLATE}}}},
    "MPIJob": {"spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1, "template": TEMPLATE},
                                            "Worker": {"replicas": 2, "template": TEMPLATE}}}},
    # Volcano's batch.volcano.sh Job (the only built-in row of kind Job)
    "Job": {"spec": {"minAvailable": 2, "tasks": [{"name": "w", "replicas": 2, "template": TEMPLATE}]},
            "status": {"state": {"phase": "Running"}}},
}  # fmt: skip


def obj_of(kind: str, name: str = "w", **meta: Any) -> dict[str, Any]:
    a = TABLE.only(kind)
    return {
        "apiVersion": a.api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "7", **meta},
        **copy.deepcopy(OBJECTS[kind]),
    }


def test_every_builtin_kind_has_an_object_here() -> None:
    assert set(OBJECTS) == {a.kind for a in TABLE.rows()}


def test_writes_are_the_documented_pointers() -> None:
    assert {a.kind: a.writes for a in builtin_actuators()} == {
        "Deployment": ["/spec/replicas"],
        "StatefulSet": ["/spec/replicas"],
        "Notebook": ["/metadata/annotations/kubeflow-resource-stopped"],
        "Workspace": ["/spec/paused"],
        "RayCluster": ["/spec/suspend"],
        "LeaderWorkerSet": ["/spec/replicas"],
        "InferenceService": ["/metadata/annotations/serving.kserve.io~1stop"],
        "NIMService": ["/spec/replicas"],
        "ScaledObject": ["/metadata/annotations/autoscaling.keda.sh~1paused-replicas"],
        "RayJob": ["/spec/suspend"],
        "RayService": [],
        "JobSet": ["/spec/suspend"],
        "TrainJob": ["/spec/suspend"],
        "PyTorchJob": ["/spec/runPolicy/suspend"],
        "TFJob": ["/spec/runPolicy/suspend"],
        "MPIJob": ["/spec/runPolicy/suspend"],
        "LLMInferenceService": ["/metadata/annotations/serving.kserve.io~1stop"],
        "Job": [],  # Volcano's: a Command object, nothing on the Job but the record
    }


PATCH_KINDS = [a.kind for a in builtin_actuators() if a.stop in ("annotation", "field")]


@pytest.mark.parametrize("kind", PATCH_KINDS)
def test_stop_then_restore_is_exact_for_every_patch_actuator(kind: str) -> None:
    a = TABLE.only(kind)
    before = obj_of(kind, annotations={"team": "x"})
    assert not a.is_stopped(before)
    stopped = merge(before, a.stop_patch(before, now=NOW))
    assert a.is_stopped(stopped)
    record = json.loads(stopped["metadata"]["annotations"][RECLAIMED_FROM_RECORD])
    assert set(record) == set(a.writes)  # the record names exactly what the stop wrote
    if kind == "Notebook":  # Kubeflow's culler format: the time of the stop
        assert stopped["metadata"]["annotations"]["kubeflow-resource-stopped"] == "2026-11-29T10:00:00Z"
    restored = merge(stopped, a.restore_patch(stopped))
    assert not a.is_stopped(restored)
    if a.stop == "field" and a.restore_value is False:
        # absent before; restore writes the running value the controller reads as "not suspended"
        assert get_pointer(restored, a.writes[0]) is False
        restored = merge(restored, merge_patch_for(a.writes[0], None))
        if kind in ("PyTorchJob", "TFJob", "MPIJob"):  # the merge patch left the parent it created
            assert restored["spec"].pop("runPolicy") == {}
    assert restored == before


def test_restore_puts_back_a_value_that_was_there() -> None:
    a = TABLE.only("NIMService")
    before = obj_of("NIMService")
    stopped = merge(before, a.stop_patch(before))
    assert stopped["spec"]["replicas"] == 0 and a.is_stopped(stopped)
    assert merge(stopped, a.restore_patch(stopped))["spec"]["replicas"] == 2


def test_restore_without_a_record_is_refused() -> None:
    a = TABLE.only("RayCluster")
    with pytest.raises(ValueError, match="not reclaimed"):
        a.restore_patch(obj_of("RayCluster"))
    bad = obj_of("RayCluster", annotations={RECLAIMED_FROM_RECORD: '{"/spec/other": 1}'})
    with pytest.raises(ValueError, match="does not record"):
        a.restore_patch(bad)


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "LeaderWorkerSet"])
def test_scale_actuators_are_stopped_at_zero(kind: str) -> None:
    a = TABLE.only(kind)
    o = obj_of(kind)
    assert not a.is_stopped(o)
    o["spec"]["replicas"] = 0
    assert a.is_stopped(o)


def test_rbac_only_the_verbs_each_actuator_needs() -> None:
    rules = {(r["apiGroups"][0], tuple(r["resources"])): r["verbs"] for r in TABLE.rbac_rules()}
    # field stops: no scale; RayService has no stop, so nothing of it is patched
    assert rules[("ray.io", ("rayclusters", "rayjobs"))] == ["get", "patch"]
    assert rules[("leaderworkerset.x-k8s.io", ("leaderworkersets", "leaderworkersets/scale"))] == [
        "get",
        "patch",
    ]
    # Volcano's stop creates a Command and nothing else: no get, patch or delete of commands
    assert rules.pop(("bus.volcano.sh", ("commands",))) == ["create"]
    assert all(set(v) <= {"get", "patch"} for v in rules.values())
    assert not any("delete" in r["verbs"] or "update" in r["verbs"] for r in TABLE.rbac_rules())


def test_a_user_adds_an_operator_kind_in_the_config() -> None:
    cfg = ControllerConfig.model_validate(
        {
            "actuators": [
                {
                    "group": "example.com",
                    "version": "v1",
                    "kind": "Trainer",
                    "plural": "trainers",
                    "stop": "field",
                    "field": "/spec/paused",
                    "value": True,
                    "restoreValue": False,
                    "containers": ["/spec/template/spec/containers"],
                    "baseRisk": 0.2,
                }
            ]
        }
    )
    table = ActuatorTable(cfg.actuators)
    t = table.get("example.com", "Trainer")
    assert t is not None and t.writes == ["/spec/paused"] and t in table.tracked()
    assert {"apiGroups": ["example.com"], "resources": ["trainers"], "verbs": ["get", "patch"]} in (
        table.rbac_rules()
    )
    assert "object.kind" not in gpu_cel(t, "['nvidia.com/gpu']")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"stop": "annotation", "value": "x"}, "needs `annotation`"),
        ({"stop": "field", "field": "/metadata/labels/x", "value": 1}, "under /spec/"),
        ({"stop": "field", "field": "spec/paused", "value": True}, "JSON pointer"),
        ({"stop": "scale", "annotation": "x"}, "takes no"),
    ],
)
def test_a_bad_actuator_is_a_clear_error(row: dict[str, Any], message: str) -> None:
    base = {"group": "example.com", "version": "v1", "kind": "Trainer", "plural": "trainers"}
    with pytest.raises(ValidationError, match=message):
        Actuator.model_validate({**base, **row})


def test_a_kind_listed_twice_is_refused() -> None:
    row = {"group": "g", "version": "v1", "kind": "K", "plural": "ks", "stop": "scale"}
    with pytest.raises(ValidationError, match="twice"):
        ControllerConfig.model_validate({"actuators": [row, row]})


# --- resolution ---------------------------------------------------------------------------------


def pod(name: str, owner_kind: str | None, owner: str | None, **labels: str) -> Any:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": labels}
    if owner_kind:
        meta["ownerReferences"] = [{"kind": owner_kind, "name": owner, "controller": True}]
    obj = {
        "metadata": meta,
        "spec": {"nodeName": "n", "containers": [{"name": "main", "resources": GPU}]},
        "status": {"phase": "Running", "startTime": "2026-11-29T08:00:00Z"},
    }
    return pod_view(obj, IS_GPU)


def owned(obj: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    api = {"Pod": "v1"}.get(kind) or (
        TABLE.only(kind).api_version if TABLE.groups_of(kind) else "example.com/v1"
    )
    ref = {"apiVersion": api, "kind": kind, "name": name, "uid": f"uid-{name}", "controller": True}
    obj["metadata"]["ownerReferences"] = [ref]
    return obj


def tracked(kind: str, name: str, **extra: Any) -> dict[str, Any]:
    o = obj_of(kind, name, labels={"ghostgpu.io/tracked": "true"}, **extra)
    o["spec"]["selector"] = {"matchLabels": {"app": name}}
    return o


def test_raycluster_pods_are_one_workload_at_the_raycluster() -> None:
    rc = manager_workload(TABLE.only("RayCluster"), tracked("RayCluster", "ray"), IS_GPU)
    pods = [pod("ray-head", "RayCluster", "ray"), pod("ray-gpu-a", "RayCluster", "ray"),
            pod("ray-gpu-b", "RayCluster", "ray")]  # fmt: skip
    res = Resolver(TABLE).resolve({}, {}, {rc.ref: rc}, pods)
    assert list(res.workloads) == [WorkloadRef("RayCluster", NS, "ray")]
    assert {res.top_of(p) for p in pods} == {rc.ref}
    assert rc.replicas == 2 and rc.gpus_per_pod == {"nvidia.com/gpu": 1.0}


def test_an_untracked_raycluster_is_not_judged() -> None:
    rc = manager_workload(TABLE.only("RayCluster"), obj_of("RayCluster", "ray"), IS_GPU)
    res = Resolver(TABLE).resolve({}, {}, {rc.ref: rc}, [pod("ray-gpu-a", "RayCluster", "ray")])
    assert res.workloads == {}


def test_notebook_statefulset_stripped_of_its_label_still_leads_to_the_notebook() -> None:
    nb = manager_workload(TABLE.only("Notebook"), tracked("Notebook", "nb"), IS_GPU)
    owners = {("StatefulSet", NS, "nb"): OwnerRef("Notebook", "nb", "kubeflow.org/v1", "uid-nb")}
    p = pod("nb-0", "StatefulSet", "nb", app="nb")
    res = Resolver(TABLE).resolve({}, owners, {nb.ref: nb}, [p])
    assert list(res.workloads) == [nb.ref] and res.top_of(p) == nb.ref


def test_a_tracked_child_of_an_inferenceservice_becomes_the_inferenceservice() -> None:
    dep = workload_from("Deployment", owned(tracked("Deployment", "isvc-predictor"), "InferenceService",
                                            "isvc"), IS_GPU)  # fmt: skip
    isvc = manager_workload(TABLE.only("InferenceService"), obj_of("InferenceService", "isvc"), IS_GPU)
    p = pod("isvc-predictor-abc12-x", "ReplicaSet", "isvc-predictor-abc12", **{"pod-template-hash": "abc12"})
    res = Resolver(TABLE).resolve({dep.ref: dep}, {}, {isvc.ref: isvc}, [p])
    # tracked through its child: one workload, at the top; the child is not a second one
    assert list(res.workloads) == [isvc.ref] and res.top_of(p) == isvc.ref


def test_keda_scaledobject_sits_above_its_target() -> None:
    dep = workload_from("Deployment", tracked("Deployment", "web"), IS_GPU)
    so = manager_workload(TABLE.only("ScaledObject"), obj_of("ScaledObject", "web-so"), IS_GPU)
    p = pod("web-abc12-x", "ReplicaSet", "web-abc12", app="web", **{"pod-template-hash": "abc12"})
    res = Resolver(TABLE).resolve({dep.ref: dep}, {}, {so.ref: so}, [p])
    assert list(res.workloads) == [so.ref] and res.top_of(p) == so.ref


def test_lws_worker_pods_reach_the_leaderworkerset_through_the_leader_pod() -> None:
    lws = manager_workload(TABLE.only("LeaderWorkerSet"), tracked("LeaderWorkerSet", "lws"), IS_GPU)
    owners = {
        ("StatefulSet", NS, "lws"): OwnerRef("LeaderWorkerSet", "lws", "", ""),
        ("StatefulSet", NS, "lws-0"): OwnerRef("Pod", "lws-0", "v1", ""),
    }
    leader, worker = pod("lws-0", "StatefulSet", "lws"), pod("lws-0-1", "StatefulSet", "lws-0")
    by_name = {p.name: p for p in (leader, worker)}

    def pod_owner(ns: str, name: str) -> OwnerRef | None:
        v = by_name.get(name)
        return OwnerRef(v.owner_kind, v.owner_name or "", "", "") if v and v.owner_kind else None

    res = Resolver(TABLE).resolve({}, owners, {lws.ref: lws}, [leader, worker], pod_owner)
    assert {res.top_of(leader), res.top_of(worker)} == {lws.ref} and list(res.workloads) == [lws.ref]


def test_unknown_owner_is_a_workload_that_is_never_written() -> None:
    dep = workload_from("Deployment", owned(tracked("Deployment", "job"), "Trainer", "t1"), IS_GPU)
    p = pod("job-abc12-x", "ReplicaSet", "job-abc12", app="job", **{"pod-template-hash": "abc12"})
    res = Resolver(TABLE).resolve({dep.ref: dep}, {}, {}, [p])
    ref = WorkloadRef("Trainer", NS, "t1", "example.com")
    assert list(res.workloads) == [ref] and res.top_of(p) == ref
    wl = res.workloads[ref]
    assert (
        wl.no_actuator and wl.raw["apiVersion"] == "example.com/v1" and wl.raw["metadata"]["uid"] == "uid-t1"
    )


def test_a_known_owner_missing_from_the_cache_is_not_judged_at_all() -> None:
    # A Notebook's StatefulSet while the Notebook cache lags: never judged (or scaled) as itself.
    sts = workload_from("StatefulSet", owned(tracked("StatefulSet", "nb"), "Notebook", "nb"), IS_GPU)
    res = Resolver(TABLE).resolve({sts.ref: sts}, {}, {}, [pod("nb-0", "StatefulSet", "nb", app="nb")])
    assert res.workloads == {}


def test_kueue_managed_manager_is_skipped() -> None:
    o = tracked("RayCluster", "ray")
    o["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "default"
    rc = manager_workload(TABLE.only("RayCluster"), o, IS_GPU)
    assert Resolver(TABLE).resolve({}, {}, {rc.ref: rc}, [pod("r", "RayCluster", "ray")]).workloads == {}


# --- the gate -----------------------------------------------------------------------------------


def reclaimable() -> Verdict:
    return Verdict(kind=VerdictKind.FINISHED_IDLE, rule=Rule.GHOSTGPU, reasons=())


def test_each_actuator_is_scored_and_the_kserve_stop_is_riskier() -> None:
    cfg = ControllerConfig.model_validate({"mode": "enforce", "autonomy": {"tau": 0.9}})
    rc = manager_workload(TABLE.only("RayCluster"), tracked("RayCluster", "ray"), IS_GPU)
    isvc = manager_workload(TABLE.only("InferenceService"), tracked("InferenceService", "isvc"), IS_GPU)
    p_rc, p_isvc = plan(rc, reclaimable(), None, cfg), plan(isvc, reclaimable(), None, cfg)
    assert p_rc.decision is not None and p_isvc.decision is not None
    assert p_rc.decision.action == "stop_raycluster" and p_isvc.decision.action == "stop_inferenceservice"
    assert p_isvc.decision.score > p_rc.decision.score
    # a row of the same name in autonomy.actionClasses overrides the actuator's base risk
    strict = ControllerConfig.model_validate(
        {"mode": "enforce", "autonomy": {"actionClasses": {"stop_raycluster": {"baseRisk": 1.0}}}}
    )
    assert plan(rc, reclaimable(), None, strict).action == "escalate"


def test_an_owner_with_no_actuator_is_escalated_naming_it() -> None:
    cfg = ControllerConfig.model_validate({"mode": "enforce", "autonomy": {"tau": 0.99}})
    dep = workload_from("Deployment", owned(tracked("Deployment", "job"), "Trainer", "t1"), IS_GPU)
    wl = (
        Resolver(TABLE)
        .resolve({dep.ref: dep}, {}, {}, [])
        .workloads[WorkloadRef("Trainer", NS, "t1", "example.com")]
    )
    p = plan(wl, reclaimable(), None, cfg)
    assert p.action == "escalate" and p.decision is not None and "Trainer t1" in p.decision.reason


# --- stop and restore against a fake apiserver ----------------------------------------------------


class FakeApi:
    """Objects with resourceVersion preconditions and merge-patch semantics; records every write."""

    def __init__(self, objects: Iterable[dict[str, Any]]) -> None:
        self.objects = {self.ref(o): o for o in objects}
        self.writes: list[tuple[WorkloadRef, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.scales: list[tuple[WorkloadRef, int]] = []
        self.created: list[tuple[str, dict[str, Any]]] = []

    @staticmethod
    def ref(o: Mapping[str, Any]) -> WorkloadRef:
        group = o["apiVersion"].rpartition("/")[0] if "apiVersion" in o else None
        return WorkloadRef(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"], group)

    async def create_object(self, plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """A created object (an actuator's `stop: create`): kept in `created`, named like generateName."""
        made = copy.deepcopy(dict(obj))
        made["metadata"]["name"] = made["metadata"].pop("generateName") + f"{len(self.created):05d}"
        self.created.append((plural, made))
        self.writes.append((WorkloadRef(made["kind"], made["metadata"]["namespace"], made["metadata"]["name"],
                                        made["apiVersion"].rpartition("/")[0]), "create"))  # fmt: skip
        return made

    async def get(self, ref: WorkloadRef) -> dict[str, Any]:
        if ref not in self.objects:
            raise NotFound(str(ref))
        return copy.deepcopy(self.objects[ref])

    def _apply(self, ref: WorkloadRef, patch: Mapping[str, Any], rv: str | None, what: str) -> dict[str, Any]:
        if ref not in self.objects:
            raise NotFound(str(ref))
        cur = self.objects[ref]
        if rv is not None and rv != cur["metadata"]["resourceVersion"]:
            raise Conflict(str(ref))
        new = merge(cur, patch)
        new["metadata"]["resourceVersion"] = str(int(cur["metadata"]["resourceVersion"]) + 1)
        self.objects[ref] = new
        self.writes.append((ref, what))
        return copy.deepcopy(new)

    async def patch_object(self, ref: WorkloadRef, patch: Mapping[str, Any], *, resource_version=None,
                           current=None) -> dict[str, Any]:  # fmt: skip
        return self._apply(ref, patch, resource_version, "patch")

    async def patch_annotations(self, ref: WorkloadRef, ann: Mapping[str, str | None], *,
                                resource_version=None, current=None) -> dict[str, Any]:  # fmt: skip
        return self._apply(ref, {"metadata": {"annotations": dict(ann)}}, resource_version, "annotate")

    async def scale(self, ref: WorkloadRef, replicas: int, *, resource_version=None) -> None:
        self._apply(ref, {"spec": {"replicas": replicas}}, resource_version, "scale")
        self.scales.append((ref, replicas))

    async def event(self, involved: Mapping[str, Any], *, reason: str, message: str, type_: str = "") -> None:
        self.events.append((involved["kind"], involved["metadata"]["name"], reason))

    async def evict(self, namespace: str, pod: str) -> str:
        self.writes.append((WorkloadRef("Pod", namespace, pod), "evict"))
        return "evicted"

    async def annotate_node(self, node: str, annotations: Mapping[str, str]) -> None:
        pass


@pytest.mark.parametrize("kind", PATCH_KINDS)
async def test_stop_and_restore_through_the_api_for_every_patch_actuator(kind: str) -> None:
    a = TABLE.only(kind)
    o = obj_of(kind)
    api = FakeApi([o])
    ref = FakeApi.ref(o)
    assert (await stop(api, ref, a, is_leader=False)).outcome == "not-leader"
    assert api.writes == []
    done = await stop(api, ref, a, is_leader=True)
    assert done.outcome == "stopped" and a.is_stopped(api.objects[ref])
    assert (await stop(api, ref, a, is_leader=True)).outcome == "already-stopped"
    assert len(api.writes) == 1  # the stop and its record: one write
    await restore(api, ref, a)
    assert not a.is_stopped(api.objects[ref])
    assert RECLAIMED_FROM_RECORD not in api.objects[ref]["metadata"].get("annotations", {})
    assert api.events == [(kind, "w", "Restored")]


async def test_stop_is_a_no_op_when_the_object_changed_since_read() -> None:
    a = TABLE.only("RayCluster")
    api = FakeApi([obj_of("RayCluster")])
    ref = WorkloadRef("RayCluster", NS, "w")
    real_get = api.get

    async def stale_get(r: WorkloadRef) -> dict[str, Any]:
        o = await real_get(r)
        api.objects[r]["metadata"]["resourceVersion"] = "8"  # someone writes right after our read
        return o

    api.get = stale_get  # type: ignore[method-assign]
    assert (await stop(api, ref, a, is_leader=True)).outcome == "conflict"
    assert api.writes == [] and not a.is_stopped(api.objects[ref])


async def test_exempt_manager_is_never_stopped() -> None:
    a = TABLE.only("Notebook")
    api = FakeApi([obj_of("Notebook", annotations={"ghostgpu.io/reclaim-policy": "never"})])
    assert (await stop(api, WorkloadRef("Notebook", NS, "w"), a, is_leader=True)).outcome == "exempt"
    assert api.writes == []


# --- the reconcile loop -------------------------------------------------------------------------

FINISHED = (
    "PID PPID STAT ELAPSED COMMAND\n"
    "1 0 Ss 900 sh -c python train.py; sleep infinity\n"
    "7 1 S 600 sleep infinity\n"
)


class Idle:
    async def poll(
        self, pods: Iterable[PodKey], *, now: float, devices: object = None, uids: object = None
    ) -> dict[PodKey, PodReading]:
        return {p: PodReading(0.0, (), 0) for p in pods}


class Finished:
    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        return ExecResult(FINISHED, "", 0)


def reconciler(tmp: Path, api: FakeApi, escalations: list[str]) -> Reconciler:
    cfg = ControllerConfig.model_validate(
        {"mode": "enforce", "window": 3, "longWindow": 6, "startupGrace": "10m", "autonomy": {"tau": 0.5}}
    )

    async def escalate(decision: Any, wl: Any, pods: Any = ()) -> None:
        escalations.append(str(wl.ref))

    return Reconciler(
        cfg,
        cluster=api,  # type: ignore[arg-type]
        utilization=Idle(),  # type: ignore[arg-type]
        processes=ExecProcessSource(Finished(), concurrency=2),
        files=FileArtifactProbe(Finished()),
        s3=None,
        metrics=ControllerMetrics(),
        decision_log=DecisionLog(tmp / "d.jsonl"),
        clock=lambda: NOW.timestamp(),
        escalate=escalate,
    )


def snapshot(api: FakeApi, pods: list[Any], tracked_children: Iterable[WorkloadRef] = ()) -> Snapshot:
    managers = {
        r: manager_workload(a, o, IS_GPU)
        for r, o in api.objects.items()
        if (a := TABLE.for_ref(r)) is not None and r.kind not in ("Deployment", "StatefulSet")
    }
    children = {r: workload_from(r.kind, api.objects[r], IS_GPU) for r in tracked_children}
    res = Resolver(TABLE).resolve(children, {}, managers, pods)
    return Snapshot({NS: {"ghostgpu.io/reclaim": "enabled"}}, res.workloads, pods, [], top_of=res.top_of)


async def test_a_finished_raycluster_is_suspended_once_and_stays_so(tmp_path: Path) -> None:
    rc = tracked("RayCluster", "ray", creationTimestamp="2026-11-29T07:00:00Z")
    api = FakeApi([rc])
    pods = [pod(f"ray-gpu-{i}", "RayCluster", "ray") for i in range(2)]
    head = pod("ray-head", "RayCluster", "ray")
    head = replace(head, gpu_requests={}, gpu_containers=())  # no GPU, no GPU series: not judged
    rec = reconciler(tmp_path, api, [])
    ref = WorkloadRef("RayCluster", NS, "ray")
    judged = []
    for _ in range(4):
        result = await rec.poll_once(snapshot(api, [head, *pods]))
        judged += [result.judged[ref].pods] if ref in result.judged else []
        assert list(result.judged) in ([], [ref])  # one workload: never a pod or a group on its own
    assert ("RayCluster", "ray", "Reclaimed") in api.events
    assert api.objects[ref]["spec"]["suspend"] is True
    assert judged and all(p == sorted(pods, key=lambda p: p.name) for p in judged)
    # KubeRay deletes the pods of a suspended cluster: nothing more is written, window after window
    n = len(api.writes)
    for _ in range(5):
        await rec.poll_once(snapshot(api, []))
    assert len(api.writes) == n and sum(1 for e in api.events if e[2] == "Reclaimed") == 1


async def test_unknown_owner_gets_zero_writes_and_exactly_one_escalation(tmp_path: Path) -> None:
    dep = owned(tracked("Deployment", "job", creationTimestamp="2026-11-29T07:00:00Z"), "Trainer", "t1")
    api = FakeApi([dep])
    escalations: list[str] = []
    rec = reconciler(tmp_path, api, escalations)
    p = pod("job-abc12-x", "ReplicaSet", "job-abc12", app="job", **{"pod-template-hash": "abc12"})
    for _ in range(8):
        await rec.poll_once(snapshot(api, [p], [FakeApi.ref(dep)]))
    assert api.writes == [] and api.scales == []
    assert escalations == [f"Trainer/{NS}/t1"]
    # Events name the owner, never the child
    assert [e for e in api.events if e[2] == "ReclaimEscalated"] == [("Trainer", "t1", "ReclaimEscalated")]
    assert all(e[0] == "Trainer" for e in api.events)
    # its verdict is remembered in memory (it carries no annotation): one Event per change, not per poll
    assert [e[2] for e in api.events if e[2].startswith("Verdict")] == ["VerdictFinishedIdle"]


def test_the_controllers_watch_caches_resolve_managers_in_a_snapshot() -> None:
    """app.Informers wiring: pods, the owner index and the manager caches, as the watches fill them."""
    from ghostgpu.controller.app import Informers
    from ghostgpu.controller.inventory import cached_pod

    inf = Informers(None, IS_GPU)
    rc = tracked("RayCluster", "ray")
    [rc_cache] = [r for r in inf.managers.managers if r.rtype.kind == "RayCluster"]
    rc_cache.store[(NS, "ray")] = rc_cache.transform(rc)
    sts = owned(obj_of("StatefulSet", "lws-0"), "Pod", "lws-0")  # a LeaderWorkerSet group
    [sts_cache] = [r for r in inf.managers.owners if r.rtype.kind == "StatefulSet"]
    sts_cache.store[(NS, "lws-0")] = sts_cache.transform(sts)
    for name in ("ray-gpu-0", "ray-gpu-1"):
        p = {
            "metadata": {"name": name, "namespace": NS, "uid": name,
                         "ownerReferences": [{"kind": "RayCluster", "name": "ray", "controller": True}]},
            "spec": {"nodeName": "n", "containers": [{"name": "w", "resources": GPU}]},
            "status": {"phase": "Running"},
        }  # fmt: skip
        inf.pods.store[(NS, name)] = cached_pod(p, IS_GPU)
    snap = inf.snapshot([])
    ref = WorkloadRef("RayCluster", NS, "ray")
    assert list(snap.workloads) == [ref]
    assert snap.top_of is not None and {snap.top_of(p) for p in snap.pods} == {ref}


@pytest.mark.parametrize("kind", [a.kind for a in builtin_actuators() if a.stop == "scale"])
async def test_scale_actuators_stop_and_restore_through_the_scale_subresource(
    tmp_path: Path, kind: str
) -> None:
    from ghostgpu.controller.ledger import ReplicaLedger
    from ghostgpu.controller.ops import restore_any

    o = tracked(kind, "w")
    api = FakeApi([o])
    ref = FakeApi.ref(o)
    rec = reconciler(tmp_path, api, [])
    wl = workload_from(kind, o, IS_GPU) if kind != "LeaderWorkerSet" else (
        manager_workload(TABLE.only(kind), o, IS_GPU))  # fmt: skip
    assert await rec.actor.stops.scale_to_zero(wl, reclaimable()) == "scaled-to-zero"
    assert api.objects[ref]["spec"]["replicas"] == 0 and TABLE.only(kind).is_stopped(api.objects[ref])
    n = o["spec"]["replicas"]
    assert api.objects[ref]["metadata"]["annotations"]["ghostgpu.io/reclaimed-from-replicas"] == str(n)
    done = await restore_any(api, ref, ReplicaLedger(api, "ghostgpu-system"), TABLE)  # type: ignore[arg-type]
    assert done.replicas == n and api.objects[ref]["spec"]["replicas"] == n
    assert "ghostgpu.io/reclaimed-from-replicas" not in api.objects[ref]["metadata"]["annotations"]


@pytest.mark.parametrize("code", [404, 403])
async def test_a_manager_kind_that_cannot_be_listed_is_empty_and_synced(code: int) -> None:
    """No CRD (404) or no RBAC for it yet (403): readiness does not wait, and the list is retried."""
    import asyncio
    import contextlib

    import httpx
    from kr8s._exceptions import ServerError

    from ghostgpu.controller.managers import OptionalReflector, resource_type

    calls: list[str] = []

    class Api:
        def call_api(self, method: str, **kw: Any) -> Any:
            calls.append(kw["url"])
            resp = httpx.Response(code, request=httpx.Request("GET", "http://x"))
            raise ServerError(f"HTTP {code}", status=str(code), response=resp)

    r = OptionalReflector(Api(), resource_type(TABLE.only("RayCluster")), recheck=0.01)
    task = asyncio.ensure_future(r.run())
    await asyncio.wait_for(r.synced.wait(), 1)
    await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert r.store == {} and len(calls) >= 2 and calls[0] == "rayclusters"


async def test_an_absent_manager_kind_is_listed_again_less_and_less_often(monkeypatch: Any) -> None:
    """A kind the cluster never runs: rechecked after 60 s, then twice as long each time up to 10 min."""
    import asyncio

    import httpx
    from kr8s._exceptions import ServerError

    from ghostgpu.controller.managers import OptionalReflector, resource_type

    class Api:
        def call_api(self, method: str, **kw: Any) -> Any:
            resp = httpx.Response(404, request=httpx.Request("GET", "http://x"))
            raise ServerError("HTTP 404", status="404", response=resp)

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 7:
            raise asyncio.CancelledError

    monkeypatch.setattr(asyncio, "sleep", sleep)
    r = OptionalReflector(Api(), resource_type(TABLE.only("RayCluster")))
    with pytest.raises(asyncio.CancelledError):
        await r.run()
    assert slept == [60, 120, 240, 480, 600, 600, 600]


# --- GPU-hours recovered: managers count like scaled workloads ------------------------------------

# kind -> pods whose GPUs the stop frees: a RayCluster's worker replicas (its head has no GPU), a
# NIMService's replicas before the stop (the stop wrote them to 0), 1 without a replica count.
RECOVERED_PODS = {
    "RayCluster": 2, "NIMService": 2, "Notebook": 1, "InferenceService": 1, "LeaderWorkerSet": 2,
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(RECOVERED_PODS))
async def test_a_stopped_manager_counts_its_gpu_hours_recovered_until_undone(
    tmp_path: Path, kind: str
) -> None:
    a = TABLE.only(kind)
    o = tracked(kind, "w")
    api = FakeApi([o])
    ref = FakeApi.ref(o)
    rec = reconciler(tmp_path, api, [])
    wl = manager_workload(a, o, IS_GPU)
    assert wl.gpus_per_pod == {"nvidia.com/gpu": 1.0}
    if a.stop == "scale":
        assert await rec.actor.stops.scale_to_zero(wl, reclaimable()) == "scaled-to-zero"
    else:
        assert await rec.actor.stops.stop_manager(wl, reclaimable(), a) == "stopped"
    recovered = rec.metrics.gpu_hours_recovered.labels(NS, "all")
    for _ in range(3):  # nothing runs: each poll adds the freed GPUs for one poll interval
        await rec.poll_once(snapshot(api, []))
    per_poll = RECOVERED_PODS[kind] * 1 * 60 / 3600
    assert recovered._value.get() == pytest.approx(3 * per_poll)
    # Undone by someone else (the record is still there): nothing more is counted.
    stopped = api.objects[ref]
    undo = merge(stopped, {"spec": {"replicas": 2}} if a.stop == "scale" else a.restore_patch(stopped))
    undo["metadata"]["annotations"].update(
        {k: v for k, v in stopped["metadata"]["annotations"].items() if k.startswith("ghostgpu.io/reclaimed")}
    )
    api.objects[ref] = undo
    assert not a.is_stopped(undo)
    await rec.poll_once(snapshot(api, []))
    assert recovered._value.get() == pytest.approx(3 * per_poll)


async def test_absent_manager_kinds_cost_one_discovery_request_not_a_list_each() -> None:
    """Kinds whose group/version the apiserver does not serve are not listed: every recheck round
    of all of them asks GET /apis once. A served group/version is listed, and an absent CRD of a
    served group still reads as missing (404)."""
    import asyncio
    import contextlib

    import httpx
    from kr8s._exceptions import ServerError

    from ghostgpu.controller.managers import OptionalReflector, ServedGroupVersions, resource_type

    calls: list[str] = []

    class Api:
        @contextlib.asynccontextmanager
        async def call_api(self, method: str, **kw: Any) -> Any:
            calls.append(f"{kw.get('base', '')}/{kw['url']}")
            if kw.get("base") == "/apis":
                body = {"kind": "APIGroupList", "groups": [{"versions": [{"groupVersion": "ray.io/v1"}]}]}
                yield httpx.Response(200, json=body, request=httpx.Request("GET", "http://x/apis"))
                return
            resp = httpx.Response(404, request=httpx.Request("GET", "http://x"))
            raise ServerError("HTTP 404", status="404", response=resp)

    served = ServedGroupVersions(Api(), ttl=30)
    absent = [a for a in TABLE.managers if a.api_version != "ray.io/v1"]
    ray = [a for a in TABLE.managers if a.api_version == "ray.io/v1"]
    assert absent and ray
    rs = [OptionalReflector(Api(), resource_type(a), served=served, recheck=0.05) for a in [*absent, *ray]]
    tasks = [asyncio.ensure_future(r.run()) for r in rs]
    await asyncio.wait_for(asyncio.gather(*(r.synced.wait() for r in rs)), 1)
    await asyncio.sleep(0.12)  # two more recheck rounds, inside the discovery's 30 s
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert all(r.store == {} for r in rs)
    assert calls.count("/apis/") == 1, calls
    listed = {c for c in calls if c != "/apis/"}
    assert listed == {f"/{a.plural}" for a in ray}, "only the served group's kinds are listed"


async def test_failed_discovery_lists_every_manager_kind() -> None:
    import asyncio
    import contextlib

    import httpx
    from kr8s._exceptions import ServerError

    from ghostgpu.controller.managers import OptionalReflector, ServedGroupVersions, resource_type

    calls: list[str] = []

    class Api:
        @contextlib.asynccontextmanager
        async def call_api(self, method: str, **kw: Any) -> Any:
            calls.append(kw["url"])
            code = 500 if kw.get("base") == "/apis" else 404
            resp = httpx.Response(code, request=httpx.Request("GET", "http://x"))
            raise ServerError(f"HTTP {code}", status=str(code), response=resp)
            yield  # pragma: no cover

    served = ServedGroupVersions(Api())
    a = TABLE.only("RayCluster")
    r = OptionalReflector(Api(), resource_type(a), served=served, recheck=10)
    task = asyncio.ensure_future(r.run())
    await asyncio.wait_for(r.synced.wait(), 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert calls == ["", "rayclusters"], "discovery failed: the kind is listed to find out"


async def test_a_present_manager_kind_is_listed_once_then_watched_from_that_list() -> None:
    """The optional reflector's own list is the plain reflector's starting point: one list at
    start, then a watch from its resourceVersion (a second list would double the start's cost)."""
    import asyncio
    import contextlib

    import httpx

    from ghostgpu.controller.managers import OptionalReflector, resource_type

    calls: list[dict[str, Any]] = []
    watching = asyncio.Event()

    class Api:
        @contextlib.asynccontextmanager
        async def call_api(self, method: str, **kw: Any) -> Any:
            calls.append(dict(kw.get("params") or {}))
            if (kw.get("params") or {}).get("watch"):
                watching.set()
                await asyncio.sleep(3600)
            body = {"metadata": {"resourceVersion": "41"}, "items": [
                {"metadata": {"name": "rc", "namespace": "ns", "resourceVersion": "40"}}]}  # fmt: skip
            yield httpx.Response(200, json=body, request=httpx.Request("GET", "http://x"))

    r = OptionalReflector(Api(), resource_type(TABLE.only("RayCluster")), recheck=10)
    task = asyncio.ensure_future(r.run())
    await asyncio.wait_for(watching.wait(), 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [c.get("watch") for c in calls] == [None, "true"], calls
    assert calls[1]["resourceVersion"] == "41" and ("ns", "rc") in r.store
