"""GPUs through DRA: the deviceClasses key, a flavor's deviceClass, and what render makes of them
(Kueue's deviceClassMappings and quotas, the tracking policy's ResourceClaimTemplate lookup)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_config import MINIMAL

from ghostgpu.actuators import ActuatorTable, claim_cel, pod_spec_pointers
from ghostgpu.config import ConfigError, load_config, load_config_text, load_default_config
from ghostgpu.render import render_bundles

REPO = Path(__file__).resolve().parents[2]

# Two node pools: one whose GPUs the device plugin serves, one whose GPUs NVIDIA's DRA driver serves.
DRA = """\
flavors:
  - name: h100
    resource: nvidia.com/gpu
  - name: h100-dra
    deviceClass: gpu.nvidia.com
    nodeLabels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/dra.gpu: "true"}
  - name: mig-dra
    deviceClass: mig.nvidia.com
    nodeLabels: {nvidia.com/dra.mig: "true"}
teams:
  - name: research
    quota:
      h100: 4
      h100-dra: {nominalQuota: 8}
      mig-dra: 14
"""


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "cluster.yaml")
    return info.value.lines()


def manager_config(files: dict[str, str]) -> dict[str, Any]:
    cm = yaml.safe_load(files["kueue/kueue-manager-config.yaml"])
    return yaml.safe_load(cm["data"]["controller_manager_config.yaml"])


def cluster_queue(files: dict[str, str], name: str) -> dict[str, Any]:
    docs = yaml.safe_load_all(files["kueue/cluster-queues.yaml"])
    return next(d for d in docs if d and d["metadata"]["name"] == name)


# --- config --------------------------------------------------------------------------------------


def test_nvidia_device_classes_are_defined_by_default_each_charged_under_its_own_name() -> None:
    cfg = load_config_text(MINIMAL)
    assert [(d.name, d.resource) for d in cfg.device_classes] == [
        ("gpu.nvidia.com", "gpu.nvidia.com"),
        ("mig.nvidia.com", "mig.nvidia.com"),
    ]
    assert cfg.dra_classes == [], "a class counts once a flavor names it"


def test_a_flavor_names_a_device_class_and_its_quota_is_charged_under_the_class_resource() -> None:
    cfg = load_config_text(DRA)
    assert [d.name for d in cfg.dra_classes] == ["gpu.nvidia.com", "mig.nvidia.com"]
    assert [cfg.charged_resource(f) for f in cfg.flavors] == [
        "nvidia.com/gpu",
        "gpu.nvidia.com",
        "mig.nvidia.com",
    ]
    assert cfg.gpu_resources == ["nvidia.com/gpu"], "device-plugin resources only"


def test_a_listed_device_class_replaces_the_defaults_and_may_name_its_resource() -> None:
    cfg = load_config_text(
        DRA.replace(
            "teams:",
            "deviceClasses:\n  - {name: gpu.nvidia.com, resource: example.com/whole-gpus}\n"
            "  - name: mig.nvidia.com\nteams:",
        )
    )
    assert [(d.name, d.resource) for d in cfg.device_classes] == [
        ("gpu.nvidia.com", "example.com/whole-gpus"),
        ("mig.nvidia.com", "mig.nvidia.com"),
    ]


def test_an_unknown_device_class_named_by_a_flavor_names_the_key_and_line() -> None:
    text = DRA.replace("teams:", "deviceClasses:\n  - name: gpu.nvidia.com\nteams:")
    assert errors(text) == [
        "cluster.yaml: flavors[2].deviceClass: undefined device class 'mig.nvidia.com'; "
        "defined deviceClasses: gpu.nvidia.com (line 8)"
    ]


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu"])
def test_a_device_class_charged_under_a_device_plugin_resource_is_refused(resource: str) -> None:
    text = DRA.replace(
        "teams:",
        f"deviceClasses:\n  - name: gpu.nvidia.com\n    resource: {resource}\n"
        "  - name: mig.nvidia.com\nteams:",
    )
    [line] = errors(text)
    assert line.startswith(
        f"cluster.yaml: deviceClasses[0].resource: '{resource}' is a device-plugin resource name"
    )
    assert line.endswith("(line 12)")


def test_a_flavor_takes_a_resource_or_a_device_class_not_both_nor_neither() -> None:
    both = DRA.replace(
        "    deviceClass: gpu.nvidia.com\n", "    deviceClass: gpu.nvidia.com\n    resource: nvidia.com/gpu\n"
    )
    [line] = errors(both)
    assert line.startswith("cluster.yaml: flavors[1]: a flavor takes either `resource`")
    assert line.endswith("(line 4)")
    neither = DRA.replace("    deviceClass: gpu.nvidia.com\n", "")
    [line] = errors(neither)
    assert line.startswith("cluster.yaml: flavors[1]: a flavor takes either `resource`")


def test_device_class_names_and_resources_must_be_names_kueue_accepts() -> None:
    lines = errors(
        DRA.replace(
            "teams:",
            "deviceClasses:\n  - {name: GPU_Class}\n"
            "  - {name: gpu.nvidia.com, resource: 'a/b/c'}\n  - name: mig.nvidia.com\nteams:",
        )
    )
    assert any(
        line.startswith("cluster.yaml: deviceClasses[0].name: expected a DeviceClass name") for line in lines
    )
    assert any(
        line.startswith("cluster.yaml: deviceClasses[1].resource: expected a resource name Kueue accepts")
        for line in lines
    )


def test_duplicate_device_classes_are_refused() -> None:
    text = DRA.replace(
        "teams:",
        "deviceClasses:\n  - name: gpu.nvidia.com\n  - name: mig.nvidia.com\n"
        "  - name: gpu.nvidia.com\nteams:",
    )
    [line] = errors(text)
    assert line.startswith("cluster.yaml: deviceClasses[2].name: duplicate name 'gpu.nvidia.com'")


def test_namespace_quota_of_a_dra_flavor_is_refused_for_now() -> None:
    [line] = errors(DRA + "    namespaceQuota: {h100-dra: 2}\n")
    assert line.startswith(
        "cluster.yaml: teams[0].namespaceQuota.h100-dra: flavor 'h100-dra' takes its GPUs through DRA"
    )


# --- render: Kueue ---------------------------------------------------------------------------------


def test_an_unopted_file_renders_no_dra_at_all() -> None:
    # The committed bundles are rendered from the example, which names no device class: no
    # deviceClassMappings (v0.17 runs it without its DRA gate), no lookup in the policies.
    files = render_bundles(load_default_config())
    assert "deviceClassMappings" not in files["kueue/kueue-manager-config.yaml"]
    assert "resourceclaimtemplates" not in files["policies/track-gpu-workloads.yaml"]
    assert "resourceclaimtemplates" not in files["policies/kyverno-rbac.yaml"]
    assert "deviceClass" not in files["controller/agent.yaml"]


def test_the_dra_keys_stay_out_of_the_agent_config_until_a_flavor_names_a_class() -> None:
    # Byte for byte the render of before: listing deviceClasses alone changes nothing.
    plain = render_bundles(load_config_text(MINIMAL))
    listed = render_bundles(load_config_text(MINIMAL + "deviceClasses: [{name: gpu.nvidia.com}]\n"))
    assert plain == listed
    agent = render_bundles(load_config_text(DRA + "controller: {processSource: agent}\n"))[
        "controller/agent.yaml"
    ]
    assert "deviceClass: gpu.nvidia.com" in agent


def test_kueue_maps_the_named_device_classes_and_charges_their_flavors_quota() -> None:
    files = render_bundles(load_config_text(DRA))
    resources = manager_config(files)["resources"]
    assert resources["deviceClassMappings"] == [
        {"name": "gpu.nvidia.com", "deviceClassNames": ["gpu.nvidia.com"]},
        {"name": "mig.nvidia.com", "deviceClassNames": ["mig.nvidia.com"]},
    ]
    assert resources["excludeResourcePrefixes"], "kept beside the mappings"
    groups = cluster_queue(files, "research")["spec"]["resourceGroups"]
    assert groups == [
        {
            "coveredResources": ["nvidia.com/gpu"],
            "flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "4"}]}],
        },
        {
            "coveredResources": ["gpu.nvidia.com"],
            "flavors": [{"name": "h100-dra", "resources": [{"name": "gpu.nvidia.com", "nominalQuota": "8"}]}],
        },
        {
            "coveredResources": ["mig.nvidia.com"],
            "flavors": [{"name": "mig-dra", "resources": [{"name": "mig.nvidia.com", "nominalQuota": "14"}]}],
        },
    ]


def test_classes_charged_under_one_resource_are_one_mapping_and_unnamed_classes_none() -> None:
    text = DRA.replace(
        "teams:",
        "deviceClasses:\n  - {name: gpu.nvidia.com, resource: example.com/gpus}\n"
        "  - {name: mig.nvidia.com, resource: example.com/gpus}\n"
        "  - {name: nic.example.com}\nteams:",
    )
    mappings = manager_config(render_bundles(load_config_text(text)))["resources"]["deviceClassMappings"]
    assert mappings == [
        {"name": "example.com/gpus", "deviceClassNames": ["gpu.nvidia.com", "mig.nvidia.com"]}
    ]


def test_the_rendered_configuration_sets_no_feature_gate() -> None:
    # Kueue v0.17 calls its gate DynamicResourceAllocation (alpha, off) and v0.18+ KueueDRAIntegration
    # (beta, on). v0.19 takes the old name only as Kubernetes' own GA gate, a no-op for Kueue, and the
    # Configuration's gates exclude --feature-gates on the command line: the bundle names no gate and
    # v0.17 users pass the flag (docs/kueue-versions.md).
    assert "featureGates" not in manager_config(render_bundles(load_config_text(DRA)))


# --- render: the tracking policy -------------------------------------------------------------------


def tracking_policy(text: str) -> dict[str, Any]:
    docs = yaml.safe_load_all(render_bundles(load_config_text(text))["policies/track-gpu-workloads.yaml"])
    return next(d for d in docs if d and d["metadata"]["name"] == "ghostgpu-track-gpu-workloads")


def test_the_tracking_policy_looks_up_resource_claim_templates_of_the_gpu_classes() -> None:
    policy = tracking_policy(DRA)
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["gpuDeviceClasses"] == "['gpu.nvidia.com', 'mig.nvidia.com']"
    assert (
        "resource.List('resource.k8s.io/v1', 'resourceclaimtemplates', object.metadata.namespace)"
        in (variables["claimsGpu"])
    )
    # The lookup comes after every label and owner test.
    should = variables["shouldTrack"]
    assert should.index("variables.claimsGpu") > should.index("ownerReferences")
    assert should.index("variables.claimsGpu") > should.index("kueue.x-k8s.io/managed")
    [match] = policy["spec"]["matchConditions"]
    assert "has(c.resourceClaimTemplateName)" in match["expression"]


def test_manager_kinds_whose_pod_templates_name_a_gpu_claim_template_are_tracked() -> None:
    policy = tracking_policy(DRA)
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    claims = variables["managerClaimsGpu"]
    # The same lookup and GPU-class test as a Deployment's, at the pod specs of gpu_cel's pointers.
    assert claims.count("resource.List('resource.k8s.io/v1', 'resourceclaimtemplates'") == 1
    assert claims.split(".exists(t, ", 1)[1].endswith(variables["claimsGpu"].split(" && t.spec.spec", 1)[1])
    table = ActuatorTable()
    for a in table.tracked():
        for spec in pod_spec_pointers(a):
            path = spec.split("/*/")[-1].replace("/", ".?")
            assert f"object.kind == '{a.kind}'" in claims, a.kind
            assert f"{path}.?resourceClaims.orValue([])" in claims, (a.kind, spec)
    assert "x0.?template.?spec.?resourceClaims" in claims  # a RayCluster's worker groups, each one
    # Written last: Kueue's, owned and labelled objects, and device-plugin GPUs need no lookup.
    should = variables["shouldTrack"]
    assert should.endswith(" || variables.managerClaimsGpu)")
    assert should.index("variables.managerClaimsGpu") > should.index("object.kind == 'RayCluster'")
    assert should.index("variables.managerClaimsGpu") > should.index("ghostgpu.io/tracked")
    # matchConditions cannot read variables: a manager naming a template must pass them.
    [match] = policy["spec"]["matchConditions"]
    assert (
        "(object.kind == 'RayCluster' && (object.?spec.?headGroupSpec.?template.?spec.?resourceClaims"
        ".orValue([]).exists(c, has(c.resourceClaimTemplateName)) || object.?spec.?workerGroupSpecs"
        ".orValue([]).exists(x0, x0.?template.?spec.?resourceClaims.orValue([])"
        ".exists(c, has(c.resourceClaimTemplateName)))))"
    ) in match["expression"]


def test_pod_specs_are_the_parents_of_a_kinds_container_lists() -> None:
    table = ActuatorTable()
    jobset = ["/spec/replicatedJobs/*/template/spec/template/spec"]
    assert pod_spec_pointers(table.only("JobSet")) == jobset
    assert pod_spec_pointers(table.only("InferenceService")) == ["/spec/predictor"]
    # A single container or bare requirements name no pod spec: no claim test for the kind.
    assert pod_spec_pointers(table.only("NIMService")) == []
    assert pod_spec_pointers(table.only("TrainJob")) == []
    assert claim_cel(table.only("TrainJob"), "true") == "false"
    # A NIMService names its claim templates in spec.draResources, not in a pod spec: its own list.
    assert (
        claim_cel(table.only("NIMService"), "true")
        == "object.?spec.?draResources.orValue([]).exists(c, true)"
    )
    claims = {v["name"]: v["expression"] for v in tracking_policy(DRA)["spec"]["variables"]}
    assert (
        "(object.kind == 'NIMService' && (object.?spec.?draResources.orValue([]).exists(c, "
        "c.?resourceClaimTemplateName.orValue('') == t.metadata.name)))"
    ) in claims["managerClaimsGpu"]


def test_without_dra_classes_no_manager_claim_test_is_rendered() -> None:
    policy = tracking_policy(MINIMAL)
    names = [v["name"] for v in policy["spec"]["variables"]]
    assert "managerClaimsGpu" not in names and "claimsGpu" not in names
    rendered = render_bundles(load_config_text(MINIMAL))["policies/track-gpu-workloads.yaml"]
    assert "resourceClaim" not in rendered


def test_kyverno_may_read_resource_claim_templates_once_a_class_is_named() -> None:
    rbac = [
        d
        for d in yaml.safe_load_all(render_bundles(load_config_text(DRA))["policies/kyverno-rbac.yaml"])
        if d
    ]
    for role in rbac:
        assert {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaimtemplates"],
            "verbs": ["get", "list"],
        } in role["rules"], role["metadata"]["name"]


def test_the_dra_kyverno_suite_runs_the_policy_its_cluster_file_renders() -> None:
    # tests/policies/track-gpu-workloads-dra, the kyverno CLI suite of the DRA lookup, runs a committed
    # render of its own ghostgpu.yaml. Re-render it with
    #   ghostgpu render -c tests/policies/track-gpu-workloads-dra/ghostgpu.yaml -o /tmp/dra-suite
    #   cp /tmp/dra-suite/policies/track-gpu-workloads.yaml tests/policies/track-gpu-workloads-dra/
    suite = REPO / "tests" / "policies" / "track-gpu-workloads-dra"
    rendered = render_bundles(load_config(suite / "ghostgpu.yaml"))["policies/track-gpu-workloads.yaml"]
    assert (suite / "track-gpu-workloads.yaml").read_text(encoding="utf-8") == rendered
