"""Idle sessions on the devcluster's real node: the cases beside a plain idle kernel (that one, the
silent computation and failing signals are tests/e2e/test_idle_sessions_real.py's), each a real
container of the notebook node image (jupyter-server, ipykernel, tmux, procps' `watch`, bash) under
a short test policy (after 40 s, warnBefore 20 s, maxSnooze 30 s; docs/idle-sessions.md).

As there, every rung reads a real source except the GPU, the one double (utilization 0, steady
memory, from the fake dcgm-exporter): CPU from the kubelet's cAdvisor through Prometheus, process
starts, running states and terminal wakeups from the real node agent's scans of the host's /proc.

- **open tab**: a kernel whose client stays connected (its channels websocket held open and pinged,
  and what a browser tab polls: GET /api/kernels, /api/kernels/<id>, /api/sessions, /api/status)
  but runs nothing is warned and stopped, the tab still polling past the deadline: connections and
  heartbeats are no rung.
- **tmux typed**: a tmux session with one `tmux attach` client held open (an exec with a tty, as
  `kubectl exec -it` opens it) into which the test types `:` and Enter (a bash builtin: no process
  starts) every few seconds is never warned. The terminal rung keeps it: the pane's bash wakes for
  every keystroke; the test reads from Prometheus that the agent's terminal wakeups moved within the
  window while no process started in it.
- **tmux untouched**: the same tmux session nobody attaches to is warned (class terminal) and stopped.
- **watch beside a holder**: `watch -n 2 date` next to `sleep infinity` (the GPU's memory held by
  the double) is warned as class monitor and stopped: the monitor's own wakeups, children and CPU
  are no activity.
- **snooze**: a warned kernel annotated `ghostgpu.io/keep-until` within maxSnooze has its deadline
  moved to that time, `ghostgpu.io/keep-until-honoured` written (naming the field manager that set
  it) and an IdleSessionSnoozed Event; then a keep-until an hour away is cut to maxSnooze after it
  was set, and recorded so; the stop comes only after the honoured time (its
  `ghostgpu.io/reclaimed-at`, written just before the scale to 0).
- **activity cancels the warning**: a warned kernel that then computes on the CPU has its warning
  removed (the three annotations) with an IdleSessionActive Event naming the rung that moved, and is
  never stopped.
- **controller restarted during a warning**: the controller is stopped (SIGTERM) once a tmux
  session is warned and a new process started with the same configuration; the deadline and
  warned-at annotations stay as they were (one IdleSessionWarning, never a later deadline), and the
  new controller's stop comes at or after that deadline.

The seven sessions run side by side under one controller and one agent, so the module takes about
one session's timeline (the snooze's is the longest): background threads type, poll as a tab, and
act on warnings (execute, snooze, restart) on each session's own timeline, and one watcher records
every Deployment's replicas and annotations each second; the tests read those records.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import urllib3
import websocket
from idle_real import (
    AFTER,
    WARN_BEFORE,
    Named,
    Owners,
    Session,
    agent_series,
    busy_cell,
    cpu_rate,
    decisions_of,
    free_port,
    idle_config,
    promql,
    start_agent,
    start_pods,
    stop_agent,
    wait_decision,
)
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from test_controller import Controller, opt_in, wait_for

from ghostgpu.actuators import RECLAIMED_AT
from ghostgpu.devcluster import DevCluster
from ghostgpu.devcluster.fleet import Box
from ghostgpu.idle_policy import IdleSessionsConfig
from ghostgpu.idle_sessions import (
    IDLE_DEADLINE,
    IDLE_SINCE,
    IDLE_WARNED_AT,
    KEEP_HONOURED,
    KEEP_UNTIL,
    format_time,
    parse_time,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.real_node, pytest.mark.timeout(600)]

MAX_SNOOZE = 30  # seconds: the test policy's maxSnooze
SNOOZE_ASK = 25  # the first keep-until, from when it is set: within maxSnooze and past the deadline
SNOOZE_MANAGER = "e2e-annotate"  # the field manager the snoozes are written with
TYPE_EVERY = 6  # seconds between keystrokes: several within every window
# Seconds between a tab's polls: JupyterLab's kernel and session managers poll every 10 s. Twice
# that pace (4 requests and a ping every 5 s) cost this loaded machine's Jupyter server 0.026-0.027
# cores over a window, above cpuBelow (0.02): the CPU rung then cancelled the warning.
TAB_EVERY = 10
FULL = AFTER + WARN_BEFORE
# Until the end of the module: the cancelled kernel computes, so it is never warned again.
CANCEL_BUSY_S = 400
# The agent's and controller's pace on a loaded 2-core machine: scan 1 s, scrape 1 s, poll 2 s,
# cAdvisor's 10-15 s refresh; timeouts leave room for all of them.
SLACK = 90
# tmux in the container (its server daemonizes; `sleep infinity` holds the container); TERM is a
# terminal the image's terminfo knows, for tmux and watch.
TMUX = "export TERM=xterm; tmux new-session -d -s work bash && exec sleep infinity"
WATCH = "export TERM=xterm; watch -n 2 date >/dev/null 2>&1 & exec sleep infinity"


@dataclass
class Shell:
    """A container of the notebook image running `script` (a tmux server, a monitor)."""

    name: str
    script: str
    pod: str = ""
    container: str = "shell"

    @property
    def box(self) -> Box:
        return Box(["/bin/sh", "-c", self.script], image="notebook")


@dataclass(frozen=True)
class Seen:
    """One look at a session's Deployment."""

    at: float  # unix time
    replicas: int
    annotations: dict[str, str]


class Loop(threading.Thread):
    """Calls `tick` every `every` seconds until halted; the first error ends it and is kept."""

    def __init__(self, every: float) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.tick()
                self.halt.wait(self.every)
        except BaseException as exc:  # read by the tests
            self.error = exc

    def tick(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        self.halt.set()
        self.join(timeout=30)


class Watcher(Loop):
    """Every second, every Deployment of the namespace: its replicas and annotations."""

    def __init__(self, owners: Owners) -> None:
        super().__init__(1.0)
        self.owners = owners
        self.seen: dict[str, list[Seen]] = {}
        self.lock = threading.Lock()

    def tick(self) -> None:
        now = time.time()
        try:
            items = self.owners.apps.list_namespaced_deployment(self.owners.ns).items
        except (ApiException, urllib3.exceptions.HTTPError):
            return  # one lost look on a loaded machine; the next second's look tells the same
        for d in items:
            look = Seen(now, int(d.spec.replicas), dict(d.metadata.annotations or {}))
            with self.lock:
                self.seen.setdefault(d.metadata.name, []).append(look)

    def of(self, s: Named) -> list[Seen]:
        with self.lock:
            return list(self.seen.get(s.name, []))

    def last(self, s: Named) -> Seen | None:
        looks = self.of(s)
        return looks[-1] if looks else None

    def warned(self, s: Named) -> bool:
        last = self.last(s)
        return last is not None and IDLE_DEADLINE in last.annotations

    def story(self, s: Named, t0: float) -> str:
        """Each change of the session's replicas, deadline and snooze record, `t0` as 0 s."""
        out, prev = [], None
        for x in self.of(s):
            now = (x.replicas, x.annotations.get(IDLE_DEADLINE), x.annotations.get(KEEP_HONOURED))
            if now != prev:
                out.append(f"{x.at - t0:.0f}s {now}")
                prev = now
        return "; ".join(out)


class Typist(Loop):
    """One `tmux attach` client held open through an exec with a tty (what `kubectl exec -it`
    opens), typing `:` and Enter every TYPE_EVERY seconds: a bash builtin, so no process starts;
    the pane's bash wakes for each key."""

    def __init__(self, owners: Owners, s: Shell) -> None:
        super().__init__(TYPE_EVERY)
        self.keys: list[float] = []  # unix time of each line typed
        self.ws = stream(
            owners.core.connect_get_namespaced_pod_exec,
            s.pod,
            owners.ns,
            container=s.container,
            command=["env", "TERM=xterm", "tmux", "attach", "-t", "work"],
            stdin=True,
            stdout=True,
            stderr=False,
            tty=True,
            _preload_content=False,
        )
        # A terminal's size, as kubectl sends it (a pty made by the runtime starts at 0x0).
        self.ws.write_channel(4, json.dumps({"Width": 100, "Height": 30}))
        self.attached = time.time()

    def tick(self) -> None:
        if not self.ws.is_open():
            raise AssertionError("the tmux attach client's exec closed")
        self.ws.update(timeout=0)
        self.ws.read_all()  # what the client draws: drained, not read
        if time.time() - self.attached >= 2:  # the client's first screen is drawn
            self.ws.write_stdin(":\r")
            self.keys.append(time.time())

    def finish(self) -> None:
        super().finish()
        with contextlib.suppress(Exception):
            self.ws.close()


class OpenTab(Loop):
    """What a browser tab with a notebook open does while nobody uses it: its kernel's channels
    websocket stays connected and is pinged, and the tab polls the server's kernels, sessions and
    status. Stops polling once the server is gone (the session stopped)."""

    def __init__(self, s: Session) -> None:
        super().__init__(TAB_EVERY)
        self.s = s
        self.ws = s.channels(timeout=5)
        self.ok: list[float] = []  # unix time of each full round of polls answered
        self.gone_at: float | None = None

    def tick(self) -> None:
        if self.gone_at is not None:
            return
        try:
            with self.s.api() as api:
                for path in ("/api/kernels", f"/api/kernels/{self.s.kernel}", "/api/sessions", "/api/status"):
                    r = api.get(path)
                    assert r.status_code == 200, (path, r.status_code, r.text)
            self.ws.ping()
            self._drain()
        except (httpx.HTTPError, websocket.WebSocketException, OSError):
            self.gone_at = time.time()
            return
        self.ok.append(time.time())

    def _drain(self) -> None:
        """What the server sent on the channels (status messages at connect): read, not used."""
        self.ws.settimeout(0.1)
        with contextlib.suppress(websocket.WebSocketTimeoutException):
            while self.ws.recv():
                pass
        self.ws.settimeout(5)

    def finish(self) -> None:
        super().finish()
        with contextlib.suppress(Exception):
            self.ws.close()


@dataclass
class Bench(Owners):
    tab: Session
    snoozed: Session
    cancelled: Session
    typed: Shell
    untouched: Shell
    watch: Shell
    restarted: Shell
    config: Path
    tmp: Path
    controllers: list[Controller] = field(default_factory=list)
    watcher: Watcher | None = None
    director: Director | None = None
    typist: Typist | None = None
    open_tab: OpenTab | None = None

    @property
    def controller(self) -> Controller:
        return self.controllers[-1]

    def start_controller(self) -> None:
        name = "idle" if not self.controllers else f"idle-{len(self.controllers) + 1}"
        ctrl = Controller(self.cluster.kubeconfig, self.config, self.tmp, name)
        self.controllers.append(ctrl)

    def decisions(self, s: Named) -> list[dict[str, Any]]:
        return [d for c in self.controllers for d in decisions_of(c, self.ns, s)]

    def scaled_at(self, s: Named) -> float:
        """When the stop was written: its ghostgpu.io/reclaimed-at (whole seconds, the controller's
        clock, set just before the scale to 0 and kept until a restore)."""
        at = parse_time(self.annotations(s).get(RECLAIMED_AT, ""))
        assert at is not None, self.annotations(s)
        return at

    def threads(self) -> list[Loop]:
        return [t for t in (self.director, self.typist, self.open_tab, self.watcher) if t is not None]


class Director(Loop):
    """Acts on warnings as the watcher sees them, each on its session's own timeline:
    - the cancelled kernel, once warned: a CPU cell runs in it;
    - the snoozed kernel, once warned: keep-until SNOOZE_ASK seconds ahead; once that is honoured,
      keep-until an hour ahead (beyond maxSnooze);
    - the restarted shell, once warned: the controller stopped and a new one started."""

    def __init__(self, bench: Bench, watcher: Watcher) -> None:
        super().__init__(0.5)
        self.b, self.w = bench, watcher
        self.marks: dict[str, float] = {}  # unix time of each act
        self.asked: dict[str, str] = {}  # the keep-until values written

    def tick(self) -> None:
        b, w, m = self.b, self.w, self.marks
        if "executed" not in m and w.warned(b.cancelled):
            b.cancelled.execute(busy_cell(CANCEL_BUSY_S, spin_first=6))
            m["executed"] = time.time()
        if "snooze-1" not in m and w.warned(b.snoozed):
            self._snooze("snooze-1", SNOOZE_ASK)
        last = w.last(b.snoozed)
        if "snooze-1" in m and "snooze-2" not in m and last and KEEP_HONOURED in last.annotations:
            self._snooze("snooze-2", 3600)
        if "restart" not in m and w.warned(b.restarted):
            m["restart"] = time.time()
            b.controllers[-1].stop()
            m["stopped"] = time.time()
            b.start_controller()
            m["started"] = time.time()

    def _snooze(self, mark: str, ahead: float) -> None:
        now = time.time()
        value = format_time(now + ahead)
        body = {"metadata": {"annotations": {KEEP_UNTIL: value}}}
        self.b.apps.patch_namespaced_deployment(
            self.b.snoozed.name, self.b.ns, body, field_manager=SNOOZE_MANAGER
        )
        self.marks[mark], self.asked[mark] = now, value


@pytest.fixture(scope="module")
def bench(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    if devcluster.state.real_node is None:
        pytest.fail(f"the devcluster's real node did not start: {devcluster.state.real_node_error}")
    tmp = tmp_path_factory.mktemp("idle-cases")
    t0 = time.monotonic()
    ns = f"idle-cases-{int(time.time())}"
    tab, snoozed = Session("open-tab", free_port()), Session("snoozed-kernel", free_port())
    cancelled = Session("cancelled-kernel", free_port())
    typed, untouched = Shell("tmux-typed", TMUX), Shell("tmux-untouched", TMUX)
    watch, restarted = Shell("watch-beside-holder", WATCH), Shell("restarted-tmux", TMUX)
    kernels, shells = (tab, snoozed, cancelled), (typed, untouched, watch, restarted)
    start_pods(devcluster, ns, [(s, s.box) for s in (*kernels, *shells)])
    for s in kernels:
        wait_for(s.answers, 60, f"{s.name}: Jupyter's API")
    print(f"[idle-cases] pods and Jupyter servers up in {time.monotonic() - t0:.1f}s")

    config = idle_config(tmp, devcluster.state.prometheus_url, maxSnooze=f"{MAX_SNOOZE}s")
    b = Bench(devcluster, ns, tab, snoozed, cancelled, typed, untouched, watch, restarted, config, tmp)
    agent = start_agent(devcluster, tmp)
    t_ctrl = time.time()
    try:
        for s in kernels:
            s.start_kernel()
        b.typist, b.open_tab = Typist(b, typed), OpenTab(tab)
        b.watcher = Watcher(b)
        b.director = Director(b, b.watcher)
        opt_in(devcluster, ns)
        b.start_controller()
        t_ctrl = time.time()
        for t in b.threads():
            t.start()
        yield b
    finally:
        for t in b.threads():
            t.finish()
        for c in b.controllers:
            c.stop()
        stop_agent(devcluster, agent)
        devcluster.dcgm.clear()
        for c in b.controllers:  # what each controller did, for a failure's reader
            lines = c.log_path.read_text().splitlines()
            print(f"[idle-cases] {c.name}:", *[x for x in lines if _acted(x)][-40:], sep="\n")
        if b.watcher is not None:
            for s in (*kernels, *shells):
                print(f"[idle-cases] {s.name}: {b.watcher.story(s, t_ctrl)}")
                for e in b.events(s):
                    if e.reason.startswith("IdleSession"):
                        print(f"[idle-cases]   {e.reason} x{e.count or 1}: {e.message[:160]}")
        devcluster.kube.delete("v1", "Namespace", ns)


def _acted(line: str) -> bool:
    return '"actions":[]' not in line and any(k in line for k in ('"actions"', "leadership", "idle session"))


def healthy(b: Bench) -> None:
    for t in b.threads():
        assert t.error is None, f"{type(t).__name__}: {t.error!r}"


def wait_seen(b: Bench, s: Named, cond: Callable[[Seen], bool], timeout: float, what: str) -> Seen:
    """The first look at the session's Deployment for which `cond` holds (waiting for it)."""
    assert b.watcher is not None

    def first() -> Seen | None:
        healthy(b)
        return next((x for x in b.watcher.of(s) if cond(x)), None)

    return wait_for(first, timeout, f"{s.name}: {what}")


def looks(b: Bench, s: Named) -> list[Seen]:
    assert b.watcher is not None
    return b.watcher.of(s)


def deadline_of(look: Seen) -> float:
    t = parse_time(look.annotations[IDLE_DEADLINE])
    assert t is not None, look.annotations
    return t


def warned_then_stopped(b: Bench, s: Named, cls: str) -> tuple[Seen, float]:
    """Warned (the three annotations, a Warning Event naming the class), then scaled to 0 at or
    after the deadline the warning gave, with an IdleSessionStopped Event and an `idle-stop` line in
    the decision log; returns the first warned look and the scale's time."""
    warned = wait_seen(b, s, lambda x: IDLE_DEADLINE in x.annotations, AFTER + SLACK, "warned")
    assert {IDLE_SINCE, IDLE_WARNED_AT, IDLE_DEADLINE} <= set(warned.annotations), warned.annotations
    events = [e for e in b.events(s) if e.reason == "IdleSessionWarning"]
    assert events and events[0].type == "Warning", [(e.reason, e.message) for e in b.events(s)]
    assert f"idle {cls} session" in events[0].message, events[0].message
    print(f"[idle-cases] {s.name}: {events[0].message}")
    wait_seen(b, s, lambda x: x.replicas == 0, WARN_BEFORE + SLACK, "stopped")
    scaled = b.scaled_at(s)
    final = max(deadline_of(x) for x in looks(b, s) if IDLE_DEADLINE in x.annotations)
    assert scaled >= final, f"scaled to 0 at {format_time(scaled)}, before its deadline {format_time(final)}"
    wait_for(lambda: b.has_event(s, "IdleSessionStopped"), 30, f"{s.name}: the IdleSessionStopped Event")
    assert any(d.get("action") == "idle-stop" for d in b.decisions(s)), b.decisions(s)
    print(f"[idle-cases] {s.name}: scaled to 0 {scaled - deadline_of(warned):+.0f}s from its first deadline")
    return warned, scaled


def test_an_open_tab_keeps_nothing(bench: Bench) -> None:
    tab = bench.open_tab
    assert tab is not None
    warned, _ = warned_then_stopped(bench, bench.tab, "notebook")
    running = agent_series("ghostgpu_agent_container_running", bench.ns, bench.tab)
    scans = promql(bench.cluster, f"count_over_time({running}[3m])")
    busy = promql(bench.cluster, f"count_over_time(({running} > 0)[3m:1s])") or 0
    print(f"[idle-cases] open tab: {busy} of {scans} agent scans saw a process running")
    # The connection and its pings are no rung, and the worker rung does not count the front-end
    # server caught answering them. Its CPU is the container's, though: on a loaded machine it can
    # pass cpuBelow, which cancels the warning until the next one (docs/idle-sessions.md, Limits).
    # Any cancellation must name that rung alone, and the session is still stopped.
    told = [(e.reason, e.message) for e in bench.events(bench.tab) if e.reason.startswith("IdleSession")]
    cancelled = [m for r, m in told if r == "IdleSessionActive"]
    assert all(("cpu:" in m and "worker:" not in m) for m in cancelled), told
    print(f"[idle-cases] open tab: {len(cancelled)} warning(s) cancelled by the server's own work")
    # The tab was connected and polling through the warning and past the deadline.
    deadline = deadline_of(warned)
    assert tab.ok and tab.ok[0] < warned.at, "the tab was not polling before the warning"
    assert max(tab.ok) >= deadline - TAB_EVERY - 2, (format_time(max(tab.ok)), format_time(deadline))
    assert tab.ws.connected or tab.gone_at is not None
    last = max(tab.ok) - deadline
    print(
        f"[idle-cases] open tab: {len(tab.ok)} rounds of polls and pings, "
        f"the last {last:+.0f}s from the deadline"
    )


def test_an_untouched_tmux_session_is_warned_and_stopped(bench: Bench) -> None:
    warned_then_stopped(bench, bench.untouched, "terminal")


def test_watch_beside_a_holder_is_stopped_as_a_monitor(bench: Bench) -> None:
    warned_then_stopped(bench, bench.watch, "monitor")


def test_a_tmux_session_typed_into_is_never_warned(bench: Bench) -> None:
    """Typed into for longer than after + warnBefore (and the polls around them) by then."""
    typist, s = bench.typist, bench.typed
    assert typist is not None and bench.watcher is not None
    end = typist.attached + FULL + 20
    while time.time() < end:
        healthy(bench)
        time.sleep(2)
    seen = looks(bench, s)
    assert seen and all(IDLE_DEADLINE not in x.annotations and x.replicas == 1 for x in seen), seen[-1:]
    assert not [e for e in bench.events(s) if e.reason.startswith("IdleSession")]
    assert len(typist.keys) >= FULL // TYPE_EVERY, typist.keys
    # What kept it, read as the ladder reads it: the terminal rung moved within the last window,
    # and no process of the container started in it (`:` is a builtin); its CPU is printed.
    window = f"{AFTER}s"
    wakeups = agent_series("ghostgpu_agent_container_tty_wakeups", bench.ns, s)
    moved = promql(bench.cluster, f"changes({wakeups}[{window}])")
    assert moved is not None and moved > 0, moved
    started = agent_series("ghostgpu_agent_container_newest_start_seconds", bench.ns, s)
    newest = promql(bench.cluster, f"max_over_time({started}[{window}])")
    assert newest is not None and newest <= time.time() - AFTER, (newest, time.time())
    cpu = cpu_rate(bench.cluster, bench.ns, s, window)
    print(
        f"[idle-cases] tmux typed: {len(typist.keys)} lines typed, {moved:.0f} changes of the terminal "
        f"wakeups in {window}, youngest process {time.time() - newest:.0f}s old, {cpu:.4f} cores "
        f"(cpuBelow {IdleSessionsConfig().cpu_below})"
    )


def test_activity_cancels_the_warning(bench: Bench) -> None:
    d, s = bench.director, bench.cancelled
    assert d is not None and bench.watcher is not None
    warned = wait_seen(bench, s, lambda x: IDLE_DEADLINE in x.annotations, AFTER + SLACK, "warned")
    wait_for(lambda: "executed" in d.marks or healthy(bench), 30, "the CPU cell run")
    cleared = wait_seen(
        bench,
        s,
        lambda x: x.at > warned.at and IDLE_DEADLINE not in x.annotations,
        WARN_BEFORE + SLACK,
        "cleared",
    )
    assert not {IDLE_SINCE, IDLE_WARNED_AT, IDLE_DEADLINE} & set(cleared.annotations), cleared.annotations
    active = [e for e in bench.events(s) if e.reason == "IdleSessionActive"]
    assert active, [(e.reason, e.message) for e in bench.events(s)]
    rungs = ("cpu:", "worker:")
    assert any(r in active[0].message for r in rungs), active[0].message
    print(
        f"[idle-cases] cancelled {cleared.at - d.marks['executed']:.0f}s after the cell started, "
        f"{deadline_of(warned) - cleared.at:.0f}s before the deadline: {active[0].message}"
    )
    # Never stopped: through its old deadline, a full after + warnBefore more, while it computes.
    end = deadline_of(warned) + FULL
    while time.time() < end:
        healthy(bench)
        time.sleep(2)
    seen = looks(bench, s)
    assert all(x.replicas == 1 for x in seen)
    assert not any(x.at > cleared.at and IDLE_DEADLINE in x.annotations for x in seen)
    assert not bench.has_event(s, "IdleSessionStopped")
    assert s.kernel_alive()


def test_a_snooze_is_honoured_up_to_max_snooze(bench: Bench) -> None:
    d, s = bench.director, bench.snoozed
    assert d is not None
    warned = wait_seen(bench, s, lambda x: IDLE_DEADLINE in x.annotations, AFTER + SLACK, "warned")
    first_deadline = deadline_of(warned)
    # Within maxSnooze: honoured as asked.
    honoured = wait_seen(bench, s, lambda x: KEEP_HONOURED in x.annotations, WARN_BEFORE + SLACK, "snoozed")
    assert "snooze-1" in d.marks and d.marks["snooze-1"] < first_deadline, (d.marks, first_deadline)
    assert honoured.annotations[IDLE_DEADLINE] == d.asked["snooze-1"], (honoured.annotations, d.asked)
    note = honoured.annotations[KEEP_HONOURED]
    assert f"kept until {d.asked['snooze-1']}" in note and SNOOZE_MANAGER in note and "cut" not in note, note
    assert honoured.annotations[IDLE_WARNED_AT] == warned.annotations[IDLE_WARNED_AT]
    # Beyond maxSnooze: cut to maxSnooze after it was set, and recorded so.
    cut = wait_seen(
        bench, s, lambda x: "cut to maxSnooze" in x.annotations.get(KEEP_HONOURED, ""), SLACK, "cut"
    )
    set_at = d.marks["snooze-2"]
    cut_deadline = deadline_of(cut)
    assert set_at - 2 <= cut_deadline - MAX_SNOOZE <= set_at + 1, (format_time(set_at), cut.annotations)
    assert f"asked {d.asked['snooze-2']}" in cut.annotations[KEEP_HONOURED], cut.annotations
    snoozed = [e for e in bench.events(s) if e.reason == "IdleSessionSnoozed"]
    assert len(snoozed) >= 2 or (snoozed and (snoozed[0].count or 1) >= 2), [e.message for e in snoozed]
    # Stopped only after the honoured time.
    wait_seen(bench, s, lambda x: x.replicas == 0, MAX_SNOOZE + SLACK, "stopped")
    scaled = bench.scaled_at(s)
    assert scaled >= cut_deadline, (scaled, cut_deadline)
    print(
        f"[idle-cases] snoozed: first deadline {first_deadline - warned.at:+.0f}s from the watcher's first "
        "look at the warning, "
        f"honoured to {deadline_of(honoured) - first_deadline:+.0f}s past it, then cut to "
        f"{cut_deadline - set_at:.0f}s after the second keep-until; scaled to 0 "
        f"{scaled - cut_deadline:+.0f}s from it"
    )


def test_a_restarted_controller_keeps_the_deadline(bench: Bench) -> None:
    d, s = bench.director, bench.restarted
    assert d is not None and bench.watcher is not None
    warned = wait_seen(bench, s, lambda x: IDLE_DEADLINE in x.annotations, AFTER + SLACK, "warned")
    wait_for(lambda: "started" in d.marks or healthy(bench), 60, "the controller restarted")
    assert d.marks["restart"] < deadline_of(warned), "the restart came after the deadline"
    wait_seen(bench, s, lambda x: x.replicas == 0, WARN_BEFORE + SLACK, "stopped")
    record = {k: warned.annotations[k] for k in (IDLE_SINCE, IDLE_WARNED_AT, IDLE_DEADLINE)}
    for x in looks(bench, s):
        if IDLE_DEADLINE in x.annotations:
            assert {k: x.annotations.get(k) for k in record} == record, (x, record)
    warnings = [e for e in bench.events(s) if e.reason == "IdleSessionWarning"]
    assert len(warnings) == 1 and (warnings[0].count or 1) == 1, [(e.message, e.count) for e in warnings]
    scaled = bench.scaled_at(s)
    assert scaled >= deadline_of(warned), (scaled, record)
    # The stop was the new controller's.
    assert wait_decision(bench.controller, bench.ns, s, "idle-stop")
    print(
        f"[idle-cases] restarted controller: stopped {d.marks['restart'] - warned.at:.0f}s after the "
        f"warning, a new one running {d.marks['started'] - d.marks['restart']:.0f}s later; scaled to 0 "
        f"{scaled - deadline_of(warned):+.0f}s from the deadline it kept"
    )
