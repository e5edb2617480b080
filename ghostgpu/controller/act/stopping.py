"""Stopping a workload through its row of the actuator table (ghostgpu/actuators.py), guarded.

One stop path for every kind: a `scale` row (Deployment, StatefulSet, LeaderWorkerSet) records its
replica count (`reclaimed-from-replicas`, or the replica ledger when an admission webhook refuses
that write) and scales through the scale subresource; an `annotation` or `field` row writes its
stop and record in one patch (stops.py). Before either: the revert mark and the GitOps pre-flight
(`before_stop`); after the poll's reads, before any stop: the revert guard's sweep (`guard_reverts`).

State: the revert guard's sightings (revert_guard.py) and the GitOps pre-flight's cache; writes:
the stop, its record, the ledger entry, the Reclaimed / ReclaimBlocked / ReclaimEscalated Events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from ghostgpu.actuators import RECLAIMED_FROM_RECORD, Actuator, ActuatorTable, describe_stop
from ghostgpu.controller import keys
from ghostgpu.controller.act import stops
from ghostgpu.controller.act.gitops import GitOpsPreflight
from ghostgpu.controller.act.gitops_rules import Outcome, Preflight
from ghostgpu.controller.act.revert_guard import MARK as REVERT_MARK
from ghostgpu.controller.act.revert_guard import RevertGuard, revert_candidates
from ghostgpu.controller.act.stopspec import StopSpec
from ghostgpu.controller.inventory import Workload, WorkloadRef
from ghostgpu.controller.kube import AdmissionDenied, Cluster, Conflict, NotFound
from ghostgpu.controller.ledger import LedgerBook, LedgerEntry, ledger_key
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.observe.evidence import WorkloadState
from ghostgpu.controller.poll import Snapshot
from ghostgpu.verdict import Verdict

log = logging.getLogger("ghostgpu.controller")


class Stopper:
    def __init__(
        self,
        *,
        cluster: Cluster,
        metrics: ControllerMetrics,
        actuators: ActuatorTable,
        records: LedgerBook,
        states: Mapping[WorkloadRef, WorkloadState],
        is_leader: Callable[[], bool],
        gitops: GitOpsPreflight | None,
    ) -> None:
        self.cluster = cluster
        self.metrics = metrics
        self.actuators = actuators
        self.records = records
        self.states = states  # the observe room's: once-per-verdict announcements live there
        self.is_leader = is_leader
        # Before a stop: would a GitOps manager put it back (None: no pre-flight)? After one: was it
        # undone by anyone but `ghostgpu restore`? Both take the stop as data (stopspec.StopSpec:
        # the JSON pointers it writes, is_stopped), from the actuator table: the pre-flight and the
        # revert guard treat a RayCluster's suspend like a Deployment's scale.
        self.gitops = gitops
        self.revert_guard = RevertGuard(cluster, metrics)
        self._stop_specs = {a.group_kind: StopSpec(tuple(a.writes), a.is_stopped) for a in actuators.rows()}

    def actuator(self, wl: Workload) -> Actuator | None:
        """The row that stops `wl`; None for an evicted bare Pod and an owner with no actuator."""
        if wl.ref.kind == "Pod" or wl.no_actuator:
            return None
        return self.actuators.for_ref(wl.ref)

    def stop_spec(self, wl: Workload) -> StopSpec | None:
        """What the stop of `wl` writes and how to tell it holds (None: nothing is stopped)."""
        return self._stop_specs.get(wl.ref.group_kind) if self.actuator(wl) is not None else None

    async def stop(self, wl: Workload, verdict: Verdict) -> str:
        """Stop `wl` through its row; the outcome ("scaled-to-zero", "stopped", or why not)."""
        a = self.actuator(wl)
        if a is None or a.stop == "scale":  # None: no row (planner.plan escalates those)
            return await self.scale_to_zero(wl, verdict)
        return await self.stop_manager(wl, verdict, a)

    # --- annotation and field rows ----------------------------------------------------------------

    async def stop_manager(self, wl: Workload, verdict: Verdict, actuator: Actuator) -> str:
        """A manager's annotation or field stop, with its record, on the manager itself (stops.py)."""
        ref = wl.ref
        done = await stops.stop(
            self.cluster,
            ref,
            actuator,
            is_leader=self.is_leader(),
            before=lambda fresh: self.before_stop(wl, fresh, verdict),  # revert mark, GitOps pre-flight
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
            message=f"stopped {ref.short} through its own API: {describe_stop(actuator)} "
            f"({verdict.kind.value}; previous value recorded in {RECLAIMED_FROM_RECORD}); undo: "
            f"ghostgpu restore {ref.target} -n {ref.namespace}",
            type_="Warning",
        )
        log.warning(
            "reclaimed", extra={"workload": str(ref), "verdict": verdict.kind, "stop": actuator.writes}
        )
        return "stopped"

    # --- scale rows ---------------------------------------------------------------------------------

    async def scale_to_zero(self, wl: Workload, verdict: Verdict) -> str:
        ref = wl.ref
        fresh, why_not = await stops.read_for_write(
            self.cluster,
            ref,
            is_leader=self.is_leader,
            already=lambda o: None if _replicas(o) else "already-zero",
        )
        if why_not is not None:
            return why_not
        assert fresh is not None
        meta = fresh.get("metadata") or {}
        replicas = _replicas(fresh)
        held = await self.before_stop(wl, fresh, verdict)  # revert mark, GitOps pre-flight
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
            ledger_error = await self.records.record(ref, fresh, replicas)
            if ledger_error is not None:
                await self._blocked(fresh, ref, verdict, f"{str(exc)[:300]}; ledger: {ledger_error}")
                return "blocked-by-webhook"
            try:
                # Precondition: the object as read before the ledger write. A concurrent actor that
                # scaled it since (another leader after a split brain) makes this a 409, no-op.
                await self.cluster.scale(ref, 0, resource_version=meta.get("resourceVersion"))
            except Conflict:
                return "conflict"  # the ledger entry stays; the next poll re-reads and rewrites it
            self.records.entries[ledger_key(ref)] = LedgerEntry(replicas, str(meta.get("uid", "")), "")
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
            f"recorded in {record}); undo: ghostgpu restore {ref.target} -n {ref.namespace}",
            type_="Warning",
        )
        log.warning(
            "reclaimed",
            extra={"workload": str(ref), "fromReplicas": replicas, "verdict": verdict.kind, "record": record},
        )
        return "scaled-to-zero"

    # --- the guards: revert mark, GitOps pre-flight, revert sweep -----------------------------------

    async def before_stop(self, wl: Workload, fresh: Mapping[str, Any], verdict: Verdict) -> str | None:
        """None: go ahead with the stop. Otherwise the outcome that replaces it, with nothing
        written: the workload carries a revert mark for its current spec, or a GitOps manager
        would revert the stop (or cannot be read, or is named by a marker but not in this cluster),
        escalated once per verdict with the fix."""
        stop = self.stop_spec(wl)
        if stop is None:
            return None
        if self.revert_guard.held(fresh, stop.writes) is not None:
            return "held-by-revert-mark"  # announced once, by the ReclaimReverted Event
        if self.gitops is not None:
            pre = await self.gitops.check(fresh, stop.writes)
            if pre.blocks:
                st = self.states.get(wl.ref)
                if st is not None and st.escalated_for != verdict.kind:
                    st.escalated_for = verdict.kind
                    await self._gitops_escalate(wl, fresh, verdict, pre)
                return f"gitops-{pre.outcome.value}"
        self.revert_guard.forget(wl.uid)  # a new record follows: earlier sightings do not count
        return None

    async def _gitops_escalate(
        self, wl: Workload, fresh: Mapping[str, Any], verdict: Verdict, pre: Preflight
    ) -> None:
        self.metrics.escalations.labels(wl.ref.namespace, "gitops-preflight").inc()
        fix = ""
        if pre.fix and pre.manager:
            where = " where it runs" if pre.outcome is Outcome.UNSEEN else ""
            fix = f" Fix: merge into the {pre.manager.kind.value}{where}:\n{pre.fix}"
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

    async def guard_reverts(self, snap: Snapshot) -> None:
        """Record reclaims undone by anyone but `ghostgpu restore` (revert_guard.py). Cheap for
        the fleet: only workloads with a reclaimed-from record are looked at, and only those that
        the cache shows running again are read fresh."""
        candidates = revert_candidates(
            self.records.marked(snap.workloads), snap.opted_in(), self.records, self.stop_spec
        )
        if not candidates:
            return
        try:
            await self.revert_guard.sweep(candidates)
        except Exception as exc:  # the next poll tries again; judging must go on
            log.warning("revert guard failed", extra={"error": f"{type(exc).__name__}: {exc}"})


def _replicas(obj: Mapping[str, Any]) -> int:
    return int((obj.get("spec") or {}).get("replicas", 1) or 0)
