"""The act room's one entry point, `Actor.act`: the leader's writes for one poll, from the judge's
rulings. Followers never get here.

- Verdict annotations and Events (`apply`): the annotations follow the verdict and its reasons,
  the Event only the verdict; on the pods when the workload cannot be written.
- Reclaims and escalations first, one at a time, in order (the ledger ConfigMap is shared), first
  in the apiserver budget's queue; then the verdict writes, a few in flight at once.
- A stop goes through the workload's actuator row (stopping.py, with the GitOps pre-flight and
  the revert mark); a bare Pod is evicted; what the risk gate refuses is escalated once per verdict.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ghostgpu.actuators import describe_stop
from ghostgpu.controller import budget, keys
from ghostgpu.controller.act import stops
from ghostgpu.controller.act.stopping import Stopper

if TYPE_CHECKING:
    from ghostgpu.controller.act.idle import IdleSessions
from ghostgpu.controller.inventory import PodView, Workload, WorkloadRef
from ghostgpu.controller.judge.judge import Apply, Rulings
from ghostgpu.controller.judge.planner import Plan
from ghostgpu.controller.judge.recorded import reasons_changed, recorded, verdict_of
from ghostgpu.controller.kube import AdmissionDenied, Cluster
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.observe.evidence import WorkloadState, evidence_json, evidence_summary
from ghostgpu.controller.poll import RECLAIM_OUTCOMES, RECLAIMABLE_VALUES, PollResult
from ghostgpu.verdict import RECLAIMABLE_KINDS, Evidence, Verdict

log = logging.getLogger("ghostgpu.controller")

# Verdict writes in flight at once (Actor._apply_records).
WRITE_CONCURRENCY = 8


class Actor:
    def __init__(
        self,
        *,
        window: int,
        cluster: Cluster,
        metrics: ControllerMetrics,
        stops: Stopper,
        is_leader: Callable[[], bool],
        clock: Callable[[], float],
        settle: Callable[[WorkloadRef, list[PodView], float], None],
        escalate: Callable[..., Any] | None = None,
    ) -> None:
        self.window = window
        self.cluster = cluster
        self.metrics = metrics
        self.stops = stops
        self.is_leader = is_leader
        self.clock = clock
        self.settle = settle  # the observe room's settle skip (Observer.stopped)
        self.escalate = escalate
        self.idle: IdleSessions | None = None  # act/idle.py, set by the reconciler
        # Inside a long poll (the first verdicts of 10,000 workloads: 30,000 requests, a minute or
        # more on a slow apiserver) this moves with every workload applied, so /healthz can tell slow
        # from stuck and the liveness probe does not restart a controller that is making progress.
        self.last_progress: float | None = None

    async def act(self, result: PollResult, rulings: Rulings) -> None:
        for j in result.judged.values():
            if j.kind not in RECLAIMABLE_VALUES and j.state is not None:
                j.state.escalated_for = j.state.blocked_for = None  # re-arm: a later ghost is announced again
        for args in rulings.actions:
            p = args[5]
            with budget.priority(
                budget.Priority.ESCALATE if p.action == "escalate" else budget.Priority.RECLAIM
            ):
                await self._apply_one(result, *args)
        if rulings.records:
            # Most valuable first: reclaimable findings, then other verdict changes, then
            # reasons-only updates of an ACTIVE verdict (budget.Priority).
            records = sorted(rulings.records, key=lambda r: _record_priority(r[3], r[5]))
            await self._apply_records(result, records)
        if self.idle is not None:  # with no candidate, too: its gauge then says none
            steps = {
                c.workload.ref: f"idle-{step.action}"
                for c, step in await self.idle.tend(rulings.idle)
                if step.action != "none"
            }
            result.actions.extend(
                (ref, a) for ref, a in steps.items() if a not in ("idle-hold", "idle-warned")
            )
            if steps:  # the decision log records each idle session's step as the row's action
                rulings.rows[:] = [(r[0], r[1], r[2], r[3], steps.get(r[0], r[4])) for r in rulings.rows]

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

    async def _apply_records(self, result: PollResult, records: Sequence[Apply]) -> None:
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
        outcome = "none"
        on = recorded(wl, pods)
        # The summary (annotation text) is built only when it is written: most polls write nothing.
        if p.record or reasons_changed(on, verdict):
            # Annotations follow the reasons (ACTIVE busy -> ACTIVE in a batch gap is worth seeing);
            # the Event only follows the verdict.
            await self._annotate(
                wl,
                pods,
                {
                    keys.VERDICT: verdict.kind.value,
                    keys.EVIDENCE: evidence_json(evidence_summary(evidence, verdict, self.window)),
                },
            )
            outcome = "annotated"
        if p.record:
            outcome = await self._record(wl, verdict, p, verdict_of(on))
        if p.action == "scale-to-zero":
            outcome = await self.stops.stop(wl, verdict)
            if outcome in RECLAIM_OUTCOMES:
                self.settle(ref, pods, self.clock())
        elif p.action == "evict":
            outcome = await self.evict(wl, pods, verdict)
        elif p.action == "escalate" and st.escalated_for != verdict.kind and p.decision is not None:
            st.escalated_for = verdict.kind
            outcome = await self._escalate(wl, pods, verdict, p)
        return outcome

    async def _record(self, wl: Workload, verdict: Verdict, p: Plan, previous: object) -> str:
        """The verdict's Event, and in shadow mode what a reclaim would have done."""
        ref = wl.ref
        await self.cluster.event(
            wl.raw,
            reason=f"Verdict{_camel(verdict.kind.value)}",
            message=f"ghostgpu verdict {verdict.kind.value} (was {previous or 'none'}): "
            + ", ".join(r.value for r in verdict.reasons),
            type_="Warning" if verdict.kind in RECLAIMABLE_KINDS else "Normal",
        )
        if p.action == "shared-claim":
            await self.cluster.event(
                wl.raw,
                reason="ReclaimHeld",
                message=f"{verdict.kind.value}, not reclaimed: {p.note}",
                type_="Warning",
            )
            return "shared-claim"
        if p.action != "would-reclaim":
            return "recorded"
        self.metrics.would_reclaims.labels(ref.namespace, verdict.kind.value).inc()
        await self.cluster.event(
            wl.raw,
            reason="WouldReclaim",
            message=f"shadow mode: would {self._would(wl)} "
            f"{ref.short} ({verdict.kind.value}); nothing was touched",
        )
        return "would-reclaim"

    def _would(self, wl: Workload) -> str:
        if wl.ref.kind == "Pod":
            return "evict"
        if wl.no_actuator:
            return "escalate (no actuator for its kind) about"
        a = self.stops.actuator(wl)
        return f"stop ({describe_stop(a)})" if a is not None and a.stop != "scale" else "scale to 0"

    async def annotate_workload(
        self, wl: Workload, pods: Sequence[PodView], annotations: Mapping[str, str | None]
    ) -> None:
        """The idle-session writes (act/idle.py): where the verdict's annotations go."""
        await self._annotate(wl, pods, annotations)

    async def escalate_plan(self, wl: Workload, pods: Sequence[PodView], verdict: Verdict, p: Plan) -> str:
        """An idle-session stop the risk gate refused: escalated like every other."""
        return await self._escalate(wl, pods, verdict, p)

    async def _annotate(
        self, wl: Workload, pods: Sequence[PodView], annotations: Mapping[str, str | None]
    ) -> None:
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

    async def evict(self, wl: Workload, pods: list[PodView], verdict: Verdict) -> str:
        ref = wl.ref
        fresh, why_not = await stops.read_for_write(
            self.cluster,
            ref,
            is_leader=self.is_leader,
            already=lambda o: (
                "already-terminating" if (o.get("metadata") or {}).get("deletionTimestamp") else None
            ),
        )
        if why_not is not None:
            return why_not
        assert fresh is not None
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
        st = self.stops.states.get(ref)
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
            await self.escalate(p.decision, wl, pods)
        return "escalated"


def _record_priority(verdict: Verdict, p: Plan) -> budget.Priority:
    if not p.record:
        return budget.Priority.ACTIVE  # the reasons changed, the verdict did not
    return budget.Priority.FINDING if verdict.kind in RECLAIMABLE_KINDS else budget.Priority.VERDICT


def _camel(kind: str) -> str:
    return "".join(part.capitalize() for part in kind.split("_"))
