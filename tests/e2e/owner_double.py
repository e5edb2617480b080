"""TEST DOUBLES of owner controllers, for the e2e tests of tests/e2e/test_owner_managers.py (the real
controllers cannot be built here; tests/doubles/README.md): Kubeflow's Notebook controller (below)
and Volcano's job controller's Command path (VolcanoJobControllerDouble).

Every `period` seconds, for each Notebook (the test-double CRD) in one namespace, it makes the
StatefulSet of the same name exist, owned by the Notebook (controller ownerReference), with the
Notebook's pod template and `replicas` = 0 when the Notebook carries `kubeflow-resource-stopped`,
else 1, put back whatever anyone else wrote there (the Notebook controller reconciles every
StatefulSet change within seconds). It never reads the StatefulSet's labels it did not set.
"""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client

STOP_ANNOTATION = "kubeflow-resource-stopped"


class NotebookControllerDouble:
    def __init__(self, api_client: Any, namespace: str, *, period: float = 0.5) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.ns = namespace
        self.period = period
        self.reverts = 0  # how many times it put `replicas` back after someone else changed it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notebook-controller-double", daemon=True)

    def __enter__(self) -> NotebookControllerDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.reconcile()
            except client.ApiException:
                continue  # a conflict or a deleted namespace: the next round sees the new state

    def reconcile(self) -> None:
        nbs = self.custom.list_namespaced_custom_object("kubeflow.org", "v1", self.ns, "notebooks")["items"]
        for nb in nbs:
            meta = nb["metadata"]
            name = meta["name"]
            desired = 0 if STOP_ANNOTATION in (meta.get("annotations") or {}) else 1
            try:
                sts = self.apps.read_namespaced_stateful_set(name, self.ns)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
                self.apps.create_namespaced_stateful_set(self.ns, self._statefulset(nb, desired))
                continue
            if sts.spec.replicas != desired:
                self.reverts += 1
                self.apps.patch_namespaced_stateful_set(name, self.ns, {"spec": {"replicas": desired}})

    def _statefulset(self, nb: dict[str, Any], replicas: int) -> dict[str, Any]:
        meta = nb["metadata"]
        name = meta["name"]
        template = nb["spec"]["template"]
        labels = {"statefulset": name, "notebook-name": name}
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": name,
                "namespace": self.ns,
                "ownerReferences": [
                    {
                        "apiVersion": nb["apiVersion"],
                        "kind": "Notebook",
                        "name": name,
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "replicas": replicas,
                "serviceName": "",
                "selector": {"matchLabels": {"statefulset": name}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": template["spec"],
                },
            },
        }


VOLCANO_JOB_API = "batch.volcano.sh/v1alpha1"


def jobs_of(ns: str) -> tuple[str, str, str, str]:
    return ("batch.volcano.sh", "v1alpha1", ns, "jobs")


class VolcanoJobControllerDouble:
    """TEST DOUBLE of Volcano's job controller, for the Command path only (the real controller is
    not built here; tests/doubles/README.md). What it does is what pkg/controllers/job does with a
    bus.volcano.sh Command whose `target` is a batch.volcano.sh Job (job_controller.go's filter,
    job_controller_handler.go's processNextCommand, state/*.go): it deletes the Command, then
    AbortJob moves a Pending or Running Job to Aborted (the real one passes Aborting while it kills
    the pods; there are no pods here) and ResumeJob moves an Aborting or Aborted Job on, counting a
    retry (`status.retryCount`), to Running. Any other action or state: the Command is deleted and
    nothing else changes. `handled` lists (job, action) in the order they were read."""

    def __init__(self, api_client: Any, namespace: str, *, period: float = 0.3) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.ns = namespace
        self.period = period
        self.handled: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="volcano-controller-double", daemon=True)

    def __enter__(self) -> VolcanoJobControllerDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.reconcile()
            except client.ApiException:
                continue

    def reconcile(self) -> None:
        cmds = self.custom.list_namespaced_custom_object("bus.volcano.sh", "v1alpha1", self.ns, "commands")
        for cmd in sorted(cmds["items"], key=lambda c: c["metadata"]["creationTimestamp"]):
            target = cmd.get("target") or {}
            if target.get("apiVersion") != VOLCANO_JOB_API or target.get("kind") != "Job":
                continue  # Volcano's informer filter: not a command for its Jobs
            self.custom.delete_namespaced_custom_object(
                "bus.volcano.sh", "v1alpha1", self.ns, "commands", cmd["metadata"]["name"]
            )
            action, name = str(cmd.get("action", "")), str(target.get("name", ""))
            self.handled.append((name, action))
            job = self.custom.get_namespaced_custom_object(*jobs_of(self.ns), name)
            status = dict(job.get("status") or {})
            phase = (status.get("state") or {}).get("phase", "Pending")
            if action == "AbortJob" and phase in ("Pending", "Running"):
                status["state"] = {"phase": "Aborted"}
            elif action == "ResumeJob" and phase in ("Aborting", "Aborted"):
                status["state"] = {"phase": "Running"}
                status["retryCount"] = int(status.get("retryCount", 0)) + 1
            else:
                continue
            self.custom.patch_namespaced_custom_object_status(*jobs_of(self.ns), name, {"status": status})
