"""Fault signal: restarts and termination reasons from pod status, combined with XID events."""

from __future__ import annotations

from ghostgpu.signals.faults import fault_observation, restarts_from_pod_status
from ghostgpu.verdict import ContainerRestart, FailureReason, FaultEvidence, SignalFailure, XidEvent


def cs(name: str, restarts: int = 0, state: dict | None = None, last: dict | None = None) -> dict:
    return {
        "name": name,
        "restartCount": restarts,
        "state": state or {"running": {}},
        "lastState": last or {},
    }


def test_healthy_pod_has_no_faults() -> None:
    status = {"phase": "Running", "containerStatuses": [cs("main"), cs("sidecar")]}
    assert restarts_from_pod_status(status) == ()


def test_oom_restart_and_crashloop_are_reported() -> None:
    status = {
        "containerStatuses": [
            cs(
                "main",
                3,
                state={"waiting": {"reason": "CrashLoopBackOff"}},
                last={"terminated": {"reason": "OOMKilled", "exitCode": 137}},
            ),
            cs("logger", 0, state={"waiting": {"reason": "CrashLoopBackOff"}}),
        ]
    }
    got = restarts_from_pod_status(status)
    assert ContainerRestart(container="main", reason="OOMKilled", exit_code=137) in got
    assert ContainerRestart(container="logger", reason="CrashLoopBackOff") in got
    assert all(r.crashed for r in got)


def test_clean_completion_is_not_a_crash_and_init_completion_is_ignored() -> None:
    status = {
        "initContainerStatuses": [
            cs("fetch", 0, state={"terminated": {"reason": "Completed", "exitCode": 0}})
        ],
        "containerStatuses": [cs("main", 0, state={"terminated": {"reason": "Completed", "exitCode": 0}})],
    }
    got = restarts_from_pod_status(status)
    assert got == (ContainerRestart(container="main", reason="Completed", exit_code=0),)
    assert not got[0].crashed


def test_terminated_without_reason_uses_exit_code() -> None:
    status = {"containerStatuses": [cs("main", 0, state={"terminated": {"exitCode": 1}})]}
    (r,) = restarts_from_pod_status(status)
    assert r.reason == "Error" and r.crashed


def test_last_state_without_restart_count_is_ignored() -> None:
    status = {"containerStatuses": [cs("main", 0, last={"terminated": {"reason": "Error", "exitCode": 1}})]}
    assert restarts_from_pod_status(status) == ()


def test_observation_combines_pods_and_xids() -> None:
    xid = XidEvent(code=79, gpu="0")
    obs = fault_observation(
        [
            {"containerStatuses": [cs("main")]},
            {"containerStatuses": [cs("main", 1, last={"terminated": {"reason": "Error", "exitCode": 2}})]},
        ],
        [xid],
    )
    assert isinstance(obs, FaultEvidence)
    assert obs.xid_events == (xid,) and len(obs.restarts) == 1


def test_malformed_status_is_a_parse_failure() -> None:
    obs = fault_observation([{"containerStatuses": [{"restartCount": 1}]}], [])
    assert isinstance(obs, SignalFailure) and obs.reason is FailureReason.PARSE_ERROR
    obs = fault_observation([{"containerStatuses": [cs("main", "x")]}], [])  # type: ignore[arg-type]
    assert isinstance(obs, SignalFailure)
