"""Kueue's MultiKueue objects for a manager devcluster and its workers (tests/e2e/test_multikueue.py).

The fields are Kueue's v1beta2 API as v0.17 and v0.19 define it (apis/kueue/v1beta2/
multikueue_types.go, admissioncheck_types.go): a worker's kubeconfig is a Secret in the manager's
Kueue namespace under the key `kubeconfig`, with its credentials inline (Kueue refuses one that
names files unless MultiKueueAllowInsecureKubeconfigs is on); a MultiKueueCluster points at the
Secret (`spec.clusterSource.kubeConfig`, locationType Secret); a MultiKueueConfig lists the
clusters; an AdmissionCheck of controllerName `kueue.x-k8s.io/multikueue` names the
MultiKueueConfig in its parameters, and a ClusterQueue that requires it sends its Workloads to
the workers."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

KUEUE_API = "kueue.x-k8s.io/v1beta2"
KUEUE_NAMESPACE = "kueue-system"  # the manager Configuration's `namespace`
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
KUBECONFIG_KEY = "kubeconfig"  # MultiKueueConfigSecretKey
ORIGIN = "multikueue"  # the manager's multiKueue.origin (Kueue's default)
# multiKueue.dispatcherName values (apis/config/v1beta2/configuration_types.go)
ALL_AT_ONCE = "kueue.x-k8s.io/multikueue-dispatcher-all-at-once"
INCREMENTAL = "kueue.x-k8s.io/multikueue-dispatcher-incremental"


def worker_objects(name: str, kubeconfig: str, namespace: str = KUEUE_NAMESPACE) -> list[dict[str, Any]]:
    """The Secret with the worker's kubeconfig (credentials inline: DevCluster.embedded_kubeconfig)
    and the MultiKueueCluster `name` that reads it."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "data": {KUBECONFIG_KEY: base64.b64encode(kubeconfig.encode()).decode()},
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "MultiKueueCluster",
            "metadata": {"name": name},
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": name}}},
        },
    ]


def manager_objects(check: str, workers: Sequence[str]) -> list[dict[str, Any]]:
    """The MultiKueueConfig `check` listing the workers, and the AdmissionCheck `check` that uses it."""
    return [
        {
            "apiVersion": KUEUE_API,
            "kind": "MultiKueueConfig",
            "metadata": {"name": check},
            "spec": {"clusters": list(workers)},
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "AdmissionCheck",
            "metadata": {"name": check},
            "spec": {
                "controllerName": MULTIKUEUE_CONTROLLER,
                "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": check},
            },
        },
    ]


def manager_kueue_overrides(
    gc_interval: str = "5s", dispatcher: str = ALL_AT_ONCE, frameworks: Sequence[str] = ("batch/job",)
) -> dict[str, Any]:
    """Merged into the manager's rendered Configuration: the `multiKueue` section (how often the
    remote objects whose manager Workload is gone are collected, the origin label's value, the
    dispatcher) and the integrations' frameworks. The manager watches, in each worker, the kind
    of every enabled framework that MultiKueue can dispatch; a worker without that kind's CRD
    stays inactive ("ClientConnectionFailed: no matches for kind PyTorchJob"), so the manager
    enables only the kinds every worker has (the rendered list names Kubeflow, Ray, JobSet...)."""
    return {
        "multiKueue": {"gcInterval": gc_interval, "origin": ORIGIN, "dispatcherName": dispatcher},
        "integrations": {"frameworks": list(frameworks)},
    }
