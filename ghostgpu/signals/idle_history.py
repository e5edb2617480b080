"""The idle-session history: one PromQL query per poll over the candidates' pods (docs/idle-sessions.md).

Only workloads that are IDLE_HELD and covered by `controller.idleSessions` are read, so the query
names those pods alone (a handful, not the fleet). It reads, per pod, over the policy's window
ending now (so a restarted controller neither forgets an idle session nor shortens its clock):

- the busiest utilization sample and how many samples there were (max/count_over_time);
- GPU memory's lowest and highest sample (min/max_over_time of the framebuffer series);
- the container CPU seconds used (increase of cAdvisor's container_cpu_usage_seconds_total, from
  the scrape `idleSessions.cpuSource` names) and how many samples there were;
- the time the GPU was last busy within the lookback (a subquery of timestamp(util > zero)).

Every series is selected by its source (the scrape that produces it), never by name and pod
labels alone. Each field is tagged (`ghostgpu_field`) so one answer carries all of them. A pod with
no answer for a field has a MISSING failure there, never a zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ghostgpu.config import MetricsPreset, _promql_alternation
from ghostgpu.idle_policy import SessionClass
from ghostgpu.idle_sessions import WindowEvidence
from ghostgpu.promql import label_matchers
from ghostgpu.verdict import FailureReason, SignalFailure

_T = TypeVar("_T", int, float)

FIELDS = (
    "util_max", "util_count", "fb_min", "fb_max", "cpu", "cpu_count", "last_busy",
    "newest_start", "agent_count", "running", "tty_changes", "monitor_cpu", "frontend_cpu",
)  # fmt: skip
CPU_METRIC = "container_cpu_usage_seconds_total"
AGENT = "ghostgpu_agent_container_"
# The class of a pod's containers, as the agent tells it: field class_<name> = 1.
CLASS_PREFIX = "class_"


def _duration(seconds: float) -> str:
    return f"{max(1, int(seconds))}s"


def history_query(
    preset: MetricsPreset,
    cpu_source: Mapping[str, str],
    agent_source: Mapping[str, str],
    pods: Sequence[tuple[str, str]],
    *,
    window_s: float,
    lookback_s: float,
    step_s: float,
    zero_threshold: float,
) -> str:
    """One PromQL query for every field of every candidate pod (module docstring)."""
    ns_label, pod_label = preset.namespace_label, preset.pod_label
    namespaces = _promql_alternation(sorted({ns for ns, _ in pods}))
    names = _promql_alternation(sorted({p for _, p in pods}))
    gpu = f'{label_matchers(preset.source)}, {ns_label}=~"{namespaces}", {pod_label}=~"{names}"'
    # cAdvisor's series name the pod by `namespace`/`pod`; container="" is the pod's own cgroup
    # total and POD the sandbox: only the containers themselves are summed.
    cpu = (
        f'{label_matchers(cpu_source)}, namespace=~"{namespaces}", pod=~"{names}", '
        f'container!="", container!="POD"'
    )
    w, lb, step = _duration(window_s), _duration(lookback_s), _duration(step_s)
    util = f"{preset.utilization_metric}{{{gpu}}}"
    fb = f"{preset.framebuffer_metric}{{{gpu}}}"
    by = f"{ns_label}, {pod_label}"
    scale = preset.utilization_scale
    threshold = zero_threshold / scale if scale else zero_threshold
    parts = {
        "util_max": f"max by ({by}) (max_over_time({util}[{w}])) * {scale!r}",
        "util_count": f"min by ({by}) (count_over_time({util}[{w}]))",
        "fb_min": f"sum by ({by}) (min_over_time({fb}[{w}])) * {preset.framebuffer_unit_bytes}",
        "fb_max": f"sum by ({by}) (max_over_time({fb}[{w}])) * {preset.framebuffer_unit_bytes}",
        "cpu": _relabel(
            f"sum by (namespace, pod) (increase({CPU_METRIC}{{{cpu}}}[{w}]))", ns_label, pod_label
        ),
        "cpu_count": _relabel(
            f"min by (namespace, pod) (count_over_time({CPU_METRIC}{{{cpu}}}[{w}]))", ns_label, pod_label
        ),
        "last_busy": f"max by ({by}) (max_over_time((timestamp({util} > {threshold!r}))[{lb}:{step}]))",
    }
    # The node agent's idle-session facts (agent/idle_facts.py), by its own label names.
    agent = f'{label_matchers(agent_source)}, tracked_namespace=~"{namespaces}", tracked_pod=~"{names}"'
    tb = "tracked_namespace, tracked_pod"
    for name, expr in {
        "newest_start": f"max by ({tb}) (max_over_time({AGENT}newest_start_seconds{{{agent}}}[{w}]))",
        "agent_count": f"min by ({tb}) (count_over_time({AGENT}newest_start_seconds{{{agent}}}[{w}]))",
        "running": f"max by ({tb}) (max_over_time({AGENT}running{{{agent}}}[{w}]))",
        "tty_changes": f"sum by ({tb}) (changes({AGENT}tty_wakeups{{{agent}}}[{w}]))",
        "monitor_cpu": f"sum by ({tb}) (increase({AGENT}monitor_cpu_seconds{{{agent}}}[{w}]))",
        "frontend_cpu": f"sum by ({tb}) (increase({AGENT}frontend_cpu_seconds{{{agent}}}[{w}]))",
    }.items():
        parts[name] = _relabel(expr, ns_label, pod_label, "tracked_namespace", "tracked_pod")
    classes = _relabel(
        f"count by ({tb}, class) (last_over_time({AGENT}newest_start_seconds{{{agent}}}[{w}]))",
        ns_label,
        pod_label,
        "tracked_namespace",
        "tracked_pod",
    )
    fields = [f'label_replace({expr}, "ghostgpu_field", "{name}", "", "")' for name, expr in parts.items()]
    fields.append(f'label_replace({classes}, "ghostgpu_field", "{CLASS_PREFIX}$1", "class", "(.+)")')
    return " or ".join(fields)


def _relabel(
    expr: str, ns_label: str, pod_label: str, ns_from: str = "namespace", pod_from: str = "pod"
) -> str:
    """Another source's namespace/pod labels under the GPU preset's names, so the fields group
    alike (the source's own labels are dropped by the aggregation around it)."""
    if ns_label != ns_from:
        expr = f'label_replace({expr}, "{ns_label}", "$1", "{ns_from}", "(.*)")'
    if pod_label != pod_from:
        expr = f'label_replace({expr}, "{pod_label}", "$1", "{pod_from}", "(.*)")'
    return expr


@dataclass
class PodHistory:
    """One pod's fields; absent ones are failures when read (`get`)."""

    values: dict[str, float] = field(default_factory=dict)

    def get(self, name: str) -> float | SignalFailure:
        if name in self.values:
            return self.values[name]
        return SignalFailure(reason=FailureReason.MISSING, detail=f"no {name} history for the pod")


def parse_history(
    rows: Iterable[tuple[Mapping[str, str], float]], ns_label: str, pod_label: str
) -> dict[tuple[str, str], PodHistory]:
    """(labels, value) rows of the answer -> per (namespace, pod) fields. A field seen twice for a
    pod (two series the grouping should have merged) keeps the value that is less idle."""
    out: dict[tuple[str, str], PodHistory] = {}
    for labels, value in rows:
        name = labels.get("ghostgpu_field", "")
        key = (labels.get(ns_label, ""), labels.get(pod_label, ""))
        if not (name in FIELDS or name.startswith(CLASS_PREFIX)) or not all(key):
            continue
        h = out.setdefault(key, PodHistory())
        old = h.values.get(name)
        if old is None:
            h.values[name] = value
        elif name in ("util_count", "cpu_count", "fb_min", "agent_count", "monitor_cpu", "frontend_cpu"):
            # The fewer samples, the lower memory floor, the smaller discount: each less idle.
            h.values[name] = min(old, value)
        else:
            h.values[name] = max(old, value)
    return out


@dataclass(frozen=True)
class WorkloadHistory:
    """A workload's fields over all its pods: the busiest, the fewest samples, the memory range."""

    gpu_util_max: float | SignalFailure
    gpu_samples: int | SignalFailure
    memory_min_bytes: float | SignalFailure
    memory_max_bytes: float | SignalFailure
    cpu_seconds: float | SignalFailure
    cpu_samples: int | SignalFailure
    last_busy_at: float | SignalFailure | None
    # The agent's: the newest process start (unix time), how many of its scans the window holds,
    # running processes, changes of the terminal wakeups, monitor CPU seconds (None: no monitor).
    newest_start: float | SignalFailure
    agent_samples: int | SignalFailure
    running: int | SignalFailure
    tty_changes: float | SignalFailure
    monitor_cpu: float | None
    frontend_cpu: float | None  # a notebook front-end server's own CPU seconds (None: none runs)
    # The most doubtful class any pod's containers have (idle_sessions.class_of's order); None
    # when a pod reports none (a program no list knows, or no agent series).
    session_class: SessionClass | None

    def evidence(
        self, *, window_s: float, expected_samples: int, lookback_s: float, now: float
    ) -> WindowEvidence:
        """The ladder's input (idle_sessions.climb). Agent facts from fewer scans than the GPU
        series needs are a failure: a gap may hide a process that came and went."""
        thin = SignalFailure(reason=FailureReason.STALE, detail="too few agent scans in the window")
        agent_ok = not isinstance(self.agent_samples, SignalFailure) and self.agent_samples > 0

        def scanned(v: _T | SignalFailure) -> _T | SignalFailure:
            """An agent fact as read, or `thin` when the window holds no scan of the agent's."""
            return v if agent_ok or isinstance(v, SignalFailure) else thin

        age = scanned(self.newest_start)
        if not isinstance(age, SignalFailure):
            age = now - age
        return WindowEvidence(
            window_s=window_s,
            expected_samples=expected_samples,
            gpu_util_max=self.gpu_util_max,
            gpu_samples=self.gpu_samples,
            memory_min_bytes=self.memory_min_bytes,
            memory_max_bytes=self.memory_max_bytes,
            cpu_seconds=self.cpu_seconds,
            cpu_samples=self.cpu_samples,
            monitor_cpu_seconds=self.monitor_cpu,
            frontend_cpu_seconds=self.frontend_cpu,
            youngest_process_age_s=age,
            running_processes=scanned(self.running),
            terminal_wakeups=scanned(self.tty_changes),
            last_busy_at=self.last_busy_at,
            lookback_s=lookback_s,
        )


def workload_history(
    pods: Sequence[tuple[str, str]], history: Mapping[tuple[str, str], PodHistory]
) -> WorkloadHistory:
    """Fold a workload's pods: a field failed on any pod fails for the workload (a pod that was not
    read may be the one at work), except last_busy, which is absent when nothing was busy."""
    empty = PodHistory()
    per = [history.get(p, empty) for p in pods]

    def fold(name: str, how: str) -> float | SignalFailure:
        vals = [h.get(name) for h in per]
        bad = next((v for v in vals if isinstance(v, SignalFailure)), None)
        if bad is not None or not vals:
            return bad or SignalFailure(reason=FailureReason.MISSING, detail="no pods")
        nums = [v for v in vals if isinstance(v, float)]
        return {"max": max, "min": min, "sum": sum}[how](nums)

    def count(name: str) -> int | SignalFailure:
        v = fold(name, "min")
        return v if isinstance(v, SignalFailure) else int(v)

    busy = [h.values["last_busy"] for h in per if "last_busy" in h.values]
    monitors = [h.values["monitor_cpu"] for h in per if "monitor_cpu" in h.values]
    frontends = [h.values["frontend_cpu"] for h in per if "frontend_cpu" in h.values]
    classes: list[SessionClass] = []
    for h in per:
        mine = [SessionClass(n[len(CLASS_PREFIX) :]) for n in h.values if _known_class(n)]
        if not mine:
            classes = []
            break
        classes.extend(mine)
    running = fold("running", "max")
    return WorkloadHistory(
        gpu_util_max=fold("util_max", "max"),
        gpu_samples=count("util_count"),
        memory_min_bytes=fold("fb_min", "sum"),
        memory_max_bytes=fold("fb_max", "sum"),
        cpu_seconds=fold("cpu", "sum"),
        cpu_samples=count("cpu_count"),
        last_busy_at=max(busy) if busy else None,
        newest_start=fold("newest_start", "max"),
        agent_samples=count("agent_count"),
        running=running if isinstance(running, SignalFailure) else int(running),
        tty_changes=fold("tty_changes", "sum"),
        monitor_cpu=sum(monitors) if monitors else None,
        frontend_cpu=sum(frontends) if frontends else None,
        session_class=_doubtful(classes),
    )


_ORDER = (
    SessionClass.OTHER,
    SessionClass.SERVER,
    SessionClass.NOTEBOOK,
    SessionClass.TERMINAL,
    SessionClass.MONITOR,
)


def _known_class(field_name: str) -> bool:
    return field_name.startswith(CLASS_PREFIX) and field_name[len(CLASS_PREFIX) :] in {
        c.value for c in SessionClass
    }


def _doubtful(classes: list[SessionClass]) -> SessionClass | None:
    return min(classes, key=_ORDER.index) if classes else None
