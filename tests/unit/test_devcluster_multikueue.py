"""The devcluster's MultiKueue pieces without a cluster: Kueue's feature-gate flag, a kubeconfig
with its credentials inline, and the MultiKueue objects a manager needs for its workers
(tests/e2e/test_multikueue.py applies them to real Kueue managers, v0.17 and v0.19)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from ghostgpu.devcluster import components
from ghostgpu.devcluster import multikueue as mk
from ghostgpu.devcluster.cluster import merge_overrides


def test_extra_feature_gates_join_the_devclusters_own_on_one_flag() -> None:
    assert components.kueue_feature_gates_flag() == "--feature-gates=VisibilityOnDemand=false"
    flag = components.kueue_feature_gates_flag({"MultiKueueOrchestratedPreemption": True})
    assert flag == "--feature-gates=VisibilityOnDemand=false,MultiKueueOrchestratedPreemption=true"
    # an extra gate of the same name wins (one flag: Kueue refuses gates in flag and config both)
    assert components.kueue_feature_gates_flag({"VisibilityOnDemand": True}) == (
        "--feature-gates=VisibilityOnDemand=true"
    )


def test_the_embedded_kubeconfig_names_no_file(tmp_path: Path) -> None:
    for name, body in (("ca.crt", b"CA"), ("admin.crt", b"CERT"), ("admin.key", b"KEY")):
        (tmp_path / name).write_bytes(body)
    kc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1",
                                               "certificate-authority": str(tmp_path / "ca.crt")}}],
        "users": [{"name": "u", "user": {"client-certificate": str(tmp_path / "admin.crt"),
                                         "client-key": str(tmp_path / "admin.key")}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }  # fmt: skip
    out = yaml.safe_load(components.embedded_kubeconfig(kc))
    cluster, user = out["clusters"][0]["cluster"], out["users"][0]["user"]
    assert cluster == {
        "server": "https://127.0.0.1:1",
        "certificate-authority-data": base64.b64encode(b"CA").decode(),
    }
    assert user == {
        "client-certificate-data": base64.b64encode(b"CERT").decode(),
        "client-key-data": base64.b64encode(b"KEY").decode(),
    }
    assert str(tmp_path) not in components.embedded_kubeconfig(kc)
    assert "certificate-authority" in kc["clusters"][0]["cluster"]  # the input is not changed


def test_a_worker_is_a_secret_and_a_multikueue_cluster_reading_it() -> None:
    secret, cluster = mk.worker_objects("worker-1", "apiVersion: v1\nkind: Config\n")
    assert (secret["kind"], secret["metadata"]) == (
        "Secret",
        {"name": "worker-1", "namespace": "kueue-system"},
    )
    assert base64.b64decode(secret["data"]["kubeconfig"]).decode().startswith("apiVersion: v1")
    assert cluster["apiVersion"] == "kueue.x-k8s.io/v1beta2" and cluster["kind"] == "MultiKueueCluster"
    assert cluster["spec"] == {
        "clusterSource": {"kubeConfig": {"locationType": "Secret", "location": "worker-1"}}
    }


def test_the_admission_check_names_the_config_of_the_workers() -> None:
    config, check = mk.manager_objects("mk", ["worker-1", "worker-2"])
    assert (config["kind"], config["spec"]) == ("MultiKueueConfig", {"clusters": ["worker-1", "worker-2"]})
    assert check["kind"] == "AdmissionCheck"
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/multikueue"
    assert check["spec"]["parameters"] == {
        "apiGroup": "kueue.x-k8s.io",
        "kind": "MultiKueueConfig",
        "name": "mk",
    }


def test_the_managers_configuration_keeps_the_rendered_one_and_adds_multikueue() -> None:
    base = {"waitForPodsReady": {"timeout": "10m", "blockAdmission": True}, "namespace": "kueue-system"}
    out = merge_overrides(base, mk.manager_kueue_overrides("3s", mk.INCREMENTAL))
    assert out["waitForPodsReady"] == base["waitForPodsReady"]
    assert out["integrations"] == {"frameworks": ["batch/job"]}  # only kinds every worker has
    assert out["multiKueue"] == {
        "gcInterval": "3s",
        "origin": "multikueue",
        "dispatcherName": "kueue.x-k8s.io/multikueue-dispatcher-incremental",
    }
