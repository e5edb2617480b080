"""Fault evidence: container restarts and termination reasons from pod status, plus the XID
events that came back with the utilization query (so faults cost no extra round trip).

Pod status is read from the watch cache, so this source cannot time out; a malformed status is a
PARSE_ERROR failure rather than "no faults".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ghostgpu.verdict import (
    ContainerRestart,
    FailureReason,
    FaultEvidence,
    FaultObservation,
    SignalFailure,
    XidEvent,
)

# A container that is *currently* waiting for one of these has crashed, even before it restarts.
CRASH_WAITING_REASONS = frozenset({"CrashLoopBackOff", "RunContainerError", "CreateContainerError"})


def restarts_from_pod_status(status: Mapping[str, Any]) -> tuple[ContainerRestart, ...]:
    """Every container termination that pod status records (current or last state).

    Raises ValueError on a status that does not have the documented shape.
    """
    out: list[ContainerRestart] = []
    statuses = list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or [])
    for cs in statuses:
        if not isinstance(cs, Mapping) or "name" not in cs:
            raise ValueError("containerStatuses entry without a name")
        name = str(cs["name"])
        restart_count = int(cs.get("restartCount") or 0)
        state = cs.get("state") or {}
        last = cs.get("lastState") or {}
        is_init = cs in (status.get("initContainerStatuses") or [])
        term = state.get("terminated")
        # An init container that Completed is how init containers are meant to end.
        if term and not (is_init and term.get("reason") == "Completed"):
            out.append(_restart(name, term))
        last_term = last.get("terminated")
        if last_term and restart_count > 0:
            out.append(_restart(name, last_term))
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in CRASH_WAITING_REASONS and not last_term:
            out.append(ContainerRestart(container=name, reason=str(waiting["reason"])))
    return tuple(out)


def _restart(container: str, term: Mapping[str, Any]) -> ContainerRestart:
    code = term.get("exitCode")
    return ContainerRestart(
        container=container,
        reason=str(term.get("reason") or ("Completed" if code == 0 else "Error")),
        exit_code=int(code) if code is not None else None,
    )


# One pod's terminations, or why its status could not be read. Computed once per pod update
# (the controller's pod cache), not once per poll.
PodFaults = tuple[ContainerRestart, ...] | SignalFailure


def pod_faults(status: Mapping[str, Any]) -> PodFaults:
    try:
        return restarts_from_pod_status(status)
    except (ValueError, TypeError, AttributeError) as exc:
        return SignalFailure(reason=FailureReason.PARSE_ERROR, detail=f"pod status: {exc}"[:200])


def workload_faults(per_pod: Iterable[PodFaults], xids: Iterable[XidEvent]) -> FaultObservation:
    """Faults of a workload from its pods' `pod_faults` and all XIDs on their GPUs."""
    restarts: list[ContainerRestart] = []
    for faults in per_pod:
        if isinstance(faults, SignalFailure):
            return faults
        restarts.extend(faults)
    xid_events = tuple(xids)
    if not xid_events and not restarts:
        return NO_FAULTS  # the common case; frozen, so one shared instance is safe
    return FaultEvidence(xid_events=xid_events, restarts=tuple(restarts))


def fault_observation(
    pod_statuses: Iterable[Mapping[str, Any]], xids: Iterable[XidEvent]
) -> FaultObservation:
    """Faults of a workload: all its pods' terminations and all XIDs on their GPUs."""
    return workload_faults((pod_faults(s) for s in pod_statuses), xids)


NO_FAULTS = FaultEvidence()  # no termination, no XID
