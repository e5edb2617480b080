"""`ghostgpu render`: bundle contents, determinism, the committed bundles, --check and exit codes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.config import ControllerConfig, load_config_text, load_default_config
from ghostgpu.render import (
    BUNDLES,
    HEADER,
    render_bundles,
    render_objects,
    stale_diff,
    write_bundles,
)

REPO = Path(__file__).resolve().parents[2]

THREE_RESOURCES = """\
flavors:
  - name: h100
    resource: nvidia.com/gpu
  - name: a100
    resource: nvidia.com/gpu
  - name: mig-3g
    resource: nvidia.com/mig-3g.40gb
  - name: mi300
    resource: amd.com/gpu
cohorts:
  - name: pool
teams:
  - name: alpha
    cohort: pool
    quota:
      mi300: 1
      h100: {nominalQuota: 8, borrowingLimit: 4}
      a100: {nominalQuota: 2, lendingLimit: 1}
    namespaceQuota: {h100: 2, a100: 3, mig-3g: 1}
  - name: beta
    quota: {mig-3g: 2}
namespaces:
  - {name: zeta, team: beta}
  - {name: alpha-ns, team: alpha}
"""


def docs(files: dict[str, str], path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(files[path]) if d is not None]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def expressions(obj: Any) -> list[str]:
    """Every CEL `expression` string anywhere in a policy."""
    found: list[str] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "expression" and isinstance(value, str):
                found.append(value)
            else:
                found.extend(expressions(value))
    elif isinstance(obj, list):
        for item in obj:
            found.extend(expressions(item))
    return found


@pytest.fixture(scope="module")
def default_files() -> dict[str, str]:
    return render_bundles(load_default_config())


@pytest.fixture(scope="module")
def custom_files() -> dict[str, str]:
    return render_bundles(load_config_text(THREE_RESOURCES))


# --- every object is a well-formed manifest -------------------------------------------------------


@pytest.mark.parametrize("which", ["default_files", "custom_files"])
def test_every_object_parses_and_is_named(which: str, request: pytest.FixtureRequest) -> None:
    files: dict[str, str] = request.getfixturevalue(which)
    assert {p.split("/")[0] for p in files} == set(BUNDLES)
    for path, text in files.items():
        assert text.startswith(HEADER), path
        for doc in yaml.safe_load_all(text):
            assert isinstance(doc, dict), path
            assert doc["apiVersion"], path
            assert doc["kind"], path
            if doc["kind"] != "Kustomization":
                assert doc["metadata"]["name"], path


@pytest.mark.parametrize("which", ["default_files", "custom_files"])
def test_each_kustomization_lists_exactly_its_files(which: str, request: pytest.FixtureRequest) -> None:
    files: dict[str, str] = request.getfixturevalue(which)
    for bundle in BUNDLES:
        [kustomization] = docs(files, f"{bundle}/kustomization.yaml")
        assert kustomization["kind"] == "Kustomization"
        listed = kustomization["resources"]
        present = sorted(p.split("/", 1)[1] for p in files if p.startswith(f"{bundle}/"))
        assert sorted([*listed, "kustomization.yaml"]) == present
        assert len(set(listed)) == len(listed)


def test_no_duplicate_objects(default_files: dict[str, str]) -> None:
    keys = [
        (o["apiVersion"], o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        for o in render_objects(load_default_config())
    ]
    assert len(keys) == len(set(keys))


# --- determinism and the committed bundles ---------------------------------------------------------


def test_rendering_twice_is_byte_identical() -> None:
    assert render_bundles(load_default_config()) == render_bundles(load_default_config())


def test_order_of_quota_keys_does_not_change_output() -> None:
    reordered = THREE_RESOURCES.replace(
        "      mi300: 1\n      h100: {nominalQuota: 8, borrowingLimit: 4}\n",
        "      h100: {nominalQuota: 8, borrowingLimit: 4}\n      mi300: 1\n",
    )
    assert reordered != THREE_RESOURCES
    assert render_bundles(load_config_text(reordered)) == render_bundles(load_config_text(THREE_RESOURCES))


def test_no_timestamps_in_output(default_files: dict[str, str]) -> None:
    for text in default_files.values():
        assert not re.search(r"\b20\d\d-\d\d-\d\d", text)


def test_committed_bundles_equal_a_fresh_render(default_files: dict[str, str]) -> None:
    diff = stale_diff(default_files, REPO)
    assert diff == "", f"policies/ kueue/ controller/ are stale; run `ghostgpu render -o .`\n{diff}"


# --- policies -------------------------------------------------------------------------------------


def test_every_gpu_resource_is_in_the_tracking_match_logic(custom_files: dict[str, str]) -> None:
    resources = ["amd.com/gpu", "nvidia.com/gpu", "nvidia.com/mig-3g.40gb"]
    mutating = docs(custom_files, "policies/track-gpu-workloads.yaml")
    validating = docs(custom_files, "policies/validate-job-queue-name.yaml")
    assert [p["kind"] for p in mutating] == ["MutatingPolicy", "MutatingPolicy"]
    assert [p["kind"] for p in validating] == ["ValidatingPolicy"]
    for policy in [*mutating, *validating]:
        gpu_var = next(v for v in policy["spec"]["variables"] if v["name"] == "gpuResources")
        assert sorted(re.findall(r"'([^']+)'", gpu_var["expression"])) == resources
    [condition] = mutating[0]["spec"]["matchConditions"]
    from ghostgpu.actuators import ActuatorTable

    # The manager kinds of the actuator table: once per container pointer of each.
    managers = sum(len(a.containers) + len(a.container) + len(a.resources) for a in ActuatorTable().tracked())
    for resource in resources:
        # containers and initContainers of pod templates, limits and requests
        assert condition["expression"].count(f"'{resource}'") == 2 + managers
        assert "limits" in condition["expression"]
        assert "requests" in condition["expression"]
        assert "initContainers" in condition["expression"]


def test_tracking_policy_shape(default_files: dict[str, str]) -> None:
    admission, opt_in = docs(default_files, "policies/track-gpu-workloads.yaml")
    for policy in (admission, opt_in):
        assert policy["apiVersion"] == "policies.kyverno.io/v1"
        assert policy["spec"]["evaluation"] == {
            "admission": {"enabled": True},
            "mutateExisting": {"enabled": True},
        }
        [mutation] = policy["spec"]["mutations"]
        assert mutation["patchType"] == "ApplyConfiguration"
        assert "'ghostgpu.io/tracked': 'true'" in mutation["applyConfiguration"]["expression"]
        should = next(v for v in policy["spec"]["variables"] if v["name"] == "shouldTrack")["expression"]
        # Not managed by Kueue: no queue-name label, pods not kueue-managed; bare pods only.
        assert "'kueue.x-k8s.io/queue-name' in variables.labels" in should
        assert "'kueue.x-k8s.io/managed'" in should
        assert "ownerReferences" in should
        assert "['Pod', 'Deployment', 'StatefulSet']" in should
    rules = admission["spec"]["matchConstraints"]["resourceRules"]
    # Plus the actuator table's tracked manager kinds (the top object: a RayCluster, not its pods).
    assert {r for rule in rules for r in rule["resources"]} == {
        "pods", "deployments", "statefulsets",
        "inferenceservices", "leaderworkersets", "nimservices", "notebooks", "rayclusters",
        "tfjobs", "mpijobs", "jobs",
        "rayjobs", "rayservices", "jobsets", "trainjobs", "pytorchjobs", "llminferenceservices",
    }  # fmt: skip
    assert {"keda.sh", "ray.io"} & {g for rule in rules for g in rule["apiGroups"]} == {"ray.io"}
    assert admission["spec"]["matchConstraints"]["namespaceSelector"] == {
        "matchLabels": {"ghostgpu.io/reclaim": "enabled"}
    }
    assert opt_in["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["namespaces"]
    assert opt_in["spec"]["targetMatchConstraints"]["namespaceSelector"] == {
        "matchLabels": {"ghostgpu.io/reclaim": "enabled"}
    }


def test_generating_policy_knows_teams_queues_quotas_and_static_namespaces(
    custom_files: dict[str, str],
) -> None:
    [policy] = docs(custom_files, "policies/generate-namespace-objects.yaml")
    assert policy["kind"] == "GeneratingPolicy"
    assert policy["spec"]["evaluation"]["synchronize"] == {"enabled": True}
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["clusterQueues"] == "{'alpha': 'alpha', 'beta': 'beta'}"
    assert variables["staticNamespaces"] == "['alpha-ns', 'zeta']"
    # h100 and a100 both provide nvidia.com/gpu: the namespace quota adds them up.
    assert "'requests.nvidia.com/gpu': '5'" in variables["quotas"]
    assert "'requests.nvidia.com/mig-3g.40gb': '1'" in variables["quotas"]
    assert "'beta': dyn({})" in variables["quotas"]
    assert "kueue.x-k8s.io/v1beta2" in variables["localQueue"]
    assert "'ghostgpu-controller-namespaced'" in variables["roleBinding"]
    assert "generator.Apply(variables.ns, variables.downstream)" in expressions(policy)
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert "in ['alpha', 'beta']" in conditions["known-team"]


def test_rbac_for_kyverno_aggregates_and_can_bind_the_controller_role(default_files: dict[str, str]) -> None:
    roles = docs(default_files, "policies/kyverno-rbac.yaml")
    background = next(
        r for r in roles if "aggregate-to-background-controller" in str(r["metadata"]["labels"])
    )
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): r for r in background["rules"]}
    assert "create" in rules[(("kueue.x-k8s.io",), ("localqueues",))]["verbs"]
    assert "create" in rules[(("rbac.authorization.k8s.io",), ("rolebindings",))]["verbs"]
    bind = rules[(("rbac.authorization.k8s.io",), ("clusterroles",))]
    assert bind["verbs"] == ["bind"]
    assert bind["resourceNames"] == ["ghostgpu-controller-namespaced"]


def test_job_queue_validation_is_audit_only_and_optional(default_files: dict[str, str]) -> None:
    [policy] = docs(default_files, "policies/validate-job-queue-name.yaml")
    assert policy["spec"]["validationActions"] == ["Audit"]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["jobs"]
    off = render_bundles(load_config_text(THREE_RESOURCES + "policies: {validateJobQueueName: false}\n"))
    assert "policies/validate-job-queue-name.yaml" not in off
    assert "validate-job-queue-name.yaml" not in off["policies/kustomization.yaml"]


# --- kueue ----------------------------------------------------------------------------------------


def test_cluster_queues_follow_kueue_rules(custom_files: dict[str, str]) -> None:
    queues = {q["metadata"]["name"]: q for q in docs(custom_files, "kueue/cluster-queues.yaml")}
    alpha, beta = queues["alpha"]["spec"], queues["beta"]["spec"]
    assert queues["alpha"]["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert alpha["cohortName"] == "pool"
    assert "cohortName" not in beta
    for spec in (alpha, beta):
        seen: set[str] = set()
        for group in spec["resourceGroups"]:
            covered = group["coveredResources"]
            assert not seen & set(covered), "a resource belongs to one group only"
            seen |= set(covered)
            for flavor in group["flavors"]:
                assert [r["name"] for r in flavor["resources"]] == covered
    # flavors sharing nvidia.com/gpu share a group, in flavors order (h100 before a100)
    gpu_group = next(g for g in alpha["resourceGroups"] if g["coveredResources"] == ["nvidia.com/gpu"])
    assert [f["name"] for f in gpu_group["flavors"]] == ["h100", "a100"]
    h100 = gpu_group["flavors"][0]["resources"][0]
    assert h100 == {"name": "nvidia.com/gpu", "nominalQuota": "8", "borrowingLimit": "4"}
    assert gpu_group["flavors"][1]["resources"][0] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": "2",
        "lendingLimit": "1",
    }


def test_default_cluster_queues_carry_preemption_and_fair_sharing(default_files: dict[str, str]) -> None:
    cfg = load_default_config()
    queues = {q["metadata"]["name"]: q["spec"] for q in docs(default_files, "kueue/cluster-queues.yaml")}
    assert set(queues) == {t.name for t in cfg.teams}
    for team in cfg.teams:
        spec = queues[team.name]
        assert spec["preemption"]["reclaimWithinCohort"] == team.preemption.reclaim_within_cohort
        assert spec["preemption"]["withinClusterQueue"] == team.preemption.within_cluster_queue
        assert (
            spec["preemption"]["borrowWithinCohort"]["policy"] == team.preemption.borrow_within_cohort.policy
        )
        assert team.fair_sharing is not None
        assert spec["fairSharing"] == {"weight": str(team.fair_sharing.weight)}


def test_flavors_cohorts_local_queues_priorities(custom_files: dict[str, str]) -> None:
    flavors = docs(custom_files, "kueue/resource-flavors.yaml")
    assert [f["metadata"]["name"] for f in flavors] == ["h100", "a100", "mig-3g", "mi300"]
    assert [c["metadata"]["name"] for c in docs(custom_files, "kueue/cohorts.yaml")] == ["pool"]
    local = docs(custom_files, "kueue/local-queues.yaml")
    assert [
        (q["metadata"]["namespace"], q["metadata"]["name"], q["spec"]["clusterQueue"]) for q in local
    ] == [
        ("alpha-ns", "default", "alpha"),
        ("zeta", "default", "beta"),
    ]
    assert "kueue/workload-priority-classes.yaml" not in custom_files
    default = render_bundles(load_default_config())
    classes = docs(default, "kueue/workload-priority-classes.yaml")
    assert [(c["metadata"]["name"], c["value"]) for c in classes] == [
        ("production", 1000),
        ("batch", 100),
        ("preemptible", 10),
    ]


def test_flavor_node_labels_and_taints(default_files: dict[str, str]) -> None:
    cfg = load_default_config()
    for flavor, rendered in zip(cfg.flavors, docs(default_files, "kueue/resource-flavors.yaml"), strict=True):
        assert rendered["spec"]["nodeLabels"] == flavor.node_labels
        assert rendered["spec"]["nodeTaints"] == [t.model_dump(exclude_none=True) for t in flavor.node_taints]
        assert rendered["spec"]["tolerations"] == [
            t.model_dump(exclude_none=True) for t in flavor.tolerations
        ]


def test_kueue_manager_configuration(default_files: dict[str, str]) -> None:
    [cm] = docs(default_files, "kueue/kueue-manager-config.yaml")
    assert (cm["kind"], cm["metadata"]["namespace"]) == ("ConfigMap", "kueue-system")
    conf = yaml.safe_load(cm["data"]["controller_manager_config.yaml"])
    assert conf["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert conf["kind"] == "Configuration"
    assert {"pod", "deployment", "statefulset"} <= set(conf["integrations"]["frameworks"])
    # Every namespace but the system ones: a narrower selector strands queue-named Jobs suspended.
    assert conf["managedJobsNamespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["ghostgpu-system", "kube-system", "kueue-system", "kyverno"],
            }
        ]
    }
    assert conf["waitForPodsReady"]["timeout"] == "10m"
    assert conf["fairSharing"]["preemptionStrategies"]
    classical = render_bundles(
        load_config_text(THREE_RESOURCES + "kueue:\n  fairSharing: {enabled: false}\n")
    )
    conf2 = yaml.safe_load(
        docs(classical, "kueue/kueue-manager-config.yaml")[0]["data"]["controller_manager_config.yaml"]
    )
    assert "fairSharing" not in conf2


# --- controller -----------------------------------------------------------------------------------


def test_controller_configmap_is_the_controller_section(
    default_files: dict[str, str], tmp_path: Path
) -> None:
    [cm] = docs(default_files, "controller/configmap.yaml")
    [key] = cm["data"]
    path = tmp_path / key
    path.write_text(cm["data"][key])
    from ghostgpu.config import load_controller_config

    assert load_controller_config(path) == load_default_config().controller
    assert ControllerConfig.model_validate(yaml.safe_load(cm["data"][key])).mode == "shadow"


def test_controller_deployment_hardening(default_files: dict[str, str]) -> None:
    [deploy] = docs(default_files, "controller/deployment.yaml")
    spec = deploy["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["requests"]["memory"]
    assert container["args"][:2] == ["controller", "--config"]
    [cm] = docs(default_files, "controller/configmap.yaml")
    assert container["args"][2].endswith("/" + next(iter(cm["data"])))


def test_controller_and_agent_resources_come_from_ghostgpu_yaml(default_files: dict[str, str]) -> None:
    def containers(files: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
        [deploy] = docs(files, "controller/deployment.yaml")
        [agent] = by_kind(docs(files, "controller/agent.yaml"), "DaemonSet")
        return deploy["spec"]["template"]["spec"]["containers"][0], agent["spec"]["template"]["spec"][
            "containers"
        ][0]

    # the defaults: the controller holds the 50,000-pod bench's peak (under 300 MB) with margin,
    # and has no CPU limit (a throttled first-verdict poll is only slower)
    controller, agent = containers(default_files)
    assert controller["resources"] == {
        "requests": {"cpu": "100m", "memory": "320Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert agent["resources"] == {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"cpu": "200m", "memory": "128Mi"},
    }
    sized = (
        "controller:\n  processSource: agent\n"
        "  resources: {requests: {cpu: '1', memory: 1Gi}, limits: {cpu: '2', memory: 2Gi}}\n"
        "  agentResources: {requests: {memory: 100Mi}}\n"
    )
    files = render_bundles(load_config_text(THREE_RESOURCES + sized))
    controller, agent = containers(files)
    assert controller["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"cpu": "2", "memory": "2Gi"},
    }
    assert agent["resources"] == {"requests": {"memory": "100Mi"}}  # what is unset is not written
    # a pod template's size is not the processes' configuration: the ConfigMaps do not change
    base = render_bundles(load_config_text(THREE_RESOURCES + "controller:\n  processSource: agent\n"))
    assert files["controller/configmap.yaml"] == base["controller/configmap.yaml"]
    assert [d for d in docs(files, "controller/agent.yaml") if d["kind"] == "ConfigMap"] == [
        d for d in docs(base, "controller/agent.yaml") if d["kind"] == "ConfigMap"
    ]


def test_resources_that_cannot_be_scheduled_are_refused_by_key() -> None:
    from ghostgpu.config import ConfigError

    with pytest.raises(
        ConfigError, match=r"resources.*limits.memory \(256Mi\) is less than requests.memory \(1Gi\)"
    ):
        load_config_text("controller:\n  resources: {requests: {memory: 1Gi}, limits: {memory: 256Mi}}\n")
    with pytest.raises(ConfigError, match=r"agentResources.*requests.cpu"):
        load_config_text("controller:\n  agentResources: {requests: {cpu: lots}}\n")


def test_config_hash_rolls_the_deployment_when_the_config_changes() -> None:
    def config_hash(text: str) -> str:
        [deploy] = docs(render_bundles(load_config_text(text)), "controller/deployment.yaml")
        return deploy["spec"]["template"]["metadata"]["annotations"]["ghostgpu.io/config-hash"]

    base = config_hash(THREE_RESOURCES)
    assert base == config_hash(THREE_RESOURCES)
    assert base != config_hash(THREE_RESOURCES + "controller: {mode: enforce}\n")


def test_controller_rbac_is_read_only_cluster_wide(default_files: dict[str, str]) -> None:
    objects = docs(default_files, "controller/rbac.yaml")
    read = next(
        o
        for o in objects
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "ghostgpu-controller-read"
    )
    for rule in read["rules"]:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
    bindings = by_kind(objects, "ClusterRoleBinding")
    assert [b["roleRef"]["name"] for b in bindings] == ["ghostgpu-controller-read"]
    namespaced = next(o for o in objects if o["metadata"]["name"] == "ghostgpu-controller-namespaced")
    granted = {(res, verb) for r in namespaced["rules"] for res in r["resources"] for verb in r["verbs"]}
    # the embedded example reads processes from the node agent: no exec (test_render_agent.py)
    assert ("pods/exec", "create") not in granted
    for need in [
        ("pods", "get"),
        ("pods", "list"),
        ("pods/eviction", "create"),
        ("deployments/scale", "get"),
        ("deployments/scale", "patch"),
        ("statefulsets/scale", "patch"),
    ]:
        assert need in granted
    assert not any(verb in ("delete", "deletecollection", "*") for _, verb in granted)
    # the replica ledger: ConfigMaps, only in the controller's own namespace, never deleted
    ledger = next(
        o
        for o in objects
        if o["metadata"]["name"] == "ghostgpu-controller-replica-ledger" and o["kind"] == "Role"
    )
    assert ledger["metadata"]["namespace"] == "ghostgpu-system"
    assert ledger["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "list", "watch", "create", "update", "patch"],
        }
    ]
    [binding] = [
        b for b in by_kind(objects, "RoleBinding") if b["roleRef"]["name"] == ledger["metadata"]["name"]
    ]
    assert binding["metadata"]["namespace"] == "ghostgpu-system"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "ghostgpu-controller", "namespace": "ghostgpu-system"}
    ]


def test_nodes_patch_is_rendered_only_with_the_kueue_nudge() -> None:
    def node_verbs(text: str) -> set[str]:
        [read] = [
            o
            for o in docs(render_bundles(load_config_text(text)), "controller/rbac.yaml")
            if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "ghostgpu-controller-read"
        ]
        return {v for r in read["rules"] if "nodes" in r["resources"] for v in r["verbs"]}

    assert node_verbs(THREE_RESOURCES) == {"get", "list", "watch"}
    assert node_verbs(THREE_RESOURCES + "controller: {kueueNudge: true}\n") == {
        "get",
        "list",
        "watch",
        "patch",
    }
    [cm] = docs(render_bundles(load_config_text(THREE_RESOURCES)), "controller/configmap.yaml")
    assert "kueueNudge: false" in next(iter(cm["data"].values()))


@pytest.mark.parametrize(
    ("preset", "util", "fb", "threshold", "labels"),
    [
        ("dcgm", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "500", "namespace, pod"),
        (
            "hami",
            "Device_utilization_desc_of_container",
            "vGPU_device_memory_usage_in_bytes",
            "524288000",
            "podnamespace, podname",
        ),
    ],
)
def test_idle_alert_per_preset(preset: str, util: str, fb: str, threshold: str, labels: str) -> None:
    files = render_bundles(
        load_config_text(THREE_RESOURCES + f"controller:\n  metrics: {{preset: {preset}}}\n")
    )
    [rule_obj] = docs(files, "controller/prometheusrule.yaml")
    idle = rule_obj["spec"]["groups"][0]["rules"][0]
    assert idle["alert"] == "GhostGpuIdleWorkload"
    assert idle["for"] == "1h"
    expr = idle["expr"]
    assert f"avg_over_time({util}[10m])" in expr
    assert f"max_over_time({fb}[10m])" in expr
    assert re.search(r"<\s*10\b", expr)
    assert re.search(rf"<\s*{threshold}\b", expr)
    assert f"by ({labels})" in expr and f"and on ({labels})" in expr


def test_service_monitor_can_be_turned_off() -> None:
    files = render_bundles(
        load_config_text(THREE_RESOURCES + "controller:\n  serviceMonitor: {enabled: false}\n")
    )
    assert "controller/servicemonitor.yaml" not in files
    assert "servicemonitor.yaml" not in files["controller/kustomization.yaml"]


# --- writing, --check and the CLI -----------------------------------------------------------------


def test_write_prunes_only_our_own_stale_files(tmp_path: Path) -> None:
    files = render_bundles(load_default_config())
    write_bundles(files, tmp_path)
    ours = tmp_path / "kueue" / "old-queues.yaml"
    ours.write_text(HEADER + "kind: Stale\n")
    foreign = tmp_path / "kueue" / "handwritten.yaml"
    foreign.write_text("kind: Mine\n")
    changed = write_bundles(files, tmp_path)
    assert changed == ["kueue/old-queues.yaml"]
    assert not ours.exists()
    assert foreign.exists()
    assert write_bundles(files, tmp_path) == []


def test_stale_diff_reports_changes_and_extra_files(tmp_path: Path) -> None:
    files = render_bundles(load_default_config())
    write_bundles(files, tmp_path)
    assert stale_diff(files, tmp_path) == ""
    target = tmp_path / "kueue" / "cohorts.yaml"
    target.write_text(target.read_text().replace("gpu-pool", "old-pool"))
    (tmp_path / "policies" / "leftover.yaml").write_text("kind: Leftover\n")
    diff = stale_diff(files, tmp_path)
    assert "--- a/kueue/cohorts.yaml" in diff
    assert "-  name: old-pool" in diff and "+  name: gpu-pool" in diff
    assert "--- a/policies/leftover.yaml\n+++ /dev/null" in diff


runner = CliRunner()


def test_cli_render_then_check(tmp_path: Path) -> None:
    result = runner.invoke(app, ["render", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "policies" / "kustomization.yaml").is_file()
    assert runner.invoke(app, ["render", "--check", "-o", str(tmp_path)]).exit_code == 0
    (tmp_path / "controller" / "service.yaml").write_text("stale\n")
    stale = runner.invoke(app, ["render", "--check", "-o", str(tmp_path)])
    assert stale.exit_code == 1
    assert "+++ b/controller/service.yaml" in stale.output
    assert (tmp_path / "controller" / "service.yaml").read_text() == "stale\n", "--check writes nothing"


def test_cli_check_on_empty_dir_is_stale(tmp_path: Path) -> None:
    result = runner.invoke(app, ["render", "--check", "-o", str(tmp_path / "nothing")])
    assert result.exit_code == 1
    assert "--- /dev/null" in result.output


def test_cli_bad_config_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "ghostgpu.yaml"
    config.write_text(
        THREE_RESOURCES.replace("mig-3g: 2", "mig-3g: -2").replace("team: beta}", "team: gamma}")
    )
    out = tmp_path / "out"
    result = runner.invoke(app, ["render", "-c", str(config), "-o", str(out)])
    assert result.exit_code == 2
    assert f"{config}: teams[1].quota.mig-3g: expected a non-negative quantity, got '-2'" in result.output
    assert not out.exists()


def test_cli_custom_config(tmp_path: Path) -> None:
    config = tmp_path / "ghostgpu.yaml"
    config.write_text(THREE_RESOURCES)
    result = runner.invoke(app, ["render", "-c", str(config), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "out" / "kueue" / "resource-flavors.yaml").read_text()
    assert "name: mi300" in text


CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ResourceFlavor",
    "Cohort",
    "ClusterQueue",
    "WorkloadPriorityClass",
    "MutatingPolicy",
    "GeneratingPolicy",
    "ValidatingPolicy",
}
NAMESPACED = {
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "Deployment",
    "DaemonSet",
    "NetworkPolicy",
    "Service",
    "ServiceMonitor",
    "PrometheusRule",
    "LocalQueue",
}


def test_namespaced_objects_name_their_namespace() -> None:
    # ArgoCD would otherwise put them in the Application's destination namespace.
    for obj in render_objects(load_default_config()):
        kind, meta = obj["kind"], obj["metadata"]
        assert kind in CLUSTER_SCOPED | NAMESPACED, kind
        if kind in NAMESPACED:
            assert meta.get("namespace"), f"{kind}/{meta['name']}"
        else:
            assert "namespace" not in meta, f"{kind}/{meta['name']}"


def test_cli_unwritable_output_is_a_clean_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    result = runner.invoke(app, ["render", "-o", str(not_a_dir)])
    assert result.exit_code == 2
    assert f"error: -o {not_a_dir}: cannot write the bundles" in result.output
    assert "fix: give -o a directory" in result.output


def test_service_monitor_keeps_the_workload_namespace_label() -> None:
    # ghostgpu_* series are labelled by the workload's namespace: the scrape must not replace it.
    monitors = [o for o in render_objects(load_default_config()) if o["kind"] == "ServiceMonitor"]
    (monitor,) = [m for m in monitors if m["metadata"]["name"] == "ghostgpu-controller"]
    assert [e.get("honorLabels") for e in monitor["spec"]["endpoints"]] == [True]


def _state_volume(cfg_text: str) -> dict[str, Any]:
    objs = render_objects(load_config_text(cfg_text))
    deployment = next(
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "ghostgpu-controller"
    )
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e.get("valueFrom") for e in pod["containers"][0]["env"]}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}  # the leader's address (Lease)
    return next(v for v in pod["volumes"] if v["name"] == "state")


def test_decision_log_volume_is_an_empty_dir_or_the_named_claim() -> None:
    assert _state_volume(THREE_RESOURCES) == {"name": "state", "emptyDir": {"sizeLimit": "256Mi"}}
    kept = THREE_RESOURCES + "controller:\n  decisionLog: {claimName: ghostgpu-decisions}\n"
    assert _state_volume(kept) == {
        "name": "state",
        "persistentVolumeClaim": {"claimName": "ghostgpu-decisions"},
    }


def test_a_bad_decision_log_claim_is_named_by_its_key(tmp_path: Path) -> None:
    config = tmp_path / "ghostgpu.yaml"
    config.write_text(THREE_RESOURCES + "controller:\n  decisionLog: {claimName: Decisions_1, size: 1Gi}\n")
    result = runner.invoke(app, ["render", "-c", str(config), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert (
        f"error: {config}: controller.decisionLog.claimName: expected a PersistentVolumeClaim name"
        in result.output
    )
    assert f"error: {config}: controller.decisionLog.size: unknown key" in result.output
    assert not (tmp_path / "out").exists()
