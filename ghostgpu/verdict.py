"""The idleness verdict: one pure, deterministic function of the evidence (docs/design.md#verdict).

No I/O, no clock, no Kubernetes. The controller's signal sources build an `Evidence`, the
benchmark's simulator builds the same `Evidence` from synthetic traces, and both call `decide()`:
there is exactly one implementation of every rule.

Safety asymmetry (why the rules look the way they do): a false reclaim kills live work and cannot
be undone, a false keep costs one more poll. So every doubt resolves to a non-reclaimable verdict:
a failed or missing required signal is `UNKNOWN`, any sign of life is `ACTIVE` or `IDLE_HELD`.

Process listings are judged here too, not in the signal source: which processes only keep a
container alive (`sleep infinity`, `pause`, an init or shell waiting on nothing) and which are a
timer between periodic runs (`sleep 3600` under a shell loop, `timeout`, a cron daemon) is policy
(`ProcessPolicy`), so the benchmark's simulator and the controller read one rule.

Utilization samples are oldest first, newest last. `decide()` reads the newest `policy.window`
samples for the verdict; older samples, when the caller keeps them, only feed the long window that
separates `IDLE_HELD` (zero for `policy.long_window` samples, a live process remains: a human
decides) from an `ACTIVE` job in a short batch gap (dataloader stall, checkpoint write).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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
    MEMORY = "memory"


class FailureReason(StrEnum):
    MISSING = "missing"  # no sample for this poll (series absent, pod not scraped)
    STALE = "stale"  # a sample exists but is older than the poll allows
    HTTP_ERROR = "http-error"
    TIMEOUT = "timeout"
    EXEC_ERROR = "exec-error"  # process listing could not run in the container
    NO_LISTING = "no-listing"  # the container has no `ps` (distroless): its processes cannot be seen
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not-found"
    PARSE_ERROR = "parse-error"
    # The node agent reports a container it should see and cannot (its reason, verbatim).
    NO_CGROUP_MATCH = "no-cgroup-match"  # no host pid's cgroup names the container
    PROC_UNREADABLE = "proc-unreadable"  # the node's /proc could not be read
    NOT_RUNNING = "not-running"  # the container is not running on the node
    # A series contradicts what the controller knows: another pod's UID, a sample or scan time
    # ahead of its clock (docs/threat-model.md).
    UNTRUSTED = "untrusted"
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
    command: str = ""  # the command line (ps `args`, bounded); its first word is the program
    ppid: int | None = None  # None: the listing did not say
    elapsed_s: int | None = None  # seconds since the process started (procps `etimes`)
    # Which pid namespace the row comes from ("pod/container"): pids repeat across containers.
    scope: str = ""

    @property
    def defunct(self) -> bool:
        # Zombie (Z) or dead (X): holds a pid table slot, does no work, cannot hold a GPU context.
        return self.state[:1].upper() in DEFUNCT_STATES


class ProcessCounts(_Frozen):
    """How many of a workload's processes play each role: what the verdict needs from a listing.
    The node agent classifies a container's rows on the node and exports these counts; the exec
    source's rows are counted here. Counts of several containers add up (`+`)."""

    work: int = Field(0, ge=0)
    wrapper: int = Field(0, ge=0)
    holder: int = Field(0, ge=0)
    timer: int = Field(0, ge=0)
    session: int = Field(0, ge=0)
    defunct: int = Field(0, ge=0)
    # The programs that keep it alive (work, timer, session roles), for a person reading the
    # verdict; the verdict itself reads only the counts.
    programs: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.work + self.wrapper + self.holder + self.timer + self.session + self.defunct

    def __add__(self, other: ProcessCounts) -> ProcessCounts:
        return ProcessCounts(
            work=self.work + other.work,
            wrapper=self.wrapper + other.wrapper,
            holder=self.holder + other.holder,
            timer=self.timer + other.timer,
            session=self.session + other.session,
            defunct=self.defunct + other.defunct,
            programs=tuple(sorted(set(self.programs) | set(other.programs))),
        )


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


class GpuMemory(_Frozen):
    """Framebuffer used by the workload's GPUs at the newest sample, summed over its pods."""

    kind: Literal["memory"] = "memory"
    used_bytes: int = Field(ge=0)


MemoryObservation = Annotated[GpuMemory | SignalFailure, Field(discriminator="kind")]


class Evidence(_Frozen):
    """Everything known about one workload over one window."""

    utilization: tuple[UtilizationSample, ...] = ()  # oldest first, newest last
    # None = not collected (the controller lists processes only once the window is all zero).
    # Rows (an exec'd `ps`) or per-role counts (the node agent classified the rows on the node).
    processes: tuple[ProcessInfo, ...] | ProcessCounts | SignalFailure | None = None
    artifacts: ArtifactObservation = ArtifactsNotDeclared()
    faults: FaultObservation = FaultEvidence()
    memory: MemoryObservation | None = None  # None = not collected


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


class ProcessRole(StrEnum):
    WORK = "work"
    WRAPPER = "wrapper"  # an init or a shell waiting on its children: not work by itself
    HOLDER = "holder"  # keeps a container alive and nothing else: sleep infinity, pause, tail -f /dev/null
    TIMER = "timer"  # a finite wait between periodic runs: sleep 3600, timeout, a cron daemon
    SESSION = "session"  # a person attached: a terminal, or a process exec'd from outside the container
    DEFUNCT = "defunct"


_SLEEP_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_WAITING_STATES = frozenset("SIT")  # sleeping, idle, stopped; R and D are doing something


class ProcessPolicy(_Frozen):
    """What a process tree that only waits means (pure; configurable as `controller.processes`).

    Only wrappers and holders can be discounted, and only when nothing else lives beside them: a
    container whose live processes are all wrappers or holders is doing no work. A timer or an
    attached session is always live work (a periodic job between runs, a person at a shell)."""

    wrappers: frozenset[str] = frozenset(
        {
            "sh", "bash", "dash", "ash", "zsh", "ksh", "mksh",
            "tini", "tini-static", "dumb-init", "catatonit", "docker-init", "init",
            "s6-svscan", "s6-supervise", "runsvdir", "runsv", "supervisord",
        }
    )  # fmt: skip
    holders: frozenset[str] = frozenset({"pause"})  # whatever their arguments
    timers: frozenset[str] = frozenset({"cron", "crond", "supercronic", "anacron", "atd", "timeout"})
    # Interpreters whose script names the program (`python3 /usr/bin/supervisord`).
    interpreters: frozenset[str] = frozenset({"python", "python3", "perl", "ruby", "node"})
    # `sleep N` this long or longer is a holder (`sleep 2147483647` is an idiom for forever).
    forever_sleep_s: float = Field(31_536_000.0, gt=0)


def program_of(command: str, interpreters: frozenset[str] = frozenset()) -> tuple[str, list[str]]:
    """(program name, its arguments) from a ps `args` column: path and login-shell '-' stripped,
    `[kthread]`/`[name] <defunct>` brackets removed, `busybox APPLET` and `python3 SCRIPT` seen
    through."""
    words = command.split()
    if not words:
        return "", []
    first = words[0]
    if first.startswith("[") and "]" in first:
        return first[1 : first.index("]")], []
    name = first.rsplit("/", 1)[-1].lstrip("-")
    args = words[1:]
    if name == "busybox" and args:
        name, args = args[0].rsplit("/", 1)[-1], args[1:]
    if (
        (name in interpreters or name.rstrip("0123456789.") in interpreters)
        and args
        and not args[0].startswith("-")
    ):
        return args[0].rsplit("/", 1)[-1], args[1:]
    return name, args


def _sleep_seconds(args: list[str]) -> float | None:
    """Total of `sleep`'s operands (coreutils sums them); inf for infinity; None if unreadable."""
    total = 0.0
    operands = [a for a in args if a != "--"]
    if not operands:
        return None
    for a in operands:
        if a.lower() in ("inf", "infinity"):
            return float("inf")
        unit = a[-1:] if a[-1:] in ("s", "m", "h", "d") else ""
        try:
            value = float(a[: len(a) - len(unit)])
        except ValueError:
            return None
        if not value >= 0:  # also rejects NaN
            return None
        total += value * _SLEEP_UNITS[unit]
    return total


def classify(proc: ProcessInfo, policy: ProcessPolicy, *, shared_pid_namespace: bool = False) -> ProcessRole:
    """The role of one process. Doubt is WORK: only a positive match discounts a process."""
    if proc.defunct:
        return ProcessRole.DEFUNCT
    if "+" in proc.state:
        return ProcessRole.SESSION  # foreground of a terminal: someone's `kubectl exec -it`
    if proc.ppid == 0 and proc.pid != 1 and not shared_pid_namespace:
        # Its parent is outside the container: started by an exec (a person, a tool), not the image.
        return ProcessRole.SESSION
    name, args = program_of(proc.command, policy.interpreters)
    if name in policy.timers:
        return ProcessRole.TIMER
    if proc.state[:1] not in _WAITING_STATES:
        return ProcessRole.WORK  # running or in uninterruptible I/O (a checkpoint write)
    if name == "sleep":
        seconds = _sleep_seconds(args)
        if seconds is None:
            return ProcessRole.TIMER  # an unreadable wait is a wait, not a holder
        return ProcessRole.HOLDER if seconds >= policy.forever_sleep_s else ProcessRole.TIMER
    if (
        name == "tail"
        and args
        and args[-1] == "/dev/null"
        and any(a in ("-f", "-F", "--follow") for a in args)
    ):
        return ProcessRole.HOLDER
    if name in policy.holders:
        return ProcessRole.HOLDER
    if name in policy.wrappers:
        return ProcessRole.WRAPPER
    return ProcessRole.WORK


def classify_listing(procs: tuple[ProcessInfo, ...], policy: ProcessPolicy) -> list[ProcessRole]:
    """Roles of a workload's processes. A scope whose pid 1 is `pause` shares its pid namespace
    across containers: each container's entrypoint then has ppid 0 without being an exec."""
    shared = {p.scope for p in procs if p.pid == 1 and program_of(p.command)[0] == "pause"}
    return [classify(p, policy, shared_pid_namespace=p.scope in shared) for p in procs]


_KEEPS_ALIVE = frozenset({ProcessRole.WORK, ProcessRole.TIMER, ProcessRole.SESSION})


def count_roles(procs: tuple[ProcessInfo, ...], policy: ProcessPolicy) -> ProcessCounts:
    """The per-role counts of a listing (`classify_listing`), with the programs that keep it alive."""
    roles = classify_listing(procs, policy)
    by_role = {role: 0 for role in ProcessRole}
    programs: set[str] = set()
    for proc, role in zip(procs, roles, strict=True):
        by_role[role] += 1
        if role in _KEEPS_ALIVE:
            programs.add(program_of(proc.command, policy.interpreters)[0])
    return ProcessCounts(**{role.value: n for role, n in by_role.items()}, programs=tuple(sorted(programs)))


class VerdictPolicy(_Frozen):
    rule: Rule = Rule.GHOSTGPU
    window: int = Field(5, ge=1, le=1000)  # K: samples that must all be zero
    zero_threshold: float = Field(0.0, ge=0.0, le=100.0)  # a sample <= this counts as zero
    # Long window for IDLE_HELD, in samples (>= window; None = 3 x window). Shorter zero runs with a
    # live process are ACTIVE batch gaps. The caller keeps this many samples to ever reach IDLE_HELD.
    hold_after: int | None = Field(None, ge=1)
    # Faults only separate ZOMBIE_CRASHED from FINISHED_IDLE (both reclaimable), so not required.
    required: frozenset[Signal] = frozenset(
        {Signal.UTILIZATION, Signal.PROCESSES, Signal.ARTIFACTS, Signal.MEMORY}
    )
    # Page-retirement / row-remap notices: the GPU keeps working and processes survive them.
    ignored_xids: frozenset[int] = frozenset({63, 64, 92})
    processes: ProcessPolicy = ProcessPolicy()
    # Framebuffer at or below this holds no CUDA context (driver bookkeeping only); above it with
    # no live process visible is a contradiction: a context exists that the listing did not see.
    memory_free_bytes: int = Field(64 << 20, ge=0)
    # IDLE_HELD reports the memory held from this line on (the idle alert's 500 MiB).
    memory_held_bytes: int = Field(500 << 20, ge=0)

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
    HOLDERS_ONLY = "holders-only"  # only wrappers/holders live (sleep infinity, pause, an idle shell)
    TIMER = "timer"  # a finite wait between periodic runs: live work
    ATTACHED_SESSION = "attached-session"  # a terminal or an exec'd process: a person is there
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
    MEMORY_FAILED = "memory-failed"
    MEMORY_NOT_COLLECTED = "memory-not-collected"
    MEMORY_FREE = "memory-free"  # no CUDA context: corroborates finished/crashed
    MEMORY_HELD = "memory-held"  # at or over the held line
    MEMORY_WITHOUT_PROCESS = "memory-without-process"  # held memory, no live process: contradiction


class Verdict(_Frozen):
    kind: VerdictKind
    rule: Rule
    reasons: tuple[Reason, ...]
    live_processes: int | None = None  # None when the rule did not look at processes
    defunct_processes: int | None = None
    memory_bytes: int | None = None  # framebuffer used, when the rule read it

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


def window_runs(samples: Sequence[UtilizationSample], threshold: float) -> tuple[int, int, int]:
    """(samples, readings in a row, readings not above `threshold` in a row), both runs ending at
    the newest sample: all a window verdict needs. `UtilizationRing` keeps them as samples arrive."""
    ok = zero = 0
    for s in reversed(samples):
        if isinstance(s, SignalFailure):
            break
        ok += 1
        if zero == ok - 1 and s <= threshold:  # a NaN is no zero reading (fail safe)
            zero = ok
    return len(samples), ok, zero


def _window_case(
    count: int, ok_run: int, zero_run: int, policy: VerdictPolicy
) -> tuple[VerdictKind, Reason] | None:
    """The verdict when the utilization window alone settles it (too few samples, a failed one, a
    non-zero one); None when the newest K samples are all zero and the other signals decide."""
    k = policy.effective_window
    if count < k:
        return VerdictKind.UNKNOWN, Reason.INSUFFICIENT_SAMPLES
    if ok_run < k:
        return VerdictKind.UNKNOWN, Reason.UTILIZATION_FAILED  # a failure outranks a reading
    if zero_run < k:
        return VerdictKind.ACTIVE, Reason.UTILIZATION_NONZERO
    return None


_SETTLED: dict[tuple[Rule, VerdictKind, Reason], Verdict] = {}


def window_verdict(samples: Sequence[UtilizationSample], policy: VerdictPolicy) -> Verdict | None:
    """decide()'s first step alone: for evidence with these utilization samples and no GPU memory
    reading, `decide()` returns exactly this verdict whatever the other signals say; None when the
    window is all zero (then only `decide()` on the whole evidence can tell). Lets a caller skip
    assembling the evidence of the many workloads that are plainly busy (or plainly unknown); the
    verdicts are shared immutable objects."""
    return window_verdict_from_runs(*window_runs(samples, policy.zero_threshold), policy)


def window_verdict_from_runs(count: int, ok_run: int, zero_run: int, policy: VerdictPolicy) -> Verdict | None:
    """`window_verdict` of samples known by their runs (`window_runs`, `UtilizationRing.runs`):
    the same answer without a pass over the samples."""
    settled = _window_case(count, ok_run, zero_run, policy)
    if settled is None:
        return None
    key = (policy.rule, *settled)
    v = _SETTLED.get(key)
    if v is None:
        v = _SETTLED[key] = Verdict.model_construct(
            kind=settled[0],
            rule=policy.rule,
            reasons=(settled[1],),
            live_processes=None,
            defunct_processes=None,
            memory_bytes=None,
        )
    return v


def decide(evidence: Evidence, policy: VerdictPolicy | None = None) -> Verdict:
    """The verdict for one workload over one window. Pure: same input, same output."""
    policy = policy or VerdictPolicy()
    rule = policy.rule
    required = policy.required & RULE_SIGNALS[rule]  # a rule never waits on a signal it ignores
    memory = evidence.memory if Signal.MEMORY in RULE_SIGNALS[rule] else None
    mem_bytes = memory.used_bytes if isinstance(memory, GpuMemory) else None

    def verdict(
        kind: VerdictKind, *reasons: Reason, live: int | None = None, dead: int | None = None
    ) -> Verdict:
        # Built from this module's own typed values: nothing to validate (one per workload per poll).
        return Verdict.model_construct(
            kind=kind,
            rule=rule,
            reasons=reasons,
            live_processes=live,
            defunct_processes=dead,
            memory_bytes=mem_bytes,
        )

    # 1. Utilization opens the case: the newest K samples, all present, all zero.
    runs = window_runs(evidence.utilization, policy.zero_threshold)  # also read for the long window
    settled = _window_case(*runs, policy)
    if settled is not None:
        return verdict(*settled)
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
    if Signal.MEMORY in required:
        if isinstance(memory, SignalFailure):
            failed.append(Reason.MEMORY_FAILED)
        elif memory is None:
            failed.append(Reason.MEMORY_NOT_COLLECTED)
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
        procs = count_roles(procs, policy.processes)
    if isinstance(procs, ProcessCounts):
        dead = procs.defunct
        live = procs.total - dead
        if rule is Rule.PAPER_MULTI_SIGNAL:
            # The published detector counts every pid, so a zombie's defunct child keeps it alive.
            if procs.total:
                return verdict(VerdictKind.ACTIVE, *reasons, Reason.PROCESS_PRESENT, live=live, dead=dead)
            return verdict(VerdictKind.FINISHED_IDLE, *reasons, Reason.NO_PROCESS, live=live, dead=dead)
        if live and not (procs.work or procs.timer or procs.session):
            # `sh -c "train.py; sleep infinity"` after training: a container kept alive, no work.
            reasons.append(Reason.HOLDERS_ONLY)
            live = 0
        if live:
            reasons.append(Reason.LIVE_PROCESS)
            if procs.timer:
                reasons.append(Reason.TIMER)
            if procs.session:
                reasons.append(Reason.ATTACHED_SESSION)
            if mem_bytes is not None and mem_bytes >= policy.memory_held_bytes:
                reasons.append(Reason.MEMORY_HELD)
            if runs[2] >= policy.long_window:  # the zero run ending at the newest sample
                return verdict(VerdictKind.IDLE_HELD, *reasons, Reason.IDLE_LONG_WINDOW, live=live, dead=dead)
            return verdict(VerdictKind.ACTIVE, *reasons, Reason.IDLE_BELOW_HOLD, live=live, dead=dead)
        reasons.append(Reason.DEFUNCT_ONLY if dead else Reason.NO_PROCESS)
    else:
        reasons.append(Reason.PROCESSES_NOT_CHECKED)
        if rule is Rule.PAPER_MULTI_SIGNAL:
            return verdict(VerdictKind.FINISHED_IDLE, *reasons)

    # 5. No live process (ghostgpu rule). GPU memory still in use means a CUDA context lives that
    # the listing did not show (another container, a hidden pid namespace): never call that idle.
    if mem_bytes is not None:
        if mem_bytes > policy.memory_free_bytes:
            return verdict(VerdictKind.UNKNOWN, *reasons, Reason.MEMORY_WITHOUT_PROCESS, live=live, dead=dead)
        reasons.append(Reason.MEMORY_FREE)

    # 6. Crashed or finished? Both are reclaimable.
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
    "GpuMemory",
    "MemoryObservation",
    "ProcessInfo",
    "ProcessPolicy",
    "ProcessRole",
    "Reason",
    "Rule",
    "Signal",
    "SignalFailure",
    "UtilizationSample",
    "Verdict",
    "VerdictKind",
    "VerdictPolicy",
    "XidEvent",
    "classify",
    "classify_listing",
    "decide",
    "program_of",
]
