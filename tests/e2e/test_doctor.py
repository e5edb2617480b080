"""`ghostgpu doctor` against the devcluster: with everything installed (the rendered bundles, an
opted-in namespace with a running GPU pod and its series, a controller holding its Lease) every
row is ok; then one prerequisite is broken at a time — a Kyverno policy deleted, Kueue stopped,
the fake exporter stopped, a namespace with an unknown team, a ClusterRole stripped of a verb —
and exactly that row fails, with its fix, while the others keep their status. Each change is
undone before the next test (the session shares one devcluster).

doctor runs as a read-only ServiceAccount (get/list/watch on everything, create only on
subjectaccessreviews): any write it tried would be refused and fail its row, so "all ok" with
that identity is the proof that doctor only reads."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from polling import eventually

from ghostgpu.devcluster import DevCluster, procs
from ghostgpu.devcluster.bundles import FIELD_MANAGER, bundle_docs

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
TEAM = "research"
# Justified warnings on the devcluster: Kueue and Kyverno run as processes, not Deployments, so
# neither Kueue's image tag nor Kyverno's --crdWatcher flag can be read from the cluster.
DEVCLUSTER_WARNINGS = {"kueue: version", "kyverno: CRD watcher"}
# The node agent is part of the applied bundle; the devcluster is neither a MultiKueue manager nor a worker.
NOT_CONFIGURED = {"kueue: MultiKueue"}
READ_ONLY_ROLE = "ghostgpu-doctor-read-only"
DOCTOR = [sys.executable, "-m", "ghostgpu.cli", "doctor"]


@dataclass
class Doctor:
    kubeconfig: Path
    config: Path

    def run(self) -> tuple[int, dict[str, dict[str, str]]]:
        out = subprocess.run(
            [*DOCTOR, "-c", str(self.config), "--kubeconfig", str(self.kubeconfig), "--json"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=180,
        )
        assert out.returncode in (0, 1), out.stderr
        return out.returncode, {r["check"]: r for r in json.loads(out.stdout)}


def statuses(rows: dict[str, dict[str, str]]) -> dict[str, str]:
    return {k: r["status"] for k, r in rows.items()}


def read_only_kubeconfig(cluster: DevCluster, path: Path) -> Path:
    """A kubeconfig for a ServiceAccount that may read everything and write nothing."""
    kube = cluster.kube
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": READ_ONLY_ROLE},
            "rules": [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
                {"nonResourceURLs": ["*"], "verbs": ["get"]},
                # a review is answered, never stored: the one create doctor sends
                {
                    "apiGroups": ["authorization.k8s.io"],
                    "resources": ["subjectaccessreviews"],
                    "verbs": ["create"],
                },
            ],
        }
    )
    kube.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "doctor", "namespace": "default"}}
    )
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": READ_ONLY_ROLE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": READ_ONLY_ROLE,
            },
            "subjects": [{"kind": "ServiceAccount", "name": "doctor", "namespace": "default"}],
        }
    )
    token = (
        client.CoreV1Api(kube.api_client)
        .create_namespaced_service_account_token(
            "doctor",
            "default",
            client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[])),
        )
        .status.token
    )
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    ctx = {"name": "doctor", "context": {"cluster": admin["clusters"][0]["name"], "user": "doctor"}}
    cfg = {**admin, "users": [{"name": "doctor", "user": {"token": token}}], "contexts": [ctx]}
    path.write_text(yaml.safe_dump({**cfg, "current-context": "doctor"}))
    return path


def gpu_pod(name: str, ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {"name": "main", "image": "trainer:latest", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        },
    }


def stop_process(cluster: DevCluster, name: str) -> list[str]:
    """Stop one devcluster process; returns its command line for start_process."""
    [rec] = [p for p in cluster.state.processes if p.name == name]
    argv = [a.decode() for a in Path(f"/proc/{rec.pid}/cmdline").read_bytes().split(b"\0") if a]
    procs.stop(rec)
    return argv


def start_process(cluster: DevCluster, name: str, argv: list[str]) -> None:
    rec = procs.start(name, argv, cluster.state_dir / "logs", cwd=cluster.state_dir)
    cluster.state.processes = [rec if p.name == name else p for p in cluster.state.processes]
    (cluster.state_dir / "state.json").write_text(cluster.state.model_dump_json(indent=2))


@dataclass
class Setup:
    doctor: Doctor
    namespace: str
    pod: str
    baseline: dict[str, dict[str, str]]
    code: int


@pytest.fixture(scope="module")
def setup(
    devcluster: DevCluster, applied_bundles: dict[str, list[str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    assert not any(applied_bundles.values()), applied_bundles
    if "prometheus" not in devcluster.state.addons:
        pytest.skip("this devcluster runs without Prometheus and the fake dcgm-exporter")
    tmp = tmp_path_factory.mktemp("doctor")
    cfg = yaml.safe_load((REPO / "examples" / "ghostgpu.yaml").read_text())
    # The example's processSource (agent), as the applied bundle: doctor checks the grants and the
    # agent DaemonSet of the bundle rendered from this config against the cluster.
    cfg["controller"].update(
        prometheus={"url": devcluster.state.prometheus_url, "timeout": "5s"}, pollInterval="2s"
    )
    config = tmp / "ghostgpu.yaml"
    config.write_text(yaml.safe_dump(cfg))
    kube, core = devcluster.kube, client.CoreV1Api(devcluster.kube.api_client)
    ns, pod = f"doctor-{uuid.uuid4().hex[:8]}", "trainer"
    # The pod first, then the opt-in: it predates the namespace's LocalQueue, as a ghost does.
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    eventually(lambda: core.list_namespaced_service_account(ns).items, 30, "the default ServiceAccount")
    kube.apply(gpu_pod(pod, ns))
    eventually(lambda: core.read_namespaced_pod(pod, ns).status.phase == "Running", 60, "the GPU pod to run")
    opted_in = {"ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": TEAM}
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": opted_in}})
    rbac = client.RbacAuthorizationV1Api(kube.api_client)
    eventually(
        lambda: any(
            b.metadata.name == "ghostgpu-controller" for b in rbac.list_namespaced_role_binding(ns).items
        ),
        60,
        "Kyverno to generate the controller's RoleBinding in the opted-in namespace",
    )
    devcluster.dcgm.set(ns, pod, util=80, fb_used_mib=2048)
    log = (tmp / "controller.log").open("w")
    controller = subprocess.Popen(
        [
            *(sys.executable, "-m", "ghostgpu.cli", "controller", "-c", str(config)),
            *("--kubeconfig", str(devcluster.kubeconfig), "--host", "127.0.0.1", "--port", "0"),
            *("--identity", "doctor-test", "--decision-log", ""),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    coordination = client.CoordinationV1Api(kube.api_client)
    lease = cfg["controller"].get("leaseName", "ghostgpu-controller")

    def holder() -> str | None:
        try:
            return coordination.read_namespaced_lease(lease, "ghostgpu-system").spec.holder_identity
        except client.ApiException as exc:
            if exc.status == 404:  # not created yet
                return None
            raise

    eventually(lambda: holder() == "doctor-test", 60, "the controller to take its Lease")
    doctor = Doctor(read_only_kubeconfig(devcluster, tmp / "doctor.kubeconfig"), config)
    eventually(lambda: statuses(doctor.run()[1])["prometheus: GPU series"] == "ok", 60, "the pod's series")
    code, rows = doctor.run()
    try:
        yield Setup(doctor, ns, pod, rows, code)
    finally:
        controller.terminate()
        controller.wait(30)
        devcluster.dcgm.clear()
        kube.delete("v1", "Namespace", ns)
        kube.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", READ_ONLY_ROLE)
        kube.delete("rbac.authorization.k8s.io/v1", "ClusterRole", READ_ONLY_ROLE)
        kube.delete("v1", "ServiceAccount", "doctor", "default")


def assert_only_row_fails(setup: Setup, check: str, *needles: str) -> dict[str, str]:
    code, rows = setup.doctor.run()
    assert code == 1
    row = rows[check]
    assert row["status"] == "fail" and row["fix"], row
    for needle in needles:
        assert needle in row["found"] + row["fix"], (needle, row)
    others = {k: v for k, v in statuses(rows).items() if k != check}
    assert others == {k: v for k, v in statuses(setup.baseline).items() if k != check}
    return row


def test_everything_installed_is_ok(setup: Setup) -> None:
    got = statuses(setup.baseline)
    assert setup.code == 0, setup.baseline
    assert {k for k, v in got.items() if v == "warn"} <= DEVCLUSTER_WARNINGS, setup.baseline
    assert {k for k, v in got.items() if v == "skip"} == NOT_CONFIGURED
    assert {k for k, v in got.items() if v == "fail"} == set(), setup.baseline
    assert "all 1 tracked GPU pods" in setup.baseline["prometheus: GPU series"]["found"]
    assert setup.namespace in setup.baseline["namespaces: opted in"]["found"]
    assert "leader doctor-test" in setup.baseline["controller: running, leader"]["found"]
    assert setup.namespace in setup.baseline["controller: RBAC"]["found"]
    # the applied bundle's agent DaemonSet, on the kwok GPU nodes
    assert "agent pods ready" in setup.baseline["agent: on every GPU node"]["found"]


def test_deleted_tracking_policy(setup: Setup, devcluster: DevCluster) -> None:
    [policy] = [d for d in bundle_docs("policies") if d["metadata"]["name"] == "ghostgpu-track-gpu-workloads"]
    devcluster.kube.delete(policy["apiVersion"], policy["kind"], policy["metadata"]["name"])
    try:
        assert_only_row_fails(setup, "kyverno: policies", "ghostgpu-track-gpu-workloads", "policies/")
    finally:
        devcluster.kube.apply(policy, FIELD_MANAGER)
        eventually(
            lambda: statuses(setup.doctor.run()[1])["kyverno: policies"] == "ok", 90, "the policy to be ready"
        )


def test_kueue_stopped(setup: Setup, devcluster: DevCluster) -> None:
    argv = stop_process(devcluster, "kueue")
    try:
        assert_only_row_fails(setup, "kueue: manager running", "does not answer", "start Kueue")
    finally:
        start_process(devcluster, "kueue", argv)
        url = f"http://127.0.0.1:{devcluster.state.ports['kueue_health']}/readyz"
        eventually(lambda: httpx.get(url, timeout=2).status_code == 200, 120, "Kueue /readyz")


def test_exporter_stopped(setup: Setup, devcluster: DevCluster) -> None:
    argv = stop_process(devcluster, "fake-dcgm-exporter")
    try:
        prom = devcluster.state.prometheus_url
        eventually(
            lambda: [
                s
                for s in httpx.get(
                    f"{prom}/api/v1/query", params={"query": 'up{job="dcgm-exporter"} == 0'}
                ).json()["data"]["result"]
            ],
            30,
            "Prometheus to see the exporter down",
        )
        assert_only_row_fails(setup, "prometheus: GPU series", "up == 0", "dcgm-exporter")
    finally:
        start_process(devcluster, "fake-dcgm-exporter", argv)
        eventually(
            lambda: httpx.get(f"{devcluster.state.dcgm_url}/healthz", timeout=2).status_code == 200,
            30,
            "exporter",
        )
        devcluster.dcgm.set(setup.namespace, setup.pod, util=80, fb_used_mib=2048)
        eventually(
            lambda: statuses(setup.doctor.run()[1])["prometheus: GPU series"] == "ok", 60, "the series back"
        )


def test_namespace_with_unknown_team(setup: Setup, devcluster: DevCluster) -> None:
    ns = f"doctor-bad-{uuid.uuid4().hex[:6]}"
    labels = {"ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": "no-such-team"}
    devcluster.kube.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
    )
    try:
        assert_only_row_fails(setup, "namespaces: opted in", f"{ns} (ghostgpu.io/team=no-such-team)", TEAM)
    finally:
        devcluster.kube.delete("v1", "Namespace", ns)
        eventually(lambda: devcluster.kube.get("v1", "Namespace", ns) is None, 90, f"namespace {ns} gone")


def test_clusterrole_without_a_verb(setup: Setup, devcluster: DevCluster) -> None:
    [role] = [
        d
        for d in bundle_docs("controller")
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-read")
    ]
    stripped = json.loads(json.dumps(role))
    pods_rule = next(r for r in stripped["rules"] if "pods" in r["resources"])
    pods_rule["verbs"].remove("watch")
    devcluster.kube.apply(stripped, FIELD_MANAGER)
    try:
        assert_only_row_fails(setup, "controller: RBAC", "watch pods", "rbac.yaml")
    finally:
        devcluster.kube.apply(role, FIELD_MANAGER)
