"""A smoke test on a kind cluster (docs/kind.md): a node image built here, Kueue and Kyverno running
in the cluster from images built here, the bundles rendered for the cluster applied as Argo CD
would, the controller running from hack/build-image's image, and no image pulled. Then one ghost,
caught and restored with nothing but what the bundles give each piece in the cluster: Kyverno
labels a GPU Deployment that predates its namespace's opt-in, generates the controller's RoleBinding
once the namespace names its team, the controller (its own ServiceAccount, enforce mode) stops it
through its Deployment, and `ghostgpu restore` brings it back.

Skipped, with the reason, where kind cannot run: not root, no Docker engine and no podman, or
hack/testbin's kind binaries not built. Everything it creates (the kind cluster and its node
container, the node's /var volume, the `kind` network if it made it, the host's Prometheus and fake
dcgm-exporter) is removed afterwards, and the test checks it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_runs import restore
from polling import eventually

from ghostgpu.devcluster import kind
from ghostgpu.devcluster.demo import controller_config
from ghostgpu.devcluster.fake_dcgm import FakeDcgmClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Kind:
    cluster: kind.KindCluster
    signals: kind.HostSignals

    def kubectl(self, *args: str) -> str:
        return self.cluster.kubectl(*args)

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig


def _engine_objects(engine: str, what: str, *flt: str) -> set[str]:
    r = subprocess.run([engine, what, "ls", "-q", *flt], capture_output=True, text=True, check=False)
    return set(r.stdout.split())


def _ps_names(engine: str, name: str) -> set[str]:
    r = subprocess.run(
        [engine, "ps", "-aq", "--filter", f"label=io.x-k8s.kind.cluster={name}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return set(r.stdout.split())


@pytest.fixture(scope="module")
def kc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    try:
        engine = kind.preflight()
    except kind.KindError as e:
        pytest.skip(f"kind cannot run here: {e}")
    state = tmp_path_factory.mktemp("kind")
    name = f"ghostgpu-e2e-{uuid.uuid4().hex[:6]}"
    volumes_before = _engine_objects(engine, "volume")
    networks_before = _engine_objects(engine, "network")
    signals: kind.HostSignals | None = None
    try:
        cluster = kind.up(state, name=name)
        signals = kind.HostSignals(state, kind.network_gateway(cluster.engine))
        # The bundles as a user renders them for this cluster: examples/ghostgpu.yaml with the
        # Prometheus it has, processes read by exec (no node agent: its series would need
        # Prometheus to scrape pods inside the node), a demo's pace, enforcing.
        cfg = controller_config(state, signals.url, "enforce")
        root = state / "rendered"
        (root / "examples").mkdir(parents=True)
        (root / "examples" / "ghostgpu.yaml").write_text(cfg.read_text())
        r = subprocess.run(
            [sys.executable, "-m", "ghostgpu.cli", "render", "-c", str(cfg), "-o", str(root)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        kind.apply_rendered(cluster, root)
        yield Kind(cluster, signals)
    finally:
        if signals is not None:
            signals.stop()
        kind.down(state, name)
        assert _ps_names(engine, name) == set(), "the kind node container was left behind"
        assert _engine_objects(engine, "volume") <= volumes_before, "a volume of the kind node was left"
        assert _engine_objects(engine, "network") <= networks_before, "kind's network was left behind"


def test_kueue_kyverno_and_the_controller_run_in_the_cluster_from_local_images(kc: Kind) -> None:
    for ns, deploy in (
        ("kueue-system", "kueue-controller-manager"),
        ("kyverno", "kyverno-admission-controller"),
        ("kyverno", "kyverno-background-controller"),
        ("ghostgpu-system", "ghostgpu-controller"),
    ):
        available = kc.kubectl(
            "-n", ns, "get", "deployment", deploy, "-o",
            "jsonpath={.status.conditions[?(@.type=='Available')].status}",
        )  # fmt: skip
        assert available == "True", f"{ns}/{deploy}"
    images = kc.kubectl("get", "pods", "-A", "-o", "jsonpath={.items[*].spec.containers[*].image}").split()
    assert any(i.startswith("localhost/ghostgpu-kind-kueue:") for i in images)
    assert any(i.startswith("localhost/ghostgpu-kind-kyverno:") for i in images)
    # Every image a pod runs was loaded or built here: nothing was pulled but CoreDNS, whose pods
    # kubeadm creates (and which try once) before `up` scales it to zero: no CoreDNS image is built.
    events = json.loads(kc.kubectl("get", "events", "-A", "--field-selector=reason=Pulling", "-o", "json"))
    pulled = [
        f"{e['involvedObject'].get('namespace')}/{e['involvedObject']['name']}" for e in events["items"]
    ]
    assert [p for p in pulled if not p.startswith("kube-system/coredns-")] == []


# The ghost: a notebook whose kernel finished, holding one H100 (the example's flavor) and nothing
# running on it but `sh` waiting on `sleep infinity`.
GHOST_NS, GHOST = "team-kind", "notebook"
H100_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}  # examples/ghostgpu.yaml's h100
TRACKED_PATH = "{.metadata.labels.ghostgpu\\.io/tracked}"
OPT_IN, TEAM = "ghostgpu.io/reclaim=enabled", "ghostgpu.io/team=research"
LEDGER = "ghostgpu-replica-ledger"


def _ghost(image: str) -> dict[str, object]:
    box = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", "python3 -c 'print(\"kernel done\")' && sleep infinity"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    spec = {
        "terminationGracePeriodSeconds": 1,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [box],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": GHOST, "namespace": GHOST_NS, "labels": {"app": GHOST}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": GHOST}},
            "template": {"metadata": {"labels": {"app": GHOST}}, "spec": spec},
        },
    }


def _running_pod(kc: Kind) -> str | None:
    pods = json.loads(kc.kubectl("-n", GHOST_NS, "get", "pods", "-l", f"app={GHOST}", "-o", "json"))["items"]
    running = [
        p["metadata"]["name"]
        for p in pods
        if p["status"].get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
        and all(c.get("ready") for c in p["status"].get("containerStatuses") or [])
    ]
    return running[0] if len(running) == 1 else None


def _jsonpath(kc: Kind, *target: str, path: str) -> str:
    return kc.kubectl(*target, "-o", f"jsonpath={path}")


def test_a_ghost_is_caught_and_restored(kc: Kind) -> None:
    """The order that works in a cluster where Kyverno and the controller run with their own
    RBAC (docs/kind.md): the Deployment first, the namespace opted in (Kyverno's mutate-existing
    labels it tracked), then its team (Kyverno generates the LocalQueue `default` and the
    controller's RoleBinding). With the team at once, Kueue's Deployment webhook may refuse
    Kyverno's label (queue-name defaulted on UPDATE, then immutable); created after the team, the
    Deployment is Kueue's (queue-name `default`), not a ghost."""
    t0 = time.monotonic()
    marks: dict[str, float] = {}

    def mark(what: str) -> None:
        marks[what] = round(time.monotonic() - t0, 1)

    images = kind.node_images()
    kc.cluster.load(Path(images["WORKLOAD_TAR"]))
    node = kc.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}")
    # The node as an H100 node of 8 GPUs: the flavor's label, the extended resource as the
    # device plugin would advertise it (no GPU here: the fake dcgm-exporter is the one double).
    kc.kubectl("label", "node", node, *(f"{k}={v}" for k, v in H100_LABELS.items()), "--overwrite")
    kc.kubectl(
        "patch", "node", node, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"capacity": {"nvidia.com/gpu": "8"}}}),
    )  # fmt: skip
    eventually(
        lambda: _jsonpath(kc, "get", "node", node, path="{.status.allocatable.nvidia\\.com/gpu}") == "8",
        60,
        "the node's 8 GPUs allocatable",
    )
    kc.kubectl("create", "namespace", GHOST_NS)
    kc.cluster.apply([_ghost(images["WORKLOAD_IMAGE"])], "the ghost")
    pod = eventually(lambda: _running_pod(kc), 120, "the ghost's pod running")
    mark("ghost running")
    FakeDcgmClient(kc.signals.dcgm_url).set(GHOST_NS, pod, util=0.0, fb_used_mib=0, node=node)

    # Opted in after its workload was created: Kyverno's mutate-existing (background controller,
    # the release's RBAC plus policies/kyverno-rbac.yaml) labels the Deployment tracked.
    kc.kubectl("label", "namespace", GHOST_NS, OPT_IN)
    eventually(
        lambda: _jsonpath(kc, "-n", GHOST_NS, "get", "deployment", GHOST, path=TRACKED_PATH) == "true",
        120,
        "Kyverno labelling the pre-existing Deployment tracked",
    )
    mark("tracked")
    # Its team: Kyverno generates the controller's RoleBinding (and the LocalQueue `default`).
    kc.kubectl("label", "namespace", GHOST_NS, TEAM)
    eventually(
        lambda: (
            _jsonpath(kc, "-n", GHOST_NS, "get", "rolebinding", "ghostgpu-controller", path="{.roleRef.name}")
            == "ghostgpu-controller-namespaced"
        ),
        60,
        "the controller's RoleBinding generated",
    )
    mark("rolebinding")

    # Caught: the controller (its ServiceAccount, enforce) execs `ps`, sees 0 % and finished
    # processes, and stops it through its owner. Kueue's webhook refuses metadata writes to the
    # running Deployment now that the namespace has a LocalQueue `default`, so the replica count is
    # kept in the controller's ledger (docs/controller.md) and the stop goes through `scale`.
    eventually(
        lambda: _jsonpath(kc, "-n", GHOST_NS, "get", "deployment", GHOST, path="{.spec.replicas}") == "0",
        180,
        "the controller stopping the ghost (replicas 0)",
    )
    mark("stopped")
    entry = json.loads(_jsonpath(kc, "-n", "ghostgpu-system", "get", "configmap", LEDGER, path="{.data}"))[
        f"{GHOST_NS}.deployment.{GHOST}"
    ]
    assert json.loads(entry)["replicas"] == 1
    logs = kc.kubectl(
        "-n", "ghostgpu-system", "logs", "-l", "app.kubernetes.io/name=ghostgpu-controller", "--tail=-1"
    )
    reclaimed = [json.loads(line) for line in logs.splitlines() if '"msg":"reclaimed"' in line]
    assert [(r["workload"], r["verdict"]) for r in reclaimed] == [
        (f"Deployment/{GHOST_NS}/{GHOST}", "FINISHED_IDLE")
    ]

    # Restored as a person would: `ghostgpu restore`. The new pod is Kueue's now (LocalQueue
    # `default`), admitted into the team's ClusterQueue on the h100 flavor.
    out = restore(kc, f"deployment/{GHOST}", GHOST_NS)
    assert out.returncode == 0, out.stderr
    assert f"restored deployment/{GHOST} in {GHOST_NS} to 1 replicas" in out.stdout
    eventually(lambda: _running_pod(kc), 120, "the restored pod running")
    mark("restored")
    ledger = json.loads(
        _jsonpath(kc, "-n", "ghostgpu-system", "get", "configmap", LEDGER, path="{.data}") or "{}"
    )
    assert f"{GHOST_NS}.deployment.{GHOST}" not in ledger
    print(f"ghost on kind, seconds since the test started: {marks}")
