"""`ghostgpu controller`: wires the watch caches, the leader elector, the signal sources, the
reconciler and the health/metrics server together, and runs the poll loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ghostgpu import __version__
from ghostgpu.actuators import ActuatorTable
from ghostgpu.config import ControllerConfig, read_config_file
from ghostgpu.controller import keys
from ghostgpu.controller.act.gitops import ApiReader, GitOpsPreflight
from ghostgpu.controller.books.accounting import FlavorSpec, node_labels_for_books
from ghostgpu.controller.books.decisions import DecisionLog
from ghostgpu.controller.books.leader_decisions import LeaderDecisions
from ghostgpu.controller.books.placeholders import Reservations, reserve
from ghostgpu.controller.budget import BudgetedApi, BudgetedExec, RequestBudget
from ghostgpu.controller.claims import DraCounter, claim_view
from ghostgpu.controller.deviceclass import class_view
from ghostgpu.controller.exported import exported_metrics
from ghostgpu.controller.inventory import (
    GpuPredicate,
    OwnerRef,
    PodView,
    Workload,
    cached_pod,
    dra_gpus_of,
    gpu_predicate,
    workload_from,
)
from ghostgpu.controller.kube import (
    CLUSTERQUEUES,
    DEPLOYMENTS,
    NAMESPACES,
    NODES,
    PODS,
    STATEFULSETS,
    Cluster,
    ResourceType,
)
from ghostgpu.controller.leader import LeaderElector
from ghostgpu.controller.ledger import ReplicaLedger
from ghostgpu.controller.managers import ManagerInformers, owner_of_view
from ghostgpu.controller.reconciler import PollResult, Reconciler, Snapshot, accounting_from, untracked_of
from ghostgpu.controller.reflector import Reflector
from ghostgpu.controller.replica import advertised_address, lease_namespace_of
from ghostgpu.controller.server import HealthServer
from ghostgpu.controller.slices import DraCapacity, slice_view
from ghostgpu.signals.agent import AgentProcessSource, AgentSeries
from ghostgpu.signals.artifacts import FileArtifactProbe, S3ArtifactProbe
from ghostgpu.signals.podexec import KubeExec, NoExec, PodExec
from ghostgpu.signals.processes import ExecProcessSource, ProcessSource
from ghostgpu.signals.prometheus import PrometheusClient
from ghostgpu.signals.utilization import QuerySpec, UtilizationSource

log = logging.getLogger("ghostgpu.controller")
RESOURCEFLAVORS = ResourceType("kueue.x-k8s.io/v1beta2", "resourceflavors", namespaced=False)
RESOURCECLAIMS = ResourceType("resource.k8s.io/v1", "resourceclaims", kind="ResourceClaim")
RESOURCESLICES = ResourceType("resource.k8s.io/v1", "resourceslices", namespaced=False, kind="ResourceSlice")
DEVICECLASSES = ResourceType("resource.k8s.io/v1", "deviceclasses", namespaced=False, kind="DeviceClass")


@dataclass(frozen=True)
class LoadedConfig:
    controller: ControllerConfig
    flavors: list[FlavorSpec] | None  # None: discover from Kueue's ResourceFlavors/ClusterQueues


def load_any_config(path: str | Path | None) -> LoadedConfig:
    """The whole ghostgpu.yaml (flavors known) or the ConfigMap's controller section alone, told
    apart by config.is_whole_file; no file: the defaults."""
    if path is None:
        return LoadedConfig(ControllerConfig(), None)
    read = read_config_file(path)
    if read.whole is None:
        return LoadedConfig(read.controller, None)
    plugin = [f for f in read.whole.flavors if f.resource is not None]
    flavors = [FlavorSpec(f.name, f.resource, dict(f.node_labels)) for f in plugin]
    return LoadedConfig(read.controller, flavors + dra_flavor_specs(read.controller))


def dra_flavor_specs(cfg: ControllerConfig) -> list[FlavorSpec]:
    """The DRA flavors (controller.draFlavors, rendered from flavors[].deviceClass): Kueue's
    ResourceFlavors do not say which device class a flavor's resource stands for."""
    return [FlavorSpec(f.name, f.resource, dict(f.node_labels), f.device_class) for f in cfg.dra_flavors]


def dra_extended_aliases(cfg: ControllerConfig) -> dict[str, str]:
    """Extended resource name -> device class, for the DRA flavors' classes (DRAExtendedResource):
    a pod's request of one is counted as devices of the class (inventory.GpuNames)."""
    return {n: f.device_class for f in cfg.dra_flavors for n in f.extended_resource_names}


async def discover_flavors(cluster: Cluster, is_gpu: GpuPredicate) -> list[FlavorSpec]:
    """GPU flavors as Kueue knows them: ClusterQueue flavor quotas on GPU resources, with the
    ResourceFlavor's nodeLabels."""
    try:
        rfs = {rf["metadata"]["name"]: rf for rf in await cluster.list(RESOURCEFLAVORS)}
        cqs = await cluster.list(CLUSTERQUEUES)
    except Exception as exc:
        log.warning("cannot read Kueue flavors", extra={"error": str(exc)})
        return []
    seen: dict[tuple[str, str], FlavorSpec] = {}
    for cq in cqs:
        for group in (cq.get("spec") or {}).get("resourceGroups") or []:
            for fq in group.get("flavors") or []:
                for r in fq.get("resources") or []:
                    if is_gpu(r.get("name", "")):
                        rf = rfs.get(fq.get("name"), {})
                        labels = (rf.get("spec") or {}).get("nodeLabels") or {}
                        seen[(fq["name"], r["name"])] = FlavorSpec(fq["name"], r["name"], dict(labels))
    return [seen[k] for k in sorted(seen)]


def _slim_node(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {
        "metadata": {"name": meta.get("name"), "labels": dict(meta.get("labels") or {})},
        "status": {"allocatable": dict((obj.get("status") or {}).get("allocatable") or {})},
    }


class Informers:
    """The watch caches the controller reads from."""

    def __init__(
        self,
        api: Any,
        is_gpu: GpuPredicate,
        table: ActuatorTable | None = None,
        gpu_classes: Sequence[str] = (),
    ) -> None:
        tracked = f"{keys.TRACKED_LABEL}=true"
        self.namespaces = Reflector(api, NAMESPACES, transform=keys.namespace_view)
        # Every pod, once: its view, plus the workload for tracked bare pods (inventory.CachedPod).
        self.pods = Reflector(api, PODS, transform=lambda o: cached_pod(o, is_gpu))
        self.nodes = Reflector(api, NODES, transform=_slim_node)
        self.deployments = Reflector(
            api,
            DEPLOYMENTS,
            label_selector=tracked,
            transform=lambda o: workload_from("Deployment", o, is_gpu),
        )
        self.statefulsets = Reflector(
            api,
            STATEFULSETS,
            label_selector=tracked,
            transform=lambda o: workload_from("StatefulSet", o, is_gpu),
        )
        # Owner chains up to each workload's manager (managers.py, actuators.py).
        self.managers = ManagerInformers(api, is_gpu, table or ActuatorTable())
        # Only with DRA flavors (their device classes): the devices allocated to each claim.
        self.claims = Reflector(api, RESOURCECLAIMS, transform=claim_view) if gpu_classes else None
        self.dra = DraCounter(gpu_classes)
        # ... and the DRA flavors' capacity: the devices their classes select in the slices.
        self.slices = Reflector(api, RESOURCESLICES, transform=slice_view) if gpu_classes else None
        self.classes = Reflector(api, DEVICECLASSES, transform=class_view) if gpu_classes else None
        self.capacity = DraCapacity()
        self.all = [
            self.namespaces,
            self.pods,
            self.nodes,
            self.deployments,
            self.statefulsets,
            *self.managers.reflectors,
            *(r for r in (self.claims, self.slices, self.classes) if r is not None),
        ]

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.all)

    async def wait_synced(self) -> None:
        await asyncio.gather(*(r.synced.wait() for r in self.all))

    def snapshot(self, flavors: Sequence[FlavorSpec]) -> Snapshot:
        workloads: dict[Any, Workload] = {}
        for store in (self.deployments.store, self.statefulsets.store):
            for wl in store.values():
                workloads[wl.ref] = wl
        pods = []
        for entry in self.pods.store.values():
            pods.append(entry.view)
            if entry.workload is not None:
                workloads[entry.workload.ref] = entry.workload
        if self.claims is not None:
            pods = self.dra.pods(pods, self.claims.store)
        nodes = []
        for n in self.nodes.store.values():
            nodes.append({**n, **node_labels_for_books(n, flavors)})
        store = self.pods.store

        def pod_owner(ns: str, name: str) -> OwnerRef | None:
            entry = store.get((ns, name))
            v = entry.view if entry is not None else None
            return owner_of_view(v)

        res = self.managers.resolve(workloads, pods, pod_owner)
        capacity = {}
        if self.slices is not None and self.classes is not None:
            classes = {c.name: c for c in self.classes.store.values()}
            capacity = self.capacity(flavors, self.nodes.store.values(), self.slices.store.values(), classes)
        return Snapshot(
            namespaces={name: labels for (_, name), labels in self.namespaces.store.items()},
            workloads=res.workloads,
            pods=pods,
            nodes=nodes,
            top_of=res.top_of,
            holder_of=res.holder_of,
            dra_capacity=capacity,
        )


def loop_healthy(
    now: float, started: float, interval: float, last_poll_end: float | None, last_progress: float | None
) -> tuple[bool, str]:
    """/healthz: the loop ended a poll, or made progress inside one (a write), recently enough."""
    last = max(t for t in (started, last_poll_end, last_progress) if t is not None)
    ok = now - last < 3 * interval + 60
    what = "poll ended" if last == last_poll_end else "progress" if last == last_progress else "start"
    return ok, f"last {what} {now - last:.0f}s ago"


@dataclass(frozen=True)
class SignalSources:
    utilization: UtilizationSource
    processes: ProcessSource
    files: FileArtifactProbe


def signal_sources(cfg: ControllerConfig, prom: PrometheusClient, executor: PodExec) -> SignalSources:
    """The sources controller.processSource asks for. agent: the node agent's series ride in the
    utilization query and nothing execs (the bundle grants no pods/exec); exec: `ps` in each idle
    GPU container through `executor`."""
    agent = cfg.process_source == "agent"
    spec = QuerySpec.from_preset(
        cfg.metrics.active,
        max_sample_age=cfg.stale_after.seconds,
        zero_threshold=cfg.zero_threshold,
        agent_processes=agent,
        dra_devices=bool(cfg.dra_flavors),
        # The last two scrapes, as far back as the store shows them.
        window=2 * cfg.metrics.scrape_interval.seconds + cfg.prometheus.ingest_delay_seconds,
        # A sample scraped while the query runs is as new as the query is slow: not ahead of the clock.
        max_clock_skew=cfg.metrics.max_clock_skew.seconds + cfg.prometheus.timeout.seconds,
        agent_source=cfg.metrics.agent_source,
    )
    if agent:
        series = AgentSeries()
        # The agent's scan may be as old as a utilization sample may (staleAfter), no older.
        ps = AgentProcessSource(series, max_age=cfg.stale_after.seconds)
        # Processes are asked after `window` idle readings in a row: with 2 or more, the pods read
        # idle by the poll before are all whose agent series a poll can need.
        after, limit = cfg.window > 1, cfg.prometheus.max_query_bytes
        util = UtilizationSource(prom, spec, agent=series, agent_after_idle=after, max_query_bytes=limit)
        return SignalSources(util, ps, FileArtifactProbe(NoExec()))
    processes = ExecProcessSource(executor, concurrency=8, timeout=10.0)
    return SignalSources(UtilizationSource(prom, spec), processes, FileArtifactProbe(executor, timeout=10.0))


CONTROLLER_USER_AGENT = f"ghostgpu-controller/{__version__}"

# How much later than it was let go a request may reach the apiserver, as the budget allows for
# (budget.RequestBudget, jitter_s): 2 of 30 tokens at the default 20 qps.
ARRIVAL_JITTER_S = 0.1


async def _kube_api(kubeconfig: str | None) -> Any:
    from ghostgpu.boundary import kube_api

    api = await kube_api(kubeconfig)  # a BoundaryError names what is missing
    _identify(api, CONTROLLER_USER_AGENT)
    return api


def _identify(api: Any, agent: str) -> None:
    """Send our own User-Agent (kr8s sends its bare version number): the apiserver's audit log
    and API Priority and Fairness see the controller by name. Exec connections copy it from
    the session (podexec._endpoint_for)."""
    create = getattr(api, "_create_session", None)
    if create is None:
        return

    async def create_session() -> None:
        await create()
        api._session.headers["User-Agent"] = agent

    api._create_session = create_session
    if getattr(api, "_session", None) is not None:
        api._session.headers["User-Agent"] = agent


async def run_controller(
    loaded: LoadedConfig,
    *,
    kubeconfig: str | None = None,
    identity: str | None = None,
    host: str = "0.0.0.0",
    port: int | None = None,
    decision_log: str | None = "/var/lib/ghostgpu/decisions.jsonl",
    lease_namespace: str | None = None,
    lease_duration: float = 15.0,
    renew_deadline: float = 10.0,
    retry_period: float = 2.0,
    max_polls: int | None = None,
    ready_file: str | None = None,
    kueue_nudge: bool | None = None,
) -> None:
    cfg = loaded.controller
    identity = identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    api = await _kube_api(kubeconfig)
    exported = exported_metrics()
    metrics = exported.controller
    # One budget for every write (through Cluster) and every exec (budget.py); the watches and
    # the leader election use `api` itself.
    budget = RequestBudget(
        cfg.apiserver.qps,
        cfg.apiserver.burst,
        jitter_s=ARRIVAL_JITTER_S,
        metrics=exported.budget,
    )
    cluster = Cluster(BudgetedApi(api, budget), instance=identity)
    dra_flavors = dra_flavor_specs(cfg)
    known = [f.resource for f in loaded.flavors or [] if f.device_class is None]
    is_gpu = gpu_predicate(known, dra_extended_aliases(cfg))
    table = ActuatorTable(cfg.actuators)
    informers = Informers(api, is_gpu, table, sorted({f.key for f in dra_flavors}))
    elector = LeaderElector(
        api,
        namespace=lease_namespace_of(lease_namespace, cfg),
        name=cfg.lease_name,
        identity=identity,
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
        on_change=lambda leading: metrics.leader.set(1 if leading else 0),
    )
    prom = PrometheusClient(cfg.prometheus.url, timeout=cfg.prometheus.timeout.seconds)
    sources = signal_sources(cfg, prom, BudgetedExec(KubeExec(api), budget))
    s3 = S3ArtifactProbe(endpoint_url=cfg.s3.endpoint, region=cfg.s3.region) if _s3_possible() else None
    dlog = DecisionLog(decision_log)
    reconciler = Reconciler(
        cfg,
        cluster=cluster,
        utilization=sources.utilization,
        processes=sources.processes,
        files=sources.files,
        s3=s3,
        metrics=metrics,
        decision_log=dlog,
        is_leader=elector.is_leader,
        escalate=_escalator(cfg),
        nudge_nodes=cfg.kueue_nudge if kueue_nudge is None else kueue_nudge,
        ledger=ReplicaLedger(cluster, cfg.namespace),
        # Read-only: the Argo CD Application / Flux Kustomization or HelmRelease that syncs a
        # workload, before stopping it (gitops.py). Argo CD's control-plane namespace is `argocd`;
        # an Application elsewhere is found by name when it is the only one. A marker whose manager
        # is not in this cluster escalates unless gitops.orphanMarkers says such markers are stale.
        gitops=GitOpsPreflight(
            ApiReader(api), field_manager=cluster.field_manager, orphan_markers=cfg.gitops.orphan_markers
        ),
    )
    reservations = Reservations(
        api, mode=cfg.reservation, local_queue=cfg.reservation_queue, emit_event=cluster.event
    )
    reservation_metrics = exported.reservation
    interval = cfg.poll_interval.seconds
    started = time.time()

    def healthy() -> tuple[bool, str]:
        # A request let through by the budget is progress too: a poll waiting on the budget for
        # its execs or writes is slow, not stuck.
        now = time.time()
        granted = None if budget.last_grant is None else now - (time.monotonic() - budget.last_grant)
        last = max([t for t in (reconciler.last_progress, granted) if t is not None], default=None)
        return loop_healthy(now, started, interval, reconciler.last_poll_end, last)

    def ready() -> tuple[bool, str]:
        return informers.synced, "watch caches synced" if informers.synced else "watch caches syncing"

    # Every replica answers /decisions with the leader's log (books/leader_decisions.py).
    decisions = LeaderDecisions(
        read_own=dlog.read_bytes,
        is_leader=elector.is_leader,
        leader_address=elector.leader_address,
        holder=lambda: elector.holder,
        identity=identity,
    )
    server = HealthServer(
        metrics.registry,
        healthy=healthy,
        ready=ready,
        decisions_answer=decisions,
        host=host,
        port=cfg.port if port is None else port,
    )
    bound = await server.start()
    elector.address = advertised_address(host, bound)
    log.info("controller starting", extra={"identity": identity, "mode": cfg.mode, "port": bound})
    tasks = [asyncio.create_task(r.run(), name=f"watch-{r.rtype.plural}") for r in informers.all]
    tasks.append(asyncio.create_task(elector.run(), name="leader-election"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await informers.wait_synced()
        # The watch caches hold every pod and workload of the cluster (10⁵-10⁶ objects at N =
        # 10,000) and live for the whole run; each full collection traversed all of them (~0.85 s
        # per poll at N = 10,000, docs/scale.md). They are acyclic JSON, freed by reference counting
        # when replaced, so move what exists now (and after each poll) out of the collector's sight.
        gc.collect()
        gc.freeze()
        # A poll creates ~10⁵ short-lived objects at N = 10,000; at the default generation-0
        # threshold (700) that is hundreds of young collections per poll (0.2-0.3 s measured in the
        # bench). Collect young objects less often; per-poll garbage is freed by reference counting.
        gc.set_threshold(50_000, 10, 10)
        if ready_file:
            Path(ready_file).write_text(f"{bound}\n")
        flavors = loaded.flavors
        polls = 0
        while not stop.is_set():
            tick = time.monotonic()
            if loaded.flavors is None and not any(f.device_class is None for f in flavors or []):
                flavors = (await discover_flavors(cluster, is_gpu) + dra_flavors) or None
            snap = informers.snapshot(flavors or [])
            result: PollResult | None = None
            try:
                result = await reconciler.poll_once(snap)
                try:
                    cqs = await cluster.list(CLUSTERQUEUES)
                except Exception:
                    cqs = []  # no Kueue (yet): the gap is still measured against the nodes
                accounts = accounting_from(
                    flavors or [], snap, cqs, result.judged, result.pods_of, untracked_of(snap, result)
                )
                if cfg.reservation != "off":
                    await reserve(
                        reservations, reservation_metrics, flavors or [], snap, cqs, result, accounts,
                        leader=elector.is_leader(),
                    )  # fmt: skip
                metrics.set_accounting(accounts)
            except Exception as exc:  # one bad poll must not end the controller; /healthz tells
                log.exception("poll failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            polls += 1
            # Drop this poll's own structures first (snapshot, verdicts, evidence: ~10⁵ objects at
            # N = 10,000, freed by reference counting), so that the collection traverses only
            # what lives on; then this poll's cyclic garbage goes and the survivors (new cache
            # entries, sample rings) are frozen: see above.
            del snap
            result = None
            gc.collect()
            gc.freeze()
            if max_polls is not None and polls >= max_polls:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, interval - (time.monotonic() - tick)))
    finally:
        await elector.release()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.stop()
        await prom.aclose()
        await budget.aclose()
        log.info("controller stopped", extra={"identity": identity})


def _s3_possible() -> bool:
    # find_spec, not import: boto3 is loaded only when an s3:// annotation is met (artifacts.py)
    return importlib.util.find_spec("boto3") is not None


def _escalator(cfg: ControllerConfig) -> Any:
    from ghostgpu.controller.judge.planner import facts_for
    from ghostgpu.escalation import send_escalation

    settings = cfg.autonomy.escalation

    async def escalate(decision: Any, wl: Workload, pods: Sequence[PodView] = ()) -> None:
        facts = facts_for(wl, None, dra_gpus_of(pods))  # a DRA workload's GPUs: its pods' devices
        result = await send_escalation(decision, facts, settings)
        if not result.ok:
            log.warning("escalation webhook failed", extra={"error": result.error, "workload": str(wl.ref)})

    return escalate
