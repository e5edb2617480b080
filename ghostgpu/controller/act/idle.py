"""Idle sessions in the act room (docs/idle-sessions.md): the leader's warnings, cancellations,
snoozes and stops of IDLE_HELD workloads that `controller.idleSessions` covers.

Per poll, for the judge's candidates (`judge.IdleCandidate`): one history query per distinct
window (signals/idle_history.py) -> the ladder and the step (idle_sessions.py, pure) -> writes:

- warn: the owner's idle-since / warned-at / deadline annotations, a Warning Event saying the class,
  what keeps it alive, the GPUs and GPU-hours held, the deadline and how to keep it;
- warned: nothing new, unless a snooze moved the deadline (annotations, the snooze's record);
- clear: the annotations removed, an Event saying what moved;
- hold: nothing (a signal is unknown);
- reread: the history read again over after + warnBefore, the step taken again;
- stop: `planner.plan_idle_stop` (the risk gate, typed IDLE_HELD), then the same stop, eviction or
  escalation as every reclaim (Stopper: actuator table, GitOps pre-flight, revert mark, record for
  `ghostgpu restore`), GPU-hours counted by class.

The gauge `ghostgpu_idle_session_deadline_seconds` carries every warned (and, in shadow, would-be)
session; the PrometheusRule's GhostGpuIdleSessionWarned alert reads it. A failed history query
fails every candidate of its window: held, never stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ghostgpu.config import ControllerConfig
from ghostgpu.controller.inventory import WorkloadRef
from ghostgpu.controller.judge.idle import Candidate
from ghostgpu.controller.judge.planner import plan_idle_stop
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.idle_sessions import (
    IDLE_DEADLINE,
    IDLE_SINCE,
    IDLE_WARNED_AT,
    KEEP_HONOURED,
    KEEP_UNTIL,
    Record,
    Step,
    climb,
    format_time,
    gpu_hours,
    next_step,
    record_annotations,
    record_of,
    snooze_of,
    warning_message,
)
from ghostgpu.signals.idle_history import PodHistory, history_query, parse_history, workload_history
from ghostgpu.signals.prometheus import PrometheusClient, PrometheusError
from ghostgpu.verdict import VerdictKind

if TYPE_CHECKING:
    from ghostgpu.controller.act.actor import Actor

log = logging.getLogger("ghostgpu.controller")
RECORD_KEYS = (IDLE_SINCE, IDLE_WARNED_AT, IDLE_DEADLINE, KEEP_HONOURED)
LOOKBACK_FACTOR = 2.0  # the clock looks this many `after + warnBefore` back for the end of the work


class IdleSessions:
    def __init__(
        self,
        cfg: ControllerConfig,
        *,
        actor: Actor,
        prometheus: PrometheusClient | None,
        metrics: ControllerMetrics,
        clock: Callable[[], float],
    ) -> None:
        self.cfg = cfg
        self.actor = actor
        self.prometheus = prometheus
        self.metrics = metrics
        self.clock = clock
        # Stops the risk gate handed to a person: escalated once (Event, annotation, webhook), not
        # again every poll while the deadline stays passed; forgotten when the session is cleared.
        self.escalated: set[WorkloadRef] = set()

    async def tend(self, candidates: Sequence[Candidate]) -> list[tuple[Candidate, Step]]:
        now = self.clock()
        self.metrics.idle_sessions.clear()  # the gauge says this poll's sessions, none left over
        looks: list[_Look] = []
        for window, group in _by_window(candidates).items():
            history = await self._history(group, window)
            looks.extend([await self._look(c, history, window, now) for c in group])
        # Sessions whose work ended before the ladder's window are read again over after +
        # warnBefore: one query per such span for all of them, as for the ladder. One per session
        # made a poll's queries grow with the sessions waiting at their deadline (every poll in
        # shadow, and while a stop is escalated).
        rereads: dict[float, list[_Look]] = {}
        for lk in looks:
            if lk.step.action == "reread":
                rereads.setdefault(lk.c.policy.after_s + lk.c.policy.warn_before_s, []).append(lk)
        for full, group in rereads.items():
            history = await self._history([lk.c for lk in group], full)
            for lk in group:
                lk.step = self._climb(lk.c, history, full, now, lk.record, lk.annotations, lk.raw)
        done: list[tuple[Candidate, Step]] = []
        for lk in looks:
            step = _own_window_agrees(lk.c, lk.step)
            try:
                await self._apply(lk.c, step, now)
            except Exception as exc:  # one workload's failure must not stop the others
                log.exception("idle session", extra={"workload": str(lk.c.workload.ref), "error": str(exc)})
            done.append((lk.c, step))
        return done

    async def _history(self, group: Sequence[Candidate], window: float) -> dict[tuple[str, str], PodHistory]:
        if self.prometheus is None:
            return {}  # no Prometheus: every field missing, every rung unknown
        pods = [(p.namespace, p.name) for c in group for p in c.pods]
        preset = self.cfg.metrics.dcgm if self.cfg.metrics.preset == "dcgm" else self.cfg.metrics.hami
        after_warn = max(c.policy.after_s + c.policy.warn_before_s for c in group)
        query = history_query(
            preset,
            self.cfg.idle_sessions.cpu_source,
            self.cfg.metrics.agent_source,
            pods,
            window_s=window,
            lookback_s=LOOKBACK_FACTOR * after_warn,
            step_s=self.cfg.metrics.scrape_interval.seconds,
            zero_threshold=self.cfg.zero_threshold,
        )
        try:
            _, samples = await self.prometheus.query(query)
        except PrometheusError as exc:
            log.warning("idle-session history unreadable", extra={"error": str(exc)[:300]})
            return {}
        return parse_history(((s.labels, s.value) for s in samples), preset.namespace_label, preset.pod_label)

    async def _look(
        self, c: Candidate, history: dict[tuple[str, str], PodHistory], window: float, now: float
    ) -> _Look:
        wl = c.workload
        raw = wl.raw
        annotations = (raw.get("metadata") or {}).get("annotations") or {}
        record = record_of(annotations)
        if not c.idle_held:
            why = f"the verdict is now {c.verdict.kind.value}"
            step = Step(action="clear" if record is not None else "none", reason=why)
            return _Look(c, step, record, annotations, raw)
        if KEEP_UNTIL in annotations:
            # Who set the snooze and when are in managedFields, which the watch cache drops.
            raw = await self.actor.cluster.get(wl.ref)
        step = self._climb(c, history, window, now, record, annotations, raw)
        return _Look(c, step, record, annotations, raw)

    def _climb(
        self,
        c: Candidate,
        history: dict[tuple[str, str], PodHistory],
        window: float,
        now: float,
        record: Record | None,
        annotations: dict[str, Any],
        raw: dict[str, Any],
    ) -> Step:
        wh = workload_history([(p.namespace, p.name) for p in c.pods], history)
        scrape = self.cfg.metrics.scrape_interval.seconds
        ev = wh.evidence(
            window_s=window,
            expected_samples=max(1, int(window // scrape)),
            lookback_s=LOOKBACK_FACTOR * (c.policy.after_s + c.policy.warn_before_s),
            now=now,
        )
        ladder = climb(ev, c.policy, now=now, zero_threshold=self.cfg.zero_threshold)
        snooze = None
        if KEEP_UNTIL in annotations:
            base = record.warned_at if record is not None else now
            snooze = snooze_of(raw, max_snooze_s=c.policy.max_snooze_s, base=base)
        return next_step(c.policy, wh.session_class, ladder, record, snooze, now=now)

    async def _apply(self, c: Candidate, step: Step, now: float) -> None:
        wl, ref = c.workload, c.workload.ref
        cls = step.cls.value if step.cls is not None else "unknown"
        gpus = sum(wl.gpus_per_pod.values()) * len(c.pods)
        labels = (ref.namespace, ref.short, cls, c.team or "")
        if step.action in ("warn", "warned", "hold") and step.record is not None:
            self.metrics.idle_sessions.labels(*labels, "warned").set(step.record.deadline)
        elif step.action in ("would-warn", "would-stop"):
            self.metrics.idle_sessions.labels(*labels, step.action).set(now)
        if step.action == "warn":
            assert step.record is not None and step.cls is not None
            await self.actor.annotate_workload(wl, c.pods, record_annotations(step.record))
            message = warning_message(step.cls, list(c.programs) or [cls], gpus, step.record, now=now)
            if c.policy.note:  # how the Namespace's ghostgpu.io/idle-after moved `after`
                message += f" ({c.policy.note})"
            await self.actor.cluster.event(
                wl.raw, reason="IdleSessionWarning", message=message, type_="Warning"
            )
        elif step.action == "warned" and step.record is not None:
            current = record_of((wl.raw.get("metadata") or {}).get("annotations") or {})
            if current is not None and current.deadline != step.record.deadline:
                notes = {**record_annotations(step.record), KEEP_HONOURED: step.reason[:200]}
                await self.actor.annotate_workload(wl, c.pods, notes)
                await self.actor.cluster.event(
                    wl.raw, reason="IdleSessionSnoozed", message=f"idle session {step.reason}"
                )
        elif step.action == "clear":
            self.escalated.discard(ref)
            await self.actor.annotate_workload(wl, c.pods, dict.fromkeys(RECORD_KEYS))
            await self.actor.cluster.event(
                wl.raw, reason="IdleSessionActive", message=f"idle-session warning cancelled: {step.reason}"
            )
        elif step.action == "stop":
            await self._stop(c, step, gpus, cls, now)

    async def _stop(self, c: Candidate, step: Step, gpus: float, cls: str, now: float) -> None:
        wl = c.workload
        p = plan_idle_stop(wl, self.cfg, team=c.team, autonomy=self.cfg.autonomy)
        if p.action == "scale-to-zero":
            outcome = await self.actor.stops.stop(wl, c.verdict)
        elif p.action == "evict":
            outcome = await self.actor.evict(wl, c.pods, c.verdict)
        elif p.action == "escalate" and p.decision is not None:
            if wl.ref in self.escalated:
                return
            self.escalated.add(wl.ref)
            outcome = await self.actor.escalate_plan(wl, c.pods, c.verdict, p)
        else:
            outcome = p.action
        if outcome in ("scaled-to-zero", "stopped", "evict-evicted") and step.record is not None:
            held = gpu_hours(gpus, step.record.idle_since, now)
            self.metrics.idle_session_gpu_hours.labels(wl.ref.namespace, cls).inc(held)
            await self.actor.cluster.event(
                wl.raw,
                reason="IdleSessionStopped",
                message=f"idle {cls} session stopped at its deadline {format_time(step.record.deadline)} "
                f"after {held:g} GPU-hours idle; `ghostgpu restore` brings it back",
                type_="Warning",
            )
            # The warning is spent: a restored session starts a new idle clock of its own.
            await self.actor.annotate_workload(wl, c.pods, dict.fromkeys(RECORD_KEYS))


@dataclass
class _Look:
    """One candidate's step from the ladder's read, and what a re-read climbs again with."""

    c: Candidate
    step: Step
    record: Record | None
    annotations: dict[str, Any]
    raw: dict[str, Any]


def _own_window_agrees(c: Candidate, step: Step) -> Step:
    """Belt and braces: this controller's own window must say IDLE_HELD too before a stop (after
    a restart it waits for its long window; the history alone never stops a session)."""
    if step.action == "stop" and c.verdict.kind is not VerdictKind.IDLE_HELD:
        why = f"the stop waits for this controller's window to say IDLE_HELD (now {c.verdict.kind.value})"
        return step.model_copy(update={"action": "hold", "reason": why})
    return step


def _by_window(candidates: Sequence[Candidate]) -> dict[float, list[Candidate]]:
    out: dict[float, list[Candidate]] = {}
    for c in candidates:
        out.setdefault(c.policy.after_s, []).append(c)
    return out
