"""Which judged workloads the idle-session policy looks at this poll (docs/idle-sessions.md): pure.

An IDLE_HELD workload whose team's `controller.idleSessions` mode is not off, and any workload that
carries an idle-session warning (so that one whose verdict moved on has its warning cleared). The
act room (act/idle.py) reads their history and takes the step.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ghostgpu.config import ControllerConfig
from ghostgpu.controller.inventory import PodView, Workload, WorkloadRef
from ghostgpu.controller.poll import Judged
from ghostgpu.idle_policy import ResolvedIdlePolicy
from ghostgpu.idle_sessions import IDLE_DEADLINE
from ghostgpu.verdict import ProcessCounts, Reason, Verdict, VerdictKind


@dataclass(frozen=True)
class Candidate:
    workload: Workload
    pods: list[PodView]
    verdict: Verdict
    policy: ResolvedIdlePolicy
    team: str | None
    # False: a warning is recorded on it and its verdict saw work since (to clear). True: IDLE_HELD,
    # or warned and its window shows no work yet (the stop still waits for IDLE_HELD).
    idle_held: bool
    programs: tuple[str, ...] = ()  # what keeps it alive (the verdict's process counts)


def candidates(
    cfg: ControllerConfig,
    judged: Mapping[WorkloadRef, Judged],
    teams: Mapping[str, str | None],
    before: Collection[WorkloadRef] | None,
    namespaces: Mapping[str, Mapping[str, str]] | None = None,
    held: int | None = None,
) -> list[Candidate]:
    """`before`: last poll's candidates (a warning is only ever written to one), so only they are
    looked at for a recorded warning; None (the first poll) looks at every workload, which finds the
    warnings a restarted controller left. `namespaces`: name -> its labels and idle-after
    annotation (inventory.namespace_view), which moves `after` within the file's bounds. `held`:
    how many of `judged` are IDLE_HELD, when the caller counted them (None: not known)."""
    idle = cfg.idle_sessions
    namespaces = namespaces or {}
    modes = {idle.mode} | {t.mode for t in idle.teams.values() if t.mode is not None}
    if modes == {"off"} and not before:
        # The policy applies nowhere: no workload is looked at (the fleet's common case). Switched
        # off while this process ran, last poll's candidates are looked at once more, to withdraw
        # their warnings.
        return []
    if held == 0 and before is not None and not before:
        # No IDLE_HELD verdict and no candidate last poll (a busy fleet's every poll): the loop
        # below would pass over every judged workload and find none.
        return []
    out: list[Candidate] = []
    for j in judged.values():
        wl = j.workload
        held = j.verdict.kind is VerdictKind.IDLE_HELD
        if not held and ((before is not None and wl.ref not in before) or not _warned(wl)):
            continue
        team = teams.get(wl.ref.namespace)
        policy = idle.for_team(team).with_namespace(namespaces.get(wl.ref.namespace))
        if held and policy.mode == "off" and not _warned(wl):
            continue
        # A warned workload whose own window shows no work but has not reached IDLE_HELD (a
        # restarted controller's window warming up, a signal failed) goes on being judged from
        # the history, which survived the restart; only work its window saw clears the warning.
        held = held or not _worked(j.verdict)
        procs = j.evidence.processes if j.evidence is not None else None
        programs = procs.programs if isinstance(procs, ProcessCounts) else ()
        out.append(Candidate(wl, j.pods, j.verdict, policy, team, held, programs))
    return out


def _worked(verdict: Verdict) -> bool:
    """The verdict saw work (or the session ended: a reclaimable verdict's own path takes it)."""
    if verdict.kind is VerdictKind.UNKNOWN:
        return False
    if verdict.kind is VerdictKind.ACTIVE:
        return Reason.UTILIZATION_NONZERO in verdict.reasons or Reason.ARTIFACTS_CHANGED in verdict.reasons
    return verdict.kind is not VerdictKind.IDLE_HELD


def _warned(wl: Workload) -> bool:
    if wl.no_actuator:
        return False  # nothing is ever written to it
    return IDLE_DEADLINE in ((wl.raw.get("metadata") or {}).get("annotations") or {})
