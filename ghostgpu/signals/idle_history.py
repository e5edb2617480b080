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

from ghostgpu.config import MetricsPreset, _promql_alternation
from ghostgpu.promql import label_matchers
from ghostgpu.verdict import FailureReason, SignalFailure

FIELDS = ("util_max", "util_count", "fb_min", "fb_max", "cpu", "cpu_count", "last_busy")
CPU_METRIC = "container_cpu_usage_seconds_total"


def _duration(seconds: float) -> str:
    return f"{max(1, int(seconds))}s"


def history_query(
    preset: MetricsPreset,
    cpu_source: Mapping[str, str],
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
    return " or ".join(
        f'label_replace({expr}, "ghostgpu_field", "{name}", "", "")' for name, expr in parts.items()
    )


def _relabel(expr: str, ns_label: str, pod_label: str) -> str:
    """cAdvisor's namespace/pod labels under the GPU preset's names, so the fields group alike."""
    if ns_label != "namespace":
        expr = f'label_replace({expr}, "{ns_label}", "$1", "namespace", "(.*)")'
    if pod_label != "pod":
        expr = f'label_replace({expr}, "{pod_label}", "$1", "pod", "(.*)")'
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
        if name not in FIELDS or not all(key):
            continue
        h = out.setdefault(key, PodHistory())
        old = h.values.get(name)
        if old is None:
            h.values[name] = value
        elif name in ("util_count", "cpu_count", "fb_min"):
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
    return WorkloadHistory(
        gpu_util_max=fold("util_max", "max"),
        gpu_samples=count("util_count"),
        memory_min_bytes=fold("fb_min", "sum"),
        memory_max_bytes=fold("fb_max", "sum"),
        cpu_seconds=fold("cpu", "sum"),
        cpu_samples=count("cpu_count"),
        last_busy_at=max(busy) if busy else None,
    )
