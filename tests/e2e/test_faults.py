"""Fault tolerance, end to end, in both process sources (controller.processSource: exec and
agent): the controller's real reconcile path against the devcluster, with faults injected by real
local servers, and three properties checked on every poll and at the end:

  0 false reclaims       no workload whose truth is not reclaimable (busy, in a batch gap, a held
                         notebook) gets a reclaimable verdict, is acted on, or has a scale request
                         reach the apiserver (the scale webhook witnesses every one);
  0 lost replica counts  every workload at 0 replicas carries `reclaimed-from-replicas` equal to
                         its replicas before, and `ghostgpu restore` brings exactly those back;
  recovery               the same Reconciler object (no restart) reaches every right verdict and
                         reclaims every true ghost once the faults stop.

Wiring: `ghostgpu.controller.app.Informers` (watch caches), `Reconciler`, `Cluster`, and the
signal sources `run_controller` builds (`app.signal_sources` in agent mode; `KubeExec` through
`ExecProcessSource` in exec mode), driven poll by poll so that faults can be set between polls.
Fault sources in both modes: PrometheusFaultProxy (down/reset/slow/5xx/garbage/empty/partial/
stale), a validating webhook that makes the apiserver answer the scale call with 429/500/503
bursts, and a skewed controller clock. Exec mode: RBAC without pods/exec (real 403), FIFO-backed
`ps` tables (real hanging exec), malformed `ps` output. Agent mode: node agents whose series the
agent's own collector renders and the real Prometheus scrapes (ghostgpu.scale.agent_faults):
restarts, rollouts, scrape gaps, stale scans, a twin's series under another pod UID, a container
restarted between scans, node clock skew. The leader-kill case is a second test with two
`ghostgpu controller` processes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from proctables import FINISHED, GAP, LIVE, NOTEBOOK, ZOMBIE

from ghostgpu.agent.scan import ContainerKey
from ghostgpu.config import ControllerConfig
from ghostgpu.controller.app import Informers, signal_sources
from ghostgpu.controller.books.decisions import DecisionLog
from ghostgpu.controller.inventory import gpu_predicate, owner_workload
from ghostgpu.controller.kube import Cluster
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.observe.evidence import policy_from_config
from ghostgpu.controller.reconciler import PollResult, Reconciler, Snapshot
from ghostgpu.devcluster import DevCluster, ProcessTables
from ghostgpu.devcluster.certs import CertAuthority
from ghostgpu.devcluster.kwok_exec import ProcessRow, render_table
from ghostgpu.devcluster.nodes import GpuNodeSpec, Taint, node_manifest
from ghostgpu.devcluster.procs import free_port
from ghostgpu.scale.agent_faults import AGENT_FAULTS, AgentFleet, Container
from ghostgpu.scale.faults import (
    PROM_MODES,
    PrometheusFaultProxy,
    ScaleWebhook,
    garbage_listing,
    hang_table,
    release_fifo,
)
from ghostgpu.signals.artifacts import FileArtifactProbe
from ghostgpu.signals.podexec import ExecResult, KubeExec, PodRef
from ghostgpu.signals.processes import ExecProcessSource, MalformedListing, parse_ps
from ghostgpu.signals.prometheus import PrometheusClient
from ghostgpu.signals.utilization import QuerySpec, UtilizationSource
from ghostgpu.verdict import RECLAIMABLE_KINDS, ProcessCounts, count_roles

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]

NODE_LABEL = "ghostgpu-faults-node"
MIN_FAULTS = 1000  # per mode
EXEC_TIMEOUT = 0.5
PROM_TIMEOUT = 0.5
# Agent mode: after the agents' faults are set, a poll waits for Prometheus's next scrape of them
# (the devcluster scrapes every second).
SCRAPE_SETTLE = 1.05
AGENT_IDLE_REPLICAS = 4
AGENT_SLOTS = 44  # one agent per pod (the agent-mode fleet has 40), so an agent's fault touches one pod


@dataclass(frozen=True)
class Plan:
    """Polls per phase: Prometheus faults, the mode's process faults (both as a follower), then
    everything at once as the leader; reclaimed ghosts restored every `restore_every` polls."""

    prom_polls: int
    process_polls: int
    leader_polls: int
    restore_every: int


PLANS = {
    "exec": Plan(prom_polls=200, process_polls=110, leader_polls=120, restore_every=6),
    "agent": Plan(prom_polls=100, process_polls=70, leader_polls=60, restore_every=6),
}
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Truth:
    replicas: int
    util: float
    table: list[ProcessRow]
    reclaimable: bool


FLEET: dict[str, Truth] = {
    "busy-a": Truth(1, 87.0, LIVE, False),
    "busy-b": Truth(2, 41.0, LIVE, False),
    "busy-c": Truth(1, 12.0, LIVE, False),
    "gap-a": Truth(1, 0.0, GAP, False),  # batch gap: 0 % but live processes - only exec tells
    "gap-b": Truth(2, 0.0, GAP, False),
    "notebook": Truth(1, 0.0, NOTEBOOK, False),  # IDLE_HELD at most: a person decides
    "done-a": Truth(1, 0.0, FINISHED, True),
    "done-b": Truth(2, 0.0, FINISHED, True),
    "done-c": Truth(1, 0.0, FINISHED, True),
    "crashed": Truth(1, 0.0, ZOMBIE, True),
}
NEVER = {n for n, t in FLEET.items() if not t.reclaimable}


def _valid_listing(text: str) -> bool:
    try:
        parse_ps(text)
    except MalformedListing:
        return False
    return True


def deployment(name: str, ns: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name, "ghostgpu.io/tracked": "true"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {NODE_LABEL: "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "trainer:latest",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


class FaultyExec:
    """The controller's exec layer with faults: all calls of a poll through an identity without
    `pods/exec` (real 403), and per-pod table faults set on the files kwok's `ps` shim reads."""

    def __init__(self, admin: KubeExec, noexec: KubeExec) -> None:
        self.admin, self.noexec = admin, noexec
        self.forbidden = False
        self.faulted: dict[tuple[str, str], str] = {}
        self.injected: Counter[str] = Counter()
        self.calls = 0

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        self.calls += 1
        if self.forbidden:
            self.injected["exec-forbidden"] += 1
            return await self.noexec.run(pod, argv, timeout=timeout)
        mode = self.faulted.get((pod.namespace, pod.name))
        if mode:
            self.injected[f"exec-{mode}"] += 1
        return await self.admin.run(pod, argv, timeout=timeout)


@dataclass
class KindStats:
    """One fault kind over the run: how often it was injected, the polls it was armed in, the
    verdicts of the workloads it touched that were UNKNOWN, and their reclaims (true ghosts only)."""

    injected: int = 0
    polls: int = 0
    unknown: int = 0
    reclaims: int = 0


@dataclass
class Ledger:
    violations: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    kinds: dict[str, KindStats] = field(default_factory=dict)
    polls: int = 0
    reclaims: int = 0
    restores: int = 0
    unknown_verdicts: int = 0

    def kind(self, name: str) -> KindStats:
        return self.kinds.setdefault(name, KindStats())


class _LastErrors(logging.Handler):
    """Keeps the controller's last few logged exceptions for assertion messages."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        self.lines = [*self.lines[-4:], f"{record.getMessage()}: {type(exc).__name__}: {exc}"[:300]]


class Harness:
    def __init__(self, cluster: DevCluster, ns: str, tmp: Path, noexec_kubeconfig: Path, mode: str) -> None:
        self.cluster, self.ns, self.tmp, self.mode = cluster, ns, tmp, mode
        self.noexec_kubeconfig = noexec_kubeconfig
        self.tables: ProcessTables = cluster.process_tables
        self.dcgm = cluster.dcgm
        self.ledger = Ledger()
        self.rng = random.Random(20261129)
        self.skew = 0.0
        self.leader = False
        self.known_pods: dict[str, str] = {}  # pod -> deployment
        # Faults armed for the coming poll: per pod (pod -> kind) and for the whole poll.
        self.pod_faults: dict[str, str] = {}
        self.poll_faults: list[str] = []
        self.agents = AgentFleet(AGENT_SLOTS) if mode == "agent" else None
        self.apps = client.AppsV1Api(cluster.kube.api_client)
        self.errors = _LastErrors()
        logging.getLogger("ghostgpu.controller").addHandler(self.errors)

    async def start(self, webhook: ScaleWebhook) -> None:
        import kr8s.asyncio

        self.webhook = webhook
        api = await kr8s.asyncio.api(kubeconfig=str(self.cluster.kubeconfig))
        noexec_api = await kr8s.asyncio.api(kubeconfig=str(self.noexec_kubeconfig))
        self.informers = Informers(api, gpu_predicate(["nvidia.com/gpu"]))
        self.tasks = [asyncio.create_task(r.run()) for r in self.informers.all]
        await asyncio.wait_for(self.informers.wait_synced(), 60)
        self.proxy = PrometheusFaultProxy(
            self.cluster.state.prometheus_url, port=free_port(), slow_seconds=PROM_TIMEOUT * 3
        )
        await self.proxy.start()
        raw: dict[str, Any] = {
            "mode": "enforce", "window": 3, "longWindow": 6, "startupGrace": "1s", "staleAfter": "30s",
            "processSource": self.mode, "prometheus": {"url": self.proxy.url, "timeout": f"{PROM_TIMEOUT}s"},
        }  # fmt: skip
        if self.agents is not None:
            # The agents' targets, scraped as the bundle's ServiceMonitor scrapes the agent: their
            # job and a namespace of their own are the controller's metrics.agentSource.
            port = free_port()
            self.agents.serve(port)
            agent_ns = f"{self.ns}-agents"
            for name, path in self.agents.targets():
                self.cluster.scrape(f"{self.ns}-{name}", port, labels={"namespace": agent_ns}, path=path)
            raw["metrics"] = {
                "scrapeInterval": "1s",
                "agentSource": {"job": "ghostgpu-controller", "namespace": agent_ns},
            }
        cfg = ControllerConfig.model_validate(raw)
        self.policy = policy_from_config(cfg).processes
        self.exec = FaultyExec(KubeExec(api), KubeExec(noexec_api))
        self.prom = PrometheusClient(self.proxy.url, timeout=PROM_TIMEOUT)
        if self.agents is not None:
            # What `ghostgpu controller` builds for processSource: agent (nothing execs).
            sources = signal_sources(cfg, self.prom, self.exec)
            utilization, processes, files = sources.utilization, sources.processes, sources.files
        else:
            spec = QuerySpec.from_preset(cfg.metrics.active, max_sample_age=30.0)
            utilization = UtilizationSource(self.prom, spec)
            processes = ExecProcessSource(self.exec, concurrency=8, timeout=EXEC_TIMEOUT)
            files = FileArtifactProbe(self.exec, timeout=EXEC_TIMEOUT)
        self.rec = Reconciler(
            cfg,
            cluster=Cluster(api, instance="fault-suite"),
            utilization=utilization,
            processes=processes,
            files=files,
            s3=None,
            metrics=ControllerMetrics(),
            decision_log=DecisionLog(self.tmp / "decisions.jsonl"),
            is_leader=lambda: self.leader,
            clock=lambda: time.time() + self.skew,
        )

    async def stop(self) -> None:
        if self.agents is not None:
            for name, _ in self.agents.targets():
                self.cluster.unscrape(f"{self.ns}-{name}")
            self.agents.stop()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.prom.aclose()
        await self.proxy.aclose()

    # --- the fleet's pods: tables and series follow the pods (restores create new ones) ---------

    def _pods(self) -> dict[str, str]:
        out = {}
        self.uids: dict[str, str] = {}
        for entry in self.informers.pods.store.values():
            p = entry.view  # one pod cache: each entry is an inventory.CachedPod
            if p.namespace != self.ns or not p.running:
                continue
            ref = owner_workload(p)
            if ref is not None and ref.name in FLEET:
                out[p.name] = ref.name
                self.uids[p.name] = p.uid
        return out

    def counts(self, name: str) -> ProcessCounts:
        """What the node agent counts in the workload's container: its table, by the verdict's rules."""
        return count_roles(parse_ps(render_table(FLEET[name].table)), self.policy)

    async def sync_pods(self) -> None:
        pods = self._pods()
        for pod, name in sorted(pods.items()):
            if pod not in self.known_pods:
                t = FLEET[name]
                await asyncio.to_thread(self.tables.set, self.ns, pod, t.table)
                await asyncio.to_thread(self.dcgm.set, self.ns, pod, util=t.util)
        for pod in set(self.known_pods) - set(pods):
            await asyncio.to_thread(self.dcgm.remove, self.ns, pod)
        self.known_pods = pods
        if self.agents is not None:
            self.agents.place(
                {
                    pod: Container(ContainerKey(self.ns, pod, self.uids[pod], "main"), self.counts(name))
                    for pod, name in pods.items()
                }
            )

    async def wait_fleet(self, timeout: float = 120) -> None:
        want = {n: self.want(n) for n in FLEET}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            have = Counter(self._pods().values())
            if all(have[n] == r for n, r in want.items() if self.replicas(n) > 0):
                await self.sync_pods()
                return
            await asyncio.sleep(0.5)
        raise AssertionError(f"fleet pods not running: {dict(Counter(self._pods().values()))}")

    def want(self, name: str) -> int:
        """The workload's replicas: in agent mode four times as many of the idle ones, as an
        agent's faults cost a poll nothing and one agent's fault touches one pod."""
        t = FLEET[name]
        return t.replicas * (AGENT_IDLE_REPLICAS if self.agents is not None and t.util == 0 else 1)

    def replicas(self, name: str) -> int:
        wl = self.informers.deployments.store.get((self.ns, name))
        return wl.replicas if wl is not None else -1

    # --- one poll, checked ---------------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        snap = self.informers.snapshot([])
        return Snapshot(
            namespaces={self.ns: snap.namespaces.get(self.ns, {})},
            workloads={r: w for r, w in snap.workloads.items() if r.namespace == self.ns},
            pods=[p for p in snap.pods if p.namespace == self.ns],
            nodes=snap.nodes,
        )

    def _faults_of(self) -> dict[str, set[str]]:
        """workload -> the fault kinds armed on it for this poll."""
        out: dict[str, set[str]] = {n: set(self.poll_faults) for n in FLEET}
        for pod, kind in self.pod_faults.items():
            if pod in self.known_pods:
                out[self.known_pods[pod]].add(kind)
        return out

    async def poll(self) -> PollResult:
        faults = self._faults_of()
        denied_before = self.webhook.state.count("denied")
        result = await self.rec.poll_once(self._snapshot())
        self.ledger.polls += 1
        for kind in set().union(*faults.values()):
            self.ledger.kind(kind).polls += 1
        if self.webhook.state.count("denied") > denied_before:
            self.ledger.kind("apiserver-scale-denied").polls += 1
        for ref, judged in result.judged.items():
            kind = judged.verdict.kind
            self.ledger.unknown_verdicts += kind.value == "UNKNOWN"
            if kind.value == "UNKNOWN":
                for fault in faults.get(ref.name, ()):
                    self.ledger.kind(fault).unknown += 1
            if ref.name in NEVER and kind in RECLAIMABLE_KINDS:
                self.ledger.violations.append(f"poll {self.ledger.polls}: {ref.name} judged {kind.value}")
        for ref, outcome in result.actions:
            if outcome == "scaled-to-zero":
                self.ledger.reclaims += 1
                for fault in faults.get(ref.name, ()):
                    self.ledger.kind(fault).reclaims += 1
                if ref.name in NEVER:
                    self.ledger.violations.append(f"poll {self.ledger.polls}: {ref.name} scaled to zero")
        self.check_counts()
        return result

    def check_counts(self) -> None:
        for name in FLEET:
            wl = self.informers.deployments.store.get((self.ns, name))
            if wl is None:
                self.ledger.violations.append(f"{name} disappeared")
                continue
            if name in NEVER and wl.replicas != self.want(name):
                self.ledger.violations.append(f"{name} has {wl.replicas} replicas, want {self.want(name)}")
            if wl.replicas == 0 and wl.reclaimed_from != self.want(name):
                self.ledger.violations.append(
                    f"{name} at 0 replicas records {wl.reclaimed_from}, had {self.want(name)}: count lost"
                )

    # --- faults ----------------------------------------------------------------------------------

    async def arm_process_faults(self, rate: float, forbid_rate: float) -> None:
        """The mode's process faults for the coming poll (exec: per pod or the whole poll's exec
        forbidden; agent: per agent, started at `rate`, some lasting a few polls)."""
        if self.agents is not None:
            idle = {p for p, n in self.known_pods.items() if FLEET[n].util == 0}
            self.pod_faults, started = self.agents.arm(idle, rate, self.known_pods)
            for kind in started.values():
                self.ledger.faults[kind] += 1
            await asyncio.sleep(SCRAPE_SETTLE)  # Prometheus scrapes the agents as they are now
            return
        await self.arm_exec_faults(rate, forbid_rate)

    async def disarm_process_faults(self) -> None:
        if self.agents is None:
            await self.disarm_exec_faults()

    async def arm_exec_faults(self, rate: float, forbid_rate: float) -> None:
        self.exec.faulted.clear()
        self.exec.forbidden = self.rng.random() < forbid_rate
        self.poll_faults = [k for k in self.poll_faults if k != "exec-forbidden"]
        self.pod_faults = {}
        if self.exec.forbidden:
            self.poll_faults.append("exec-forbidden")
            return
        for pod, name in self.known_pods.items():
            if FLEET[name].util == 0 and self.rng.random() < rate:
                mode = self.rng.choice(["hang", "garbage"])
                path = self.tables.path(self.ns, pod)
                if mode == "hang":
                    await asyncio.to_thread(hang_table, path)
                else:
                    text = garbage_listing(self.rng, _valid_listing)
                    await asyncio.to_thread(path.write_text, text)
                self.exec.faulted[(self.ns, pod)] = mode
                self.pod_faults[pod] = f"exec-{mode}"

    async def disarm_exec_faults(self) -> None:
        for (_, pod), _mode in list(self.exec.faulted.items()):
            name = self.known_pods.get(pod)
            text = render_table(FLEET[name].table) if name else ""
            await asyncio.to_thread(release_fifo, self.tables.path(self.ns, pod), text)
        self.exec.faulted.clear()
        self.exec.forbidden = False
        self.pod_faults = {}
        self.poll_faults = [k for k in self.poll_faults if k != "exec-forbidden"]

    async def set_prometheus_fault(self, mode: str) -> None:
        await self.proxy.set_mode(mode)
        self.poll_faults = [k for k in self.poll_faults if not k.startswith("prometheus-")]
        if mode != "ok":
            self.poll_faults.append(f"prometheus-{mode}")

    def set_skew(self, skew: float) -> None:
        self.skew = skew
        self.poll_faults = [k for k in self.poll_faults if k != "clock-skew"]
        if skew:
            self.poll_faults.append("clock-skew")
            self.ledger.faults["clock-skew"] += 1

    async def restore_reclaimed(self) -> None:
        """Every reclaimed ghost goes back through `ghostgpu restore`: proves the count was kept and
        puts the ghost back into play for more faults."""
        from ghostgpu.controller.ops import restore

        for name, truth in FLEET.items():
            if not (truth.reclaimable and self.replicas(name) == 0):
                continue
            # A person restores a reclaimed workload after its pods are gone; restoring while the
            # old pods still run keeps them, and the controller then waits for those pods to go
            # before it judges the workload again (reported to the controller's owner).
            gone_by = time.monotonic() + 60
            while name in set(self._pods().values()) and time.monotonic() < gone_by:
                await asyncio.sleep(0.3)
            for _attempt in range(20):  # the scale webhook may deny the restore's scale call too
                try:
                    restored = await restore(
                        f"deployment/{name}", self.ns, kubeconfig=str(self.cluster.kubeconfig)
                    )
                except Exception as exc:  # a denied scale: the count must still be there
                    fresh = await asyncio.to_thread(self.apps.read_namespaced_deployment, name, self.ns)
                    ann = fresh.metadata.annotations or {}
                    if fresh.spec.replicas == 0 and ann.get("ghostgpu.io/reclaimed-from-replicas") != str(
                        self.want(name)
                    ):
                        self.ledger.violations.append(f"restore of {name} lost its count: {exc}")
                        break
                    continue
                assert restored.replicas == self.want(name), f"{name} restored to {restored.replicas}"
                self.ledger.restores += 1
                break
            # the watch cache sees the scale before the next poll is checked
            deadline = time.monotonic() + 30
            while self.replicas(name) != self.want(name) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)

    def tally(self) -> Counter[str]:
        total: Counter[str] = Counter()
        total.update({f"prometheus-{k}": v for k, v in self.proxy.injected.items()})
        total.update(self.exec.injected)
        total["apiserver-scale-denied"] = self.webhook.state.count("denied")
        total.update(self.ledger.faults)  # clock skew; the agents' faults
        return total

    def report(self) -> dict[str, Any]:
        faults = self.tally()
        kinds = {}
        for kind, injected in sorted(faults.items()):
            stats = self.ledger.kind(kind)
            kinds[kind] = {
                "injected": injected,
                "polls": stats.polls,
                "unknown_verdicts": stats.unknown,
                "reclaims": stats.reclaims,
            }
        return {
            "mode": self.mode,
            "faults": kinds,
            "total_faults": sum(faults.values()),
            "polls": self.ledger.polls,
            "reclaims": self.ledger.reclaims,
            "restores": self.ledger.restores,
            "unknown_verdicts": self.ledger.unknown_verdicts,
            "exec_calls": self.exec.calls,
            "scale_requests_seen": len(self.webhook.state.seen),
            "false_reclaims": len(self.ledger.violations),
        }


# --- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture
def fault_ns(devcluster: DevCluster, make_namespace: Callable[..., str]) -> Iterator[str]:
    if "prometheus" not in devcluster.state.addons:
        pytest.skip("needs the devcluster's Prometheus and fake dcgm-exporter")
    kube = devcluster.kube
    kube.apply(
        node_manifest(
            GpuNodeSpec(
                name="faults-gpu-0",
                gpus=64,
                labels={NODE_LABEL: "true"},
                taints=[Taint(key="ghostgpu-faults", value="true")],
            )
        )
    )
    # Opted in only once the fleet runs (`opt_in`), as ghosts are workloads that bypassed Kueue.
    ns = make_namespace({}, prefix="faults")
    yield ns
    kube.delete("v1", "Node", "faults-gpu-0")


@pytest.fixture
def noexec_kubeconfig(devcluster: DevCluster, tmp_path: Path) -> Iterator[Path]:
    """A user that may read pods but not exec into them (RBAC answers 403)."""
    pki = Path(devcluster.state.state_dir) / "pki"
    pair = CertAuthority(pki).issue("faults-noexec", "ghostgpu-faults-noexec", client=True)
    kube = devcluster.kube
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "ghostgpu-faults-noexec"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "ghostgpu-faults-noexec"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role["metadata"]["name"],
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "ghostgpu-faults-noexec"}
        ],
    }
    kube.apply(role)
    kube.apply(binding)
    kc = yaml.safe_load(devcluster.kubeconfig.read_text())
    kc["users"] = [
        {"name": "noexec", "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)}}
    ]
    kc["contexts"][0]["context"]["user"] = "noexec"
    path = tmp_path / "noexec.kubeconfig"
    path.write_text(yaml.safe_dump(kc))
    yield path
    kube.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "ghostgpu-faults-noexec")
    kube.delete("rbac.authorization.k8s.io/v1", "ClusterRole", "ghostgpu-faults-noexec")


def opt_in(devcluster: DevCluster, ns: str) -> None:
    """The opt-in label alone: with the rendered bundles applied (the e2e session does that), a team
    label makes Kyverno generate a LocalQueue `default`, and Kueue's defaulting then puts new pods
    into it and refuses metadata writes to the existing Deployments (test_controller.py covers
    that case); this suite is about faults, not about that."""
    labels = {"ghostgpu.io/reclaim": "enabled"}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
    devcluster.kube.apply(namespace)


def _webhook(devcluster: DevCluster, ns: str) -> Iterator[ScaleWebhook]:
    ca = CertAuthority(Path(devcluster.state.state_dir) / "pki")
    pair = ca.issue("faults-webhook", "faults-webhook", server=True, dns=("localhost",), ips=("127.0.0.1",))
    hook = ScaleWebhook(pair.cert, pair.key, ca.pem, port=free_port(), namespace=ns)
    hook.start()
    name = f"ghostgpu-faults-{ns}"
    devcluster.kube.apply(hook.configuration(name))
    time.sleep(1.0)  # the apiserver's webhook configuration informer
    try:
        yield hook
    finally:
        devcluster.kube.delete("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", name)
        hook.stop()


@pytest.fixture
def scale_webhook(devcluster: DevCluster, fault_ns: str) -> Iterator[ScaleWebhook]:
    yield from _webhook(devcluster, fault_ns)


# --- the suite ------------------------------------------------------------------------------------------


def code_commit() -> str:
    """The commit the suite runs on; `+changes` when the code differs from it (not a result of it)."""
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    diff = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", "ghostgpu", "tests/e2e"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    return head.stdout.strip() + ("+changes" if diff.stdout.strip() else "")


def write_report(path: Path, report: dict[str, Any]) -> None:
    """docs/faults.json: each mode's report under `modes`, and the totals over the modes."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    modes = {**(doc.get("modes") or {}), report["mode"]: report}
    out = {
        "modes": dict(sorted(modes.items())),
        "total_faults": sum(m["total_faults"] for m in modes.values()),
        "false_reclaims": sum(m["false_reclaims"] for m in modes.values()),
    }
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("mode", ["exec", "agent"])
async def test_injected_faults_never_reclaim_live_work_nor_lose_counts(
    devcluster: DevCluster,
    fault_ns: str,
    noexec_kubeconfig: Path,
    scale_webhook: ScaleWebhook,
    tmp_path: Path,
    mode: str,
) -> None:
    ns = fault_ns
    plan = PLANS[mode]
    started = time.monotonic()
    h = Harness(devcluster, ns, tmp_path, noexec_kubeconfig, mode)
    for name in FLEET:
        await asyncio.to_thread(devcluster.kube.apply, deployment(name, ns, h.want(name)))
    await h.start(scale_webhook)
    try:
        await h.wait_fleet()
        await asyncio.to_thread(opt_in, devcluster, ns)
        deadline = time.monotonic() + 30
        while h.informers.namespaces.store.get(("", ns), {}).get("ghostgpu.io/reclaim") != "enabled":
            assert time.monotonic() < deadline, "the namespace's opt-in label never reached the cache"
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.5)  # Prometheus scrapes the new series (every 1 s) and grace passes

        # Phase 1 - Prometheus faults (follower: judged, not acted on). Every poll one mode; a
        # clean poll in between lets windows start again.
        for i in range(plan.prom_polls):
            await h.set_prometheus_fault(PROM_MODES[i % len(PROM_MODES)] if i % 4 else "ok")
            await h.poll()
        await h.set_prometheus_fault("ok")

        # Phase 2 - the mode's process faults (follower). Exec: forbidden (real RBAC 403), hanging,
        # malformed output. Agent: the agents' faults (ghostgpu.scale.agent_faults).
        for _ in range(3):  # fill the windows first
            await h.poll()
        for _ in range(plan.process_polls):
            await h.arm_process_faults(rate=0.9 if mode == "agent" else 0.7, forbid_rate=0.3)
            await h.poll()
            await h.disarm_process_faults()

        # Phase 3 - everything at once, as the leader, acting: apiserver 429/500/503 bursts on the
        # scale call, clock skew, Prometheus and process faults; reclaimed ghosts are restored.
        h.leader = True
        scale_webhook.state.deny_probability = 0.6
        for i in range(plan.leader_polls):
            await h.set_prometheus_fault(h.rng.choice(PROM_MODES) if h.rng.random() < 0.25 else "ok")
            await h.arm_process_faults(rate=0.4 if mode == "agent" else 0.3, forbid_rate=0.1)
            h.set_skew(h.rng.choice([-900.0, -300.0, 90.0, 400.0, 3600.0]) if h.rng.random() < 0.25 else 0.0)
            await h.poll()
            await h.disarm_process_faults()
            if i % plan.restore_every == plan.restore_every - 1:
                await h.restore_reclaimed()
                await h.wait_fleet()

        # Phase 4 - the faults stop; the same Reconciler (never restarted) must converge.
        await h.set_prometheus_fault("ok")
        h.set_skew(0.0)
        if h.agents is not None:
            h.agents.clear()
            h.pod_faults = {}
        scale_webhook.state.deny_probability = 0.0
        await h.restore_reclaimed()
        await h.wait_fleet()
        await asyncio.sleep(2.5)  # the faulted samples leave the agents' window
        converged = False
        # Bounded by time, not polls: on a loaded 2-core machine a reclaim can meet a few
        # resourceVersion conflicts (the restored pods' status updates) before it lands.
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            result = await h.poll()
            verdicts = {r.name: j.verdict.kind.value for r, j in result.judged.items()}
            ghosts_gone = all(h.replicas(n) == 0 for n, t in FLEET.items() if t.reclaimable)
            live_ok = all(verdicts.get(n) in ("ACTIVE", "IDLE_HELD") for n in NEVER)
            if ghosts_gone and live_ok:
                converged = True
                break
            await asyncio.sleep(0.5)
        assert converged, (
            f"no recovery after the faults stopped: verdicts {verdicts}, states {dict(result.states)}, "
            f"replicas { {n: h.replicas(n) for n in FLEET} }, pods {sorted(h.known_pods.values())}, "
            f"violations {h.ledger.violations}, last controller errors {h.errors.lines}"
        )

        # Witness: no scale request ever reached the apiserver for live work.
        assert not (scale_webhook.state.names() & NEVER), scale_webhook.state.seen
        # Every reclaimed ghost is restorable to its count.
        await h.restore_reclaimed()
        for name in FLEET:
            got = await asyncio.to_thread(
                lambda n=name: h.apps.read_namespaced_deployment(n, ns).spec.replicas
            )
            assert got == h.want(name), f"{name}: {got} replicas after restore, want {h.want(name)}"

        report = {**h.report(), "seconds": round(time.monotonic() - started), "commit": code_commit()}
        print(f"FAULT-SUITE {mode} " + json.dumps(report, sort_keys=True))
        out = Path(os.environ.get("GHOSTGPU_FAULT_REPORT") or tmp_path / "fault-report.json")
        write_report(out, report)  # docs/faults.json
        faults = h.tally()
        assert h.ledger.violations == []
        assert report["total_faults"] >= MIN_FAULTS, faults
        # every class of fault was really injected
        process_kinds = AGENT_FAULTS if mode == "agent" else ("exec-forbidden", "exec-hang", "exec-garbage")
        for kind in (*process_kinds, "apiserver-scale-denied", "clock-skew"):
            assert faults[kind] > 0, kind
        assert all(faults[f"prometheus-{m}"] > 0 for m in PROM_MODES), faults
        assert h.ledger.reclaims > 0 and h.ledger.restores > 0
        if mode == "agent":
            assert h.exec.calls == 0, "agent mode execs into no pod"
            # The agents' faults that fail the signal did: each made verdicts UNKNOWN.
            for kind in ("agent-stale-scan", "agent-twin-uid", "agent-container-restarted"):
                assert h.ledger.kind(kind).unknown > 0, (kind, report["faults"][kind])
    finally:
        await h.disarm_process_faults()
        await h.stop()
        for pod in list(h.known_pods):
            await asyncio.to_thread(h.tables.clear, ns, pod)
            await asyncio.to_thread(h.dcgm.remove, ns, pod)


# --- the leader killed mid-action -----------------------------------------------------------------------


def _controller(kubeconfig: Path, config: Path, tmp: Path, name: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "ghostgpu.cli", "controller", "--config", str(config),
        "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1", "--port", "0",
        "--identity", name, "--lease-namespace", "ghostgpu-system", "--lease-duration", "6",
        "--renew-deadline", "4", "--retry-period", "1", "--decision-log", str(tmp / f"{name}.jsonl"),
    ]  # fmt: skip
    log = (tmp / f"{name}.log").open("w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


def _wait(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_leader_killed_mid_scale_acts_once_and_loses_nothing(
    devcluster: DevCluster, fault_ns: str, scale_webhook: ScaleWebhook, tmp_path: Path
) -> None:
    """Two replicas; the leader's scale call is held by the webhook and the leader is SIGKILLed
    while it waits: the annotation is written, the scale never lands. The other replica must take
    over, scale each ghost exactly once, record the right count, and leave live work alone."""
    ns = fault_ns
    fleet = {
        "busy-a": FLEET["busy-a"],
        "gap-b": FLEET["gap-b"],
        "done-b": FLEET["done-b"],
        "done-a": FLEET["done-a"],
    }
    kube = devcluster.kube
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ghostgpu-system"}})
    for name, truth in fleet.items():
        kube.apply(deployment(name, ns, truth.replicas))
    core = client.CoreV1Api(kube.api_client)
    apps = client.AppsV1Api(kube.api_client)

    def running() -> dict[str, str]:
        out = {}
        for p in core.list_namespaced_pod(ns).items:
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp:
                out[p.metadata.name] = p.metadata.labels["app"]
        return out

    _wait(
        lambda: Counter(running().values()) == {n: t.replicas for n, t in fleet.items()}, 120, "fleet running"
    )
    pods = running()
    opt_in(devcluster, ns)
    for pod, name in pods.items():
        devcluster.process_tables.set(ns, pod, fleet[name].table)
        devcluster.dcgm.set(ns, pod, util=fleet[name].util)
    cfg = yaml.safe_load((REPO / "examples" / "ghostgpu.yaml").read_text())
    cfg["controller"]["metrics"]["scrapeInterval"] = "1s"  # the devcluster's Prometheus
    cfg["controller"].update(
        mode="enforce", processSource="exec", pollInterval="1s", window=3, longWindow=6,
        startupGrace="1s", staleAfter="30s",
        prometheus={"url": devcluster.state.prometheus_url, "timeout": "5s"},
    )  # fmt: skip
    config = tmp_path / "ghostgpu.yaml"
    config.write_text(yaml.safe_dump(cfg))
    scale_webhook.state.hold = True  # the first scale request is held until the leader is dead
    lease = client.CoordinationV1Api(kube.api_client)

    def holder() -> str | None:
        try:
            return lease.read_namespaced_lease(
                cfg["controller"].get("leaseName", "ghostgpu-controller"), "ghostgpu-system"
            ).spec.holder_identity
        except client.ApiException:
            return None

    procs = {n: _controller(devcluster.kubeconfig, config, tmp_path, n) for n in ("replica-a", "replica-b")}
    try:
        assert scale_webhook.state.held.wait(120), "no scale request reached the apiserver"
        leader = _wait(holder, 10, "a lease holder")
        procs[leader].send_signal(signal.SIGKILL)  # mid-action: annotation written, scale in flight
        procs[leader].wait(10)
        scale_webhook.state.release.set()  # the held request fails (its client is gone anyway)
        other = next(n for n in procs if n != leader)
        _wait(lambda: holder() == other, 14, f"{other} takes the lease within 2 lease durations")
        ghosts = [n for n, t in fleet.items() if t.reclaimable]
        _wait(
            lambda: all(apps.read_namespaced_deployment(n, ns).spec.replicas == 0 for n in ghosts),
            90,
            "ghosts at 0",
        )
        # Each Reclaimed Event is posted after its scale: wait for them all, then a few more polls
        # for the negatives (nothing is acted on twice, nothing live is touched).
        _wait(
            lambda: all(
                any(e.reason == "Reclaimed" for e in core.list_namespaced_event(
                    ns, field_selector=f"involvedObject.name={n}").items)
                for n in ghosts
            ),
            30,
            "a Reclaimed Event for every ghost",
        )  # fmt: skip
        time.sleep(3)
        for name, truth in fleet.items():
            dep = apps.read_namespaced_deployment(name, ns)
            ann = dep.metadata.annotations or {}
            if truth.reclaimable:
                assert dep.spec.replicas == 0
                assert ann.get("ghostgpu.io/reclaimed-from-replicas") == str(truth.replicas), (name, ann)
            else:
                assert dep.spec.replicas == truth.replicas, name
                assert "ghostgpu.io/reclaimed-from-replicas" not in ann, name
        # Exactly one reclaim per ghost, counted by the controllers' own "Reclaimed" Events (the
        # webhook may see one PATCH more than once: the apiserver re-runs admission when it
        # retries a storage conflict, so its "allowed" count is not a count of actions).
        for name in ghosts:
            events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
            reclaimed = [e for e in events if e.reason == "Reclaimed"]
            assert len(reclaimed) == 1, f"{name} reclaimed {len(reclaimed)} times: {scale_webhook.state.seen}"
        assert scale_webhook.state.count("held") == 1
        assert not (scale_webhook.state.names() & {n for n, t in fleet.items() if not t.reclaimable})
        assert procs[other].poll() is None, "the surviving replica keeps running"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        for pod in pods:
            devcluster.process_tables.clear(ns, pod)
            devcluster.dcgm.remove(ns, pod)
