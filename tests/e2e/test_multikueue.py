"""MultiKueue across three devclusters: a manager and two workers, each a control plane of its own
with Kueue (no Kyverno, Prometheus, real node or CRDs of kinds nothing runs: as light as the
devcluster goes). The manager's ClusterQueue requires a MultiKueue AdmissionCheck over both
workers (AllAtOnce: the first worker whose Kueue admits a copy wins); each worker has one kwok node
of 8 H100s and a ClusterQueue of 8 (the rendered preemption: withinClusterQueue LowerPriority).

On the manager (which has a kwok GPU node too) a hand-made placeholder in the MultiKueue
ClusterQueue is rejected by Kueue and deactivated; the controller against the manager, with a ghost
there, writes none (the guard), and `ghostgpu status`/`doctor` say why.

A ghost (a GPU Deployment outside Kueue) holds all 8 of worker 1's GPUs.
- Without reservation: worker 1's Kueue admits an 8-GPU Job's copy on quota, wins, and the pod
  cannot be scheduled.
- With ghostgpu's reservation in each worker (the controller against each worker's apiserver): the
  placeholder fills worker 1's quota, so the copy waits there and worker 2 wins; no pod of the Job
  is refused by a scheduler.
- The manager's garbage collection of remote objects (every 5 s here) leaves placeholders alone.
- A higher-priority Job sent to both workers: what Kueue's priority preemption does to the
  placeholder, measured and printed.
- The ghost reclaimed (scaled to 0, as the scale actuator does): worker 1 admits again within a poll.

Worker 2 is held (`stopPolicy: Hold` on its ClusterQueue) where a test needs the race decided for
worker 1. Times are printed (pytest -s) for docs/reservation.md."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from reservation_config import reservation_section
from test_controller import LEASE_NS, REPO, Controller, wait_for

from ghostgpu.controller.books.reservation import Reservation, placeholder_object
from ghostgpu.devcluster import DevCluster, GpuNodeSpec
from ghostgpu.devcluster import multikueue as mk
from ghostgpu.devcluster.paths import Toolchain

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.kueue, pytest.mark.timeout(1200)]

KUEUE = ("kueue.x-k8s.io", "v1beta2")
API = "/".join(KUEUE)
POLL = 2  # seconds, the controllers' pollInterval
NS, QUEUE, CQ, FLAVOR, CHECK = "team-a", "team-q", "team", "h100", "mk"
WORKERS = ("worker-1", "worker-2")
GPU_NODE = "gpu-h100-0"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
PLACEHOLDERS = "ghostgpu.io/reservation=true"
EVICTIONS = "ghostgpu_reservation_evictions_total"  # reason InClusterQueue: priority preemption
NEEDED = ["etcd", "kube_apiserver", "kube_controller_manager", "kube_scheduler", "kwok", "kueue"]


@dataclass
class Cluster:
    name: str
    dc: DevCluster

    @property
    def co(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.dc.kube.api_client)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.dc.kube.api_client)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.dc.kube.api_client)

    def apply(self, *objs: dict[str, Any]) -> None:
        for o in objs:
            self.dc.kube.apply(o)

    def workloads(self, selector: str = "") -> list[dict[str, Any]]:
        return self.co.list_namespaced_custom_object(*KUEUE, NS, "workloads", label_selector=selector)[
            "items"
        ]

    def placeholders(self) -> dict[str, dict[str, Any]]:
        """name -> {uid, condition type: status} of each placeholder."""
        return {
            w["metadata"]["name"]: {
                "uid": w["metadata"]["uid"],
                **{c["type"]: c["status"] for c in (w.get("status") or {}).get("conditions") or []},
            }
            for w in self.workloads(PLACEHOLDERS)
        }

    def job_pods(self, job: str) -> list[Any]:
        return self.core.list_namespaced_pod(NS, label_selector=f"job-name={job}").items

    def refused(self, job: str) -> list[str]:
        """The pods of `job` the scheduler refused at least once."""
        evs = self.core.list_namespaced_event(NS, field_selector="reason=FailedScheduling").items
        return sorted({e.involved_object.name for e in evs if e.involved_object.name.startswith(f"{job}-")})

    def hold(self, on: bool) -> None:
        patch = {"spec": {"stopPolicy": "Hold" if on else "None"}}
        self.co.patch_cluster_custom_object(*KUEUE, "clusterqueues", CQ, patch)

    def has_job(self, job: str) -> bool:
        return bool(self.batch.list_namespaced_job(NS, field_selector=f"metadata.name={job}").items)


@dataclass
class Fleet:
    manager: Cluster
    workers: dict[str, Cluster]
    start_s: dict[str, float]

    def job(self, name: str, gpus: int = 8, priority_class: str | None = None) -> float:
        """An 8-GPU Job in the manager's LocalQueue; returns when it was created (monotonic)."""
        labels = {"kueue.x-k8s.io/queue-name": QUEUE}
        if priority_class:
            labels["kueue.x-k8s.io/priority-class"] = priority_class
        self.manager.apply({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"parallelism": 1, "completions": 1, "suspend": True, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "train", "image": "trainer:latest",
                                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}},
        })  # fmt: skip
        return time.monotonic()

    def manager_workload(self, job: str) -> dict[str, Any] | None:
        return next(
            (w for w in self.manager.workloads()
             if any(o.get("name") == job for o in w["metadata"].get("ownerReferences") or [])),
            None,
        )  # fmt: skip

    def placed_on(self, job: str) -> str | None:
        """The worker MultiKueue placed the Job on (the manager Workload's status.clusterName)."""
        w = self.manager_workload(job)
        return ((w or {}).get("status") or {}).get("clusterName")

    def delete_job(self, job: str) -> None:
        """The Job on the manager (MultiKueue then removes its copies), and waits until no worker
        has it: the next test needs the quota and GPUs free."""
        with contextlib.suppress(client.ApiException):
            self.manager.batch.delete_namespaced_job(job, NS, propagation_policy="Background")
        for w in self.workers.values():
            w.core.delete_collection_namespaced_pod(
                NS, label_selector=f"job-name={job}", grace_period_seconds=0
            )
        wait_for(
            lambda: not any(w.has_job(job) for w in self.workers.values()), 90, f"{job} gone from the workers"
        )
        wait_for(lambda: self.manager_workload(job) is None, 60, f"{job}'s manager Workload gone")


def _team_objects(
    quota: int, node_labels: dict[str, str], checks: list[str] | None = None
) -> list[dict[str, Any]]:
    cq: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": FLAVOR, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": quota}]}]}],
        "preemption": {"withinClusterQueue": "LowerPriority"},  # as the rendered ClusterQueues
    }  # fmt: skip
    if checks:
        cq["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {
            "ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": "team-a"}}},
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR},
         "spec": {"nodeLabels": node_labels}},
        {"apiVersion": API, "kind": "WorkloadPriorityClass", "metadata": {"name": "production"},
         "value": 1000},
        {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": CQ}, "spec": cq},
        {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": NS},
         "spec": {"clusterQueue": CQ}},
    ]  # fmt: skip


def _active(c: Cluster, plural: str, name: str) -> bool:
    obj = c.co.get_cluster_custom_object(*KUEUE, plural, name)
    return any(
        x["type"] == "Active" and x["status"] == "True"
        for x in (obj.get("status") or {}).get("conditions") or []
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    missing = Toolchain.locate().missing(*NEEDED)
    if missing:
        pytest.skip("devcluster binaries not built (run hack/testbin): " + ", ".join(missing))
    root = tmp_path_factory.mktemp("multikueue")
    node = GpuNodeSpec(name=GPU_NODE, gpus=8, labels=H100)
    light = {"addons": ("kueue",), "real_node": False, "extra_crds": False}
    specs = {
        # The manager has a GPU node too: a ghost there shows the reservation's guard.
        "manager": {"nodes": [node], "kueue_overrides": mk.manager_kueue_overrides("5s"), **light},
        **{w: {"nodes": [node], **light} for w in WORKERS},
    }
    started: dict[str, DevCluster] = {}
    start_s: dict[str, float] = {}

    def up(name: str) -> None:
        t0 = time.monotonic()
        started[name] = DevCluster.up(root / name, log=lambda m: print(f"[{name}] {m}"), **specs[name])
        start_s[name] = time.monotonic() - t0

    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(len(specs)) as pool:
            for f in [pool.submit(up, n) for n in specs]:
                f.result()
        start_s["all three, in parallel"] = time.monotonic() - t0
        print(f"cluster start (s): { {k: round(v, 1) for k, v in start_s.items()} }")
        manager = Cluster("manager", started["manager"])
        workers = {w: Cluster(w, started[w]) for w in WORKERS}
        for w in workers.values():
            w.apply(*_team_objects(8, H100))
        for c in (manager, *workers.values()):
            c.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
        for w in WORKERS:
            manager.apply(*mk.worker_objects(w, started[w].embedded_kubeconfig()))
        manager.apply(*mk.manager_objects(CHECK, list(WORKERS)), *_team_objects(16, H100, [CHECK]))
        for w in WORKERS:
            wait_for(
                lambda w=w: _active(manager, "multikueueclusters", w), 90, f"MultiKueueCluster {w} Active"
            )
        wait_for(
            lambda: _active(manager, "admissionchecks", CHECK), 60, "the MultiKueue AdmissionCheck Active"
        )
        wait_for(lambda: _active(manager, "clusterqueues", CQ), 60, "the manager's ClusterQueue Active")
        yield Fleet(manager, workers, start_s)
    finally:
        for dc in started.values():
            dc.down()


@pytest.fixture(scope="module")
def ghost(fleet: Fleet) -> str:
    """Deployment `ghost` outside Kueue holding all 8 GPUs of worker 1; the name of its pod."""
    w1 = fleet.workers["worker-1"]
    labels = {"app": "ghost", "ghostgpu.io/tracked": "true"}
    w1.apply({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "ghost", "namespace": NS, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "ghost"}}, "template": {
            "metadata": {"labels": labels},
            "spec": {"nodeSelector": H100, "containers": [{"name": "serve", "image": "server:latest",
                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}},
    })  # fmt: skip

    def running() -> str | None:
        pods = [p for p in w1.core.list_namespaced_pod(NS, label_selector="app=ghost").items
                if p.status.phase == "Running"]  # fmt: skip
        return pods[0].metadata.name if len(pods) == 1 else None

    return wait_for(running, 90, "the ghost running on worker 1")


@pytest.fixture(scope="module")
def controllers(
    fleet: Fleet, ghost: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Controller]]:
    """ghostgpu's controller against each worker (_controller_config)."""
    tmp = tmp_path_factory.mktemp("controllers")
    path = _controller_config(tmp)
    ctls = {w: Controller(fleet.workers[w].dc.kubeconfig, path, tmp, w) for w in WORKERS}
    try:
        yield ctls
    finally:
        for c in ctls.values():
            c.stop()


def _reserved(w: Cluster) -> dict[str, Any] | None:
    """Its one placeholder, once admitted and PodsReady (None meanwhile, or while there are two)."""
    phs = list(w.placeholders().values())
    ready = len(phs) == 1 and phs[0].get("Admitted") == "True" and phs[0].get("PodsReady") == "True"
    return phs[0] if ready else None


def _back_within(w: Cluster, timeout: float) -> float | None:
    """When (monotonic) its one placeholder is seen admitted and PodsReady, or None past `timeout`:
    a measure, not a condition (docs/reservation.md)."""
    try:
        wait_for(lambda: _reserved(w), timeout, "the placeholder admitted again")
    except AssertionError:
        return None
    return time.monotonic()


def _controller_config(tmp: Path) -> Path:
    """The controllers' config: reservation enforce, mode shadow (it reclaims nothing itself, and
    no Prometheus runs here, so every verdict is UNKNOWN: held, reserved), poll 2 s."""
    path = tmp / "controller.yaml"
    cfg = reservation_section("http://127.0.0.1:9", queue=QUEUE, poll_s=POLL, mode="shadow")
    path.write_text(yaml.safe_dump(cfg))
    return path


def _status(c: Cluster, cfg: Path) -> list[dict[str, Any]]:
    """`ghostgpu status --json` on cluster c, with the controllers' config (its reservationQueue)."""
    out = subprocess.run(
        [sys.executable, "-m", "ghostgpu.cli", "status", "--json", "--kubeconfig", str(c.dc.kubeconfig),
         "--config", cfg],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    return json.loads(out.stdout)


def _doctor_row(c: Cluster) -> dict[str, str]:
    """`ghostgpu doctor --json`'s row `kueue: MultiKueue` on cluster c, with the example config but
    the reservation on and this test's queue (the other rows fail here: no Kyverno, no Prometheus)."""
    cfg = yaml.safe_load((REPO / "examples" / "ghostgpu.yaml").read_text())
    cfg["controller"].update(reservation="enforce", reservationQueue=QUEUE)
    path = Path(c.dc.state_dir) / "doctor-ghostgpu.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run(
        [sys.executable, "-m", "ghostgpu.cli", "doctor", "--json", "-c", str(path),
         "--kubeconfig", str(c.dc.kubeconfig), "--prometheus-url", "http://127.0.0.1:9"],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    rows = {r["check"]: r for r in json.loads(out.stdout)}
    return rows["kueue: MultiKueue"]


def test_on_the_manager_kueue_rejects_a_placeholder_and_the_controller_writes_none(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Why the guard: a placeholder in the manager's MultiKueue ClusterQueue is rejected by Kueue
    (no MultiKueue adapter for an owner-less Workload) and deactivated. With the guard the
    controller, against the manager with a ghost there, writes none; status and doctor say why."""
    m = fleet.manager
    labels = {"app": "ghost-m", "ghostgpu.io/tracked": "true"}
    m.apply({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "ghost-m", "namespace": NS, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "ghost-m"}}, "template": {
            "metadata": {"labels": labels},
            "spec": {"nodeSelector": H100, "containers": [{"name": "serve", "image": "server:latest",
                     "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}},
    })  # fmt: skip
    wait_for(
        lambda: [p for p in m.core.list_namespaced_pod(NS, label_selector="app=ghost-m").items
                 if p.status.phase == "Running"],
        90, "the manager's ghost running",
    )  # fmt: skip
    hand_made = placeholder_object(
        Reservation(NS, "deployment/ghost-m", FLAVOR, "nvidia.com/gpu", 2, CQ, QUEUE, "team-a"), H100
    )
    t0 = time.monotonic()
    m.apply(hand_made)
    name = hand_made["metadata"]["name"]

    def rejected() -> str | None:
        w = m.co.get_namespaced_custom_object(*KUEUE, NS, "workloads", name)
        checks = (w.get("status") or {}).get("admissionChecks") or []
        done = (w.get("spec") or {}).get("active") is False and any(
            c.get("state") == "Rejected" for c in checks
        )
        return "; ".join(str(c.get("message")) for c in checks) if done else None

    why = wait_for(rejected, 60, "Kueue to reject and deactivate the hand-made placeholder")
    print(f"manager: a placeholder in the MultiKueue ClusterQueue rejected and deactivated after "
          f"{time.monotonic() - t0:.1f}s: {why}")  # fmt: skip
    assert "multikueue adapter" in why.lower()
    m.dc.kube.delete(API, "Workload", name, NS)

    path = _controller_config(tmp_path)
    ctl = Controller(m.dc.kubeconfig, path, tmp_path, "manager")
    try:
        ctl.wait_polls(3)
        assert m.placeholders() == {}, "no placeholder in the MultiKueue ClusterQueue"
        assert '"msg":"reservation skips ClusterQueues"' in ctl.log_path.read_text()
        [h100] = [a for a in _status(m, path) if a["flavor"] == FLAVOR]
        assert (
            list(h100["reservationSkipped"]) == [CQ]
            and "MultiKueue AdmissionCheck mk" in h100["reservationSkipped"][CQ]
        )
        assert h100["heldOutsideKueue"] == 2 and h100["reservationDesired"] == 0
        row = _doctor_row(m)
        # The reservation is on and team-a's reservationQueue leads to the MultiKueue ClusterQueue.
        assert row["status"] == "warn" and f"manager: ClusterQueues {CQ}" in row["found"], row
    finally:
        ctl.stop()
        m.dc.kube.delete("apps/v1", "Deployment", "ghost-m", NS)
        m.core.delete_collection_namespaced_pod(NS, label_selector="app=ghost-m", grace_period_seconds=0)


def test_without_reservation_the_job_lands_on_the_held_worker_and_pends(
    fleet: Fleet, ghost: str, tmp_path: Path
) -> None:
    w1, w2 = fleet.workers["worker-1"], fleet.workers["worker-2"]
    w2.hold(True)  # the race between two workers that both look free goes to worker 1
    try:
        sent = fleet.job("unreserved")
        wait_for(lambda: fleet.placed_on("unreserved") == "worker-1", 90, "the Job placed on worker 1")
        print(f"no reservation: placed on worker-1 {time.monotonic() - sent:.1f}s after it was created")
        wait_for(lambda: w1.refused("unreserved"), 60, "worker 1's scheduler to refuse its pod")
        [pod] = w1.job_pods("unreserved")
        assert pod.spec.node_name is None and pod.status.phase == "Pending", "admitted, yet it cannot run"
        assert w1.placeholders() == {}
        # What status and doctor see on a worker: the Workload a manager sent, admitted here.
        cfg = _controller_config(tmp_path)

        def h100() -> dict[str, Any] | None:  # once Kueue's ClusterQueue status counts the copy
            [acc] = [a for a in _status(w1, cfg) if a["flavor"] == FLAVOR]
            return acc if acc["kueueAdmitted"] == 8 else None

        acc = wait_for(h100, 30, "status to show the copy admitted on worker 1")
        assert acc["multiKueueWorkloads"] == 1 and acc["reservationSkipped"] == {}
        assert acc["heldOutsideKueue"] == 8  # and admitted 8: the gap the reservation closes
        row = _doctor_row(w1)
        assert row["status"] == "ok", row
        assert "worker: 1 Workloads sent by a manager of origin multikueue" in row["found"]
    finally:
        fleet.delete_job("unreserved")
        w2.hold(False)


def test_with_reservation_the_job_lands_on_the_free_worker(
    fleet: Fleet, controllers: dict[str, Controller]
) -> None:
    w1, w2 = fleet.workers["worker-1"], fleet.workers["worker-2"]
    t0 = time.monotonic()
    wait_for(lambda: _reserved(w1), 60, "worker 1's placeholder admitted and PodsReady")
    print(
        f"placeholder on worker-1 admitted and ready {time.monotonic() - t0:.1f}s after the controllers "
        "started"
    )
    [name] = w1.placeholders()
    assert name == f"ghostgpu-reserve-deployment-ghost-{FLAVOR}-8"
    controllers["worker-2"].wait_polls(2)
    assert w2.placeholders() == {}, "nothing is held outside Kueue on worker 2"
    try:
        sent = fleet.job("reserved")
        wait_for(lambda: fleet.placed_on("reserved") is not None, 90, "the Job placed")
        took = time.monotonic() - sent
        assert fleet.placed_on("reserved") == "worker-2"
        pods = wait_for(
            lambda: [p for p in w2.job_pods("reserved") if p.spec.node_name], 60, "its pod scheduled"
        )
        print(
            f"reservation: placed on worker-2 {took:.1f}s after it was created, "
            f"pod on {pods[0].spec.node_name}"
        )
        assert w2.refused("reserved") == [] and w1.refused("reserved") == []
        assert not w1.has_job("reserved"), "worker 1's copy is removed once worker 2 won"
        assert _reserved(w1), "the placeholder stays admitted"
    finally:
        fleet.delete_job("reserved")


def test_placeholders_survive_the_managers_garbage_collection(
    fleet: Fleet, controllers: dict[str, Controller]
) -> None:
    """The manager deletes, every gcInterval (5 s), the Workloads in a worker labelled with its
    origin whose manager Workload is gone; a placeholder carries no such label."""
    w1 = fleet.workers["worker-1"]
    before = wait_for(lambda: _reserved(w1), 60, "worker 1's placeholder")
    orphan = {
        "apiVersion": API, "kind": "Workload",
        "metadata": {"name": "orphan", "namespace": NS,
                     "labels": {"kueue.x-k8s.io/multikueue-origin": mk.ORIGIN}},
        "spec": {"queueName": QUEUE, "podSets": [{"name": "main", "count": 1, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "x",
            "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}}]},
    }  # fmt: skip
    w1.apply(orphan)
    t0 = time.monotonic()
    wait_for(
        lambda: not [w for w in w1.workloads() if w["metadata"]["name"] == "orphan"],
        60,
        "the GC to collect it",
    )
    print(f"manager GC: an orphaned remote Workload collected after {time.monotonic() - t0:.1f}s")
    time.sleep(2 * 5)  # two more collections
    after = _reserved(w1)
    assert after is not None and after["uid"] == before["uid"], "the same placeholder, still admitted"


def test_a_higher_priority_job_sent_to_both_workers(fleet: Fleet, controllers: dict[str, Controller]) -> None:
    """Kueue's priority preemption on worker 1 (withinClusterQueue: LowerPriority): its copy of a
    production Job may preempt the placeholder, and worker 1 may then admit it onto GPUs the ghost
    still holds. Measured: where it lands, the placeholder's evictions, refused pods, whether the
    placeholder was back while the Job ran."""
    w1, w2 = fleet.workers["worker-1"], fleet.workers["worker-2"]
    first = wait_for(lambda: _reserved(w1), 60, "worker 1's placeholder")
    evicted_before = controllers["worker-1"].metric(EVICTIONS, reason="InClusterQueue")
    try:
        sent = fleet.job("urgent", priority_class="production")
        wait_for(lambda: fleet.placed_on("urgent") is not None, 90, "the production Job placed")
        placed, took = fleet.placed_on("urgent"), time.monotonic() - sent
        winner = fleet.workers[str(placed)]
        wait_for(
            lambda: [p for p in winner.job_pods("urgent") if p.spec.node_name] or w1.refused("urgent"),
            60,
            "its pod scheduled or refused",
        )
        controllers["worker-1"].wait_polls(2)
        evictions = controllers["worker-1"].metric(EVICTIONS, reason="InClusterQueue") - evicted_before
        back = _back_within(w1, 20) if placed == "worker-2" else None
        print(
            f"production Job: placed on {placed} {took:.1f}s after it was created; placeholder evictions on "
            f"worker-1: {evictions:g}; refused pods: worker-1 {w1.refused('urgent')}, "
            f"worker-2 {w2.refused('urgent')}; placeholder admitted and PodsReady again while the Job ran: "
            + (f"{back - sent:.1f}s after the Job was created" if back is not None else "not within 20 s")
        )
        # A race (Kueue's AllAtOnce: the first worker to admit wins): worker 2 admits at once, worker 1
        # only by preempting its placeholder, and on a loaded machine that can come first; then its
        # pod waits on GPUs the ghost holds (docs/reservation.md, the limit). Either way nothing else.
        assert placed in ("worker-1", "worker-2"), placed
        if placed == "worker-2":
            assert w2.refused("urgent") == [] and w1.refused("urgent") == []
        else:
            assert evictions >= 1 and w2.refused("urgent") == [], "worker 1 won only by preempting"
    finally:
        fleet.delete_job("urgent")
    gone = time.monotonic()
    again = wait_for(lambda: _reserved(w1), 60, "worker 1's placeholder admitted again")
    print(
        f"production Job gone: placeholder admitted {time.monotonic() - gone:.1f}s later, "
        f"replaced: {again['uid'] != first['uid']}"
    )


def test_a_higher_priority_job_with_worker_2_full_preempts_the_placeholder_and_pends(
    fleet: Fleet, controllers: dict[str, Controller]
) -> None:
    """The limit (docs/reservation.md): with no other worker to win, worker 1's copy of a
    production Job preempts the placeholder (priority 0, the lowest), the controller deletes the
    evicted placeholder (an owner-less Workload keeps its quota when evicted), and worker 1 admits
    the Job onto GPUs the ghost still holds: its pod is refused. Shown and measured."""
    w1, w2 = fleet.workers["worker-1"], fleet.workers["worker-2"]
    wait_for(lambda: _reserved(w1), 60, "worker 1's placeholder")
    evicted_before = controllers["worker-1"].metric(EVICTIONS, reason="InClusterQueue")
    w2.hold(True)  # worker 2 takes nothing: as if it were full
    try:
        sent = fleet.job("urgent-held", priority_class="production")
        wait_for(
            lambda: fleet.placed_on("urgent-held") == "worker-1", 60, "the production Job placed on worker 1"
        )
        took = time.monotonic() - sent
        wait_for(lambda: w1.refused("urgent-held"), 60, "worker 1's scheduler to refuse its pod")
        evictions = controllers["worker-1"].metric(EVICTIONS, reason="InClusterQueue") - evicted_before
        print(
            f"production Job, worker-2 held: placed on worker-1 {took:.1f}s after it was created, its pod "
            f"refused; placeholder evictions on worker-1: {evictions:g}; placeholders now: "
            f"{ {n: c.get('QuotaReserved') for n, c in w1.placeholders().items()} }"
        )
        assert evictions == 1
        assert not _reserved(w1), "the recreated placeholder waits behind the admitted Job"
    finally:
        fleet.delete_job("urgent-held")
        w2.hold(False)
    t0 = time.monotonic()
    wait_for(lambda: _reserved(w1), 60, "worker 1's placeholder admitted again")
    print(f"placeholder admitted again {time.monotonic() - t0:.1f}s after the production Job was gone")


def _restart_kueues(fleet: Fleet, gates: dict[str, bool]) -> list[float]:
    """Every cluster's Kueue restarted with these extra feature gates; waits until MultiKueue is
    connected again. Returns the seconds each restart took."""
    took = [c.dc.restart_kueue(feature_gates=gates) for c in (fleet.manager, *fleet.workers.values())]
    for w in WORKERS:
        wait_for(
            lambda w=w: _active(fleet.manager, "multikueueclusters", w), 90, f"MultiKueueCluster {w} Active"
        )
    wait_for(lambda: _active(fleet.manager, "clusterqueues", CQ), 60, "the manager's ClusterQueue Active")
    return took


def test_orchestrated_preemption_spares_the_placeholder_when_another_worker_has_room(
    fleet: Fleet, controllers: dict[str, Controller]
) -> None:
    """Kueue's MultiKueueOrchestratedPreemption gate (alpha from v0.17), passed on each Kueue's
    command line: the copies carry a preemption gate the manager opens one worker at a time, so a
    production Job that worker 2 admits without preempting leaves worker 1's placeholder alone."""
    w1 = fleet.workers["worker-1"]
    took = _restart_kueues(fleet, {"MultiKueueOrchestratedPreemption": True})
    try:
        first = wait_for(lambda: _reserved(w1), 60, "worker 1's placeholder")
        # The controller counts an eviction at the poll after it: the one of the test before is
        # counted before this test's baseline is read.
        controllers["worker-1"].wait_polls(2)
        evicted_before = controllers["worker-1"].metric(EVICTIONS, reason="InClusterQueue")
        sent = fleet.job("urgent-gated", priority_class="production")
        wait_for(lambda: fleet.placed_on("urgent-gated") is not None, 90, "the production Job placed")
        placed, after = fleet.placed_on("urgent-gated"), time.monotonic() - sent
        controllers["worker-1"].wait_polls(2)
        evictions = controllers["worker-1"].metric(EVICTIONS, reason="InClusterQueue") - evicted_before
        now = _reserved(w1)
        spared = now is not None and now["uid"] == first["uid"]
        if not spared:  # an eviction is counted at the poll after it
            controllers["worker-1"].wait_polls(2)
            evictions = controllers["worker-1"].metric(EVICTIONS, reason="InClusterQueue") - evicted_before
        print(
            f"orchestrated preemption (Kueue restarted in {max(took):.1f}s at most): placed on {placed} "
            f"{after:.1f}s after it was created; placeholder evictions on worker-1: {evictions:g}; "
            f"the same placeholder still admitted: {spared}"
        )
        # Measured, not asserted: the gate spared the placeholder in most runs, but on a loaded
        # machine worker 1's gate was opened too and it was evicted once (docs/reservation.md).
        assert placed == "worker-2"
        assert evictions <= 1, "at most one eviction"
        assert spared or evictions == 1, "a placeholder not admitted any more was evicted, and counted"
    finally:
        gone = time.monotonic()
        fleet.delete_job("urgent-gated")
        _restart_kueues(fleet, {})
    # After an eviction the placeholder created again can stay pending until the production Job is
    # gone (docs/reservation.md): it is checked once the Job is deleted.
    wait_for(lambda: _reserved(w1), 60, "worker 1's placeholder admitted after the Job was gone")
    print(
        f"placeholder admitted {time.monotonic() - gone:.1f}s after the production Job was deleted "
        "(Kueue restarted without the gate meanwhile)"
    )


def test_the_ghost_reclaimed_worker_1_admits_again_within_a_poll(
    fleet: Fleet, controllers: dict[str, Controller]
) -> None:
    w1, w2 = fleet.workers["worker-1"], fleet.workers["worker-2"]
    wait_for(lambda: _reserved(w1), 60, "worker 1's placeholder")
    w2.hold(True)  # only worker 1 can take it: the Job waits for its GPUs
    try:
        fleet.job("after")
        wait_for(
            lambda: w1.has_job("after") or w1.workloads("kueue.x-k8s.io/multikueue-origin"),
            60,
            "its copy on worker 1",
        )
        controllers["worker-1"].wait_polls(2)
        assert fleet.placed_on("after") is None, "it waits: worker 1's quota is reserved"
        # Reclaimed as the scale actuator does it: replicas 0, the pod gone.
        client.AppsV1Api(w1.dc.kube.api_client).patch_namespaced_deployment_scale(
            "ghost", NS, {"spec": {"replicas": 0}}
        )
        w1.core.delete_collection_namespaced_pod(NS, label_selector="app=ghost", grace_period_seconds=0)
        wait_for(
            lambda: not w1.core.list_namespaced_pod(NS, label_selector="app=ghost").items,
            60,
            "the ghost's pod gone",
        )
        gone, polls = time.monotonic(), controllers["worker-1"].polls()
        wait_for(lambda: fleet.placed_on("after") == "worker-1", 60, "the Job placed on worker 1")
        took, n = time.monotonic() - gone, controllers["worker-1"].polls() - polls
        print(f"ghost reclaimed: placed on worker-1 {took:.1f}s ({n} polls) after its pod was gone")
        assert n <= 2, f"placed {n} polls after the ghost's pod was gone"
        pods = wait_for(
            lambda: [p for p in w1.job_pods("after") if p.spec.node_name], 60, "its pod scheduled"
        )
        assert pods[0].spec.node_name == GPU_NODE and w1.refused("after") == []
        assert w1.placeholders() == {}
    finally:
        fleet.delete_job("after")
        w2.hold(False)
