"""GPUs through DRA, end to end in the devcluster: the real kube-apiserver (resource.k8s.io/v1),
scheduler and controller-manager allocate ResourceClaims on kwok DRA nodes whose devices are
published in ResourceSlices (ghostgpu.devcluster.dra: no DRA driver runs), Kyverno runs the
tracking policy rendered from a DRA ghostgpu.yaml, Kueue runs with its rendered
`deviceClassMappings`, the fake dcgm-exporter prints DRA GPUs' series with dcgm-exporter's dra_*
labels, and the controller counts, reserves, judges, reclaims and restores.

The module's cluster file (CONFIG) has one device-plugin flavor (h100-mix: the 8 GPUs of kwok node
gpu-h100-1) and one DRA flavor (h100-dra: two kwok nodes of 4 `gpu.nvidia.com` devices each, label
ghostgpu.io/gpu-driver=dra), both in team dra-team's quota (8 each). One namespace holds the fleet
for the whole module (one set-up): a 4-device DRA Deployment, a NIC-claim Deployment, two
Deployments whose pods share one GPU claim, and a 2-GPU device-plugin Deployment.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_runs import restore, run_cli
from kubernetes import client
from kueue_jobs import KUEUE, delete_job_now, workload_of
from proctables import FINISHED, LIVE
from reservation_config import reservation_section
from test_controller import LEASE_NS, Controller, wait_for

from ghostgpu.config import load_config
from ghostgpu.devcluster import DevCluster, FakeDcgmClient, dra
from ghostgpu.devcluster.bundles import FIELD_MANAGER
from ghostgpu.devcluster.fake_dcgm import DraLabels
from ghostgpu.render import render_bundles

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
POLL = 2  # seconds
TEAM = "dra-team"
QUEUE = "dra-q"  # not `default`: Kueue would default every new Deployment of the namespace into it
DP_NODE = "gpu-h100-1"
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
PLACEHOLDERS = "ghostgpu.io/reservation=true"
GPUS_PER_NODE = 4  # two DRA nodes: 8 devices, the DRA flavor's quota
CONFIG = {
    "apiVersion": "ghostgpu.io/v1alpha1",
    "kind": "GhostgpuConfig",
    "flavors": [
        {
            "name": "h100-mix",
            "resource": "nvidia.com/gpu",
            "nodeLabels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "kubernetes.io/hostname": DP_NODE,
            },
            "tolerations": TOLERATE_GPU,
        },
        {
            "name": "h100-dra",
            "deviceClass": dra.GPU_CLASS,
            "nodeLabels": dict(dra.DRA_NODE_LABELS),
            "tolerations": TOLERATE_GPU,
        },
    ],
    "teams": [{"name": TEAM, "quota": {"h100-mix": 8, "h100-dra": 8}}],
}


def kueue_counts_dra(dc: DevCluster) -> bool:
    """Kueue v0.18+ charges DRA devices by default; v0.17 only behind its alpha gate, which the
    devcluster does not turn on (docs/kueue-versions.md)."""
    v = (dc.state.kueue_version or "v0.0.0").lstrip("v").split(".")
    return (int(v[0]), int(v[1])) >= (0, 18)


# --- objects ---------------------------------------------------------------------------------------


def claim_spec(device_class: str, count: int) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [{"name": "dev", "exactly": {"deviceClassName": device_class, "count": count}}]
        }
    }


def claim_template(name: str, ns: str, device_class: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": dra.RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": claim_spec(device_class, count)},
    }


def pod_spec(claim: dict[str, str]) -> dict[str, Any]:
    """A pod whose one container uses one claim (`{"resourceClaimTemplateName": ...}` or
    `{"resourceClaimName": ...}`); it tolerates the GPU taint and names no node."""
    return {
        "tolerations": TOLERATE_GPU,
        "resourceClaims": [{"name": "dev", **claim}],
        "containers": [
            {"name": "main", "image": "trainer:latest", "resources": {"claims": [{"name": "dev"}]}}
        ],
    }


def deployment(name: str, ns: str, spec: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    """No ghostgpu.io/tracked label: whether it is tracked is the policy's call."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def dra_job(name: str, ns: str, template: str) -> dict[str, Any]:
    spec = {"restartPolicy": "Never", **pod_spec({"resourceClaimTemplateName": template})}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
        "spec": {"parallelism": 1, "completions": 1, "suspend": True, "template": {"spec": spec}},
    }


# --- the module's set-up ---------------------------------------------------------------------------


@dataclass
class DraEnv:
    dc: DevCluster
    config: Path  # CONFIG with the controller section at the tests' pace
    files: dict[str, str]  # what `ghostgpu render` makes of it
    nodes: list[str]

    def get(self, api: str, kind: str, name: str, ns: str | None = None) -> dict[str, Any] | None:
        obj = self.dc.kube.get(api, kind, name, ns)
        return None if obj is None else obj.to_dict()

    def list(self, api: str, kind: str, ns: str | None = None, selector: str = "") -> list[dict[str, Any]]:
        res = self.dc.kube.resource(api, kind).get(namespace=ns, label_selector=selector)
        return list(res.to_dict()["items"])

    def pods(self, ns: str, app: str) -> list[dict[str, Any]]:
        return self.list("v1", "Pod", ns, f"app={app}")

    def running(self, ns: str, app: str, n: int = 1) -> list[dict[str, Any]] | None:
        pods = [
            p
            for p in self.pods(ns, app)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        return pods if len(pods) == n else None

    def claims_of(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The pod's ResourceClaims: named ones, and the ones generated from its templates."""
        ns = pod["metadata"]["namespace"]
        generated = {
            s["name"]: s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses") or []
        }
        names = [
            c.get("resourceClaimName") or generated.get(c["name"])
            for c in pod["spec"].get("resourceClaims") or []
        ]
        return [
            c for n in names if n and (c := self.get(dra.RESOURCE_API, "ResourceClaim", n, ns)) is not None
        ]

    def status(self) -> dict[str, dict[str, Any]]:
        """`ghostgpu status --json` with CONFIG, by flavor."""
        out = run_cli(self.dc, "status", "--json", "--config", str(self.config))
        assert out.returncode == 0, out.stderr
        return {a["flavor"]: a for a in json.loads(out.stdout)}

    def workloads(self, ns: str | None = None, selector: str = "") -> list[dict[str, Any]]:
        co = client.CustomObjectsApi(self.dc.kube.api_client)
        if ns is None:
            return list(co.list_cluster_custom_object(*KUEUE, "workloads", label_selector=selector)["items"])
        return list(
            co.list_namespaced_custom_object(*KUEUE, ns, "workloads", label_selector=selector)["items"]
        )

    def workload_of(self, ns: str, job: str) -> dict[str, Any] | None:
        return workload_of(self.dc.kube.api_client, ns, job)

    def cq_usage(self) -> dict[tuple[str, str], float]:
        co = client.CustomObjectsApi(self.dc.kube.api_client)
        st = co.get_cluster_custom_object(*KUEUE, "clusterqueues", TEAM).get("status") or {}
        return {
            (fu["name"], r["name"]): float(r.get("total", 0))
            for fu in st.get("flavorsUsage") or []
            for r in fu.get("resources") or []
        }

    def admitted(self, ns: str, job: str) -> bool:
        return client.BatchV1Api(self.dc.kube.api_client).read_namespaced_job(job, ns).spec.suspend is False

    def delete_job(self, ns: str, job: str) -> None:
        delete_job_now(self.dc.kube.api_client, ns, job)


def _wait_until_dra_tracking_is_live(dc: DevCluster) -> None:
    """Kyverno takes a moment to load a changed policy: probe with a dry-run Deployment of a GPU
    template in an opted-in namespace until it comes back labelled."""
    ns = f"dra-probe-{uuid.uuid4().hex[:8]}"
    labels = {"ghostgpu.io/reclaim": "enabled"}
    dc.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}})
    apps = client.AppsV1Api(dc.kube.api_client)
    try:
        dc.kube.apply(claim_template("gpu1", ns, dra.GPU_CLASS, 1))
        probe = deployment("probe", ns, pod_spec({"resourceClaimTemplateName": "gpu1"}))

        def labelled() -> bool:
            made = apps.create_namespaced_deployment(ns, probe, dry_run="All")
            return (made.metadata.labels or {}).get("ghostgpu.io/tracked") == "true"

        wait_for(labelled, 90, "the DRA tracking policy to label a DRA GPU Deployment at admission")
    finally:
        dc.kube.delete("v1", "Namespace", ns)


def _apply_policy_files(dc: DevCluster, files: dict[str, str]) -> None:
    for name in ("policies/kyverno-rbac.yaml", "policies/track-gpu-workloads.yaml"):
        for doc in yaml.safe_load_all(files[name]):
            if doc:
                dc.kube.apply(doc, FIELD_MANAGER)


@pytest.fixture(scope="module")
def env(
    devcluster: DevCluster, applied_bundles: dict[str, list[str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DraEnv]:
    """DRA nodes, classes and slices; the tracking policy and Kueue objects rendered from CONFIG
    (the session's bundles put back afterwards); the controller's config file."""
    assert not any(applied_bundles.values()), applied_bundles
    tmp = tmp_path_factory.mktemp("dra")
    path = tmp / "ghostgpu.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(CONFIG))))  # plain copies: no YAML aliases
    files = render_bundles(load_config(path))
    nodes = dra.dra_nodes(2)
    kube = devcluster.kube
    t0 = time.monotonic()
    dra.install(kube, nodes, gpus=GPUS_PER_NODE)
    kueue_objs = [
        d
        for f in ("kueue/resource-flavors.yaml", "kueue/cluster-queues.yaml")
        for d in yaml.safe_load_all(files[f])
        if d
    ]
    try:
        for doc in kueue_objs:
            kube.apply(doc, FIELD_MANAGER)
        _apply_policy_files(devcluster, files)
        _wait_until_dra_tracking_is_live(devcluster)
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
        cfg = dict(CONFIG)
        section = reservation_section(devcluster.state.prometheus_url, queue=QUEUE, poll_s=POLL)
        cfg["controller"] = {**section, "processSource": "exec"}
        path.write_text(yaml.safe_dump(json.loads(json.dumps(cfg))))
        print(f"DRA nodes, classes, slices, policy and Kueue objects in {time.monotonic() - t0:.1f}s")
        yield DraEnv(devcluster, path, files, [n.name for n in nodes])
    finally:
        _apply_policy_files(devcluster, render_bundles(load_config(REPO / "examples" / "ghostgpu.yaml")))
        for doc in reversed(kueue_objs):
            kube.delete(doc["apiVersion"], doc["kind"], doc["metadata"]["name"])
        dra.uninstall(kube, nodes)


@pytest.fixture(scope="module")
def dra_kueue(env: DraEnv) -> Iterator[dict[str, Any]]:
    """Kueue restarted with the rendered Configuration's `resources` (its deviceClassMappings);
    the Configuration it started with is put back at the end of the module."""
    rendered = yaml.safe_load(env.files["kueue/kueue-manager-config.yaml"])
    conf = yaml.safe_load(rendered["data"]["controller_manager_config.yaml"])
    resources = conf["resources"]
    assert resources["deviceClassMappings"] == [
        {"name": "gpu.nvidia.com", "deviceClassNames": ["gpu.nvidia.com"]}
    ]
    took = env.dc.restart_kueue({"resources": resources})
    print(f"Kueue restarted with deviceClassMappings in {took:.1f}s")
    yield resources
    env.dc.restart_kueue(None)


SHARED = ("shared-a", "shared-b")  # two Deployments whose pods use one ResourceClaim of 1 GPU


@dataclass
class Fleet:
    ns: str
    gpu_pod: str  # dra-x's pod (4 gpu.nvidia.com devices)
    dp_pod: str  # dp's pod (2 nvidia.com/gpu)
    shared_pods: dict[str, str]  # Deployment -> its pod
    nic_pod: str


@pytest.fixture(scope="module")
def fleet(env: DraEnv, devcluster: DevCluster) -> Iterator[Fleet]:
    """One opted-in namespace of team dra-team, its LocalQueue QUEUE, and the module's workloads,
    all Running: dra-x (a 4-device template claim: all of one DRA node), nic (a NIC-class
    template claim), shared-a and shared-b (one pod each, naming the ResourceClaim shared-gpu of
    1 GPU), dp (2 device-plugin GPUs on DP_NODE). DRA devices in use: 5 of 8."""
    kube = devcluster.kube
    ns = f"dra-{uuid.uuid4().hex[:8]}"
    labels = {"ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": TEAM}
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}})
    tables, dcgm = devcluster.process_tables, devcluster.dcgm
    try:
        lq = {"name": QUEUE, "namespace": ns}
        kube.apply(
            {
                "apiVersion": "/".join(KUEUE),
                "kind": "LocalQueue",
                "metadata": lq,
                "spec": {"clusterQueue": TEAM},
            }
        )
        kube.apply(claim_template("gpu4", ns, dra.GPU_CLASS, 4))
        kube.apply(claim_template("nic1", ns, dra.NIC_CLASS, 1))
        shared_claim = {"name": "shared-gpu", "namespace": ns}
        kube.apply(
            {"apiVersion": dra.RESOURCE_API, "kind": "ResourceClaim", "metadata": shared_claim,
             "spec": claim_spec(dra.GPU_CLASS, 1)}
        )  # fmt: skip
        # dra-x first: its 4 devices take one node whole, the rest go to the other one.
        kube.apply(deployment("dra-x", ns, pod_spec({"resourceClaimTemplateName": "gpu4"})))
        [gpu] = wait_for(lambda: env.running(ns, "dra-x"), 90, "dra-x running")
        kube.apply(deployment("nic", ns, pod_spec({"resourceClaimTemplateName": "nic1"})))
        for name in SHARED:
            kube.apply(deployment(name, ns, pod_spec({"resourceClaimName": "shared-gpu"})))
        dp = {"tolerations": TOLERATE_GPU, "nodeSelector": {"kubernetes.io/hostname": DP_NODE},
              "containers": [{"name": "main", "image": "trainer:latest",
                              "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}  # fmt: skip
        kube.apply(deployment("dp", ns, dp))
        [nic] = wait_for(lambda: env.running(ns, "nic"), 60, "nic running")
        shared = {n: wait_for(lambda n=n: env.running(ns, n), 60, f"{n} running")[0] for n in SHARED}
        [dpp] = wait_for(lambda: env.running(ns, "dp"), 60, "dp running")
        f = Fleet(
            ns,
            gpu["metadata"]["name"],
            dpp["metadata"]["name"],
            {n: p["metadata"]["name"] for n, p in shared.items()},
            nic["metadata"]["name"],
        )
        # Busy: dra-x and dp. Idle by every signal: the shared-claim pods and nic.
        set_gpu_series(env, dcgm, gpu, util=90.0)
        tables.set(ns, f.gpu_pod, LIVE)
        dcgm.set(ns, f.dp_pod, util=90.0, node=DP_NODE)
        tables.set(ns, f.dp_pod, LIVE)
        for p in shared.values():
            set_gpu_series(env, dcgm, p, util=0.0)
            tables.set(ns, p["metadata"]["name"], FINISHED)
        tables.set(ns, f.nic_pod, FINISHED)
        yield f
    finally:
        for pod in [p["metadata"]["name"] for p in env.list("v1", "Pod", ns)]:
            tables.clear(ns, pod)
            dcgm.remove(ns, pod)
        kube.delete("v1", "Namespace", ns)
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(kube.api_client).delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        wait_for(lambda: kube.get("v1", "Namespace", ns) is None, 90, f"namespace {ns} gone")


def set_gpu_series(env: DraEnv, dcgm: FakeDcgmClient, pod: dict[str, Any], util: float) -> None:
    """dcgm-exporter's series for each GPU device allocated to the pod's claims, as it prints them
    with --kubernetes-enable-dra: the GPU's index on its node (device gpu-N), the pod, and the
    claim, driver, pool and device (its dra_* labels)."""
    ns, name, node = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["spec"]["nodeName"]
    devices = [
        (c["metadata"]["name"], r)
        for c in env.claims_of(pod)
        for r in c["status"]["allocation"]["devices"]["results"]
        if r["driver"] == dra.GPU_DRIVER
    ]
    assert devices, f"{ns}/{name}: no GPU device allocated"
    for claim, r in devices:
        labels = DraLabels(claim=claim, pool=r["pool"], device=r["device"])
        dcgm.set(ns, name, util=util, node=node, gpu=int(r["device"].removeprefix("gpu-")), dra=labels)


# --- tests -----------------------------------------------------------------------------------------


def test_scheduler_allocates_claims_from_the_slices_of_kwok_nodes(
    env: DraEnv, make_namespace: Callable[..., str]
) -> None:
    """resource.k8s.io/v1 is served; a pod of a 2-GPU template lands on a DRA node, its generated
    claim holds 2 devices of that node's pool and names the pod in reservedFor; the claim goes
    with the pod."""
    assert dra.resource_api_served(env.dc.kube)
    ns = make_namespace()
    env.dc.kube.apply(claim_template("gpu2", ns, dra.GPU_CLASS, 2))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": ns},
        "spec": pod_spec({"resourceClaimTemplateName": "gpu2"}),
    }
    env.dc.kube.apply(pod)
    running = wait_for(
        lambda: (p := env.get("v1", "Pod", "p", ns)) and p["status"].get("phase") == "Running" and p,
        60,
        "p running",
    )
    node = running["spec"]["nodeName"]
    assert node in env.nodes
    [claim] = env.claims_of(running)
    assert claim["metadata"]["name"].startswith("p-dev-")  # generated by kube-controller-manager
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {(r["driver"], r["pool"], r["request"]) for r in results} == {(dra.GPU_DRIVER, node, "dev")}
    assert len({r["device"] for r in results}) == 2
    assert [(c["resource"], c["name"]) for c in claim["status"]["reservedFor"]] == [("pods", "p")]
    env.dc.kube.delete("v1", "Pod", "p", ns)
    wait_for(
        lambda: env.get(dra.RESOURCE_API, "ResourceClaim", claim["metadata"]["name"], ns) is None,
        60,
        "the generated claim deleted with its pod",
    )


def test_tracking_policy_labels_gpu_claims_only(env: DraEnv, fleet: Fleet) -> None:
    """The rendered tracking policy, live in Kyverno: the GPU-template Deployment and the
    device-plugin one are tracked; the NIC-class one and the two naming a shared claim are not,
    though all of them run with their claims allocated."""
    assert [tracked(env, fleet.ns, n) for n in ("dra-x", "dp")] == ["true", "true"]
    assert [tracked(env, fleet.ns, n) for n in ("nic", *SHARED)] == [None, None, None]
    [nic] = env.claims_of(env.get("v1", "Pod", fleet.nic_pod, fleet.ns) or {})
    assert [r["driver"] for r in nic["status"]["allocation"]["devices"]["results"]] == [dra.NIC_DRIVER]
    shared = env.get(dra.RESOURCE_API, "ResourceClaim", "shared-gpu", fleet.ns) or {}
    assert sorted(c["name"] for c in shared["status"]["reservedFor"]) == sorted(fleet.shared_pods.values())


def tracked(env: DraEnv, ns: str, name: str) -> str | None:
    dep = env.get("apps/v1", "Deployment", name, ns) or {}
    return (dep.get("metadata", {}).get("labels") or {}).get("ghostgpu.io/tracked")


@pytest.mark.kueue
def test_kueue_charges_a_dra_job_against_the_flavor_quota(
    env: DraEnv, dra_kueue: dict[str, Any], fleet: Fleet
) -> None:
    """With the rendered deviceClassMappings, Kueue admits a Job of a 2-device template on the
    DRA flavor, charged 2 gpu.nvidia.com; a 9-device Job exceeds the flavor's quota of 8 and waits.
    Kueue v0.17 (its alpha gate off, as the bundle leaves it) loads the same Configuration and
    admits both Jobs charging nothing for their devices, the 9-device one beyond the quota."""
    if not kueue_counts_dra(env.dc):
        uncharged_on_old_kueue(env, fleet.ns)
        return
    ns, kube = fleet.ns, env.dc.kube
    kube.apply(claim_template("gpu2", ns, dra.GPU_CLASS, 2))
    kube.apply(claim_template("gpu9", ns, dra.GPU_CLASS, 9))
    try:
        kube.apply(dra_job("two", ns, "gpu2"))
        wait_for(lambda: env.admitted(ns, "two"), 60, "the 2-device Job admitted")
        wl = env.workload_of(ns, "two") or {}
        [ps] = wl["status"]["admission"]["podSetAssignments"]
        assert ps["flavors"] == {"gpu.nvidia.com": "h100-dra"}
        assert ps["resourceUsage"]["gpu.nvidia.com"] == "2"
        pods = wait_for(
            lambda: [p for p in env.list("v1", "Pod", ns, "job-name=two") if p["spec"].get("nodeName")],
            30,
            "its pod scheduled",
        )
        assert pods[0]["spec"]["nodeName"] in env.nodes
        assert pods[0]["spec"]["nodeSelector"] == dra.DRA_NODE_LABELS  # the flavor's, set by Kueue

        kube.apply(dra_job("nine", ns, "gpu9"))

        def refused() -> str | None:
            w = env.workload_of(ns, "nine") or {}
            conds = {c["type"]: c for c in (w.get("status") or {}).get("conditions") or []}
            c = conds.get("QuotaReserved")
            return c["message"] if c and c["status"] == "False" and "gpu.nvidia.com" in c["message"] else None

        why = wait_for(refused, 30, "the 9-device Job refused on quota")
        assert "h100-dra" in why, why
        assert not env.admitted(ns, "nine")
    finally:
        env.delete_job(ns, "two")
        env.delete_job(ns, "nine")


def failed_scheduling(env: DraEnv, ns: str, job: str) -> list[str]:
    """The pods of `job` the scheduler refused at least once."""
    pods = {p["metadata"]["name"] for p in env.list("v1", "Pod", ns, f"job-name={job}")}
    evs = client.CoreV1Api(env.dc.kube.api_client).list_namespaced_event(
        ns, field_selector="reason=FailedScheduling"
    )
    return sorted({e.involved_object.name for e in evs.items if e.involved_object.name in pods})


def uncharged_on_old_kueue(env: DraEnv, ns: str) -> None:
    """Kueue v0.17 without DynamicResourceAllocation: DRA Jobs admitted, charged nothing."""
    env.dc.kube.apply(claim_template("gpu2", ns, dra.GPU_CLASS, 2))
    env.dc.kube.apply(claim_template("gpu9", ns, dra.GPU_CLASS, 9))
    try:
        for job, template in (("two", "gpu2"), ("nine", "gpu9")):
            env.dc.kube.apply(dra_job(job, ns, template))
            wait_for(lambda job=job: env.admitted(ns, job), 60, f"{job} admitted")
            [ps] = (env.workload_of(ns, job) or {})["status"]["admission"]["podSetAssignments"]
            assert "gpu.nvidia.com" not in (ps.get("resourceUsage") or {}), ps
            assert "gpu.nvidia.com" not in (ps.get("flavors") or {}), ps
        assert ("h100-dra", "gpu.nvidia.com") not in env.cq_usage() or env.cq_usage()[
            ("h100-dra", "gpu.nvidia.com")
        ] == 0
    finally:
        env.delete_job(ns, "two")
        env.delete_job(ns, "nine")


@pytest.mark.kueue
def test_dra_deployment_counted_reserved_reclaimed_and_restored(
    env: DraEnv, dra_kueue: dict[str, Any], fleet: Fleet, devcluster: DevCluster, tmp_path: Path
) -> None:
    """The controller in enforce with `reservation: enforce`, over both flavors of one team:
    - status before it runs: DRA 5 of 8 devices in use (dra-x 4, the shared claim once), Kueue
      believes 8 free: gap 5; device-plugin 2 of 8 in use: gap 2;
    - placeholders reserve dra-x's 4 and the shared claim's 1 gpu.nvidia.com and dp's 2
      nvidia.com/gpu in the team's ClusterQueue: both gaps 0, and Kueue holds back a 4-device DRA
      Job (8 - 5 < 4), saying why (Kueue v0.17, which charges DRA Jobs nothing without its alpha
      gate, counts the placeholders all the same but admits the Job, whose pod then cannot be
      scheduled until dra-x is reclaimed);
    - dra-x goes idle (its devices' dcgm series at 0, its processes finished): reclaimed (scaled
      to 0, its claim deleted), the Job admitted onto the freed node; shared-a and shared-b,
      tracked by hand and idle by every signal, are held (their claim is the other's too); nic
      is never judged; `ghostgpu restore` brings dra-x back with 4 devices allocated again."""
    ns, kube = fleet.ns, devcluster.kube
    for name in SHARED:  # tracked another way than the policy: stopping one would free nothing
        kube.apply(
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": name, "namespace": ns, "labels": {"ghostgpu.io/tracked": "true"}}},
            field_manager="test-label",
        )  # fmt: skip
    old_claim = env.claims_of(env.get("v1", "Pod", fleet.gpu_pod, ns) or {})[0]["metadata"]["name"]

    st = env.status()
    d, m = st["h100-dra"], st["h100-mix"]
    assert (d["resource"], d["allocatable"], d["inUse"], d["trulyFree"]) == ("gpu.nvidia.com", 8, 5, 3)
    assert (d["kueueNominal"], d["kueueAdmitted"], d["kueueBelievesFree"], d["gap"]) == (8, 0, 8, 5)
    assert (m["resource"], m["allocatable"], m["inUse"], m["trulyFree"]) == ("nvidia.com/gpu", 8, 2, 6)
    assert (m["kueueNominal"], m["kueueAdmitted"], m["kueueBelievesFree"], m["gap"]) == (8, 0, 8, 2)

    ctl = Controller(devcluster.kubeconfig, env.config, tmp_path, "dra-enforce")
    try:
        fixed = {"ghostgpu-reserve-deployment-dra-x-h100-dra-4", "ghostgpu-reserve-deployment-dp-h100-mix-2"}

        def placeholders() -> dict[str, dict[str, str]]:
            return {
                w["metadata"]["name"]: {
                    c["type"]: c["status"] for c in (w.get("status") or {}).get("conditions") or []
                }
                for w in env.workloads(ns, PLACEHOLDERS)
            }

        def reserved() -> bool:
            ws = placeholders()
            # The shared device counts on the consumer pod whose uid sorts first: either holder.
            shared = {n for n in ws if n in {f"ghostgpu-reserve-deployment-{s}-h100-dra-1" for s in SHARED}}
            ready = all(c.get("Admitted") == c.get("PodsReady") == "True" for c in ws.values())
            return set(ws) - shared == fixed and len(shared) == 1 and ready

        started = time.monotonic()
        wait_for(reserved, 60, "the three holders reserved, admitted and ready")
        print(
            f"placeholders admitted and ready {time.monotonic() - started:.1f}s after the controller started"
        )
        usage = {("h100-mix", "nvidia.com/gpu"): 2, ("h100-dra", "gpu.nvidia.com"): 5}
        wait_for(lambda: env.cq_usage() == usage, 30, "Kueue to count the held GPUs of both flavors")
        st = env.status()
        d, m = st["h100-dra"], st["h100-mix"]
        held = (d["heldOutsideKueue"], d["reservationDesired"], d["reservedOutsideKueue"], d["kueueAdmitted"])
        assert held == (5, 5, 5, 5) and d["gpusUnknownPods"] == 0
        assert (d["trulyFree"], d["kueueBelievesFree"], d["gap"]) == (3, 3, 0)
        held = (m["heldOutsideKueue"], m["reservationDesired"], m["reservedOutsideKueue"], m["kueueAdmitted"])
        assert held == (2, 2, 2, 2)
        assert (m["trulyFree"], m["kueueBelievesFree"], m["gap"]) == (6, 6, 0)

        kube.apply(claim_template("gpu4", ns, dra.GPU_CLASS, 4))
        kube.apply(dra_job("big", ns, "gpu4"))

        def told_why() -> list[str]:
            w = env.workload_of(ns, "big")
            if w is None:
                return []
            evs = client.CoreV1Api(kube.api_client).list_namespaced_event(
                ns, field_selector=f"involvedObject.name={w['metadata']['name']}"
            )
            return [e.message for e in evs.items if e.reason == "GPUsHeldOutsideKueue"]

        if kueue_counts_dra(devcluster):
            [why] = wait_for(told_why, 30, "the Event on the waiting DRA Job's Workload")
            assert f"4 gpu.nvidia.com held outside Kueue by deployment/dra-x in {ns}" in why, why
            ctl.wait_polls(2)
            assert not env.admitted(ns, "big"), "8 - 5 reserved < 4: the DRA Job waits"
        else:  # Kueue v0.17: the Job's devices are charged nothing, so nothing holds it back
            wait_for(lambda: env.admitted(ns, "big"), 30, "the 4-device DRA Job admitted uncharged")
            wait_for(lambda: failed_scheduling(env, ns, "big"), 30, "its pod refused by the scheduler")

        # dra-x goes idle: reclaimed, and the Job gets its devices.
        set_gpu_series(env, devcluster.dcgm, env.get("v1", "Pod", fleet.gpu_pod, ns) or {}, util=0.0)
        devcluster.process_tables.set(ns, fleet.gpu_pod, FINISHED)
        idle_at = time.monotonic()
        wait_for(lambda: not env.pods(ns, "dra-x"), 120, "dra-x reclaimed and its pod gone")
        print(f"dra-x reclaimed {time.monotonic() - idle_at:.1f}s after it went idle")
        dep = env.get("apps/v1", "Deployment", "dra-x", ns) or {}
        assert dep["spec"]["replicas"] == 0
        assert dep["metadata"]["annotations"]["ghostgpu.io/reclaimed-from-replicas"] == "1"
        gone = lambda: env.get(dra.RESOURCE_API, "ResourceClaim", old_claim, ns) is None  # noqa: E731
        wait_for(gone, 60, "its claim deleted")
        wait_for(lambda: env.admitted(ns, "big"), 30, "the 4-device DRA Job admitted")
        big = wait_for(
            lambda: [p for p in env.list("v1", "Pod", ns, "job-name=big") if p["spec"].get("nodeName")],
            30,
            "its pod scheduled",
        )
        assert big[0]["spec"]["nodeName"] in env.nodes
        # kwok finishes a Job's pod at once; Kubernetes then deletes its generated claim, the pod
        # stays: a finished pod holds nothing, and its missing claim leaves nothing unknown.
        [big_claim] = [s["resourceClaimName"] for s in big[0]["status"].get("resourceClaimStatuses") or []]
        done = lambda: env.get("v1", "Pod", big[0]["metadata"]["name"], ns)["status"]["phase"] == "Succeeded"  # noqa: E731
        wait_for(done, 30, "big's pod finished")
        wait_for(
            lambda: env.get(dra.RESOURCE_API, "ResourceClaim", big_claim, ns) is None, 30, "its claim deleted"
        )
        ctl.wait_polls(1)
        d = env.status()["h100-dra"]
        assert (d["gpusUnknownPods"], d["inUse"], d["trulyFree"]) == (0, 1, 7), d
        dropped = lambda: "ghostgpu-reserve-deployment-dra-x-h100-dra-4" not in placeholders()  # noqa: E731
        wait_for(dropped, 3 * POLL, "dra-x's placeholder deleted")

        # Idle by every signal, but stopping them frees nothing (shared) or no GPU (nic): untouched.
        ctl.wait_polls(2)
        for name, pod in fleet.shared_pods.items():
            assert [p["metadata"]["name"] for p in env.running(ns, name) or []] == [pod]
        assert [p["metadata"]["name"] for p in env.running(ns, "nic") or []] == [fleet.nic_pod]
        assert [p["metadata"]["name"] for p in env.running(ns, "dp") or []] == [fleet.dp_pod]
        rows = [json.loads(line) for line in ctl.decisions.read_text().splitlines()]
        actions: dict[str, set[str]] = {}
        for r in rows:
            if "kind" not in r:  # poll markers and `left` lines carry no action
                actions.setdefault(r["workload"].rsplit("/", 1)[-1], set()).add(r["action"])
        assert actions["dra-x"] - {"none"} == {"scale-to-zero"}, actions
        [stop] = [r for r in rows if r.get("action") == "scale-to-zero"]
        assert stop["gpus"] == 4  # the workload's own count: its pod's devices
        assert actions["dp"] == {"none"} and "nic" not in actions, actions
        shared_actions = set().union(*(actions.get(n, set()) for n in SHARED))
        assert "shared-claim" in shared_actions and "scale-to-zero" not in shared_actions, actions
        assert '"msg":"poll failed"' not in ctl.log_path.read_text()
        evs = client.CoreV1Api(kube.api_client).list_namespaced_event(ns, field_selector="reason=ReclaimHeld")
        assert any(
            f"shared-claim: gpu claim {ns}/shared-gpu is also used by pod" in e.message for e in evs.items
        )
    finally:
        ctl.stop()
        env.delete_job(ns, "big")

    out = restore(devcluster, "deployment/dra-x", ns)
    assert out.returncode == 0, out.stderr
    [pod] = wait_for(lambda: env.running(ns, "dra-x"), 60, "dra-x restored and running")
    [claim] = env.claims_of(pod)
    assert claim["metadata"]["name"] != old_claim
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 4 and {r["pool"] for r in results} == {pod["spec"]["nodeName"]}
    assert [c["uid"] for c in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
