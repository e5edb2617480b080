"""Idle sessions on the devcluster's real node, with a real Jupyter server and kernel (the notebook
node image: jupyter-server and ipykernel from PyPI) driven through Jupyter's own REST and websocket
API, under a short test policy (docs/idle-sessions.md).

Every rung reads a real source except the GPU, the one double: utilization 0 and steady memory from
the fake dcgm-exporter. CPU is the real kubelet's cAdvisor counter scraped by Prometheus (the
default `cpuSource`); processes, running states and terminal wakeups come from the real node agent
(`ghostgpu agent`, its own process reading the host's /proc), scraped as a target of its own that
`metrics.agentSource` names; the verdict's processes from the controller's exec of the container's
own `ps`.

- an idle kernel (started with POST /api/kernels, nothing run in it) is warned (annotations and a
  Warning Event on its Deployment), stopped through its owner (the Deployment to 0 replicas), and
  `ghostgpu restore` brings it back;
- a cell that computes on the CPU and prints nothing, running longer than `after` + `warnBefore`,
  is never warned, and is still computing at the end;
- an idle kernel whose signals fail during its warning is never stopped on them: its GPU series
  gone across the deadline, then its GPU back while the node agent hangs (SIGSTOP: its scans go
  stale, its target's scrapes fail), then Prometheus hangs (queries time out, a gap in every
  series), then the node's kubelet stops (the exec of `ps` fails, cAdvisor is not scraped); the
  warning stays, the decision log holds it (`idle-hold`)
  while they last, and the stop comes only once a full `after` + `warnBefore` of fresh evidence
  holds again.

The three sessions run side by side (one controller, one agent), so the module takes about one
session's timeline plus the faults'.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cli_runs import restore
from idle_real import (
    AFTER,
    CPU_WINDOW,
    WARN_BEFORE,
    Owners,
    Session,
    busy_cell,
    computing,
    cpu_rate,
    cpu_series,
    decisions_of,
    free_port,
    idle_config,
    promql,
    start_agent,
    start_pods,
    stop_agent,
    wait_decision,
)
from test_controller import Controller, opt_in, wait_for

from ghostgpu.devcluster import DevCluster
from ghostgpu.devcluster.fleet import the_running_pod
from ghostgpu.idle_policy import IdleSessionsConfig
from ghostgpu.idle_sessions import IDLE_DEADLINE, IDLE_SINCE, IDLE_WARNED_AT

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.real_node, pytest.mark.timeout(600)]

# The silent computation: CPU-bound, prints nothing, for longer than after + warnBefore (and the
# polls around them).
# It outlasts the idle kernel's test (warning, stop, restore and a pod started again), which runs
# before the check that it still computes.
BUSY_S = AFTER + WARN_BEFORE + 180
# The faulted session: how long past its deadline its GPU series stay gone, how long the agent
# hangs after that (its GPU series back: their gap alone then holds the stop for about a window).
# Then Prometheus hangs (SIGSTOP: queries time out, nothing is scraped) for PROMETHEUS_HUNG, then
# the node's kubelet is stopped for KUBELET_DOWN (the exec of `ps` fails, cAdvisor is not scraped).
GPU_GONE_PAST_DEADLINE, AGENT_HUNG, PROMETHEUS_HUNG, KUBELET_DOWN = 20, 20, 15, 15


@dataclass
class Bench(Owners):
    idle: Session
    busy: Session
    faulted: Session
    controller: Controller
    tmp: Path
    faults: FaultScript | None = None


class FaultScript(threading.Thread):
    """Fails the faulted session's signals during its warning, on the session's own timeline,
    watching its Deployment every second meanwhile: the GPU double's series of its pod removed from
    the warning to GPU_GONE_PAST_DEADLINE past the deadline; then, once the idle kernel's own stop
    is done (the agent and Prometheus are shared), its series back and the agent SIGSTOPped for
    AGENT_HUNG seconds, then Prometheus for PROMETHEUS_HUNG, then the kubelet stopped for
    KUBELET_DOWN and started again as it ran. Any stop seen while a fault lasts, or
    the warning withdrawn, is a violation."""

    def __init__(self, bench: Bench, agent: subprocess.Popen[bytes]) -> None:
        super().__init__(daemon=True)
        self.bench, self.agent = bench, agent
        self.marks: dict[str, float] = {}  # monotonic: warned, gpu-off, gpu-back, agent-back, ...
        self.prometheus = next(p.pid for p in bench.cluster.state.processes if p.name == "prometheus")
        self.deadline = 0.0  # unix time, from the warning's annotation
        self.violations: list[str] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            self._script()
        except BaseException as exc:  # reported by the test that reads the script
            self.error = exc
        finally:
            for pid in (self.agent.pid, self.prometheus):
                os.kill(pid, signal.SIGCONT)

    def finish(self) -> None:
        self._halt.set()
        self.join(timeout=30)

    def _script(self) -> None:
        b, s = self.bench, self.bench.faulted
        ann = self._warning(AFTER + 120)
        self.marks["warned"] = time.monotonic()
        self.deadline = datetime.fromisoformat(ann[IDLE_DEADLINE].replace("Z", "+00:00")).timestamp()
        b.cluster.dcgm.remove(b.ns, s.pod)
        self.marks["gpu-off"] = time.monotonic()
        self._watch_until(lambda: time.time() >= self.deadline + GPU_GONE_PAST_DEADLINE, "GPU series gone")
        # The agent is shared: it hangs only once the idle kernel's own test saw its stop.
        idle_stopped = lambda: any(e.reason == "IdleSessionStopped" for e in b.events(b.idle))  # noqa: E731
        self._watch_until(idle_stopped, "GPU series gone", limit=120)
        b.cluster.dcgm.set(b.ns, s.pod, util=0.0, fb_used_mib=20_000, container="notebook", node="localhost")
        self.marks["gpu-back"] = time.monotonic()
        os.kill(self.agent.pid, signal.SIGSTOP)
        self.marks["agent-hung"] = time.monotonic()
        end = time.monotonic() + AGENT_HUNG
        self._watch_until(lambda: time.monotonic() >= end, "agent hung (and the GPU gap in the window)")
        os.kill(self.agent.pid, signal.SIGCONT)
        self.marks["agent-back"] = time.monotonic()
        os.kill(self.prometheus, signal.SIGSTOP)
        end = time.monotonic() + PROMETHEUS_HUNG
        self._watch_until(lambda: time.monotonic() >= end, "Prometheus hung")
        os.kill(self.prometheus, signal.SIGCONT)
        self.marks["prometheus-back"] = time.monotonic()
        launch = b.cluster.stop_node_daemon("kubelet")
        try:
            end = time.monotonic() + KUBELET_DOWN
            self._watch_until(lambda: time.monotonic() >= end, "kubelet down")
        finally:
            b.cluster.start_node_daemon(launch)
        self.marks["kubelet-back"] = time.monotonic()

    def _warning(self, limit: float) -> dict[str, str]:
        end = time.monotonic() + limit
        while not self._halt.is_set() and time.monotonic() < end:
            ann = self.bench.annotations(self.bench.faulted)
            if IDLE_DEADLINE in ann:
                return ann
            time.sleep(1)
        raise AssertionError(f"faulted session: not warned within {limit}s")

    def _watch_until(self, done: Any, fault: str, limit: float = 300) -> None:
        """Every second until `done`: the session still runs and its warning stands."""
        b, s = self.bench, self.bench.faulted
        end = time.monotonic() + limit
        while not done():
            if self._halt.is_set() or time.monotonic() > end:
                raise AssertionError(f"faulted session: {fault}: gave up after {limit}s")
            if b.replicas(s) != 1:
                late = time.time() - self.deadline
                self.violations.append(f"stopped while {fault} ({late:+.0f}s from the deadline)")
            if IDLE_DEADLINE not in b.annotations(s):
                self.violations.append(f"warning withdrawn while {fault}")
            time.sleep(1)


@pytest.fixture(scope="module")
def bench(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    if devcluster.state.real_node is None:
        pytest.fail(f"the devcluster's real node did not start: {devcluster.state.real_node_error}")
    tmp = tmp_path_factory.mktemp("idle-real")
    t0 = time.monotonic()
    ns = f"idle-real-{int(time.time())}"
    idle, busy = Session("idle-kernel", free_port()), Session("silent-computation", free_port())
    faulted = Session("faulted-kernel", free_port())
    sessions = (idle, busy, faulted)
    start_pods(devcluster, ns, [(s, s.box) for s in sessions])
    for s in sessions:
        wait_for(s.answers, 60, f"{s.name}: Jupyter's API")
    print(f"[idle-real] pods and Jupyter servers up in {time.monotonic() - t0:.1f}s")

    agent = start_agent(devcluster, tmp)
    for s in sessions:
        s.start_kernel()
    busy.execute(busy_cell(BUSY_S))
    opt_in(devcluster, ns)
    ctrl = Controller(devcluster.kubeconfig, idle_config(tmp, devcluster.state.prometheus_url), tmp, "idle")
    b = Bench(devcluster, ns, idle, busy, faulted, ctrl, tmp)
    b.faults = FaultScript(b, agent)
    b.faults.start()
    try:
        yield b
    finally:
        b.faults.finish()
        ctrl.stop()
        stop_agent(devcluster, agent)
        devcluster.dcgm.clear()
        print((tmp / "idle.log").read_text()[-4000:])
        devcluster.kube.delete("v1", "Namespace", ns)


def test_cadvisor_cpu_of_the_real_containers_is_in_prometheus(bench: Bench) -> None:
    """The CPU rung's series exists for the real pods under the default cpuSource selector, a
    sample per scrape (the rungs' coverage), and shows the silent computation's CPU (the idle
    kernel's own start is within these seconds: its quiet is the next test's to show)."""
    for s in (bench.idle, bench.busy):
        wait_for(
            lambda s=s: promql(bench.cluster, cpu_series(bench.ns, s)) is not None,
            60,
            f"{s.name}: cAdvisor CPU",
        )
    time.sleep(10)
    samples = promql(bench.cluster, f"count_over_time({cpu_series(bench.ns, bench.busy)}[10s])") or 0
    assert samples >= 9, samples  # a 1 s scrape
    # cAdvisor refreshes a container's counter every 10-15 s (its housekeeping): a rate needs a
    # window that holds two refreshes.
    wait_for(
        lambda: computing(bench.cluster, bench.ns, bench.busy), 60, "the silent computation's CPU in cAdvisor"
    )
    busy, idle = (
        cpu_rate(bench.cluster, bench.ns, bench.busy, CPU_WINDOW),
        cpu_rate(bench.cluster, bench.ns, bench.idle, CPU_WINDOW),
    )
    print(f"[idle-real] CPU over {CPU_WINDOW}: computing {busy:.4f} cores, idle {idle:.4f} cores")


def test_an_idle_kernel_is_warned_then_stopped_through_its_owner_and_restored(bench: Bench) -> None:
    s = bench.idle
    warned = wait_for(lambda: IDLE_DEADLINE in bench.annotations(s), AFTER + 90, "the idle kernel warned")
    assert warned
    warned_after = time.monotonic() - s.started
    ann = bench.annotations(s)
    assert {IDLE_SINCE, IDLE_WARNED_AT, IDLE_DEADLINE} <= set(ann), ann
    events = [e for e in bench.events(s) if e.reason == "IdleSessionWarning"]
    assert events and events[0].type == "Warning", [(e.reason, e.message) for e in bench.events(s)]
    assert "notebook" in events[0].message, events[0].message
    print(f"[idle-real] warned {warned_after:.0f}s after the kernel was up: {events[0].message}")
    assert warned_after >= AFTER, "warned before `after` had passed since the kernel started"

    wait_for(lambda: bench.replicas(s) == 0, WARN_BEFORE + 60, "the idle kernel stopped")
    stopped_after = time.monotonic() - s.started
    print(f"[idle-real] stopped {stopped_after:.0f}s after the kernel was up")
    assert stopped_after >= AFTER + WARN_BEFORE
    # The Event follows the scale-down it reports.
    stopped_event = lambda: any(e.reason == "IdleSessionStopped" for e in bench.events(s))  # noqa: E731
    wait_for(stopped_event, 30, "the IdleSessionStopped Event")
    core = bench.core
    wait_for(
        lambda: not core.list_namespaced_pod(bench.ns, label_selector=f"app={s.name}").items,
        60,
        "the stopped kernel's pod gone",
    )

    out = restore(bench.cluster, f"deployment/{s.name}", bench.ns)
    assert out.returncode == 0 and "to 1 replicas" in out.stdout, (out.stdout, out.stderr)
    pod = wait_for(lambda: the_running_pod(core, bench.ns, s.name), 120, "the kernel's pod running again")
    assert pod != s.pod
    wait_for(s.answers, 60, "Jupyter's API again")


def test_a_silent_cpu_computation_is_never_warned(bench: Bench) -> None:
    """Runs after the idle kernel's test: by then the computation has been silent for longer than
    after + warnBefore, through every poll of the same controller that stopped its neighbour."""
    s = bench.busy
    remaining = AFTER + WARN_BEFORE + 10 - (time.monotonic() - s.started)
    end = time.monotonic() + max(0.0, remaining)
    while True:
        assert IDLE_DEADLINE not in bench.annotations(s), bench.annotations(s)
        if time.monotonic() >= end:
            break
        time.sleep(2)
    assert time.monotonic() - s.started >= AFTER + WARN_BEFORE
    assert not [e for e in bench.events(s) if e.reason.startswith("IdleSession")]
    assert bench.replicas(s) == 1
    assert s.kernel_alive()
    # Still computing: its container's CPU over CPU_WINDOW, from the same cAdvisor series (asked again
    # while the fault script's Prometheus hang or its gap lasts).
    wait_for(lambda: computing(bench.cluster, bench.ns, s), 60, "the silent computation's CPU")


def test_a_warned_kernel_is_never_stopped_on_a_failed_or_stale_signal(bench: Bench) -> None:
    """Runs last: the fault script started with the fixture and follows the session's timeline."""
    faults, s = bench.faults, bench.faulted
    assert faults is not None
    faults_s = GPU_GONE_PAST_DEADLINE + AGENT_HUNG + PROMETHEUS_HUNG + KUBELET_DOWN
    faults.join(timeout=AFTER + WARN_BEFORE + faults_s + 240)
    assert not faults.is_alive(), "the fault script did not end"
    assert faults.error is None, repr(faults.error)
    assert faults.violations == [], faults.violations
    marks = faults.marks
    print(
        "[idle-real] faulted session: "
        + ", ".join(f"{k} at {v - s.started:.0f}s" for k, v in marks.items())
        + f"; deadline at {faults.deadline - time.time() + time.monotonic() - s.started:.0f}s"
    )
    # While its GPU series were gone the controller held the warned session, and said so.
    held = [d for d in decisions_of(bench.controller, bench.ns, s) if d.get("action") == "idle-hold"]
    assert held, decisions_of(bench.controller, bench.ns, s)
    assert any(d.get("verdict") == "UNKNOWN" for d in held), held
    # Then the stop, once fresh evidence covers after + warnBefore again: never inside the last
    # gap's reach (a window of after + warnBefore needs `coverage` of its samples after the gap).
    wait_for(lambda: bench.replicas(s) == 0, AFTER + WARN_BEFORE + 90, "the faulted kernel stopped at last")
    stopped = time.monotonic()
    coverage = IdleSessionsConfig().coverage
    since = stopped - marks["kubelet-back"]
    print(f"[idle-real] faulted session stopped {since:.0f}s after the kubelet came back")
    assert since >= coverage * (AFTER + WARN_BEFORE) - 8, since
    wait_for(lambda: any(e.reason == "IdleSessionStopped" for e in bench.events(s)), 30, "the stop's Event")
    # The poll's decision lines are written after its actions: wait for the stop's line.
    assert wait_decision(bench.controller, bench.ns, s, "idle-stop")
