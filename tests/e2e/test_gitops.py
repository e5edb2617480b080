"""GitOps pre-flight and revert guard, end to end on the devcluster: a GPU Deployment synced by an
Argo CD Application (the real v3.5.1 CRD) or a Flux Kustomization (the real kustomize-controller
v1.9.4 CRD); no Argo CD or Flux controller runs, so their effect is made the way they make it.

- An Application with automated sync + selfHeal and no ignoreDifferences: escalated once with the
  fix, 0 stop writes. With the fix: reclaimed.
- Self-heal's revert (the Git manifest server-side applied again by field manager
  `argocd-controller`): exactly one ReclaimReverted naming it, 0 further reclaims over 5 windows
  although the workload is judged reclaimable again; after a spec change it is reclaimed again.
- The same pre-flight for a Flux Kustomization.
- A tracking id whose Application this cluster does not have (a hub Argo CD's): escalated once, 0
  stop writes, under the default `gitops.orphanMarkers: escalate`; reclaimed under `stale`.
- Faults during the action: the Application unreadable (real 403; a real hanging apiserver
  connection), a 409 on the record write (a real concurrent write), the object deleted
  mid-action: 0 false reclaims, 0 lost records.

Wiring as in test_faults.py: the controller's Informers, Reconciler and Cluster driven poll by poll.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client
from proctables import FINISHED

# The fixture `noexec_kubeconfig`: a user that may read pods and nothing else (no applications).
from test_faults import noexec_kubeconfig  # noqa: F401

from ghostgpu.config import ControllerConfig
from ghostgpu.controller.act.gitops import ApiReader, GitOpsPreflight
from ghostgpu.controller.act.revert_guard import MARK
from ghostgpu.controller.app import Informers
from ghostgpu.controller.books.decisions import DecisionLog
from ghostgpu.controller.inventory import WorkloadRef, gpu_predicate, owner_workload
from ghostgpu.controller.kube import Cluster
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.reconciler import PollResult, Reconciler, Snapshot
from ghostgpu.devcluster import DevCluster
from ghostgpu.devcluster.nodes import GpuNodeSpec, Taint, node_manifest
from ghostgpu.signals.artifacts import FileArtifactProbe
from ghostgpu.signals.podexec import KubeExec
from ghostgpu.signals.processes import ExecProcessSource
from ghostgpu.signals.prometheus import PrometheusClient
from ghostgpu.signals.utilization import QuerySpec, UtilizationSource

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

NODE_LABEL = "ghostgpu-gitops-node"
WINDOW = 3
RECORD = "ghostgpu.io/reclaimed-from-replicas"
ARGOCD_NS = "argocd"
FLUX_NS = "flux-system"
GIT = "argocd-controller"  # the field manager Argo CD applies with (server-side apply)


def manifest(
    name: str,
    ns: str,
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    env: str = "1",
    replicas: int = 1,
) -> dict[str, Any]:
    """The GPU Deployment as Git has it."""
    pod_labels = {"app": name, "ghostgpu.io/tracked": "true"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {**pod_labels, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "nodeSelector": {NODE_LABEL: "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "trainer:latest",
                            "env": [{"name": "RUN", "value": env}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def application(name: str, ns: str, *, fixed: bool) -> dict[str, Any]:
    sync: dict[str, Any] = {
        "automated": {"prune": True, "selfHeal": True},
        "syncOptions": ["ServerSideApply=true"],
    }
    spec: dict[str, Any] = {
        "project": "default",
        "source": {
            "repoURL": "https://git.example.invalid/gpu.git",
            "targetRevision": "main",
            "path": "train",
        },
        "destination": {"server": "https://kubernetes.default.svc", "namespace": ns},
        "syncPolicy": sync,
    }
    if fixed:  # what the ReclaimEscalated Event proposes, and docs/argocd.md shows
        sync["syncOptions"].append("RespectIgnoreDifferences=true")
        spec["ignoreDifferences"] = [
            {"group": "apps", "kind": "Deployment", "jsonPointers": ["/spec/replicas"]}
        ]
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": ARGOCD_NS},
        "spec": spec,
    }


def kustomization(name: str, *, ignore: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "interval": "1m",
        "path": "./train",
        "prune": True,
        "sourceRef": {"kind": "GitRepository", "name": "gpu"},
    }
    if ignore is not None:
        spec["ignore"] = ignore
    return {
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1",
        "kind": "Kustomization",
        "metadata": {"name": name, "namespace": FLUX_NS},
        "spec": spec,
    }


class Rig:
    """One namespace, the controller's objects driven poll by poll, outcomes tallied."""

    def __init__(self, dc: DevCluster, ns: str, tmp: Path) -> None:
        self.dc, self.ns, self.tmp = dc, ns, tmp
        self.apps = client.AppsV1Api(dc.kube.api_client)
        self.core = client.CoreV1Api(dc.kube.api_client)
        self.outcomes: Counter[str] = Counter()
        self.known: set[str] = set()

    async def start(
        self,
        *,
        reader_kubeconfig: Path | None = None,
        cluster_factory: Callable[..., Cluster] = Cluster,
        preflight_timeout: float = 5.0,
        controller: dict[str, Any] | None = None,
    ) -> None:
        import kr8s.asyncio

        api = await kr8s.asyncio.api(kubeconfig=str(self.dc.kubeconfig))
        reader_api = api
        if reader_kubeconfig is not None:  # kr8s asks the apiserver for its version here: bounded
            reader_api = await asyncio.wait_for(kr8s.asyncio.api(kubeconfig=str(reader_kubeconfig)), 30)
        self.informers = Informers(api, gpu_predicate(["nvidia.com/gpu"]))
        self.tasks = [asyncio.create_task(r.run()) for r in self.informers.all]
        await asyncio.wait_for(self.informers.wait_synced(), 60)
        cfg = ControllerConfig.model_validate(
            {
                "mode": "enforce",
                "window": WINDOW,
                "longWindow": 6,
                "startupGrace": "1s",
                "staleAfter": "30s",
                **(controller or {}),
            }
        )
        self.prom = PrometheusClient(self.dc.state.prometheus_url, timeout=5.0)
        executor = KubeExec(api)
        self.cluster = cluster_factory(api, instance="gitops-e2e")
        self.metrics = ControllerMetrics()
        self.rec = Reconciler(
            cfg,
            cluster=self.cluster,
            utilization=UtilizationSource(
                self.prom, QuerySpec.from_preset(cfg.metrics.active, max_sample_age=30.0)
            ),
            processes=ExecProcessSource(executor, concurrency=4, timeout=5.0),
            files=FileArtifactProbe(executor, timeout=5.0),
            s3=None,
            metrics=self.metrics,
            decision_log=DecisionLog(self.tmp / "decisions.jsonl"),
            # As app.py builds it: the configuration says what a marker without its manager means.
            gitops=GitOpsPreflight(
                ApiReader(reader_api),
                cache_seconds=0,
                timeout=preflight_timeout,
                orphan_markers=cfg.gitops.orphan_markers,
            ),
        )

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.prom.aclose()
        for pod in self.known:
            await asyncio.to_thread(self.dc.process_tables.clear, self.ns, pod)
            await asyncio.to_thread(self.dc.dcgm.remove, self.ns, pod)

    def running(self) -> dict[str, str]:
        out = {}
        for entry in self.informers.pods.store.values():
            p = entry.view
            ref = owner_workload(p)
            if p.namespace == self.ns and p.running and ref is not None:
                out[p.name] = ref.name
        return out

    async def ghosts_running(self, want: dict[str, int], timeout: float = 180) -> None:
        """Wait until each Deployment of `want` runs that many pods; every pod is a finished job
        holding its GPU. Pods of other Deployments are not waited for: a Deployment the fault
        deleted leaves its pod to the garbage collector, which on a loaded machine takes minutes."""
        deadline = time.monotonic() + timeout
        while True:
            pods = {p: w for p, w in self.running().items() if w in want}
            if Counter(pods.values()) == Counter({k: v for k, v in want.items() if v}):
                break
            assert time.monotonic() < deadline, f"pods {pods}, want {want}"
            await asyncio.sleep(0.5)
        for pod in set(pods) - self.known:
            await asyncio.to_thread(self.dc.process_tables.set, self.ns, pod, FINISHED)
            await asyncio.to_thread(self.dc.dcgm.set, self.ns, pod, util=0.0)
        self.known |= set(pods)
        await asyncio.sleep(2.5)  # Prometheus scrapes the series (every 1 s), grace passes

    def snapshot(self) -> Snapshot:
        snap = self.informers.snapshot([])
        return Snapshot(
            namespaces={self.ns: snap.namespaces.get(self.ns, {})},
            workloads={r: w for r, w in snap.workloads.items() if r.namespace == self.ns},
            pods=[p for p in snap.pods if p.namespace == self.ns],
            nodes=snap.nodes,
        )

    async def poll(self) -> PollResult:
        result = await self.rec.poll_once(self.snapshot())
        for ref, outcome in result.actions:
            self.outcomes[f"{ref.name}:{outcome}"] += 1
        await asyncio.sleep(0.3)
        return result

    async def poll_until(self, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while self.outcomes[what] == 0:
            assert time.monotonic() < deadline, f"no {what} in {timeout:.0f}s: {dict(self.outcomes)}"
            await self.poll()

    def deployment(self, name: str) -> Any:
        return self.apps.read_namespaced_deployment(name, self.ns)

    def events(self, name: str, reason: str) -> list[Any]:
        items = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        return [e for e in items if e.reason == reason]

    def replicas_writers(self, name: str) -> set[str]:
        return {
            m.manager
            for m in self.deployment(name).metadata.managed_fields or []
            if "f:replicas" in ((m.fields_v1 or {}).get("f:spec") or {})
        }

    def check_records(self, truth: dict[str, int]) -> None:
        """0 lost records: a Deployment at 0 replicas records what it had."""
        for name, replicas in truth.items():
            try:
                d = self.deployment(name)
            except client.ApiException as exc:
                assert exc.status == 404, exc
                continue
            if d.spec.replicas == 0:
                assert (d.metadata.annotations or {}).get(RECORD) == str(replicas), (
                    name,
                    d.metadata.annotations,
                )


@pytest.fixture
def gitops_ns(devcluster: DevCluster, make_namespace: Callable[..., str]) -> Iterator[str]:
    if "prometheus" not in devcluster.state.addons:
        pytest.skip("needs the devcluster's Prometheus and fake dcgm-exporter")
    kube = devcluster.kube
    spec = GpuNodeSpec(
        name="gitops-gpu-0", gpus=16, labels={NODE_LABEL: "true"}, taints=[Taint(key="gitops", value="true")]
    )
    kube.apply(node_manifest(spec))
    for ns in (ARGOCD_NS, FLUX_NS):
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    yield make_namespace({"ghostgpu.io/reclaim": "enabled"}, prefix="gitops")
    kube.delete("v1", "Node", "gitops-gpu-0")


def tracking_id(app: str, ns: str, name: str) -> dict[str, str]:
    return {"argocd.argoproj.io/tracking-id": f"{app}:apps/Deployment:{ns}/{name}"}


async def test_argocd_self_heal_blocks_then_the_fix_reclaims_and_a_revert_is_recorded_once(
    devcluster: DevCluster, gitops_ns: str, tmp_path: Path
) -> None:
    ns, kube = gitops_ns, devcluster.kube
    app = f"gpu-{ns}"
    git = manifest("ghost", ns, annotations=tracking_id(app, ns, "ghost"))
    await asyncio.to_thread(kube.apply, application(app, ns, fixed=False))
    await asyncio.to_thread(kube.apply, git, GIT)
    rig = Rig(devcluster, ns, tmp_path)
    await rig.start()
    try:
        await rig.ghosts_running({"ghost": 1})
        # 1. selfHeal, no ignoreDifferences: escalated, nothing stopped, for 5 windows.
        await rig.poll_until("ghost:gitops-reverts")
        for _ in range(5 * WINDOW):
            await rig.poll()
        d = rig.deployment("ghost")
        assert d.spec.replicas == 1 and RECORD not in (d.metadata.annotations or {})
        assert "ghostgpu-controller" not in rig.replicas_writers("ghost")  # 0 stop writes
        assert rig.outcomes["ghost:scaled-to-zero"] == 0
        escalated = rig.events("ghost", "ReclaimEscalated")
        assert len(escalated) == 1, [e.message for e in escalated]
        assert (
            "ignoreDifferences" in escalated[0].message
            and "RespectIgnoreDifferences=true" in escalated[0].message
        )
        blocked_polls = rig.outcomes["ghost:gitops-reverts"]
        assert blocked_polls >= 5 * WINDOW

        # 2. The Application gets the fix: reclaimed.
        await asyncio.to_thread(kube.apply, application(app, ns, fixed=True))
        await rig.poll_until("ghost:scaled-to-zero", timeout=30)
        d = rig.deployment("ghost")
        assert d.spec.replicas == 0 and d.metadata.annotations[RECORD] == "1"
        await rig.ghosts_running({"ghost": 0})
        for _ in range(2):
            await rig.poll()  # the cache shows it stopped

        # 3. Self-heal's revert: the Git manifest applied again by argocd-controller.
        await asyncio.to_thread(kube.apply, git, GIT)
        deadline = time.monotonic() + 30
        while not rig.events("ghost", "ReclaimReverted"):
            assert time.monotonic() < deadline, dict(rig.outcomes)
            await rig.poll()
        await rig.ghosts_running({"ghost": 1})
        before = rig.outcomes["ghost:scaled-to-zero"]
        for _ in range(5 * WINDOW + 3):
            await rig.poll()
        reverted = rig.events("ghost", "ReclaimReverted")
        assert len(reverted) == 1 and GIT in reverted[0].message, [e.message for e in reverted]
        assert rig.metrics.reclaim_reverts.labels(ns, GIT)._value.get() == 1
        assert rig.outcomes["ghost:scaled-to-zero"] == before == 1, dict(rig.outcomes)
        assert rig.outcomes["ghost:held-by-revert-mark"] >= 1, dict(rig.outcomes)  # judged, and held
        d = rig.deployment("ghost")
        assert d.spec.replicas == 1 and RECORD not in d.metadata.annotations
        assert '"by":"argocd-controller"' in d.metadata.annotations[MARK]

        # 4. A new spec (Git changes the job): judged again, reclaimed again; the mark goes.
        await asyncio.to_thread(
            kube.apply, manifest("ghost", ns, annotations=tracking_id(app, ns, "ghost"), env="2"), GIT
        )
        await asyncio.sleep(1)
        await rig.ghosts_running({"ghost": 1})
        deadline = time.monotonic() + 60
        while rig.outcomes["ghost:scaled-to-zero"] < 2:
            assert time.monotonic() < deadline, dict(rig.outcomes)
            await rig.poll()
        d = rig.deployment("ghost")
        assert (
            d.spec.replicas == 0
            and MARK not in d.metadata.annotations
            and d.metadata.annotations[RECORD] == "1"
        )
        assert len(rig.events("ghost", "ReclaimReverted")) == 1
        print(f"GITOPS-ARGOCD outcomes={dict(sorted(rig.outcomes.items()))}")
    finally:
        await rig.stop()
        await asyncio.to_thread(kube.delete, "argoproj.io/v1alpha1", "Application", app, ARGOCD_NS)


async def test_flux_kustomization_blocks_until_it_ignores_replicas(
    devcluster: DevCluster, gitops_ns: str, tmp_path: Path
) -> None:
    ns, kube = gitops_ns, devcluster.kube
    ks = f"gpu-{ns}"
    labels = {"kustomize.toolkit.fluxcd.io/name": ks, "kustomize.toolkit.fluxcd.io/namespace": FLUX_NS}
    await asyncio.to_thread(kube.apply, kustomization(ks))
    await asyncio.to_thread(kube.apply, manifest("ghost", ns, labels=labels), "kustomize-controller")
    rig = Rig(devcluster, ns, tmp_path)
    await rig.start()
    try:
        await rig.ghosts_running({"ghost": 1})
        await rig.poll_until("ghost:gitops-reverts")
        for _ in range(2 * WINDOW):
            await rig.poll()
        assert rig.deployment("ghost").spec.replicas == 1 and rig.outcomes["ghost:scaled-to-zero"] == 0
        escalated = rig.events("ghost", "ReclaimEscalated")
        assert len(escalated) == 1 and "spec.ignore" in escalated[0].message
        fix = yaml.safe_load(escalated[0].message.split("Kustomization:\n", 1)[1])["spec"]["ignore"]
        # The proposed fix, applied as it is, passes the real CRD's schema and unblocks the stop.
        await asyncio.to_thread(kube.apply, kustomization(ks, ignore=fix))
        await rig.poll_until("ghost:scaled-to-zero", timeout=30)
        assert rig.deployment("ghost").spec.replicas == 0
        print(f"GITOPS-FLUX outcomes={dict(sorted(rig.outcomes.items()))}")
    finally:
        await rig.stop()
        await asyncio.to_thread(kube.delete, "kustomize.toolkit.fluxcd.io/v1", "Kustomization", ks, FLUX_NS)


async def test_a_tracking_id_whose_application_is_absent_escalates_unless_markers_are_stale(
    devcluster: DevCluster, gitops_ns: str, tmp_path: Path
) -> None:
    """A hub Argo CD keeps the Application in the hub: here the workload carries its tracking id and
    the Application CRD is installed, but no Application of that name exists in any namespace."""
    ns, kube = gitops_ns, devcluster.kube
    app = f"hub-{ns}"  # never created in this cluster
    await asyncio.to_thread(kube.apply, manifest("ghost", ns, annotations=tracking_id(app, ns, "ghost")), GIT)
    rig = Rig(devcluster, ns, tmp_path)
    await rig.start()  # gitops.orphanMarkers: the default, escalate
    rigs = [rig]
    try:
        # 1. escalate: held and escalated once, nothing stopped, for 3 windows.
        await rig.ghosts_running({"ghost": 1})
        await rig.poll_until("ghost:gitops-unseen")
        for _ in range(3 * WINDOW):
            await rig.poll()
        d = rig.deployment("ghost")
        assert d.spec.replicas == 1 and RECORD not in (d.metadata.annotations or {})
        assert "ghostgpu-controller" not in rig.replicas_writers("ghost")  # 0 stop writes
        assert rig.outcomes["ghost:scaled-to-zero"] == 0
        assert rig.outcomes["ghost:gitops-unseen"] >= 3 * WINDOW, dict(rig.outcomes)
        escalated = rig.events("ghost", "ReclaimEscalated")
        assert len(escalated) == 1, [e.message for e in escalated]
        message = escalated[0].message
        assert f"this cluster has no Application {ARGOCD_NS}/{app}" in message, message
        assert "controller.gitops.orphanMarkers: stale" in message, message
        # The entry for the hub's Application, merged into one as it is, passes the real CRD.
        fix = yaml.safe_load(message.split("Application where it runs:\n", 1)[1])["spec"]
        hub = application(app, ns, fixed=False)
        hub["spec"]["ignoreDifferences"] = fix["ignoreDifferences"]
        hub["spec"]["syncPolicy"]["syncOptions"] += fix["syncPolicy"]["syncOptions"]
        stored = await asyncio.to_thread(kube.apply, hub, field_manager="hub-fix-test", dry_run=True)
        assert stored.to_dict()["spec"]["ignoreDifferences"] == fix["ignoreDifferences"]
        print(f"GITOPS-UNSEEN escalate={dict(sorted(rig.outcomes.items()))}")
        await rig.stop()
        rigs.clear()

        # 2. stale: the same workload, a controller configured with orphanMarkers: stale.
        (tmp_path / "stale").mkdir()
        rig = Rig(devcluster, ns, tmp_path / "stale")
        rigs.append(rig)
        await rig.start(controller={"gitops": {"orphanMarkers": "stale"}})
        await rig.ghosts_running({"ghost": 1})
        await rig.poll_until("ghost:scaled-to-zero")
        d = rig.deployment("ghost")
        assert d.spec.replicas == 0 and d.metadata.annotations[RECORD] == "1"
        assert rig.outcomes["ghost:gitops-unseen"] == 0, dict(rig.outcomes)
        assert len(rig.events("ghost", "ReclaimEscalated")) == 1  # only the first controller's
        print(f"GITOPS-UNSEEN stale={dict(sorted(rig.outcomes.items()))}")
    finally:
        for r in rigs:
            await r.stop()


# --- faults during the action ----------------------------------------------------------------------


class FreezingRelay:
    """A TCP relay to the apiserver that can stop relaying: every request through it then hangs,
    on connections already open and new ones alike (kr8s's client is built while it flows)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                await self.flowing.wait()
                dst.write(data)
                await dst.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            dst.close()

    async def close(self) -> None:
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class FaultyCluster(Cluster):
    """The controller's Cluster, with real faults right before the record write (the first write
    of a stop): a concurrent write to the object (the apiserver answers 409), or its deletion."""

    conflict_next: ClassVar[set[str]] = set()
    delete_next: ClassVar[set[str]] = set()
    admin: ClassVar[Any] = None
    injected: ClassVar[Counter[str]] = Counter()

    async def patch_annotations(self, ref: WorkloadRef, annotations: Any, **kw: Any) -> dict[str, Any]:
        if RECORD in annotations and annotations[RECORD] is not None:
            if ref.name in self.conflict_next:
                self.conflict_next.discard(ref.name)
                body = {"metadata": {"labels": {"touched": uuid.uuid4().hex[:8]}}}
                await asyncio.to_thread(self.admin.patch_namespaced_deployment, ref.name, ref.namespace, body)
                self.injected["conflict"] += 1
            if ref.name in self.delete_next:
                self.delete_next.discard(ref.name)
                await asyncio.to_thread(self.admin.delete_namespaced_deployment, ref.name, ref.namespace)
                self.injected["deleted"] += 1
        return await super().patch_annotations(ref, annotations, **kw)


async def test_faults_during_the_action_never_reclaim_falsely_nor_lose_records(
    devcluster: DevCluster,
    gitops_ns: str,
    noexec_kubeconfig: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    ns, kube = gitops_ns, devcluster.kube
    app = f"gpu-{ns}"
    names = {"tracked-a": True, "tracked-b": True, "conflict": False, "deleted": False}
    truth = dict.fromkeys(names, 1)
    await asyncio.to_thread(kube.apply, application(app, ns, fixed=True))
    for name, tracked in names.items():
        ann = tracking_id(app, ns, name) if tracked else {}
        await asyncio.to_thread(kube.apply, manifest(name, ns, annotations=ann), GIT)

    # Application unreadable, two ways: the reader's identity may not get applications (a real 403),
    # or its apiserver connection stops answering (a TCP relay to the apiserver that freezes).
    admin_kc = yaml.safe_load(devcluster.kubeconfig.read_text())
    upstream = urlsplit(admin_kc["clusters"][0]["cluster"]["server"])
    relay = FreezingRelay(upstream.hostname or "127.0.0.1", upstream.port or 443)
    port = await relay.start()
    admin_kc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    hanging_kc = tmp_path / "hanging.kubeconfig"
    hanging_kc.write_text(yaml.safe_dump(admin_kc))

    FaultyCluster.admin = client.AppsV1Api(kube.api_client)
    FaultyCluster.conflict_next = {"conflict"}
    FaultyCluster.delete_next = {"deleted"}
    rigs = []
    try:
        # Forbidden: the pre-flight reads as the user without applications rights (a real 403).
        rig = Rig(devcluster, ns, tmp_path)
        rigs.append(rig)
        await rig.start(reader_kubeconfig=noexec_kubeconfig, cluster_factory=FaultyCluster)
        await rig.ghosts_running(truth)
        deadline = time.monotonic() + 120
        while not (rig.outcomes["tracked-a:gitops-unknown"] >= 5 and rig.outcomes["conflict:scaled-to-zero"]):
            assert time.monotonic() < deadline, dict(rig.outcomes)
            await rig.poll()
            rig.check_records(truth)
        assert rig.outcomes["tracked-b:gitops-unknown"] >= 5
        assert FaultyCluster.injected == {"conflict": 1, "deleted": 1}, FaultyCluster.injected
        # The injected 409: nothing written, judged again. kube-controller-manager's own status
        # writes to the Deployment are real concurrent writers too and may add a 409 of their own.
        assert rig.outcomes["conflict:conflict"] >= 1
        assert rig.outcomes["deleted:gone"] == 1 and rig.outcomes["deleted:scaled-to-zero"] == 0
        for name in ("tracked-a", "tracked-b"):
            assert rig.deployment(name).spec.replicas == 1, name  # 0 false reclaims
            (escalated,) = rig.events(name, "ReclaimEscalated")  # once, over every blocked poll
            assert "cannot be read" in escalated.message
        first = dict(rig.outcomes)
        await rig.stop()
        rigs.clear()

        # Hanging: the same workloads through a pre-flight whose apiserver connection never answers.
        (tmp_path / "hang").mkdir()
        rig = Rig(devcluster, ns, tmp_path / "hang")
        rigs.append(rig)
        await rig.start(reader_kubeconfig=hanging_kc, preflight_timeout=1.0)
        relay.flowing.clear()  # from now on the pre-flight's requests get no answer
        await rig.ghosts_running({"tracked-a": 1, "tracked-b": 1})  # the first rig's stop cleared them
        deadline = time.monotonic() + 120
        while rig.outcomes["tracked-b:gitops-unknown"] < 3:
            assert time.monotonic() < deadline, dict(rig.outcomes)
            await rig.poll()
        for name in ("tracked-a", "tracked-b"):
            assert rig.deployment(name).spec.replicas == 1, name
            assert rig.outcomes[f"{name}:scaled-to-zero"] == 0
            assert any("timed out" in e.message for e in rig.events(name, "ReclaimEscalated"))
        rig.check_records(truth)
        print(f"GITOPS-FAULTS forbidden={first} hanging={dict(sorted(rig.outcomes.items()))}")
    finally:
        for r in rigs:
            await r.stop()
        await relay.close()
        await asyncio.to_thread(kube.delete, "argoproj.io/v1alpha1", "Application", app, ARGOCD_NS)


def test_the_gpu_workloads_example_validates_and_clears_the_preflight(
    devcluster: DevCluster, gitops_ns: str
) -> None:
    """examples/argocd/gpu-workloads.yaml against the real Application CRD (server-side dry run),
    and the pre-flight on what the apiserver would store."""
    from ghostgpu.controller.act.gitops_rules import (
        ARGOCD_TRACKING_ID,
        ManagerKind,
        ManagerRef,
        Target,
        argocd_preflight,
    )
    from ghostgpu.controller.act.stopspec import SCALE_TO_ZERO

    doc = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "examples/argocd/gpu-workloads.yaml").read_text()
    )
    stored = devcluster.kube.apply(doc, field_manager="gitops-example-test", dry_run=True).to_dict()
    assert stored["spec"]["ignoreDifferences"] == doc["spec"]["ignoreDifferences"]  # nothing pruned
    ref = ManagerRef(ManagerKind.APPLICATION, None, doc["metadata"]["name"], ARGOCD_TRACKING_ID)
    for kind in ("Deployment", "StatefulSet"):
        pre = argocd_preflight(
            stored,
            Target("apps", kind, "team-a", "x"),
            SCALE_TO_ZERO.writes,
            field_manager="ghostgpu-controller",
            ref=ref,
        )
        assert not pre.blocks, pre.reason
