"""The live admission chain with the rendered bundles applied: kube-apiserver → Kueue's webhooks →
Kyverno's webhooks (mutating webhooks run in name order, kueue-… before kyverno-…), Kyverno's
background controller generating namespace objects, Kueue admitting Jobs onto kwok GPU nodes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from polling import eventually

from ghostgpu.devcluster import DevCluster

# Every test here goes through Kueue's webhooks (they run before Kyverno's) or its admission.
pytestmark = [pytest.mark.e2e, pytest.mark.kueue, pytest.mark.timeout(300)]

TRACKED = "ghostgpu.io/tracked"
QUEUE = "kueue.x-k8s.io/queue-name"


@pytest.fixture(autouse=True)
def _bundles(applied_bundles: dict[str, list[str]]) -> None:
    errors = [e for errs in applied_bundles.values() for e in errs]
    if errors:
        pytest.fail("the rendered bundles were not accepted:\n" + "\n".join(errors))


def pod_spec(gpus: int = 1, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    return {
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {resource: str(gpus)}}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }


def deployment(name: str, labels: dict[str, str] | None = None, gpus: int = 1) -> dict[str, Any]:
    spec = pod_spec(gpus) if gpus else {"containers": [{"name": "main", "image": "busybox"}]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def apps(dc: DevCluster) -> client.AppsV1Api:
    return client.AppsV1Api(dc.kube.api_client)


def labels_of(obj: Any) -> dict[str, str]:
    return dict(obj.metadata.labels or {})


def test_gpu_deployment_in_opted_in_namespace_is_tracked(
    devcluster: DevCluster, make_namespace: Callable[..., str]
) -> None:
    # Opted in but no team: no LocalQueue `default` is generated, so Kueue leaves it alone.
    ns = make_namespace({"ghostgpu.io/reclaim": "enabled"})
    created = apps(devcluster).create_namespaced_deployment(ns, deployment("notebook"))
    assert labels_of(created).get(TRACKED) == "true"  # set at admission, in the create response
    cpu = apps(devcluster).create_namespaced_deployment(ns, deployment("cpu-only", gpus=0))
    assert TRACKED not in labels_of(cpu)


def test_gpu_deployment_outside_opted_in_namespaces_is_not_tracked(
    devcluster: DevCluster, make_namespace: Callable[..., str]
) -> None:
    ns = make_namespace({})
    created = apps(devcluster).create_namespaced_deployment(ns, deployment("notebook"))
    assert TRACKED not in labels_of(created)


def test_existing_gpu_deployment_is_tracked_when_its_namespace_opts_in(
    devcluster: DevCluster, make_namespace: Callable[..., str]
) -> None:
    ns = make_namespace({})
    apps(devcluster).create_namespaced_deployment(ns, deployment("legacy"))
    devcluster.kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"ghostgpu.io/reclaim": "enabled"}},
        }
    )
    eventually(
        lambda: labels_of(apps(devcluster).read_namespaced_deployment("legacy", ns)).get(TRACKED) == "true",
        timeout=90,
        what="mutate-existing to label the pre-existing Deployment",
    )


def test_labelling_a_namespace_generates_its_localqueue_and_rolebinding(
    devcluster: DevCluster, make_namespace: Callable[..., str]
) -> None:
    ns = make_namespace({})
    devcluster.kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": ns,
                "labels": {"ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": "research"},
            },
        }
    )
    lq = eventually(
        lambda: devcluster.kube.get("kueue.x-k8s.io/v1beta2", "LocalQueue", "default", ns),
        timeout=90,
        what="generated LocalQueue default",
    )
    assert lq.spec.clusterQueue == "research"
    rb = eventually(
        lambda: devcluster.kube.get("rbac.authorization.k8s.io/v1", "RoleBinding", "ghostgpu-controller", ns),
        timeout=60,
        what="generated RoleBinding",
    )
    assert rb.roleRef.name == "ghostgpu-controller-namespaced"
    assert [(s.kind, s.name, s.namespace) for s in rb.subjects] == [
        ("ServiceAccount", "ghostgpu-controller", "ghostgpu-system")
    ]


def test_deployment_in_a_namespace_with_default_localqueue_goes_to_kueue_untracked(
    devcluster: DevCluster, make_namespace: Callable[..., str]
) -> None:
    ns = make_namespace({"ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": "research"})
    eventually(
        lambda: devcluster.kube.get("kueue.x-k8s.io/v1beta2", "LocalQueue", "default", ns),
        timeout=90,
        what="generated LocalQueue default",
    )
    # Kueue's webhook defaults the queue name from its in-memory queue manager, which learns of the
    # LocalQueue from its own informer, a moment after the object exists: wait for that, by dry-run.
    eventually(
        lambda: (
            labels_of(
                apps(devcluster).create_namespaced_deployment(ns, deployment("serving"), dry_run="All")
            ).get(QUEUE)
            == "default"
        ),
        timeout=30,
        what="Kueue's queue manager to know LocalQueue default",
    )
    created = apps(devcluster).create_namespaced_deployment(ns, deployment("serving"))
    labels = labels_of(created)
    assert labels.get(QUEUE) == "default"  # Kueue's LocalQueue defaulting, not ghostgpu
    assert TRACKED not in labels


def test_gpu_job_naming_a_localqueue_is_admitted_and_runs_on_a_kwok_gpu_node(devcluster: DevCluster) -> None:
    ns = "research-batch"  # a statically listed namespace: its LocalQueue comes from kueue/
    # Kueue >= 0.15 respects managedJobsNamespaceSelector for every Job (feature gate
    # ManagedJobsNamespaceSelectorAlwaysRespected); the rendered selector is the opt-in label.
    devcluster.kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": ns,
                "labels": {"ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": "research"},
            },
        }
    )
    name = f"train-{int(time.time() * 1000) % 10**8}"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE: "default"}},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
                    ],
                }
            },
        },
    }
    batch = client.BatchV1Api(devcluster.kube.api_client)
    created = batch.create_namespaced_job(ns, job)
    assert created.spec.suspend is True  # Kueue's webhook suspends it until admission
    core = client.CoreV1Api(devcluster.kube.api_client)

    def pods_on_h100() -> list[Any]:
        pods = core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items
        placed = [p for p in pods if (p.spec.node_name or "").startswith("gpu-h100-")]
        return placed if len(placed) == 2 else []

    pods = eventually(pods_on_h100, timeout=120, what="both Job pods scheduled on kwok H100 nodes")
    # Kueue injected the h100 flavor's node selector and toleration at admission.
    assert pods[0].spec.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    wl_list = devcluster.kube.resource("kueue.x-k8s.io/v1beta2", "Workload").get(namespace=ns)
    [wl] = [w for w in wl_list.items if any(o.name == name for o in w.metadata.ownerReferences or [])]
    admission = wl.status.admission
    assert admission.clusterQueue == "research"
    assert admission.podSetAssignments[0].flavors["nvidia.com/gpu"] == "h100"
    # Leave the GPUs free for the next test: delete the Job and wait for its pods to go.
    batch.delete_namespaced_job(name, ns, propagation_policy="Foreground")
    eventually(
        lambda: not core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items,
        timeout=60,
        what="the Job's pods to be deleted",
    )


def test_queue_named_job_in_a_namespace_that_did_not_opt_in_is_admitted(
    devcluster: DevCluster, make_namespace: Callable[..., str]
) -> None:
    ns = make_namespace({})
    devcluster.kube.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "default", "namespace": ns},
            "spec": {"clusterQueue": "research"},
        }
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "labels": {QUEUE: "default"}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                }
            }
        },
    }
    batch = client.BatchV1Api(devcluster.kube.api_client)
    batch.create_namespaced_job(ns, job)
    eventually(
        lambda: batch.read_namespaced_job("train", ns).spec.suspend is False,
        timeout=30,
        what="Kueue to admit (unsuspend) the Job",
    )
