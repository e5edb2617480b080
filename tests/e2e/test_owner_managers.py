"""End to end: reclaims act on the workload's manager, through its own stop API (DESIGN §4a).

- KubeRay (real: ray-operator v1.5.0 and its CRD, built by `hack/testbin kuberay`): a RayCluster
  with a GPU worker group on kwok nodes is labelled by the tracking policy, judged as ONE workload
  over its GPU pods, reclaimed by `spec.suspend`, stays suspended for 5 windows (KubeRay keeps its
  pods deleted, ghostgpu writes nothing more), and `ghostgpu restore raycluster/NAME` brings its
  pods back.
- Kubeflow Notebook (a TEST DOUBLE: the CRD in tests/doubles/crds and owner_double.py, which puts
  the StatefulSet's replicas back the way the Notebook controller does): a scale of the child does
  not stick; the stop annotation on the Notebook does; `ghostgpu restore notebook/NAME` undoes it.
- An owner kind with no actuator (the `Trainer` double): 0 writes to its child, exactly one
  escalation naming the owner.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from owner_double import STOP_ANNOTATION, NotebookControllerDouble
from proctables import FINISHED
from test_controller import H100, LEASE_NS, REPO, WINDOW, Controller, controller_config, wait_for

from ghostgpu.devcluster import DevCluster, FakeDcgmClient, ProcessTables
from ghostgpu.devcluster.paths import cache_root, read_versions

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

DOUBLES = REPO / "tests" / "doubles" / "crds"
TRACKED = "ghostgpu.io/tracked"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def kuberay_dir() -> Path:
    return cache_root() / f"kuberay-{read_versions()['KUBERAY_VERSION']}"


def restore(dc: DevCluster, target: str, ns: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ghostgpu.cli", "restore", target, "-n", ns,
         "--kubeconfig", str(dc.kubeconfig)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip


def events(dc: DevCluster, ns: str, name: str, reason: str, kind: str | None = None) -> int:
    core = client.CoreV1Api(dc.kube.api_client)
    evs = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return sum(1 for e in evs if e.reason == reason and (kind is None or e.involved_object.kind == kind))


def decided_workloads(ctrl: Controller) -> set[str]:
    """Every workload the controller's decision log has a row for."""
    lines = [json.loads(line) for line in ctrl.decisions.read_text().splitlines()]
    return {d["workload"] for d in lines if "workload" in d and "verdict" in d}


def apply_tracked(dc: DevCluster, doc: dict[str, Any], timeout: float = 90) -> None:
    """Apply `doc` once the tracking policy labels its kind at admission (probed with dry-runs).
    Kyverno learns a CRD installed after it started from its CRD watcher (`--crdWatcher`), then
    registers its webhook for the kind; until then it refuses the kind ("resource ... not found in
    group") or its webhook is not called yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            probe = dc.kube.apply(doc, dry_run=True).to_dict()
            if (probe["metadata"].get("labels") or {}).get(TRACKED) == "true":
                dc.kube.apply(doc)
                return
            last = "admitted unlabelled"
        except Exception as exc:
            if "not found in group" not in str(exc):
                raise
            last = str(exc)[-200:]
        if time.monotonic() > deadline:
            raise AssertionError(f"the tracking policy never labelled a {doc['kind']} ({last})")
        time.sleep(1)


def apply_crds(dc: DevCluster, files: list[Path]) -> None:
    names = []
    for f in files:
        doc = yaml.safe_load(f.read_text())
        dc.kube.apply(doc)
        names.append(doc["metadata"]["name"])
    dc.kube.wait_crds_established(names)


@pytest.fixture
def opted_in(make_namespace: Callable[..., str], devcluster: DevCluster) -> str:
    """Opted in before anything is created: the policy labels the top object at admission. No
    team label, so Kyverno generates no LocalQueue (see test_controller.opt_in)."""
    devcluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    return make_namespace({"ghostgpu.io/reclaim": "enabled"}, prefix="owners")


# --- KubeRay ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kuberay(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The real KubeRay operator as a process against the devcluster, with its real CRD."""
    d = kuberay_dir()
    binary = d / "bin" / "kuberay-operator"
    if not (d / ".done").exists() or not binary.exists():
        pytest.skip(f"KubeRay not built (run hack/testbin kuberay): {d}")
    apply_crds(devcluster, sorted((d / "crds").glob("*.yaml")))
    log = tmp_path_factory.mktemp("kuberay") / "kuberay-operator.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(binary), "--enable-leader-election=false", "--metrics-addr=0",
             "--health-probe-bind-address=127.0.0.1:0", "--log-stdout-encoder=console"],
            stdout=out, stderr=subprocess.STDOUT, env={"KUBECONFIG": str(devcluster.kubeconfig)},
        )  # fmt: skip
        try:
            time.sleep(1)
            if proc.poll() is not None:
                pytest.fail(f"kuberay-operator exited {proc.returncode}: {log.read_text()[-2000:]}")
            yield log
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def raycluster(name: str, ns: str, workers: int) -> dict[str, Any]:
    worker = {
        "name": "ray-worker",
        "image": "rayproject/ray:2.46.0",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {
                    "spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": workers,
                    "minReplicas": 0,
                    "maxReplicas": workers,
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "nodeSelector": H100,
                            "tolerations": [GPU_TOLERATION],
                            "containers": [worker],
                        }
                    },
                }
            ],
        },
    }


def running_pods(dc: DevCluster, ns: str, selector: str) -> list[str]:
    core = client.CoreV1Api(dc.kube.api_client)
    pods = core.list_namespaced_pod(ns, label_selector=selector).items
    return sorted(
        p.metadata.name for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    )


def test_raycluster_is_tracked_judged_as_one_suspended_kept_suspended_and_restored(
    kuberay: Path,
    applied_bundles: dict[str, list[str]],
    devcluster: DevCluster,
    opted_in: str,
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    assert not any(applied_bundles.values()), applied_bundles
    ns, name = opted_in, "idle-ray"
    custom = client.CustomObjectsApi(devcluster.kube.api_client)
    apply_tracked(devcluster, raycluster(name, ns, workers=2))

    def rc() -> dict[str, Any]:
        return custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", name)

    assert rc()["metadata"].get("labels", {}).get(TRACKED) == "true", "the policy labels the RayCluster"
    workers_sel = f"ray.io/cluster={name},ray.io/group=gpu"
    workers = wait_for(
        lambda: (w := running_pods(devcluster, ns, workers_sel)) and len(w) == 2 and w,
        120,
        f"KubeRay's 2 GPU workers running ({kuberay})",
    )
    for pod in workers:
        process_tables.set(ns, pod, FINISHED)
        dcgm.set(ns, pod, util=0.0)
    ctrl = Controller(
        devcluster.kubeconfig, controller_config(tmp_path, prometheus_url, "enforce"), tmp_path, "owners"
    )
    try:
        wait_for(lambda: rc()["spec"].get("suspend") is True, 120, "the RayCluster suspended by ghostgpu")
        ann = rc()["metadata"]["annotations"]
        assert ann["ghostgpu.io/verdict"] == "FINISHED_IDLE"
        assert json.loads(ann["ghostgpu.io/reclaimed-from"]) == {"/spec/suspend": None}
        wait_for(
            lambda: not running_pods(devcluster, ns, f"ray.io/cluster={name}"), 60, "KubeRay deletes the pods"
        )
        ctrl.wait_polls(5 * WINDOW)  # five windows: it stays suspended and nothing is acted on again
        assert rc()["spec"]["suspend"] is True
        assert events(devcluster, ns, name, "Reclaimed", "RayCluster") == 1
        assert ctrl.metric("ghostgpu_reclaims_total", namespace=ns) == 1
        # One workload: the RayCluster, never one of its pods or groups on its own.
        assert {w for w in decided_workloads(ctrl) if f"/{ns}/" in w} == {f"RayCluster/{ns}/{name}"}
    finally:
        ctrl.stop()
        for pod in workers:
            process_tables.clear(ns, pod)
    out = restore(devcluster, f"raycluster/{name}", ns)
    assert out.returncode == 0, out.stderr
    assert "/spec/suspend=false" in out.stdout
    assert rc()["spec"]["suspend"] is False
    assert "ghostgpu.io/reclaimed-from" not in rc()["metadata"].get("annotations", {})
    wait_for(lambda: len(running_pods(devcluster, ns, workers_sel)) == 2, 120, "the GPU workers back")
    again = restore(devcluster, f"raycluster/{name}", ns)
    assert again.returncode == 1 and "not reclaimed" in again.stderr


# --- a Notebook (test double) ---------------------------------------------------------------------


def notebook(name: str, ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "template": {
                "spec": {
                    "nodeSelector": H100,
                    "tolerations": [GPU_TOLERATION],
                    "containers": [
                        {
                            "name": "main",
                            "image": "jupyter:latest",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                }
            }
        },
    }


def test_notebook_double_scaling_the_child_does_not_stick_stopping_the_owner_does(
    applied_bundles: dict[str, list[str]],
    devcluster: DevCluster,
    opted_in: str,
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    assert not any(applied_bundles.values()), applied_bundles
    apply_crds(devcluster, [DOUBLES / "notebooks.kubeflow.org.yaml"])
    ns, name = opted_in, "idle-nb"
    apps = client.AppsV1Api(devcluster.kube.api_client)
    custom = client.CustomObjectsApi(devcluster.kube.api_client)

    def nb() -> dict[str, Any]:
        return custom.get_namespaced_custom_object("kubeflow.org", "v1", ns, "notebooks", name)

    def replicas() -> int:
        return int(apps.read_namespaced_stateful_set(name, ns).spec.replicas)

    apply_tracked(devcluster, notebook(name, ns))
    assert nb()["metadata"].get("labels", {}).get(TRACKED) == "true"
    with NotebookControllerDouble(devcluster.kube.api_client, ns) as owner:
        [pod] = wait_for(lambda: running_pods(devcluster, ns, f"statefulset={name}"), 90, "the notebook pod")
        # Acting on the child does not stick: its owner puts replicas back.
        apps.patch_namespaced_stateful_set_scale(name, ns, {"spec": {"replicas": 0}})
        wait_for(
            lambda: owner.reverts >= 1 and replicas() == 1, 30, "the owner reverting a scale of its child"
        )
        wait_for(lambda: running_pods(devcluster, ns, f"statefulset={name}"), 90, "the notebook pod back")
        [pod] = running_pods(devcluster, ns, f"statefulset={name}")
        process_tables.set(ns, pod, FINISHED)
        dcgm.set(ns, pod, util=0.0)
        reverts = owner.reverts
        ctrl = Controller(
            devcluster.kubeconfig, controller_config(tmp_path, prometheus_url, "enforce"), tmp_path, "nb"
        )
        try:
            wait_for(lambda: STOP_ANNOTATION in nb()["metadata"].get("annotations", {}), 120, "the stop")
            wait_for(lambda: replicas() == 0, 30, "the owner scaling its StatefulSet to 0")
            ctrl.wait_polls(3 * WINDOW)
            assert replicas() == 0 and owner.reverts == reverts + 1  # the owner's own scale-down only
            assert events(devcluster, ns, name, "Reclaimed", "Notebook") == 1
            sts_ann = apps.read_namespaced_stateful_set(name, ns).metadata.annotations or {}
            assert not [k for k in sts_ann if k.startswith("ghostgpu.io/")], "the child is never written"
        finally:
            ctrl.stop()
            process_tables.clear(ns, pod)
        out = restore(devcluster, f"notebook/{name}", ns)
        assert out.returncode == 0, out.stderr
        assert STOP_ANNOTATION not in nb()["metadata"].get("annotations", {})
        wait_for(lambda: replicas() == 1 and running_pods(devcluster, ns, f"statefulset={name}"), 90, "back")


# --- an owner with no actuator --------------------------------------------------------------------


def test_unknown_owner_zero_writes_to_the_child_one_escalation(
    applied_bundles: dict[str, list[str]],
    devcluster: DevCluster,
    opted_in: str,
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    assert not any(applied_bundles.values()), applied_bundles
    apply_crds(devcluster, [DOUBLES / "trainers.example.com.yaml"])
    ns = opted_in
    custom = client.CustomObjectsApi(devcluster.kube.api_client)
    apps = client.AppsV1Api(devcluster.kube.api_client)
    trainer = custom.create_namespaced_custom_object(
        "example.com", "v1", ns, "trainers",
        {"apiVersion": "example.com/v1", "kind": "Trainer", "metadata": {"name": "t1"}, "spec": {}},
    )  # fmt: skip
    owner_ref = {"apiVersion": "example.com/v1", "kind": "Trainer", "name": "t1",
                 "uid": trainer["metadata"]["uid"], "controller": True}  # fmt: skip
    labels = {"app": "t1-job"}
    devcluster.kube.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "t1-job", "namespace": ns, "ownerReferences": [owner_ref]},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": H100,
                        "tolerations": [GPU_TOLERATION],
                        "containers": [
                            {"name": "main", "image": "t:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                        ],
                    },
                },
            },
        }
    )
    dep = apps.read_namespaced_deployment("t1-job", ns)
    assert (dep.metadata.labels or {}).get(TRACKED) == "true"
    written_at = dep.metadata.resource_version
    [pod] = wait_for(lambda: running_pods(devcluster, ns, "app=t1-job"), 90, "the trainer's pod")
    process_tables.set(ns, pod, FINISHED)
    dcgm.set(ns, pod, util=0.0)
    ctrl = Controller(
        devcluster.kubeconfig, controller_config(tmp_path, prometheus_url, "enforce"), tmp_path, "unknown"
    )
    try:
        wait_for(
            lambda: events(devcluster, ns, "t1", "ReclaimEscalated", "Trainer") == 1, 120, "the escalation"
        )
        ctrl.wait_polls(3 * WINDOW)
        assert events(devcluster, ns, "t1", "ReclaimEscalated", "Trainer") == 1
        assert events(devcluster, ns, "t1", "VerdictFinishedIdle", "Trainer") == 1  # not one per poll
        dep = apps.read_namespaced_deployment("t1-job", ns)
        assert dep.spec.replicas == 1
        assert not [k for k in dep.metadata.annotations or {} if k.startswith("ghostgpu.io/")]
        # No write at all to the child: its metadata is as the apiserver last stored it for us.
        assert dep.metadata.resource_version == written_at or dep.metadata.generation == 1
        core = client.CoreV1Api(devcluster.kube.api_client)
        pod_ann = core.read_namespaced_pod(pod, ns).metadata.annotations or {}
        assert not [k for k in pod_ann if k.startswith("ghostgpu.io/")]
        assert events(devcluster, ns, "t1-job", "Reclaimed") == 0
        assert ctrl.metric("ghostgpu_escalations_total", namespace=ns) == 1
    finally:
        ctrl.stop()
        process_tables.clear(ns, pod)
