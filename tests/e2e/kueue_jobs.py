"""Removing a Kueue Job in e2e tests: now, rather than when a loaded machine gets to it."""

from __future__ import annotations

import contextlib
from typing import Any

from kubernetes import client
from test_controller import wait_for

KUEUE = ("kueue.x-k8s.io", "v1beta2")


def workload_of(api: client.ApiClient, ns: str, job: str) -> dict[str, Any] | None:
    """The Kueue Workload the Job `job` owns, if any."""
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
    return next(
        (w for w in items if any(o.get("name") == job for o in w["metadata"].get("ownerReferences") or [])),
        None,
    )


def delete_job_now(api: client.ApiClient, ns: str, job: str, timeout: float = 60) -> None:
    """Deletes Job `job`, its pods and its Workload, and waits until none is left.

    The tests need the Job's quota and GPUs free, not a measure of how soon a loaded machine's
    garbage collector and Job controller get to a deleted Job (over 60 s in CI). So the pods are
    deleted with grace 0 and lose the Job's tracking finalizer (which only the Job controller
    removes once the Job is gone), and the Workload is deleted directly (Kueue then drops its own
    finalizer). A timeout names what was left."""
    core = client.CoreV1Api(api)
    with contextlib.suppress(client.ApiException):
        # Background propagation: the Job API's default orphans the pods.
        client.BatchV1Api(api).delete_namespaced_job(job, ns, propagation_policy="Background")
    selector = f"job-name={job}"
    core.delete_collection_namespaced_pod(ns, label_selector=selector, grace_period_seconds=0)
    for p in core.list_namespaced_pod(ns, label_selector=selector).items:
        if p.metadata.finalizers:
            with contextlib.suppress(client.ApiException):
                core.patch_namespaced_pod(p.metadata.name, ns, {"metadata": {"finalizers": None}})
    if (w := workload_of(api, ns, job)) is not None:
        with contextlib.suppress(client.ApiException):
            client.CustomObjectsApi(api).delete_namespaced_custom_object(
                *KUEUE, ns, "workloads", w["metadata"]["name"]
            )

    def left() -> list[str]:
        pods = core.list_namespaced_pod(ns, label_selector=selector).items
        names = [f"pod {p.metadata.name} ({p.metadata.finalizers})" for p in pods]
        w = workload_of(api, ns, job)
        return names if w is None else [f"workload {w['metadata']['name']}", *names]

    try:
        wait_for(lambda: not left(), timeout, f"job {job} gone")
    except AssertionError as e:
        raise AssertionError(f"{e}; still there: {left()}") from None
