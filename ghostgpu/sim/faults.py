"""Signal-fault injection for the benchmark: what production monitoring actually delivers.

`inject_faults` turns readings into explicit `SignalFailure`s at a given rate (a dropped sample, a
stale series, a failed exec of the process listing, an unreadable bucket), the way ghostgpu's signal
sources report them. `read_silently` shows the alternative docs/design.md#signals forbids: a
naive pipeline that reads a failure as zero / empty / no growth. Comparing the two is the point of
`--fault-rate`.
"""

from __future__ import annotations

import random

from ghostgpu.verdict import (
    ArtifactSizes,
    ArtifactsNotDeclared,
    Evidence,
    FailureReason,
    FaultEvidence,
    SignalFailure,
)

UTILIZATION_FAILURES = (FailureReason.MISSING, FailureReason.STALE, FailureReason.HTTP_ERROR)
PROCESS_FAILURES = (FailureReason.EXEC_ERROR, FailureReason.TIMEOUT)
ARTIFACT_FAILURES = (FailureReason.HTTP_ERROR, FailureReason.FORBIDDEN, FailureReason.TIMEOUT)


def fault_rng(seed: int) -> random.Random:
    """A stream separate from the fleet's, so the clean fleet is identical whatever the fault rate."""
    return random.Random(f"ghostgpu-faults:{seed}")


def inject_faults(evidence: Evidence, rate: float, rng: random.Random) -> Evidence:
    """Each reading fails independently with probability `rate` (every source, every sample)."""
    if rate <= 0:
        return evidence
    utilization = tuple(
        SignalFailure(reason=rng.choice(UTILIZATION_FAILURES)) if rng.random() < rate else s
        for s in evidence.utilization
    )
    processes = evidence.processes
    if isinstance(processes, tuple) and rng.random() < rate:
        processes = SignalFailure(reason=rng.choice(PROCESS_FAILURES))
    artifacts = evidence.artifacts
    if isinstance(artifacts, ArtifactSizes) and rng.random() < rate:
        artifacts = SignalFailure(reason=rng.choice(ARTIFACT_FAILURES))
    faults = evidence.faults
    if isinstance(faults, FaultEvidence) and rng.random() < rate:
        faults = SignalFailure(reason=FailureReason.HTTP_ERROR)
    # model_copy skips re-validation: every value above is already a valid member of its union.
    return evidence.model_copy(
        update={"utilization": utilization, "processes": processes, "artifacts": artifacts, "faults": faults}
    )


def read_silently(evidence: Evidence) -> Evidence:
    """The anti-pattern: a failed reading taken as 0 %, an empty process table, no output growth."""
    return evidence.model_copy(
        update={
            "utilization": tuple(0.0 if isinstance(s, SignalFailure) else s for s in evidence.utilization),
            "processes": () if isinstance(evidence.processes, SignalFailure) else evidence.processes,
            "artifacts": (
                ArtifactsNotDeclared()
                if isinstance(evidence.artifacts, SignalFailure)
                else evidence.artifacts
            ),
            "faults": FaultEvidence() if isinstance(evidence.faults, SignalFailure) else evidence.faults,
        }
    )
