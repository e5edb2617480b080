"""DRA extended resources (Kubernetes DRAExtendedResource, Kueue KueueDRAIntegrationExtendedResource):
a pod that requests a GPU class's `extendedResourceName` or its implicit
`deviceclass.resource.kubernetes.io/<class>` name in its containers' resources gets devices of the
class through a claim the scheduler creates. The config key, the tracking policy, the controller's
count, and what the Kueue bundle renders for such classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_config import MINIMAL
from test_dra import DRA, errors, tracking_policy
from test_dra_count import DRA_GPU, FLAVORS, claim, exactly, node

from ghostgpu.config import load_config_text
from ghostgpu.controller.app import dra_extended_aliases, load_any_config
from ghostgpu.controller.books.accounting import account
from ghostgpu.controller.claims import DraCounter, claim_view, pod_claim_names
from ghostgpu.controller.inventory import gpu_predicate, pod_view, workload_from
from ghostgpu.render import render_bundles

IMPLICIT_GPU = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
IMPLICIT_MIG = "deviceclass.resource.kubernetes.io/mig.nvidia.com"

# DRA's two NVIDIA classes, whole GPUs also requested as example.com/gpu.
EXTENDED = DRA.replace(
    "teams:",
    "deviceClasses:\n"
    "  - name: gpu.nvidia.com\n"
    "    extendedResourceName: example.com/gpu\n"
    "  - name: mig.nvidia.com\n"
    "teams:",
)


# --- config --------------------------------------------------------------------------------------


def test_a_class_takes_an_extended_resource_name_beside_its_implicit_one() -> None:
    cfg = load_config_text(EXTENDED)
    gpu, mig = cfg.device_classes
    assert gpu.extended_resource_name == "example.com/gpu"
    assert gpu.extended_resource_names == ("example.com/gpu", IMPLICIT_GPU)
    assert mig.extended_resource_name is None and mig.extended_resource_names == (IMPLICIT_MIG,)
    assert cfg.dra_extended_resources == ["deviceclass.resource.kubernetes.io/gpu.nvidia.com",
                                          IMPLICIT_MIG, "example.com/gpu"]  # fmt: skip
    assert cfg.gpu_resources == ["nvidia.com/gpu"], "still the device-plugin names alone"


def test_only_the_classes_a_flavor_names_have_extended_resources_that_count() -> None:
    text = MINIMAL + "deviceClasses: [{name: gpu.nvidia.com, extendedResourceName: example.com/gpu}]\n"
    assert load_config_text(text).dra_extended_resources == []


@pytest.mark.parametrize("name", ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu"])
def test_an_extended_resource_name_of_the_device_plugin_is_refused_with_key_and_line(name: str) -> None:
    [line] = errors(EXTENDED.replace("example.com/gpu", name))
    assert line.startswith(
        f"cluster.yaml: deviceClasses[0].extendedResourceName: '{name}' is a device-plugin resource name"
    ), line
    assert line.endswith("(line 12)"), line


def test_two_classes_sharing_an_extended_resource_name_are_refused_with_key_and_line() -> None:
    text = EXTENDED.replace(
        "  - name: mig.nvidia.com\nteams:",
        "  - name: mig.nvidia.com\n    extendedResourceName: example.com/gpu\nteams:",
    )
    assert errors(text) == [
        "cluster.yaml: deviceClasses[1].extendedResourceName: 'example.com/gpu' is already the "
        "extendedResourceName of device class 'gpu.nvidia.com' (line 14)"
    ]


@pytest.mark.parametrize("name", ["gpu", "example.com/", "Example.com/gpu"])
def test_an_extended_resource_name_must_be_domain_prefixed(name: str) -> None:
    [line] = errors(EXTENDED.replace("example.com/gpu", name))
    assert line.startswith("cluster.yaml: deviceClasses[0].extendedResourceName: ")
    assert "domain-prefixed extended resource name" in line


# --- render --------------------------------------------------------------------------------------


def test_a_file_without_extended_resource_name_renders_as_before() -> None:
    # The key is written only when set: the ConfigMaps of a DRA file without it carry no null.
    files = render_bundles(load_config_text(DRA + "controller: {processSource: agent}\n"))
    assert "extendedResourceName" not in files["controller/configmap.yaml"]
    assert "extendedResourceName" not in files["controller/agent.yaml"]
    # ... and a file whose classes no flavor names renders what it did without deviceClasses.
    listed = MINIMAL + "deviceClasses: [{name: gpu.nvidia.com, extendedResourceName: example.com/gpu}]\n"
    assert render_bundles(load_config_text(listed)) == render_bundles(load_config_text(MINIMAL))


def test_the_tracking_policy_takes_the_gpu_classes_extended_resources_for_gpu_requests() -> None:
    variables = {v["name"]: v["expression"] for v in tracking_policy(EXTENDED)["spec"]["variables"]}
    assert variables["gpuResources"] == (
        f"['{IMPLICIT_GPU}', '{IMPLICIT_MIG}', 'example.com/gpu', 'nvidia.com/gpu']"
    )
    # A class no flavor names is no GPU class: its implicit name is not a GPU request.
    only_gpu = EXTENDED.replace(
        '  - name: mig-dra\n    deviceClass: mig.nvidia.com\n    nodeLabels: {nvidia.com/dra.mig: "true"}\n',
        "",
    ).replace("      mig-dra: 14\n", "")
    variables = {v["name"]: v["expression"] for v in tracking_policy(only_gpu)["spec"]["variables"]}
    assert IMPLICIT_MIG not in variables["gpuResources"]
    assert IMPLICIT_GPU in variables["gpuResources"]


def test_the_kueue_bundle_charges_extended_requests_under_the_class_mapping_unchanged() -> None:
    # Kueue (pkg/dra/extended_resources.go, resolveQuotaKey) finds the DeviceClass by
    # spec.extendedResourceName and charges the request under that class's deviceClassMappings
    # name: the ClusterQueues already cover it, and the bundle is the same with or without the key.
    with_ext = render_bundles(load_config_text(EXTENDED))
    without = render_bundles(load_config_text(DRA))
    for name in without:
        if name.startswith("kueue/"):
            assert with_ext[name] == without[name], name
    assert "example.com/gpu" not in with_ext["kueue/cluster-queues.yaml"]
    assert "deviceclass.resource.kubernetes.io" not in with_ext["kueue/cluster-queues.yaml"]


# --- the controller counts the request ------------------------------------------------------------

ALIASES = {
    "example.com/gpu": "gpu.nvidia.com",
    IMPLICIT_GPU: "gpu.nvidia.com",
    IMPLICIT_MIG: "mig.nvidia.com",
}
IS_GPU = gpu_predicate(["nvidia.com/gpu"], ALIASES)


def extended_pod(
    name: str, uid: str, requests: dict[str, str], *, claim_name: str | None = None
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running"}
    if claim_name:
        # What the scheduler writes (core/v1 PodExtendedResourceClaimStatus): the claim it created.
        status["extendedResourceClaimStatus"] = {
            "resourceClaimName": claim_name,
            "requestMapping": [
                {
                    "containerName": "main",
                    "extendedResourceName": r,
                    "requestName": f"container-0-request-{i}",
                }
                for i, r in enumerate(requests)
            ],
        }
    return {
        "metadata": {"namespace": "team-a", "name": name, "uid": uid},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "main", "resources": {"requests": requests, "limits": requests}}],
        },
        "status": status,
    }


def test_the_aliases_come_from_the_dra_flavors_the_controller_config_carries(tmp_path: Path) -> None:
    whole = tmp_path / "ghostgpu.yaml"
    whole.write_text("apiVersion: ghostgpu.io/v1alpha1\nkind: GhostgpuConfig\n" + EXTENDED)
    assert dra_extended_aliases(load_any_config(whole).controller) == ALIASES
    (cm,) = [
        o
        for o in yaml.safe_load_all(render_bundles(load_config_text(EXTENDED))["controller/configmap.yaml"])
        if o
    ]
    section = yaml.safe_load(next(iter(cm["data"].values())))
    assert section["draFlavors"][0]["extendedResourceName"] == "example.com/gpu"
    assert "extendedResourceName" not in section["draFlavors"][1]
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(section))
    assert dra_extended_aliases(load_any_config(path).controller) == ALIASES


def test_an_extended_request_counts_as_gpus_of_the_class_and_another_class_is_none() -> None:
    view = pod_view(extended_pod("x", "u1", {"example.com/gpu": "2", IMPLICIT_MIG: "1"}), IS_GPU)
    assert dict(view.gpu_requests) == {"gpu.nvidia.com": 2.0, "mig.nvidia.com": 1.0}
    assert view.gpu_containers == ("main",) and view.holds_gpus
    nic = pod_view(
        extended_pod("n", "u2", {"deviceclass.resource.kubernetes.io/nic.example.com": "1"}), IS_GPU
    )
    assert dict(nic.gpu_requests) == {} and not nic.holds_gpus
    # Without the aliases (a file without DRA flavors) the names are no GPU at all.
    plain = pod_view(extended_pod("x", "u1", {"example.com/gpu": "2"}), gpu_predicate(["nvidia.com/gpu"]))
    assert dict(plain.gpu_requests) == {}
    wl = workload_from("Pod", extended_pod("x", "u1", {IMPLICIT_GPU: "3"}), IS_GPU)
    assert dict(wl.gpus_per_pod) == {"gpu.nvidia.com": 3.0}


def test_the_claim_the_scheduler_created_is_not_counted_a_second_time() -> None:
    # claims.py reads spec.resourceClaims (and resourceClaimStatuses) only: the scheduler's claim,
    # named in status.extendedResourceClaimStatus, is no claim of the pod to it.
    pod = extended_pod("x", "u1", {"example.com/gpu": "2"}, claim_name="x-extended-resources-abc")
    assert pod_claim_names(pod["spec"], pod["status"]) == ()
    created = claim(
        "x-extended-resources-abc",
        [("container-0-request-0", "gpu-0"), ("container-0-request-0", "gpu-1")],
        [exactly("container-0-request-0", "gpu.nvidia.com", 2)],
        ["u1"],
    )
    store = {(c.namespace, c.name): c for c in map(claim_view, [created])}
    (view,) = DraCounter(["gpu.nvidia.com", "mig.nvidia.com"]).pods([pod_view(pod, IS_GPU)], store)
    assert dict(view.gpu_requests) == {"gpu.nvidia.com": 2.0}
    assert view.dra_gpus == 0.0 and not view.gpus_unknown
    (acc,) = [
        a for a in account(FLAVORS, [node("node-1", "dra", {})], [view], [], {}) if a.flavor == DRA_GPU.name
    ]
    assert acc.in_use == 2
