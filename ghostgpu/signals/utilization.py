"""GPU utilization: ONE batched PromQL query per poll for every tracked pod.

The query selects the tracked pods' namespaces (not each pod: its size does not grow with the
fleet) and the series are matched to the tracked pods here.

The query returns kinds of series told apart by a `ghostgpu_field` label that the query itself
adds with `label_replace`, so a single HTTP round trip carries:
  util  max utilization over the pod's GPUs, only for a pod whose oldest GPU sample is fresh
  ts    min `timestamp()` of the pod's GPU series, only for a pod whose oldest sample is stale
  xid   last XID error code per GPU, when non-zero      (fault evidence, docs/design.md#signals)
  fb    framebuffer used, summed over the pod's GPUs, in bytes, only for a pod at or under the
        zero threshold (GPU memory evidence: the verdict reads it only for an all-zero window)
  proc, prog, scan, unseen
        the node agent's series of the containers of those same pods, when processes come from
        the agent (signals/agent.py): the processes signal rides in the same request
  dev   with DRA flavors (`QuerySpec.dra_devices`), one series per DRA device of a pod at or
        under the zero threshold: its dcgm-exporter labels dra_driver_name, dra_pool_name,
        dra_device_name (`--kubernetes-enable-dra`; the series also carry pod/namespace/container)

Prometheus does the filtering so the answer has about one series per pod, not three: at 50,000
pods, three series per pod were ~150,000 JSON objects to parse on every poll, most of the
controller's peak memory.

Failure rules (never a silent zero): the query failing as a whole fails every pod; a pod with a
`ts` series is STALE (its age is in the detail); a pod with neither `util` nor `ts` is MISSING; a
pod with a `util` reading at or under the zero threshold but no `fb` series has a MISSING memory
reading (its utilization stands). A DRA pod at or under the zero threshold that lacks a `dev`
series of one of its claims' GPU devices (the controller knows them: claims.py) is MISSING,
naming the device: a GPU without a series is a failed signal, never an idle one. Over the zero
threshold the check is not needed (the reading is the max over its GPUs: a GPU without a series
cannot make it idle) and not asked for, so a busy DRA fleet adds no series to the answer.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from string import Template
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ghostgpu.promql import label_matchers
from ghostgpu.signals.agent import AGENT_FIELDS, AgentAnswer, AgentSeries, query_parts
from ghostgpu.signals.dra import (
    DCGM_DRA_LABELS,
    DEVICE_FIELD,
    DeviceId,
    DraDevice,
    device_part,
    no_series,
    without_series,
)
from ghostgpu.signals.prometheus import (
    PrometheusClient,
    PrometheusError,
    VectorSample,
    iter_answer,
    newest_sample_time,
)
from ghostgpu.verdict import (
    FailureReason,
    GpuMemory,
    SignalFailure,
    UtilizationSample,
    XidEvent,
    window_runs,
)

FIELD_LABEL = "ghostgpu_field"
# The fields of the answer that only a forged or broken producer makes (the query asks for them
# all the same, so that they fail the pod rather than go unseen): a sample ahead of the clock, the
# UIDs a pod's series name, a negative framebuffer sample.
AHEAD_FIELD, UID_FIELD, FB_NEGATIVE_FIELD = "ahead", "uid", "fbneg"
# How many series of the answer a poll may read per pod it asks about (a pod's reading, memory,
# XIDs per GPU, DRA devices, and per GPU container the agent's roles, programs and scan), and the
# bytes per series: a larger answer (series of pods that do not exist, flooded into a tracked
# namespace) fails every pod's signals instead of filling the controller's memory.
SERIES_PER_POD = 64
SERIES_SLACK = 1000
BYTES_PER_SERIES = 1024
# Kubernetes object names (DNS-1123 subdomain): the only characters we ever put into a regex.
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_PROM_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_PROM_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


class QuerySpec(BaseModel):
    """What to query and how series map to pods (built from the config's metrics preset).

    `utilization_query` / `xid_query` are the config's `string.Template` PromQL with placeholders
    ${namespace_label} ${pod_label} ${namespaces} ${pods} ${utilization_metric} ${xid_metric}
    ${framebuffer_metric}; None uses the built-in `max by (namespace, pod)` form.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str = Field(pattern=_PROM_METRIC.pattern)
    # The label matchers of the scrape that produces the GPU series (promql.label_matchers of the
    # preset's `source`): every selector of the query carries them, so a series of another target
    # with the same name and pod labels is never read (docs/threat-model.md).
    source: str = Field(min_length=1)
    xid_source: str = ""  # "" : `source`
    agent_source: str = ""  # the node agent's scrape; required with agent_processes
    pod_label: str = Field("pod", pattern=_PROM_LABEL.pattern)
    namespace_label: str = Field("namespace", pattern=_PROM_LABEL.pattern)
    gpu_label: str = Field("gpu", pattern=_PROM_LABEL.pattern)
    # Readings are percent (0-100); ratio metrics such as DCGM_FI_PROF_GR_ENGINE_ACTIVE use 100.
    scale: float = Field(1.0, gt=0)
    xid_metric: str | None = Field(None, pattern=_PROM_METRIC.pattern)
    framebuffer_metric: str = ""
    framebuffer_unit_bytes: int = Field(1 << 20, gt=0)  # dcgm-exporter reports MiB
    utilization_query: str | None = None
    xid_query: str | None = None
    framebuffer_query: str | None = None  # None: no memory series in the query (memory not collected)
    # A sample older than this (seconds, relative to the query's evaluation time) is STALE.
    max_sample_age: float = Field(120.0, gt=0)
    # Two scrape intervals (seconds): the reading is the busiest sample in it, so a second producer
    # interleaving zeros between a busy exporter's samples cannot make the pod read idle.
    window: float = Field(60.0, gt=0)
    # How far (seconds) a sample's time or the agent's scan time may lead the controller's clock.
    max_clock_skew: float = Field(5.0, ge=0)
    # The exporter's label carrying the pod's UID ("": the exporter writes none, nothing to check).
    pod_uid_label: str = Field("", pattern=r"^([a-zA-Z_][a-zA-Z0-9_]*)?$")
    # Utilization (percent, after `scale`) counted as zero: GPU memory is asked for only up to here.
    zero_threshold: float = Field(0.0, ge=0)
    # The node agent's series for the pods at or under the zero threshold (processSource: agent).
    agent_processes: bool = False
    # DRA flavors: each DRA GPU of a pod at or under the zero threshold must have its series,
    # matched by dcgm-exporter's device labels (driver, pool, device).
    dra_devices: bool = False
    dra_labels: tuple[str, str, str] = DCGM_DRA_LABELS

    @classmethod
    def from_preset(
        cls,
        preset: Any,
        *,
        max_sample_age: float,
        zero_threshold: float = 0.0,
        agent_processes: bool = False,
        dra_devices: bool = False,
        window: float = 60.0,
        max_clock_skew: float = 5.0,
        agent_source: Mapping[str, str] | None = None,
    ) -> QuerySpec:
        """From `ghostgpu.config.MetricsPreset` (duck-typed: signals do not import the config)."""
        return cls(
            metric=preset.utilization_metric,
            source=label_matchers(preset.source),
            xid_source=label_matchers(preset.xid_source),
            agent_source=label_matchers(agent_source) if agent_source else "",
            window=window,
            max_clock_skew=max_clock_skew,
            pod_uid_label=preset.pod_uid_label,
            pod_label=preset.pod_label,
            namespace_label=preset.namespace_label,
            scale=preset.utilization_scale,
            xid_metric=preset.xid_metric or None,
            framebuffer_metric=preset.framebuffer_metric,
            framebuffer_unit_bytes=preset.framebuffer_unit_bytes,
            utilization_query=preset.utilization_query,
            xid_query=preset.xid_query or None,
            framebuffer_query=preset.framebuffer_query or None,
            max_sample_age=max_sample_age,
            zero_threshold=zero_threshold,
            agent_processes=agent_processes,
            dra_devices=dra_devices,
        )

    @model_validator(mode="after")
    def _agent_pinned(self) -> QuerySpec:
        if self.agent_processes and not self.agent_source:
            raise ValueError("agent_processes needs agent_source: the node agent's scrape")
        return self

    @field_validator("dra_labels")
    @classmethod
    def _label_names(cls, v: tuple[str, str, str]) -> tuple[str, str, str]:
        bad = [n for n in v if not _PROM_LABEL.match(n)]
        if bad:
            raise ValueError(f"not Prometheus label names: {bad}")
        return v


class PodKey(NamedTuple):
    """(namespace, name): a tuple, hashed in C (one lookup per pod per poll, N = 10,000)."""

    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class PodReading:
    """One pod's share of one poll."""

    utilization: UtilizationSample
    xids: tuple[XidEvent, ...] = ()
    memory: int | SignalFailure | None = None  # framebuffer bytes; None: not in the query


def _alternation(names: Iterable[str]) -> str:
    # Names are validated DNS-1123, so '.' is the only regex metacharacter left to escape
    # (doubled because the regex sits inside a PromQL string literal).
    return "|".join(n.replace(".", "\\\\.") for n in sorted(set(names)))


# What `${pods}` selects: any pod of the selected namespaces. The query names the namespaces of
# the tracked pods and the controller keeps the tracked pods' series (readings_from_samples), so the
# query stays a few hundred bytes however many pods there are; an alternation of every pod name was
# ~1 MB at 50,000 pods, for Prometheus to compile into a regex on every poll.
ANY_POD = ".+"


def _template_vars(spec: QuerySpec, pods: list[PodKey]) -> dict[str, str]:
    return {
        "namespace_label": spec.namespace_label,
        "pod_label": spec.pod_label,
        "namespaces": _alternation(p.namespace for p in pods),
        "pods": ANY_POD,
        "utilization_metric": spec.metric,
        "xid_metric": spec.xid_metric or "",
        "framebuffer_metric": spec.framebuffer_metric,
        "source": spec.source,
        "window": f"{spec.window:g}s",
    }


# How far past `now` the query looks for samples ahead of the clock: under Prometheus's default
# lookback (5m), so that `timestamp(x @ now+AHEAD_HORIZON)` is the newest sample up to then. A
# producer whose samples lead by more than the skew has some in (now+skew, now+horizon] as long as
# it keeps writing: however far ahead it writes, the samples it wrote a while ago land there.
AHEAD_HORIZON = 240.0


def _selector(spec: QuerySpec, variables: Mapping[str, str]) -> str:
    """The label matchers inside every selector of the GPU series: source, namespaces, any pod."""
    return Template('${source}, ${namespace_label}=~"${namespaces}", ${pod_label}=~"${pods}"').substitute(
        variables
    )


def build_query(
    spec: QuerySpec,
    pods: Iterable[PodKey],
    *,
    now: float | None = None,
    agent_pods: Collection[PodKey] | None = None,
) -> str:
    """The one PromQL expression for this poll. Raises ValueError on an invalid namespace name:
    namespaces are the only names written into the query (every pod is matched by ANY_POD and
    filtered in the controller). With `now` (what the poll passes), the query also asks for pods
    with samples ahead of the controller's clock. With `agent_pods`, the node agent's series are
    asked for those pods by name (none: no agent part), instead of for every pod at zero."""
    pods = list(pods)
    for ns in {p.namespace for p in pods} | {p.namespace for p in agent_pods or ()}:
        if not _K8S_NAME.match(ns):
            raise ValueError(f"not a Kubernetes namespace name: {ns!r}")
    if agent_pods and not all(_K8S_NAME.match(p.name) for p in agent_pods):
        raise ValueError("not a Kubernetes pod name among the agent's pods")
    variables = _template_vars(spec, pods)
    inner = _selector(spec, variables)
    sel = "{" + inner + "}"
    by = f"{spec.namespace_label}, {spec.pod_label}"
    window = variables["window"]
    if spec.utilization_query:
        util = Template(spec.utilization_query).substitute(variables)
    else:
        util = f"max by ({by}) (max_over_time({spec.metric}{sel}[{window}]))"
    if spec.scale != 1.0:
        util = f"({util}) * {spec.scale:g}"
    # timestamp() only reports a sample's own time on a plain selector, so staleness is read from
    # the metric itself, whatever the utilization template aggregates. `time()` is the query's
    # evaluation time. Every pod gets its reading, a stale one also its oldest sample's time, which
    # fails the reading (_readings): one pass over the series for the time, not a second to keep
    # the reading from stale pods.
    oldest = f"min by ({by}) (timestamp({spec.metric}{sel}))"
    since = f"time() - {spec.max_sample_age:g}"
    parts = [
        f'label_replace({util}, "{FIELD_LABEL}", "util", "", "")',
        f'label_replace({oldest} < {since}, "{FIELD_LABEL}", "ts", "", "")',
    ]
    zero = f"({util}) <= {spec.zero_threshold:g}"
    if now is not None:
        names = sorted({spec.metric, spec.framebuffer_metric} - {""})
        newest = newest_sample_time(names, inner, by, now + AHEAD_HORIZON)
        ahead = f"{newest} > {now + spec.max_clock_skew:.3f}"
        parts.append(f'label_replace({ahead}, "{FIELD_LABEL}", "{AHEAD_FIELD}", "", "")')
    # The parts read only for the pods at or under the zero threshold (the ones a reclaim could
    # follow), kept with ONE `and on(...) (zero)`: Prometheus evaluates the utilization expression
    # again for every `zero` the query names (no common subexpressions), at 50,000 pods ~0.4-1 s
    # each on the bench's machine.
    at_zero: list[str] = []
    if spec.pod_uid_label:
        # The UIDs the pod's series name.
        uid = spec.pod_uid_label
        at_zero.append(
            f'label_replace(group by ({by}, {uid}) ({spec.metric}{{{inner}, {uid}!=""}}), '
            f'"{FIELD_LABEL}", "{UID_FIELD}", "", "")'
        )
    if spec.framebuffer_query:
        fb = Template(spec.framebuffer_query).substitute(variables)
        if spec.framebuffer_unit_bytes != 1:
            fb = f"({fb}) * {spec.framebuffer_unit_bytes}"
        at_zero.append(f'label_replace({fb}, "{FIELD_LABEL}", "fb", "", "")')
        # A negative sample is no memory reading: it fails the pod's memory rather than being summed.
        parts.append(
            f"label_replace(min by ({by}) (min_over_time({spec.framebuffer_metric}{sel}[{window}])) < 0, "
            f'"{FIELD_LABEL}", "{FB_NEGATIVE_FIELD}", "", "")'
        )
    xvars = {**variables, "source": spec.xid_source or spec.source}
    if spec.xid_query:
        xid = Template(spec.xid_query).substitute(xvars)
        parts.append(f'label_replace(({xid}) > 0, "{FIELD_LABEL}", "xid", "", "")')
    elif spec.xid_metric:
        xsel = "{" + _selector(spec, xvars) + "}"
        parts.append(
            f"label_replace(max by ({by}, {spec.gpu_label}) ({spec.xid_metric}{xsel} > 0), "
            f'"{FIELD_LABEL}", "xid", "", "")'
        )
    if spec.dra_devices:
        at_zero.append(device_part(spec.metric, sel, by, spec.dra_labels, FIELD_LABEL))
    if at_zero:
        parts.append(f"({' or '.join(at_zero)}) and on({by}) ({zero})")
    if spec.agent_processes and (agent_pods is None or agent_pods):
        named = None if agent_pods is None else _alternation(p.name for p in agent_pods)
        parts += query_parts(
            variables["namespaces"] if agent_pods is None else _alternation(p.namespace for p in agent_pods),
            zero,
            namespace_label=spec.namespace_label,
            pod_label=spec.pod_label,
            field_label=FIELD_LABEL,
            source=spec.agent_source,
            window=window,
            ahead=(now + AHEAD_HORIZON, now + spec.max_clock_skew) if now is not None else None,
            ahead_field=AHEAD_FIELD,
            pods=named,
        )
    return " or ".join(parts)


def every_signal_query(spec: QuerySpec, pods: Iterable[PodKey], *, agent: bool = False) -> str:
    """Every pod's reading, oldest sample time and GPU memory, unfiltered (three series per pod),
    and with `agent` the node agent's series of every pod's GPU containers (the parts build_query
    adds, asked for every pod rather than the utilization-idle ones): what a poll that reads every
    signal of every pod parses (build_query asks Prometheus for about one series per pod). A fixed
    amount of work for `ghostgpu bench scale` to measure the machine's speed with, whatever the
    controller's query asks."""
    pods = list(pods)
    variables = _template_vars(spec, pods)
    sel = "{" + _selector(spec, variables) + "}"
    by = f"{spec.namespace_label}, {spec.pod_label}"
    util = f"max by ({by}) ({spec.metric}{sel})"
    parts = [
        f'label_replace({util}, "{FIELD_LABEL}", "util", "", "")',
        f'label_replace(min by ({by}) (timestamp({spec.metric}{sel})), "{FIELD_LABEL}", "ts", "", "")',
    ]
    if spec.framebuffer_metric:
        fb = f"sum by ({by}) ({spec.framebuffer_metric}{sel})"
        parts.append(f'label_replace({fb}, "{FIELD_LABEL}", "fb", "", "")')
    if agent:
        parts += query_parts(
            variables["namespaces"],
            util,  # every pod with a reading, not only the idle ones
            namespace_label=spec.namespace_label,
            pod_label=spec.pod_label,
            field_label=FIELD_LABEL,
            source=spec.agent_source or spec.source,
            window=variables["window"],
        )
    return " or ".join(parts)


def readings_from_samples(
    spec: QuerySpec,
    pods: Iterable[PodKey],
    eval_time: float,
    samples: Sequence[VectorSample],
    agent: AgentAnswer | None = None,
    devices: Mapping[PodKey, Sequence[DraDevice]] | None = None,
    uids: Mapping[PodKey, str] | None = None,
) -> dict[PodKey, PodReading]:
    """Turn the query's series into one reading per requested pod (pure; tested without HTTP);
    the node agent's series go into `agent`; `devices` are the DRA GPUs each pod must have a
    series of (PodView.dra_devices); `uids` the live pods' UIDs their series must name."""
    series = ((s.timestamp, s.labels, s.value) for s in samples)
    return _readings(spec, pods, eval_time, series, agent, devices, uids)


def max_series(pods: int) -> int:
    """The most series a poll's answer may hold when it asks about `pods` pods."""
    return SERIES_PER_POD * pods + SERIES_SLACK


def _readings(
    spec: QuerySpec,
    pods: Iterable[PodKey],
    default_eval_time: float,
    series: Iterable[tuple[float, Mapping[str, str], float]],
    agent: AgentAnswer | None = None,
    devices: Mapping[PodKey, Sequence[DraDevice]] | None = None,
    uids: Mapping[PodKey, str] | None = None,
    wanted: frozenset[PodKey] | None = None,
) -> dict[PodKey, PodReading]:
    """(evaluation time, labels, value) series -> one reading per pod. The query selects whole
    namespaces: series of pods not asked for are dropped here, before anything of them is kept.
    The node agent's series are collected into `agent` (dropped when it is None). More series than
    max_series(pods) raise PrometheusError: every pod fails."""
    pods = list(pods)
    # The set the caller has already built (UtilizationSource.poll: the agent's answer keeps it
    # too), not a second one of 50,000 keys per poll.
    wanted = frozenset(pods) if wanted is None else wanted
    limit = max_series(len(wanted))
    util: dict[tuple[str, str], float] = {}
    stamp: dict[tuple[str, str], float] = {}
    xids: dict[tuple[str, str], list[XidEvent]] = {}
    fb: dict[tuple[str, str], float] = {}
    seen: dict[tuple[str, str], set[DeviceId]] = {}  # DRA devices with a series
    untrusted: dict[tuple[str, str], str] = {}  # why a pod's series cannot be believed
    negative_fb: set[tuple[str, str]] = set()
    drv_label, pool_label, dev_label = spec.dra_labels
    ns_label, pod_label, uid_label = spec.namespace_label, spec.pod_label, spec.pod_uid_label
    eval_time = default_eval_time
    count = 0
    for ts, labels, value in series:
        count += 1
        if count > limit:
            raise PrometheusError(
                FailureReason.OTHER,
                f"the answer holds more than {limit} series for {len(wanted)} pods "
                f"(series of pods that do not exist in a tracked namespace?)",
            )
        eval_time = ts
        key = (labels.get(ns_label, ""), labels.get(pod_label, ""))
        kind = labels.get(FIELD_LABEL)
        if kind == "xid" and key not in wanted:
            # An XID template may use the exporter's own namespace/pod labels (HAMi preset).
            key = (labels.get("namespace", ""), labels.get("pod", ""))
        if kind in AGENT_FIELDS:
            if agent is not None:
                agent.add(kind, labels, value)  # type: ignore[arg-type]
            continue
        if key not in wanted:
            continue
        if kind == "util":
            util[key] = value
        elif kind == "ts":
            stamp[key] = value
        elif kind == "fb":
            fb[key] = value
        elif kind == DEVICE_FIELD:
            device = (labels.get(drv_label, ""), labels.get(pool_label, ""), labels.get(dev_label, ""))
            seen.setdefault(key, set()).add(device)
        elif kind == "xid" and value > 0:
            xids.setdefault(key, []).append(XidEvent(code=int(value), gpu=labels.get(spec.gpu_label, "")))
        elif kind == AHEAD_FIELD:
            untrusted[key] = f"a sample {value - eval_time:.0f}s ahead of the controller's clock"
        elif kind == UID_FIELD and uids is not None:
            live, named = uids.get(PodKey(*key), ""), labels.get(uid_label, "")
            if live and named != live:
                untrusted.setdefault(key, f"a series names pod uid {named[:40]!r}, the live pod's is {live}")
        elif kind == FB_NEGATIVE_FIELD:
            negative_fb.add(key)
    if agent is not None:
        agent.eval_time = eval_time
    out: dict[PodKey, PodReading] = {}
    collect_fb = bool(spec.framebuffer_query)
    oldest = eval_time - spec.max_sample_age
    zero = spec.zero_threshold
    busy: dict[float, PodReading] = {}
    # Only a query that asked for the `dev` series can tell a device without one.
    expected = devices if spec.dra_devices and devices else {}
    # XIDs, stale pods and untrusted series are rare: their maps are empty on most polls and
    # are not looked up then (three lookups per pod per poll at 50,000 pods).
    for key in pods:
        ev = xids.get(key) if xids else None
        events = tuple(sorted(ev, key=_xid_order)) if ev else ()
        u = util.get(key)
        t = stamp.get(key) if stamp else None
        # The query sends `ts` only for a stale pod, beside its reading: a `ts` fails the reading,
        # and is checked against the clock all the same.
        if untrusted and key in untrusted:
            out[key] = PodReading(
                SignalFailure(reason=FailureReason.UNTRUSTED, detail=untrusted[key]), events
            )
        elif t is not None and t < oldest:
            age = eval_time - t
            out[key] = PodReading(
                SignalFailure(reason=FailureReason.STALE, detail=f"newest sample {age:.0f}s old"), events
            )
        elif u is None:
            failure = SignalFailure(reason=FailureReason.MISSING, detail=f"no {spec.metric} series")
            out[key] = PodReading(failure, events)
        elif not 0 <= u <= 100:
            detail = "negative reading" if u < 0 else f"reading {u:g} % is over 100 %"
            out[key] = PodReading(SignalFailure(reason=FailureReason.PARSE_ERROR, detail=detail), events)
        elif u <= zero and key in expected and (gap := without_series(expected[key], seen.get(key))):
            out[key] = PodReading(no_series(spec.metric, key[0], gap), events)
        elif collect_fb and u <= zero:
            memory = _NEGATIVE_FB if key in negative_fb else _memory(fb.get(key))
            out[key] = PodReading(u, events, memory)
        elif events:
            out[key] = PodReading(u, events, _NOT_ASKED if collect_fb else None)
        else:
            # Over the zero threshold the verdict never reads memory, and the query did not ask.
            # Most pods of a fleet: one shared, frozen reading per value, not one object per pod.
            shared = busy.get(u)
            if shared is None:
                shared = busy[u] = PodReading(u, (), _NOT_ASKED if collect_fb else None)
            out[key] = shared
    return out


_NEGATIVE_FB = SignalFailure(reason=FailureReason.PARSE_ERROR, detail="a negative framebuffer sample")
# A busy pod's memory: the query did not ask for it (the verdict reads memory only for an
# all-zero window, and a window with this reading in it is not).
_NOT_ASKED = SignalFailure(
    reason=FailureReason.MISSING, detail="not asked: utilization over the zero threshold"
)


def _xid_order(x: XidEvent) -> tuple[str, int]:
    return (x.gpu, x.code)


def _memory(value: float | None) -> int | SignalFailure:
    if value is None:
        return SignalFailure(reason=FailureReason.MISSING, detail="no framebuffer series")
    if not 0 <= value < 1 << 62:  # also NaN
        return SignalFailure(reason=FailureReason.PARSE_ERROR, detail="framebuffer reading out of range")
    return int(value)


def poll_query(
    spec: QuerySpec,
    pods: list[PodKey],
    *,
    now: float,
    agent_pods: frozenset[PodKey] | None,
    max_bytes: int,
) -> tuple[str, frozenset[PodKey] | None]:
    """(the poll's query, the pods whose agent series it names): `agent_pods` by name while the
    query stays within `max_bytes`, else every pod at zero (None)."""
    if agent_pods is not None:
        query = build_query(spec, pods, now=now, agent_pods=agent_pods)
        if len(query.encode()) <= max_bytes:
            return query, agent_pods
    return build_query(spec, pods, now=now), None


class UtilizationSource:
    """Runs the batched query. `poll()` never raises: failures land in every pod's reading.

    With `agent_after_idle` (the verdict asks a workload's processes only after two or more idle
    readings in a row: controller.window >= 2), the node agent's series are asked only for the
    pods the previous poll read at or under the zero threshold, by name: every pod whose processes
    this poll can ask for is among them. The first poll, and any poll whose names would make the
    query longer than `max_query_bytes`, asks for every pod at zero."""

    def __init__(
        self,
        client: PrometheusClient,
        spec: QuerySpec,
        *,
        agent: AgentSeries | None = None,
        agent_after_idle: bool = False,
        max_query_bytes: int = 16384,
    ) -> None:
        self.client = client
        self.spec = spec
        # Where this poll's node agent series go (spec.agent_processes): the process source reads them.
        self.agent = agent
        self.agent_after_idle = agent_after_idle
        self.max_query_bytes = max_query_bytes
        # The pods the last poll read at or under the zero threshold; None before the first poll.
        self.idle_last_poll: frozenset[PodKey] | None = None

    def _agent_pods(self) -> frozenset[PodKey] | None:
        last = self.idle_last_poll
        if not self.agent_after_idle or last is None:
            return None
        # Names from the apiserver are DNS-1123 already; one that is not is left unasked (fail safe).
        return frozenset(p for p in last if _K8S_NAME.match(p.name) and _K8S_NAME.match(p.namespace))

    async def poll(
        self,
        pods: Iterable[PodKey],
        *,
        now: float,
        devices: Mapping[PodKey, Sequence[DraDevice]] | None = None,
        uids: Mapping[PodKey, str] | None = None,
    ) -> dict[PodKey, PodReading]:
        """`devices`: each DRA pod's GPU devices, each of which must have its series; `uids`: each
        live pod's UID, which every series of it that names one must name."""
        pods = list(dict.fromkeys(pods))
        wanted = frozenset(pods)  # one set of the pods for the answer's filter and the agent's
        agent_pods = self._agent_pods() if self.agent is not None else None
        answer = AgentAnswer(
            eval_time=now,
            pods=wanted,
            uids=dict(uids or {}),
            max_clock_skew=self.spec.max_clock_skew,
        )
        if self.agent is not None:
            self.agent.answer = answer  # replaced every poll: last poll's series are never read again
        readings = await self._poll(
            pods, now, answer if self.agent is not None else None, devices, uids, wanted, agent_pods
        )
        if self.agent is not None and self.agent_after_idle:  # a pass over every pod: only where read
            zero = self.spec.zero_threshold
            self.idle_last_poll = frozenset(
                k
                for k, r in readings.items()
                if not isinstance(u := r.utilization, SignalFailure) and u <= zero
            )
        return readings

    async def _poll(
        self,
        pods: list[PodKey],
        now: float,
        agent: AgentAnswer | None,
        devices: Mapping[PodKey, Sequence[DraDevice]] | None = None,
        uids: Mapping[PodKey, str] | None = None,
        wanted: frozenset[PodKey] | None = None,
        agent_pods: frozenset[PodKey] | None = None,
    ) -> dict[PodKey, PodReading]:
        if not pods:
            return {}
        # Namespaces are the only names written into the query: check each once (about 20 for
        # 50,000 pods), not two regular expressions per pod per poll.
        bad = {ns for ns in {p.namespace for p in pods} if not _K8S_NAME.match(ns)}
        if bad:
            invalid = PodReading(SignalFailure(reason=FailureReason.OTHER, detail="invalid namespace name"))
            out = {p: invalid for p in pods if p.namespace in bad}
            valid = [p for p in pods if p.namespace not in bad]
            wanted = None  # the valid pods only: _readings builds their set
        else:
            out, valid = {}, pods
        if not valid:
            return out
        query, named = poll_query(
            self.spec, valid, now=now, agent_pods=agent_pods, max_bytes=self.max_query_bytes
        )
        if agent is not None:
            agent.asked = named  # type: ignore[assignment]  # a PodKey is a (namespace, name) tuple
        try:
            content = await self.client.query_content(
                query,
                at=now,
                max_bytes=BYTES_PER_SERIES * max_series(len(valid)),
            )
            # An empty result carries no evaluation time; we asked for `now`, so that is it.
            readings = _readings(self.spec, valid, now, iter_answer(content), agent, devices, uids, wanted)
        except PrometheusError as exc:
            if agent is not None:
                agent.failure = exc.failure
            return out | {p: PodReading(exc.failure) for p in valid}
        return out | readings


def workload_memory(readings: Iterable[PodReading]) -> GpuMemory | SignalFailure | None:
    """Framebuffer used by a workload: the sum over its pods; any pod failing fails it (fail safe),
    None when the query did not collect memory."""
    total = 0
    for r in readings:
        if r.memory is None:
            return None
        if isinstance(r.memory, SignalFailure):
            return r.memory
        total += r.memory
    return GpuMemory.model_construct(used_bytes=total)


def workload_sample(readings: Iterable[PodReading]) -> UtilizationSample:
    """A workload's reading is the max over its pods; any pod failing fails the workload (fail safe)."""
    values: list[float] = []
    for r in readings:
        if isinstance(r.utilization, SignalFailure):
            return r.utilization
        values.append(r.utilization)
    if not values:
        return SignalFailure(reason=FailureReason.MISSING, detail="workload has no running pod")
    return max(values)


# The readings every exporter reports most (DCGM's utilization is a whole percent): one float
# object each, shared by every ring, so a ring slot costs its 8-byte pointer, not a new float.
_WHOLE_PERCENTS = {float(i): float(i) for i in range(101)}


@dataclass(slots=True)
class UtilizationRing:
    """The last `size` samples of one workload, oldest first (what `Evidence.utilization` wants).

    A circular buffer of `size` slots allocated once, not a deque: every tracked workload has a
    ring of `longWindow` (30) samples, and a deque's first 64-slot block plus one float per
    sample was ~1.3 KB per workload at 50,000 workloads. Nothing is allocated per push, so a
    steady poll leaves no new long-lived object behind (those scatter the heap: RSS grows)."""

    size: int
    _slots: list[UtilizationSample | None] = field(default_factory=list)
    _next: int = 0  # the slot the next push writes
    _count: int = 0
    # The runs ending at the newest sample, kept on push so that a window is judged without a pass
    # over its samples (every workload, every poll): readings (no failure), and readings at or
    # under `zero_threshold`. They may outgrow the ring; only min(run, count) is meaningful.
    zero_threshold: float = 0.0
    _ok_run: int = 0
    _zero_run: int = 0

    @classmethod
    def allocated(cls, size: int, zero_threshold: float = 0.0) -> UtilizationRing:
        """A ring with its slots already allocated (see WorkloadState.new's caller)."""
        return cls(size, [None] * size, zero_threshold=zero_threshold)

    def push(self, sample: UtilizationSample) -> None:
        if type(sample) is float:
            sample = _WHOLE_PERCENTS.get(sample, sample)
        if not self._slots:
            self._slots = [None] * self.size
        self._slots[self._next] = sample
        self._next = (self._next + 1) % self.size
        self._count = min(self._count + 1, self.size)
        if isinstance(sample, SignalFailure):
            self._ok_run = self._zero_run = 0
        else:
            self._ok_run += 1
            # `<=`, not `not >`: a NaN is no zero reading (fail safe, as verdict.window_runs).
            self._zero_run = self._zero_run + 1 if sample <= self.zero_threshold else 0

    def resize(self, size: int) -> None:
        kept = self.newest(size)
        self.size, self._slots, self._next, self._count = size, [], 0, 0
        self._ok_run = self._zero_run = 0
        for sample in kept:
            self.push(sample)

    def clear(self) -> None:
        self._next = self._count = self._ok_run = self._zero_run = 0

    @property
    def samples(self) -> tuple[UtilizationSample, ...]:
        return self.newest(self._count)

    def newest(self, k: int) -> tuple[UtilizationSample, ...]:
        """The newest min(k, count) samples, oldest first (fewer than k: not enough yet)."""
        k = min(k, self._count)
        start = (self._next - k) % self.size if k else 0
        if start + k <= self.size:
            return tuple(self._slots[start : start + k])  # type: ignore[arg-type]
        return tuple(self._slots[start:] + self._slots[: self._next])  # type: ignore[operator]

    def runs(self, threshold: float) -> tuple[int, int, int]:
        """(samples held, readings in a row, readings <= threshold in a row), each run ending at
        the newest sample and at most the samples held."""
        count = self._count
        if threshold == self.zero_threshold:
            return count, min(self._ok_run, count), min(self._zero_run, count)
        return window_runs(self.newest(count), threshold)  # another threshold: count them

    def newest_all_zero(self, k: int, threshold: float) -> bool:
        """True when the newest k samples exist, are readings, and are all <= threshold."""
        if k <= 0 or k > self._count:
            return False
        if threshold == self.zero_threshold:
            return self._zero_run >= k  # k <= count: the newest k pushes since the last clear
        return self.runs(threshold)[2] >= k

    def __len__(self) -> int:
        return self._count
