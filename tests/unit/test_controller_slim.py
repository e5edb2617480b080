"""The scale optimisations (docs/scale.md) change cost, never results: slim cache entries
keep every field the controller reads, and the fast Evidence path builds exactly what validation
builds (anything not already valid still goes through validation and fails as before)."""

from __future__ import annotations

import copy
import json
import math

import pytest
from pydantic import ValidationError

from ghostgpu.config import ControllerConfig
from ghostgpu.controller.books.decisions import Decision
from ghostgpu.controller.inventory import WorkloadRef, cached_pod, gpu_predicate, pod_view, workload_from
from ghostgpu.controller.judge.planner import manifest_lines
from ghostgpu.controller.observe.evidence import WorkloadState, assemble
from ghostgpu.controller.packing import pack
from ghostgpu.signals.faults import fault_observation, workload_faults
from ghostgpu.verdict import (
    ContainerRestart,
    Evidence,
    FailureReason,
    FaultEvidence,
    ProcessInfo,
    SignalFailure,
    XidEvent,
)

IS_GPU = gpu_predicate(["nvidia.com/gpu"])


def _pod() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "7",
            "labels": {"ghostgpu.io/tracked": "true"},
            "annotations": {"ghostgpu.io/verdict": "ACTIVE", "other": "x"},
            "ownerReferences": [{"kind": "Job", "name": "j", "controller": True}],
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:metadata": {}}}],
        },
        "spec": {
            "nodeName": "n",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "busybox",
                    "imageID": "sha256:abc",
                    "containerID": "containerd://x",
                    "restartCount": 2,
                    "state": {"running": {}},
                    "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                }
            ],
        },
    }


def test_workload_raw_is_slim_but_keeps_what_is_read() -> None:
    obj = _pod()
    wl = workload_from("Pod", obj, IS_GPU)
    assert "status" not in wl.raw and "managedFields" not in wl.raw["metadata"]
    assert (wl.raw["apiVersion"], wl.raw["kind"]) == ("v1", "Pod")
    meta = wl.raw["metadata"]
    assert (meta["name"], meta["namespace"], meta["uid"], meta["resourceVersion"]) == ("p", "ns", "u1", "7")
    assert meta["ownerReferences"] == obj["metadata"]["ownerReferences"]
    assert meta["annotations"] == wl.annotations == obj["metadata"]["annotations"]
    assert wl.raw["spec"] == obj["spec"]
    # the risk score's manifest size is unchanged (it dropped status and managedFields itself)
    full = workload_from("Pod", obj, IS_GPU)
    object.__setattr__(full, "raw_packed", pack(obj))
    assert manifest_lines(wl) == manifest_lines(full)
    assert "managedFields" in obj["metadata"] and "status" in obj  # the input is not mutated
    # kept packed, a fraction of its JSON; every read is a fresh copy (a caller cannot corrupt the cache)
    assert isinstance(wl.raw_packed, bytes) and len(wl.raw_packed) < len(json.dumps(obj)) / 3
    wl.raw["metadata"]["name"] = "changed"
    assert wl.raw["metadata"]["name"] == "p"


def test_one_pod_cache_entry_carries_the_bare_tracked_workload() -> None:
    obj = _pod()
    tracked = {**obj, "metadata": {**obj["metadata"], "labels": {"ghostgpu.io/tracked": "true"}}}
    owned = copy.deepcopy(tracked)
    bare = {**tracked, "metadata": {**tracked["metadata"], "ownerReferences": []}}
    assert cached_pod(obj, IS_GPU).workload is None  # not labelled tracked
    assert cached_pod(owned, IS_GPU).workload is None  # a controller's pod: its owner is the workload
    entry = cached_pod(bare, IS_GPU)
    assert entry.view == pod_view(bare, IS_GPU)
    assert entry.workload is not None and entry.workload.ref == WorkloadRef("Pod", "ns", "p")
    assert entry.workload.labels is entry.view.labels  # one copy of the labels


def test_pod_view_keeps_fault_evidence_computed_once() -> None:
    obj = _pod()
    view = pod_view(obj, IS_GPU)
    assert workload_faults([view.faults], []) == fault_observation([obj["status"]], [])
    assert workload_faults([view.faults], []) == FaultEvidence(
        restarts=(ContainerRestart(container="main", reason="OOMKilled", exit_code=137),)
    )
    # a malformed status is still a parse failure, not "no faults", and it wins over other pods
    bad = {**obj, "status": {"containerStatuses": [{"restartCount": 1}]}}
    assert isinstance(pod_view(bad, IS_GPU).faults, SignalFailure)
    bad2 = {**obj, "status": {"containerStatuses": ["garbage"]}}
    assert isinstance(workload_faults([view.faults, pod_view(bad2, IS_GPU).faults], []), SignalFailure)


def test_no_faults_is_the_same_value() -> None:
    assert fault_observation([{}], []) == FaultEvidence()
    assert fault_observation([{}], [XidEvent(code=79)]) == FaultEvidence(xid_events=(XidEvent(code=79),))


def _state(samples: list[object]) -> WorkloadState:
    st = WorkloadState.new("u", ControllerConfig.model_validate({"window": 3}))
    for s in samples:
        st.ring.push(s)  # type: ignore[arg-type]
    return st


@pytest.mark.parametrize(
    "samples,processes",
    [
        ([0.0, 12.5, 0.0], None),
        ([0.0, SignalFailure(reason=FailureReason.MISSING), 0.0], (ProcessInfo(pid=1, state="S"),)),
        ([0.0, 0.0, 0.0], SignalFailure(reason=FailureReason.EXEC_ERROR)),
        ([1, 0.0, 3], ()),  # ints: the validating path coerces them, as before
    ],
)
def test_fast_evidence_equals_validated(samples: list[object], processes: object) -> None:
    st = _state(samples)
    faults = fault_observation([{}], [])
    fast = assemble(st, window=3, processes=processes, faults=faults)  # type: ignore[arg-type]
    slow = Evidence(utilization=st.ring.samples, processes=processes, artifacts=fast.artifacts, faults=faults)
    assert fast == slow
    assert json.dumps(fast.model_dump(mode="json")) == json.dumps(slow.model_dump(mode="json"))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_invalid_sample_still_rejected(bad: float) -> None:
    with pytest.raises(ValidationError):
        assemble(_state([0.0, bad]), window=3, processes=None, faults=FaultEvidence())


def test_decision_line_matches_model_dump() -> None:
    d = Decision(ts=1.5, poll=2, workload="Pod/a/b", verdict="ACTIVE", reasons=["x"], gpus=1, interval_s=1)
    dumped = d.model_dump()
    dumped["intervalS"] = dumped.pop("interval_s")
    assert d.line() == json.dumps(dumped, sort_keys=True, separators=(",", ":"))
    assert Decision.parse(d.line()) == d
