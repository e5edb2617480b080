"""A smoke test on a kind cluster (docs/kind.md): a node image built here, Kueue and Kyverno running
in the cluster from images built here, the bundles rendered for the cluster applied as Argo CD
would, the controller running from hack/build-image's image, and no image pulled. Then one ghost,
caught and restored with nothing but what the bundles give each piece in the cluster: Kyverno
labels a GPU Deployment that predates its namespace's opt-in, generates the controller's RoleBinding
once the namespace names its team, the controller (its own ServiceAccount, enforce mode) stops it
through its Deployment, and `ghostgpu restore` brings it back.

Skipped, with the reason, where kind cannot run: not root, no Docker engine and no podman, or
hack/testbin's kind binaries not built. The cluster and the ghost are `ghostgpu devcluster demo
--provider kind`'s own steps (`kind_demo.KindDemo`), run in this process so the module's checks can
look at the cluster in between. Everything it creates (the kind cluster and its node container, the
node's /var volume, the `kind` network if it made it, the host's Prometheus and fake dcgm-exporter)
is removed afterwards, and the test checks it."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from ghostgpu.devcluster import kind, realnode
from ghostgpu.devcluster.kind_demo import GHOST, GHOST_NS, KindDemo, result_table

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


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
def kc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindDemo]:
    try:
        engine = kind.preflight()
    except kind.KindError as e:
        pytest.skip(f"kind cannot run here: {e}")
    state = tmp_path_factory.mktemp("kind")
    name = f"ghostgpu-e2e-{uuid.uuid4().hex[:6]}"
    volumes_before = _engine_objects(engine, "volume")
    networks_before = _engine_objects(engine, "network")
    # The node container's kubelet changes the host's kernel tunables; with no real node holding
    # them (another test worker's devcluster), deleting the cluster puts the host's values back.
    ledger = realnode.LEDGER_DIR / "realnode-sysctls.json"
    sysctls_before = None if ledger.exists() else realnode.read_sysctls()
    # What the demo prints, shown (-s) and kept for the ghost test's checks.
    console = Console(width=140, record=True)
    try:
        with KindDemo.started(state, console, name=name) as demo:
            yield demo
    finally:
        assert _ps_names(engine, name) == set(), "the kind node container was left behind"
        assert _engine_objects(engine, "volume") <= volumes_before, "a volume of the kind node was left"
        assert _engine_objects(engine, "network") <= networks_before, "kind's network was left behind"
        assert "cleaned up: the kind cluster" in console.export_text()
        if sysctls_before is not None and not ledger.exists():
            assert realnode.read_sysctls() == sysctls_before, "the host's kernel tunables were left changed"


def test_kueue_kyverno_and_the_controller_run_in_the_cluster_from_local_images(kc: KindDemo) -> None:
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


def test_a_ghost_is_caught_and_restored(kc: KindDemo) -> None:
    """The demo's ghost (`KindDemo.catch_and_restore`), in the order that works in a cluster where
    Kyverno and the controller run with their own RBAC (docs/kind.md): the Deployment first, the
    namespace opted in (Kyverno's mutate-existing labels it tracked), then its team (Kyverno
    generates the LocalQueue `default` and the controller's RoleBinding). With the team at once,
    Kueue's Deployment webhook may refuse Kyverno's label (queue-name defaulted on UPDATE, then
    immutable); created after the team, the Deployment is Kueue's (queue-name `default`), not a
    ghost."""
    run = kc.catch_and_restore()
    # Stopped once, by the controller in the cluster, the replica count kept in its ledger (Kueue
    # refuses metadata writes to the running Deployment), and taken from it by the restore.
    assert run.reclaimed == [(f"Deployment/{GHOST_NS}/{GHOST}", "FINISHED_IDLE")]
    assert run.ledger_stopped == 1
    assert f"restored deployment/{GHOST} in {GHOST_NS} to 1 replicas" in run.restore_output
    assert (run.replicas, run.ledger_restored) == (1, None)
    kc.console.print(result_table(run))
    out = kc.console.export_text(clear=False)
    for typed in (
        f"$ kubectl label namespace {GHOST_NS} ghostgpu.io/reclaim=enabled",
        f"$ kubectl label namespace {GHOST_NS} ghostgpu.io/team=research",
        f"$ ghostgpu restore deployment/{GHOST} -n {GHOST_NS} --kubeconfig",
    ):
        assert typed in out
    assert "stopped, restored" in out
    print(f"ghost on kind, seconds since the test started: {run.marks}")
