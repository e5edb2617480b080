"""What the idle-session ladder needs from a container's processes (docs/idle-sessions.md), and
the series that carry it. Pure over the processes one scan read (`procfs.HostProcess`: its
`/proc/<pid>/stat` and `status`, both mode 0444, no ptrace access needed).

Only a container an idle session may live in gets these series: one whose processes, holders and
init wrappers aside, are all programs of a known class (a notebook, a terminal, a server, a
monitor: `idle_sessions.class_of`). A training job, whose program no list knows, gets none; the
controller then cannot tell its class and does nothing with it, which is the safe direction.

Per such container, three series, one more with a monitor, one more with a notebook front-end
(each is a series Prometheus keeps for every such container, so the class rides as a label instead
of a series of its own):
- the unix time the youngest process started, monitors and what they started aside (a command
  typed, a new kernel), labelled with the container's class:
  `ghostgpu_agent_container_newest_start_seconds{class}`;
- how many processes run or wait on I/O (R, D), monitors aside, and in a notebook its front-end
  server aside (caught running, it was answering a browser, an open tab's heartbeat; the kernel,
  where a cell computes, counts): `..._running`;
- the wakeups (context switches) of the processes with a controlling terminal, tmux and screen
  aside (they redraw on their own clock): a keystroke wakes the shell that reads it:
  `..._tty_wakeups`, which only moves (the controller reads any change in the window as activity;
  a process that exits makes it fall, which reads as activity too: the safe direction);
- only where a monitor runs, the CPU seconds of monitors, with the children they started and
  reaped (`watch nvidia-smi`): `..._monitor_cpu_seconds`, which the controller subtracts, up to an
  allowance, from the container's CPU. Without the series nothing is subtracted: one lost on its
  way reads as more CPU, the safe direction;
- only where a notebook's front-end server runs, its own CPU seconds (not its children's: a kernel
  it reaped computed, and that is work): `..._frontend_cpu_seconds`, subtracted the same way up to
  an allowance of its own, for the polls of an open tab it answers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ghostgpu.agent.procfs import HostProcess
from ghostgpu.idle_policy import SessionClass
from ghostgpu.idle_sessions import MONITOR_PROGRAMS, NOTEBOOK_FRONTENDS, class_of, session_program
from ghostgpu.verdict import ProcessPolicy, program_of

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_POLICY = ProcessPolicy()
# Shells are wrappers only without a terminal (an entrypoint's `sh -c`); on a terminal they are
# what a person types into.
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "fish"})
_MULTIPLEXERS = frozenset({"tmux", "tmux: server", "tmux: client", "screen", "SCREEN"})
LABELS = ("tracked_namespace", "tracked_pod", "tracked_uid", "tracked_container")


@dataclass(frozen=True, slots=True)
class IdleFacts:
    session_class: SessionClass
    newest_start_age_s: int  # elapsed seconds of the youngest process, monitors aside
    running: int
    tty_wakeups: int
    monitor_cpu_s: float | None  # None: no monitor runs
    frontend_cpu_s: float | None = None  # None: no notebook front-end server runs


def _is_monitor(args: str) -> bool:
    name, rest = program_of(args)
    if name not in MONITOR_PROGRAMS:
        return False
    if name == "tail":
        follows = any(a in ("-f", "-F", "--follow") or a.startswith("--follow=") for a in rest)
        return follows and not (rest and rest[-1] == "/dev/null")
    return True


def _holds_only(args: str, tty: bool) -> bool:
    """A process that says nothing about a session: an init or supervisor, a shell running a
    script (no terminal), `sleep`, `pause`, `tail -f /dev/null`."""
    name, rest = program_of(args, _POLICY.interpreters)
    if name in _SHELLS:
        return not tty
    if name in _POLICY.wrappers or name in _POLICY.holders or name == "sleep":
        return True
    return name == "tail" and bool(rest) and rest[-1] == "/dev/null"


def idle_facts(group: Sequence[HostProcess]) -> IdleFacts | None:
    """The facts of one container's processes (`procfs.HostProcess`), or None when they name no
    known class."""
    procs = list(group)
    by_pid = {p.pid: p for p in procs}
    roots = {p.pid for p in procs if _is_monitor(p.args)}

    def under_monitor(p: HostProcess) -> bool:
        seen: set[int] = set()
        cur: HostProcess | None = p
        while cur is not None and cur.pid not in seen:
            if cur.pid in roots:
                return True
            seen.add(cur.pid)
            cur = by_pid.get(cur.ppid)
        return False

    monitors = [p for p in procs if under_monitor(p)]
    others = [p for p in procs if not under_monitor(p)]
    live = [p for p in others if p.stat[:1] not in ("Z", "X")]
    keepers = [session_program(p.args) for p in live if not _holds_only(p.args, p.tty)]
    if monitors:
        keepers.append("watch")  # what class_of needs to know: a monitor is there
    cls = class_of(keepers)
    if cls is None or cls is SessionClass.OTHER:
        return None
    working, frontends = live, []
    if cls is SessionClass.NOTEBOOK:
        frontends = [p for p in live if session_program(p.args) in NOTEBOOK_FRONTENDS]
        working = [p for p in live if p not in frontends]
    return IdleFacts(
        session_class=cls,
        newest_start_age_s=min((p.elapsed_s for p in live), default=10**9),
        running=sum(p.stat[:1] in ("R", "D") for p in working),
        tty_wakeups=sum(p.wakeups for p in live if p.tty and program_of(p.args)[0] not in _MULTIPLEXERS),
        monitor_cpu_s=round(sum(p.cpu_ticks for p in monitors) / _CLK_TCK, 2) if monitors else None,
        frontend_cpu_s=round(sum(p.own_cpu_ticks for p in frontends) / _CLK_TCK, 2) if frontends else None,
    )


class IdleFactsCollector(Collector):
    """The idle-session series of the last scan (module docstring); `last()` gives the scan."""

    def __init__(self, last: Callable[[], Any]) -> None:
        self._last = last

    def collect(self) -> Iterator[Metric]:
        newest = GaugeMetricFamily(
            "ghostgpu_agent_container_newest_start_seconds",
            "Unix time the youngest process of the container started, monitors aside; `class`: its "
            "idle-session class (notebook, terminal, server, monitor).",
            labels=[*LABELS, "class"],
        )
        running = GaugeMetricFamily(
            "ghostgpu_agent_container_running",
            "Processes of the container running or in uninterruptible I/O, monitors and a "
            "notebook's front-end server aside.",
            labels=list(LABELS),
        )
        tty = GaugeMetricFamily(
            "ghostgpu_agent_container_tty_wakeups",
            "Context switches of the container's processes on a terminal (tmux, screen aside).",
            labels=list(LABELS),
        )
        monitor_cpu = GaugeMetricFamily(
            "ghostgpu_agent_container_monitor_cpu_seconds",
            "CPU seconds of the container's monitors (watch, top, tail -f) and their children; only "
            "where a monitor runs.",
            labels=list(LABELS),
        )
        frontend_cpu = GaugeMetricFamily(
            "ghostgpu_agent_container_frontend_cpu_seconds",
            "CPU seconds of a notebook's front-end server (Jupyter's server, code-server, RStudio "
            "Server), its own, not its children's; only where one runs.",
            labels=list(LABELS),
        )
        r = self._last()
        if r is not None:
            for key in sorted(r.containers):
                facts = getattr(r.containers[key], "idle", None)
                if facts is None:
                    continue
                labels = list(key)
                newest_start = r.timestamp - facts.newest_start_age_s
                newest.add_metric([*labels, facts.session_class.value], newest_start)
                running.add_metric(labels, facts.running)
                tty.add_metric(labels, facts.tty_wakeups)
                if facts.monitor_cpu_s is not None:
                    monitor_cpu.add_metric(labels, facts.monitor_cpu_s)
                if facts.frontend_cpu_s is not None:
                    frontend_cpu.add_metric(labels, facts.frontend_cpu_s)
        yield from (newest, running, tty, monitor_cpu, frontend_cpu)
