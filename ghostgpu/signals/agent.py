"""The processes signal from the node agent (`ghostgpu agent`, a DaemonSet on the GPU nodes), read
through the poll's ONE PromQL query: no exec, no call from the controller to a node.

The agent exports, per GPU container it tracks (docs/agent.md), under label names of its own
(tracked_namespace, tracked_pod, tracked_uid, tracked_container: no scrape sets them, so its
ServiceMonitor needs no honorLabels and Prometheus sets job/namespace/instance from the target):
  ghostgpu_agent_container_scan_timestamp_seconds{...,live_roles}  unix time of the scan: presence;
                                                              live_roles names the live roles it has
                                                              a processes series for
  ghostgpu_agent_container_processes{...,role,programs}       roles with processes only; the live
                                                              roles name up to 4 programs
  ghostgpu_agent_container_unseen{...,reason} = 1             a container it cannot see

`query_parts` adds these to the utilization query (signals/utilization.py), for the pods whose
utilization is at or under the zero threshold right now: the controller asks processes only for a
workload whose window is all zero, so every pod it asks about is among them, and a busy fleet's
containers cost the answer nothing. `AgentAnswer` collects the series of one answer and
`AgentProcessSource` (the observe room's `ProcessSource`) hands out each container's counts.

Every series is read only from the agent's scrape (the config's metrics.agentSource), over two
scrape intervals: the most processes of each role and every program seen in them, the oldest scan
(docs/threat-model.md). A role without a series counts 0 only beside a fresh scan time of the same
container: one scrape carries all of a target's series or none, so a fresh scan time means the
scrape that carried it carried every role with processes, and the scan's `live_roles` label names
the live roles that must be in the answer beside it: an answer that lost one (a proxy or a store
answering with part of the series) fails the container instead of reading it as finished. Fail
safe (docs/design.md#signals): a container with no scan time (agent not running there, Prometheus
not scraping it, an agent too old to export it), a scan older than the signal's maximum age or ahead
of the controller's clock, a pod UID that is not the live pod's, a live role its scan names and the
answer lacks, or an unseen report is a SignalFailure: the verdict stays UNKNOWN,
never reclaims.

An agent of the earlier contract (all six roles with zeros, the programs as series of their own)
reads the same here, without the programs (they explain a verdict, they do not decide it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ghostgpu.signals.podexec import PodRef
from ghostgpu.verdict import FailureReason, ProcessCounts, ProcessRole, SignalFailure

PROCESSES_METRIC = "ghostgpu_agent_container_processes"
SCAN_METRIC = "ghostgpu_agent_container_scan_timestamp_seconds"
UNSEEN_METRIC = "ghostgpu_agent_container_unseen"
CONTAINER_METRICS = (PROCESSES_METRIC, SCAN_METRIC, UNSEEN_METRIC)
# The label of a live role's series with its programs, space-separated (a program has no space).
PROGRAMS_LABEL = "programs"
# On the scan series: the live roles the agent exported a processes series for (an agent of the
# earlier contract has no such label, and nothing is checked for it).
LIVE_ROLES_LABEL = "live_roles"
# The roles that keep a container alive (ProcessCounts.programs' roles).
LIVE_ROLES = "work|timer|session"
ROLES: tuple[str, ...] = tuple(r.value for r in ProcessRole)
# The agent's unseen reasons, each its own FailureReason so that the verdict's evidence says it.
UNSEEN_REASONS: dict[str, FailureReason] = {
    "no-cgroup-match": FailureReason.NO_CGROUP_MATCH,
    "proc-unreadable": FailureReason.PROC_UNREADABLE,
    "not-running": FailureReason.NOT_RUNNING,
}
# The `ghostgpu_field` values (utilization.FIELD_LABEL) of the agent's parts of the answer.
ROLE_FIELD, SCAN_FIELD, UNSEEN_FIELD = "proc", "scan", "unseen"
AGENT_FIELDS = frozenset({ROLE_FIELD, SCAN_FIELD, UNSEEN_FIELD})
# The labels every per-container series carries: the tracked container's, under names no scrape
# sets (a target's own namespace/pod/container labels are the agent pod's).
TRACKED_NAMESPACE, TRACKED_POD, TRACKED_UID, TRACKED_CONTAINER = (
    "tracked_namespace",
    "tracked_pod",
    "tracked_uid",
    "tracked_container",
)
CONTAINER_LABELS = (TRACKED_NAMESPACE, TRACKED_POD, TRACKED_UID, TRACKED_CONTAINER)
_KEY = ", ".join(CONTAINER_LABELS)
_ON = f"{TRACKED_NAMESPACE}, {TRACKED_POD}"

ContainerKey = tuple[str, str, str]  # (namespace, pod, container)
# Programs read per series and kept per container: the agent names at most 4 per series; a
# container's series over the window (programs that changed) are bounded by the answer's cap.
MAX_PROGRAMS = 4
MAX_PROGRAMS_KEPT = 16


def query_parts(
    namespaces: str,
    zero: str,
    *,
    namespace_label: str,
    pod_label: str,
    field_label: str,
    source: str,
    window: str,
    ahead: tuple[float, float] | None = None,
    ahead_field: str = "ahead",
    pods: str | None = None,
) -> list[str]:
    """The agent's parts of the poll's query, each tagged with its `field_label` value.

    `namespaces` is the validated alternation of the tracked namespaces; `zero` a vector with one
    series per pod at or under the zero threshold, labelled `namespace_label`/`pod_label`; `source`
    the label matchers of the agent's scrape; `window` two scrape intervals (a PromQL duration).
    Each part is aggregated by the tracked container's labels, so a container scraped twice (two
    agent pods on one node during a rollout) is one series, and the scrape's target labels do not
    reach the answer. With `ahead` = (at, after), pods with an agent sample newer than `after` at
    `at` (a producer writing ahead of the clock) come back as `ahead_field`, labelled as `zero`.

    With `pods` (an alternation of pod names; `namespaces` then those pods' namespaces), only the
    series of those pods are selected and `zero` is not evaluated: the poll names the pods it
    read idle the poll before, the only ones whose processes it can ask for (see
    UtilizationSource). Selecting them by name costs Prometheus a lookup per pod, where `zero`
    costs a pass over every pod's utilization and the agent's selectors a pass over every busy
    container's series.
    """
    on = f'label_replace({zero}, "{TRACKED_NAMESPACE}", "$1", "{namespace_label}", "(.*)")'
    on = f'label_replace({on}, "{TRACKED_POD}", "$1", "{pod_label}", "(.*)")'
    every = f'{source}, {TRACKED_NAMESPACE}=~"{namespaces}"'
    inner = every if pods is None else f'{every}, {TRACKED_POD}=~"{pods}"'
    sel, bare = "{" + inner + "}", "{" + every + "}"

    def part(expr: str, agg: str, by: str, kind: str) -> str:
        return f'label_replace({agg} by ({by}) ({expr}), "{field_label}", "{kind}", "", "")'

    each = [
        part(
            f"max_over_time({PROCESSES_METRIC}{sel}[{window}])",
            "max",
            f"{_KEY}, role, {PROGRAMS_LABEL}",
            ROLE_FIELD,
        ),
        part(
            f"min_over_time({SCAN_METRIC}{sel}[{window}])", "min", f"{_KEY}, {LIVE_ROLES_LABEL}", SCAN_FIELD
        ),
        # Not by name: a container the agent cannot see is rare, and the names cost query bytes.
        part(f"max_over_time({UNSEEN_METRIC}{bare}[{window}]) == 1", "max", f"{_KEY}, reason", UNSEEN_FIELD),
    ]
    # One `and on(...)` for the three: `zero` is the utilization expression, which Prometheus
    # evaluates again wherever the query names it. Pods named instead (of one name in two
    # namespaces, both match: a few more series, never fewer) need no filter.
    parts = each if pods is not None else [f"({' or '.join(each)}) and on({_ON}) ({on})"]
    if ahead is not None:
        # The scan time and the live roles' counts (work, timer, session: what keeps a workload
        # alive) are what a forger must write ahead to make a busy container look finished: one
        # selector for both (a series without a role is a scan time), not every agent series.
        at, after = ahead
        both = f'__name__=~"{SCAN_METRIC}|{PROCESSES_METRIC}", {inner}, role=~"|{LIVE_ROLES}"'
        newest = f"max by ({_ON}) (timestamp({{{both}}} @ {at:.3f})) > {after:.3f}"
        newest = f'label_replace({newest}, "{namespace_label}", "$1", "{TRACKED_NAMESPACE}", "(.*)")'
        newest = f'label_replace({newest}, "{pod_label}", "$1", "{TRACKED_POD}", "(.*)")'
        parts.append(f'label_replace({newest}, "{field_label}", "{ahead_field}", "", "")')
    return parts


@dataclass(slots=True)
class _Container:
    uids: set[str] = field(default_factory=set)
    roles: dict[str, int] = field(default_factory=dict)
    programs: list[str] = field(default_factory=list)
    scan: float | None = None
    live: set[str] = field(default_factory=set)  # the live roles the scans say have a series
    unseen: list[str] = field(default_factory=list)
    bad: str = ""  # why the series cannot be read (a value that is not a count, an unknown role)


@dataclass(slots=True)
class AgentAnswer:
    """The agent's series of one poll's answer, by container; or the query's failure."""

    eval_time: float = 0.0
    failure: SignalFailure | None = None
    containers: dict[ContainerKey, _Container] = field(default_factory=dict)
    # The pods asked about ((namespace, name)): series of any other pod are dropped, not kept.
    # None: keep every pod's (a caller that reads the answer without a poll).
    pods: frozenset[tuple[str, str]] | None = None
    # The live pods' UIDs: a container whose series name another UID fails.
    uids: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # How far a scan time may lead eval_time (the controller's clock) before it fails.
    max_clock_skew: float = 5.0
    # The pods whose series the query named ((namespace, name)); None: every pod at zero.
    asked: frozenset[tuple[str, str]] | None = None

    def add(self, kind: str, labels: Mapping[str, str], value: float) -> None:
        ns, name = labels.get(TRACKED_NAMESPACE, ""), labels.get(TRACKED_POD, "")
        if self.pods is not None and (ns, name) not in self.pods:
            return
        key = (ns, name, labels.get(TRACKED_CONTAINER, ""))
        c = self.containers.get(key)
        if c is None:
            c = self.containers[key] = _Container()
        c.uids.add(labels.get(TRACKED_UID, ""))
        if kind == ROLE_FIELD:
            role = labels.get("role", "")
            if role not in ROLES:
                c.bad = f"unknown role {role[:40]!r}"
            elif not (0 <= value <= 1_000_000 and value == int(value)):
                c.bad = f"{role} count {value!r} is not a count"
            else:
                # One role can come as several series in the window (its programs changed between
                # two scans): each is the role's whole count at its time, so the most, not the sum.
                c.roles[role] = max(c.roles.get(role, 0), int(value))
                c.programs.extend(labels.get(PROGRAMS_LABEL, "").split()[:MAX_PROGRAMS])
        elif kind == SCAN_FIELD:
            # One series per live-role set in the window (the set changed between two scans): the
            # oldest scan, and every live role any of them names.
            c.scan = value if c.scan is None else min(c.scan, value)
            c.live.update(labels.get(LIVE_ROLES_LABEL, "").split()[: len(ROLES)])
        elif kind == UNSEEN_FIELD:
            c.unseen.append(labels.get("reason", ""))

    def counts(self, pod: PodRef, max_age: float) -> ProcessCounts | SignalFailure:
        """One container's counts, or why there are none (never raises)."""
        if self.failure is not None:
            return self.failure
        c = self.containers.get((pod.namespace, pod.name, pod.container))
        where = f"container {pod.container!r} of {pod.namespace}/{pod.name}"
        if c is None and self.asked is not None and (pod.namespace, pod.name) not in self.asked:
            return SignalFailure(
                reason=FailureReason.MISSING,
                detail=f"the poll did not ask for the node agent's series of {where}: its pod was "
                "not read idle in the poll before",
            )
        if c is None:
            return SignalFailure(
                reason=FailureReason.MISSING,
                detail=f"no node agent series for {where} (agent not running on its node, or not scraped)",
            )
        if len(c.uids) > 1:
            # Two pods of one name (a replaced StatefulSet pod whose old series linger): whose is whose
            # cannot be told here, so neither is used.
            return SignalFailure(
                reason=FailureReason.OTHER, detail=f"agent reports {len(c.uids)} pod uids for {where}"
            )
        live = self.uids.get((pod.namespace, pod.name), "")
        if live and c.uids != {live}:
            named = next(iter(c.uids), "")
            return SignalFailure(
                reason=FailureReason.UNTRUSTED,
                detail=f"the agent's series of {where} name pod uid {named[:40]!r}, the live pod's is {live}",
            )
        if c.scan is not None and c.scan > self.eval_time + self.max_clock_skew:
            # The oldest scan of the window: a forged scan ahead beside a real one is outvoted
            # (min), one alone fails here.
            return SignalFailure(
                reason=FailureReason.UNTRUSTED,
                detail=f"the agent's scan of {where} is {c.scan - self.eval_time:.0f}s ahead of the "
                f"controller's clock",
            )
        if c.unseen:
            reason = sorted(c.unseen)[0]
            return SignalFailure(
                reason=UNSEEN_REASONS.get(reason, FailureReason.OTHER),
                detail=f"the node agent cannot see {where}: {reason[:40]}",
            )
        if c.bad:
            return SignalFailure(reason=FailureReason.PARSE_ERROR, detail=f"{where}: {c.bad}")
        if c.scan is None:
            return SignalFailure(reason=FailureReason.MISSING, detail=f"no scan timestamp for {where}")
        age = self.eval_time - c.scan
        if age > max_age:
            return SignalFailure(
                reason=FailureReason.STALE, detail=f"the agent's newest scan of {where} is {age:.0f}s old"
            )
        lost = sorted(role for role in c.live if role in ROLES and not c.roles.get(role))
        if lost:
            return SignalFailure(
                reason=FailureReason.MISSING,
                detail=f"the agent's scan of {where} names live role(s) {' '.join(lost)} whose series "
                "the answer lacks (a partial answer)",
            )
        # A fresh scan time (checked above) is the presence series: a role without a series has
        # no processes.
        programs = tuple(sorted(set(c.programs))[:MAX_PROGRAMS_KEPT])
        return ProcessCounts(**c.roles, programs=programs)


class AgentSeries:
    """Where the utilization source leaves this poll's agent series for the process source."""

    def __init__(self) -> None:
        self.answer = AgentAnswer(failure=SignalFailure(reason=FailureReason.MISSING, detail="no poll yet"))


class AgentProcessSource:
    """`ProcessSource` over the node agent's series of the poll's query (no exec, no extra query).

    The observe room runs the utilization query before it asks for processes (observer.gather), so
    the answer read here is this poll's."""

    def __init__(self, series: AgentSeries, *, max_age: float) -> None:
        self.series = series
        self.max_age = max_age

    async def list_many(self, pods: Sequence[PodRef]) -> dict[PodRef, ProcessCounts | SignalFailure]:
        answer = self.series.answer
        return {p: answer.counts(p, self.max_age) for p in pods}


__all__ = [
    "AGENT_FIELDS",
    "CONTAINER_LABELS",
    "LIVE_ROLES_LABEL",
    "PROCESSES_METRIC",
    "PROGRAMS_LABEL",
    "ROLES",
    "SCAN_METRIC",
    "UNSEEN_METRIC",
    "UNSEEN_REASONS",
    "AgentAnswer",
    "AgentProcessSource",
    "AgentSeries",
    "query_parts",
]
