"""The agent's Prometheus series (docs/agent.md: the controller parses exactly these).

Per container the agent saw (labels tracked_namespace, tracked_pod, tracked_uid,
tracked_container: names of its own, so that no scrape overwrites them and its ServiceMonitor
needs no honorLabels; ghostgpu.signals.agent reads them):
- `ghostgpu_agent_container_scan_timestamp_seconds{live_roles}`: the unix time of the scan, for
  every container the agent reports on: the presence series. With it fresh, a role without a series
  has no processes; without it, the container was not seen (the controller fails the signal).
  `live_roles` names the live roles (work, timer, session) that have a processes series, sorted and
  joined by a space, so an answer that lost one of those series (a proxy or a store that answers
  with part of the series) reads as a failure, not as a finished container.
- `ghostgpu_agent_container_processes{role, programs}`: the roles with processes only (no zero
  series). A role that keeps the container alive (work, timer, session) carries in `programs` the
  programs that keep it alive, sorted, the first 4, each cut at 64 characters, joined by a space
  (a program name is the first word of a command line: it has no space); the other roles carry
  none. The programs ride on the counts instead of series of their own: a busy container costs
  Prometheus its live roles and the presence series (docs/agent.md#series).
Per container it should see and cannot: `ghostgpu_agent_container_unseen{reason}` = 1 and the
scan timestamp (how fresh that is), no processes series.
The agent's own: `ghostgpu_agent_scan_duration_seconds` (histogram), `ghostgpu_agent_scanned_pids`,
`ghostgpu_agent_tracked_containers`, `ghostgpu_agent_info{node,version}` = 1.

The per-container series come from the last scan only (a collector, not gauges): a container
gone from the node is gone from /metrics at the next scan, with no label bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ghostgpu import __version__
from ghostgpu.agent.idle_facts import IdleFactsCollector
from ghostgpu.agent.scan import ScanResult, Seen, Unseen
from ghostgpu.verdict import ProcessCounts, ProcessRole

CONTAINER_LABELS = ("tracked_namespace", "tracked_pod", "tracked_uid", "tracked_container")
ROLES = tuple(r.value for r in ProcessRole)
# The roles that keep a container alive: their series name the programs (ProcessCounts.programs).
LIVE_ROLES = frozenset({ProcessRole.WORK.value, ProcessRole.TIMER.value, ProcessRole.SESSION.value})
MAX_PROGRAMS = 4
MAX_PROGRAM_CHARS = 64
# From a few ms (a quiet node) to seconds (10k processes on a busy one).
SCAN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _LastScan(Collector):
    def __init__(self, node: str) -> None:
        self.node = node
        self.result: ScanResult | None = None

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "ghostgpu_agent_info", "The node agent: its node and version.", labels=["node", "version"]
        )
        info.add_metric([self.node, __version__], 1)
        yield info
        processes = GaugeMetricFamily(
            "ghostgpu_agent_container_processes",
            "Processes of a GPU container by role (the verdict's ProcessPolicy), from the last scan: "
            "roles with processes only; work, timer and session name the programs that keep it alive.",
            labels=[*CONTAINER_LABELS, "role", "programs"],
        )
        stamp = GaugeMetricFamily(
            "ghostgpu_agent_container_scan_timestamp_seconds",
            "Unix time of the scan a container's series come from (every container reported on: a "
            "role without a series has no processes).",
            labels=[*CONTAINER_LABELS, "live_roles"],
        )
        unseen = GaugeMetricFamily(
            "ghostgpu_agent_container_unseen",
            "A GPU container the agent should see and cannot, by reason (no processes series then).",
            labels=[*CONTAINER_LABELS, "reason"],
        )
        scanned = GaugeMetricFamily("ghostgpu_agent_scanned_pids", "Host pids the last scan looked at.")
        tracked = GaugeMetricFamily(
            "ghostgpu_agent_tracked_containers", "GPU containers of this node the last scan reported on."
        )
        r = self.result
        if r is not None:
            for key in sorted(r.containers):
                labels = list(key)
                outcome = r.containers[key]
                if isinstance(outcome, Unseen):
                    stamp.add_metric([*labels, ""], r.timestamp)
                    unseen.add_metric([*labels, outcome.value], 1)
                    continue
                assert isinstance(outcome, Seen)
                stamp.add_metric([*labels, live_roles(outcome.counts)], r.timestamp)
                for role, count, programs in role_series(outcome.counts):
                    processes.add_metric([*labels, role, programs], count)
            scanned.add_metric([], r.scanned_pids)
            tracked.add_metric([], len(r.containers))
        yield from (processes, stamp, unseen, scanned, tracked)


def role_series(counts: ProcessCounts) -> list[tuple[str, int, str]]:
    """(role, count, programs label) of each role with processes, in ROLES order: what a seen
    container exports beside its scan time (the bench's fake agent prints the same)."""
    programs = " ".join(exported_programs(counts.programs))
    return [
        (role, n, programs if role in LIVE_ROLES else "") for role in ROLES if (n := getattr(counts, role))
    ]


def live_roles(counts: ProcessCounts) -> str:
    """The scan series' `live_roles` label: the live roles with a processes series, sorted."""
    return " ".join(sorted(role for role in LIVE_ROLES if getattr(counts, role)))


def exported_programs(programs: tuple[str, ...]) -> list[str]:
    """Sorted, the first MAX_PROGRAMS, each cut at MAX_PROGRAM_CHARS (deduplicated after the cut)."""
    return sorted({p[:MAX_PROGRAM_CHARS] for p in sorted(programs)[:MAX_PROGRAMS]})


class AgentExporter:
    """The agent's registry: publish() replaces what the last scan exported."""

    def __init__(self, node: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._last = _LastScan(node)
        self.registry.register(self._last)
        self.registry.register(IdleFactsCollector(lambda: self._last.result))  # agent/idle_facts.py
        self.scan_duration = Histogram(
            "ghostgpu_agent_scan_duration_seconds",
            "Wall time of one scan of the node's proc root.",
            buckets=SCAN_BUCKETS,
            registry=self.registry,
        )

    def publish(self, result: ScanResult) -> None:
        self.scan_duration.observe(result.duration_s)
        self._last.result = result

    @property
    def last(self) -> ScanResult | None:
        return self._last.result
