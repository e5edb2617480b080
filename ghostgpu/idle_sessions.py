"""The idle-session evidence ladder and clock (docs/idle-sessions.md): pure, no I/O, no clock.

An IDLE_HELD workload whose team and class `controller.idleSessions` covers climbs a ladder of
evidence read from Prometheus over the policy's window (so a restarted controller neither forgets an
idle session nor shortens its clock). Every rung must hold:

1. GPU: utilization at or under the zero threshold for the whole window, with the window's samples
   present (a gap may hide activity), and GPU memory not moving by more than `memoryGrowth`;
2. CPU: the workload's containers used under `cpuBelow` cores over the window (cAdvisor's
   container_cpu_usage_seconds_total), less a monitor's own CPU up to `monitorCpuAllowance` and a
   notebook front-end server's own (never a kernel's) up to `frontendCpuAllowance`;
3. processes: none started in the window and none running (R, D) at the newest scan, monitors
   aside, and a notebook's front-end server aside for the running ones;
4. terminal: no wakeup of a process on a terminal in the window (a keystroke, a command).

Any rung that saw activity makes the session ACTIVE (a warning is cancelled). Otherwise any rung
that failed, is stale or was not read makes it UNKNOWN: nothing moves towards a stop (no warning is
given, a given one is not acted on). Only all rungs idle make it IDLE.

`next_step` then turns the ladder, the owner's record (its annotations) and a snooze into one
step: warn, keep the warning, clear it, stop (or, in shadow, what would happen).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ghostgpu.idle_policy import ResolvedIdlePolicy, SessionClass
from ghostgpu.verdict import SignalFailure, program_of

# The owner's annotations (docs/design.md#labelling-contract).
IDLE_SINCE = "ghostgpu.io/idle-since"
IDLE_DEADLINE = "ghostgpu.io/idle-deadline"
IDLE_WARNED_AT = "ghostgpu.io/idle-warned-at"
KEEP_UNTIL = "ghostgpu.io/keep-until"
KEEP_HONOURED = "ghostgpu.io/keep-until-honoured"

# Programs by what they tell about a session (the base name, `python -m X` seen through).
NOTEBOOK_PROGRAMS = frozenset({
    "jupyter", "jupyter-lab", "jupyter-notebook", "jupyter-server", "jupyterhub-singleuser",
    "jupyter-labhub", "ipykernel", "ipykernel_launcher", "ipython", "code-server", "openvscode-server",
    "rstudio-server", "rsession",
})  # fmt: skip
# The part of a notebook that serves the browser, not the kernel that computes: caught running, it
# was answering a client (an open tab's heartbeat, a save), which is no work of the session's.
NOTEBOOK_FRONTENDS = frozenset({
    "jupyter", "jupyter-lab", "jupyter-notebook", "jupyter-server", "jupyterhub-singleuser",
    "jupyter-labhub", "code-server", "openvscode-server", "rstudio-server",
})  # fmt: skip
TERMINAL_PROGRAMS = frozenset({
    "tmux", "tmux: server", "screen", "SCREEN", "bash", "sh", "zsh", "dash", "ash", "fish", "ksh",
    "mksh", "ttyd", "sshd", "mosh-server", "login",
})  # fmt: skip
SERVER_PROGRAMS = frozenset({
    "tritonserver", "vllm", "text-generation-launcher", "text-generation-server", "torchserve",
    "tensorflow_model_server", "uvicorn", "gunicorn", "hypercorn", "nginx", "httpd", "sglang",
    "ollama", "llama-server", "ray", "serve", "mlserver", "bentoml", "kserve", "http.server",
    "lmdeploy", "triton",
})  # fmt: skip
MONITOR_PROGRAMS = frozenset({
    "watch", "top", "htop", "btop", "atop", "nvtop", "nvitop", "gpustat", "glances", "tail",
    "nvidia-smi", "less", "dstat", "vmstat", "iostat",
})  # fmt: skip


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def session_program(command: str) -> str:
    """The program a command line names, `python3 -m ipykernel_launcher` seen as ipykernel_launcher."""
    name, args = program_of(command, frozenset({"python", "python3"}))
    if name.rstrip("0123456789.") == "python" and len(args) >= 2 and args[0] == "-m":
        return args[1].split(".")[0] if args[1] != "http.server" else "http.server"
    return name


def class_of(programs: Iterable[str], *, complete: bool = True) -> SessionClass | None:
    """The class of a workload from the programs that keep it alive (verdict.ProcessCounts.programs).
    The most doubtful program present wins: any program nobody knows makes it OTHER, then a server,
    then a notebook, then a terminal; only monitors left: MONITOR. None: no program is known, or
    the list was cut (`complete` False), so the class cannot be told."""
    names = set(programs)
    if not names or not complete:
        return None
    known = NOTEBOOK_PROGRAMS | TERMINAL_PROGRAMS | SERVER_PROGRAMS | MONITOR_PROGRAMS
    if names - known:
        return SessionClass.OTHER
    for cls, group in (
        (SessionClass.SERVER, SERVER_PROGRAMS),
        (SessionClass.NOTEBOOK, NOTEBOOK_PROGRAMS),
        (SessionClass.TERMINAL, TERMINAL_PROGRAMS),
    ):
        if names & group:
            return cls
    return SessionClass.MONITOR


# --- the evidence over the window -----------------------------------------------------------------

Reading = float | SignalFailure


class WindowEvidence(_Frozen):
    """What Prometheus and the agent say about one workload over a window ending now. Every reading
    is a value or an explicit failure (missing, stale, untrusted), never a silent zero."""

    window_s: float = Field(gt=0)  # the span the readings cover (`after`, or after + warnBefore)
    expected_samples: int = Field(ge=1)  # samples a full series has over the window
    # GPU, over all the workload's GPUs: the busiest sample, the fewest samples of any GPU series.
    gpu_util_max: Reading
    gpu_samples: int | SignalFailure
    memory_min_bytes: Reading
    memory_max_bytes: Reading
    # The workload's containers' CPU seconds over the window (the increase of the cAdvisor counter).
    cpu_seconds: Reading
    cpu_samples: int | SignalFailure
    # CPU seconds of monitor processes with their reaped children (the agent); None: no monitor.
    monitor_cpu_seconds: float | None = None
    # CPU seconds of a notebook's front-end server alone (the agent); None: no front-end runs.
    frontend_cpu_seconds: float | None = None
    # At the newest agent scan: the youngest process's age (monitors and their children aside) and
    # how many processes run or wait on I/O (R, D).
    youngest_process_age_s: Reading
    running_processes: int | SignalFailure
    # Wakeups (context switches) of processes on a terminal over the window; None: none on a tty.
    terminal_wakeups: Reading | None = None
    # When the GPU was last busy, as unix time, within `lookback_s` before now; None: not within it.
    last_busy_at: float | SignalFailure | None = None
    lookback_s: float = Field(gt=0)


class Rung(StrEnum):
    GPU = "gpu"
    MEMORY = "memory"
    CPU = "cpu"
    NEW_PROCESS = "new-process"
    WORKER = "worker"
    TERMINAL = "terminal"
    CLOCK = "clock"


class Finding(_Frozen):
    rung: Rung
    state: Literal["idle", "active", "unknown"]
    detail: str


class Ladder(_Frozen):
    outcome: Literal["idle", "active", "unknown"]
    findings: tuple[Finding, ...]
    idle_since: float | None = None  # unix time the work ended (the window's start when not found)
    window_s: float = 0.0
    since_found: bool = False  # idle_since is when the GPU was last busy, not the window's start

    def keeps(self) -> str:
        """What keeps the session (active rungs) or why it is held (unknown rungs), for Events."""
        picked = [f for f in self.findings if f.state == self.outcome and self.outcome != "idle"]
        return "; ".join(f"{f.rung.value}: {f.detail}" for f in picked)


def climb(ev: WindowEvidence, policy: ResolvedIdlePolicy, *, now: float, zero_threshold: float) -> Ladder:
    """Every rung of the ladder for one workload (module docstring)."""
    f: list[Finding] = []

    def add(rung: Rung, state: Literal["idle", "active", "unknown"], detail: str) -> None:
        f.append(Finding(rung=rung, state=state, detail=detail))

    need = policy.coverage * ev.expected_samples
    # 1. GPU utilization and its coverage.
    if isinstance(ev.gpu_util_max, SignalFailure) or isinstance(ev.gpu_samples, SignalFailure):
        add(Rung.GPU, "unknown", "utilization history unreadable")
    elif not ev.gpu_util_max <= zero_threshold:  # NaN is no idle reading
        add(Rung.GPU, "active", f"utilization reached {ev.gpu_util_max:g}% in the window")
    elif ev.gpu_samples < need:
        add(Rung.GPU, "unknown", f"{ev.gpu_samples} of {ev.expected_samples} samples: a gap may hide work")
    else:
        add(Rung.GPU, "idle", f"utilization <= {zero_threshold:g}% for {ev.window_s:g}s")
    # GPU memory not moving.
    lo, hi = ev.memory_min_bytes, ev.memory_max_bytes
    if isinstance(lo, SignalFailure) or isinstance(hi, SignalFailure):
        add(Rung.MEMORY, "unknown", "GPU memory history unreadable")
    elif not hi - lo <= policy.memory_growth_bytes:
        add(Rung.MEMORY, "active", f"GPU memory moved by {int(hi - lo)} bytes")
    else:
        add(Rung.MEMORY, "idle", f"GPU memory flat at {int(hi)} bytes")
    # 2. CPU, less a monitor's own and a notebook front-end's own, each up to its allowance.
    if isinstance(ev.cpu_seconds, SignalFailure) or isinstance(ev.cpu_samples, SignalFailure):
        add(Rung.CPU, "unknown", "container CPU history unreadable")
    elif ev.cpu_samples < need:
        add(Rung.CPU, "unknown", f"{ev.cpu_samples} of {ev.expected_samples} CPU samples")
    else:
        w = ev.window_s
        discounted = min(max(ev.monitor_cpu_seconds or 0.0, 0.0), policy.monitor_cpu_allowance * w)
        discounted += min(max(ev.frontend_cpu_seconds or 0.0, 0.0), policy.frontend_cpu_allowance * w)
        cores = (ev.cpu_seconds - discounted) / ev.window_s
        if not cores < policy.cpu_below:
            add(Rung.CPU, "active", f"{cores:.4f} cores over the window (>= {policy.cpu_below:g})")
        else:
            add(Rung.CPU, "idle", f"{cores:.4f} cores over the window")
    # 3. Processes: none new, none running.
    if isinstance(ev.youngest_process_age_s, SignalFailure):
        add(Rung.NEW_PROCESS, "unknown", "process ages unreadable")
    elif not ev.youngest_process_age_s >= ev.window_s:
        add(Rung.NEW_PROCESS, "active", f"a process started {ev.youngest_process_age_s:g}s ago")
    else:
        add(Rung.NEW_PROCESS, "idle", "no process started in the window")
    if isinstance(ev.running_processes, SignalFailure):
        add(Rung.WORKER, "unknown", "process states unreadable")
    elif ev.running_processes > 0:
        add(Rung.WORKER, "active", f"{ev.running_processes} process(es) running")
    else:
        add(Rung.WORKER, "idle", "no process running")
    # 4. Terminals.
    tw = ev.terminal_wakeups
    if isinstance(tw, SignalFailure):
        add(Rung.TERMINAL, "unknown", "terminal activity unreadable")
    elif tw is not None and not tw <= 0:
        add(Rung.TERMINAL, "active", f"{tw:g} wakeups of processes on a terminal")
    else:
        add(Rung.TERMINAL, "idle", "no terminal activity" if tw is not None else "no process on a terminal")
    # The clock: when the work ended.
    since: float | None = None
    if isinstance(ev.last_busy_at, SignalFailure):
        add(Rung.CLOCK, "unknown", "the time the GPU was last busy is unreadable")
    elif ev.last_busy_at is None:
        # Not busy within the lookback, which may also have been a gap: the clock claims no more
        # idle time than the window this ladder read proves.
        since = now - ev.window_s
        add(Rung.CLOCK, "idle", f"not busy in the last {ev.lookback_s:g}s")
    elif not ev.last_busy_at <= now - ev.window_s:
        add(Rung.CLOCK, "active", f"GPU busy {now - ev.last_busy_at:g}s ago")
    else:
        since = ev.last_busy_at
        add(Rung.CLOCK, "idle", f"GPU last busy {now - ev.last_busy_at:g}s ago")

    states = {x.state for x in f}
    outcome: Literal["idle", "active", "unknown"] = (
        "active" if "active" in states else "unknown" if "unknown" in states else "idle"
    )
    return Ladder(
        outcome=outcome,
        findings=tuple(f),
        idle_since=since if outcome == "idle" else None,
        window_s=ev.window_s,
        since_found=isinstance(ev.last_busy_at, float),
    )


# --- the owner's record and a snooze --------------------------------------------------------------


class Record(_Frozen):
    """A warning given, as the owner's annotations hold it (they survive a controller restart)."""

    idle_since: float
    warned_at: float
    deadline: float


def parse_time(value: str) -> float | None:
    """Unix time of an RFC 3339 timestamp (`2026-12-05T22:00:00Z`); None when unreadable."""
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    if t.tzinfo is None:
        return None  # a time without a zone means nothing certain
    return t.timestamp()


def format_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def record_of(annotations: Mapping[str, str]) -> Record | None:
    """The warning recorded on the owner; None when absent or not all readable."""
    times = [parse_time(annotations.get(k, "")) for k in (IDLE_SINCE, IDLE_WARNED_AT, IDLE_DEADLINE)]
    if any(t is None for t in times):
        return None
    since, warned, deadline = times
    assert since is not None and warned is not None and deadline is not None
    return Record(idle_since=since, warned_at=warned, deadline=deadline)


def record_annotations(r: Record) -> dict[str, str]:
    return {
        IDLE_SINCE: format_time(r.idle_since),
        IDLE_WARNED_AT: format_time(r.warned_at),
        IDLE_DEADLINE: format_time(r.deadline),
    }


class Snooze(_Frozen):
    """A ghostgpu.io/keep-until, as honoured: `until` is the time kept to (cut to maxSnooze)."""

    asked: str  # the annotation's value, bounded
    until: float | None  # None: unreadable, not honoured
    set_at: float | None  # from managedFields; None when no entry owns the annotation
    manager: str  # the field manager that wrote it (the client's name, not the user's)
    cut: bool = False

    def describe(self) -> str:
        if self.until is None:
            return f"keep-until {self.asked!r} is not an RFC 3339 time with a zone: not honoured"
        who = f"set by {self.manager}" + (f" at {format_time(self.set_at)}" if self.set_at else "")
        cut = f" (asked {self.asked}, cut to maxSnooze)" if self.cut else ""
        return f"kept until {format_time(self.until)}, {who}{cut}"


def _owns_annotation(fields: Any, key: str) -> bool:
    meta = (fields or {}).get("f:metadata") if isinstance(fields, dict) else None
    notes = (meta or {}).get("f:annotations") if isinstance(meta, dict) else None
    return isinstance(notes, dict) and f"f:{key}" in notes


def snooze_of(obj: Mapping[str, Any], *, max_snooze_s: float, base: float) -> Snooze | None:
    """The owner's keep-until, honoured up to `max_snooze_s` after it was set (its managedFields
    entry's time; `base`, when no entry owns it: the time the warning was or would be given)."""
    meta = obj.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(KEEP_UNTIL)
    if raw is None:
        return None
    asked = str(raw)[:64]
    manager, set_at = "unknown", None
    for entry in meta.get("managedFields") or []:
        if isinstance(entry, dict) and _owns_annotation(entry.get("fieldsV1"), KEEP_UNTIL):
            manager = str(entry.get("manager") or "unknown")[:64]
            set_at = parse_time(str(entry.get("time") or ""))
    until = parse_time(asked)
    if until is None:
        return Snooze(asked=asked, until=None, set_at=set_at, manager=manager)
    limit = (set_at if set_at is not None else base) + max_snooze_s
    return Snooze(asked=asked, until=min(until, limit), set_at=set_at, manager=manager, cut=until > limit)


# --- one step ------------------------------------------------------------------------------------

Action = Literal[
    "none",  # nothing to do (not covered, not idle long enough, nothing recorded)
    "hold",  # a signal is unknown: nothing moves, a warning given stays
    "clear",  # activity (or the policy no longer covers it): remove the warning, an Event
    "warn",  # annotate the owner, a Warning Event, the alert
    "warned",  # a warning stands, its deadline not reached (or snoozed)
    "reread",  # the deadline passed: read the evidence again over after + warnBefore
    "stop",  # the deadline passed and fresh evidence over after + warnBefore holds
    "would-warn",  # shadow: what enforce would do
    "would-stop",
]


class Step(_Frozen):
    action: Action
    cls: SessionClass | None = None
    record: Record | None = None  # the warning to write or keep
    reason: str = ""


def next_step(
    policy: ResolvedIdlePolicy,
    cls: SessionClass | None,
    ladder: Ladder,
    record: Record | None,
    snooze: Snooze | None,
    *,
    now: float,
) -> Step:
    """What to do about one IDLE_HELD workload this poll. Pure: same input, same output.

    A stop needs, all at once: the ladder idle over at least after + warnBefore (read fresh, so an
    annotation copied from another object or edited cannot shorten anything), the work ended that
    long ago, a warning given at least warnBefore ago, its deadline and any snooze passed."""
    if policy.mode == "shadow" and record is not None:
        # Switched back from enforce: a warning nobody will act on is withdrawn.
        return Step(action="clear", cls=cls, reason="mode shadow: the warning is withdrawn")
    if policy.mode == "off" or (cls is not None and not policy.classes.allows(cls)):
        why = f"class {cls.value if cls else 'unknown'} not covered (mode {policy.mode})"
        return Step(action="clear" if record else "none", cls=cls, reason=why)
    if ladder.outcome == "active":
        return Step(action="clear" if record else "none", cls=cls, reason=ladder.keeps())
    if cls is None or ladder.outcome == "unknown" or ladder.idle_since is None:
        # A class nobody could tell (the agent's facts missing) is as unknown as a failed rung.
        why = ladder.keeps() or "no class told"
        return Step(action="hold" if record else "none", cls=cls, record=record, reason=why)
    since = ladder.idle_since
    idle_for = now - since
    if idle_for < policy.after_s:
        return Step(action="none", cls=cls, reason=f"idle {idle_for:g}s of {policy.after_s:g}s")
    full = policy.after_s + policy.warn_before_s
    if policy.mode == "shadow":
        # No warning is given, so none is recorded: whether a stop would be due is the history's.
        if ladder.window_s >= full and idle_for >= full:
            return Step(action="would-stop", cls=cls, reason=f"idle for {full:g}s on every signal")
        if ladder.window_s >= full or (ladder.since_found and idle_for < full):
            return Step(action="would-warn", cls=cls, reason=f"idle {idle_for:g}s")
        return _stop_or_reread(ladder, full, cls, None, "would-stop")
    if record is None:
        snoozed = snooze is not None and snooze.until is not None and snooze.until > now
        if snoozed:
            assert snooze is not None
            return Step(action="none", cls=cls, reason=snooze.describe())
        warned = Record(idle_since=since, warned_at=now, deadline=now + policy.warn_before_s)
        return Step(action="warn", cls=cls, record=warned, reason=f"idle since {format_time(since)}")
    if ladder.since_found and since > record.warned_at:
        # The GPU worked after that warning (while no controller watched): a new idle spell.
        fresh = Record(idle_since=since, warned_at=now, deadline=now + policy.warn_before_s)
        return Step(action="warn", cls=cls, record=fresh, reason="work after the recorded warning")
    # A warning stands: its deadline is never earlier than warnBefore after it was given.
    deadline = max(record.deadline, record.warned_at + policy.warn_before_s)
    if snooze is not None and snooze.until is not None:
        deadline = max(deadline, snooze.until)
    kept = record.model_copy(update={"deadline": deadline})
    if now < deadline:
        why = snooze.describe() if snooze is not None and snooze.until == deadline else ""
        return Step(action="warned", cls=cls, record=kept, reason=why or f"deadline {format_time(deadline)}")
    if ladder.window_s < full:
        return _stop_or_reread(ladder, full, cls, kept, "stop")
    if idle_for < full:
        # Fresh evidence over after + warnBefore does not show that long an idle spell: the record
        # is not this session's (copied from another object, or edited); warn anew.
        fresh = Record(idle_since=since, warned_at=now, deadline=now + policy.warn_before_s)
        why = "the recorded warning predates this idle spell"
        return Step(action="warn", cls=cls, record=fresh, reason=why)
    return _stop_or_reread(ladder, full, cls, kept, "stop")


def _stop_or_reread(
    ladder: Ladder, full: float, cls: SessionClass, record: Record | None, action: Action
) -> Step:
    if ladder.window_s < full:
        return Step(
            action="reread", cls=cls, record=record, reason=f"read {full:g}s of evidence before the stop"
        )
    return Step(action=action, cls=cls, record=record, reason=f"idle for {full:g}s on every signal")


def evidence_note(ladder: Ladder) -> str:
    """Compact JSON of the ladder's findings, for the decision log."""
    return json.dumps({f.rung.value: f.state for f in ladder.findings}, separators=(",", ":"), sort_keys=True)


def gpu_hours(gpus: float, idle_since: float, now: float) -> float:
    """GPU-hours a session held while idle."""
    return round(gpus * max(0.0, now - idle_since) / 3600.0, 3)


def warning_message(
    cls: SessionClass, programs: Sequence[str], gpus: float, record: Record, *, now: float
) -> str:
    """The Warning Event: the class and what keeps it alive, the GPUs and GPU-hours held, the
    deadline, and how to keep it."""
    kept = ", ".join(programs[:4]) or "unknown"
    return (
        f"idle {cls.value} session (kept alive by {kept}) holds {gpus:g} GPU(s), idle since "
        f"{format_time(record.idle_since)} ({gpu_hours(gpus, record.idle_since, now):g} GPU-hours): "
        f"stopped at {format_time(record.deadline)} unless it is used; to keep it, use it, or "
        f"annotate the owner {KEEP_UNTIL}=<RFC 3339 time> (honoured up to maxSnooze); "
        f"`ghostgpu restore` undoes a stop"
    )
