"""Node agents with faults, for the fault-tolerance suite in agent mode (tests/e2e/test_faults.py):
an HTTP server whose paths are agent targets that the real Prometheus scrapes, each rendered by
the agent's own collector (`ghostgpu.agent.exporter.AgentExporter`), so the series are exactly
what `ghostgpu agent` exports for the same scan, whatever their shape.

The fleet's pods are spread over `slots`: one agent per slot (as if each pod ran on a node of its
own), so a fault of one agent touches one pod. Each slot has two targets, `a` and `b` (the old and
the new pod of a DaemonSet rollout); normally only one reports the slot's containers and the
other is an agent that reports none of them. Faults, per slot, for the polls they are armed:

- `agent-restart`: the agent's pod restarts: its target fails its scrapes (503), then a fresh scan;
- `agent-rollout`: both targets report the containers (two agents' series for one container,
  as during a DaemonSet rollout), then the new one alone;
- `agent-scrape-gap`: Prometheus misses the target for longer than the query's window;
- `agent-stale-scan`: the agent's scans stopped an hour ago while its /metrics still serves them;
- `agent-twin-uid`: a second agent reports the container under another pod UID (a replaced pod
  of the same name whose old series linger);
- `agent-container-restarted`: the container restarted between two scans: one scan finds it not
  running;
- `agent-node-clock-skew`: the node's clock is off the controller's: the scan time is ahead or
  behind by the skew.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ghostgpu.agent.exporter import AgentExporter
from ghostgpu.agent.scan import ContainerKey, ScanResult, Seen, Unseen
from ghostgpu.quiet_http import QuietHTTPServer
from ghostgpu.verdict import ProcessCounts

AGENT_FAULTS = (
    "agent-restart",
    "agent-rollout",
    "agent-scrape-gap",
    "agent-stale-scan",
    "agent-twin-uid",
    "agent-container-restarted",
    "agent-node-clock-skew",
)
# How many polls an episode of each fault stays armed: a gap longer than the query's window
# (two scrape intervals) needs two polls of about one interval each, and so does a skewed scan
# time once the window holds no honest one; a rollout keeps both agents for a poll, then the new
# one alone.
EPISODE_POLLS = {"agent-scrape-gap": 2, "agent-rollout": 2, "agent-node-clock-skew": 2}
# The node's clock off the controller's (seconds): behind within staleAfter is a real, older scan;
# further behind is stale; ahead beyond metrics.maxClockSkew + prometheus.timeout is untrusted.
NODE_SKEWS = (-900.0, -120.0, -10.0, 2.0, 30.0, 400.0)


@dataclass
class Container:
    key: ContainerKey
    counts: ProcessCounts


@dataclass
class Slot:
    """One agent (two targets, `a` and `b`) and the containers it reports."""

    containers: dict[str, Container] = field(default_factory=dict)  # pod name -> container
    live: str = "a"  # which target reports the containers
    fault: str | None = None
    polls_left: int = 0
    # The fault just over: its samples are still in the query's window for one more poll, and no
    # new fault starts on the slot then (each poll's effect is one fault's).
    lingering: str | None = None
    skew: float = 0.0
    rollout_both: bool = False

    def outcome(self, c: Container) -> Seen | Unseen:
        if self.fault == "agent-container-restarted":
            return Unseen.NOT_RUNNING
        return Seen(c.counts, ())

    def render(self, target: str, now: float) -> bytes | None:
        """This target's exposition; None: the scrape fails."""
        f = self.fault
        if f in ("agent-restart", "agent-scrape-gap") and target == self.live:
            return None
        scan = now + self.skew
        if f == "agent-stale-scan":
            scan = now - 3600
        reports = target == self.live or (f == "agent-rollout" and self.rollout_both)
        results: list[ScanResult] = []
        if reports:
            results.append(ScanResult(scan, {c.key: self.outcome(c) for c in self.containers.values()}, 1))
        if f == "agent-twin-uid" and target != self.live:
            other = {
                c.key._replace(uid=c.key.uid[::-1]): Seen(c.counts, ()) for c in self.containers.values()
            }
            results.append(ScanResult(now, other, 1))
        return render_scans(f"slot-{target}", results)


class _Merged(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def render_scans(node: str, results: list[ScanResult]) -> bytes:
    """What one agent's /metrics prints for these scans (several: containers scanned at different
    times), each rendered by the agent's collector, merged family by family."""
    merged: dict[str, Metric] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for result in results or [ScanResult(time.time(), {}, 0)]:
        exporter = AgentExporter(node, CollectorRegistry())
        exporter.publish(result)
        for fam in exporter.registry.collect():
            into = merged.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type, fam.unit))
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if key not in seen:  # the agent's own series (info, histogram) once
                    seen.add(key)
                    into.samples.append(s)
    registry = CollectorRegistry()
    registry.register(_Merged(list(merged.values())))
    return generate_latest(registry)


class AgentFleet:
    """The slots and their faults; `serve` answers /<slot>/<a|b>/metrics from them."""

    def __init__(self, slots: int, *, seed: int = 23) -> None:
        self.slots = [Slot() for _ in range(slots)]
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.server: QuietHTTPServer | None = None

    def targets(self) -> list[tuple[str, str]]:
        """(name, metrics path) of every target."""
        return [(f"slot{i}{t}", f"/{i}/{t}/metrics") for i in range(len(self.slots)) for t in "ab"]

    def place(self, pods: dict[str, Container]) -> None:
        """The fleet's running pods, each on a slot (a pod keeps its slot while it runs)."""
        with self.lock:
            for slot in self.slots:
                for name in [n for n in slot.containers if n not in pods]:
                    del slot.containers[name]
            placed = {n for s in self.slots for n in s.containers}
            for name, c in sorted(pods.items()):
                if name in placed:
                    continue
                slot = min(self.slots, key=lambda s: len(s.containers))
                slot.containers[name] = c

    def slot_of(self, pod: str) -> Slot | None:
        return next((s for s in self.slots if pod in s.containers), None)

    def arm(
        self, eligible: set[str], rate: float, groups: Mapping[str, str]
    ) -> tuple[dict[str, str], dict[str, str]]:
        """Advance the armed faults by a poll, and start new ones (at `rate`) on the slots whose pods
        are all `eligible`. Returns ({pod: fault} whose samples the coming poll's answer holds:
        armed or lingering, {pod: fault} begun). `groups` (pod -> workload): a workload's pods
        have one fault kind at a time, so that what its verdict shows is that fault's doing."""
        started: dict[str, str] = {}
        with self.lock:
            kind_of = {
                groups.get(p, p): k for s in self.slots if (k := s.fault or s.lingering) for p in s.containers
            }
            for slot in self.slots:
                if slot.lingering is not None:
                    slot.lingering = None
                    continue
                if slot.fault is not None:
                    slot.polls_left -= 1
                    if slot.rollout_both:  # the old agent's pod is gone: the new one alone
                        slot.rollout_both = False
                        slot.live = "b" if slot.live == "a" else "a"
                    if slot.polls_left <= 0:
                        slot.lingering, slot.fault, slot.skew = slot.fault, None, 0.0
                if slot.fault is not None or slot.lingering is not None or not slot.containers:
                    continue
                if not set(slot.containers) <= eligible or self.rng.random() >= rate:
                    continue
                workload = groups.get(next(iter(slot.containers)), "")
                fault = kind_of.setdefault(workload, self.rng.choice(AGENT_FAULTS))
                slot.fault, slot.polls_left = fault, EPISODE_POLLS.get(fault, 1)
                slot.skew = self.rng.choice(NODE_SKEWS) if fault == "agent-node-clock-skew" else 0.0
                slot.rollout_both = fault == "agent-rollout"
                started.update(dict.fromkeys(slot.containers, fault))
            armed = {
                pod: kind for s in self.slots if (kind := s.fault or s.lingering) for pod in s.containers
            }
            return armed, started

    def clear(self) -> None:
        with self.lock:
            for slot in self.slots:
                slot.fault, slot.skew, slot.rollout_both, slot.polls_left = None, 0.0, False, 0
                slot.lingering = None

    def render(self, slot: int, target: str) -> bytes | None:
        with self.lock:
            return self.slots[slot].render(target, time.time())

    def serve(self, port: int) -> None:
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            owner: ClassVar[AgentFleet] = fleet

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                parts = self.path.split("?")[0].strip("/").split("/")
                body: bytes | None = b"not found\n"
                code = 404
                slot = int(parts[0]) if len(parts) == 3 and parts[0].isdigit() else -1
                if 0 <= slot < len(self.owner.slots) and parts[1] in ("a", "b"):
                    body = self.owner.render(slot, parts[1])
                    code = 200 if body is not None else 503
                data = body if body is not None else b"agent restarting\n"
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = QuietHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
