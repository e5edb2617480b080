"""The reconcile loop: watch caches -> one batched signal poll -> verdicts -> guarded actions.

Per poll (every `pollInterval`):
  1. From the watch caches: tracked workloads in opted-in namespaces, their running pods; skip
     exempt ones, those inside the start-up grace period, and those with no running pod (their
     sample window is reset so old zeros never count again).
  2. ONE PromQL query for all their pods; one sample per workload into its ring.
  3. Process listings (exec, bounded concurrency) only for workloads whose window is all zero;
     artifact sizes for workloads whose newest sample is zero; faults from pod status + XIDs.
  4. `verdict.decide()` -> `planner.plan()` -> (leader only) annotations + Event when the verdict
     changes, and the reclaim itself: re-read the object, refuse if it is already at zero or now
     exempt, record `reclaimed-from-replicas` with a resourceVersion precondition (in the replica
     ledger, ledger.py, when an admission webhook refuses that write), then scale.
Followers run steps 1-3 too (their windows stay warm for a failover) but never write.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

from ghostgpu.actuators import RECLAIMED_FROM_RECORD, Actuator, table_from
from ghostgpu.autonomy import AutonomyConfig
from ghostgpu.config import ControllerConfig
from ghostgpu.controller import budget, keys, stops
from ghostgpu.controller.accounting import FlavorAccount, FlavorSpec, account, node_flavor
from ghostgpu.controller.decisions import DecisionLog, DecisionRow
from ghostgpu.controller.evidence import (
    SettledPlan,
    WorkloadState,
    assemble,
    evidence_json,
    evidence_summary,
    policy_from_config,
)
from ghostgpu.controller.gitops import GitOpsPreflight, Preflight
from ghostgpu.controller.inventory import (
    PodView,
    Workload,
    WorkloadRef,
    namespace_opted_in,
    parse_time,
    pods_by_workload,
)
from ghostgpu.controller.kube import AdmissionDenied, Cluster, Conflict, NotFound
from ghostgpu.controller.ledger import LedgerEntry, ReplicaLedger, ledger_key, ref_of_key
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.planner import Plan, plan, silent_first
from ghostgpu.controller.revert_guard import MARK as REVERT_MARK
from ghostgpu.controller.revert_guard import Candidate, RevertGuard
from ghostgpu.controller.stopspec import StopSpec, stop_spec_for
from ghostgpu.signals.artifacts import (
    FileArtifactProbe,
    FileTarget,
    InvalidArtifactURI,
    Measurement,
    S3ArtifactProbe,
    S3Target,
    parse_artifact_uri,
)
from ghostgpu.signals.faults import NO_FAULTS, workload_faults
from ghostgpu.signals.podexec import PodRef
from ghostgpu.signals.processes import ProcessSource, merge_listings
from ghostgpu.signals.utilization import (
    PodKey,
    PodReading,
    UtilizationSource,
    workload_memory,
    workload_sample,
)
from ghostgpu.verdict import (
    RECLAIMABLE_KINDS,
    Evidence,
    FailureReason,
    GpuMemory,
    ProcessInfo,
    SignalFailure,
    Verdict,
    VerdictKind,
    XidEvent,
    decide,
    window_verdict_from_runs,
)

log = logging.getLogger("ghostgpu.controller")

# How long a workload this process scaled to zero waits for the watch cache to show its old pods
# gone before it is judged again (a scale-down reaches the cache within seconds; pods terminate
# within their grace period, 30 s by default).
RECLAIM_SETTLE_SECONDS = 300.0
# Stale replica-ledger entries (workload deleted or re-created) are looked for this often, and at
# most this many are confirmed by a GET per round: a bounded, rare cost next to a poll.
LEDGER_PRUNE_INTERVAL_S = 600.0
LEDGER_PRUNE_BATCH = 50


@dataclass
class Snapshot:
    """What the watch caches hold at the start of a poll."""

    namespaces: Mapping[str, Mapping[str, str]]  # name -> labels
    workloads: Mapping[WorkloadRef, Workload]  # tracked, any namespace
    pods: Sequence[PodView]  # every pod
    nodes: Sequence[Mapping[str, Any]]
    # A pod -> its workload at the top of its owner chain (managers.Resolution.top_of); None:
    # Deployment/StatefulSet/bare Pod only (inventory.owner_workload).
    top_of: Callable[[PodView], WorkloadRef | None] | None = None


@dataclass
class Judged:
    workload: Workload
    pods: list[PodView]
    verdict: Verdict
    # None when the utilization window alone settled the verdict and nothing was written (the
    # evidence is assembled only where it is used: verdict.window_verdict).
    evidence: Evidence | None
    plan: Plan
    # verdict.kind's value, read once: an enum member's .value is a Python-level descriptor call,
    # and the accounting reads it for every pod of every poll.
    kind: str


@dataclass
class PollResult:
    started: float
    duration: float = 0.0
    states: Counter[str] = field(default_factory=Counter)
    judged: dict[WorkloadRef, Judged] = field(default_factory=dict)
    actions: list[tuple[WorkloadRef, str]] = field(default_factory=list)
    accounts: list[FlavorAccount] = field(default_factory=list)
    # The poll's opted-in workloads and their pods, for accounting_from (computed once per poll).
    pods_of: dict[WorkloadRef, list[PodView]] | None = None


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
        # --- GitOps pre-flight and revert guard (gitops.py, revert_guard.py) ---
        # Before a stop: would a GitOps manager put it back (None: no pre-flight)? After one: was it
        # undone by anyone but `ghostgpu restore`? Both take the stop as data (stopspec.StopSpec:
        # the JSON pointers it writes, is_stopped), from `stop_spec` below.
        self.gitops = gitops
        self.revert_guard = RevertGuard(cluster, metrics)
        # What each stop writes and how to tell it holds, from the actuator table (actuators.py):
        # the pre-flight and the revert guard treat a RayCluster's suspend like a Deployment's scale.
        self.stop_spec: Callable[[Workload], StopSpec | None] = self._stop_spec_of
        self.actuators = table_from(cfg.actuators)
        self._stop_specs: dict[str, StopSpec] = {
            a.kind: StopSpec(tuple(a.writes), a.is_stopped) for a in self.actuators.by_kind.values()
        }
        # --- end ---
        self.nudge_nodes = cfg.kueue_nudge if nudge_nodes is None else nudge_nodes
        # Where replica counts go when the workload's annotations cannot be written (ledger.py).
        self.ledger = ledger
        self.ledger_entries: dict[str, LedgerEntry] = {}
        self.ledger_pruned_at: float | None = None
        # Pods of workloads this process scaled to zero: until the watch cache shows them gone, the
        # workload is not judged again (a stale poll would exec into a dying pod and write an UNKNOWN
        # verdict onto a workload at zero ready replicas, which Kueue's webhook then accepts and
        # labels with queue-name).
        # The skip is bounded (RECLAIM_SETTLE_SECONDS): old pods still running after that mean a
        # person restored the workload before the scale-down reached them; it is judged again (the
        # dry-run guard in kube.py still keeps any write from adding queue-name).
        self.reclaimed_pods: dict[WorkloadRef, tuple[frozenset[str], float]] = {}
        self.cfg = cfg
        self.policy = policy_from_config(cfg)
        self.cluster = cluster
        self.utilization = utilization
        self.processes = processes
        self.files = files
        self.s3 = s3
        self.metrics = metrics
        self.decision_log = decision_log
        self.is_leader = is_leader
        self.clock = clock
        self.autonomy = autonomy or cfg.autonomy
        self.escalate = escalate
        self.states: dict[WorkloadRef, WorkloadState] = {}
        self.poll_count = 0
        self.last_poll_end: float | None = None
        # Inside a long poll (the first verdicts of 10,000 workloads: 30,000 requests, a minute or
        # more on a slow apiserver) this moves with every workload applied, so /healthz can tell slow
        # from stuck and the liveness probe does not restart a controller that is making progress.
        self.last_progress: float | None = None

    async def _load_ledger(self) -> None:
        """One read of the replica ledger per poll (a failure keeps the previous copy)."""
        if self.ledger is None:
            return
        try:
            self.ledger_entries = await self.ledger.entries()
        except Exception as exc:
            log.warning("cannot read the replica ledger", extra={"error": f"{type(exc).__name__}: {exc}"})

    async def prune_ledger(self, snap: Snapshot, now: float) -> int:
        """Remove ledger entries whose workload is gone or was re-created (another uid): restore
        refuses those, and they would only grow the ConfigMap read every poll. Leader only, every
        LEDGER_PRUNE_INTERVAL_S. An entry whose workload the cache shows with the same uid is kept
        without a request; any other is removed only after a fresh GET answers 404 or another uid.
        Any doubt (an error, an untracked but existing workload, a key that cannot be read back to
        a workload) keeps the entry: a lost replica count cannot be recovered."""
        if self.ledger is None or not self.ledger_entries:
            return 0
        if self.ledger_pruned_at is not None and now - self.ledger_pruned_at < LEDGER_PRUNE_INTERVAL_S:
            return 0
        self.ledger_pruned_at = now
        stale: dict[str, str] = {}
        checked = 0
        for key, entry in sorted(self.ledger_entries.items()):
            ref = ref_of_key(key)
            wl = snap.workloads.get(ref) if ref is not None else None
            if ref is None or (wl is not None and wl.uid == entry.uid):
                continue
            if checked == LEDGER_PRUNE_BATCH:
                break  # the rest next round
            checked += 1
            try:
                uid = str(((await self.cluster.get(ref)).get("metadata") or {}).get("uid", ""))
            except NotFound:
                stale[key] = entry.uid
                continue
            except Exception as exc:
                log.warning(
                    "cannot check a ledger entry", extra={"workload": str(ref), "error": str(exc)[:300]}
                )
                continue
            if entry.uid and uid != entry.uid:
                stale[key] = entry.uid
        if not stale:
            return 0
        try:
            removed = await self.ledger.remove_stale(stale)
        except Exception as exc:
            log.warning("cannot prune the replica ledger", extra={"error": f"{type(exc).__name__}: {exc}"})
            return 0
        for key in stale:
            self.ledger_entries.pop(key, None)
        log.info("pruned the replica ledger", extra={"removed": removed, "entries": sorted(stale)})
        return removed

    def _reclaim_marked(
        self, workloads: Mapping[WorkloadRef, Workload]
    ) -> Iterator[tuple[WorkloadRef, Workload]]:
        """The workloads a reclaim has marked: a reclaimed-from annotation or record, or a ledger
        entry. Only they can hold GPUs free or be undone; the rest of a large fleet is passed over
        with two lookups each, every poll."""
        in_ledger = {ref_of_key(k) for k in self.ledger_entries}
        everyone = None in in_ledger  # a shortened key names no workload for sure: all of them
        for ref, wl in workloads.items():
            ann = wl.annotations
            if everyone or keys.RECLAIMED_FROM in ann or RECLAIMED_FROM_RECORD in ann or ref in in_ledger:
                yield ref, wl

    def reclaimed_from(self, wl: Workload) -> int | None:
        """`reclaimed-from-replicas` from the workload's annotation, else from the ledger (an entry
        counts only for the object it was written for: same uid)."""
        if wl.reclaimed_from is not None:
            return wl.reclaimed_from
        entry = self.ledger_entries.get(ledger_key(wl.ref)) if self.ledger_entries else None
        return entry.replicas if entry is not None and entry.uid == wl.uid else None

    # --- step 1: what to judge ------------------------------------------------------------------

    def eligible(
        self, snap: Snapshot, now: float, result: PollResult
    ) -> dict[WorkloadRef, tuple[Workload, list[PodView], WorkloadState]]:
        opted_in = {ns for ns, labels in snap.namespaces.items() if namespace_opted_in(labels)}
        workloads = {ref: wl for ref, wl in snap.workloads.items() if ref.namespace in opted_in}
        # New workloads' states first, before this poll's short-lived objects: made in one run
        # they share memory pages with each other, not with garbage, and a start with 50,000
        # workloads leaves ~50 MB less memory behind that Python cannot give back.
        for ref, wl in workloads.items():
            st = self.states.get(ref)
            if st is None or st.uid != wl.uid:
                self.states[ref] = WorkloadState.new(wl.uid, self.cfg)
        if len(self.states) > len(workloads):  # every workload has its state: some have left
            # Namespaces that opted out, deleted workloads: forget them entirely.
            for ref in [r for r in self.states if r not in workloads]:
                del self.states[ref]
                self.reclaimed_pods.pop(ref, None)
        pods_of = result.pods_of = pods_by_workload(workloads, snap.pods, snap.top_of)
        out: dict[WorkloadRef, tuple[Workload, list[PodView], WorkloadState]] = {}
        grace = self.cfg.startup_grace.seconds
        # Sorted by (kind, namespace, name): WorkloadRef is a tuple, compared in C.
        for ref, wl in sorted(workloads.items(), key=itemgetter(0)):
            st = self.states[ref]
            pods = pods_of[ref]
            # One running pod (nearly every workload at scale): its list as is, no copy.
            running = pods if len(pods) == 1 and pods[0].running else [p for p in pods if p.running]
            if wl.exempt:
                result.states["exempt"] += 1
                st.reset_window()
                continue
            if not running:
                stopped = self.reclaimed_from(wl) is not None or RECLAIMED_FROM_RECORD in wl.annotations
                result.states["reclaimed" if stopped else "no-running-pod"] += 1
                st.reset_window()
                continue
            reclaimed = self.reclaimed_pods.get(ref)
            if reclaimed is not None:
                gone, at = reclaimed
                if gone & {p.uid for p in running} and now - at < RECLAIM_SETTLE_SECONDS:
                    result.states["reclaimed"] += 1  # the cache has not seen the scale-down yet
                    st.reset_window()
                    continue
                del self.reclaimed_pods[ref]  # new pods (restored, or scaled up by a person) or settled
            known = st.pod_uids
            if len(running) == 1 and len(known) == 1 and known[0] == running[0].uid:
                pass  # the same one pod as last poll (nearly every workload): no tuple to build
            elif (pod_uids := tuple(sorted(p.uid for p in running))) != known:
                if known:
                    st.reset_window()  # pods were replaced: their history is not this window's
                st.pod_uids = pod_uids  # only on a change: no new object per workload per poll
                st.past_grace = False
            if not st.past_grace:
                starts = [p.started_at.timestamp() for p in running if p.started_at]
                if wl.created_at:
                    starts.append(wl.created_at.timestamp())
                if starts and now - max(starts) < grace:
                    result.states["grace"] += 1
                    st.reset_window()
                    continue
                # A pod's start time never changes: once past, these pods stay past the grace.
                st.past_grace = True
            st.artifact_target = self._artifact_target(wl)
            out[ref] = (wl, running, st)
        return out

    @staticmethod
    def _artifact_target(wl: Workload) -> FileTarget | S3Target | SignalFailure | None:
        uri = wl.annotations.get(keys.ARTIFACTS)
        if not uri:
            return None
        try:
            return parse_artifact_uri(uri)
        except InvalidArtifactURI as exc:
            return SignalFailure(reason=FailureReason.OTHER, detail=f"invalid {keys.ARTIFACTS}: {exc}")

    # --- steps 2-3: signals -----------------------------------------------------------------------

    def _probe_pod(self, pod: PodView) -> PodRef:
        return PodRef(pod.namespace, pod.name, pod.gpu_container or pod.first_container)

    @staticmethod
    def _probe_targets(pods: list[PodView]) -> list[PodRef]:
        return [PodRef(p.namespace, p.name, c) for p in pods for c in p.probe_containers]

    async def _measure(
        self, wl: Workload, pods: list[PodView], st: WorkloadState
    ) -> Measurement | SignalFailure:
        target = st.artifact_target
        if isinstance(target, S3Target):
            if self.s3 is None:
                return SignalFailure(reason=FailureReason.OTHER, detail="no S3 client configured")
            return await self.s3.measure(target)
        assert isinstance(target, FileTarget)
        return await self.files.measure(self._probe_pod(pods[0]), target)

    async def gather(
        self, eligible: Mapping[WorkloadRef, tuple[Workload, list[PodView], WorkloadState]], now: float
    ) -> tuple[dict[WorkloadRef, tuple[ProcessInfo, ...] | SignalFailure | None], dict[PodKey, PodReading]]:
        keys_ = [PodKey(p.namespace, p.name) for _, pods, _ in eligible.values() for p in pods]
        readings = await self.utilization.poll(keys_, now=now)
        failed = self.metrics.signal_failures
        # Processes only once the window is all zero; artifacts from the first zero sample on, so
        # that the window's start has a measurement by the time the window is complete. One pass.
        window, thr = self.cfg.window, self.cfg.zero_threshold
        proc_refs: list[WorkloadRef] = []
        art_refs: list[WorkloadRef] = []
        with_artifacts: list[tuple[WorkloadRef, WorkloadState]] = []
        for r, (_wl, pods, st) in eligible.items():
            if len(pods) == 1:  # one pod: its reading is the workload's (workload_sample of one)
                p = pods[0]
                # Looked up by a plain tuple: a PodKey's hash and equality, without a namedtuple
                # per pod per poll (here and in poll_once).
                u = readings[(p.namespace, p.name)].utilization  # type: ignore[index]
                if isinstance(u, SignalFailure):
                    failed.labels("utilization", u.reason.value).inc()
                st.ring.push(u)
            else:
                pod_readings = [readings[PodKey(p.namespace, p.name)] for p in pods]
                for reading in pod_readings:
                    if isinstance(reading.utilization, SignalFailure):
                        failed.labels("utilization", reading.utilization.reason.value).inc()
                st.ring.push(workload_sample(pod_readings))
            target = st.artifact_target  # None for nearly every workload: no isinstance then
            measured_here = target is not None and isinstance(target, FileTarget | S3Target)
            if measured_here:
                with_artifacts.append((r, st))
            if st.ring.newest_all_zero(1, thr):
                if st.ring.newest_all_zero(window, thr):
                    proc_refs.append(r)
                if measured_here:
                    art_refs.append(r)
        proc_pods = {r: self._probe_targets(eligible[r][1]) for r in proc_refs}
        flat = [p for lst in proc_pods.values() for p in lst]
        listings_task = asyncio.ensure_future(self.processes.list_many(flat))
        measurements = await asyncio.gather(*(self._measure(*eligible[r]) for r in art_refs))
        listings = await listings_task
        processes: dict[WorkloadRef, tuple[ProcessInfo, ...] | SignalFailure | None] = {
            r: None for r in eligible
        }
        no_listing = 0
        for r, lst in proc_pods.items():
            # Raw listings: which processes only hold a container is the verdict policy's call.
            merged = processes[r] = merge_listings([listings[p] for p in lst])
            if isinstance(merged, SignalFailure):
                self.metrics.signal_failures.labels("processes", merged.reason.value).inc()
                no_listing += merged.reason is FailureReason.NO_LISTING
        self.metrics.no_listing.set(no_listing)
        measured = dict(zip(art_refs, measurements, strict=True))
        for r, st in with_artifacts:  # a workload with an artifact target: its measurement, or none
            m = measured.get(r)
            st.artifacts.push(m)
            if isinstance(m, SignalFailure):
                failed.labels("artifacts", m.reason.value).inc()
        return processes, readings

    # --- the poll --------------------------------------------------------------------------------

    async def poll_once(self, snap: Snapshot) -> PollResult:
        now = self.clock()
        t0 = time.monotonic()
        result = PollResult(started=now)
        self.poll_count += 1
        await self._load_ledger()
        eligible = self.eligible(snap, now, result)
        processes, readings = await self.gather(eligible, now)
        leader = self.is_leader()
        if leader:
            await self._guard_reverts(snap)  # revert_guard.py: before any action of this poll
        rows: list[DecisionRow] = []
        zero = self.policy.zero_threshold
        teams = {ns: labels.get(keys.TEAM_LABEL) for ns, labels in snap.namespaces.items()}
        records: list[_Apply] = []  # verdict/annotation writes only, no action
        for ref, (wl, pods, st) in eligible.items():
            if len(pods) == 1:
                xids: Sequence[XidEvent] = readings[(pods[0].namespace, pods[0].name)].xids  # type: ignore[index]
            else:
                xids = [x for p in pods for x in readings[PodKey(p.namespace, p.name)].xids]
            faults = (
                NO_FAULTS  # one pod, no terminations, no XID: nearly every workload on every poll
                if not xids and len(pods) == 1 and pods[0].faults == ()
                else workload_faults([p.faults for p in pods], xids)
            )
            if isinstance(faults, SignalFailure):
                self.metrics.signal_failures.labels("faults", faults.reason.value).inc()
            # Most workloads are plainly busy (or plainly unknown): their utilization window settles
            # the verdict, which is decide()'s own first step (verdict.window_verdict), so their
            # evidence is assembled only if it is written. Those with processes listed (an
            # all-zero window) take the whole of decide().
            evidence: Evidence | None = None
            verdict = (
                window_verdict_from_runs(*st.ring.runs(zero), self.policy) if processes[ref] is None else None
            )
            if verdict is None:
                # GPU memory is read where the processes are: only once the window is all zero
                # (the verdict never looks at it otherwise).
                memory: GpuMemory | SignalFailure | None = None
                if processes[ref] is not None:
                    memory = workload_memory(readings[PodKey(p.namespace, p.name)] for p in pods)
                    if isinstance(memory, SignalFailure):
                        self.metrics.signal_failures.labels("memory", memory.reason.value).inc()
                evidence = assemble(
                    st, window=self.cfg.window, processes=processes[ref], faults=faults, memory=memory
                )
                verdict = decide(evidence, self.policy)
            team = teams.get(ref.namespace)
            memo = st.settled
            if (
                evidence is None
                and memo is not None
                and memo.workload is wl
                and memo.pod is pods[0]
                and memo.verdict is verdict
                and memo.team == team
            ):
                # Settled by the window again, with the same cached objects: the same plan. plan()
                # is pure for a verdict that is not reclaimable (no gate, no clock), and the
                # recorded verdict is read from these very objects.
                p, reasons_changed, kind, gpus = memo.plan, memo.reasons_changed, memo.kind, memo.gpus
            else:
                recorded = _recorded(wl, pods)
                # An owner with no actuator carries no verdict annotation (nothing is written to it):
                # its previous verdict is this process's memory, so its Events follow verdict changes.
                previous = st.last_verdict if wl.no_actuator else _verdict_of(recorded)
                p = plan(wl, verdict, previous, self.cfg, team=team, autonomy=self.autonomy)
                # An owner with no actuator gets no reasons-only update: nothing is written to it.
                reasons_changed = not wl.no_actuator and _reasons_changed(recorded, verdict)
                kind = verdict.kind.value
                gpus = sum(wl.gpus_per_pod.values()) * len(pods)
                if evidence is None and len(pods) == 1 and not wl.no_actuator:
                    st.settled = SettledPlan(wl, pods[0], verdict, team, p, reasons_changed, kind, gpus)
                else:
                    st.settled = None
            result.judged[ref] = Judged(wl, pods, verdict, evidence, p, kind)
            result.states[kind] += 1
            st.last_verdict = verdict.kind
            # Reasons are StrEnum members: equal to, and serialised as, their string values.
            rows.append((ref, kind, verdict.reasons, gpus, p.action))
            if leader:
                if kind not in _RECLAIMABLE_VALUES:
                    st.escalated_for = st.blocked_for = None  # re-arm: a later ghost is announced again
                if p.action in _NO_ACTION and not (p.record or reasons_changed):
                    continue  # most workloads on most polls: nothing to write, no apply() call
                if evidence is None:  # settled by the window, and now written: the same evidence
                    evidence = assemble(st, window=self.cfg.window, processes=None, faults=faults)
                    result.judged[ref].evidence = evidence
                if p.action in _NO_ACTION:
                    records.append((wl, pods, st, verdict, evidence, p))
                    continue
                # Reclaims and escalations: one at a time, in order (the ledger ConfigMap is shared),
                # first in the apiserver budget's queue.
                with budget.priority(
                    budget.Priority.ESCALATE if p.action == "escalate" else budget.Priority.RECLAIM
                ):
                    await self._apply_one(result, wl, pods, st, verdict, evidence, p)
        if records:
            # Most valuable first: reclaimable findings, then other verdict changes, then
            # reasons-only updates of an ACTIVE verdict (budget.Priority).
            records.sort(key=lambda r: _record_priority(r[3], r[5]))
            await self._apply_records(result, records)
        if leader:
            # Run-length: only changed rows reach the file (decisions.py).
            self.decision_log.record_poll(
                ts=now,
                poll=self.poll_count,
                mode=self.cfg.mode,
                interval_s=self.cfg.poll_interval.seconds,
                rows=rows,
            )
            self._accrue(snap, result)
            await self.nudge_kueue(result)
            await self.prune_ledger(snap, now)
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

    # --- step 4: writes (leader only) ----------------------------------------------------------

    def _would(self, wl: Workload) -> str:
        if wl.ref.kind == "Pod":
            return "evict"
        if wl.no_actuator:
            return "escalate (no actuator for its kind) about"
        a = self.actuators.get(wl.ref.kind) if wl.ref.kind not in ("Deployment", "StatefulSet") else None
        return f"stop ({stops.describe_stop(a)})" if a is not None and a.stop != "scale" else "scale to 0"

    async def _apply_one(self, result: PollResult, *args: Any) -> None:
        wl = args[0]
        try:
            outcome = await self.apply(*args)
        except Exception as exc:  # one workload's failure must not stop the poll
            log.exception("action failed", extra={"workload": str(wl.ref), "error": str(exc)})
            outcome = "error"
        if outcome != "none":
            result.actions.append((wl.ref, outcome))
        self.last_progress = self.clock()

    async def _apply_records(self, result: PollResult, records: Sequence[_Apply]) -> None:
        """Verdict writes (annotations, Events; nothing scaled or evicted) with up to
        WRITE_CONCURRENCY in flight: the first verdicts of a large fleet are one such write per
        workload (3 requests with the dry-run), minutes when issued one after another. Each
        workload's own requests stay in order; a few workers share one iterator, so no task or
        coroutine is made per workload."""
        todo = iter(records)

        async def worker() -> None:
            for args in todo:
                with budget.priority(_record_priority(args[3], args[5])):
                    await self._apply_one(result, *args)

        await asyncio.gather(*(worker() for _ in range(min(WRITE_CONCURRENCY, len(records)))))

    async def apply(
        self,
        wl: Workload,
        pods: list[PodView],
        st: WorkloadState,
        verdict: Verdict,
        evidence: Evidence,
        p: Plan,
    ) -> str:
        ref = wl.ref
        ns = ref.namespace
        outcome = "none"
        recorded = _recorded(wl, pods)
        # The summary (annotation text) is built only when it is written: most polls write nothing.
        reasons_changed = _reasons_changed(recorded, verdict)
        if p.record or reasons_changed:
            # Annotations follow the reasons (ACTIVE busy -> ACTIVE in a batch gap is worth seeing);
            # the Event only follows the verdict.
            await self._annotate(
                wl,
                pods,
                {
                    keys.VERDICT: verdict.kind.value,
                    keys.EVIDENCE: evidence_json(evidence_summary(evidence, verdict, self.cfg.window)),
                },
            )
            outcome = "annotated"
        if p.record:
            previous = _verdict_of(recorded) or "none"
            await self.cluster.event(
                wl.raw,
                reason=f"Verdict{_camel(verdict.kind.value)}",
                message=f"ghostgpu verdict {verdict.kind.value} (was {previous}): "
                + ", ".join(r.value for r in verdict.reasons),
                type_="Warning" if verdict.kind in RECLAIMABLE_KINDS else "Normal",
            )
            outcome = "recorded"
            if p.action == "would-reclaim":
                self.metrics.would_reclaims.labels(ns, verdict.kind.value).inc()
                await self.cluster.event(
                    wl.raw,
                    reason="WouldReclaim",
                    message=f"shadow mode: would {self._would(wl)} "
                    f"{ref.short} ({verdict.kind.value}); nothing was touched",
                )
                outcome = "would-reclaim"
        if p.action == "scale-to-zero":
            actuator = self.actuators.get(ref.kind) if ref.kind not in ("Deployment", "StatefulSet") else None
            if actuator is not None and actuator.stop != "scale":
                outcome = await self.stop_manager(wl, verdict, actuator)
            else:
                outcome = await self.scale_to_zero(wl, verdict)
            if outcome in RECLAIM_OUTCOMES:
                self.reclaimed_pods[ref] = (frozenset(pod.uid for pod in pods), self.clock())
        elif p.action == "evict":
            outcome = await self.evict(wl, pods, verdict)
        elif p.action == "escalate" and st.escalated_for != verdict.kind and p.decision is not None:
            st.escalated_for = verdict.kind
            outcome = await self._escalate(wl, pods, verdict, p)
        return outcome

    def _stop_spec_of(self, wl: Workload) -> StopSpec | None:
        """None for an evicted bare Pod and for an owner with no actuator (nothing is stopped)."""
        if wl.ref.kind == "Pod" or wl.no_actuator:
            return None
        return self._stop_specs.get(wl.ref.kind) or stop_spec_for(wl.ref.kind)

    async def stop_manager(self, wl: Workload, verdict: Verdict, actuator: Actuator) -> str:
        """A manager's annotation or field stop, with its record, on the manager itself (stops.py)."""
        ref = wl.ref
        done = await stops.stop(
            self.cluster,
            ref,
            actuator,
            is_leader=self.is_leader(),
            before=lambda fresh: self._before_stop(wl, fresh, verdict),  # revert mark, GitOps pre-flight
        )
        if done.outcome == "blocked" and done.fresh is not None:
            await self._blocked(done.fresh, ref, verdict, done.detail)
            return "blocked-by-webhook"
        if done.outcome != "stopped" or done.fresh is None:
            return done.outcome
        self.revert_guard.saw_stopped(wl.uid, done.record)
        self.metrics.reclaims.labels(ref.namespace, verdict.kind.value, "stop").inc()
        await self.cluster.event(
            done.fresh,
            reason="Reclaimed",
            message=f"stopped {ref.short} through its own API: {stops.describe_stop(actuator)} "
            f"({verdict.kind.value}; previous value recorded in {RECLAIMED_FROM_RECORD}); undo: "
            f"ghostgpu restore {ref.short} -n {ref.namespace}",
            type_="Warning",
        )
        log.warning(
            "reclaimed", extra={"workload": str(ref), "verdict": verdict.kind, "stop": actuator.writes}
        )
        return "stopped"

    async def _annotate(self, wl: Workload, pods: Sequence[PodView], annotations: Mapping[str, str]) -> None:
        if wl.no_actuator:
            return  # a controller owner ghostgpu has no rights on: nothing is written to it or its children
        try:
            await self.cluster.patch_annotations(wl.ref, annotations, current=wl.raw)
        except AdmissionDenied as exc:
            # The workload cannot be written (Kueue's LocalQueue-default webhook on a pre-existing
            # Deployment refuses it, or, at 0 ready replicas, would accept it and add queue-name:
            # kube.WouldMutate, seen by a dry-run); its pods can, and status/report/failover read
            # them from there.
            self.metrics.write_fallbacks.labels(wl.ref.namespace).inc()
            log.warning(
                "workload not writable, annotating its pods",
                extra={"workload": str(wl.ref), "error": str(exc)[:300]},
            )
            for pod in pods:
                await self.cluster.patch_annotations(WorkloadRef("Pod", pod.namespace, pod.name), annotations)

    async def scale_to_zero(self, wl: Workload, verdict: Verdict) -> str:
        ref = wl.ref
        try:
            fresh = await self.cluster.get(ref)
        except NotFound:
            return "gone"
        meta = fresh.get("metadata") or {}
        ann = meta.get("annotations") or {}
        replicas = int((fresh.get("spec") or {}).get("replicas", 1) or 0)
        if replicas == 0:
            return "already-zero"  # someone (the other replica, a person) already did it
        if ann.get(keys.RECLAIM_POLICY) == "never" or ann.get(keys.GPU_EVICTION_POLICY) == "never":
            return "exempt"
        if not self.is_leader():
            return "not-leader"
        held = await self._before_stop(wl, fresh, verdict)  # revert mark, GitOps pre-flight
        if held is not None:
            return held
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            recorded = await self.cluster.patch_annotations(
                ref,
                {
                    keys.RECLAIMED_FROM: str(replicas),
                    keys.RECLAIMED_AT: at,
                    REVERT_MARK: None,  # a mark reached here only with a changed spec: stale
                },
                resource_version=meta.get("resourceVersion"),
                current=fresh,
            )
        except Conflict:
            return "conflict"  # the object changed since we read it: judge again next poll
        except NotFound:
            return "gone"  # deleted since we read it: nothing to stop, nothing to record
        except AdmissionDenied as exc:
            # The workload cannot carry the record (Kueue's LocalQueue-default webhook): the
            # ledger can. Without a durable record there is no scale-to-zero (restore needs it).
            ledger_error = await self._record_in_ledger(ref, fresh, replicas)
            if ledger_error is not None:
                await self._blocked(fresh, ref, verdict, f"{str(exc)[:300]}; ledger: {ledger_error}")
                return "blocked-by-webhook"
            try:
                # Precondition: the object as read before the ledger write. A concurrent actor that
                # scaled it since (another leader after a split brain) makes this a 409, no-op.
                await self.cluster.scale(ref, 0, resource_version=meta.get("resourceVersion"))
            except Conflict:
                return "conflict"  # the ledger entry stays; the next poll re-reads and rewrites it
            self.ledger_entries[ledger_key(ref)] = LedgerEntry(replicas, str(meta.get("uid", "")), "")
            return await self._reclaimed(fresh, ref, replicas, verdict, record="the replica ledger")
        # Precondition: the object as the record left it. A write in between (someone scaled it to
        # 3 after we recorded 2) makes the scale a 409 instead of a stop whose record names the
        # wrong count; the record then goes too, so record and stop land together or not at all.
        rv = ((recorded or {}).get("metadata") or {}).get("resourceVersion")
        try:
            await self.cluster.scale(ref, 0, resource_version=rv)
        except Conflict:
            await self._unrecord(ref, str(replicas), at)
            return "conflict"
        except NotFound:
            return "gone"  # deleted between the record and the scale: the record went with it
        return await self._reclaimed(fresh, ref, replicas, verdict, record=keys.RECLAIMED_FROM)

    async def _unrecord(self, ref: WorkloadRef, record: str, at: str) -> None:
        """Remove the record this process just wrote when its scale did not land: only if it is
        still exactly ours and the workload still runs (at 0, a record is what restore needs).
        If this fails too, the record stays and the revert guard treats it as a stop that never
        landed (revert_guard.py); the next reclaim rewrites it from the current count."""
        try:
            obj = await self.cluster.get(ref)
            meta = obj.get("metadata") or {}
            ann = meta.get("annotations") or {}
            ours = ann.get(keys.RECLAIMED_FROM) == record and ann.get(keys.RECLAIMED_AT) == at
            if not ours or int((obj.get("spec") or {}).get("replicas", 1) or 0) == 0:
                return
            await self.cluster.patch_annotations(
                ref,
                {keys.RECLAIMED_FROM: None, keys.RECLAIMED_AT: None},
                resource_version=meta.get("resourceVersion"),
                current=obj,
            )
        except (Conflict, NotFound, AdmissionDenied) as exc:
            log.info("record of a scale that did not land left in place", extra={"workload": str(ref),
                     "error": type(exc).__name__})  # fmt: skip

    # --- GitOps pre-flight and revert guard hooks (gitops.py, revert_guard.py) -------------------

    async def _before_stop(self, wl: Workload, fresh: Mapping[str, Any], verdict: Verdict) -> str | None:
        """None: go ahead with the stop. Otherwise the outcome that replaces it, with nothing
        written: the workload carries a revert mark for its current spec, or a GitOps manager
        would revert the stop (or cannot be read), escalated once per verdict with the fix."""
        stop = self.stop_spec(wl)
        if stop is None:
            return None
        if self.revert_guard.held(fresh, stop.writes) is not None:
            return "held-by-revert-mark"  # announced once, by the ReclaimReverted Event
        if self.gitops is not None:
            pre = await self.gitops.check(fresh, stop.writes)
            if pre.blocks:
                return await self._gitops_blocked(wl, fresh, verdict, pre)
        self.revert_guard.forget(wl.uid)  # a new record follows: earlier sightings do not count
        return None

    async def _gitops_blocked(
        self, wl: Workload, fresh: Mapping[str, Any], verdict: Verdict, pre: Preflight
    ) -> str:
        st = self.states.get(wl.ref)
        if st is not None and st.escalated_for != verdict.kind:
            st.escalated_for = verdict.kind
            await self._gitops_escalate(wl, fresh, verdict, pre)
        return f"gitops-{pre.outcome.value}"

    async def _gitops_escalate(
        self, wl: Workload, fresh: Mapping[str, Any], verdict: Verdict, pre: Preflight
    ) -> None:
        self.metrics.escalations.labels(wl.ref.namespace, "gitops-preflight").inc()
        fix = f" Fix: merge into the {pre.manager.kind.value}:\n{pre.fix}" if pre.fix and pre.manager else ""
        await self.cluster.event(
            fresh,
            reason="ReclaimEscalated",
            message=f"{verdict.kind.value}: not stopping {wl.ref.short}: {pre.reason}.{fix}",
            type_="Warning",
        )
        log.warning(
            "reclaim blocked by GitOps pre-flight",
            extra={"workload": str(wl.ref), "outcome": pre.outcome.value, "reason": pre.reason},
        )

    async def _guard_reverts(self, snap: Snapshot) -> None:
        """Record reclaims undone by anyone but `ghostgpu restore` (revert_guard.py). Cheap for
        the fleet: only workloads with a reclaimed-from record are looked at, and only those that
        the cache shows running again are read fresh."""
        candidates = []
        opted_in = {ns for ns, labels in snap.namespaces.items() if namespace_opted_in(labels)}
        for ref, wl in self._reclaim_marked(snap.workloads):  # only these can be undone
            record = self.reclaimed_from(wl) if ref.namespace in opted_in else None
            if record is None and ref.namespace in opted_in and RECLAIMED_FROM_RECORD in wl.annotations:
                # A manager's annotation or field stop: its record is the previous values (stops.py).
                stop = self.stop_spec(wl)
                if stop is not None:
                    candidates.append(
                        Candidate(
                            ref, wl.uid, wl.annotations[RECLAIMED_FROM_RECORD],
                            parse_time(wl.annotations.get(keys.RECLAIMED_AT)), stop.is_stopped(wl.raw),
                            stop, record_keys=(RECLAIMED_FROM_RECORD, keys.RECLAIMED_AT),
                        )
                    )  # fmt: skip
                continue
            stop = self.stop_spec(wl) if record is not None else None
            if record is None or stop is None:
                continue
            at = wl.annotations.get(keys.RECLAIMED_AT)
            if at is None and wl.reclaimed_from is None:
                entry = self.ledger_entries.get(ledger_key(ref))
                at = entry.at if entry is not None else None
            candidates.append(
                Candidate(ref, wl.uid, str(record), parse_time(at), stop.is_stopped(wl.raw), stop)
            )
        if not candidates:
            return
        try:
            await self.revert_guard.sweep(candidates)
        except Exception as exc:  # the next poll tries again; judging must go on
            log.warning("revert guard failed", extra={"error": f"{type(exc).__name__}: {exc}"})

    async def _record_in_ledger(
        self, ref: WorkloadRef, fresh: Mapping[str, Any], replicas: int
    ) -> str | None:
        """Store the replica count in the ledger; None once it is durably stored, else why not."""
        if self.ledger is None:
            return "no replica ledger configured"
        uid = str((fresh.get("metadata") or {}).get("uid", ""))
        try:
            await self.ledger.record(
                ref, LedgerEntry(replicas, uid, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            )
        except Exception as exc:
            log.warning(
                "cannot write the replica ledger", extra={"workload": str(ref), "error": str(exc)[:300]}
            )
            return f"{type(exc).__name__}: {str(exc)[:200]}"
        return None

    async def _blocked(self, fresh: Mapping[str, Any], ref: WorkloadRef, verdict: Verdict, why: str) -> None:
        """ReclaimBlocked, once per verdict: no durable replica record could be written."""
        st = self.states.get(ref)
        if st is not None and st.escalated_for != verdict.kind:
            st.escalated_for = verdict.kind
            self.metrics.escalations.labels(ref.namespace, "scale_to_zero").inc()
            await self.cluster.event(
                fresh,
                reason="ReclaimBlocked",
                message=f"{verdict.kind.value}: not scaling {ref.short} to 0 because "
                f"{keys.RECLAIMED_FROM} can be recorded neither on it nor in the ledger: {why}",
                type_="Warning",
            )

    async def _reclaimed(
        self, fresh: Mapping[str, Any], ref: WorkloadRef, replicas: int, verdict: Verdict, *, record: str
    ) -> str:
        self.revert_guard.saw_stopped(str((fresh.get("metadata") or {}).get("uid", "")), str(replicas))
        self.metrics.reclaims.labels(ref.namespace, verdict.kind.value, "scale-to-zero").inc()
        await self.cluster.event(
            fresh,
            reason="Reclaimed",
            message=f"scaled {ref.short} from {replicas} to 0 replicas ({verdict.kind.value}; count "
            f"recorded in {record}); undo: ghostgpu restore {ref.short} -n {ref.namespace}",
            type_="Warning",
        )
        log.warning(
            "reclaimed",
            extra={"workload": str(ref), "fromReplicas": replicas, "verdict": verdict.kind, "record": record},
        )
        return "scaled-to-zero"

    async def evict(self, wl: Workload, pods: list[PodView], verdict: Verdict) -> str:
        ref = wl.ref
        try:
            fresh = await self.cluster.get(ref)
        except NotFound:
            return "gone"
        meta = fresh.get("metadata") or {}
        ann = meta.get("annotations") or {}
        if meta.get("deletionTimestamp"):
            return "already-terminating"
        if ann.get(keys.RECLAIM_POLICY) == "never" or ann.get(keys.GPU_EVICTION_POLICY) == "never":
            return "exempt"
        if not self.is_leader():
            return "not-leader"
        outcome = await self.cluster.evict(ref.namespace, ref.name)
        if outcome == "evicted":
            self.metrics.reclaims.labels(ref.namespace, verdict.kind.value, "evict").inc()
            await self.cluster.event(
                fresh,
                reason="Reclaimed",
                message=f"evicted {ref.short} ({verdict.kind.value})",
                type_="Warning",
            )
        elif outcome == "blocked" and self._first_block(ref, verdict):
            await self.cluster.event(
                fresh,
                reason="EvictionBlocked",
                message="a PodDisruptionBudget forbids evicting it now; retrying next poll",
                type_="Warning",
            )
        return f"evict-{outcome}"

    def _first_block(self, ref: WorkloadRef, verdict: Verdict) -> bool:
        """True once per verdict: a blocked eviction is retried every poll but announced once."""
        st = self.states.get(ref)
        if st is None or st.blocked_for == verdict.kind:
            return False
        st.blocked_for = verdict.kind
        return True

    async def _escalate(self, wl: Workload, pods: Sequence[PodView], verdict: Verdict, p: Plan) -> str:
        from ghostgpu.escalation import annotation_value

        assert p.decision is not None
        self.metrics.escalations.labels(wl.ref.namespace, p.decision.action).inc()
        now = datetime.now(UTC)
        # Like the verdict: on the pods when the workload cannot (or must not) be written.
        await self._annotate(wl, pods, {keys.ESCALATED: annotation_value(p.decision, now=now)})
        await self.cluster.event(
            wl.raw,
            reason="ReclaimEscalated",
            message=f"{verdict.kind.value}: {p.decision.reason}",
            type_="Warning",
        )
        if self.escalate is not None:
            await self.escalate(p.decision, wl)
        return "escalated"

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

    def _accrue(self, snap: Snapshot, result: PollResult) -> None:
        """Ghost GPUs gauge and the GPU-hour counters (leader only, once per poll)."""
        hours = self.cfg.poll_interval.seconds / 3600.0
        flavors_by_node = {
            (n.get("metadata") or {}).get("name", ""): n.get("_flavor", "unknown") for n in snap.nodes
        }
        ghosts: Counter[tuple[str, str, str]] = Counter()
        for ref, j in result.judged.items():
            reclaimable = j.kind in _RECLAIMABLE_VALUES
            for pod in j.pods:
                flavor = flavors_by_node.get(pod.node_name or "", "unknown")
                gpus = sum(pod.gpu_requests.values())
                ghosts[(ref.namespace, flavor, j.kind)] += gpus
                if reclaimable:
                    self.metrics.gpu_hours_reclaimable.labels(ref.namespace, flavor).inc(gpus * hours)
        self.metrics.set_ghosts(ghosts)
        for ref, wl in self._reclaim_marked(snap.workloads):  # only these hold GPUs free
            pods = self.recovered_pods(wl)
            if pods:
                gpus = sum(wl.gpus_per_pod.values()) * pods
                self.metrics.gpu_hours_recovered.labels(ref.namespace, "all").inc(gpus * hours)

    def recovered_pods(self, wl: Workload) -> int | None:
        """How many pods' GPUs a reclaim of `wl` holds free now (None: not reclaimed, or undone).
        Scaled to 0: its recorded replica count. A manager stopped through an annotation or a field
        (a suspended RayCluster, a stopped Notebook or InferenceService, a NIMService at 0): while
        the stop holds, its replica count before the stop (the record's, when the stop wrote the
        replica count itself), else its pod templates' replicas (1 without a count)."""
        reclaimed_from = self.reclaimed_from(wl)
        if reclaimed_from is not None:
            return reclaimed_from if wl.replicas == 0 else None
        raw = wl.annotations.get(RECLAIMED_FROM_RECORD)
        a = self.actuators.get(wl.ref.kind) if wl.ref.kind not in ("Deployment", "StatefulSet") else None
        if raw is None or a is None or a.stop == "scale" or not a.is_stopped(wl.raw):
            return None
        try:
            record = json.loads(raw)
        except ValueError:
            return None
        before = record.get(a.replicas) if isinstance(record, dict) and a.replicas else None
        return int(before) if isinstance(before, int | float) else wl.replicas


def _recorded(wl: Workload, pods: Sequence[PodView] = ()) -> Mapping[str, str]:
    """Where the last verdict was written: the workload, or its pods when the workload could not
    be written (see kube.AdmissionDenied)."""
    if keys.VERDICT in wl.annotations:
        return wl.annotations
    for pod in sorted(pods, key=lambda p: p.name):
        if keys.VERDICT in pod.annotations:
            return pod.annotations
    return wl.annotations


def _verdict_of(wl: Workload | Mapping[str, str]) -> VerdictKind | None:
    annotations = wl.annotations if isinstance(wl, Workload) else wl
    raw = annotations.get(keys.VERDICT)
    try:
        return VerdictKind(raw) if raw else None
    except ValueError:
        return None


# Outcomes of a reclaim that stops pods (the settle skip, the Kueue nudge).
RECLAIM_OUTCOMES = ("scaled-to-zero", "stopped")

# Verdict writes in flight at once (Reconciler._apply_records).
WRITE_CONCURRENCY = 8

# apply()'s arguments for one workload.
_Apply = tuple[Workload, list[PodView], WorkloadState, Verdict, Evidence, Plan]

# RECLAIMABLE_KINDS by value (Judged.kind): a str hashes in C, an enum member in Python.
_RECLAIMABLE_VALUES = frozenset(k.value for k in RECLAIMABLE_KINDS)

# Plans that do nothing beyond recording the verdict (see planner.ActionKind).
_NO_ACTION = frozenset({"none", "would-reclaim", "disabled"})


def _reasons_changed(recorded: Mapping[str, str], verdict: Verdict) -> bool:
    """Annotations follow the reasons too (ACTIVE busy -> ACTIVE in a batch gap is worth seeing);
    never for a warm-up UNKNOWN (Verdict.warming_up), and never onto a workload that carries no
    verdict while it is plainly busy (not written: planner.silent_first)."""
    if verdict.warming_up:
        return False
    if keys.VERDICT not in recorded and silent_first(verdict, None):
        return False
    return _reasons_of(recorded) != list(verdict.reasons)


def _record_priority(verdict: Verdict, p: Plan) -> budget.Priority:
    if not p.record:
        return budget.Priority.ACTIVE  # the reasons changed, the verdict did not
    return budget.Priority.FINDING if verdict.kind in RECLAIMABLE_KINDS else budget.Priority.VERDICT


def _reasons_of(annotations: Mapping[str, str]) -> list[str] | None:
    return _parse_reasons(annotations.get(keys.EVIDENCE, ""))


@functools.lru_cache(maxsize=32768)
def _parse_reasons(evidence: str) -> list[str] | None:
    """The reasons recorded in an evidence annotation. Memoised on the annotation text: it changes
    only when the controller rewrites it, so most polls parse none of the N annotations (the
    annotation stays the durable record; callers only compare the result, never mutate it)."""
    try:
        reasons = json.loads(evidence).get("reasons")
    except (ValueError, AttributeError):
        return None
    return reasons if isinstance(reasons, list) else None


def _camel(kind: str) -> str:
    return "".join(part.capitalize() for part in kind.split("_"))


def outside_kueue_buckets(
    judged: Mapping[WorkloadRef, Judged],
    workloads: Mapping[WorkloadRef, Workload],
    pods_of: Mapping[WorkloadRef, list[PodView]],
) -> dict[tuple[str, str], str]:
    """(namespace, pod) -> verdict bucket for every pod of a tracked workload."""
    out: dict[tuple[str, str], str] = {}
    for ref, wl in workloads.items():
        if ref in judged:
            bucket = judged[ref].kind
        elif wl.exempt:
            bucket = "EXEMPT"
        else:
            kind = _verdict_of(_recorded(wl, pods_of.get(ref, [])))
            bucket = kind.value if kind else "PENDING"
        for pod in pods_of.get(ref, []):
            out[(pod.namespace, pod.name)] = bucket
    return out


def accounting_from(
    flavors: Sequence[FlavorSpec],
    snap: Snapshot,
    cluster_queues: Sequence[Mapping[str, Any]],
    judged: Mapping[WorkloadRef, Judged] | None = None,
    pods_of: Mapping[WorkloadRef, list[PodView]] | None = None,
) -> list[FlavorAccount]:
    """`pods_of`: the poll's PollResult.pods_of (the same snapshot), else computed here."""
    opted_in = {ns for ns, labels in snap.namespaces.items() if namespace_opted_in(labels)}
    workloads = {ref: wl for ref, wl in snap.workloads.items() if ref.namespace in opted_in}
    if pods_of is None:
        pods_of = pods_by_workload(workloads, snap.pods, snap.top_of)
    buckets = outside_kueue_buckets(judged or {}, workloads, pods_of)
    return account(flavors, snap.nodes, snap.pods, cluster_queues, buckets)


__all__ = [
    "Judged",
    "PollResult",
    "Reconciler",
    "Snapshot",
    "accounting_from",
    "node_flavor",
    "outside_kueue_buckets",
]
