"""The agent-side faults of the fault suite (ghostgpu.scale.agent_faults): what each fault makes the
agents' targets print (the agent's own collector) is read by the controller's own parser
(ghostgpu.signals.agent.AgentAnswer), aggregated across targets as the poll's query aggregates
them, and fails the signal the way docs/faults.md says, or, for the faults a window absorbs, not."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ghostgpu.agent.scan import ContainerKey
from ghostgpu.scale.agent_faults import AGENT_FAULTS, AgentFleet, Container
from ghostgpu.signals.agent import (
    PROCESSES_METRIC,
    ROLE_FIELD,
    SCAN_FIELD,
    SCAN_METRIC,
    UNSEEN_FIELD,
    UNSEEN_METRIC,
    AgentAnswer,
)
from ghostgpu.signals.podexec import PodRef
from ghostgpu.verdict import FailureReason, ProcessCounts, SignalFailure

KEY = ContainerKey("ns", "p1", "uid-1", "main")
COUNTS = ProcessCounts(work=1, wrapper=1, programs=("python",))
FIELDS = {PROCESSES_METRIC: ROLE_FIELD, UNSEEN_METRIC: UNSEEN_FIELD}


def answer(fleet: AgentFleet, now: float) -> AgentAnswer:
    """Both targets of slot 0 as one poll's answer: max per role/program, min scan time (the query's
    aggregation across the targets that report a container); a failed scrape adds nothing."""
    ans = AgentAnswer(eval_time=now, uids={("ns", "p1"): "uid-1"})
    scans: dict[tuple[str, ...], float] = {}
    roles: dict[tuple[str, ...], tuple[dict[str, str], float]] = {}
    for target in "ab":
        body = fleet.render(0, target)
        if body is None:
            continue
        for fam in text_string_to_metric_families(body.decode()):
            for s in fam.samples:
                key = tuple(sorted(s.labels.items()))
                if s.name == SCAN_METRIC:
                    scans[key] = min(scans.get(key, s.value), s.value)
                elif s.name in FIELDS:
                    old = roles.get((s.name, *map(str, key)))
                    if old is None or s.value > old[1]:
                        roles[(s.name, *map(str, key))] = (dict(s.labels), s.value)
    for (name, *_), (labels, value) in roles.items():
        ans.add(FIELDS[name], labels, value)
    for key, value in scans.items():
        ans.add(SCAN_FIELD, dict(key), value)
    return ans


def armed(fault: str) -> AgentFleet:
    fleet = AgentFleet(1)
    fleet.place({"p1": Container(KEY, COUNTS)})
    slot = fleet.slots[0]
    slot.fault, slot.polls_left = fault, 1
    slot.rollout_both = fault == "agent-rollout"
    return fleet


POD = PodRef("ns", "p1", "main")


def test_a_healthy_agent_gives_the_containers_counts() -> None:
    fleet = armed("agent-rollout")
    fleet.slots[0].fault = None
    fleet.slots[0].rollout_both = False
    now = time.time()
    got = answer(fleet, now).counts(POD, max_age=30)
    assert isinstance(got, ProcessCounts) and (got.work, got.wrapper, got.programs) == (1, 1, ("python",))


@pytest.mark.parametrize(
    ("fault", "skew", "reason"),
    [
        ("agent-stale-scan", 0.0, FailureReason.STALE),
        ("agent-twin-uid", 0.0, FailureReason.OTHER),  # two pod UIDs for one container
        ("agent-container-restarted", 0.0, FailureReason.NOT_RUNNING),
        ("agent-restart", 0.0, FailureReason.MISSING),  # no earlier sample in this answer
        ("agent-scrape-gap", 0.0, FailureReason.MISSING),
        ("agent-node-clock-skew", 400.0, FailureReason.UNTRUSTED),  # ahead of the controller
        ("agent-node-clock-skew", -900.0, FailureReason.STALE),
    ],
)
def test_each_failing_fault_fails_the_signal_with_its_reason(fault: str, skew: float, reason: str) -> None:
    fleet = armed(fault)
    fleet.slots[0].skew = skew
    got = answer(fleet, time.time()).counts(POD, max_age=30)
    assert isinstance(got, SignalFailure) and got.reason == reason, got


@pytest.mark.parametrize(("fault", "skew"), [("agent-rollout", 0.0), ("agent-node-clock-skew", -10.0)])
def test_a_rollout_and_a_small_skew_leave_the_counts_as_they_are(fault: str, skew: float) -> None:
    """Two agents reporting one container (a rollout) are one container's counts; a node clock a
    little behind gives an older, still fresh scan."""
    fleet = armed(fault)
    fleet.slots[0].skew = skew
    got = answer(fleet, time.time()).counts(POD, max_age=30)
    assert isinstance(got, ProcessCounts) and got.work == 1, got


def test_arming_keeps_one_kind_per_workload_and_rests_a_poll_after_each_fault() -> None:
    fleet = AgentFleet(6, seed=3)
    pods = {f"p{i}": Container(ContainerKey("ns", f"p{i}", f"u{i}", "main"), COUNTS) for i in range(6)}
    fleet.place(pods)
    groups = {f"p{i}": ("a" if i < 3 else "b") for i in range(6)}
    begun: set[str] = set()
    for _ in range(60):
        faults, started = fleet.arm(set(pods), 1.0, groups)
        for workload in "ab":
            kinds = {k for p, k in faults.items() if groups[p] == workload}
            assert len(kinds) <= 1, kinds
        for slot in fleet.slots:
            if slot.lingering is not None:
                assert slot.fault is None
        begun |= set(started.values())
    assert begun == set(AGENT_FAULTS)
