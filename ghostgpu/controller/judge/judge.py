"""The judge room's one entry point, `Judge.judge`: each observed workload's evidence -> verdict
(`verdict.decide`, pure) -> plan (`planner.plan`, pure: the risk gate and the config's switches).

Nothing here talks to the cluster. Its state is the settled-plan memo: a workload that its
utilization window alone keeps settling, with the same cached objects, keeps last poll's plan (at
50,000 pods, plan() and the recorded-verdict reads were a per-workload cost of every poll). On the
leader it also hands the act room what to write: reclaims and escalations in order, and the
verdict writes (the evidence of a window-settled verdict is assembled only then).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ghostgpu.autonomy import AutonomyConfig
from ghostgpu.config import ControllerConfig
from ghostgpu.controller import keys
from ghostgpu.controller.inventory import PodView, Workload, WorkloadRef, dra_gpus_of
from ghostgpu.controller.judge import idle as idle_sessions
from ghostgpu.controller.judge import planner
from ghostgpu.controller.judge.planner import Plan
from ghostgpu.controller.judge.recorded import reasons_changed, recorded, verdict_of
from ghostgpu.controller.observe.evidence import WorkloadState, assemble, policy_from_config
from ghostgpu.controller.observe.observer import Observation
from ghostgpu.controller.poll import Judged, PollResult, Snapshot
from ghostgpu.verdict import Evidence, Verdict, VerdictKind, decide, window_verdict_from_runs

# Plans that do nothing beyond recording the verdict (see planner.ActionKind).
NO_ACTION = frozenset({"none", "would-reclaim", "disabled", "shared-claim"})

# What the act room does for one workload: apply()'s arguments.
Apply = tuple[Workload, list[PodView], WorkloadState, Verdict, Evidence, Plan]
# A decision-log row (books.decisions.DecisionRow): ref, verdict, reasons, GPUs, action.
Row = tuple[WorkloadRef, str, tuple[str, ...], float, str]


class SettledPlan(NamedTuple):
    """What was planned for a one-pod workload whose utilization window settled its verdict, and
    the objects it was planned from: while they are the same objects, the plan is."""

    workload: Workload  # the watch cache's object
    pod: PodView
    verdict: Verdict
    team: str | None
    plan: Plan
    reasons_changed: bool
    kind: str
    gpus: float


@dataclass
class Rulings:
    """The judge's answer for one poll."""

    rows: list[Row] = field(default_factory=list)  # every judged workload, for the decision log
    actions: list[Apply] = field(default_factory=list)  # leader: reclaims and escalations, in order
    records: list[Apply] = field(default_factory=list)  # leader: verdict writes, nothing stopped
    idle: list[idle_sessions.Candidate] = field(default_factory=list)  # judge/idle.py


class Judge:
    def __init__(self, cfg: ControllerConfig, autonomy: AutonomyConfig) -> None:
        self.cfg = cfg
        self.policy = policy_from_config(cfg)
        self.autonomy = autonomy
        self.settled: dict[WorkloadRef, SettledPlan] = {}
        self.idle_before: set[WorkloadRef] | None = None  # last poll's idle-session candidates

    def judge(self, obs: Observation, snap: Snapshot, result: PollResult, *, leader: bool) -> Rulings:
        out = Rulings()
        rows = out.rows
        zero, window = self.policy.zero_threshold, self.cfg.window
        teams = {ns: labels.get(keys.TEAM_LABEL) for ns, labels in snap.namespaces.items()}
        settled = self.settled
        if len(settled) > len(obs.eligible):  # workloads that left, or are not judged this poll
            self.settled = settled = {r: m for r, m in settled.items() if r in obs.eligible}
        for ref, (wl, pods, st) in obs.eligible.items():
            processes = obs.processes[ref]
            # Most workloads are plainly busy (or plainly unknown): their utilization window settles
            # the verdict, which is decide()'s own first step (verdict.window_verdict), so their
            # evidence is assembled only if it is written. Those with processes listed (an
            # all-zero window) take the whole of decide().
            evidence: Evidence | None = None
            verdict = (
                window_verdict_from_runs(*st.ring.runs(zero), self.policy) if processes is None else None
            )
            if verdict is None:
                evidence = assemble(
                    st, window=window, processes=processes, faults=obs.faults[ref], memory=obs.memory.get(ref)
                )
                verdict = decide(evidence, self.policy)
            team = teams.get(ref.namespace)
            memo = settled.get(ref)
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
                p, changed, kind, gpus = memo.plan, memo.reasons_changed, memo.kind, memo.gpus
            else:
                on = recorded(wl, pods)
                # An owner with no actuator carries no verdict annotation (nothing is written to it):
                # its previous verdict is this process's memory, so its Events follow verdict changes.
                previous = st.last_verdict if wl.no_actuator else verdict_of(on)
                # A GPU claim another pod also uses: stopping this workload frees nothing (checked
                # only for a reclaimable verdict; most pods have no claim peers at all).
                shared = (
                    planner.shared_claim(pods, (result.pods_of or {}).get(ref, ()))
                    if verdict.reclaimable
                    else None
                )
                # A DRA workload's GPUs are its pods' devices: its template names none (inventory).
                dra = dra_gpus_of(pods)
                p = planner.plan(
                    wl,
                    verdict,
                    previous,
                    self.cfg,
                    team=team,
                    autonomy=self.autonomy,
                    shared=shared,
                    dra_gpus=dra,
                )
                # An owner with no actuator gets no reasons-only update: nothing is written to it.
                changed = not wl.no_actuator and reasons_changed(on, verdict)
                kind = verdict.kind.value
                gpus = sum(wl.gpus_per_pod.values()) * len(pods) + dra
                if evidence is None and len(pods) == 1 and not wl.no_actuator:
                    settled[ref] = SettledPlan(wl, pods[0], verdict, team, p, changed, kind, gpus)
                elif memo is not None:
                    del settled[ref]
            judged = result.judged[ref] = Judged(wl, pods, verdict, evidence, p, kind, st)
            result.states[kind] += 1
            st.last_verdict = verdict.kind
            # Reasons are StrEnum members: equal to, and serialised as, their string values.
            rows.append((ref, kind, verdict.reasons, gpus, p.action))  # type: ignore[arg-type]
            if not leader or (p.action in NO_ACTION and not (p.record or changed)):
                continue  # most workloads on most polls: nothing to write
            if evidence is None:  # settled by the window, and now written: the same evidence
                judged.evidence = evidence = assemble(
                    st, window=window, processes=None, faults=obs.faults[ref]
                )
            (out.records if p.action in NO_ACTION else out.actions).append(
                (wl, pods, st, verdict, evidence, p)
            )
        # result.states counts the judged workloads' kinds (and, under other names, those not judged).
        held = result.states[VerdictKind.IDLE_HELD.value]
        out.idle = idle_sessions.candidates(
            self.cfg, result.judged, teams, self.idle_before, snap.namespaces, held=held
        )
        self.idle_before = {c.workload.ref for c in out.idle}
        return out
