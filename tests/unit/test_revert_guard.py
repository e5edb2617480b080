"""The revert guard (revert_guard.py) and the reconciler's two hooks (GitOps pre-flight before a
stop, revert sweep every poll), on the reconciler's scripted cluster: who undid a reclaim (from
managedFields), recorded once, never reclaimed again until the spec changes, and what is not a
revert (restore's own scale, a stop that never landed)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from test_controller_reconciler import FINISHED, NS, Harness

from ghostgpu.controller.act.gitops import GitOpsPreflight
from ghostgpu.controller.act.gitops_rules import ARGOCD_TRACKING_ID, RESPECT_IGNORE, ResourceId
from ghostgpu.controller.act.revert_guard import (
    MARK,
    Mark,
    detect_revert,
    field_writer,
    mark_holds,
    spec_hash,
)
from ghostgpu.controller.act.stopspec import SCALE_TO_ZERO, StopSpec
from ghostgpu.controller.inventory import WorkloadRef

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def entry(manager: str, t: datetime, fields: dict[str, Any], **extra: str) -> dict[str, Any]:
    return {"manager": manager, "operation": "Update", "time": stamp(t), "fieldsV1": fields, **extra}


REPLICAS_FIELDS = {"f:spec": {"f:replicas": {}}}


def obj(replicas: int, managed: list[dict[str, Any]], image: str = "trainer:1") -> dict[str, Any]:
    return {
        "metadata": {"name": "w", "namespace": NS, "uid": "u1", "managedFields": managed},
        "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"image": image}]}}},
    }


# --- pure parts -----------------------------------------------------------------------------------


def test_field_writer_is_the_newest_owner_of_a_written_field() -> None:
    managed = [
        entry("argocd-controller", T0, {"f:spec": {"f:template": {}}}, operation="Apply"),
        entry("ghostgpu-controller", T0 + timedelta(seconds=5), REPLICAS_FIELDS, subresource="scale"),
        entry("kubectl", T0 + timedelta(seconds=9), REPLICAS_FIELDS),
        entry("zz-newest-but-unrelated", T0 + timedelta(seconds=20), {"f:metadata": {"f:labels": {}}}),
    ]
    w = field_writer(obj(1, managed), ["/spec/replicas"])
    assert w is not None and (w.manager, w.time) == ("kubectl", T0 + timedelta(seconds=9))
    ann = {"f:metadata": {"f:annotations": {"f:kubeflow-resource-stopped": {}}}}
    w2 = field_writer(
        obj(1, [entry("notebook-controller", T0, ann)]), ["/metadata/annotations/kubeflow-resource-stopped"]
    )
    assert w2 is not None and w2.manager == "notebook-controller"
    assert field_writer(obj(1, []), ["/spec/replicas"]) is None


@given(st.integers(0, 50), st.integers(0, 50))
def test_spec_hash_ignores_the_written_fields_only(a: int, b: int) -> None:
    assert spec_hash(obj(a, []), ["/spec/replicas"]) == spec_hash(obj(b, []), ["/spec/replicas"])
    assert spec_hash(obj(a, []), ["/spec/replicas"]) != spec_hash(
        obj(a, [], image="trainer:2"), ["/spec/replicas"]
    )
    if a != b:
        assert spec_hash(obj(a, []), ["/spec/suspend"]) != spec_hash(obj(b, []), ["/spec/suspend"])


def test_mark_holds_until_the_spec_changes_and_an_unreadable_mark_holds() -> None:
    o = obj(1, [])
    o["metadata"]["annotations"] = {MARK: Mark("kubectl", "", spec_hash(o, ["/spec/replicas"]), "2").value()}
    assert mark_holds(o, ["/spec/replicas"]) is not None
    scaled = copy.deepcopy(o)
    scaled["spec"]["replicas"] = 7
    assert mark_holds(scaled, ["/spec/replicas"]) is not None
    changed = copy.deepcopy(o)
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "trainer:2"
    assert mark_holds(changed, ["/spec/replicas"]) is None
    o["metadata"]["annotations"][MARK] = "{not json"
    assert mark_holds(o, ["/spec/replicas"]) is not None


def test_detect_revert_cases() -> None:
    later = [entry("argocd-controller", T0 + timedelta(seconds=30), REPLICAS_FIELDS, operation="Apply")]
    earlier = [entry("kubectl-client-side-apply", T0 - timedelta(hours=1), REPLICAS_FIELDS)]
    restore = [entry("ghostgpu-restore", T0 + timedelta(seconds=30), REPLICAS_FIELDS, subresource="scale")]
    kw: dict[str, Any] = {"record": "2", "recorded_at": T0}
    r = detect_revert(obj(2, later), SCALE_TO_ZERO, seen_stopped=False, **kw)
    assert r is not None and r.writer == "argocd-controller"
    assert detect_revert(obj(0, later), SCALE_TO_ZERO, seen_stopped=True, **kw) is None  # still stopped
    # The stop never landed (leader died after the record): reclaim again, not a revert ...
    assert detect_revert(obj(2, earlier), SCALE_TO_ZERO, seen_stopped=False, **kw) is None
    # ... unless this process saw it stopped.
    seen = detect_revert(obj(2, earlier), SCALE_TO_ZERO, seen_stopped=True, **kw)
    assert seen is not None and seen.writer == "kubectl-client-side-apply"
    assert detect_revert(obj(2, restore), SCALE_TO_ZERO, seen_stopped=True, **kw) is None
    unknown = detect_revert(obj(2, []), SCALE_TO_ZERO, seen_stopped=True, **kw)
    assert unknown is not None and unknown.writer == "unknown"
    # Any stop, as data: an annotation-based one.
    ann_stop = StopSpec(
        ("/metadata/annotations/stopped",),
        lambda o: "stopped" in ((o.get("metadata") or {}).get("annotations") or {}),
    )
    a = obj(1, [entry("nb-controller", T0 + timedelta(seconds=3), {"f:metadata": {"f:annotations": {}}})])
    assert detect_revert(a, ann_stop, seen_stopped=True, **kw) is not None


# --- the reconciler's hooks -------------------------------------------------------------------------

REF = WorkloadRef("Deployment", NS, "done")


class Reader:
    def __init__(self, app: dict[str, Any] | None) -> None:
        self.app = app

    async def get(self, rid: ResourceId, namespace: str, name: str) -> dict[str, Any] | None:
        return self.app if (namespace, name) == ("argocd", "gpu") else None

    async def find(self, rid: ResourceId, name: str) -> list[dict[str, Any]]:
        return []


def tracked_harness(tmp: Path, app: dict[str, Any] | None) -> tuple[Harness, Reader]:
    h = Harness(tmp, mode="enforce", startupGrace="1s")
    h.add("done", table=FINISHED, ann={ARGOCD_TRACKING_ID: f"gpu:apps/Deployment:{NS}/done"})
    reader = Reader(app)
    h.rec.actor.stops.gitops = GitOpsPreflight(reader, cache_seconds=0)  # type: ignore[arg-type]
    return h, reader


def events(h: Harness, reason: str) -> int:
    return sum(1 for _, r in h.cluster.events if r == reason)


SELF_HEAL_APP = {
    "metadata": {"name": "gpu", "namespace": "argocd"},
    "spec": {"syncPolicy": {"automated": {"selfHeal": True}}},
}
FIXED_APP = {
    "metadata": {"name": "gpu", "namespace": "argocd"},
    "spec": {
        "syncPolicy": {"automated": {"selfHeal": True}, "syncOptions": [RESPECT_IGNORE]},
        "ignoreDifferences": [{"group": "apps", "kind": "Deployment", "jsonPointers": ["/spec/replicas"]}],
    },
}


async def test_self_heal_blocks_the_stop_with_one_escalation_then_the_fix_lets_it_through(
    tmp_path: Path,
) -> None:
    h, reader = tracked_harness(tmp_path, SELF_HEAL_APP)
    await h.polls(8)
    assert h.cluster.scaled == [] and h.replicas("done") == 1
    assert "ghostgpu.io/reclaimed-from-replicas" not in h.objects[REF]["metadata"]["annotations"]
    assert events(h, "ReclaimEscalated") == 1
    assert h.metrics.escalations.labels(NS, "gitops-preflight")._value.get() == 1
    reader.app = FIXED_APP
    await h.polls(1)
    assert h.cluster.scaled == [(REF, 0)]


async def test_an_unreadable_application_blocks_once(tmp_path: Path) -> None:
    h, reader = tracked_harness(tmp_path, None)

    async def forbidden(*_: Any) -> None:
        raise PermissionError("403 Forbidden: applications.argoproj.io is forbidden")

    reader.get = forbidden  # type: ignore[method-assign]
    result = await h.polls(8)
    assert h.cluster.scaled == [] and events(h, "ReclaimEscalated") == 1
    assert dict(result.actions)[REF] == "gitops-unknown"


async def test_a_marker_whose_application_is_not_here_escalates_once_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """The tracking id names an Application this cluster does not have (a hub Argo CD's): held, one
    ReclaimEscalated with the ways out, no record and no scale over every blocked poll."""
    h = Harness(tmp_path, mode="enforce", startupGrace="1s")  # gitops.orphanMarkers: the default
    h.add("done", table=FINISHED, ann={ARGOCD_TRACKING_ID: f"gpu:apps/Deployment:{NS}/done"})
    h.rec.actor.stops.gitops = GitOpsPreflight(  # type: ignore[arg-type]
        Reader(None), cache_seconds=0, orphan_markers=h.cfg.gitops.orphan_markers
    )
    messages: list[str] = []
    event = h.cluster.event

    async def recording(involved: Any, *, reason: str, message: str, type_: str = "Normal") -> None:
        if reason == "ReclaimEscalated":
            messages.append(message)
        await event(involved, reason=reason, message=message, type_=type_)

    h.cluster.event = recording  # type: ignore[method-assign]
    result = await h.polls(8)
    assert dict(result.actions)[REF] == "gitops-unseen"
    assert h.cluster.scaled == [] and h.replicas("done") == 1
    stop_writes = [
        a for r, a, _ in h.cluster.patches if r == REF and "ghostgpu.io/reclaimed-from-replicas" in a
    ]
    assert stop_writes == []
    assert events(h, "ReclaimEscalated") == 1 and len(messages) == 1
    assert h.metrics.escalations.labels(NS, "gitops-preflight")._value.get() == 1
    (message,) = messages
    assert "this cluster has no Application argocd/gpu" in message
    assert "controller.gitops.orphanMarkers: stale" in message
    assert "Fix: merge into the Application where it runs:" in message
    assert "RespectIgnoreDifferences=true" in message and "/spec/replicas" in message
    assert len(message) <= 1024  # an Event's message is cut there


async def test_orphan_markers_stale_reclaims_a_marker_without_its_application(tmp_path: Path) -> None:
    h = Harness(tmp_path, mode="enforce", startupGrace="1s", gitops={"orphanMarkers": "stale"})
    h.add("done", table=FINISHED, ann={ARGOCD_TRACKING_ID: f"gpu:apps/Deployment:{NS}/done"})
    h.rec.actor.stops.gitops = GitOpsPreflight(  # type: ignore[arg-type]
        Reader(None), cache_seconds=0, orphan_markers=h.cfg.gitops.orphan_markers
    )
    await h.polls(5)
    assert h.cluster.scaled == [(REF, 0)] and events(h, "ReclaimEscalated") == 0


def revert(h: Harness, manager: str, at: datetime, replicas: int = 1) -> None:
    """What self-heal does: the Git manifest applied again puts replicas back, owned by `manager`."""
    o = h.objects[REF]
    o["spec"]["replicas"] = replicas
    o["metadata"]["managedFields"] = [entry(manager, at, REPLICAS_FIELDS, operation="Apply")]
    o["metadata"]["resourceVersion"] = str(int(o["metadata"]["resourceVersion"]) + 1)


async def test_a_revert_is_recorded_once_and_never_fought_until_the_spec_changes(tmp_path: Path) -> None:
    h, _ = tracked_harness(tmp_path, FIXED_APP)
    await h.polls(5)
    assert h.cluster.scaled == [(REF, 0)]
    await h.polls(1)  # the cache shows it stopped
    revert(h, "argocd-controller", datetime.now(UTC) + timedelta(seconds=2))
    await h.polls(20)  # many windows: it goes FINISHED_IDLE again and again
    assert h.cluster.scaled == [(REF, 0)], "reclaimed again after a revert"
    assert events(h, "ReclaimReverted") == 1
    assert h.metrics.reclaim_reverts.labels(NS, "argocd-controller")._value.get() == 1
    ann = h.objects[REF]["metadata"]["annotations"]
    assert "ghostgpu.io/reclaimed-from-replicas" not in ann
    mark = Mark.parse(ann[MARK])
    assert mark is not None and (mark.by, mark.record) == ("argocd-controller", "1")
    # A new spec (image): judged and reclaimed again; the stale mark goes with the new record.
    h.objects[REF]["spec"]["template"]["spec"]["containers"][0]["image"] = "trainer:2"
    await h.polls(5)
    assert h.cluster.scaled == [(REF, 0), (REF, 0)]
    assert MARK not in h.objects[REF]["metadata"]["annotations"]
    assert events(h, "ReclaimReverted") == 1


async def test_restore_and_a_stop_that_never_landed_are_not_reverts(tmp_path: Path) -> None:
    h, _ = tracked_harness(tmp_path, FIXED_APP)
    # Restore had to leave the record (Kueue's webhook): its own scale is not a revert.
    await h.polls(5)
    await h.polls(1)
    revert(h, "ghostgpu-restore", datetime.now(UTC) + timedelta(seconds=2))
    await h.polls(3)
    assert events(h, "ReclaimReverted") == 0 and MARK not in h.objects[REF]["metadata"]["annotations"]
    # A record whose stop never landed (written long before by a leader that died), replicas owned
    # by the manifest's apply from before the record, and a fresh controller: reclaimed normally.
    h2, _ = tracked_harness(tmp_path / "2", FIXED_APP)
    o = h2.objects[REF]
    o["metadata"]["annotations"]["ghostgpu.io/reclaimed-from-replicas"] = "1"
    o["metadata"]["annotations"]["ghostgpu.io/reclaimed-at"] = stamp(datetime.now(UTC))
    o["metadata"]["managedFields"] = [
        entry("argocd-controller", datetime.now(UTC) - timedelta(hours=1), REPLICAS_FIELDS)
    ]
    await h2.polls(5)
    assert events(h2, "ReclaimReverted") == 0 and h2.cluster.scaled == [(REF, 0)]


async def test_a_conflict_on_the_mark_retries_and_still_records_once(tmp_path: Path) -> None:
    h, _ = tracked_harness(tmp_path, FIXED_APP)
    await h.polls(6)
    revert(h, "kubectl", datetime.now(UTC) + timedelta(seconds=2))
    h.cluster.conflict_on.add("done")  # a concurrent writer: the precondition fails
    await h.polls(3)
    assert events(h, "ReclaimReverted") == 0 and h.cluster.scaled == [(REF, 0)]
    h.cluster.conflict_on.clear()
    await h.polls(10)
    assert events(h, "ReclaimReverted") == 1 and h.cluster.scaled == [(REF, 0)]


async def test_a_failed_stop_after_a_restore_is_not_a_revert(tmp_path: Path) -> None:
    """Reclaimed, restored, then reclaimed again under the same record ("1") with a scale that
    fails (a 5xx): what this process saw under the first record must not make the second read as
    undone, or the workload would be marked and never reclaimed again."""
    h, _ = tracked_harness(tmp_path, FIXED_APP)
    await h.polls(6)  # reclaimed, and the cache has shown it stopped
    assert h.cluster.scaled == [(REF, 0)]
    o = h.objects[REF]
    o["spec"]["replicas"] = 1  # restored: replicas back, record gone (writer unknown to the guard)
    for key in ("ghostgpu.io/reclaimed-from-replicas", "ghostgpu.io/reclaimed-at"):
        o["metadata"]["annotations"].pop(key, None)
    o["metadata"]["managedFields"] = []
    h.cluster.scale_fails = 1
    await h.polls(12)
    assert events(h, "ReclaimReverted") == 0
    assert MARK not in h.objects[REF]["metadata"]["annotations"]
    assert len(h.cluster.scaled) == 2, "the next poll reclaims it again"
