"""Idle sessions through the controller's poll (judge/idle.py, act/idle.py) against a scripted
cluster and a scripted Prometheus: warned, then stopped through the actuator path; a silent
computation never warned; activity cancels; a restart keeps the deadline; Prometheus gone during
a warning stops nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from test_controller_reconciler import NS, Harness, ps

from ghostgpu.controller.inventory import WorkloadRef
from ghostgpu.idle_sessions import IDLE_DEADLINE, IDLE_SINCE, KEEP_UNTIL, format_time
from ghostgpu.signals.prometheus import PrometheusError, VectorSample
from ghostgpu.verdict import FailureReason

KERNEL = ps(
    "1 0 Ss 90000 tini -- start-notebook.sh",
    "8 1 Sl 90000 jupyter-lab --port 8888",
    "40 8 Ssl 90000 python3 -m ipykernel_launcher -f k.json",
)
IDLE = {
    "after": "10m",
    "warnBefore": "5m",
    "maxSnooze": "20m",
    "afterBounds": {"min": "1m"},
}


class ScriptedPrometheus:
    """Answers the idle-session history query with `fields` for every pod it names."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.fields: dict[str, float] = {}
        self.failing = False
        self.windows: list[int] = []

    def idle(self, **over: float) -> None:
        self.fields = {
            "util_max": 0.0,
            "fb_min": 4 << 30,
            "fb_max": 4 << 30,
            "cpu": 0.5,
            "running": 0.0,
            "tty_changes": 0.0,
            "class_notebook": 1.0,
            **over,
        }

    async def query(self, promql: str, *, at: float | None = None) -> tuple[float, list[VectorSample]]:
        if self.failing:
            raise PrometheusError(FailureReason.TIMEOUT, "scripted")
        window = int(re.search(r"\[(\d+)s\]", promql).group(1))  # type: ignore[union-attr]
        self.windows.append(window)
        pods = re.search(r'pod=~"([^"]+)"', promql).group(1).split("|")  # type: ignore[union-attr]
        samples = window // 30
        out = []
        for pod in pods:
            values = {
                "util_count": samples,
                "cpu_count": samples,
                "agent_count": samples,
                "newest_start": self.h.clock - 30 * 86400,
                **self.fields,
            }
            for name, value in values.items():
                labels = {"namespace": NS, "pod": pod.replace("\\\\.", "."), "ghostgpu_field": name}
                out.append(VectorSample(labels, self.h.clock, float(value)))
        return self.h.clock, out


def harness(tmp: Path, **idle: Any) -> tuple[Harness, ScriptedPrometheus]:
    h = Harness(tmp, mode="enforce", idleSessions={"mode": "enforce", **IDLE, **idle})
    h.messages = []  # type: ignore[attr-defined]
    recorded = h.cluster.event

    async def event(involved: Any, *, reason: str, message: str, type_: str = "Normal") -> None:
        h.messages.append((reason, message))  # type: ignore[attr-defined]
        await recorded(involved, reason=reason, message=message, type_=type_)

    h.cluster.event = event  # type: ignore[method-assign]
    prom = ScriptedPrometheus(h)
    h.util.client = prom  # type: ignore[attr-defined]
    h.rec = h.reconciler()
    h.add("nb", table=KERNEL)
    return h, prom


def annotations(h: Harness) -> dict[str, str]:
    return h.objects[WorkloadRef("Deployment", NS, "nb")]["metadata"]["annotations"]


def reasons(h: Harness) -> list[str]:
    return [r for n, r in h.cluster.events if n == "nb" and r.startswith("IdleSession")]


async def until_warned(h: Harness) -> float:
    for _ in range(12):
        await h.polls(1)
        if IDLE_DEADLINE in annotations(h):
            return h.clock - 60  # the poll that warned
    raise AssertionError(f"never warned: {h.cluster.events}")


async def test_an_idle_kernel_is_warned_then_stopped_through_its_owner(tmp_path: Path) -> None:
    h, prom = harness(tmp_path)
    prom.idle()
    warned = await until_warned(h)
    ann = annotations(h)
    assert ann[IDLE_DEADLINE] == format_time(warned + 300)
    assert reasons(h) == ["IdleSessionWarning"]
    message = next(m for r, m in h.messages if r == "IdleSessionWarning")  # type: ignore[attr-defined]
    assert "notebook" in message and KEEP_UNTIL in message and "2 GPU(s)" in message
    gauge = h.metrics.idle_sessions.labels(NS, "deployment/nb", "notebook", "research", "warned")
    assert gauge._value.get() == warned + 300
    await h.polls(4)
    assert h.cluster.scaled == []  # before the deadline
    await h.polls(2)
    assert [(r.name, n) for r, n in h.cluster.scaled] == [("nb", 0)]
    assert 900 in prom.windows  # the evidence was read again over after + warnBefore
    assert ann["ghostgpu.io/reclaimed-from-replicas"] == "1"  # `ghostgpu restore` puts it back
    assert IDLE_DEADLINE not in ann  # the warning is spent: a restored session starts anew
    assert reasons(h)[-1] == "IdleSessionStopped"
    logged = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    actions = [row.get("action") for row in logged if row.get("workload", "").endswith("/nb")]
    assert "idle-warn" in actions and "idle-warned" in actions and "idle-stop" in actions


async def test_a_silent_cpu_computation_is_never_warned(tmp_path: Path) -> None:
    h, prom = harness(tmp_path)
    prom.idle(cpu=0.9 * 600)  # most of a core, printing nothing
    await h.polls(20)
    assert IDLE_DEADLINE not in annotations(h) and reasons(h) == [] and h.cluster.scaled == []


async def test_activity_during_the_warning_cancels_it(tmp_path: Path) -> None:
    h, prom = harness(tmp_path)
    prom.idle()
    await until_warned(h)
    prom.idle(tty_changes=3.0)  # someone typed into the kernel's terminal
    await h.polls(1)
    assert IDLE_DEADLINE not in annotations(h) and IDLE_SINCE not in annotations(h)
    assert reasons(h) == ["IdleSessionWarning", "IdleSessionActive"]
    await h.polls(10)
    assert h.cluster.scaled == []


async def test_prometheus_gone_during_a_warning_stops_nothing(tmp_path: Path) -> None:
    h, prom = harness(tmp_path)
    prom.idle()
    await until_warned(h)
    prom.failing = True
    await h.polls(15)
    assert h.cluster.scaled == []
    assert IDLE_DEADLINE in annotations(h)  # held: neither stopped nor cleared


async def test_a_restarted_controller_keeps_the_deadline(tmp_path: Path) -> None:
    h, prom = harness(tmp_path)
    prom.idle()
    warned = await until_warned(h)
    deadline = annotations(h)[IDLE_DEADLINE]
    h.rec = h.reconciler()  # a new process: nothing in memory
    await h.polls(2)
    assert annotations(h)[IDLE_DEADLINE] == deadline
    # The new controller judges again from its own window first (longWindow polls), then stops at
    # the recorded deadline at the earliest, never later than the first poll it can.
    await h.polls(8)
    assert [(r.name, n) for r, n in h.cluster.scaled] == [("nb", 0)]
    assert h.clock - 60 >= warned + 300


async def test_a_snooze_beyond_max_snooze_is_cut_and_recorded(tmp_path: Path) -> None:
    h, prom = harness(tmp_path)
    prom.idle()
    warned = await until_warned(h)
    obj = h.objects[WorkloadRef("Deployment", NS, "nb")]
    obj["metadata"]["annotations"][KEEP_UNTIL] = format_time(warned + 86400)
    obj["metadata"]["managedFields"] = [
        {
            "manager": "kubectl-annotate",
            "operation": "Update",
            "time": format_time(warned),
            "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{KEEP_UNTIL}": {}}}},
        }
    ]
    await h.polls(1)
    ann = annotations(h)
    assert ann[IDLE_DEADLINE] == format_time(warned + 1200)  # cut to maxSnooze (20m) from when set
    assert "kubectl-annotate" in ann["ghostgpu.io/keep-until-honoured"]
    assert "cut to maxSnooze" in ann["ghostgpu.io/keep-until-honoured"]
    await h.polls(10)
    assert h.cluster.scaled == []  # still before the snoozed deadline
    await h.polls(12)
    assert [(r.name, n) for r, n in h.cluster.scaled] == [("nb", 0)]


async def test_shadow_mode_warns_nobody(tmp_path: Path) -> None:
    h, prom = harness(tmp_path, mode="shadow")
    prom.idle()
    await h.polls(20)
    assert IDLE_DEADLINE not in annotations(h) and reasons(h) == [] and h.cluster.scaled == []
    states = {s.labels["state"] for s in h.metrics.idle_sessions.collect()[0].samples}
    assert states == {"would-stop"}


async def test_sessions_read_again_at_their_deadline_share_one_query(tmp_path: Path) -> None:
    """A session past `after + warnBefore` is read again over that span; however many wait there,
    a poll sends one such query naming all their pods, beside the ladder's one."""
    h, prom = harness(tmp_path, mode="shadow")
    for name in ("nb2", "nb3"):
        h.add(name, table=KERNEL)
    prom.idle()
    named: list[tuple[int, int]] = []
    answer = prom.query

    async def query(promql: str, *, at: float | None = None) -> Any:
        pods = re.search(r'pod=~"([^"]+)"', promql).group(1).split("|")  # type: ignore[union-attr]
        named.append((int(re.search(r"\[(\d+)s\]", promql).group(1)), len(pods)))  # type: ignore[union-attr]
        return await answer(promql, at=at)

    prom.query = query  # type: ignore[method-assign]
    await h.polls(20)
    states = [s.labels["state"] for s in h.metrics.idle_sessions.collect()[0].samples]
    assert states == ["would-stop"] * 3
    named.clear()
    await h.polls(1)
    # The ladder's window (after, 10m) and the re-read (after + warnBefore, 15m): 3 pods each.
    assert sorted(named) == [(600, 3), (900, 3)]


async def test_a_namespace_annotation_moves_after_within_bounds(tmp_path: Path) -> None:
    h, prom = harness(tmp_path)
    prom.idle()
    h.namespaces[NS]["ghostgpu.io/idle-after"] = "1000h"  # beyond afterBounds.max (168h): cut to it
    warned = await until_warned(h)
    assert prom.windows[0] == 168 * 3600  # the history is read over the namespace's `after`
    assert annotations(h)[IDLE_SINCE] == format_time(warned - 168 * 3600)
    message = next(m for r, m in h.messages if r == "IdleSessionWarning")  # type: ignore[attr-defined]
    assert "ghostgpu.io/idle-after=1000h clamped" in message


def test_the_namespace_watch_keeps_labels_and_the_idle_after_annotation() -> None:
    from ghostgpu.controller.keys import namespace_view

    ns = {
        "metadata": {
            "name": NS,
            "labels": {"ghostgpu.io/team": "research"},
            "annotations": {"ghostgpu.io/idle-after": "6h", "other": "x" * 1000},
        }
    }
    assert namespace_view(ns) == {"ghostgpu.io/team": "research", "ghostgpu.io/idle-after": "6h"}
    assert namespace_view({"metadata": {}}) == {}


async def test_a_stop_the_gate_refuses_is_escalated_once(tmp_path: Path) -> None:
    h, prom = harness(tmp_path)
    h.cfg = h.cfg.model_copy(
        update={"autonomy": h.cfg.autonomy.model_copy(update={"tau_by_type": {"idle_held": 0.0}})}
    )
    h.rec = h.reconciler()
    prom.idle()
    await until_warned(h)
    await h.polls(10)
    assert h.cluster.scaled == []
    assert h.escalations == ["nb"]  # once, though the deadline stays passed poll after poll
    assert [r for n, r in h.cluster.events if r == "ReclaimEscalated"] == ["ReclaimEscalated"]


async def test_turning_the_policy_off_withdraws_the_warnings(tmp_path: Path) -> None:
    h, prom = harness(tmp_path)
    prom.idle()
    await until_warned(h)
    off = h.cfg.idle_sessions.model_copy(update={"mode": "off"})
    h.rec.judge.cfg = h.rec.actor.idle.cfg = h.cfg.model_copy(update={"idle_sessions": off})  # type: ignore[union-attr]
    await h.polls(1)
    assert IDLE_DEADLINE not in annotations(h)
    assert reasons(h)[-1] == "IdleSessionActive"
    await h.polls(10)
    assert h.cluster.scaled == []
