"""The idle-session policy: `controller.idleSessions` in ghostgpu.yaml (docs/idle-sessions.md).

An IDLE_HELD workload (its GPUs idle for the long window while a live process remains) is only
reported unless this policy applies to its team and class. Then it is warned once every signal has
agreed for `after`, stopped `warnBefore` later unless something moved or a person snoozed it.

Pure: the model, its per-team overrides and the namespace annotation's clamp. No clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from ghostgpu.quantity import Duration, Quantity

# The Namespace annotation that shortens or lengthens `after` within the file's bounds.
AFTER_ANNOTATION = "ghostgpu.io/idle-after"

Mode = Literal["off", "shadow", "enforce"]
NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class SessionClass(StrEnum):
    """What keeps an idle workload alive, as its processes tell (ghostgpu.idle_sessions.class_of)."""

    NOTEBOOK = "notebook"  # a Jupyter kernel or server, an IDE server
    TERMINAL = "terminal"  # a shell on a terminal, tmux, screen
    SERVER = "server"  # a process that serves requests (a model server, an HTTP server)
    MONITOR = "monitor"  # watch, top, tail -f, nvidia-smi -l: never activity by itself
    OTHER = "other"  # any other program: nobody can tell what it waits for


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        str_strip_whitespace=True,
    )


class SessionClasses(_Model):
    """Which classes the policy applies to. A class that is off is only reported, as before."""

    notebook: bool = Field(
        True,
        description="An idle Jupyter kernel or server (or an IDE server) holding GPUs: warned and "
        "stopped like every culler does, with GPU, CPU and process evidence they lack.",
    )
    terminal: bool = Field(
        True,
        description="A shell, tmux or screen session nobody typed into for `after`; any keystroke "
        "(terminal wakeups) or new command keeps it.",
    )
    server: bool = Field(
        False,
        description="A process serving requests (vLLM, Triton, uvicorn, ...). Off by default: a "
        "serving endpoint at zero traffic is often a deliberate warm standby (no cold start at the "
        "next request), and its GPUs being idle is its normal state between requests, not a sign "
        "someone forgot it. Turn it on for teams whose endpoints are experiments.",
    )
    monitor: bool = Field(
        True,
        description="Only a monitor keeps it alive (`watch nvidia-smi`, `top`, `tail -f log`): "
        "a monitor refreshes itself, so it is never activity on its own.",
    )
    other: bool = Field(
        False,
        description="Any other program: off by default, since nothing says what it waits for (a "
        "queue, a lock, a timer of its own). The node agent reports no class for such programs yet, "
        "so turning it on changes nothing.",
    )

    def allows(self, cls: SessionClass) -> bool:
        return bool(getattr(self, cls.value))


class AfterBounds(_Model):
    """How far the Namespace annotation ghostgpu.io/idle-after may move `after`."""

    min: Duration = Field(
        Duration("30m"),
        description="The shortest `after` the annotation may set; a shorter value is raised to it.",
    )
    max: Duration = Field(
        Duration("168h"),
        description="The longest `after` the annotation may set; a longer value is cut to it.",
    )

    @model_validator(mode="after")
    def _order(self) -> AfterBounds:
        if self.min.seconds > self.max.seconds:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class TeamIdleSessions(_Model):
    """A team's overrides: every key left out is the file's default."""

    mode: Mode | None = Field(None, description="The team's mode (off, shadow, enforce).")
    after: Duration | None = Field(None, description="The team's `after`.")
    warn_before: Duration | None = Field(None, description="The team's `warnBefore`.")
    max_snooze: Duration | None = Field(None, description="The team's `maxSnooze`.")
    classes: SessionClasses | None = Field(
        None, description="The team's classes (the whole table: a class left out takes its default)."
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        return _mode(value)


def _cpu_source(value: dict[str, str]) -> dict[str, str]:
    from ghostgpu.config import _source_selector  # the one check of a source selector

    return _source_selector(value)


def _mode(value: Any) -> Any:
    # YAML 1.1 reads a bare `off` as false.
    if value is False:
        return "off"
    if value is True:
        raise ValueError("mode takes off, shadow or enforce (a bare `on`/`true` names no mode)")
    return value


class IdleSessionsConfig(_Model):
    """`controller.idleSessions`: reclaim IDLE_HELD workloads on a policy, warned first."""

    mode: Mode = Field(
        "off",
        description="off: IDLE_HELD is only reported; shadow: the idle clock runs and is exported "
        "(ghostgpu_idle_session_* metrics, the decision log), nobody is warned and nothing stopped; "
        "enforce: warn, then stop at the deadline (and only when controller.mode is enforce too).",
    )
    after: Duration = Field(
        Duration("3h"),
        description="How long every signal must agree (GPU idle, memory flat, CPU low, no new "
        "process, no terminal activity) before the session is warned. 3h: longer than a meeting or "
        "a lunch break, Vertex AI Workbench's default.",
    )
    warn_before: Duration = Field(
        Duration("1h"),
        description="The warning period: the stop comes this long after the warning at the "
        "earliest, so an alert has time to reach a person.",
    )
    max_snooze: Duration = Field(
        Duration("72h"),
        description="The longest a ghostgpu.io/keep-until on the owner is honoured, counted from "
        "when it was set; a later time is cut to it (72h: a weekend).",
    )
    after_bounds: AfterBounds = Field(
        default_factory=AfterBounds,
        description="The range the Namespace annotation ghostgpu.io/idle-after may set `after` to.",
    )
    classes: SessionClasses = Field(
        default_factory=SessionClasses,
        description="Which classes the policy applies to.",
    )
    cpu_below: NonNegFloat = Field(
        0.02,
        description="The container's CPU over the window, in cores (CPU seconds per second), below "
        "which it counts as idle; an idle kernel or shell uses about 0.001. A computation that "
        "prints nothing keeps its session through this.",
    )
    monitor_cpu_allowance: NonNegFloat = Field(
        0.05,
        description="Cores of a monitor's own CPU (with the children it reaped: `watch nvidia-smi`) "
        "not counted as work; a monitor that uses more keeps the session (a computation named `top` "
        "is not discounted).",
    )
    frontend_cpu_allowance: NonNegFloat = Field(
        0.05,
        description="Cores of a notebook's front-end server's own CPU (Jupyter's server, JupyterHub's "
        "single-user server, code-server, RStudio Server; not its kernels) not counted as work: it "
        "answers an open tab's polls. A front-end that uses more keeps the session; a kernel's CPU "
        "is never discounted.",
    )
    memory_growth: Quantity = Field(
        Quantity("64Mi"),
        description="GPU memory moving by more than this over the window (up or down) is activity.",
    )
    coverage: float = Field(
        0.9,
        gt=0,
        le=1,
        description="The share of the window's expected samples each series must have; fewer is a "
        "gap that might hide activity: UNKNOWN.",
    )
    cpu_source: Annotated[dict[str, str], AfterValidator(_cpu_source)] = Field(
        default_factory=lambda: {"job": "kubelet", "metrics_path": "/metrics/cadvisor"},
        description="The scrape whose container_cpu_usage_seconds_total is read (the kubelet's "
        "cAdvisor endpoint; kube-prometheus-stack's job and path): label -> regex, never the metric "
        "name and pod labels alone.",
    )
    teams: dict[str, TeamIdleSessions] = Field(
        default_factory=dict,
        description="Per-team overrides (team name -> any of mode, after, warnBefore, maxSnooze, classes).",
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        return _mode(value)

    def bound_issues(self) -> list[tuple[str, str]]:
        """(key path under idleSessions, message) for every `after` outside afterBounds: the file
        sets both, so one outside the range the annotation may reach is a slip."""
        lo, hi = self.after_bounds.min, self.after_bounds.max
        afters = [("after", self.after)] + [
            (f"teams.{t}.after", o.after) for t, o in self.teams.items() if o.after is not None
        ]
        return [
            (where, f"{after} lies outside afterBounds ({lo} to {hi})")
            for where, after in afters
            if not lo.seconds <= after.seconds <= hi.seconds
        ]

    def for_team(self, team: str | None) -> ResolvedIdlePolicy:
        """The policy a team's workloads get: the file's, with the team's overrides."""
        o = self.teams.get(team or "") or TeamIdleSessions()
        return ResolvedIdlePolicy(
            mode=o.mode or self.mode,
            after_s=(o.after or self.after).seconds,
            warn_before_s=(o.warn_before or self.warn_before).seconds,
            max_snooze_s=(o.max_snooze or self.max_snooze).seconds,
            classes=o.classes or self.classes,
            cpu_below=self.cpu_below,
            monitor_cpu_allowance=self.monitor_cpu_allowance,
            frontend_cpu_allowance=self.frontend_cpu_allowance,
            memory_growth_bytes=int(self.memory_growth.value),
            coverage=self.coverage,
            after_min_s=self.after_bounds.min.seconds,
            after_max_s=self.after_bounds.max.seconds,
        )


class ResolvedIdlePolicy(BaseModel):
    """One team's policy in seconds, what the evidence ladder reads."""

    model_config = ConfigDict(frozen=True)

    mode: Mode
    after_s: float
    warn_before_s: float
    max_snooze_s: float
    classes: SessionClasses
    cpu_below: float
    monitor_cpu_allowance: float
    frontend_cpu_allowance: float = 0.0
    memory_growth_bytes: int
    coverage: float
    after_min_s: float
    after_max_s: float
    note: str = ""  # how a Namespace annotation changed `after`, for the Event

    def with_namespace(self, annotations: Mapping[str, str] | None) -> ResolvedIdlePolicy:
        """`after` as the Namespace's ghostgpu.io/idle-after sets it, clamped to the file's bounds.
        An unreadable value changes nothing and says so (the note)."""
        raw = (annotations or {}).get(AFTER_ANNOTATION)
        if raw is None:
            return self
        try:
            seconds = Duration._validate(raw).seconds
        except Exception:
            return self.model_copy(
                update={"note": f"namespace {AFTER_ANNOTATION}={raw[:64]!r} is not a duration: ignored"}
            )
        clamped = min(max(seconds, self.after_min_s), self.after_max_s)
        note = f"namespace {AFTER_ANNOTATION}={raw[:64]}"
        if clamped != seconds:
            note += f" clamped to {clamped:g}s (afterBounds)"
        return self.model_copy(update={"after_s": clamped, "note": note})
