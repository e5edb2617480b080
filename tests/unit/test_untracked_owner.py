"""GPU pods no tracked workload accounts for (books/untracked.py): a Job nobody queued, an operator
kind with no actuator row, a Deployment the tracking policy missed. Their GPUs are in `status`'s
outside-Kueue columns (UNTRACKED_OWNER), the ghost gauge and the reservation; nothing is ever
written to them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ghostgpu.actuators import ActuatorTable
from ghostgpu.config import ControllerConfig
from ghostgpu.controller.books.accounting import FlavorSpec
from ghostgpu.controller.books.books import accounting_from
from ghostgpu.controller.books.decisions import DecisionLog
from ghostgpu.controller.books.reservation import desired_from
from ghostgpu.controller.books.untracked import UNTRACKED_OWNER, untracked_holders
from ghostgpu.controller.inventory import OwnerRef, WorkloadRef, gpu_predicate, pod_view, workload_from
from ghostgpu.controller.managers import Resolver, manager_workload
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.poll import Snapshot
from ghostgpu.controller.reconciler import Reconciler
from ghostgpu.signals.artifacts import FileArtifactProbe
from ghostgpu.signals.podexec import ExecResult, PodRef
from ghostgpu.signals.processes import ExecProcessSource
from ghostgpu.signals.utilization import PodKey, PodReading

NS = "ml"
IS_GPU = gpu_predicate(["nvidia.com/gpu"])
TABLE = ActuatorTable()
H100 = FlavorSpec("h100", "nvidia.com/gpu", {"gpu": "h100"})
NODE = {
    "metadata": {"name": "n-h100", "labels": {"gpu": "h100"}},
    "status": {"allocatable": {"nvidia.com/gpu": "8"}},
}
OPTED = {"ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": "vision"}
CQ = {
    "metadata": {"name": "cq-vision"},
    "spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
        {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]},
}  # fmt: skip
LQ = {"metadata": {"name": "team-q", "namespace": NS}, "spec": {"clusterQueue": "cq-vision"}}


def pod_obj(
    name: str, owner: tuple[str, str] | None, *, gpus: str = "4", phase: str = "Running",
    node: str | None = "n-h100", ns: str = NS, **labels: str,
) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels}
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    limits = {"nvidia.com/gpu": gpus} if gpus else {"cpu": "1"}
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase, "startTime": "2026-11-29T08:00:00Z"}}


def pod(name: str, owner: tuple[str, str] | None, **kw: Any) -> Any:
    return pod_view(pod_obj(name, owner, **kw), IS_GPU)


def tracked_deployment(name: str) -> Any:
    obj = {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                     "labels": {"ghostgpu.io/tracked": "true"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {"spec": {
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}},
    }  # fmt: skip
    return workload_from("Deployment", obj, IS_GPU)


def raycluster_of_rayjob(name: str, rayjob: str) -> Any:
    o = {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                     "labels": {"ghostgpu.io/tracked": "true"},
                     "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": rayjob[0], "name": rayjob[1],
                                          "uid": "uid-rj", "controller": True}]},
        "spec": {"workerGroupSpecs": [{"replicas": 1, "template": {"spec": {"containers": [
            {"name": "w", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}}]},
    }  # fmt: skip
    return manager_workload(TABLE.only("RayCluster"), o, IS_GPU)


def snapshot(
    tracked: dict[WorkloadRef, Any],
    pods: list[Any],
    *,
    managers: dict[WorkloadRef, Any] | None = None,
    owners: dict[tuple[str, str, str], OwnerRef | None] | None = None,
    namespaces: dict[str, Any] | None = None,
) -> Snapshot:
    res = Resolver(TABLE).resolve(tracked, owners or {}, managers or {}, pods)
    return Snapshot(
        namespaces if namespaces is not None else {NS: OPTED},
        res.workloads,
        pods,
        [{**NODE, "_flavor": "h100"}],
        top_of=res.top_of,
        holder_of=res.holder_of,
    )


# --- who holds them ----------------------------------------------------------------------------


def test_the_holder_is_the_top_of_the_chain_the_caches_see() -> None:
    job_pod = pod("train-x", ("Job", "train"))
    bare = pod("lonely", None)
    rc = raycluster_of_rayjob("rj-raycluster", ("RayJob", "rj"))
    ray_pod = pod("rj-worker-0", ("RayCluster", "rj-raycluster"))
    # a Deployment the policy did not label, owned by an operator kind nobody configured
    op_pod = pod("op-abc12-x", ("ReplicaSet", "op-abc12"), **{"pod-template-hash": "abc12"})
    owners = {("Deployment", NS, "op"): OwnerRef("Serving", "s1", "example.com/v1", "uid-s1")}
    snap = snapshot({}, [job_pod, bare, ray_pod, op_pod], managers={rc.ref: rc}, owners=owners)
    assert snap.holder_of is not None
    assert snap.holder_of(job_pod) == WorkloadRef("Job", NS, "train")
    assert snap.holder_of(bare) == WorkloadRef("Pod", NS, "lonely")
    assert snap.holder_of(ray_pod) == WorkloadRef("RayJob", NS, "rj")  # through the RayCluster cache
    assert snap.holder_of(op_pod) == WorkloadRef("Serving", NS, "s1", "example.com")
    # none of them is a workload: nothing is judged, so nothing is ever written
    assert snap.workloads == {}


def test_only_gpus_held_outside_kueue_and_outside_every_workload_are_untracked() -> None:
    dep = tracked_deployment("web")
    pods = [
        pod("train-x", ("Job", "train")),
        pod("web-abc12-x", ("ReplicaSet", "web-abc12"), app="web", **{"pod-template-hash": "abc12"}),
        pod("kueue-job-x", ("Job", "queued"), **{"kueue.x-k8s.io/podset": "main"}),  # Kueue started it
        pod("kueue-pod", None, **{"kueue.x-k8s.io/managed": "true"}),
        pod("queued-pod", None, **{"kueue.x-k8s.io/queue-name": "team-q"}),
        pod("pending-x", ("Job", "pending"), node=None, phase="Pending"),
        pod("done-x", ("Job", "done"), phase="Succeeded"),
        pod("cpu-x", ("Job", "cpu"), gpus=""),
        pod("elsewhere-x", ("Job", "elsewhere"), ns="not-opted-in"),
    ]
    snap = snapshot({dep.ref: dep}, pods, namespaces={NS: OPTED, "not-opted-in": {}})
    pods_of = {dep.ref: [pods[1]]}
    got = untracked_holders(snap.pods, snap.namespaces, pods_of, snap.holder_of)
    assert {ref: [p.name for p in lst] for ref, lst in got.items()} == {
        WorkloadRef("Job", NS, "train"): ["train-x"]
    }


# --- status, the ghost gauge, the reservation ------------------------------------------------------


def test_status_counts_them_in_an_untracked_owner_bucket_outside_kueue() -> None:
    dep = tracked_deployment("web")
    pods = [
        pod("train-a", ("Job", "train")),
        pod("train-b", ("Job", "train"), gpus="1"),
        pod(
            "web-abc12-x", ("ReplicaSet", "web-abc12"), gpus="2", app="web", **{"pod-template-hash": "abc12"}
        ),
    ]
    [acc] = accounting_from([H100], snapshot({dep.ref: dep}, pods), [CQ])
    assert acc.in_use == 7
    assert acc.outside_kueue[UNTRACKED_OWNER] == 5
    assert acc.held_outside_kueue == 7  # the tracked Deployment's 2 in its own (verdict) bucket
    assert acc.truly_free == 1 and acc.kueue_believes_free == 8 and acc.gap == 7
    assert acc.as_dict()["outsideKueueByVerdict"][UNTRACKED_OWNER] == 5


def test_without_the_namespace_opted_in_nothing_is_counted_outside_kueue() -> None:
    [acc] = accounting_from(
        [H100], snapshot({}, [pod("train-a", ("Job", "train"))], namespaces={NS: {}}), [CQ]
    )
    assert acc.in_use == 4 and acc.outside_kueue == {}


@pytest.mark.parametrize(
    "pods,expected",
    [
        (
            [pod_obj("train-a", ("Job", "train")), pod_obj("train-b", ("Job", "train"), gpus="2")],
            [("job/train", 6, "ghostgpu-reserve-job-train-h100-6")],
        ),
        ([pod_obj("lonely", None, gpus="3")], [("pod/lonely", 3, "ghostgpu-reserve-pod-lonely-h100-3")]),
        ([pod_obj("kueue-x", ("Job", "q"), **{"kueue.x-k8s.io/podset": "main"})], []),
    ],
)
def test_the_reservation_holds_them_under_their_holders_name(
    pods: list[dict[str, Any]], expected: list[tuple[str, int, str]]
) -> None:
    views = [pod_view(p, IS_GPU) for p in pods]
    got = desired_from([H100], snapshot({}, views), [CQ], [LQ], local_queue="team-q")
    assert [(r.holder, r.gpus, r.name) for r in got] == expected
    assert all(r.cluster_queue == "cq-vision" and r.team == "vision" for r in got)


def test_a_rayjobs_workers_are_reserved_for_the_rayjob() -> None:
    rc = raycluster_of_rayjob("rj-raycluster", ("RayJob", "rj"))
    views = [pod("rj-worker-0", ("RayCluster", "rj-raycluster"))]
    [r] = desired_from([H100], snapshot({}, views, managers={rc.ref: rc}), [CQ], [LQ], local_queue="team-q")
    assert (r.holder, r.gpus) == ("rayjob/rj", 4)


def test_the_reservation_does_not_count_a_tracked_workloads_pods_twice() -> None:
    dep = tracked_deployment("web")
    views = [pod("web-abc12-x", ("ReplicaSet", "web-abc12"), app="web", **{"pod-template-hash": "abc12"})]
    got = desired_from([H100], snapshot({dep.ref: dep}, views), [CQ], [LQ], local_queue="team-q")
    assert [(r.holder, r.gpus) for r in got] == [("deployment/web", 4)]


# --- the reconcile loop: in the ghost gauge, never written to -----------------------------------------


class Idle:
    async def poll(
        self, pods: Any, *, now: float, devices: object = None, uids: object = None
    ) -> dict[PodKey, PodReading]:
        return {p: PodReading(0.0, (), 0) for p in pods}


class Finished:
    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        return ExecResult("", "", 0)


class RecordingCluster:
    """Every call the controller makes: for untracked GPUs there must be none that writes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return None

        return call


async def test_the_ghost_gauge_counts_them_and_nothing_is_written(tmp_path: Path) -> None:
    cfg = ControllerConfig.model_validate(
        {"mode": "enforce", "window": 3, "longWindow": 6, "startupGrace": "1s", "autonomy": {"tau": 0.5}}
    )
    cluster = RecordingCluster()
    metrics = ControllerMetrics()
    rec = Reconciler(
        cfg,
        cluster=cluster,  # type: ignore[arg-type]
        utilization=Idle(),  # type: ignore[arg-type]
        processes=ExecProcessSource(Finished(), concurrency=2),
        files=FileArtifactProbe(Finished()),
        s3=None,
        metrics=metrics,
        decision_log=DecisionLog(tmp_path / "d.jsonl"),
        clock=lambda: 1_800_000_000.0,
    )
    pods = [pod("train-a", ("Job", "train")), pod("train-b", ("Job", "train"), gpus="2")]
    for _ in range(8):  # idle far past the window: an untracked holder is never judged or stopped
        result = await rec.poll_once(snapshot({}, pods))
        assert result.judged == {} and result.actions == []
    assert cluster.calls == []
    gauge = metrics.registry.get_sample_value
    assert gauge("ghostgpu_ghost_gpus", {"namespace": NS, "flavor": "h100", "verdict": UNTRACKED_OWNER}) == 6
    reclaimable = gauge("ghostgpu_gpu_hours_reclaimable_total", {"namespace": NS, "flavor": "h100"})
    assert not reclaimable  # held, never reclaimable: nothing may act on it


# --- `ghostgpu status --by owner` ------------------------------------------------------------------


def test_by_owner_names_the_kinds_holding_gpus_outside_kueue_most_first() -> None:
    from ghostgpu.controller.books.books import opted_in_pods_of
    from ghostgpu.controller.books.owners import OwnerKindRow, by_owner_kind

    dep = tracked_deployment("web")
    rc = raycluster_of_rayjob("rj-raycluster", ("RayJob", "rj"))
    pods = [
        pod(
            "web-abc12-x", ("ReplicaSet", "web-abc12"), gpus="2", app="web", **{"pod-template-hash": "abc12"}
        ),
        pod("train-a", ("Job", "train")),
        pod("other-a", ("Job", "other"), gpus="1"),
        pod("rj-worker-0", ("RayCluster", "rj-raycluster"), gpus="8"),
        pod("queued", ("Job", "q"), **{"kueue.x-k8s.io/podset": "main"}),  # Kueue's: not outside
    ]
    rj_obj = {"apiVersion": "ray.io/v1", "kind": "RayJob",
              "metadata": {"name": "rj", "namespace": NS, "uid": "uid-rj"},
              "spec": {"shutdownAfterJobFinishes": True}}  # fmt: skip
    rj = manager_workload(TABLE.only("RayJob"), rj_obj, IS_GPU)
    snap = snapshot({dep.ref: dep}, pods, managers={rc.ref: rc, rj.ref: rj})
    rows = [(r.kind, r.group, r.acts, r.holders, r.gpus) for r in by_owner_kind(snap, opted_in_pods_of(snap))]
    # a RayJob is stopped through its row; plain Jobs are only counted (no row: add one to act)
    assert rows == [
        ("RayJob", "ray.io", True, 1, 8.0),
        ("Job", "batch", False, 2, 5.0),
        ("Deployment", "apps", True, 1, 2.0),
    ]
    # the same RayJob without shutdownAfterJobFinishes: held, but ghostgpu cannot stop it
    rj_obj["spec"] = {}
    rj = manager_workload(TABLE.only("RayJob"), rj_obj, IS_GPU)
    snap = snapshot({dep.ref: dep}, pods, managers={rc.ref: rc, rj.ref: rj})
    assert by_owner_kind(snap, opted_in_pods_of(snap))[0] == OwnerKindRow("RayJob", False, 1, 8.0, "ray.io")


def shadow_reconciler(
    tmp_path: Path, metrics: ControllerMetrics, *, is_leader: Callable[[], bool] = lambda: True
) -> Reconciler:
    """A shadow-mode reconciler whose pods all read idle and finished."""
    return Reconciler(
        ControllerConfig.model_validate({"mode": "shadow", "window": 3, "startupGrace": "1s"}),
        cluster=RecordingCluster(),  # type: ignore[arg-type]
        utilization=Idle(),  # type: ignore[arg-type]
        processes=ExecProcessSource(Finished(), concurrency=2),
        files=FileArtifactProbe(Finished()),
        s3=None,
        metrics=metrics,
        decision_log=DecisionLog(tmp_path / "d.jsonl"),
        is_leader=is_leader,
        clock=lambda: 1_800_000_000.0,
    )


async def test_the_leaders_books_export_the_owner_kinds_and_drop_a_kind_that_stopped_holding(
    tmp_path: Path,
) -> None:
    from prometheus_client import generate_latest

    leader = True
    metrics = ControllerMetrics()
    rec = shadow_reconciler(tmp_path, metrics, is_leader=lambda: leader)
    rc = raycluster_of_rayjob("rj-raycluster", ("RayJob", "rj"))
    rj_obj = {"apiVersion": "ray.io/v1", "kind": "RayJob",
              "metadata": {"name": "rj", "namespace": NS, "uid": "uid-rj"},
              "spec": {"shutdownAfterJobFinishes": True}}  # fmt: skip
    rj = manager_workload(TABLE.only("RayJob"), rj_obj, IS_GPU)
    ray = [pod("rj-worker-0", ("RayCluster", "rj-raycluster"), gpus="8")]
    jobs = [pod("train-a", ("Job", "train")), pod("train-b", ("Job", "train"), gpus="2")]
    queued = [pod("queued", ("Job", "q"), **{"kueue.x-k8s.io/podset": "main"})]  # Kueue's own

    def gauge(kind: str, stoppable: str) -> float | None:
        group = {"RayJob": "ray.io", "Job": "batch"}[kind]
        labels = {"owner_kind": kind, "owner_group": group, "stoppable": stoppable}
        return metrics.registry.get_sample_value("ghostgpu_owner_kind_outside_kueue_gpus", labels)

    def exposed() -> list[str]:
        text = generate_latest(metrics.registry).decode()
        return [ln for ln in text.splitlines() if ln.startswith("ghostgpu_owner_kind_outside_kueue_gpus{")]

    # RayJob has an actuator row (stoppable); a plain Job has none (add a row to act on it).
    await rec.poll_once(snapshot({}, ray + jobs + queued, managers={rc.ref: rc, rj.ref: rj}))
    assert (gauge("RayJob", "true"), gauge("Job", "false")) == (8.0, 6.0)
    assert len(exposed()) == 2  # one series per (kind, stoppable) holding GPUs; Kueue's pod is not one

    # The Job's pods are gone: its series goes, it does not stay at its last value.
    await rec.poll_once(snapshot({}, ray + queued, managers={rc.ref: rc, rj.ref: rj}))
    assert gauge("RayJob", "true") == 8.0 and gauge("Job", "false") is None
    assert exposed() == [
        "ghostgpu_owner_kind_outside_kueue_gpus"
        '{owner_group="ray.io",owner_kind="RayJob",stoppable="true"} 8.0'
    ]

    # The ghost gauge holds the same GPUs (the RayCluster's 8 as untracked holders' of the namespace).
    ghosts = [
        ln
        for ln in generate_latest(metrics.registry).decode().splitlines()
        if ln.startswith("ghostgpu_ghost_gpus{")
    ]
    assert ghosts, "the leader exports ghost GPUs"

    # A replica that lost the lease stops exporting them, and its ghost GPUs (the new leader does).
    leader = False
    await rec.poll_once(snapshot({}, ray + jobs, managers={rc.ref: rc, rj.ref: rj}))
    assert exposed() == []
    ghosts = [
        ln
        for ln in generate_latest(metrics.registry).decode().splitlines()
        if ln.startswith("ghostgpu_ghost_gpus{")
    ]
    assert ghosts == []


async def test_a_poll_finds_its_untracked_holders_once_for_every_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ghost gauge, the owner kinds, the accounting and the reservation read one computation."""
    import ghostgpu.controller.books.books as books

    calls = 0
    real = books.untracked_holders

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    import ghostgpu.controller.books.reservation as reservation

    monkeypatch.setattr(books, "untracked_holders", counted)
    monkeypatch.setattr(reservation, "untracked_holders", counted)
    rec = shadow_reconciler(tmp_path, ControllerMetrics())
    snap = snapshot({}, [pod("train-b", ("Job", "train"), gpus="2")])
    result = await rec.poll_once(snap)  # the leader's books: ghost gauge and owner kinds
    [acc] = accounting_from(
        [H100], snap, [CQ], result.judged, result.pods_of, books.untracked_of(snap, result)
    )
    desired_from([H100], snap, [CQ], [], local_queue="default", untracked=books.untracked_of(snap, result))
    assert calls == 1
    assert acc.outside_kueue.get(UNTRACKED_OWNER) == 2.0
