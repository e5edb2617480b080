"""Manifests and config files the devcluster derives from the upstream release files that
hack/testbin copied out of the module zips (Kueue's webhook and CRD patches, kwok's stages)."""

from __future__ import annotations

import base64
import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Only the API groups whose types exist in this cluster: Kueue also ships webhooks for Kubeflow,
# Ray, JobSet... which would only add noise (their CRDs are not installed).
KUEUE_WEBHOOK_GROUPS = {"", "apps", "batch", "kueue.x-k8s.io"}
KUEUE_SYSTEM_NAMESPACES = ["kube-system", "kueue-system"]
# Without Kueue's webhook kustomization at hand: v0.17 gives only these webhooks the selector that
# skips the system namespaces (from v0.18 every job integration's webhook gets it).
KUEUE_POD_LIKE_WEBHOOKS = {
    "mpod.kb.io",
    "mdeployment.kb.io",
    "mstatefulset.kb.io",
    "vpod.kb.io",
    "vdeployment.kb.io",
    "vstatefulset.kb.io",
}
_WEBHOOK_SELECTOR_PATH = re.compile(r"webhooks\.\[name=([^\]]+)\]\.namespaceSelector")
KUEUE_FRAMEWORKS = ["batch/job", "pod", "deployment", "statefulset"]


def kueue_config(
    webhook_port: int, health_port: int, metrics_port: int, cert_dir: Path, base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Kueue's manager Configuration: `base` (the rendered kueue/kueue-manager-config.yaml, so the
    cluster runs the configuration the project ships) with only what running out of cluster on
    127.0.0.1 must change: listen addresses, our certificates, no leader election."""
    cfg: dict[str, Any] = (
        copy.deepcopy(base)
        if base
        else {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "manageJobsWithoutQueueName": False,
            "managedJobsNamespaceSelector": {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": KUEUE_SYSTEM_NAMESPACES,
                    }
                ]
            },
            "integrations": {"frameworks": KUEUE_FRAMEWORKS},
        }
    )
    cfg["health"] = {"healthProbeBindAddress": f"127.0.0.1:{health_port}"}
    cfg["metrics"] = {**cfg.get("metrics", {}), "bindAddress": f"127.0.0.1:{metrics_port}"}
    cfg["webhook"] = {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)}
    cfg["leaderElection"] = {"leaderElect": False}
    # Our own CA signs Kueue's serving cert and the webhook configurations carry url clientConfig.
    cfg["internalCertManagement"] = {"enable": False}
    return cfg


# The visibility API is an aggregated apiserver with certs at the fixed path /visibility;
# ghostgpu does not use it, so it stays off in the devcluster.
KUEUE_BASE_FEATURE_GATES = {"VisibilityOnDemand": False}


def kueue_feature_gates_flag(extra: dict[str, bool] | None = None) -> str:
    """Kueue's --feature-gates flag: the devcluster's own gates, then `extra` (which wins)."""
    gates = {**KUEUE_BASE_FEATURE_GATES, **(extra or {})}
    return "--feature-gates=" + ",".join(f"{k}={'true' if v else 'false'}" for k, v in gates.items())


_FILE_KEYS = {
    "certificate-authority": "certificate-authority-data",
    "client-certificate": "client-certificate-data",
    "client-key": "client-key-data",
}


def embedded_kubeconfig(kubeconfig: dict[str, Any]) -> str:
    """The kubeconfig (parsed) with every file it names inlined as base64 `-data`, as YAML."""
    out = copy.deepcopy(kubeconfig)
    for entry in [*(out.get("clusters") or []), *(out.get("users") or [])]:
        body = entry.get("cluster") or entry.get("user") or {}
        for key, data_key in _FILE_KEYS.items():
            if key in body:
                body[data_key] = base64.b64encode(Path(body.pop(key)).read_bytes()).decode()
    return yaml.safe_dump(out, sort_keys=False)


def rendered_kueue_config(path: Path) -> dict[str, Any] | None:
    """The Configuration inside the rendered kueue-manager-config ConfigMap, if the file exists."""
    if not path.is_file():
        return None
    cm = yaml.safe_load(path.read_text())
    try:
        text = cm["data"]["controller_manager_config.yaml"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: expected a ConfigMap with data.controller_manager_config.yaml") from e
    cfg = yaml.safe_load(text)
    if not isinstance(cfg, dict) or cfg.get("kind") != "Configuration":
        raise ValueError(f"{path}: controller_manager_config.yaml is not a Kueue Configuration")
    return cfg


def _url_client_config(port: int, path: str, ca_pem: bytes) -> dict[str, Any]:
    return {"url": f"https://127.0.0.1:{port}{path}", "caBundle": base64.b64encode(ca_pem).decode()}


def kueue_webhook_namespace_selectors(kustomization: Path) -> dict[str, dict[str, Any]]:
    """{webhook name: namespaceSelector} that Kueue's config/components/webhook/kustomization.yaml
    sets, read the two ways Kueue's releases write it: strategic-merge `patches` naming each webhook
    (v0.17) and `replacements` that copy one webhook's selector to the others (v0.18+)."""
    if not kustomization.is_file():
        selector = {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": KUEUE_SYSTEM_NAMESPACES}
            ]
        }
        return {name: copy.deepcopy(selector) for name in sorted(KUEUE_POD_LIKE_WEBHOOKS)}
    k = yaml.safe_load(kustomization.read_text()) or {}
    out: dict[str, dict[str, Any]] = {}
    for patch in k.get("patches") or []:
        for doc in yaml.safe_load_all(patch.get("patch") or ""):
            for wh in (doc or {}).get("webhooks") or []:
                if "namespaceSelector" in wh:
                    out[wh["name"]] = wh["namespaceSelector"]
    for rep in k.get("replacements") or []:
        src = _WEBHOOK_SELECTOR_PATH.fullmatch(rep.get("source", {}).get("fieldPath", ""))
        if src is None:
            continue
        if src.group(1) not in out:
            raise ValueError(f"{kustomization}: replacement source {src.group(1)} has no namespaceSelector")
        for target in rep.get("targets") or []:
            for path in target.get("fieldPaths") or []:
                dst = _WEBHOOK_SELECTOR_PATH.fullmatch(path)
                if dst is not None:
                    out[dst.group(1)] = copy.deepcopy(out[src.group(1)])
    return out


def kueue_webhook_configs(webhook_dir: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's Mutating/ValidatingWebhookConfiguration with url clientConfig to 127.0.0.1:port and
    the namespace selectors of the release's own kustomization."""
    selectors = kueue_webhook_namespace_selectors(webhook_dir / "kustomization.yaml")
    out = []
    for doc in yaml.safe_load_all((webhook_dir / "manifests.yaml").read_text()):
        if not doc or doc.get("kind") not in (
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ):
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]  # kustomize namePrefix
        hooks = []
        for wh in doc.get("webhooks", []):
            groups = {g for rule in wh.get("rules", []) for g in rule.get("apiGroups", [])}
            if not groups <= KUEUE_WEBHOOK_GROUPS:
                continue
            path = wh["clientConfig"]["service"]["path"]
            wh["clientConfig"] = _url_client_config(port, path, ca_pem)
            if wh["name"] in selectors:
                wh["namespaceSelector"] = copy.deepcopy(selectors[wh["name"]])
            hooks.append(wh)
        doc["webhooks"] = hooks
        out.append(doc)
    if not out:
        raise ValueError(f"{webhook_dir}/manifests.yaml: no webhook configurations found")
    return out


def kueue_crds(crd_dir: Path, webhook_dir: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's CRDs; those Kueue's kustomization patches with a conversion webhook get one by url."""
    # Only the patches Kueue's CRD kustomization applies (its patches/ dir holds unused ones too).
    kustomization = webhook_dir / "crd-kustomization.yaml"
    if kustomization.is_file():
        listed = [p["path"] for p in yaml.safe_load(kustomization.read_text()).get("patches") or []]
        patches = [webhook_dir / Path(p).name for p in listed if Path(p).name.startswith("webhook_in_")]
    else:
        patches = sorted(webhook_dir.glob("webhook_in_*.yaml"))
    converted = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in patches}
    crds = []
    for f in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.load(f.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        if crd["metadata"]["name"] in converted:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": _url_client_config(port, "/convert", ca_pem),
                    "conversionReviewVersions": ["v1"],
                },
            }
        crds.append(crd)
    return crds


def kwok_stage_config(stage_dir: Path, out: Path) -> Path:
    """One kwok --config file with the stages kwokctl uses by default: node initialize + lease
    heartbeat (so nodes stay Ready for the node-lifecycle controller) and the fast pod lifecycle."""
    files = [
        *sorted((stage_dir / "node" / "fast").glob("*.yaml")),
        *sorted((stage_dir / "node" / "heartbeat-with-lease").glob("*.yaml")),
        *sorted((stage_dir / "pod" / "fast").glob("*.yaml")),
    ]
    docs = [
        d
        for f in files
        if f.name != "kustomization.yaml"
        for d in yaml.safe_load_all(f.read_text())
        if d and d.get("kind") == "Stage"
    ]
    if not docs:
        raise ValueError(f"{stage_dir}: no kwok Stage documents found")
    for d in docs:
        if d["metadata"]["name"] == "node-initialize":
            d["spec"]["next"]["statusTemplate"] = _keep_node_addresses(d["spec"]["next"]["statusTemplate"])
    out.write_text(yaml.safe_dump_all(docs, sort_keys=True))
    return out


# kwok's node-initialize writes an address list of only the entry types it finds missing (and no
# Hostname here: NodeName is empty), so a node it initialises again (Ready lost while kwok, loaded
# by 50,000 pods, renewed its lease late) came back with no address, and every exec to its pods
# failed ("no preferred addresses found") until a heartbeat 10-20 minutes later. Written instead
# the way kwok's own heartbeat stage does it: the node's addresses as they are, else kwok's.
_INIT_ADDRESSES = re.compile(r"\{\{ \$hasInternalIP := false \}\}.*?(?=\{\{ with NodePort \}\})", re.S)
_KEPT_ADDRESSES = (
    "addresses:\n{{ with .status.addresses }}\n{{ YAML . 1 }}\n{{ else }}\n"
    "{{ with NodeIP }}\n- address: {{ . | Quote }}\n  type: InternalIP\n{{ end }}\n"
    "{{ with NodeName }}\n- address: {{ . | Quote }}\n  type: Hostname\n{{ end }}\n{{ end }}\n\n"
)


def _keep_node_addresses(template: str) -> str:
    kept, n = _INIT_ADDRESSES.subn(lambda _: _KEPT_ADDRESSES, template)
    if n != 1:
        raise ValueError("kwok's node-initialize stage changed: its addresses block was not found")
    return kept


# Kyverno's Helm chart defaults, minus the chart's own objects (nothing of Kyverno runs in-cluster).
KYVERNO_RESOURCE_FILTERS = [
    "[Event,*,*]",
    "[*/*,kube-system,*]",
    "[*/*,kube-public,*]",
    "[*/*,kube-node-lease,*]",
    "[Node,*,*]",
    "[Node/?*,*,*]",
    "[APIService,*,*]",
    "[APIService/?*,*,*]",
    "[TokenReview,*,*]",
    "[SubjectAccessReview,*,*]",
    "[SelfSubjectAccessReview,*,*]",
    "[Binding,*,*]",
    "[Pod/binding,*,*]",
    "[ReplicaSet,*,*]",
    "[ReplicaSet/?*,*,*]",
    "[EphemeralReport,*,*]",
    "[ClusterEphemeralReport,*,*]",
]
KYVERNO_NAMESPACE = "kyverno"
KYVERNO_SERVICE_ACCOUNTS = [
    "kyverno-admission-controller",
    "kyverno-background-controller",
    "kyverno-reports-controller",
]


def kyverno_bootstrap() -> list[dict[str, Any]]:
    """Namespace, config maps, and service accounts bound to cluster-admin: the admission
    controller checks that the background controller's service account may create what a
    generating policy generates, so that account must exist and hold the rights."""
    ns = KYVERNO_NAMESPACE
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kyverno", "namespace": ns},
            "data": {
                "resourceFilters": "".join(KYVERNO_RESOURCE_FILTERS),
                "webhooks": json.dumps(
                    [
                        {
                            "namespaceSelector": {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/metadata.name",
                                        "operator": "NotIn",
                                        "values": ["kube-system", ns],
                                    }
                                ]
                            }
                        }
                    ]
                ),
                "defaultRegistry": "docker.io",
                "enableDefaultRegistryMutation": "true",
                "generateSuccessEvents": "false",
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kyverno-metrics", "namespace": ns},
            "data": {"namespaces": json.dumps({"include": [], "exclude": []})},
        },
    ]
    for sa in KYVERNO_SERVICE_ACCOUNTS:
        docs.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}})
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"ghostgpu-devcluster:{sa}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
            }
        )
    return docs


def kyverno_env(service_account: str) -> dict[str, str]:
    return {
        "KYVERNO_NAMESPACE": KYVERNO_NAMESPACE,
        "KYVERNO_SERVICEACCOUNT_NAME": service_account,
        "KYVERNO_DEPLOYMENT": "dummy",
        "KYVERNO_POD_NAME": "dummy",
        "INIT_CONFIG": "kyverno",
        "METRICS_CONFIG": "kyverno-metrics",
    }


CONTROLLER_SCRAPE_JOB = "ghostgpu-controller"  # the job name the controller/ ServiceMonitor gives
AGENT_SCRAPE_JOB = "ghostgpu-agent"
AGENT_NAMESPACE = "ghostgpu-agent"  # what the bundle's agent ServiceMonitor gives its series


TENANT_PODS_JOB = "kubernetes-pods"
TENANT_PODS_DIR = "pods"  # under targets_dir: the file_sd targets of TENANT_PODS_JOB
# The real node's kubelet, as kube-prometheus-stack's kubelet ServiceMonitor scrapes its cAdvisor
# endpoint: this job and a metrics_path label, what controller.idleSessions.cpuSource selects by
# default (the idle-session CPU rung reads container_cpu_usage_seconds_total from there alone).
KUBELET_SCRAPE_JOB = "kubelet"
KUBELET_CADVISOR_PATH = "/metrics/cadvisor"


@dataclass(frozen=True)
class KubeletScrape:
    """Where the real node's kubelet serves HTTPS, and the client identity Prometheus scrapes it
    with (the kubelet authenticates by x509 and authorizes through the apiserver)."""

    port: int
    ca_file: Path
    cert_file: Path
    key_file: Path


def prometheus_config(
    dcgm_port: int,
    targets_dir: Path | None = None,
    scrape_interval: str = "1s",
    prometheus_port: int | None = None,
    kubelet: KubeletScrape | None = None,
) -> dict[str, Any]:
    """Scrape the fake dcgm-exporter; with targets_dir, also every controller whose port a test
    registers there at runtime (file_sd: a JSON file per target, picked up without a reload), and
    every tenant pod a test registers under targets_dir/pods, as the prometheus-community chart's
    `kubernetes-pods` job scrapes annotated pods: with honor_labels, so that a tenant's exporter can
    write any label (what docs/threat-model.md assumes of a real cluster). With prometheus_port,
    Prometheus also scrapes itself (its counters of dropped samples, which `ghostgpu doctor` reads).
    With kubelet, the real node's cAdvisor endpoint as job `kubelet` (KUBELET_SCRAPE_JOB)."""
    jobs: list[dict[str, Any]] = [
        {
            "job_name": "dcgm-exporter",
            "scrape_interval": scrape_interval,
            "honor_labels": True,  # keep the exporter's namespace/pod/container labels as they are
            "static_configs": [{"targets": [f"127.0.0.1:{dcgm_port}"]}],
        },
        {
            # The node agent's series, served by the same fake exporter as a target of their own (as
            # the agent's pods are), so that a test can take this target down alone. As the
            # bundle's ServiceMonitor: no honor_labels, and the target's job and namespace are the
            # agent's (the controller reads its series only from there: metrics.agentSource).
            "job_name": AGENT_SCRAPE_JOB,
            "scrape_interval": scrape_interval,
            "metrics_path": "/agent/metrics",
            "static_configs": [
                {"targets": [f"127.0.0.1:{dcgm_port}"], "labels": {"namespace": AGENT_NAMESPACE}}
            ],
        },
    ]
    if targets_dir is not None:
        jobs.append(
            {
                "job_name": CONTROLLER_SCRAPE_JOB,
                "scrape_interval": scrape_interval,
                "file_sd_configs": [{"files": [str(targets_dir / "*.json")], "refresh_interval": "1s"}],
            }
        )
        jobs.append(
            {
                "job_name": TENANT_PODS_JOB,
                "scrape_interval": scrape_interval,
                "honor_labels": True,
                "file_sd_configs": [
                    {"files": [str(targets_dir / TENANT_PODS_DIR / "*.json")], "refresh_interval": "1s"}
                ],
            }
        )
    if kubelet is not None:
        jobs.append(
            {
                "job_name": KUBELET_SCRAPE_JOB,
                "scrape_interval": scrape_interval,
                "scheme": "https",
                "metrics_path": KUBELET_CADVISOR_PATH,
                # As the chart's ServiceMonitor: cAdvisor's namespace/pod/container labels are kept.
                "honor_labels": True,
                # cAdvisor stamps a sample with its housekeeping time (every 10 s or more); at this
                # 1 s scrape the stamped samples would be one in ten, too few for the idle
                # rungs' coverage at a 1 s scrapeInterval. Stamped with the scrape's time instead.
                "honor_timestamps": False,
                "tls_config": {
                    "ca_file": str(kubelet.ca_file),
                    "cert_file": str(kubelet.cert_file),
                    "key_file": str(kubelet.key_file),
                },
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{kubelet.port}"],
                        "labels": {"metrics_path": KUBELET_CADVISOR_PATH},
                    }
                ],
            }
        )
    if prometheus_port is not None:
        jobs.append(
            {
                "job_name": "prometheus",
                "scrape_interval": "5s",
                "static_configs": [{"targets": [f"127.0.0.1:{prometheus_port}"]}],
            }
        )
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": jobs,
    }
