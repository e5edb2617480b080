"""TEST DOUBLE of an owner controller: what the Kubeflow Notebook controller does to its
StatefulSet, for the e2e tests of tests/e2e/test_owner_managers.py (the real controller cannot be
built here; tests/doubles/README.md).

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
