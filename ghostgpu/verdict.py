"""The idleness verdict: one pure, deterministic function of the evidence (DESIGN §4).

No I/O, no clock, no Kubernetes. The controller's signal sources build an `Evidence`, the
benchmark's simulator builds the same `Evidence` from synthetic traces, and both call `decide()`:
there is exactly one implementation of every rule.

Safety asymmetry (why the rules look the way they do): a false reclaim kills live work and cannot
be undone, a false keep costs one more poll. So every doubt resolves to a non-reclaimable verdict:
a failed or missing required signal is `UNKNOWN`, any sign of life is `ACTIVE` or `IDLE_HELD`.

Utilization samples are oldest first, newest last. `decide()` reads the newest `policy.window`
samples for the verdict; older samples, when the caller keeps them, only feed the long window that
separates `IDLE_HELD` (zero for `policy.long_window` samples, a live process remains: a human
decides) from an `ACTIVE` job in a short batch gap (dataloader stall, checkpoint write).
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- signals -------------------------------------------------------------------------------------


class Signal(StrEnum):
    UTILIZATION = "utilization"
    PROCESSES = "processes"
    ARTIFACTS = "artifacts"
    FAULTS = "faults"


class FailureReason(StrEnum):
    MISSING = "missing"  # no sample for this poll (series absent, pod not scraped)
    STALE = "stale"  # a sample exists but is older than the poll allows
    HTTP_ERROR = "http-error"
    TIMEOUT = "timeout"
    EXEC_ERROR = "exec-error"  # process listing could not run in the container
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not-found"
    PARSE_ERROR = "parse-error"
    OTHER = "other"


class SignalFailure(_Frozen):
    """An explicit failure of one signal: sources return this, never a silent zero."""

    kind: Literal["failure"] = "failure"
    reason: FailureReason
    detail: str = ""


# A utilization reading in percent (0-100); NaN/inf are rejected at the boundary.
UtilizationValue = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
UtilizationSample = UtilizationValue | SignalFailure

DEFUNCT_STATES = frozenset({"Z", "X"})


class ProcessInfo(_Frozen):
    pid: int
    state: str  # ps STAT, e.g. "R", "S", "Sl", "Z", "Z+"; the first letter is the state
    command: str = ""

    @property
    def defunct(self) -> bool:
        # Zombie (Z) or dead (X): holds a pid table slot, does no work, cannot hold a GPU context.
        return self.state[:1].upper() in DEFUNCT_STATES


class ArtifactsNotDeclared(_Frozen):
    """The workload has no `ghostgpu.io/artifacts` annotation: nothing to check."""

    kind: Literal["not-declared"] = "not-declared"


class ArtifactSizes(_Frozen):
    """Total size of the declared output location at window start and window end."""

    kind: Literal["sizes"] = "sizes"
    start_bytes: int = Field(ge=0)
    end_bytes: int = Field(ge=0)
    completion_marker: bool = False  # e.g. a `_SUCCESS` object exists

    @property
    def changed(self) -> bool:
        # Shrinking counts too: something is rotating or rewriting output, i.e. still working.
        return self.end_bytes != self.start_bytes


ArtifactObservation = Annotated[
    ArtifactsNotDeclared | ArtifactSizes | SignalFailure, Field(discriminator="kind")
]


class XidEvent(_Frozen):
    code: int = Field(ge=0)
    gpu: str = ""  # UUID or index of the GPU that raised it


class ContainerRestart(_Frozen):
    container: str
    reason: str  # last termination reason: OOMKilled, Error, Completed, ContainerCannotRun, ...
    exit_code: int | None = None

    @property
    def crashed(self) -> bool:
        return self.reason != "Completed" or (self.exit_code not in (None, 0))


class FaultEvidence(_Frozen):
    kind: Literal["faults"] = "faults"
    xid_events: tuple[XidEvent, ...] = ()
    restarts: tuple[ContainerRestart, ...] = ()


FaultObservation = Annotated[FaultEvidence | SignalFailure, Field(discriminator="kind")]


class Evidence(_Frozen):
    """Everything known about one workload over one window."""

    utilization: tuple[UtilizationSample, ...] = ()  # oldest first, newest last
    # None = not collected (the controller lists processes only once the window is all zero).
    processes: tuple[ProcessInfo, ...] | SignalFailure | None = None
    artifacts: ArtifactObservation = ArtifactsNotDeclared()
    faults: FaultObservation = FaultEvidence()


# --- policy and verdict --------------------------------------------------------------------------


class Rule(StrEnum):
    SINGLE_UTIL = "single-util"  # published baseline: newest sample == 0
    WINDOW_UTIL = "window-util"  # published baseline: K samples all == 0
    PAPER_MULTI_SIGNAL = "paper-multi-signal"  # published: K zero ∧ process count == 0 ∧ no growth
    GHOSTGPU = "ghostgpu"  # default: defunct-aware, fault evidence, long-window hold


# The signals each rule looks at; `policy.required` only matters for these.
RULE_SIGNALS: dict[Rule, frozenset[Signal]] = {
    Rule.SINGLE_UTIL: frozenset({Signal.UTILIZATION}),
    Rule.WINDOW_UTIL: frozenset({Signal.UTILIZATION}),
    Rule.PAPER_MULTI_SIGNAL: frozenset({Signal.UTILIZATION, Signal.PROCESSES, Signal.ARTIFACTS}),
    Rule.GHOSTGPU: frozenset(Signal),
}


class VerdictPolicy(_Frozen):
    rule: Rule = Rule.GHOSTGPU
    window: int = Field(5, ge=1, le=1000)  # K: samples that must all be zero
    zero_threshold: float = Field(0.0, ge=0.0, le=100.0)  # a sample <= this counts as zero
    # Long window for IDLE_HELD, in samples (>= window; None = 3 x window). Shorter zero runs with a
    # live process are ACTIVE batch gaps. The caller keeps this many samples to ever reach IDLE_HELD.
    hold_after: int | None = Field(None, ge=1)
    # Faults only separate ZOMBIE_CRASHED from FINISHED_IDLE (both reclaimable), so not required.
    required: frozenset[Signal] = frozenset({Signal.UTILIZATION, Signal.PROCESSES, Signal.ARTIFACTS})
    # Page-retirement / row-remap notices: the GPU keeps working and processes survive them.
    ignored_xids: frozenset[int] = frozenset({63, 64, 92})

    @model_validator(mode="after")
    def _check(self) -> VerdictPolicy:
        if Signal.UTILIZATION not in self.required:
            raise ValueError("utilization is always required: it is what opens an idleness case")
        if self.hold_after is not None and self.hold_after < self.window:
            raise ValueError("hold_after must be >= window")
        return self

    @property
    def effective_window(self) -> int:
        return 1 if self.rule is Rule.SINGLE_UTIL else self.window

    @property
    def long_window(self) -> int:
        return self.hold_after if self.hold_after is not None else 3 * self.window


class VerdictKind(StrEnum):
    ACTIVE = "ACTIVE"
    FINISHED_IDLE = "FINISHED_IDLE"
    ZOMBIE_CRASHED = "ZOMBIE_CRASHED"
    IDLE_HELD = "IDLE_HELD"
    UNKNOWN = "UNKNOWN"


RECLAIMABLE_KINDS = frozenset({VerdictKind.FINISHED_IDLE, VerdictKind.ZOMBIE_CRASHED})


class Reason(StrEnum):
    INSUFFICIENT_SAMPLES = "insufficient-samples"
    UTILIZATION_FAILED = "utilization-failed"
    UTILIZATION_NONZERO = "utilization-nonzero"
    UTILIZATION_ZERO = "utilization-zero"
    PROCESSES_FAILED = "processes-failed"
    PROCESSES_NOT_COLLECTED = "processes-not-collected"
    PROCESSES_NOT_CHECKED = "processes-not-checked"  # unavailable but not required by the policy
    PROCESS_PRESENT = "process-present"  # paper rule: any process, defunct included
    LIVE_PROCESS = "live-process"
    IDLE_BELOW_HOLD = "idle-below-hold"  # zero run shorter than hold_after: a batch gap
    IDLE_LONG_WINDOW = "idle-long-window"  # zero run reached hold_after
    NO_PROCESS = "no-process"
    DEFUNCT_ONLY = "defunct-only"
    ARTIFACTS_FAILED = "artifacts-failed"
    ARTIFACTS_NOT_CHECKED = "artifacts-not-checked"
    ARTIFACTS_CHANGED = "artifacts-changed"
    ARTIFACTS_UNCHANGED = "artifacts-unchanged"
    ARTIFACTS_NOT_DECLARED = "artifacts-not-declared"
    COMPLETION_MARKER = "completion-marker"
    FAULTS_FAILED = "faults-failed"
    FAULT_XID = "fault-xid"
    FAULT_RESTART = "fault-restart"
    NO_FAULT = "no-fault"


class Verdict(_Frozen):
    kind: VerdictKind
    rule: Rule
    reasons: tuple[Reason, ...]
    live_processes: int | None = None  # None when the rule did not look at processes
    defunct_processes: int | None = None

    @property
    def reclaimable(self) -> bool:
        return self.kind in RECLAIMABLE_KINDS

    @property
    def warming_up(self) -> bool:
        """UNKNOWN only because the window is not full yet (a new workload, new pods, or a
        controller that just started). Nothing to record: it would overwrite the last real
        verdict with a placeholder and, at every controller start, rewrite every workload twice."""
        return self.kind is VerdictKind.UNKNOWN and self.reasons == (Reason.INSUFFICIENT_SAMPLES,)

    def to_annotation(self) -> str:
        """Compact, key-sorted JSON for the `ghostgpu.io/evidence` annotation (stable bytes)."""
        return json.dumps(
            {
                "kind": self.kind.value,
                "rule": self.rule.value,
                "reasons": [r.value for r in self.reasons],
                "live": self.live_processes,
                "defunct": self.defunct_processes,
            },
            separators=(",", ":"),
            sort_keys=True,
        )


# --- the decision --------------------------------------------------------------------------------


def _is_zero(sample: UtilizationSample, threshold: float) -> bool:
    return not isinstance(sample, SignalFailure) and sample <= threshold


def _zero_run(samples: tuple[UtilizationSample, ...], threshold: float) -> int:
    """Length of the all-zero run ending at the newest sample (a failure breaks the run)."""
    run = 0
    for sample in reversed(samples):
        if not _is_zero(sample, threshold):
            break
        run += 1
    return run


def decide(evidence: Evidence, policy: VerdictPolicy | None = None) -> Verdict:
    """The verdict for one workload over one window. Pure: same input, same output."""
    policy = policy or VerdictPolicy()
    rule = policy.rule
    required = policy.required & RULE_SIGNALS[rule]  # a rule never waits on a signal it ignores

    def verdict(
        kind: VerdictKind, *reasons: Reason, live: int | None = None, dead: int | None = None
    ) -> Verdict:
        # Built from this module's own typed values: nothing to validate (one per workload per poll).
        return Verdict.model_construct(
            kind=kind, rule=rule, reasons=reasons, live_processes=live, defunct_processes=dead
        )

    # 1. Utilization opens the case: the newest K samples, all present, all zero.
    k = policy.effective_window
    if len(evidence.utilization) < k:
        return verdict(VerdictKind.UNKNOWN, Reason.INSUFFICIENT_SAMPLES)
    window = evidence.utilization[-k:]
    if any(isinstance(s, SignalFailure) for s in window):
        return verdict(VerdictKind.UNKNOWN, Reason.UTILIZATION_FAILED)
    if not all(_is_zero(s, policy.zero_threshold) for s in window):
        return verdict(VerdictKind.ACTIVE, Reason.UTILIZATION_NONZERO)
    if rule in (Rule.SINGLE_UTIL, Rule.WINDOW_UTIL):
        return verdict(VerdictKind.FINISHED_IDLE, Reason.UTILIZATION_ZERO)

    # 2. The window is all zero. Any failed required signal now means "cannot prove idle".
    failed: list[Reason] = []
    procs = evidence.processes
    if isinstance(procs, SignalFailure) and Signal.PROCESSES in required:
        failed.append(Reason.PROCESSES_FAILED)
    elif procs is None and Signal.PROCESSES in required:
        failed.append(Reason.PROCESSES_NOT_COLLECTED)
    if isinstance(evidence.artifacts, SignalFailure) and Signal.ARTIFACTS in required:
        failed.append(Reason.ARTIFACTS_FAILED)
    if isinstance(evidence.faults, SignalFailure) and Signal.FAULTS in required:
        failed.append(Reason.FAULTS_FAILED)
    if failed:
        return verdict(VerdictKind.UNKNOWN, Reason.UTILIZATION_ZERO, *failed)

    reasons: list[Reason] = [Reason.UTILIZATION_ZERO]

    # 3. Output still moving is proof of work, whatever the GPU counters say.
    artifacts = evidence.artifacts
    if isinstance(artifacts, ArtifactSizes):
        if artifacts.changed:
            return verdict(VerdictKind.ACTIVE, *reasons, Reason.ARTIFACTS_CHANGED)
        reasons.append(Reason.ARTIFACTS_UNCHANGED)
        if artifacts.completion_marker:
            reasons.append(Reason.COMPLETION_MARKER)
    elif isinstance(artifacts, SignalFailure):
        reasons.append(Reason.ARTIFACTS_NOT_CHECKED)
    else:
        reasons.append(Reason.ARTIFACTS_NOT_DECLARED)

    # 4. Processes.
    live: int | None = None
    dead: int | None = None
    if isinstance(procs, tuple):
        dead = sum(p.defunct for p in procs)
        live = len(procs) - dead
        if rule is Rule.PAPER_MULTI_SIGNAL:
            # The published detector counts every pid, so a zombie's defunct child keeps it alive.
            if procs:
                return verdict(VerdictKind.ACTIVE, *reasons, Reason.PROCESS_PRESENT, live=live, dead=dead)
            return verdict(VerdictKind.FINISHED_IDLE, *reasons, Reason.NO_PROCESS, live=live, dead=dead)
        if live:
            reasons.append(Reason.LIVE_PROCESS)
            if _zero_run(evidence.utilization, policy.zero_threshold) >= policy.long_window:
                return verdict(VerdictKind.IDLE_HELD, *reasons, Reason.IDLE_LONG_WINDOW, live=live, dead=dead)
            return verdict(VerdictKind.ACTIVE, *reasons, Reason.IDLE_BELOW_HOLD, live=live, dead=dead)
        reasons.append(Reason.DEFUNCT_ONLY if dead else Reason.NO_PROCESS)
    else:
        reasons.append(Reason.PROCESSES_NOT_CHECKED)
        if rule is Rule.PAPER_MULTI_SIGNAL:
            return verdict(VerdictKind.FINISHED_IDLE, *reasons)

    # 5. No live process (ghostgpu rule): crashed or finished? Both are reclaimable.
    faults = evidence.faults
    crashed = bool(dead)
    if isinstance(faults, FaultEvidence):
        if any(x.code not in policy.ignored_xids for x in faults.xid_events):
            reasons.append(Reason.FAULT_XID)
            crashed = True
        if any(r.crashed for r in faults.restarts):
            reasons.append(Reason.FAULT_RESTART)
            crashed = True
        if not crashed:
            reasons.append(Reason.NO_FAULT)
    else:
        reasons.append(Reason.FAULTS_FAILED)
    kind = VerdictKind.ZOMBIE_CRASHED if crashed else VerdictKind.FINISHED_IDLE
    return verdict(kind, *reasons, live=live, dead=dead)


__all__ = [
    "DEFUNCT_STATES",
    "RECLAIMABLE_KINDS",
    "RULE_SIGNALS",
    "ArtifactObservation",
    "ArtifactSizes",
    "ArtifactsNotDeclared",
    "ContainerRestart",
    "Evidence",
    "FailureReason",
    "FaultEvidence",
    "FaultObservation",
    "ProcessInfo",
    "Reason",
    "Rule",
    "Signal",
    "SignalFailure",
    "UtilizationSample",
    "Verdict",
    "VerdictKind",
    "VerdictPolicy",
    "XidEvent",
    "decide",
]
