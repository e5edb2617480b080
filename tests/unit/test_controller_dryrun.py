"""kube.Cluster.patch_annotations against an in-memory apiserver that runs Kueue v0.17's Deployment
webhook (pkg/controller/jobs/deployment/deployment_webhook.go): with a LocalQueue `default` in the
namespace it defaults queue-name on every UPDATE (and Kueue's labels on the pod template), refuses
that as immutable while the Deployment has ready replicas, and accepts it at 0 ready replicas. The
controller's write must be dry-run first and never land when Kueue would change the object."""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from kr8s._exceptions import ServerError

from ghostgpu.controller.inventory import WorkloadRef, gpu_predicate, workload_from
from ghostgpu.controller.kube import (
    AdmissionDenied,
    Cluster,
    Conflict,
    WouldMutate,
    admission_changes,
)

QUEUE = "kueue.x-k8s.io/queue-name"
MANAGED = "kueue.x-k8s.io/managed"
REF = WorkloadRef("Deployment", "team-a", "legacy")


def deployment(ready: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "legacy",
            "namespace": "team-a",
            "uid": "uid-legacy",
            "resourceVersion": "7",
            "generation": 3,
            "labels": {"ghostgpu.io/tracked": "true"},
            "annotations": {"deployment.kubernetes.io/revision": "1"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "legacy"}},
            "template": {
                "metadata": {"labels": {"app": "legacy"}},
                "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            },
        },
        "status": {"replicas": 1, "readyReplicas": ready, "observedGeneration": 3},
    }


class KueueApi:
    """GET and merge-PATCH of one Deployment, with resourceVersion preconditions and Kueue's
    mutating + validating webhook when `default_queue`; `dryRun=All` runs everything, stores nothing."""

    def __init__(self, obj: dict[str, Any], *, default_queue: bool) -> None:
        self.obj = obj
        self.default_queue = default_queue
        self.calls: list[tuple[str, bool]] = []  # (method, dry run)

    def _error(self, code: int, message: str) -> ServerError:
        resp = httpx.Response(code, request=httpx.Request("PATCH", "http://x"))
        return ServerError(message, status=str(code), response=resp)

    @contextlib.asynccontextmanager
    async def call_api(self, method: str, **kw: Any) -> AsyncIterator[httpx.Response]:
        dry = (kw.get("params") or {}).get("dryRun") == "All"
        self.calls.append((method, dry))
        if method == "GET":
            yield httpx.Response(200, json=self.obj)
            return
        assert method == "PATCH" and kw["headers"]["Content-Type"] == "application/merge-patch+json"
        patch = json.loads(kw["content"])["metadata"]
        old = self.obj
        rv = patch.pop("resourceVersion", None)
        if rv is not None and rv != old["metadata"]["resourceVersion"]:
            raise self._error(409, "the object has been modified")
        new = copy.deepcopy(old)
        if patch["annotations"]:  # the Deployment strategy bumps generation on annotation changes
            new["metadata"]["generation"] += 1
        for k, v in patch["annotations"].items():
            if v is None:
                new["metadata"]["annotations"].pop(k, None)
            else:
                new["metadata"]["annotations"][k] = v
        if self.default_queue and QUEUE not in new["metadata"]["labels"]:
            # mdeployment.kb.io: ApplyDefaultLocalQueue, then the pod template is suspended by parent
            new["metadata"]["labels"][QUEUE] = "default"
            tpl = new["spec"]["template"]["metadata"]
            tpl["labels"].update({MANAGED: "true", QUEUE: "default"})
            tpl.setdefault("annotations", {})["kueue.x-k8s.io/pod-suspending-parent"] = "deployment"
            if old["status"].get("readyReplicas", 0) > 0:  # vdeployment.kb.io: immutable while ready
                raise self._error(
                    422,
                    'admission webhook "vdeployment.kb.io" denied the request: '
                    f'metadata.labels[{QUEUE}]: Invalid value: "default": field is immutable',
                )
        if not dry:
            new["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
            self.obj = new
        yield httpx.Response(200, json=new)


@pytest.mark.parametrize("passed_current", [True, False])
async def test_zero_ready_replicas_kueue_would_add_queue_name_so_nothing_is_written(
    passed_current: bool,
) -> None:
    api = KueueApi(deployment(ready=0), default_queue=True)
    before = copy.deepcopy(api.obj)
    cluster = Cluster(api, instance="test")
    current = workload_from("Deployment", before, gpu_predicate(["nvidia.com/gpu"])).raw
    with pytest.raises(WouldMutate, match=r"queue-name.*None -> 'default'") as err:
        await cluster.patch_annotations(
            REF, {"ghostgpu.io/verdict": "ZOMBIE_CRASHED"}, current=current if passed_current else None
        )
    assert isinstance(err.value, AdmissionDenied), "callers fall back as for a refused write"
    assert "spec.template.metadata.labels" in str(err.value) and "pod template would change" in str(err.value)
    assert api.obj == before, "nothing stored"
    # only the dry-run was sent (after a GET when the caller had no copy of the object)
    assert api.calls == ([] if passed_current else [("GET", False)]) + [("PATCH", True)]


async def test_ready_replicas_the_refusal_surfaces_from_the_dry_run() -> None:
    api = KueueApi(deployment(ready=1), default_queue=True)
    before = copy.deepcopy(api.obj)
    with pytest.raises(AdmissionDenied, match=r"vdeployment\.kb\.io") as err:
        await Cluster(api, instance="t").patch_annotations(REF, {"ghostgpu.io/verdict": "X"}, current=before)
    assert not isinstance(err.value, WouldMutate)
    assert api.obj == before and api.calls == [("PATCH", True)]


async def test_no_default_local_queue_the_same_patch_is_written_after_the_dry_run() -> None:
    api = KueueApi(deployment(ready=0), default_queue=False)
    current = workload_from("Deployment", copy.deepcopy(api.obj), gpu_predicate(["nvidia.com/gpu"])).raw
    out = await Cluster(api, instance="t").patch_annotations(
        REF, {"ghostgpu.io/verdict": "FINISHED_IDLE"}, resource_version="7", current=current
    )
    assert api.calls == [("PATCH", True), ("PATCH", False)]
    assert out["metadata"]["annotations"]["ghostgpu.io/verdict"] == "FINISHED_IDLE"
    assert api.obj["metadata"]["annotations"]["ghostgpu.io/verdict"] == "FINISHED_IDLE"
    assert QUEUE not in api.obj["metadata"]["labels"] and api.obj["spec"] == deployment(0)["spec"]
    # the precondition goes with the dry-run too: a stale read never reaches the real write
    with pytest.raises(Conflict):
        await Cluster(api, instance="t").patch_annotations(
            REF, {"a": "b"}, resource_version="7", current=current
        )
    assert api.calls[-1] == ("PATCH", True)


def test_admission_changes_ignores_everything_but_kueue_fields_and_the_pod_template() -> None:
    before = deployment(ready=0)
    after = copy.deepcopy(before)
    after["metadata"]["generation"] += 1  # what an annotation change does to a Deployment
    after["metadata"]["annotations"]["ghostgpu.io/verdict"] = "ACTIVE"
    after["metadata"]["resourceVersion"] = "8"
    after["metadata"]["managedFields"].append({"manager": "ghostgpu"})
    after["status"]["readyReplicas"] = 1
    assert admission_changes(before, after) == []
    # an object that is already Kueue's keeps its label: no change, no alarm
    before["metadata"]["labels"][QUEUE] = after["metadata"]["labels"][QUEUE] = "team"
    assert admission_changes(before, after) == []
    after["metadata"]["labels"][QUEUE] = "default"
    assert admission_changes(before, after) == [f"metadata.labels[{QUEUE}]: 'team' -> 'default'"]
    # a copy without generation (a slimmed cache) still catches Kueue's labels
    slim = {"metadata": {"labels": {}}}
    assert admission_changes(slim, {"metadata": {"labels": {}, "generation": 9}}) == []
    assert admission_changes(slim, {"metadata": {"labels": {MANAGED: "true"}}}) != []
    # any other change of the pod template counts too (some other webhook's, or Kueue's next one)
    after["spec"]["template"]["spec"]["schedulerName"] = "other"
    assert "spec.template (the pod template would change)" in admission_changes(before, after)
