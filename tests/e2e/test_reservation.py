"""controller.reservation on the real Kueue (hack/versions.env's release, and hack/test's pass over
KUEUE_EXTRA_VERSIONS): a live Deployment that bypassed Kueue holds 4 of a team's 8 H100s.

- Without reservation Kueue admits an 8-GPU Job whose pod then cannot be scheduled.
- With `reservation: enforce` the 8-GPU Job waits in Kueue (an Event on its Workload says why), a
  4-GPU Job is admitted and runs, and once the Deployment is reclaimed the 8-GPU Job is admitted
  within 2 polls; no admitted pod ever waits for the scheduler.
- Shadow mode writes nothing to Kueue and reports the same numbers.
- A controller killed mid-update leaves placeholders that the next one brings back to what is held.
- Two teams in a cohort: a reservation within A's quota leaves B nothing to borrow.
- Trimming nominalQuota instead (the other mechanism, docs/reservation.md) is measured too.

The devcluster's Kueue runs the rendered Configuration: waitForPodsReady with blockAdmission true,
so an admitted placeholder that never got PodsReady=True would block every admission here.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kueue_jobs import KUEUE, delete_job_now, workload_of
from proctables import FINISHED, LIVE
from reservation_config import reservation_section
from test_controller import LEASE_NS, Controller, deployment, wait_for

from ghostgpu.controller.books.reservation import Reservation, placeholder_object
from ghostgpu.devcluster import DevCluster, FakeDcgmClient, ProcessTables
from ghostgpu.devcluster.kube import Kube

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.kueue, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
POLL = 2  # seconds
NODE = "gpu-h100-0"  # 8 kwok H100s
H100_NODE = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "kubernetes.io/hostname": NODE}
QUEUE = "team-q"  # the LocalQueue whose ClusterQueue is the team's (controller.reservationQueue)
PLACEHOLDERS = "ghostgpu.io/reservation=true"


def config(tmp: Path, prometheus_url: str, reservation: str, mode: str = "enforce") -> Path:
    """The controller section alone: flavors are discovered from Kueue (the test's own)."""
    cfg = reservation_section(prometheus_url, queue=QUEUE, poll_s=POLL, reservation=reservation, mode=mode)
    path = tmp / f"controller-{reservation}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass
class Team:
    """One team: namespace (opted in, team label), ResourceFlavor on NODE, ClusterQueue of 8."""

    dc: DevCluster
    ns: str
    cq: str
    flavor: str

    @classmethod
    def create(
        cls, dc: DevCluster, ns: str, uid: str, quota: int = 8, preemption: dict[str, str] | None = None
    ) -> Team:
        """The team of namespace ns: a ResourceFlavor on NODE, a ClusterQueue of `quota` H100s that
        only ns may use, and the LocalQueue QUEUE pointing at it (removed by `remove`)."""
        t = cls(dc, ns, f"cq-{uid}", f"h100-{uid}")
        toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        cq_spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                {"name": t.flavor, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": quota}]}]}],
        }  # fmt: skip
        if preemption:
            cq_spec["preemption"] = preemption
        objs = [
            {"kind": "ResourceFlavor", "metadata": {"name": t.flavor},
             "spec": {"nodeLabels": H100_NODE, "tolerations": toleration}},
            {"kind": "ClusterQueue", "metadata": {"name": t.cq}, "spec": cq_spec},
            {"kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": ns},
             "spec": {"clusterQueue": t.cq}},
        ]  # fmt: skip
        for obj in objs:
            dc.kube.apply({"apiVersion": "/".join(KUEUE), **obj})
        return t

    def remove(self) -> None:
        """The team's placeholders, then its LocalQueue, ClusterQueue and ResourceFlavor."""
        kube, api = self.dc.kube, "/".join(KUEUE)
        for w in self.workloads(PLACEHOLDERS):
            kube.delete(api, "Workload", w["metadata"]["name"], self.ns)
        kube.delete(api, "LocalQueue", QUEUE, self.ns)
        kube.delete(api, "ClusterQueue", self.cq, None)
        kube.delete(api, "ResourceFlavor", self.flavor, None)

    @property
    def co(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.dc.kube.api_client)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.dc.kube.api_client)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.dc.kube.api_client)

    def job(self, name: str, gpus: int) -> None:
        self.dc.kube.apply({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": self.ns, "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
            "spec": {"parallelism": 1, "completions": 1, "suspend": True, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "train", "image": "trainer:latest",
                                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}},
        })  # fmt: skip

    def admitted(self, job: str) -> bool:
        return self.batch.read_namespaced_job(job, self.ns).spec.suspend is False

    def job_pods(self, job: str) -> list[Any]:
        return self.core.list_namespaced_pod(self.ns, label_selector=f"job-name={job}").items

    def workloads(self, selector: str | None = None, all_namespaces: bool = False) -> list[dict[str, Any]]:
        if all_namespaces:
            return self.co.list_cluster_custom_object(*KUEUE, "workloads", label_selector=selector or "")[
                "items"
            ]
        return self.co.list_namespaced_custom_object(
            *KUEUE, self.ns, "workloads", label_selector=selector or ""
        )["items"]

    def workload_of(self, job: str) -> dict[str, Any] | None:
        return workload_of(self.core.api_client, self.ns, job)

    def placeholders(self) -> dict[str, dict[str, str]]:
        """name -> {condition type: status} of every placeholder in the cluster."""
        return {
            w["metadata"]["name"]: {
                c["type"]: c["status"] for c in (w.get("status") or {}).get("conditions") or []
            }
            for w in self.workloads(PLACEHOLDERS, all_namespaces=True)
        }

    def cq_usage(self) -> float:
        st = self.co.get_cluster_custom_object(*KUEUE, "clusterqueues", self.cq).get("status") or {}
        return sum(
            float(r.get("total", 0)) for fu in st.get("flavorsUsage") or [] for r in fu.get("resources") or []
        )

    def failed_scheduling(self, job: str) -> list[str]:
        """The pods of `job` the scheduler refused at least once."""
        pods = {p.metadata.name for p in self.job_pods(job)}
        evs = self.core.list_namespaced_event(self.ns, field_selector="reason=FailedScheduling").items
        return sorted({e.involved_object.name for e in evs if e.involved_object.name in pods})

    def status(self, cfg: Path | None = None) -> dict[str, Any]:
        """`ghostgpu status --json` for this team's flavor (with the controller's config: the
        reservation queue is read from it)."""
        out = subprocess.run(
            [sys.executable, "-m", "ghostgpu.cli", "status", "--json",
             "--kubeconfig", str(self.dc.kubeconfig), *(["--config", str(cfg)] if cfg else [])],
            capture_output=True, text=True, check=True, cwd=REPO,
        )  # fmt: skip
        return next(a for a in json.loads(out.stdout) if a["flavor"] == self.flavor)

    def delete_job(self, name: str) -> None:
        delete_job_now(self.core.api_client, self.ns, name)


@pytest.fixture
def team(
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
) -> Iterator[tuple[Team, str]]:
    """The team and its live holder: Deployment x with 4 GPUs on NODE (busy), opted in."""
    kube = devcluster.kube
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    uid = uuid.uuid4().hex[:6]
    ns = make_namespace({}, prefix="team")
    t = Team.create(devcluster, ns, uid)
    dep = deployment("x", ns, gpus=4)
    dep["spec"]["template"]["spec"]["nodeSelector"] = H100_NODE
    kube.apply(dep)
    pod = wait_for(lambda: _running_pod(t, "x"), 90, "x running")
    process_tables.set(ns, pod, LIVE)
    dcgm.set(ns, pod, util=90.0)
    # Opted in, of a team, once it runs: a workload that bypassed Kueue.
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
        "ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": f"team-{uid}"}}})  # fmt: skip
    try:
        yield t, pod
    finally:
        process_tables.clear(ns, pod)
        for job in JOBS:
            with contextlib.suppress(client.ApiException):
                t.batch.delete_namespaced_job(job, ns, propagation_policy="Background")
        t.remove()


JOBS = ("big", "small", "big-unreserved")


@contextlib.contextmanager
def cohort_of_two(
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    *,
    holder_gpus: int,
    preemption: dict[str, Any] | None = None,
) -> Iterator[tuple[Team, Team, str]]:
    """Teams A and B, nominal 4 each, in one cohort over the same H100 flavor; A's live, busy
    Deployment x holds `holder_gpus`; both namespaces opted in. Yields (A, B, x's pod) and removes
    the Jobs, placeholders and Kueue objects afterwards (stop the controller first)."""
    kube = devcluster.kube
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    uid = uuid.uuid4().hex[:6]
    ns_a, ns_b = make_namespace({}, prefix="team-a"), make_namespace({}, prefix="team-b")
    flavor, cohort = f"h100-{uid}", f"pool-{uid}"
    a = Team(devcluster, ns_a, f"cq-a-{uid}", flavor)
    b = Team(devcluster, ns_b, f"cq-b-{uid}", flavor)
    toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

    def cq(t: Team) -> dict[str, Any]:
        return {"kind": "ClusterQueue", "metadata": {"name": t.cq}, "spec": {
            "cohortName": cohort,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": t.ns}},
            **(preemption or {}),
            "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                {"name": flavor, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]},
            ]}]}}  # fmt: skip

    objs = [
        {"kind": "ResourceFlavor", "metadata": {"name": flavor},
         "spec": {"nodeLabels": H100_NODE, "tolerations": toleration}},
        cq(a), cq(b),
        *({"kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": t.ns},
           "spec": {"clusterQueue": t.cq}} for t in (a, b)),
    ]  # fmt: skip
    for obj in objs:
        kube.apply({"apiVersion": "/".join(KUEUE), **obj})
    pod = ""
    try:
        dep = deployment("x", ns_a, gpus=holder_gpus)
        dep["spec"]["template"]["spec"]["nodeSelector"] = H100_NODE
        kube.apply(dep)
        pod = wait_for(lambda: _running_pod(a, "x"), 90, "x running")
        process_tables.set(ns_a, pod, LIVE)
        dcgm.set(ns_a, pod, util=90.0)
        for t in (a, b):
            kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": t.ns, "labels": {
                "ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": t.cq}}})  # fmt: skip
        yield a, b, pod
    finally:
        if pod:
            process_tables.clear(ns_a, pod)
        for t in (a, b):
            for job in JOBS:
                with contextlib.suppress(client.ApiException):
                    t.batch.delete_namespaced_job(job, t.ns, propagation_policy="Background")
        for w in a.workloads(PLACEHOLDERS):
            kube.delete("/".join(KUEUE), "Workload", w["metadata"]["name"], ns_a)
        kube.delete("apps/v1", "Deployment", "x", ns_a)
        for obj in reversed(objs):
            md = obj["metadata"]
            kube.delete("/".join(KUEUE), obj["kind"], md["name"], md.get("namespace"))


def _running_pod(t: Team, app: str) -> str | None:
    pods = t.core.list_namespaced_pod(t.ns, label_selector=f"app={app}").items
    running = [
        p.metadata.name for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    ]
    return running[0] if len(running) == 1 else None


def test_without_reservation_kueue_admits_what_cannot_be_scheduled(team: tuple[Team, str]) -> None:
    t, _ = team
    t.job("big-unreserved", 8)
    wait_for(lambda: t.admitted("big-unreserved"), 60, "Kueue admits the 8-GPU Job (quota 8, usage 0)")
    pods = wait_for(lambda: t.job_pods("big-unreserved"), 30, "its pod")
    wait_for(lambda: t.failed_scheduling("big-unreserved"), 30, "the scheduler to refuse its pod")
    time.sleep(3 * POLL)
    [p] = t.job_pods("big-unreserved")
    assert p.spec.node_name is None and p.status.phase == "Pending", "admitted, yet it cannot run"
    assert len(pods) == 1 and t.cq_usage() == 8
    st = t.status()
    assert st["heldOutsideKueue"] == 4 and st["kueueAdmitted"] == 8
    t.delete_job("big-unreserved")  # blockAdmission: its unready pod would block every admission


def test_enforce_reserves_held_gpus_and_releases_them_on_reclaim(
    team: tuple[Team, str],
    devcluster: DevCluster,
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    t, pod = team
    cfg = config(tmp_path, prometheus_url, "enforce")
    ctl = Controller(devcluster.kubeconfig, cfg, tmp_path, "enforce")
    try:
        seen = time.monotonic()
        ph = wait_for(
            lambda: [c for c in t.placeholders().values() if c.get("PodsReady") == "True"],
            60,
            "a ready placeholder",
        )
        print(f"placeholder admitted and ready {time.monotonic() - seen:.1f}s after the controller started")
        [name] = t.placeholders()
        assert name == "ghostgpu-reserve-deployment-x-" + t.flavor + "-4"
        assert ph[0]["Admitted"] == "True"
        wait_for(lambda: t.cq_usage() == 4, 30, "Kueue to count the 4 held GPUs")
        st = t.status(cfg)
        assert (st["heldOutsideKueue"], st["reservedOutsideKueue"], st["reservationDesired"]) == (4, 4, 4)
        assert st["kueueAdmitted"] == 4 and st["gap"] == 0
        assert ctl.metric("ghostgpu_reservation_gpus", cluster_queue=t.cq, mode="enforce") == 4
        assert ctl.metric("ghostgpu_reservation_admitted_gpus", cluster_queue=t.cq) == 4

        t.job("big", 8)
        wait_for(lambda: t.workload_of("big"), 30, "big's Workload")

        def told_why() -> list[str]:
            w = t.workload_of("big")
            evs = t.core.list_namespaced_event(
                t.ns, field_selector=f"involvedObject.name={w['metadata']['name']}"
            )
            return [e.message for e in evs.items if e.reason == "GPUsHeldOutsideKueue"]

        [why] = wait_for(told_why, 30, "the Event on the waiting Workload")
        assert f"4 nvidia.com/gpu held outside Kueue by deployment/x in {t.ns}" in why
        t.job("small", 4)
        wait_for(lambda: t.admitted("small"), 60, "the 4-GPU Job admitted")
        assert not t.admitted("big"), "the 8-GPU Job waits in Kueue"
        small = wait_for(lambda: [p for p in t.job_pods("small") if p.spec.node_name], 30, "small scheduled")
        assert small[0].spec.node_name == NODE
        wait_for(
            lambda: (t.batch.read_namespaced_job("small", t.ns).status.succeeded or 0) == 1, 60, "small ran"
        )
        time.sleep(2 * POLL)
        assert not t.admitted("big")

        # The Deployment goes idle and is reclaimed: the 8-GPU Job gets its GPUs within 2 polls.
        process_tables.set(t.ns, pod, FINISHED)
        dcgm.set(t.ns, pod, util=0.0)
        wait_for(lambda: not _pods_of_x(t), 120, "x reclaimed and its pod gone")
        gone_at, polls_at = time.monotonic(), ctl.polls()
        wait_for(lambda: t.admitted("big"), 30, "the 8-GPU Job admitted")
        took, polls = time.monotonic() - gone_at, ctl.polls() - polls_at
        print(f"8-GPU Job admitted {took:.1f}s ({polls} polls) after the reclaimed pod was gone")
        assert polls <= 2, f"admitted {polls} polls after the holder was gone"
        big = wait_for(lambda: [p for p in t.job_pods("big") if p.spec.node_name], 30, "big scheduled")
        assert big[0].spec.node_name == NODE
        assert t.placeholders() == {}
        # Over the whole scenario no admitted pod waited for the scheduler.
        assert t.failed_scheduling("big") == [] and t.failed_scheduling("small") == []
    finally:
        ctl.stop()


def _pods_of_x(t: Team) -> list[Any]:
    return t.core.list_namespaced_pod(t.ns, label_selector="app=x").items


def _remove_x(t: Team, kube: Kube, timeout: float = 60) -> None:
    """Deletes Deployment x with its ReplicaSet and pods now, and waits until no pod of x is left.
    The tests need x's GPUs free, not a measure of how soon the garbage collector of a loaded
    machine gets to a deleted Deployment's pods (it took over 60 s in CI)."""
    kube.delete("apps/v1", "Deployment", "x", t.ns)
    client.AppsV1Api(kube.api_client).delete_collection_namespaced_replica_set(t.ns, label_selector="app=x")
    t.core.delete_collection_namespaced_pod(t.ns, label_selector="app=x", grace_period_seconds=0)
    wait_for(lambda: not _pods_of_x(t), timeout, "x gone")


def test_shadow_writes_nothing_to_kueue_and_reports_the_same_numbers(
    team: tuple[Team, str], devcluster: DevCluster, prometheus_url: str, tmp_path: Path
) -> None:
    t, _ = team
    before = {w["metadata"]["name"] for w in t.workloads(all_namespaces=True)}
    cfg = config(tmp_path, prometheus_url, "shadow", mode="shadow")
    ctl = Controller(devcluster.kubeconfig, cfg, tmp_path, "shadow")
    try:
        ctl.wait_polls(3)
        assert ctl.metric("ghostgpu_reservation_gpus", cluster_queue=t.cq, mode="shadow") == 4
        assert ctl.metric("ghostgpu_reservation_admitted_gpus", cluster_queue=t.cq) == 0
        assert t.placeholders() == {}
        assert {w["metadata"]["name"] for w in t.workloads(all_namespaces=True)} == before
        st = t.status(cfg)
        assert (st["heldOutsideKueue"], st["reservationDesired"], st["reservedOutsideKueue"]) == (4, 4, 0)
        assert st["gap"] == 4  # shadow closes nothing
        assert t.cq_usage() == 0
    finally:
        ctl.stop()


def test_controller_killed_mid_update_leaves_nothing_behind(
    team: tuple[Team, str], devcluster: DevCluster, prometheus_url: str, tmp_path: Path
) -> None:
    t, _ = team
    cfg = config(tmp_path, prometheus_url, "enforce")
    first = Controller(devcluster.kubeconfig, cfg, tmp_path, "first")
    second: Controller | None = None
    try:
        wait_for(lambda: list(t.placeholders().values()) and all(
            c.get("PodsReady") == "True" for c in t.placeholders().values()), 60, "x reserved")  # fmt: skip
        first.stop(signal.SIGKILL)
        # Meanwhile: x is deleted, y (2 GPUs) starts; and the killed leader had created, but not yet
        # marked ready, a placeholder for a count that is no longer held (a half-done update).
        _remove_x(t, devcluster.kube)
        dep = deployment("y", t.ns, gpus=2)
        dep["spec"]["template"]["spec"]["nodeSelector"] = H100_NODE
        devcluster.kube.apply(dep)
        wait_for(lambda: _running_pod(t, "y"), 90, "y running")
        half_done = Reservation(t.ns, "deployment/x", t.flavor, "nvidia.com/gpu", 3, t.cq, QUEUE, "")
        stray = placeholder_object(half_done, H100_NODE)
        devcluster.kube.apply(stray)
        assert len(t.placeholders()) == 2
        second = Controller(devcluster.kubeconfig, cfg, tmp_path, "second")
        want = {"ghostgpu-reserve-deployment-y-" + t.flavor + "-2"}
        wait_for(lambda: set(t.placeholders()) == want, 60, "placeholders == what is held")
        wait_for(lambda: t.placeholders()[next(iter(want))].get("PodsReady") == "True", 30, "y's ready")
        wait_for(lambda: t.cq_usage() == 2, 30, "Kueue counts exactly the 2 held GPUs")
        second.wait_polls(2)
        assert set(t.placeholders()) == want and t.cq_usage() == 2
        st = t.status(cfg)
        assert (st["heldOutsideKueue"], st["reservedOutsideKueue"], st["gap"]) == (2, 2, 0)
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_trimming_nominal_quota_instead(team: tuple[Team, str], devcluster: DevCluster) -> None:
    """The other mechanism, measured: lowering the ClusterQueue's nominalQuota by what is held.
    Kueue then admits only what fits the trimmed quota; it works, but every change of what is held
    is a write to a field GitOps owns (docs/reservation.md)."""
    t, _ = team

    def set_quota(n: int) -> None:
        patch = {"spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": t.flavor, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": n}]}]}]}}  # fmt: skip
        t.co.patch_cluster_custom_object(*KUEUE, "clusterqueues", t.cq, patch)

    set_quota(4)  # 8 - the 4 that x holds
    t.job("big", 8)
    wait_for(lambda: t.workload_of("big"), 30, "big's Workload")
    t.job("small", 4)
    wait_for(lambda: t.admitted("small"), 60, "a Job that fits the trimmed quota")
    time.sleep(3 * POLL)
    assert not t.admitted("big"), "8 > the trimmed quota: it waits"
    _remove_x(t, devcluster.kube)
    restored = time.monotonic()
    set_quota(8)
    wait_for(lambda: t.admitted("big"), 60, "big admitted once the quota is back")
    print(
        f"trimmed quota: 8-GPU Job admitted {time.monotonic() - restored:.1f}s after the quota was restored"
    )
    wait_for(lambda: [p for p in t.job_pods("big") if p.spec.node_name], 30, "big scheduled")
    assert t.failed_scheduling("big") == []


def test_cohort_borrowing_counts_the_reservation(
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    """Two teams of 4 in one cohort over the same 8 GPUs; team A's live Deployment holds 4. Without
    reservation team B borrows A's idle-looking quota for an 8-GPU Job that cannot be scheduled; with
    it A's quota is in use, so B can borrow nothing and only its 4-GPU Job is admitted (and runs)."""
    with cohort_of_two(devcluster, make_namespace, process_tables, dcgm, holder_gpus=4) as (a, b, _):
        ctl: Controller | None = None
        try:
            b.job("big-unreserved", 8)
            wait_for(lambda: b.admitted("big-unreserved"), 60, "B borrows A's 4 for an 8-GPU Job")
            wait_for(lambda: b.failed_scheduling("big-unreserved"), 30, "its pod cannot be scheduled")
            b.delete_job("big-unreserved")

            cfg = config(tmp_path, prometheus_url, "enforce")
            ctl = Controller(devcluster.kubeconfig, cfg, tmp_path, "cohort")

            def reserved() -> bool:
                ready = all(c.get("PodsReady") == "True" for c in a.placeholders().values())
                return a.cq_usage() == 4 and ready

            wait_for(reserved, 60, "A's 4 held GPUs reserved")
            b.job("big", 8)
            b.job("small", 4)
            wait_for(lambda: b.admitted("small"), 60, "B's 4-GPU Job admitted on its own quota")
            wait_for(lambda: [p for p in b.job_pods("small") if p.spec.node_name], 30, "small scheduled")
            ctl.wait_polls(2)
            assert not b.admitted("big"), "nothing left to borrow: the 8-GPU Job waits"
            assert b.failed_scheduling("small") == [] and b.failed_scheduling("big") == []
            assert a.cq_usage() == 4  # the placeholder was not preempted or counted twice
        finally:
            if ctl is not None:
                ctl.stop()
