"""The reconcile loop: one poll every `pollInterval`, in four rooms. Read `poll_once` first.

  observe/  watch caches -> eligible workloads -> one batched signal read (Prometheus, processes
            through a ProcessSource, artifacts, faults). Every replica, so a follower's windows
            stay warm for a failover. State: each workload's memory, the settle skip.
  judge/    evidence -> verdict -> plan, pure. State: the settled-plan memo.
  act/      the leader's writes: verdict annotations and Events, stops through the actuator table
            (GitOps pre-flight, revert mark), eviction, escalation, the revert guard's sweep, the
            replica ledger. State: the revert guard's sightings.
  books/    the leader's books: decision log, ghost and owner-kind gauges, GPU-hours, the Kueue
            nudge; after the poll (app.py), GPUs by flavor and the Kueue reservation.

A room imports the floor (inventory, kube, ledger, metrics, poll) and the rooms before it, never
one after it. The replica ledger's copy (ledger.LedgerBook) is loaded here once per poll: the act
room writes it, observe and books read it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ghostgpu.actuators import table_from
from ghostgpu.autonomy import AutonomyConfig
from ghostgpu.config import ControllerConfig
from ghostgpu.controller.act.actor import Actor
from ghostgpu.controller.act.gitops import GitOpsPreflight
from ghostgpu.controller.act.idle import IdleSessions
from ghostgpu.controller.act.stopping import Stopper
from ghostgpu.controller.books.books import Books, accounting_from, outside_kueue_buckets, untracked_of
from ghostgpu.controller.books.decisions import DecisionLog
from ghostgpu.controller.inventory import WorkloadRef
from ghostgpu.controller.judge.judge import Judge
from ghostgpu.controller.kube import Cluster
from ghostgpu.controller.ledger import LedgerBook, ReplicaLedger
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.observe.evidence import WorkloadState
from ghostgpu.controller.observe.observer import Observer
from ghostgpu.controller.poll import Judged, PollResult, Snapshot
from ghostgpu.signals.artifacts import FileArtifactProbe, S3ArtifactProbe
from ghostgpu.signals.processes import ProcessSource
from ghostgpu.signals.utilization import UtilizationSource

log = logging.getLogger("ghostgpu.controller")


class Reconciler:
    def __init__(
        self,
        cfg: ControllerConfig,
        *,
        cluster: Cluster,
        utilization: UtilizationSource,
        processes: ProcessSource,
        files: FileArtifactProbe,
        s3: S3ArtifactProbe | None,
        metrics: ControllerMetrics,
        decision_log: DecisionLog,
        is_leader: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
        autonomy: AutonomyConfig | None = None,
        escalate: Callable[..., Any] | None = None,
        nudge_nodes: bool | None = None,  # None: controller.kueueNudge
        ledger: ReplicaLedger | None = None,
        gitops: GitOpsPreflight | None = None,
    ) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.metrics = metrics
        self.is_leader = is_leader
        self.clock = clock
        leading = lambda: self.is_leader()  # noqa: E731 -- one switch for every room
        self.records = LedgerBook(ledger)  # where replica counts go when annotations cannot
        self.actuators = table_from(cfg.actuators)
        self.observer = Observer(
            cfg, utilization=utilization, processes=processes, files=files, s3=s3, metrics=metrics,
            records=self.records,
        )  # fmt: skip
        self.judge = Judge(cfg, autonomy or cfg.autonomy)
        stops = Stopper(
            cluster=cluster, metrics=metrics, actuators=self.actuators, records=self.records,
            states=self.observer.states, is_leader=leading, gitops=gitops,
        )  # fmt: skip
        self.actor = Actor(
            window=cfg.window, cluster=cluster, metrics=metrics, stops=stops, is_leader=leading,
            clock=clock, settle=self.observer.stopped, escalate=escalate,
        )  # fmt: skip
        self.actor.idle = IdleSessions(
            cfg,
            actor=self.actor,
            prometheus=getattr(utilization, "client", None),
            metrics=metrics,
            clock=clock,
        )
        self.books = Books(
            cfg, cluster=cluster, metrics=metrics, decision_log=decision_log, actuators=self.actuators,
            records=self.records, nudge_nodes=cfg.kueue_nudge if nudge_nodes is None else nudge_nodes,
            states=self.observer.states,
        )  # fmt: skip
        self.poll_count = 0
        self.last_poll_end: float | None = None

    @property
    def states(self) -> dict[WorkloadRef, WorkloadState]:
        return self.observer.states

    @property
    def last_progress(self) -> float | None:
        """Moves with every workload the act room applied (/healthz: slow, not stuck)."""
        return self.actor.last_progress

    async def poll_once(self, snap: Snapshot) -> PollResult:
        now = self.clock()
        t0 = time.monotonic()
        result = PollResult(started=now)
        self.poll_count += 1
        await self.records.load()
        seen = await self.observer.observe(snap, now, result)
        leader = self.is_leader()
        if leader:
            await self.actor.stops.guard_reverts(snap)  # before any action of this poll
        rulings = self.judge.judge(seen, snap, result, leader=leader)
        if leader:
            await self.actor.act(result, rulings)
            await self.books.keep(snap, result, rulings.rows, poll=self.poll_count)
            await self.records.prune(self.cluster, snap.workloads, now)
        else:
            # Only the leader keeps the books: a replica that lost the lease must not go on
            # exporting its last owner kinds and ghost GPUs beside the new leader's (the panels
            # take `max by`; a sum over the replicas would count them twice).
            self.metrics.set_owner_kinds(())
            self.metrics.set_ghosts({})
        result.duration = time.monotonic() - t0
        self.metrics.poll_duration.observe(result.duration)
        self.metrics.set_workload_states(result.states)
        self.last_poll_end = self.clock()
        log.info(
            "poll",
            extra={
                "poll": self.poll_count,
                "leader": leader,
                "durationS": round(result.duration, 3),
                "states": dict(result.states),
                "actions": [f"{r}:{a}" for r, a in result.actions],
            },
        )
        return result


__all__ = [
    "Judged",
    "PollResult",
    "Reconciler",
    "Snapshot",
    "accounting_from",
    "outside_kueue_buckets",
    "untracked_of",
]
