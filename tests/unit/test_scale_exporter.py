"""The scale bench's exporter prints the node agent's series as the agent itself does (pure)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ghostgpu.agent.exporter import AgentExporter
from ghostgpu.agent.scan import ContainerKey, ScanResult, Seen
from ghostgpu.scale.exporter import _Body, agent_exposition, agent_scans
from ghostgpu.scale.fleet import BUSY_TABLE, IDLE_TABLE
from ghostgpu.signals.agent import PROCESSES_METRIC, SCAN_METRIC
from ghostgpu.signals.processes import parse_ps
from ghostgpu.verdict import ProcessPolicy, count_roles

ROWS = [["scale-00", "g00000", "gpu-s-0000", 0, "uid-a"], ["scale-01", "g00001", "gpu-s-0000", 57, "uid-b"]]
AGENT = (PROCESSES_METRIC, SCAN_METRIC)


def _samples(text: bytes) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for fam in text_string_to_metric_families(text.decode())
        for s in fam.samples
        if s.name in AGENT
    }


def test_the_bench_serves_what_the_agent_would_for_the_same_processes() -> None:
    policy = ProcessPolicy()
    rows = {
        ContainerKey(ns, pod, uid, "main"): parse_ps(IDLE_TABLE if util == 0 else BUSY_TABLE)
        for ns, pod, _node, util, uid in ROWS
    }
    scan = ScanResult(
        timestamp=1700000000.0,
        containers={k: Seen(counts=count_roles(r, policy), rows=r) for k, r in rows.items()},
        scanned_pids=3,
    )
    agent = AgentExporter("gpu-s-0000")
    agent.publish(scan)
    bench = agent_exposition(ROWS) + agent_scans(ROWS, 1700000000.0)
    assert _samples(bench) == _samples(generate_latest(agent.registry))
    # what the verdict reads: the idle pod holds only a holder, the busy one works
    idle = ("scale-00", "g00000")
    held = {
        (dict(lab)["role"], v)
        for n, lab, v in _samples(bench)
        if n == PROCESSES_METRIC and (dict(lab)["tracked_namespace"], dict(lab)["tracked_pod"]) == idle
    }
    assert held == {("holder", 1.0)}, "no zero-valued role series"
    # the busy pod: its shell, its program (named on the work series) and the presence series
    per_pod: dict[str, list[tuple[str, tuple[tuple[str, str], ...]]]] = {}
    for n, lab, _v in _samples(bench):
        per_pod.setdefault(dict(lab)["tracked_pod"], []).append((n, lab))
    busy = sorted(
        (n, dict(lab).get("role", ""), dict(lab).get("programs", "")) for n, lab in per_pod["g00001"]
    )
    assert busy == [
        (PROCESSES_METRIC, "work", "train.py"),
        (PROCESSES_METRIC, "wrapper", ""),
        (SCAN_METRIC, "", ""),
    ]


def _stamps(text: bytes) -> list[float]:
    fams = text_string_to_metric_families(text.decode())
    return [s.value for fam in fams for s in fam.samples if s.name == SCAN_METRIC]


def test_scan_timestamps_are_as_fresh_as_the_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    import ghostgpu.scale.exporter as exporter

    clock = iter([990.0, 1000.0, 1000.5, 1005.0, 1010.0])  # the first: the fleet loaded
    monkeypatch.setattr(exporter.time, "time", lambda: next(clock))
    body = _Body(ROWS, agent=True)
    assert _stamps(body.render_agent()) == [1000.0, 1000.0]
    assert _stamps(body.render_agent()) == [1000.0, 1000.0]  # within a second: the same block
    assert _stamps(body.render_agent()) == [1005.0, 1005.0]  # the next scrape 5 s later: fresh
    # the agents' series are a target of their own (/agent/metrics), as the agent's pods are
    assert not _samples(body.render())
    assert not _samples(_Body(ROWS, agent=False).render_agent()), "--no-agent serves dcgm's series only"
