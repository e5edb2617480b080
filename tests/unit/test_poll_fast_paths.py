"""The steady poll's fast paths for one-pod workloads (benchmarks/bench_poll_offline.py) skip
work only where it would have changed nothing: each test here takes the path the fast path
passes over and checks that it is still taken."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ghostgpu.controller.inventory import WorkloadRef, pod_view, workload_from
from ghostgpu.controller.poll import PollResult
from ghostgpu.controller.reconciler import Snapshot
from ghostgpu.signals.faults import NO_FAULTS
from ghostgpu.signals.utilization import PodKey, PodReading
from ghostgpu.verdict import FaultEvidence, XidEvent
from tests.unit.test_controller_reconciler import FINISHED, IS_GPU, NOW, NS, Harness, deployment, pod_for


async def test_a_pod_replaced_by_a_young_one_is_in_grace_again(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.add("job", table=FINISHED)
    result = await h.polls(2)
    st = h.rec.states[WorkloadRef("Deployment", NS, "job")]
    assert st.past_grace and result.states["grace"] == 0 and len(st.ring) == 2
    # One pod for another, just started: the same one-pod shape, a new uid.
    h.pods[:] = [pod_for("job", started=NOW + timedelta(minutes=2))]
    h.pods[0]["metadata"]["uid"] = "uid-new"
    result = await h.polls(1)
    assert result.states["grace"] == 1 and not result.judged
    assert not st.past_grace and len(st.ring) == 0 and st.pod_uids == ("uid-new",)


async def test_one_pod_whose_gpus_are_not_known_is_not_judged(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.add("job", table=FINISHED)
    await h.polls(2)
    snap = h.snapshot()
    unknown = Snapshot(
        snap.namespaces, snap.workloads, [dataclasses.replace(p, gpus_unknown=True) for p in snap.pods], []
    )
    result = await h.rec.poll_once(unknown)
    assert result.states["gpus-unknown"] == 1 and not result.judged


async def test_a_stopped_workload_still_settles_while_its_pods_linger(tmp_path: Path) -> None:
    h = Harness(tmp_path, mode="enforce")
    h.add("done", table=FINISHED)
    h.add("busy", util=80.0)
    await h.polls(4)
    assert [r.name for r, _ in h.cluster.scaled] == ["done"]
    # The cache has not seen the scale-down: the stopped workload's pod is still there.
    h.objects[WorkloadRef("Deployment", NS, "done")]["spec"]["replicas"] = 1
    result = await h.polls(1)
    assert result.states["reclaimed"] == 1
    assert WorkloadRef("Deployment", NS, "done") not in result.judged
    assert WorkloadRef("Deployment", NS, "busy") in result.judged


async def test_the_ghost_gauge_and_reclaimable_hours_of_judged_pods_without_dra_flavors(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    h.add("done", table=FINISHED)
    h.add("busy", util=80.0)
    nodes = [{"metadata": {"name": "gpu-0"}, "_flavor": "h100"}]
    reclaimable_polls = 0
    for _ in range(5):
        snap = h.snapshot()
        result = await h.rec.poll_once(Snapshot(snap.namespaces, snap.workloads, snap.pods, nodes))
        h.clock += 60
        reclaimable_polls += result.judged[WorkloadRef("Deployment", NS, "done")].kind == "FINISHED_IDLE"
    assert reclaimable_polls == 3
    gauge = h.metrics.registry.get_sample_value
    assert gauge("ghostgpu_ghost_gpus", {"namespace": NS, "flavor": "h100", "verdict": "FINISHED_IDLE"}) == 2
    assert gauge("ghostgpu_ghost_gpus", {"namespace": NS, "flavor": "h100", "verdict": "ACTIVE"}) == 2
    hours = gauge("ghostgpu_gpu_hours_reclaimable_total", {"namespace": NS, "flavor": "h100"})
    assert hours == pytest.approx(3 * 2 * 60 / 3600)
    # A pod on a node of no known flavor is counted as such.
    await h.rec.poll_once(h.snapshot())
    assert gauge("ghostgpu_ghost_gpus", {"namespace": NS, "flavor": "unknown", "verdict": "ACTIVE"}) == 2


async def test_the_faults_of_one_pod_and_of_several_come_with_the_readings(tmp_path: Path) -> None:
    """gather's one pass over the readings yields each workload's faults: an XID of its one pod, of
    any of its pods, or none (the shared NO_FAULTS)."""
    h = Harness(tmp_path)
    for name in ("quiet", "xid-one", "xid-two"):
        h.add(name, util=50.0)
    second = pod_for("xid-two")
    second["metadata"]["name"] += "2"
    second["metadata"]["uid"] += "2"
    h.pods.append(second)
    xid = {"xid-one-abc12-xyz": XidEvent(code=79, gpu="0"), "xid-two-abc12-xyz2": XidEvent(code=48, gpu="1")}
    scripted = h.util.poll

    async def with_xids(pods: Any, **kw: Any) -> dict[PodKey, PodReading]:
        out = await scripted(pods, **kw)
        return {k: PodReading(r.utilization, (xid[k.name],)) if k.name in xid else r for k, r in out.items()}

    h.util.poll = with_xids  # type: ignore[method-assign]
    obs = await h.rec.observer.observe(h.snapshot(), h.clock, PollResult(started=h.clock))
    faults = {ref.name: f for ref, f in obs.faults.items()}
    assert faults["quiet"] is NO_FAULTS
    assert isinstance(faults["xid-one"], FaultEvidence) and faults["xid-one"].xid_events == (
        xid["xid-one-abc12-xyz"],
    )
    assert isinstance(faults["xid-two"], FaultEvidence)
    assert faults["xid-two"].xid_events == (xid["xid-two-abc12-xyz2"],)
    assert obs.memory == {}  # nothing listed: no memory read


class CachedHarness(Harness):
    """Hands out the same Workload and PodView objects while the objects they come from are
    unchanged, as the watch caches do: the steady poll's memos compare them by identity."""

    def __init__(self, tmp: Path, **cfg: Any) -> None:
        super().__init__(tmp, **cfg)
        self.cache: dict[tuple[str, str, str], tuple[str, Any]] = {}

    def _cached(self, key: tuple[str, str, str], obj: dict, make: Any) -> Any:
        text = json.dumps(obj, sort_keys=True)
        hit = self.cache.get(key)
        if hit is None or hit[0] != text:
            hit = self.cache[key] = (text, make(obj))
        return hit[1]

    def snapshot(self) -> Snapshot:
        fresh = Harness.snapshot(self)  # which pods are live
        workloads = {}
        for obj in self.objects.values():
            meta = obj["metadata"]
            wl = self._cached(
                ("wl", meta["namespace"], meta["name"]), obj, lambda o: workload_from("Deployment", o, IS_GPU)
            )
            workloads[wl.ref] = wl
        live = {(p.namespace, p.name) for p in fresh.pods}
        pods = [
            self._cached(("pod", m["namespace"], m["name"]), p, lambda o: pod_view(o, IS_GPU))
            for p in self.pods
            if ((m := p["metadata"])["namespace"], m["name"]) in live
        ]
        return Snapshot(self.namespaces, workloads, pods, [])


async def test_the_same_cached_objects_are_judged_without_the_eligibility_checks(tmp_path: Path) -> None:
    h = CachedHarness(tmp_path)
    h.add("done", table=FINISHED)
    h.add("busy", util=80.0)
    await h.polls(4)
    assert h.verdict("done") == "FINISHED_IDLE"
    ref = WorkloadRef("Deployment", NS, "busy")
    st = h.rec.states[ref]
    snap = h.snapshot()
    assert st.eligible_workload is snap.workloads[ref] and st.eligible_pod in snap.pods
    result = await h.rec.poll_once(snap)
    assert result.judged[ref].verdict.kind.value == "ACTIVE" and len(st.ring) == 5


async def test_an_exemption_on_the_cached_workload_is_seen_at_once(tmp_path: Path) -> None:
    h = CachedHarness(tmp_path)
    h.add("busy", util=80.0)
    await h.polls(3)
    h.objects[WorkloadRef("Deployment", NS, "busy")]["metadata"]["annotations"][
        "ghostgpu.io/reclaim-policy"
    ] = "never"
    result = await h.polls(1)
    assert result.states["exempt"] == 1 and not result.judged


async def test_a_stop_with_the_same_cached_objects_settles(tmp_path: Path) -> None:
    h = CachedHarness(tmp_path)
    h.add("busy", util=80.0)  # nothing is written to it: its cached objects stay the same
    await h.polls(3)
    ref = WorkloadRef("Deployment", NS, "busy")
    snap = h.snapshot()
    assert h.rec.states[ref].eligible_workload is snap.workloads[ref]
    h.rec.observer.stopped(ref, list(snap.pods), h.clock)  # the act room stopped it
    result = await h.rec.poll_once(snap)  # the cache has not seen the scale-down: same objects
    assert result.states["reclaimed"] == 1 and ref not in result.judged


async def test_a_cached_pod_that_stops_running_or_is_replaced_is_checked_again(tmp_path: Path) -> None:
    h = CachedHarness(tmp_path)
    h.add("job", util=80.0)
    await h.polls(3)
    h.pods[0]["status"]["phase"] = "Succeeded"
    result = await h.polls(1)
    assert result.states["no-running-pod"] == 1 and not result.judged
    h.pods[:] = [pod_for("job", started=NOW + timedelta(minutes=3))]
    h.pods[0]["metadata"]["uid"] = "uid-new"
    result = await h.polls(1)
    assert result.states["grace"] == 1 and not result.judged


def test_every_tracked_pod_gets_its_workloads_bucket_outside_kueue() -> None:
    from types import SimpleNamespace

    from ghostgpu.controller.books.books import outside_kueue_buckets

    objs = {
        "judged": deployment("judged"),
        "exempt": deployment("exempt", ann={"ghostgpu.io/reclaim-policy": "never"}),
        "recorded": deployment("recorded", ann={"ghostgpu.io/verdict": "FINISHED_IDLE"}),
        "new": deployment("new"),
        "no-pods": deployment("no-pods"),
    }
    workloads = {(wl := workload_from("Deployment", o, IS_GPU)).ref: wl for o in objs.values()}
    refs = {ref.name: ref for ref in workloads}
    second = pod_for("judged")
    second["metadata"]["name"] += "2"
    pods_of = {refs[n]: [pod_view(pod_for(n), IS_GPU)] for n in ("judged", "exempt", "recorded", "new")}
    pods_of[refs["judged"]].append(pod_view(second, IS_GPU))
    judged = {refs["judged"]: SimpleNamespace(kind="ACTIVE")}
    assert outside_kueue_buckets(judged, workloads, pods_of) == {  # type: ignore[arg-type]
        (NS, "judged-abc12-xyz"): "ACTIVE",
        (NS, "judged-abc12-xyz2"): "ACTIVE",
        (NS, "exempt-abc12-xyz"): "EXEMPT",
        (NS, "recorded-abc12-xyz"): "FINISHED_IDLE",
        (NS, "new-abc12-xyz"): "PENDING",
    }


async def test_a_judged_workload_is_one_slotted_object(tmp_path: Path) -> None:
    """One object per judged workload per poll, not an object and its __dict__: at 50,000 pods each
    is one more object for the collector's young generation to traverse."""
    h = Harness(tmp_path)
    h.add("busy", util=80.0)
    result = await h.polls(4)
    (judged,) = result.judged.values()
    assert not hasattr(judged, "__dict__") and judged.kind == "ACTIVE"
