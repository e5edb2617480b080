"""The actuator table keyed by API group and kind: two groups that name a kind alike (batch/v1's Job
and Volcano's batch.volcano.sh Job) are each handled by their own row; a kind-only row in
ghostgpu.yaml is read as the one known group of its kind, and refused when the kind has several;
`ghostgpu restore` takes KIND/NAME when the kind is unambiguous and KIND.GROUP/NAME always; Volcano's
stop is a Command object its job controller reads (AbortJob), undone by a ResumeJob Command."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from ghostgpu.actuators import RECLAIMED_FROM_RECORD, ActuatorTable, known_groups
from ghostgpu.config import ConfigError, ControllerConfig, load_config_text, load_default_config
from ghostgpu.controller.act.stops import restore, stop
from ghostgpu.controller.inventory import WorkloadRef, gpu_predicate, pod_view
from ghostgpu.controller.managers import Resolver, manager_workload
from ghostgpu.controller.ops import RestoreError, parse_target
from ghostgpu.render import render_bundles
from tests.unit.test_managers import FakeApi

IS_GPU = gpu_predicate(["nvidia.com/gpu"])
NS = "team-a"
TEMPLATE = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
VOLCANO = ("batch.volcano.sh", "Job")


def volcano_job(name: str, phase: str = "Running", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "3",
                     "labels": {"ghostgpu.io/tracked": "true", **labels}},
        "spec": {"minAvailable": 1, "tasks": [{"name": "w", "replicas": 2, "template": TEMPLATE}]},
        "status": {"state": {"phase": phase}},
    }  # fmt: skip


def pod_of(name: str, api_version: str, kind: str, owner: str) -> Any:
    ref = {"apiVersion": api_version, "kind": kind, "name": owner, "uid": f"uid-{owner}", "controller": True}
    return pod_view(
        {
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "ownerReferences": [ref]},
            "spec": TEMPLATE["spec"],
            "status": {"phase": "Running"},
        },
        IS_GPU,
    )


def test_a_batch_job_and_a_volcano_job_of_one_name_are_each_handled_by_their_own_row() -> None:
    table = ActuatorTable()
    assert table.get(*VOLCANO) is not None and table.get("batch", "Job") is None
    vj = manager_workload(table.get(*VOLCANO), volcano_job("train"), IS_GPU)  # type: ignore[arg-type]
    assert vj.ref == WorkloadRef("Job", NS, "train", "batch.volcano.sh") and not vj.no_actuator
    volcano_pod = pod_of("train-w-0", "batch.volcano.sh/v1alpha1", "Job", "train")
    batch_pod = pod_of("train-x", "batch/v1", "Job", "train")  # a batch/v1 Job of the same name
    res = Resolver(table).resolve({}, {("Job", NS, "train"): None}, {vj.ref: vj}, [volcano_pod, batch_pod])
    # Volcano's pod is its Job's workload; the batch Job has no row: no workload, held as itself
    assert res.top_of(volcano_pod) == vj.ref and list(res.workloads) == [vj.ref]
    assert res.top_of(batch_pod) is None
    assert res.holder_of(batch_pod) == WorkloadRef("Job", NS, "train", "batch")
    assert res.holder_of(batch_pod) != res.holder_of(volcano_pod)


def test_a_user_row_for_batch_jobs_sits_beside_volcanos() -> None:
    row = {"group": "batch", "version": "v1", "kind": "Job", "plural": "jobs", "stop": "field",
           "field": "/spec/suspend", "value": True, "restoreValue": False,
           "containers": ["/spec/template/spec/containers"]}  # fmt: skip
    table = ActuatorTable(ControllerConfig.model_validate({"actuators": [row]}).actuators)
    batch, volcano = table.get("batch", "Job"), table.get(*VOLCANO)
    assert batch is not None and volcano is not None and batch is not volcano
    assert batch.writes == ["/spec/suspend"] and volcano.stop == "create"
    meta = {"name": "train", "namespace": NS, "uid": "uid-b", "labels": {"ghostgpu.io/tracked": "true"}}
    bj_obj = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"template": TEMPLATE}}
    bj = manager_workload(batch, bj_obj, IS_GPU)
    vj = manager_workload(volcano, volcano_job("train"), IS_GPU)
    volcano_pod = pod_of("train-w-0", "batch.volcano.sh/v1alpha1", "Job", "train")
    batch_pod = pod_of("train-x", "batch/v1", "Job", "train")
    res = Resolver(table).resolve({}, {}, {bj.ref: bj, vj.ref: vj}, [volcano_pod, batch_pod])
    assert res.top_of(batch_pod) == bj.ref and res.top_of(volcano_pod) == vj.ref
    assert table.for_ref(bj.ref) is batch and table.for_ref(vj.ref) is volcano
    assert batch.action_class == "stop_job.batch" and volcano.action_class == "stop_job.batch.volcano.sh"


def test_a_kind_only_row_is_read_as_the_one_known_group_of_its_kind() -> None:
    row = {"version": "v1", "kind": "RayCluster", "plural": "rayclusters", "stop": "none",
           "containers": ["/spec/headGroupSpec/template/spec/containers"]}  # fmt: skip
    [a] = ControllerConfig.model_validate({"actuators": [row]}).actuators
    assert a.group == "ray.io" and ActuatorTable([a]).get("ray.io", "RayCluster") is a


def test_a_kind_only_row_of_an_ambiguous_kind_names_the_key_line_and_groups() -> None:
    assert known_groups("Job") == ["batch", "batch.volcano.sh"]
    text = (
        "apiVersion: ghostgpu.io/v1alpha1\nkind: GhostgpuConfig\nflavors:\n"
        "  - name: a100\n    resource: nvidia.com/gpu\n    nodeLabels: {gpu: a100}\n"
        "teams:\n  - name: t\n    namespaces: [t]\n    quota: {a100: 1}\n"
        "controller:\n  actuators:\n"
        "    - version: v1\n      kind: Job\n      plural: jobs\n      stop: none\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config_text(text)
    msg = str(err.value)
    assert "controller.actuators[0]" in msg and "(line 13)" in msg
    assert "batch, batch.volcano.sh" in msg and "name the group" in msg
    with pytest.raises(ValidationError, match="no known API group has kind Trainer"):
        ControllerConfig.model_validate({"actuators": [{"version": "v1", "kind": "Trainer",
                                                        "plural": "trainers", "stop": "none"}]})  # fmt: skip


def test_restore_takes_kind_name_when_unambiguous_and_kind_group_name_always() -> None:
    assert parse_target("raycluster/r", NS) == WorkloadRef("RayCluster", NS, "r", "ray.io")
    assert parse_target("rayclusters.ray.io/r", NS) == WorkloadRef("RayCluster", NS, "r", "ray.io")
    assert parse_target("job.batch.volcano.sh/x", NS) == WorkloadRef("Job", NS, "x", "batch.volcano.sh")
    assert parse_target("deploy/web", NS) == WorkloadRef("Deployment", NS, "web", "apps")
    with pytest.raises(
        RestoreError, match=r"job.batch.volcano.sh/x or job.batch/x|job.batch/x or job.batch.volcano.sh/x"
    ):
        parse_target("job/x", NS)
    with pytest.raises(RestoreError, match="no kind ghostgpu restores"):
        parse_target("job.example.com/x", NS)
    with pytest.raises(RestoreError, match=r"job\.batch has no actuator row"):
        parse_target("job.batch/x", NS)
    # the name an Event tells a person to restore is one parse_target takes back
    ref = WorkloadRef("Job", NS, "x", "batch.volcano.sh")
    assert ref.target == "job.batch.volcano.sh/x" and parse_target(ref.target, NS) == ref


def test_volcano_is_stopped_by_an_abortjob_command_and_restored_by_a_resumejob_command() -> None:
    a = ActuatorTable().get(*VOLCANO)
    assert a is not None
    api = FakeApi([volcano_job("train")])
    ref = WorkloadRef("Job", NS, "train", "batch.volcano.sh")
    done = asyncio.run(stop(api, ref, a, is_leader=True))
    assert done.outcome == "stopped" and json.loads(done.record) == {}
    [(plural, cmd)] = api.created
    assert (
        plural == "commands" and cmd["apiVersion"] == "bus.volcano.sh/v1alpha1" and cmd["kind"] == "Command"
    )
    assert cmd["action"] == "AbortJob" and cmd["metadata"]["namespace"] == NS
    # what Volcano's controller filters on: the target's apiVersion, kind and name
    assert cmd["target"] == {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "train",
                             "uid": "uid-train", "controller": True}  # fmt: skip
    assert cmd["metadata"]["ownerReferences"] == [cmd["target"]]
    # the record went first, on the Job itself; the Job's spec is not written
    assert [w for _, w in api.writes] == ["patch", "create"]
    job = api.objects[ref]
    assert (
        RECLAIMED_FROM_RECORD in job["metadata"]["annotations"]
        and job["spec"] == volcano_job("train")["spec"]
    )
    assert not a.is_stopped(job)  # until Volcano reports it
    # asked already: the next poll creates no second Command while Volcano has not acted
    assert asyncio.run(stop(api, ref, a, is_leader=True)).outcome == "already-asked"
    assert len(api.created) == 1
    job["status"]["state"]["phase"] = "Aborted"
    assert a.is_stopped(job)
    assert asyncio.run(stop(api, ref, a, is_leader=True)).outcome == "already-stopped"
    done_r = asyncio.run(restore(api, ref, a))
    assert "ResumeJob" in done_r.what
    (_, resume) = api.created[-1]
    assert resume["action"] == "ResumeJob" and resume["target"]["name"] == "train"
    assert RECLAIMED_FROM_RECORD not in (api.objects[ref]["metadata"].get("annotations") or {})


def test_a_volcano_stop_whose_command_is_refused_leaves_no_record() -> None:
    from ghostgpu.controller.kube import AdmissionDenied

    class Refusing(FakeApi):
        async def create_object(self, plural: str, obj: Any) -> dict[str, Any]:
            raise AdmissionDenied("commands is forbidden")

    a = ActuatorTable().get(*VOLCANO)
    assert a is not None
    api = Refusing([volcano_job("train")])
    ref = WorkloadRef("Job", NS, "train", "batch.volcano.sh")
    assert asyncio.run(stop(api, ref, a, is_leader=True)).outcome == "blocked"
    assert RECLAIMED_FROM_RECORD not in (api.objects[ref]["metadata"].get("annotations") or {})


def test_the_table_reads_as_rows_with_group_kind_stop_restore_and_risk() -> None:
    rows = ActuatorTable().rows()
    assert rows == sorted(rows, key=lambda a: (a.kind, a.group))
    v = next(a for a in rows if a.group_kind == VOLCANO)
    assert v.describe_stop() == "create a Command action: AbortJob"
    assert v.describe_restore() == "create a Command action: ResumeJob"
    assert v.base_risk == 0.3
    tf = next(a for a in rows if a.kind == "TFJob")
    assert (tf.group, tf.describe_stop(), tf.describe_restore()) == (
        "kubeflow.org",
        "/spec/runPolicy/suspend=True",
        "/spec/runPolicy/suspend back to the recorded value",
    )


def test_the_tracking_policy_tests_the_group_where_two_rows_share_a_kind() -> None:
    def track_condition(cfg: Any) -> str:
        text = render_bundles(cfg)["policies/track-gpu-workloads.yaml"]
        [policy, _] = [d for d in yaml.safe_load_all(text) if d]
        return next(v for v in policy["spec"]["variables"] if v["name"] == "shouldTrack")["expression"]

    cfg = load_default_config()
    # built-ins: Volcano's is the only row of kind Job, and the policy admits only its group's jobs
    plain = track_condition(cfg)
    assert "object.kind == 'Job' && (object.?spec.?tasks" in plain and "apiVersion.startsWith" not in plain
    row = {"group": "batch", "version": "v1", "kind": "Job", "plural": "jobs", "stop": "field",
           "field": "/spec/suspend", "value": True,
           "containers": ["/spec/template/spec/containers"]}  # fmt: skip
    ctrl = cfg.controller.model_copy(
        update={"actuators": ControllerConfig.model_validate({"actuators": [row]}).actuators}
    )
    both = track_condition(cfg.model_copy(update={"controller": ctrl}))
    assert (
        "object.kind == 'Job' && object.apiVersion.startsWith('batch.volcano.sh/') && (object.?spec.?tasks"
        in both
    )
    assert "object.kind == 'Job' && object.apiVersion.startsWith('batch/') && (object.?spec.?template" in both
    assert "object.kind == 'RayCluster' && (" in both  # a kind one row has: no group test
