"""Per-workload memory between polls and the assembly of `verdict.Evidence` (pure).

The controller keeps, per workload, the utilization ring and the artifact history; each poll
pushes one entry to each, then `assemble()` turns them plus this poll's processes and faults into
the `Evidence` that `verdict.decide()` judges. `evidence_json()` is the short form written to the
`ghostgpu.io/evidence` annotation and the decision log.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime

from ghostgpu.config import ControllerConfig
from ghostgpu.controller.inventory import PodView, Workload
from ghostgpu.signals.artifacts import ArtifactHistory, ArtifactTarget
from ghostgpu.signals.utilization import UtilizationRing
from ghostgpu.verdict import (
    ArtifactObservation,
    ArtifactSizes,
    ArtifactsNotDeclared,
    Evidence,
    FaultEvidence,
    FaultObservation,
    GpuMemory,
    ProcessCounts,
    ProcessInfo,
    Signal,
    SignalFailure,
    Verdict,
    VerdictKind,
    VerdictPolicy,
)


def policy_from_config(cfg: ControllerConfig) -> VerdictPolicy:
    return VerdictPolicy(
        window=cfg.window,
        zero_threshold=cfg.zero_threshold,
        hold_after=cfg.long_window,
        required=frozenset(Signal(s) for s in cfg.required_signals),
        processes=cfg.processes.policy(),
        memory_free_bytes=int(cfg.gpu_memory.free_at_most.value),
        memory_held_bytes=int(cfg.gpu_memory.held_from.value),
    )


@dataclass(slots=True)
class WorkloadState:
    """What the controller remembers about one workload (reset when its uid changes). The observe
    room owns it; the act room keeps its once-per-verdict announcements here too (escalated_for,
    blocked_for), so they go when the workload does."""

    uid: str
    ring: UtilizationRing
    artifacts: ArtifactHistory
    artifact_target: ArtifactTarget | SignalFailure | None = None
    last_verdict: VerdictKind | None = None
    last_reasons: tuple[str, ...] = ()
    verdict_since: datetime | None = None
    escalated_for: VerdictKind | None = None  # escalate once per verdict, not every poll
    blocked_for: VerdictKind | None = None  # announce a PDB-blocked eviction once per verdict
    pod_uids: tuple[str, ...] = ()  # sorted; kept as is while the pods stay the same
    past_grace: bool = False  # these pods (pod_uids) are past the start-up grace
    # The most DRA devices one of its running pods held when last seen (claims.py): after a reclaim
    # its pods and their claims are gone, and the books count the GPU-hours the stop holds free
    # from this. Memory only: a controller started after the reclaim does not know it.
    dra_gpus_per_pod: float = 0.0
    # The one-pod workload's cached objects when it was last found eligible, past its grace
    # (Observer.eligible): while the watch cache hands out these same objects, every check of
    # eligibility answers as it did then, so they are not made again.
    # Two fields, not a tuple: 16 bytes per workload, not 64.
    eligible_workload: Workload | None = None
    eligible_pod: PodView | None = None

    @classmethod
    def new(cls, uid: str, cfg: ControllerConfig) -> WorkloadState:
        return cls(
            uid=uid,
            ring=UtilizationRing.allocated(max(cfg.long_window, cfg.window), cfg.zero_threshold),
            artifacts=ArtifactHistory(size=cfg.window),
        )

    def reset_window(self) -> None:
        """Forget samples (new pods, grace, scaled to zero): old zeros must never count again."""
        self.ring.clear()
        self.artifacts.clear()


def assemble(
    state: WorkloadState,
    *,
    window: int,
    processes: tuple[ProcessInfo, ...] | ProcessCounts | SignalFailure | None,
    faults: FaultObservation,
    memory: GpuMemory | SignalFailure | None = None,
) -> Evidence:
    artifacts: ArtifactObservation
    if state.artifact_target is None:
        artifacts = ArtifactsNotDeclared()
    elif isinstance(state.artifact_target, SignalFailure):
        artifacts = state.artifact_target  # the annotation itself is invalid: a failed signal
    else:
        artifacts = state.artifacts.observation(window)
    samples = state.ring.samples
    if _already_valid(samples, processes, artifacts, faults) and (
        memory is None or isinstance(memory, GpuMemory | SignalFailure)
    ):
        # Every part is already a validated model or a finite float >= 0: the same Evidence that
        # validation would build, without ~20 pydantic validations per workload per poll.
        return Evidence.model_construct(
            utilization=samples, processes=processes, artifacts=artifacts, faults=faults, memory=memory
        )
    return Evidence(
        utilization=samples, processes=processes, artifacts=artifacts, faults=faults, memory=memory
    )


def _already_valid(
    samples: tuple[object, ...],
    processes: object,
    artifacts: object,
    faults: object,
) -> bool:
    """True when Evidence(...) would accept these values unchanged (anything else, e.g. a NaN or
    an int sample, takes the validating constructor, which coerces or raises as before)."""
    for v in samples:
        if type(v) is float:
            if not 0.0 <= v < math.inf:
                return False
        elif not isinstance(v, SignalFailure):
            return False
    if not (
        processes is None
        or isinstance(processes, SignalFailure | ProcessCounts)
        or (type(processes) is tuple and all(isinstance(p, ProcessInfo) for p in processes))
    ):
        return False
    return isinstance(artifacts, ArtifactsNotDeclared | ArtifactSizes | SignalFailure) and isinstance(
        faults, FaultEvidence | SignalFailure
    )


def _sample(s: float | SignalFailure) -> float | str:
    return round(s, 1) if not isinstance(s, SignalFailure) else f"!{s.reason.value}"


def evidence_summary(evidence: Evidence, verdict: Verdict, window: int) -> dict[str, object]:
    """Short, stable JSON-able summary (annotation and decision log)."""
    out: dict[str, object] = {
        "verdict": verdict.kind.value,
        "reasons": [r.value for r in verdict.reasons],
        "util": [_sample(s) for s in evidence.utilization[-window:]],
    }
    procs = evidence.processes
    if isinstance(procs, SignalFailure):
        out["procs"] = f"!{procs.reason.value}"
    elif procs is not None:
        # live: what the verdict counted as work (0 when only holders such as `sleep infinity` run).
        if isinstance(procs, ProcessCounts):  # the node agent's counts
            total, dead = procs.total, procs.defunct
        else:
            total, dead = len(procs), sum(p.defunct for p in procs)
        live = verdict.live_processes if verdict.live_processes is not None else total - dead
        held = total - dead - live
        out["procs"] = {"live": live, "defunct": dead, **({"holders": held} if held else {})}
        if isinstance(procs, ProcessCounts) and procs.programs:
            out["procs"]["programs"] = list(procs.programs)  # type: ignore[index]
    memory = evidence.memory
    if isinstance(memory, SignalFailure):
        out["gpu_mem"] = f"!{memory.reason.value}"
    elif isinstance(memory, GpuMemory):
        out["gpu_mem_mib"] = round(memory.used_bytes / (1 << 20))
    art = evidence.artifacts
    if isinstance(art, SignalFailure):
        out["artifacts"] = f"!{art.reason.value}"
    elif isinstance(art, ArtifactSizes):
        out["artifacts"] = {"start": art.start_bytes, "end": art.end_bytes, "marker": art.completion_marker}
    faults = evidence.faults
    if isinstance(faults, SignalFailure):
        out["faults"] = f"!{faults.reason.value}"
    elif isinstance(faults, FaultEvidence) and (faults.xid_events or faults.restarts):
        out["faults"] = {
            "xid": [x.code for x in faults.xid_events],
            "restarts": [f"{r.container}:{r.reason}" for r in faults.restarts],
        }
    return out


def evidence_json(summary: dict[str, object]) -> str:
    return json.dumps(summary, sort_keys=True, separators=(",", ":"))
