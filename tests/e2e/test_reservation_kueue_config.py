"""controller.reservation under the Kueue settings that act on an admitted Workload, on the real
Kueue (hack/versions.env's release and hack/test's pass over KUEUE_EXTRA_VERSIONS): waitForPodsReady
with blockAdmission true and false (a 15 s timeout, so that it fires within the test), cohort
reclaim (`reclaimWithinCohort: Any`) with fair sharing on and off.

Kueue reads its Configuration only at start, so each variant restarts the devcluster's Kueue manager
with overrides of the rendered Configuration (DevCluster.restart_kueue, a few seconds, instead of a
cluster per variant); the Configuration the cluster started with is restored at the end.

Per variant:
- PodsReady: a placeholder nobody marks ready is evicted at the timeout and keeps its quota (what an
  owner-less Workload does); the controller announces, counts, replaces it; its own placeholders
  are marked ready and never evicted, an 8-GPU Job waits while a 4-GPU Job is admitted and runs, and
  the 8-GPU Job is admitted within 2 polls once the holder is gone: no admission is stuck.
- Preemption: a placeholder that reserves more than its team's nominal quota runs on quota borrowed
  in the cohort; the lender's Job reclaims it. The controller counts and announces the eviction and
  re-establishes the reservation (it is admitted again as soon as the lender's Job is gone), never
  two placeholders for one holder. Meanwhile the lender's Job is admitted onto GPUs that the holder
  still uses (measured: its pod cannot be scheduled) -- the window docs/reservation.md discusses.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from proctables import LIVE
from test_controller import Controller, deployment, wait_for
from test_reservation import (  # noqa: F401  (team: a fixture)
    H100_NODE,
    KUEUE,
    PLACEHOLDERS,
    POLL,
    QUEUE,
    Team,
    _remove_x,
    _running_pod,
    cohort_of_two,
    config,
    team,
)

from ghostgpu.controller.books.reservation import Reservation, placeholder_object
from ghostgpu.devcluster import DevCluster, FakeDcgmClient, ProcessTables

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.kueue, pytest.mark.timeout(600)]

TIMEOUT_S = 15  # waitForPodsReady.timeout of every variant
VARIANTS = {
    "blockAdmission-true+fairSharing": {
        "waitForPodsReady": {"timeout": f"{TIMEOUT_S}s", "blockAdmission": True}
    },
    # fairSharing removed: Kueue's classic preemption (no fairSharing section = off).
    "blockAdmission-false+classic": {
        "waitForPodsReady": {"timeout": f"{TIMEOUT_S}s", "blockAdmission": False},
        "fairSharing": None,
    },
}
EVICTIONS = "ghostgpu_reservation_evictions_total"


@pytest.fixture(scope="module")
def restore_kueue(devcluster: DevCluster) -> Iterator[None]:
    """At the end of the module: the Configuration the cluster started with, for the tests after."""
    yield
    took = devcluster.restart_kueue(None)
    print(f"Kueue restarted with its original Configuration in {took:.1f}s")


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def kueue_variant(request: pytest.FixtureRequest, devcluster: DevCluster, restore_kueue: None) -> str:
    took = devcluster.restart_kueue(VARIANTS[request.param])
    print(f"Kueue restarted ({request.param}) in {took:.1f}s")
    return str(request.param)


def conditions(w: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (w.get("status") or {}).get("conditions") or []}


def evicted_for_timeout(t: Team) -> list[str]:
    """Workloads (any, in the team's namespace) that Kueue evicted for the PodsReady timeout."""
    return sorted(
        w["metadata"]["name"]
        for w in t.workloads()
        if conditions(w).get("Evicted", {}).get("status") == "True"
        and conditions(w)["Evicted"].get("reason") == "PodsReadyTimeout"
    )


def events(t: Team, reason: str) -> list[Any]:
    return t.core.list_namespaced_event(t.ns, field_selector=f"reason={reason}").items


def test_pods_ready_timeout_never_evicts_a_placeholder_and_no_admission_is_stuck(
    kueue_variant: str,
    team: tuple[Team, str],  # noqa: F811
    devcluster: DevCluster,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    t, _ = team
    # 1. A placeholder that nobody marks ready (no controller runs yet): what Kueue does with it.
    unready = Reservation(t.ns, "deployment/x", t.flavor, "nvidia.com/gpu", 4, t.cq, QUEUE, "")
    devcluster.kube.apply(placeholder_object(unready, H100_NODE))
    wait_for(lambda: conditions(t.workloads(PLACEHOLDERS)[0]).get("Admitted", {}).get("status") == "True",
             60, "the unready placeholder admitted")  # fmt: skip
    admitted_at = time.monotonic()
    wait_for(lambda: evicted_for_timeout(t), TIMEOUT_S + 45, "Kueue to evict it at the PodsReady timeout")
    print(
        f"[{kueue_variant}] unready placeholder evicted {time.monotonic() - admitted_at:.1f}s after admission"
    )
    [old] = t.workloads(PLACEHOLDERS)
    time.sleep(2)
    [old] = t.workloads(PLACEHOLDERS)
    old_conds = conditions(old)
    kept = old_conds.get("QuotaReserved", {}).get("status") == "True" and t.cq_usage() == 4
    print(f"[{kueue_variant}] evicted, unready placeholder keeps its quota: {kept} (usage {t.cq_usage()})")
    assert kept, "an owner-less Workload keeps its quota when evicted: nothing stops its job"

    # 2. The controller: announces and counts the eviction, replaces the placeholder, marks it ready.
    cfg = config(tmp_path, prometheus_url, "enforce")
    ctl = Controller(devcluster.kubeconfig, cfg, tmp_path, f"pods-ready-{kueue_variant}")
    try:
        started = time.monotonic()

        def replaced_and_ready() -> dict[str, Any] | None:
            ws = t.workloads(PLACEHOLDERS)
            if len(ws) == 1 and ws[0]["metadata"]["uid"] != old["metadata"]["uid"]:
                c = conditions(ws[0])
                if (
                    c.get("PodsReady", {}).get("status") == "True"
                    and c.get("Admitted", {}).get("status") == "True"
                ):
                    return ws[0]
            return None

        new = wait_for(replaced_and_ready, 60, "the evicted placeholder replaced, admitted and ready")
        print(f"[{kueue_variant}] replaced, admitted and ready {time.monotonic() - started:.1f}s after start")
        assert new["metadata"]["name"] == old["metadata"]["name"]
        assert ctl.metric(EVICTIONS, cluster_queue=t.cq, reason="PodsReadyTimeout") == 1
        [ev] = [e for e in events(t, "ReservationEvicted") if e.involved_object.uid == old["metadata"]["uid"]]
        assert "4 nvidia.com/gpu held outside Kueue by deployment/x: PodsReadyTimeout" in ev.message
        new_admitted = time.monotonic()
        wait_for(lambda: t.cq_usage() == 4, 30, "Kueue to count the 4 held GPUs once")

        # 3. The 8-GPU Job waits, the 4-GPU Job is admitted (its pod becomes ready) and runs.
        t.job("big", 8)
        t.job("small", 4)
        wait_for(lambda: t.admitted("small"), 60, "the 4-GPU Job admitted")
        wait_for(
            lambda: (t.batch.read_namespaced_job("small", t.ns).status.succeeded or 0) == 1, 60, "small ran"
        )
        # 4. Past the timeout since the controller's placeholder was admitted: never evicted.
        remaining = TIMEOUT_S + 2 * POLL + 3 - (time.monotonic() - new_admitted)
        if remaining > 0:
            time.sleep(remaining)
        [now] = t.workloads(PLACEHOLDERS)
        assert now["metadata"]["uid"] == new["metadata"]["uid"]
        assert conditions(now).get("Evicted", {}).get("status") != "True"
        assert ctl.metric(EVICTIONS) == 1  # the hand-made one only
        assert not t.admitted("big"), "the 8-GPU Job waits in Kueue"
        assert evicted_for_timeout(t) == []  # nothing is evicted for PodsReady: no admission is stuck
        assert t.cq_usage() == 4

        # 5. The holder goes: the 8-GPU Job is admitted within 2 polls and is scheduled.
        _remove_x(t, devcluster.kube)
        gone_at, polls_at = time.monotonic(), ctl.polls()
        wait_for(lambda: t.admitted("big"), 30, "the 8-GPU Job admitted")
        polls = ctl.polls() - polls_at
        print(
            f"[{kueue_variant}] big admitted {time.monotonic() - gone_at:.1f}s ({polls} polls) after x went"
        )
        assert polls <= 2
        wait_for(lambda: [p for p in t.job_pods("big") if p.spec.node_name], 30, "big scheduled")
        assert t.failed_scheduling("big") == [] and t.failed_scheduling("small") == []
        assert evicted_for_timeout(t) == [] and t.placeholders() == {}
    finally:
        ctl.stop()


def test_a_placeholder_preempted_by_a_cohort_reclaim_is_counted_announced_and_re_established(
    kueue_variant: str,
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    process_tables: ProcessTables,
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    """Teams A and B of nominal 4 each in one cohort over 8 GPUs, reclaimWithinCohort Any, fair
    sharing weights 1 (used when the variant has fair sharing on). A's live Deployment holds 6: its
    placeholder borrows 2 of B's quota. B's 4-GPU Job reclaims them."""
    preemption = {"preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority",
                                 "borrowWithinCohort": {"policy": "Never"}},
                  "fairSharing": {"weight": "1"}}  # fmt: skip
    with cohort_of_two(
        devcluster, make_namespace, process_tables, dcgm, holder_gpus=6, preemption=preemption
    ) as (a, b, _):
        ctl: Controller | None = None
        try:
            cfg = config(tmp_path, prometheus_url, "enforce")
            ctl = Controller(devcluster.kubeconfig, cfg, tmp_path, f"reclaim-{kueue_variant}")

            def reserved() -> str | None:
                ws = a.workloads(PLACEHOLDERS)
                ok = len(ws) == 1 and all(
                    conditions(ws[0]).get(c, {}).get("status") == "True" for c in ("Admitted", "PodsReady")
                )
                return ws[0]["metadata"]["uid"] if ok and a.cq_usage() == 6 else None

            first = wait_for(reserved, 60, "A's 6 held GPUs reserved (2 of them borrowed from B)")
            borrowed = "ghostgpu_reservation_borrowed_gpus"
            wait_for(lambda: ctl is not None and ctl.metric(borrowed, cluster_queue=a.cq) == 2, 30,
                     "the 2 borrowed GPUs of the reservation reported")  # fmt: skip

            # B reclaims its lent quota: Kueue preempts the placeholder.
            seen: list[tuple[int, float]] = []  # (placeholders of x, A's usage) over the reclaim
            b.job("big", 4)
            submitted = time.monotonic()

            def evicted_counted() -> bool:
                seen.append((len(a.workloads(PLACEHOLDERS)), a.cq_usage()))
                return ctl is not None and ctl.metric(EVICTIONS, cluster_queue=a.cq) == 1

            wait_for(evicted_counted, 60, "the preempted placeholder counted")
            print(f"[{kueue_variant}] preempted, counted {time.monotonic() - submitted:.1f}s after B's Job")
            reasons = [
                line
                for line in ctl.metrics().splitlines()
                if line.startswith(EVICTIONS + "{") and a.cq in line
            ]
            print(f"[{kueue_variant}] {reasons}")
            # Measured: InCohortReclamation with fair sharing on too (B reclaims within its nominal quota).
            expected = "InCohortReclamation"
            assert ctl.metric(EVICTIONS, cluster_queue=a.cq, reason=expected) == 1
            ev = wait_for(
                lambda: [e for e in events(a, "ReservationEvicted") if e.involved_object.uid == first],
                30,
                "the Event on the preempted placeholder",
            )
            assert "6 nvidia.com/gpu held outside Kueue by deployment/x: " + expected in ev[0].message
            wait_for(lambda: b.admitted("big"), 60, "B's Job admitted on its reclaimed quota")
            print(f"[{kueue_variant}] B's Job admitted {time.monotonic() - submitted:.1f}s after creation")

            def replaced_pending() -> bool:
                seen.append((len(a.workloads(PLACEHOLDERS)), a.cq_usage()))
                ws = a.workloads(PLACEHOLDERS)
                return len(ws) == 1 and ws[0]["metadata"]["uid"] != first

            wait_for(replaced_pending, 30, "the placeholder created again")
            # The window: B's Job was admitted onto GPUs that x still uses.
            refused = wait_for(lambda: b.failed_scheduling("big"), 30, "B's pod refused by the scheduler")
            window = bool(refused)
            print(f"[{kueue_variant}] B's admitted pod cannot be scheduled while x holds 6: {window}")
            ctl.wait_polls(2)
            [again] = a.workloads(PLACEHOLDERS)
            admitted = conditions(again).get("Admitted", {}).get("status")
            assert admitted != "True", "no quota left for it: it waits"
            assert conditions(again).get("QuotaReserved", {}).get("status") != "True"

            # The lender's Job goes: the reservation is admitted again, once.
            b.delete_job("big")
            gone = time.monotonic()

            def re_established() -> bool:
                seen.append((len(a.workloads(PLACEHOLDERS)), a.cq_usage()))
                return reserved() is not None

            wait_for(re_established, 60, "the reservation admitted again")
            print(f"[{kueue_variant}] re-established {time.monotonic() - gone:.1f}s after B's Job went")
            ctl.wait_polls(2)
            assert reserved() is not None and a.cq_usage() == 6
            assert ctl.metric(EVICTIONS, cluster_queue=a.cq) == 1  # one eviction, counted once
            assert ctl.metric(borrowed, cluster_queue=a.cq) == 2
            # Never two placeholders for x, never more than the 6 held counted.
            assert max(n for n, _ in seen) == 1 and max(u for _, u in seen) <= 6
        finally:
            if ctl is not None:
                ctl.stop()


# A measurement behind a design choice, not a compatibility check: the newest Kueue only.
@pytest.mark.newest_kueue_only
def test_a_higher_priority_placeholder_would_preempt_its_own_teams_running_work(
    devcluster: DevCluster, make_namespace: Callable[..., str], process_tables: ProcessTables
) -> None:
    """Why placeholders keep the default priority (docs/reservation.md): a Kueue-managed serving
    Deployment of 4 fills its team's ClusterQueue of 4 (withinClusterQueue: LowerPriority, as in the
    example bundle); a placeholder for 2 GPUs held outside Kueue does not fit. At the default
    priority it waits and nothing is touched; at a higher priority -- what would make a placeholder
    immune to a lower-priority reclaim -- Kueue preempts the running Deployment's pod: live work
    killed to fix the books."""
    kube = devcluster.kube
    ns = make_namespace({}, prefix="team")
    t = Team.create(
        devcluster, ns, uuid.uuid4().hex[:6], quota=4, preemption={"withinClusterQueue": "LowerPriority"}
    )
    try:
        serve = deployment("serve", ns, gpus=4)
        serve["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = QUEUE
        serve["spec"]["template"]["spec"]["nodeSelector"] = H100_NODE
        kube.apply(serve)
        pod = wait_for(lambda: _running_pod(t, "serve"), 90, "the Kueue-managed Deployment running")
        process_tables.set(ns, pod, LIVE)

        def serve_preempted() -> list[str]:
            return [
                w["metadata"]["name"]
                for w in t.workloads()
                if w["metadata"].get("labels", {}).get("ghostgpu.io/reservation") != "true"
                and conditions(w).get("Evicted", {}).get("status") == "True"
            ]

        for priority in (None, 1000):
            held = Reservation(ns, "deployment/x", t.flavor, "nvidia.com/gpu", 2, t.cq, QUEUE, "")
            ph = placeholder_object(held, H100_NODE)
            if priority is not None:
                ph["spec"]["priority"] = priority
            kube.apply(ph)
            if priority is None:
                time.sleep(3 * POLL)
                [w] = t.workloads(PLACEHOLDERS)
                assert conditions(w).get("QuotaReserved", {}).get("status") != "True", (
                    "it does not fit: it waits"
                )
                assert serve_preempted() == [] and _running_pod(t, "serve") == pod
                print("default-priority placeholder: waits, the running Deployment is untouched")
                kube.delete("/".join(KUEUE), "Workload", ph["metadata"]["name"], ns)
                wait_for(lambda: not t.workloads(PLACEHOLDERS), 30, "the placeholder gone")
            else:

                def outcome() -> str | None:
                    [w] = t.workloads(PLACEHOLDERS)
                    if conditions(w).get("QuotaReserved", {}).get("status") == "True":
                        return "placeholder admitted"
                    return "serve preempted" if serve_preempted() or _running_pod(t, "serve") != pod else None

                got = wait_for(outcome, 45, "Kueue to make room for the priority-1000 placeholder")
                [w] = t.workloads(PLACEHOLDERS)
                reasons = {k: c.get("reason") for k, c in conditions(w).items()}
                running = _running_pod(t, "serve") == pod
                print(f"priority-{priority} placeholder (spec.priority {w['spec'].get('priority')}): {got}; "
                      f"serve's pod running: {running}; its conditions: {reasons}")  # fmt: skip
                wait_for(lambda: _running_pod(t, "serve") != pod, 30, "the running serving pod stopped")
        process_tables.clear(ns, pod)
    finally:
        with contextlib.suppress(client.ApiException):
            kube.delete("apps/v1", "Deployment", "serve", ns)
        t.remove()
