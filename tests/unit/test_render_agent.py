"""The node agent in the controller bundle (controller.processSource: agent): the DaemonSet runs
exactly the contract's command on the GPU nodes, unprivileged but for hostPID, with a
ServiceAccount that only reads pods; no pods/exec anywhere in the bundle; exec mode renders the
bundle as before. Each RBAC verb and pod security field is asserted with the reason it is there.
tests/e2e/test_cluster_bundles.py applies the committed bundle (this DaemonSet included) to the
real apiserver with Pod Security admission."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ghostgpu.config import AGENT_SOURCE, GhostgpuConfig, load_config_text, load_default_config
from ghostgpu.render import render_bundles, render_objects

BASE = """\
flavors:
  - name: h100
    resource: nvidia.com/gpu
    nodeLabels: {nvidia.com/gpu.product: H100, pool: train}
    tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  - name: mig
    resource: nvidia.com/mig-1g.10gb
    nodeLabels: {nvidia.com/mig.config: all-1g.10gb}
    tolerations:
      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
      - {key: dedicated, operator: Equal, value: mig, effect: NoExecute}
teams:
  - name: research
    quota: {h100: 4, mig: 7}
"""
# The contract's command (docs/agent.md, "The command"), word for word.
CONTRACT_ARGS = [
    "agent", "--config", "/etc/ghostgpu/ghostgpu.yaml", "--node-name", "$(NODE_NAME)",
    "--proc", "/proc", "--listen", "0.0.0.0:9402", "--interval", "15",
]  # fmt: skip


def cfg(source: str | None = "agent", extra: str = "") -> GhostgpuConfig:
    controller = f"controller: {{processSource: {source}{extra}}}\n" if source else ""
    return load_config_text(BASE + controller)


def objects(c: GhostgpuConfig) -> list[dict[str, Any]]:
    return render_objects(c)


def one(objs: list[dict[str, Any]], kind: str, name: str = "ghostgpu-agent") -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def daemonset(c: GhostgpuConfig) -> dict[str, Any]:
    return one(objects(c), "DaemonSet")


@pytest.mark.parametrize("c", [cfg("agent"), load_default_config()], ids=["agent", "embedded-example"])
def test_agent_mode_has_no_pods_exec_anywhere_in_the_bundles(c: GhostgpuConfig) -> None:
    for path, text in render_bundles(c).items():
        assert "pods/exec" not in text, path
    for o in objects(c):
        for rule in o.get("rules") or []:
            assert not [r for r in rule.get("resources", []) if r.startswith("pods/exec")], o["metadata"]


def test_exec_mode_is_the_bundle_as_before() -> None:
    for c in (cfg("exec"), cfg(None)):  # a file without the key is exec
        files = render_bundles(c)
        assert "controller/agent.yaml" not in files
        assert "agent.yaml" not in files["controller/kustomization.yaml"]
        assert not [
            o for o in objects(c) if o["kind"] == "DaemonSet" or "ghostgpu-agent" in str(o["metadata"])
        ]
        role = one(objects(c), "ClusterRole", "ghostgpu-controller-namespaced")
        exec_rules = [r for r in role["rules"] if "pods/exec" in r["resources"]]
        # Exactly these two verbs: the controller's exec is a websocket upgrade, a GET, which the
        # apiserver authorizes as `get` on pods/exec, and Kubernetes 1.35 also as `create`
        # (AuthorizePodWebsocketUpgradeCreatePermission); with either alone every exec is a 403.
        assert exec_rules == [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]}]
    assert "controller/agent.yaml" in render_bundles(cfg("agent"))


def test_the_daemonset_runs_exactly_the_contracts_command_from_the_controllers_image() -> None:
    c = cfg()
    ds = daemonset(c)
    [container] = ds["spec"]["template"]["spec"]["containers"]
    assert container["args"] == CONTRACT_ARGS
    assert container["image"] == c.controller.image
    # NODE_NAME from the downward API: the node whose pods the agent watches
    assert container["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    assert container["ports"] == [{"name": "agent-metrics", "containerPort": 9402, "protocol": "TCP"}]
    # --config names the ConfigMap's key; it holds the whole ghostgpu.yaml the agent loads
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert mount == {"name": "config", "mountPath": "/etc/ghostgpu", "readOnly": True}
    cm = one(objects(c), "ConfigMap")
    assert cm["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert load_config_text(cm["data"]["ghostgpu.yaml"]) == c


def _pod(c: GhostgpuConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = daemonset(c)["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


# Every pod security field rendered, with the reason it is set so.
POD_FIELDS = [
    ("hostPID", True, "the agent reads every host process's /proc/<pid>: its own /proc must be the node's"),
    ("hostNetwork", False, "it serves metrics on the pod IP; the node's network is not needed"),
    ("hostIPC", None, "no shared memory with the host"),
    ("automountServiceAccountToken", True, "it watches its node's pods through the apiserver"),
    ("enableServiceLinks", False, "no Service environment variables: it reads none"),
    ("securityContext", {"runAsNonRoot": True, "runAsUser": 65533, "runAsGroup": 65533,
                         "seccompProfile": {"type": "RuntimeDefault"}},
     "non-root with a uid and gid of its own, not the controller's 65532: with hostPID, a uid shared "
     "with any process of the node would pass the kernel's same-uid check for its environ and root; "
     "/proc's cgroup, status, stat, cmdline are mode 0444 (any uid reads them: "
     "test_agent_procfs.py reads a real container as this uid); seccomp RuntimeDefault: it makes "
     "only ordinary file reads and one HTTP listener"),
    ("priorityClassName", "system-node-critical",
     "scheduled (and kept) on a full GPU node before any workload: without it a node's containers "
     "are `missing` (UNKNOWN) until room is made"),
]  # fmt: skip
CONTAINER_FIELDS = [
    ("securityContext", {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                         "privileged": False, "capabilities": {"drop": ["ALL"]}},
     "no capability is needed to read 0444 files or bind port 9402 (>1024); nothing is written but /tmp"),
    ("resources", {"requests": {"cpu": "10m", "memory": "64Mi"},
                   "limits": {"cpu": "200m", "memory": "128Mi"}},
     "a scan every 15 s of the node's /proc: small requests, and limits that bound a runaway"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "want", "why"), POD_FIELDS, ids=[f[0] for f in POD_FIELDS])
def test_pod_security_field(field: str, want: object, why: str) -> None:
    spec, _ = _pod(cfg())
    assert spec.get(field) == want, why


@pytest.mark.parametrize(("field", "want", "why"), CONTAINER_FIELDS, ids=[f[0] for f in CONTAINER_FIELDS])
def test_container_security_field(field: str, want: object, why: str) -> None:
    _, container = _pod(cfg())
    assert container.get(field) == want, why


def test_no_host_path_and_no_other_privilege() -> None:
    spec, container = _pod(cfg())
    # /proc comes from hostPID, not a hostPath mount; the only volumes are the config and /tmp
    assert sorted(v["name"] for v in spec["volumes"]) == ["config", "tmp"]
    assert not any("hostPath" in v for v in spec["volumes"])
    assert [v["emptyDir"] for v in spec["volumes"] if v["name"] == "tmp"] == [{"sizeLimit": "16Mi"}]
    assert "add" not in container["securityContext"]["capabilities"]
    assert not container.get("ports", [{}])[0].get("hostPort")
    # every field of the pod spec is one asserted above or here
    assert set(spec) == {
        "serviceAccountName", "automountServiceAccountToken", "hostPID", "hostNetwork",
        "enableServiceLinks", "terminationGracePeriodSeconds", "securityContext", "priorityClassName",
        "affinity", "tolerations", "containers", "volumes",
    }  # fmt: skip
    assert set(container) == {
        "name", "image", "imagePullPolicy", "args", "env", "ports", "resources", "securityContext",
        "volumeMounts", "livenessProbe", "readinessProbe",
    }  # fmt: skip


def test_probes_read_the_agents_own_endpoints() -> None:
    _, container = _pod(cfg())
    # /healthz: the HTTP server answers; /readyz: the last scan is recent (ghostgpu/agent/command.py)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "agent-metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "agent-metrics"}
    assert [p["name"] for p in container["ports"]] == ["agent-metrics"]


def test_its_namespace_allows_host_pid_and_the_controllers_stays_restricted() -> None:
    objs = objects(cfg())
    ds = one(objs, "DaemonSet")
    agent_ns = one(objs, "Namespace", ds["metadata"]["namespace"])
    # hostPID is outside `baseline`: Pod Security admission would refuse it anywhere stricter
    assert agent_ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    controller_ns = one(objs, "Namespace", "ghostgpu-system")
    assert controller_ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # nothing but the agent runs in its namespace
    kinds = sorted(o["kind"] for o in objs if o["metadata"].get("namespace") == agent_ns["metadata"]["name"])
    assert kinds == ["ConfigMap", "DaemonSet", "NetworkPolicy", "Service", "ServiceAccount", "ServiceMonitor"]


def test_the_agents_service_account_may_only_read_pods() -> None:
    objs = objects(cfg())
    sa = one(objs, "ServiceAccount")
    role = one(objs, "ClusterRole")
    # get/list/watch pods: the watch of its own node's pods (a spec.nodeName field selector)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    bindings = [
        b
        for b in objs
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and any(s.get("name") == sa["metadata"]["name"] for s in b.get("subjects", []))
    ]
    assert [(b["kind"], b["roleRef"]["name"]) for b in bindings] == [("ClusterRoleBinding", "ghostgpu-agent")]
    assert bindings[0]["subjects"] == [
        {"kind": "ServiceAccount", "name": "ghostgpu-agent", "namespace": sa["metadata"]["namespace"]}
    ]
    assert daemonset(cfg())["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_it_runs_on_the_gpu_nodes_of_every_flavor_with_their_tolerations() -> None:
    spec, _ = _pod(cfg())
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # one term per flavor (ORed), each flavor's labels ANDed
    assert terms == [
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]},
                {"key": "pool", "operator": "In", "values": ["train"]},
            ]
        },
        {"matchExpressions": [{"key": "nvidia.com/mig.config", "operator": "In", "values": ["all-1g.10gb"]}]},
    ]
    # the union of the flavors' tolerations, each once
    assert spec["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "mig", "effect": "NoExecute"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    # a flavor without node labels may be on any node: then every node runs the agent
    anywhere = load_config_text(
        "flavors: [{name: g, resource: nvidia.com/gpu}]\nteams: [{name: t, quota: {g: 1}}]\n"
        "controller: {processSource: agent}\n"
    )
    spec, _ = _pod(anywhere)
    assert "affinity" not in spec and "tolerations" not in spec


def test_it_runs_on_the_dra_flavors_nodes_too() -> None:
    dra = load_config_text(
        BASE.replace(
            "teams:",
            "  - name: h100-dra\n    deviceClass: gpu.nvidia.com\n    nodeLabels: {gpu-driver: dra}\n"
            "    tolerations: [{key: dra-only, operator: Exists, effect: NoSchedule}]\nteams:",
        ).replace("quota: {h100: 4, mig: 7}", "quota: {h100: 4, mig: 7, h100-dra: 2}")
        + "controller: {processSource: agent}\n"
    )
    spec, _ = _pod(dra)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"matchExpressions": [{"key": "gpu-driver", "operator": "In", "values": ["dra"]}]} in terms
    assert len(terms) == 3
    assert {"key": "dra-only", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_its_metrics_are_scraped_with_the_tracked_pods_labels_kept() -> None:
    objs = objects(cfg())
    svc, monitor = one(objs, "Service"), one(objs, "ServiceMonitor")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [
        {"name": "agent-metrics", "port": 9402, "targetPort": "agent-metrics", "protocol": "TCP"}
    ]
    assert svc["spec"]["selector"] == daemonset(cfg())["spec"]["selector"]["matchLabels"]
    [endpoint] = monitor["spec"]["endpoints"]
    # No honorLabels: Prometheus sets job/namespace from this target (what metrics.agentSource
    # pins), and the tracked pod's labels are the agent's own names, which no target sets.
    assert endpoint["port"] == "agent-metrics" and endpoint["honorLabels"] is False
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert {
        "job": svc["metadata"]["labels"]["app.kubernetes.io/name"],
        "namespace": svc["metadata"]["namespace"],
    } == AGENT_SOURCE
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [svc["metadata"]["namespace"]]}
    off = objects(cfg(extra=", serviceMonitor: {enabled: false}"))
    assert not [
        o for o in off if o["kind"] in ("ServiceMonitor", "Service") and "agent" in o["metadata"]["name"]
    ]


def test_the_daemonset_rolls_when_what_the_agent_reads_changes() -> None:
    def config_hash(text: str) -> str:
        ds = one(render_objects(load_config_text(text)), "DaemonSet")
        return ds["spec"]["template"]["metadata"]["annotations"]["ghostgpu.io/config-hash"]

    base = BASE + "controller: {processSource: agent}\n"
    assert config_hash(base) == config_hash(base)
    policy = BASE + "controller: {processSource: agent, processes: {holders: [pause, sleeper]}}\n"
    assert config_hash(base) != config_hash(policy)
    assert config_hash(base) == config_hash(
        base.replace("quota: {h100: 4, mig: 7}", "quota: {h100: 8, mig: 7}")
    )
    assert config_hash(base) != config_hash(base.replace("nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb"))


def test_the_committed_bundle_is_the_agent_mode_one() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    committed = yaml.safe_load_all((root / "controller" / "agent.yaml").read_text())
    assert [d["kind"] for d in committed if d] == [
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet",
        "Service", "ServiceMonitor",
    ]  # fmt: skip


def test_the_agent_and_the_controller_run_as_different_users() -> None:
    objs = objects(cfg())
    agent = one(objs, "DaemonSet")["spec"]["template"]["spec"]["securityContext"]
    controller = one(objs, "Deployment", "ghostgpu-controller")["spec"]["template"]["spec"]["securityContext"]
    assert agent["runAsUser"] != controller["runAsUser"]
    assert agent["runAsGroup"] != controller["runAsGroup"]
