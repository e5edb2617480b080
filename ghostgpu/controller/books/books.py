"""The books room's entry points: `Books.keep` once per poll on the leader (the decision log, the
ghost gauge, GPUs outside Kueue by owner kind, reclaimable and recovered GPU-hours, the Kueue
nudge) and `accounting_from` for every replica after the poll (GPUs by flavor and verdict bucket,
what the Kueue reservation reads: reservation.py). Nothing here changes a workload; the nudge
writes one annotation on Nodes.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ghostgpu.actuators import RECLAIMED_FROM_RECORD, ActuatorTable
from ghostgpu.config import ControllerConfig
from ghostgpu.controller import keys
from ghostgpu.controller.books.accounting import FlavorAccount, FlavorSpec, account
from ghostgpu.controller.books.decisions import DecisionLog
from ghostgpu.controller.books.owners import by_owner_kind
from ghostgpu.controller.books.untracked import UNTRACKED_OWNER, untracked_holders
from ghostgpu.controller.inventory import PodView, Workload, WorkloadRef, pods_by_workload
from ghostgpu.controller.judge.judge import Row
from ghostgpu.controller.judge.recorded import recorded, verdict_of
from ghostgpu.controller.kube import Cluster
from ghostgpu.controller.ledger import LedgerBook
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.observe.evidence import WorkloadState
from ghostgpu.controller.poll import RECLAIM_OUTCOMES, RECLAIMABLE_VALUES, Judged, PollResult, Snapshot

log = logging.getLogger("ghostgpu.controller")


class Books:
    def __init__(
        self,
        cfg: ControllerConfig,
        *,
        cluster: Cluster,
        metrics: ControllerMetrics,
        decision_log: DecisionLog,
        actuators: ActuatorTable,
        records: LedgerBook,
        nudge_nodes: bool,
        states: Mapping[WorkloadRef, WorkloadState] | None = None,
    ) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.metrics = metrics
        self.decision_log = decision_log
        self.actuators = actuators
        self.records = records
        self.nudge_nodes = nudge_nodes
        self.states = states if states is not None else {}  # the observe room's memory

    async def keep(self, snap: Snapshot, result: PollResult, rows: Sequence[Row], *, poll: int) -> None:
        """The leader's books for one poll."""
        # Run-length: only changed rows reach the file (decisions.py).
        self.decision_log.record_poll(
            ts=result.started,
            poll=poll,
            mode=self.cfg.mode,
            interval_s=self.cfg.poll_interval.seconds,
            rows=rows,  # type: ignore[arg-type]
        )
        self.accrue(snap, result)
        await self.nudge_kueue(result)

    def accrue(self, snap: Snapshot, result: PollResult) -> None:
        """Ghost GPUs and owner-kind gauges and the GPU-hour counters (leader only, once per poll)."""
        hours = self.cfg.poll_interval.seconds / 3600.0
        flavors_by_node = {
            (n.get("metadata") or {}).get("name", ""): n.get("_flavor", "unknown") for n in snap.nodes
        }
        # Nodes of DRA flavors: each key of a pod's gpu_requests under its own flavor (accounting).
        keyed = {
            (n.get("metadata") or {}).get("name", ""): n["_flavors"] for n in snap.nodes if "_flavors" in n
        }

        def by_flavor(pod: PodView) -> list[tuple[str, float]]:
            node = pod.node_name or ""
            flavor = flavors_by_node.get(node, "unknown")
            by_key = keyed.get(node) if keyed else None
            if by_key is None:
                return [(flavor, sum(pod.gpu_requests.values()))]
            return [(by_key.get(key, flavor), n) for key, n in pod.gpu_requests.items()]

        ghosts: Counter[tuple[str, str, str]] = Counter()
        for ref, j in result.judged.items():
            reclaimable = j.kind in RECLAIMABLE_VALUES
            for pod in j.pods:
                if not keyed:
                    # No node of a DRA flavor (nearly every fleet): by_flavor's one pair, read in
                    # place, without a function call and a list per pod per poll.
                    flavor = flavors_by_node.get(pod.node_name or "", "unknown")
                    gpus = sum(pod.gpu_requests.values())
                    ghosts[(ref.namespace, flavor, j.kind)] += gpus
                    if reclaimable:
                        self.metrics.gpu_hours_reclaimable.labels(ref.namespace, flavor).inc(gpus * hours)
                    continue
                for flavor, gpus in by_flavor(pod):
                    ghosts[(ref.namespace, flavor, j.kind)] += gpus
                    if reclaimable:
                        self.metrics.gpu_hours_reclaimable.labels(ref.namespace, flavor).inc(gpus * hours)
        # GPUs no workload accounts for are held as surely: in the totals, never reclaimable.
        untracked = untracked_of(snap, result)
        pods_of = result.pods_of if result.pods_of is not None else opted_in_pods_of(snap)
        for holder, pods in untracked.items():
            for pod in pods:
                for flavor, gpus in by_flavor(pod):
                    ghosts[(holder.namespace, flavor, UNTRACKED_OWNER)] += gpus
        self.metrics.set_ghosts(ghosts)
        # The same GPUs by top owner kind (`ghostgpu status --by owner`): which kinds need a row.
        self.metrics.set_owner_kinds(by_owner_kind(snap, pods_of, untracked))
        for ref, wl in self.records.marked(snap.workloads):  # only these hold GPUs free
            pods = self.recovered_pods(wl)
            if pods:
                gpus = self.gpus_per_pod(ref, wl) * pods
                self.metrics.gpu_hours_recovered.labels(ref.namespace, "all").inc(gpus * hours)

    def gpus_per_pod(self, ref: WorkloadRef, wl: Workload) -> float:
        """What one of its pods holds: the device-plugin GPUs its template asks for, and the DRA
        devices one of its pods held when last seen running (its template names no GPU)."""
        st = self.states.get(ref)
        return sum(wl.gpus_per_pod.values()) + (st.dra_gpus_per_pod if st is not None else 0.0)

    def recovered_pods(self, wl: Workload) -> int | None:
        """How many pods' GPUs a reclaim of `wl` holds free now (None: not reclaimed, or undone).
        A scale row: its recorded replica count while it is at 0. An annotation or field row (a
        suspended RayCluster, a stopped Notebook or InferenceService, a NIMService at 0): while
        the stop holds, its replica count before the stop (the record's, when the stop wrote the
        replica count itself), else its pod templates' replicas (1 without a count)."""
        reclaimed_from = self.records.reclaimed_from(wl)
        if reclaimed_from is not None:
            return reclaimed_from if wl.replicas == 0 else None
        raw = wl.annotations.get(RECLAIMED_FROM_RECORD)
        a = self.actuators.for_ref(wl.ref)
        if raw is None or a is None or a.stop == "scale" or not a.is_stopped(wl.raw):
            return None
        try:
            record = json.loads(raw)
        except ValueError:
            return None
        before = record.get(a.replicas) if isinstance(record, dict) and a.replicas else None
        return int(before) if isinstance(before, int | float) else wl.replicas

    async def nudge_kueue(self, result: PollResult) -> None:
        """Tell Kueue that GPUs were freed on these nodes.

        Why: Kueue's topology-aware scheduling counts pods outside Kueue against node capacity,
        but (before v0.19.1) retries inadmissible workloads on node changes, not on pod deletions;
        so a Job that did not fit would wait for an unrelated event. A Node annotation change is
        such an event (v0.19.1+ also retries on pod deletions, batched every 10 s: the nudge only
        saves those seconds there). The annotation is informational; failures are only logged.
        """
        if not self.nudge_nodes:
            return
        nodes = sorted(
            {
                p.node_name
                for ref, outcome in result.actions
                if outcome in (*RECLAIM_OUTCOMES, "evict-evicted")
                for p in result.judged[ref].pods
                if p.node_name
            }
        )
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for node in nodes:
            try:
                await self.cluster.annotate_node(node, {keys.CAPACITY_FREED_AT: stamp})
            except Exception as exc:
                log.warning("could not annotate node", extra={"node": node, "error": str(exc)})


def outside_kueue_buckets(
    judged: Mapping[WorkloadRef, Judged],
    workloads: Mapping[WorkloadRef, Workload],
    pods_of: Mapping[WorkloadRef, list[PodView]],
) -> dict[tuple[str, str], str]:
    """(namespace, pod) -> verdict bucket for every pod of a tracked workload."""
    out: dict[tuple[str, str], str] = {}
    # One lookup in each map per workload, and no new empty list as the default of each: this runs
    # over every tracked workload after every poll.
    no_pods: list[PodView] = []
    for ref, wl in workloads.items():
        pods = pods_of.get(ref, no_pods)
        j = judged.get(ref)
        if j is not None:
            bucket = j.kind
        elif wl.exempt:
            bucket = "EXEMPT"
        else:
            kind = verdict_of(recorded(wl, pods))
            bucket = kind.value if kind else "PENDING"
        for pod in pods:
            out[(pod.namespace, pod.name)] = bucket
    return out


def opted_in_pods_of(snap: Snapshot) -> dict[WorkloadRef, list[PodView]]:
    """The pods of each opted-in workload (what the observe room computes once per poll)."""
    opted_in = snap.opted_in()
    workloads = {ref: wl for ref, wl in snap.workloads.items() if ref.namespace in opted_in}
    return pods_by_workload(workloads, snap.pods, snap.top_of)


def untracked_of(snap: Snapshot, result: PollResult) -> dict[WorkloadRef, list[PodView]]:
    """The poll's untracked holders (untracked.py), computed on first use and kept on its result."""
    if result.untracked is None:
        pods_of = result.pods_of if result.pods_of is not None else opted_in_pods_of(snap)
        result.untracked = untracked_holders(snap.pods, snap.namespaces, pods_of, snap.holder_of)
    return result.untracked


def accounting_from(
    flavors: Sequence[FlavorSpec],
    snap: Snapshot,
    cluster_queues: Sequence[Mapping[str, Any]],
    judged: Mapping[WorkloadRef, Judged] | None = None,
    pods_of: Mapping[WorkloadRef, list[PodView]] | None = None,
    untracked: Mapping[WorkloadRef, Sequence[PodView]] | None = None,
) -> list[FlavorAccount]:
    """`pods_of`, `untracked`: the poll's PollResult.pods_of and untracked_of (the same snapshot),
    else computed here."""
    opted_in = snap.opted_in()
    workloads = {ref: wl for ref, wl in snap.workloads.items() if ref.namespace in opted_in}
    if pods_of is None:
        pods_of = opted_in_pods_of(snap)
    buckets = outside_kueue_buckets(judged or {}, workloads, pods_of)
    if untracked is None:
        untracked = untracked_holders(snap.pods, snap.namespaces, pods_of, snap.holder_of)
    for pods in untracked.values():
        for pod in pods:
            buckets[(pod.namespace, pod.name)] = UNTRACKED_OWNER
    return account(flavors, snap.nodes, snap.pods, cluster_queues, buckets, snap.dra_capacity)
