"""Kueue itself, on whichever release the devcluster runs (hack/versions.env KUEUE_VERSION, or
GHOSTGPU_KUEUE_VERSION for hack/test's pass over KUEUE_EXTRA_VERSIONS): it starts with the rendered
manager Configuration, gets the webhook namespace selectors its release ships, and the behaviour
changes of docs/kueue-versions.md that matter to whoever writes Workloads next to Kueue."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from polling import eventually

from ghostgpu.devcluster import DevCluster
from ghostgpu.devcluster.components import rendered_kueue_config
from ghostgpu.devcluster.paths import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.kueue, pytest.mark.timeout(300)]

KUEUE = "kueue.x-k8s.io/v1beta2"
SYSTEM_SELECTOR = {
    "matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kueue-system"]}
    ]
}


def release(dc: DevCluster) -> tuple[int, int, int]:
    v = dc.state.kueue_version
    assert v, "the devcluster records the Kueue release it runs"
    major, minor, patch = v.lstrip("v").split("-")[0].split(".")
    return int(major), int(minor), int(patch)


LOADED = ("Configuration loaded", "Successfully loaded configuration")


def kueue_log(dc: DevCluster) -> list[dict[str, Any]]:
    [rec] = [p for p in dc.state.processes if p.name == "kueue"]
    out = []
    for line in Path(rec.log).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"level": "raw", "msg": line})
    # The log file is appended across restarts (the doctor and Kueue-configuration tests stop and
    # start Kueue in the same cluster): the running process's lines start at its first line, the
    # configuration it loaded (renamed in v0.18; "Successfully loaded configuration" before).
    starts = [i for i, e in enumerate(out) if e.get("msg") in LOADED]
    return out[starts[-1] :] if starts else out


def test_kueue_runs_the_pinned_release_with_the_rendered_configuration(devcluster: DevCluster) -> None:
    log = kueue_log(devcluster)
    [init] = [e for e in log if e.get("msg") == "Initializing"]
    assert init["gitVersion"] == devcluster.state.kueue_version
    # Kueue decodes its Configuration strictly and exits on an unknown or invalid field; it got
    # past that, and the effective configuration is the rendered one (with Kueue's defaults).
    assert not [e for e in log if str(e.get("msg", "")).startswith(("Unable to", "conflicting feature"))]
    [loaded] = [e for e in log if e.get("msg") in LOADED]
    text = loaded["config"]
    rendered = rendered_kueue_config(REPO_ROOT / "kueue" / "kueue-manager-config.yaml")
    assert rendered is not None
    ready = rendered["waitForPodsReady"]
    assert f"timeout: {ready['timeout'].replace('m', 'm0s')}" in text
    assert f"blockAdmission: {str(ready['blockAdmission']).lower()}" in text
    for framework in rendered["integrations"]["frameworks"]:
        assert f"- {framework}" in text
    assert "LessThanOrEqualToFinalShare" in text


def test_kueue_webhooks_skip_the_system_namespaces_as_the_release_ships(devcluster: DevCluster) -> None:
    adm = client.AdmissionregistrationV1Api(devcluster.kube.api_client)
    hooks = {
        w.name: w
        for cfg in (
            adm.read_mutating_webhook_configuration("kueue-mutating-webhook-configuration"),
            adm.read_validating_webhook_configuration("kueue-validating-webhook-configuration"),
        )
        for w in cfg.webhooks
    }
    sanitize = devcluster.kube.api_client.sanitize_for_serialization
    for name in ("mpod.kb.io", "mdeployment.kb.io", "mstatefulset.kb.io", "vpod.kb.io", "vdeployment.kb.io"):
        assert sanitize(hooks[name].namespace_selector) == SYSTEM_SELECTOR, name
    # v0.18 extended the selector to every job integration (Kueue's webhook kustomization).
    job_selector = sanitize(hooks["mjob.kb.io"].namespace_selector)
    if release(devcluster) >= (0, 18, 0):
        assert job_selector == SYSTEM_SELECTOR
    else:
        assert job_selector in (None, {})


@pytest.fixture
def queue(devcluster: DevCluster, namespace: str) -> Iterator[str]:
    """A LocalQueue in `namespace` on a ClusterQueue with 4 GPUs of a flavor without node labels."""
    uid = uuid.uuid4().hex[:6]
    objs = [
        {"kind": "ResourceFlavor", "metadata": {"name": f"rf-{uid}"}, "spec": {}},
        {
            "kind": "ClusterQueue",
            "metadata": {"name": f"cq-{uid}"},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": f"rf-{uid}",
                                "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "kind": "LocalQueue",
            "metadata": {"name": "q", "namespace": namespace},
            "spec": {"clusterQueue": f"cq-{uid}"},
        },
    ]
    for obj in objs:
        devcluster.kube.apply({"apiVersion": KUEUE, **obj})
    try:
        yield "q"
    finally:
        for obj in reversed(objs):
            md = obj["metadata"]
            devcluster.kube.delete(KUEUE, obj["kind"], md["name"], md.get("namespace"))


def workload(
    name: str, ns: str, queue: str | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "podSets": [
            {
                "name": "main",
                "count": 1,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "c",
                                "image": "busybox",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            }
                        ],
                    }
                },
            }
        ]
    }
    if queue:
        spec["queueName"] = queue
    md: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {}}
    return {"apiVersion": KUEUE, "kind": "Workload", "metadata": md, "spec": spec}


def conditions(dc: DevCluster, name: str, ns: str) -> dict[str, dict[str, Any]]:
    wl = dc.kube.get(KUEUE, "Workload", name, ns)
    return {c["type"]: c for c in (wl.to_dict().get("status") or {}).get("conditions") or []}


def test_orphaned_workload_with_a_job_uid_label_is_finished_from_v0_18(
    devcluster: DevCluster, namespace: str
) -> None:
    """FinishOrphanedWorkloads (Beta, on by default from v0.18): a Workload without ownerReferences
    but with the `kueue.x-k8s.io/job-uid` label is taken for one whose Job is gone and is Finished
    (reason OwnerNotFound) — whatever created it. v0.17 has no such gate and leaves it alone."""
    # A queue that does not exist: Kueue's reconcile shows up as "LocalQueue absent doesn't exist".
    devcluster.kube.apply(workload("orphan", namespace, "absent", {"kueue.x-k8s.io/job-uid": "0" * 8}))
    devcluster.kube.apply(workload("plain", namespace, "absent"))

    def reconciled(name: str) -> bool:
        return "doesn't exist" in conditions(devcluster, name, namespace).get("QuotaReserved", {}).get(
            "message", ""
        )

    if release(devcluster) >= (0, 18, 0):
        finished = eventually(
            lambda: conditions(devcluster, "orphan", namespace).get("Finished"), 30, "Kueue to finish it"
        )
        assert finished["status"] == "True" and finished["reason"] == "OwnerNotFound"
    else:
        eventually(lambda: reconciled("orphan"), 30, "Kueue to reconcile the labelled Workload")
        assert "Finished" not in conditions(devcluster, "orphan", namespace)
    # Without the label a Workload without an owner is left alone by every release.
    eventually(lambda: reconciled("plain"), 30, "Kueue to reconcile the unlabelled Workload")
    assert "Finished" not in conditions(devcluster, "plain", namespace)


def field_keys(fields: Any) -> set[str]:
    """Every key of a managedFields fieldsV1 tree (`f:status`, `k:{"type":"PodsReady"}`, ...)."""
    if not isinstance(fields, dict):
        return set()
    return set(fields) | {k for v in fields.values() for k in field_keys(v)}


def _apply_status(
    dc: DevCluster, name: str, ns: str, cond: dict[str, Any], manager: str, force: bool
) -> None:
    """Server-side apply of one status condition under `manager` (what an external writer does)."""
    body = {"apiVersion": KUEUE, "kind": "Workload", "metadata": {"name": name, "namespace": ns},
            "status": {"conditions": [cond]}}  # fmt: skip
    client.CustomObjectsApi(dc.kube.api_client).patch_namespaced_custom_object_status(
        "kueue.x-k8s.io", "v1beta2", ns, "workloads", name, body,
        field_manager=manager, force=force, _content_type="application/apply-patch+yaml",
    )  # fmt: skip


def test_podsready_is_taken_over_by_kueue_admission_from_v0_18(
    devcluster: DevCluster, namespace: str, queue: str
) -> None:
    """From v0.18 the status writes of Kueue's `kueue-admission` field manager (server-side apply,
    forced) carry the PodsReady condition along with QuotaReserved/Admitted/Evicted/Finished. Once
    Kueue writes such a status from a copy that holds the PodsReady another manager set (here: the
    eviction of a deactivated Workload), `kueue-admission` co-owns that condition and the other
    manager's next non-forced apply of a changed PodsReady is a 409 conflict. v0.17 leaves PodsReady
    to its writer."""
    mgr = "ghostgpu-e2e"
    co = client.CustomObjectsApi(devcluster.kube.api_client)
    devcluster.kube.apply(workload("held", namespace, queue))
    not_ready = {"type": "PodsReady", "status": "False", "reason": "WaitForStart", "message": "not yet",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    _apply_status(devcluster, "held", namespace, not_ready, mgr, force=False)
    try:
        eventually(
            lambda: conditions(devcluster, "held", namespace).get("Admitted", {}).get("status") == "True",
            60,
            "Kueue to admit the Workload",
        )
        # Deactivating it makes the workload controller evict it from its own fresh read; that also
        # frees the quota and ends blockAdmission's wait for this Workload's pods.
        co.patch_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", namespace, "workloads", "held", {"spec": {"active": False}}
        )
        evicted = eventually(
            lambda: conditions(devcluster, "held", namespace).get("Evicted"), 60, "Kueue to evict it"
        )
        assert evicted["status"] == "True" and evicted["reason"] == "Deactivated"
        wl = devcluster.kube.get(KUEUE, "Workload", "held", namespace).to_dict()
        owners = {
            f["manager"]
            for f in wl["metadata"]["managedFields"]
            if f.get("subresource") == "status" and 'k:{"type":"PodsReady"}' in field_keys(f.get("fieldsV1"))
        }
        ready = {**not_ready, "status": "True", "reason": "Started", "message": "all pods ready"}
        if release(devcluster) >= (0, 18, 0):
            assert owners == {"kueue-admission", mgr}
            with pytest.raises(ApiException) as e:
                _apply_status(devcluster, "held", namespace, ready, mgr, force=False)
            assert e.value.status == 409 and "kueue-admission" in str(e.value.body)
            assert conditions(devcluster, "held", namespace)["PodsReady"]["status"] == "False"
            _apply_status(devcluster, "held", namespace, ready, mgr, force=True)  # forcing works
        else:
            assert owners == {mgr}
            _apply_status(devcluster, "held", namespace, ready, mgr, force=False)
        assert conditions(devcluster, "held", namespace)["PodsReady"]["status"] == "True"
    finally:
        devcluster.kube.delete(KUEUE, "Workload", "held", namespace)
