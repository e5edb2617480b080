"""The NetworkPolicies of the controller bundle: the controller's port (8080) and the node agent's
(9402) take connections only from the Prometheus namespace, the controller's also from its own
other replicas. Each rule is asserted with the reason
it exists; anything not listed is refused once a policy selects the pod (NetworkPolicy semantics).

The kubelet's probes need no rule: a NetworkPolicy never blocks traffic between a pod and the
node it runs on ("traffic to and from the node where a Pod is running is always allowed",
kubernetes.io/docs/concepts/services-networking/network-policies), and the probes come from there.
"""

from __future__ import annotations

from typing import Any

import pytest

from ghostgpu.config import GhostgpuConfig, load_config_text, load_default_config
from ghostgpu.config_errors import ConfigError
from ghostgpu.render import render_bundles, render_objects

BASE = """\
flavors:
  - {name: h100, resource: nvidia.com/gpu}
teams:
  - {name: research, quota: {h100: 4}}
"""


def cfg(controller: str = "processSource: agent") -> GhostgpuConfig:
    return load_config_text(BASE + f"controller: {{{controller}}}\n")


def policies(c: GhostgpuConfig) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["namespace"]: o for o in render_objects(c) if o["kind"] == "NetworkPolicy"}


def _only_from(policy: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """The namespaces and ports the one ingress rule admits."""
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress (apiserver, Prometheus, S3) stays open
    (rule,) = policy["spec"]["ingress"]  # one rule: nothing else is admitted
    namespaces = [peer for peer in rule["from"] if peer not in _replica_peers(policy)]
    names = [peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for peer in namespaces]
    for peer in namespaces:
        # The namespace's name label, which the apiserver sets and no one can change; no pod
        # selector: any Prometheus pod of that namespace (replicas, shards, an agent) scrapes.
        assert set(peer) == {"namespaceSelector"} and set(peer["namespaceSelector"]) == {"matchLabels"}
    return names, [p["port"] for p in rule["ports"]]


def _replica_peers(policy: dict[str, Any]) -> list[Any]:
    """Peers that are the policy's own pods (a pod selector alone: this namespace only)."""
    (rule,) = policy["spec"]["ingress"]
    own = {"podSelector": policy["spec"]["podSelector"]}
    return [peer for peer in rule["from"] if peer == own]


def test_the_controllers_port_is_open_to_the_prometheus_namespace_only() -> None:
    p = policies(cfg())["ghostgpu-system"]
    assert p["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "ghostgpu-controller"}}
    # Prometheus scrapes /metrics (the ServiceMonitor); /healthz and /readyz are the kubelet's
    # (node-local, always allowed); /decisions is read through `kubectl port-forward` (the pod's
    # own loopback, no policy applies) or from a pod of the Prometheus namespace.
    assert _only_from(p) == (["monitoring"], ["http"])
    # ... and the controller's other replicas: a follower answers /decisions with the leader's log,
    # fetched from the leader's pod (books/leader_decisions.py).
    assert len(_replica_peers(p)) == 1


def test_the_agents_port_is_open_to_the_prometheus_namespace_only() -> None:
    p = policies(cfg())["ghostgpu-agent"]
    assert p["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "ghostgpu-agent"}}
    # /metrics names every GPU container's namespace, pod, uid and programs: only Prometheus reads it.
    assert _only_from(p) == (["monitoring"], ["agent-metrics"])
    assert _replica_peers(p) == []  # agents never talk to each other


def test_exec_mode_renders_the_controllers_policy_only() -> None:
    assert set(policies(cfg("processSource: exec"))) == {"ghostgpu-system"}


def test_the_prometheus_namespace_is_taken_from_the_in_cluster_url() -> None:
    c = cfg("processSource: agent, prometheus: {url: 'http://prometheus-k8s.observability.svc:9090'}")
    assert {_only_from(p)[0][0] for p in policies(c).values()} == {"observability"}
    outside = cfg("processSource: agent, prometheus: {url: 'https://thanos.example.com'}")
    assert {_only_from(p)[0][0] for p in policies(outside).values()} == {"monitoring"}  # the default


def test_the_prometheus_namespace_set_in_ghostgpu_yaml_wins() -> None:
    c = cfg("processSource: agent, networkPolicy: {prometheusNamespace: kube-prometheus}")
    assert {_only_from(p)[0][0] for p in policies(c).values()} == {"kube-prometheus"}


def test_disabled_renders_no_policy() -> None:
    c = cfg("processSource: agent, networkPolicy: {enabled: false}")
    assert policies(c) == {}
    assert "networkpolicy.yaml" not in render_bundles(c)["controller/kustomization.yaml"]


@pytest.mark.parametrize("bad", ["Monitoring", "-x", "a" * 64, "mon_itoring"])
def test_a_bad_namespace_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        cfg(f"processSource: agent, networkPolicy: {{prometheusNamespace: '{bad}'}}")
    text = str(err.value)
    assert "controller.networkPolicy.prometheusNamespace" in text and "DNS-1123 label" in text


def test_the_embedded_example_renders_both_policies() -> None:
    assert set(policies(load_default_config())) == {"ghostgpu-system", "ghostgpu-agent"}
