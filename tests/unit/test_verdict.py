"""Every branch of `ghostgpu.verdict.decide`, one behaviour per test."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from ghostgpu.verdict import (
    ArtifactSizes,
    ArtifactsNotDeclared,
    ContainerRestart,
    Evidence,
    FailureReason,
    FaultEvidence,
    GpuMemory,
    ProcessInfo,
    Reason,
    Rule,
    Signal,
    SignalFailure,
    VerdictKind,
    VerdictPolicy,
    XidEvent,
    decide,
)

ZERO5 = (0.0,) * 5
LIVE = ProcessInfo(pid=1, state="S", command="python train.py")
ZOMBIE = ProcessInfo(pid=9, state="Z", command="[python] <defunct>")
GHOST = VerdictPolicy()
PAPER = VerdictPolicy(rule=Rule.PAPER_MULTI_SIGNAL)
WINDOW = VerdictPolicy(rule=Rule.WINDOW_UTIL)
SINGLE = VerdictPolicy(rule=Rule.SINGLE_UTIL)
ALL_RULES = [SINGLE, WINDOW, PAPER, GHOST]


def ev(**kw: object) -> Evidence:
    kw.setdefault("utilization", ZERO5)
    kw.setdefault("processes", ())
    kw.setdefault("memory", GpuMemory(used_bytes=0))
    return Evidence(**kw)  # type: ignore[arg-type]


def fail(reason: FailureReason = FailureReason.MISSING) -> SignalFailure:
    return SignalFailure(reason=reason)


# --- utilization -------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ALL_RULES, ids=lambda p: p.rule.value)
def test_fewer_samples_than_the_window_is_unknown(policy: VerdictPolicy) -> None:
    v = decide(ev(utilization=()), policy)
    assert v.kind is VerdictKind.UNKNOWN
    assert v.reasons == (Reason.INSUFFICIENT_SAMPLES,)
    assert not v.reclaimable


def test_four_of_five_samples_is_unknown_not_idle() -> None:
    assert decide(ev(utilization=(0.0,) * 4)).kind is VerdictKind.UNKNOWN


@pytest.mark.parametrize("reason", list(FailureReason))
@pytest.mark.parametrize("policy", ALL_RULES, ids=lambda p: p.rule.value)
def test_failed_sample_in_the_window_is_unknown(policy: VerdictPolicy, reason: FailureReason) -> None:
    v = decide(ev(utilization=(0.0, 0.0, 0.0, 0.0, fail(reason))), policy)
    assert v.kind is VerdictKind.UNKNOWN
    assert Reason.UTILIZATION_FAILED in v.reasons


def test_failure_older_than_the_window_does_not_matter() -> None:
    v = decide(ev(utilization=(fail(), *ZERO5)))
    assert v.kind is VerdictKind.FINISHED_IDLE


@pytest.mark.parametrize("policy", ALL_RULES, ids=lambda p: p.rule.value)
def test_nonzero_utilization_is_active(policy: VerdictPolicy) -> None:
    v = decide(ev(utilization=(0.0, 0.0, 0.0, 0.0, 3.0)), policy)
    assert v.kind is VerdictKind.ACTIVE
    assert v.reasons == (Reason.UTILIZATION_NONZERO,)


def test_nonzero_utilization_is_active_even_without_a_process_listing() -> None:
    # The controller lists processes only once the window is all zero: None must not be UNKNOWN here.
    v = decide(Evidence(utilization=(40.0,) * 5, processes=None))
    assert v.kind is VerdictKind.ACTIVE


def test_zero_threshold_counts_low_readings_as_zero() -> None:
    samples = (0.4, 0.0, 0.2, 0.0, 0.5)
    assert decide(ev(utilization=samples)).kind is VerdictKind.ACTIVE
    assert (
        decide(ev(utilization=samples), VerdictPolicy(zero_threshold=0.5)).kind is VerdictKind.FINISHED_IDLE
    )


def test_single_util_reads_only_the_newest_sample() -> None:
    e = ev(utilization=(80.0, 80.0, 80.0, 80.0, 0.0), processes=(LIVE,))
    assert decide(e, SINGLE).kind is VerdictKind.FINISHED_IDLE
    assert decide(e, WINDOW).kind is VerdictKind.ACTIVE


def test_utilization_only_rules_ignore_live_processes() -> None:
    # This is the published baselines' flaw the benchmark measures: a batch gap looks finished.
    e = ev(processes=(LIVE,), artifacts=ArtifactSizes(start_bytes=1, end_bytes=9))
    for policy in (SINGLE, WINDOW):
        v = decide(e, policy)
        assert v.kind is VerdictKind.FINISHED_IDLE
        assert v.reasons == (Reason.UTILIZATION_ZERO,)


def test_nan_utilization_is_rejected_at_the_boundary() -> None:
    with pytest.raises(ValidationError):
        Evidence(utilization=(float("nan"),))
    with pytest.raises(ValidationError):
        Evidence(utilization=(-1.0,))


# --- required signals --------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [PAPER, GHOST], ids=lambda p: p.rule.value)
def test_failed_process_listing_is_unknown(policy: VerdictPolicy) -> None:
    v = decide(ev(processes=fail(FailureReason.EXEC_ERROR)), policy)
    assert v.kind is VerdictKind.UNKNOWN
    assert Reason.PROCESSES_FAILED in v.reasons


@pytest.mark.parametrize("policy", [PAPER, GHOST], ids=lambda p: p.rule.value)
def test_missing_process_listing_is_unknown(policy: VerdictPolicy) -> None:
    v = decide(Evidence(utilization=ZERO5, processes=None), policy)
    assert v.kind is VerdictKind.UNKNOWN
    assert Reason.PROCESSES_NOT_COLLECTED in v.reasons


def test_process_listing_not_required_lets_the_rule_decide_without_it() -> None:
    policy = VerdictPolicy(required=frozenset({Signal.UTILIZATION, Signal.ARTIFACTS}))
    v = decide(ev(processes=fail()), policy)
    assert v.kind is VerdictKind.FINISHED_IDLE
    assert Reason.PROCESSES_NOT_CHECKED in v.reasons
    assert v.live_processes is None


@pytest.mark.parametrize("policy", [PAPER, GHOST], ids=lambda p: p.rule.value)
def test_failed_artifact_read_is_unknown(policy: VerdictPolicy) -> None:
    v = decide(ev(artifacts=fail(FailureReason.FORBIDDEN)), policy)
    assert v.kind is VerdictKind.UNKNOWN
    assert Reason.ARTIFACTS_FAILED in v.reasons


def test_all_failed_required_signals_are_listed() -> None:
    v = decide(ev(processes=fail(), artifacts=fail(), memory=fail()))
    assert v.reasons == (
        Reason.UTILIZATION_ZERO,
        Reason.PROCESSES_FAILED,
        Reason.ARTIFACTS_FAILED,
        Reason.MEMORY_FAILED,
    )


def test_artifacts_not_required_are_skipped_when_unreadable() -> None:
    policy = VerdictPolicy(required=frozenset({Signal.UTILIZATION, Signal.PROCESSES}))
    v = decide(ev(artifacts=fail()), policy)
    assert v.kind is VerdictKind.FINISHED_IDLE
    assert Reason.ARTIFACTS_NOT_CHECKED in v.reasons


def test_failed_fault_source_only_blurs_finished_versus_crashed() -> None:
    v = decide(ev(faults=fail(FailureReason.HTTP_ERROR)))
    assert v.kind is VerdictKind.FINISHED_IDLE
    assert Reason.FAULTS_FAILED in v.reasons


def test_failed_fault_source_is_unknown_when_required() -> None:
    policy = VerdictPolicy(required=frozenset(Signal))
    v = decide(ev(faults=fail(FailureReason.HTTP_ERROR)), policy)
    assert v.kind is VerdictKind.UNKNOWN
    assert Reason.FAULTS_FAILED in v.reasons


# --- artifacts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [PAPER, GHOST], ids=lambda p: p.rule.value)
@pytest.mark.parametrize("end", [2048, 512], ids=["grew", "shrank"])
def test_artifact_change_with_zero_utilization_is_active(policy: VerdictPolicy, end: int) -> None:
    v = decide(ev(artifacts=ArtifactSizes(start_bytes=1024, end_bytes=end)), policy)
    assert v.kind is VerdictKind.ACTIVE
    assert Reason.ARTIFACTS_CHANGED in v.reasons


def test_unchanged_artifacts_with_completion_marker_is_finished() -> None:
    v = decide(ev(artifacts=ArtifactSizes(start_bytes=7, end_bytes=7, completion_marker=True)))
    assert v.kind is VerdictKind.FINISHED_IDLE
    assert {Reason.ARTIFACTS_UNCHANGED, Reason.COMPLETION_MARKER} <= set(v.reasons)


def test_undeclared_artifacts_are_not_a_failure() -> None:
    v = decide(ev(artifacts=ArtifactsNotDeclared()))
    assert v.kind is VerdictKind.FINISHED_IDLE
    assert Reason.ARTIFACTS_NOT_DECLARED in v.reasons


# --- processes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["Z", "Z+", "Zs", "X", "z"])
def test_defunct_only_table_is_zombie_for_ghostgpu(state: str) -> None:
    table = (ProcessInfo(pid=9, state=state), ProcessInfo(pid=10, state="Z"))
    v = decide(ev(processes=table))
    assert v.kind is VerdictKind.ZOMBIE_CRASHED
    assert Reason.DEFUNCT_ONLY in v.reasons
    assert (v.live_processes, v.defunct_processes) == (0, 2)
    assert v.reclaimable


def test_defunct_only_table_keeps_the_paper_rule_from_reclaiming() -> None:
    v = decide(ev(processes=(ZOMBIE,)), PAPER)
    assert v.kind is VerdictKind.ACTIVE
    assert Reason.PROCESS_PRESENT in v.reasons


def test_empty_table_is_finished_for_the_paper_rule() -> None:
    v = decide(ev(processes=()), PAPER)
    assert v.kind is VerdictKind.FINISHED_IDLE
    assert Reason.NO_PROCESS in v.reasons


@pytest.mark.parametrize("state", ["R", "S", "Sl", "D", "I", "T"])
def test_live_process_in_a_short_zero_run_is_active(state: str) -> None:
    v = decide(ev(processes=(ZOMBIE, ProcessInfo(pid=1, state=state))))
    assert v.kind is VerdictKind.ACTIVE
    assert Reason.LIVE_PROCESS in v.reasons and Reason.IDLE_BELOW_HOLD in v.reasons
    assert (v.live_processes, v.defunct_processes) == (1, 1)


def test_live_process_over_the_long_window_is_idle_held() -> None:
    policy = VerdictPolicy(window=5, hold_after=8)
    v = decide(ev(utilization=(0.0,) * 8, processes=(LIVE,)), policy)
    assert v.kind is VerdictKind.IDLE_HELD
    assert Reason.IDLE_LONG_WINDOW in v.reasons
    assert not v.reclaimable


def test_default_long_window_is_three_windows() -> None:
    assert decide(ev(utilization=(0.0,) * 14, processes=(LIVE,))).kind is VerdictKind.ACTIVE
    assert decide(ev(utilization=(0.0,) * 15, processes=(LIVE,))).kind is VerdictKind.IDLE_HELD


@pytest.mark.parametrize("breaker", [fail(FailureReason.STALE), 12.0], ids=["failure", "nonzero"])
def test_long_window_run_is_broken_by_a_failure_or_a_reading(breaker: object) -> None:
    policy = VerdictPolicy(window=5, hold_after=8)
    samples = (0.0, 0.0, breaker, *ZERO5)
    assert decide(ev(utilization=samples, processes=(LIVE,)), policy).kind is VerdictKind.ACTIVE


def test_live_process_beats_crash_evidence() -> None:
    # An OOMKilled container that restarted and runs again is not a zombie.
    faults = FaultEvidence(restarts=(ContainerRestart(container="main", reason="OOMKilled", exit_code=137),))
    assert decide(ev(processes=(LIVE,), faults=faults)).kind is VerdictKind.ACTIVE


# --- faults ------------------------------------------------------------------------------------


def test_no_process_no_fault_is_finished() -> None:
    v = decide(ev())
    assert v.kind is VerdictKind.FINISHED_IDLE
    assert v.reasons == (
        Reason.UTILIZATION_ZERO,
        Reason.ARTIFACTS_NOT_DECLARED,
        Reason.NO_PROCESS,
        Reason.MEMORY_FREE,
        Reason.NO_FAULT,
    )


@pytest.mark.parametrize("code", [13, 31, 43, 48, 79])
def test_crash_xid_is_zombie(code: int) -> None:
    v = decide(ev(faults=FaultEvidence(xid_events=(XidEvent(code=code, gpu="GPU-0"),))))
    assert v.kind is VerdictKind.ZOMBIE_CRASHED
    assert Reason.FAULT_XID in v.reasons


def test_ignored_xid_is_not_fault_evidence() -> None:
    faults = FaultEvidence(xid_events=(XidEvent(code=63),))
    assert decide(ev(faults=faults)).kind is VerdictKind.FINISHED_IDLE
    assert (
        decide(ev(faults=faults), VerdictPolicy(ignored_xids=frozenset())).kind is VerdictKind.ZOMBIE_CRASHED
    )


@pytest.mark.parametrize(
    ("reason", "exit_code", "kind"),
    [
        ("OOMKilled", 137, VerdictKind.ZOMBIE_CRASHED),
        ("Error", 1, VerdictKind.ZOMBIE_CRASHED),
        ("Completed", 0, VerdictKind.FINISHED_IDLE),
        ("Completed", None, VerdictKind.FINISHED_IDLE),
        ("Completed", 2, VerdictKind.ZOMBIE_CRASHED),
    ],
)
def test_container_restart_reasons(reason: str, exit_code: int | None, kind: VerdictKind) -> None:
    faults = FaultEvidence(restarts=(ContainerRestart(container="main", reason=reason, exit_code=exit_code),))
    v = decide(ev(faults=faults))
    assert v.kind is kind
    assert (Reason.FAULT_RESTART in v.reasons) is (kind is VerdictKind.ZOMBIE_CRASHED)


def test_paper_rule_ignores_fault_evidence() -> None:
    faults = FaultEvidence(xid_events=(XidEvent(code=79),))
    v = decide(ev(faults=faults), PAPER)
    assert v.kind is VerdictKind.FINISHED_IDLE
    assert Reason.FAULT_XID not in v.reasons


# --- policy, verdict, determinism --------------------------------------------------------------


def test_policy_requires_utilization() -> None:
    with pytest.raises(ValidationError):
        VerdictPolicy(required=frozenset({Signal.PROCESSES}))


def test_policy_long_window_not_shorter_than_window() -> None:
    with pytest.raises(ValidationError):
        VerdictPolicy(window=5, hold_after=4)


def test_only_finished_and_zombie_are_reclaimable() -> None:
    outcomes = {
        VerdictKind.ACTIVE: ev(utilization=(9.0,) * 5),
        VerdictKind.FINISHED_IDLE: ev(),
        VerdictKind.ZOMBIE_CRASHED: ev(processes=(ZOMBIE,)),
        VerdictKind.IDLE_HELD: ev(utilization=(0.0,) * 15, processes=(LIVE,)),
        VerdictKind.UNKNOWN: ev(processes=fail()),
    }
    for kind, evidence in outcomes.items():
        v = decide(evidence)
        assert v.kind is kind
        assert v.reclaimable is (kind in {VerdictKind.FINISHED_IDLE, VerdictKind.ZOMBIE_CRASHED})


def test_default_policy_is_the_ghostgpu_rule() -> None:
    assert decide(ev()).rule is Rule.GHOSTGPU
    assert decide(ev(), GHOST) == decide(ev())


def test_same_evidence_same_verdict_also_after_a_json_round_trip() -> None:
    e = ev(
        utilization=(fail(FailureReason.STALE), 0.0, 0.0, 0.0, 0.0, 0.0),
        processes=(ZOMBIE, ProcessInfo(pid=3, state="Z")),
        artifacts=ArtifactSizes(start_bytes=5, end_bytes=5),
        faults=FaultEvidence(xid_events=(XidEvent(code=43),)),
    )
    first = decide(e)
    assert all(decide(e) == first for _ in range(20))
    again = Evidence.model_validate_json(e.model_dump_json())
    assert again == e
    assert decide(again) == first
    assert first.model_dump(mode="json")["reasons"] == [r.value for r in first.reasons]


def test_evidence_and_verdict_are_immutable() -> None:
    e = ev()
    with pytest.raises(ValidationError):
        e.utilization = (1.0,)  # type: ignore[misc]
    v = decide(e)
    with pytest.raises(ValidationError):
        v.kind = VerdictKind.ACTIVE  # type: ignore[misc]


def test_annotation_is_compact_stable_json() -> None:
    v = decide(ev(processes=(ZOMBIE,)))
    text = v.to_annotation()
    assert text == decide(ev(processes=(ZOMBIE,))).to_annotation()
    data = json.loads(text)
    assert data["kind"] == "ZOMBIE_CRASHED" and data["rule"] == "ghostgpu"
    assert "defunct-only" in data["reasons"]
    assert (data["live"], data["defunct"]) == (0, 1)
    assert " " not in text
