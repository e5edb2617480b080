"""controller.reservation without a cluster: what is reserved for which holder in which
ClusterQueue (the pure part), how desired and existing placeholders are reconciled, and the writes
the reconcile sends (to a recording fake of kr8s's call_api)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from ghostgpu.config import ControllerConfig, load_default_config
from ghostgpu.controller.books.accounting import FlavorSpec
from ghostgpu.controller.books.placeholders import ReservationMetrics, Reservations
from ghostgpu.controller.books.reservation import (
    FLAVOR_ANNOTATION,
    HOLDER_ANNOTATION,
    RESERVATION_LABEL,
    Placeholder,
    Reservation,
    admitted_by_flavor,
    borrowed_reservations,
    cq_flavors,
    desired_reservations,
    placeholder_name,
    placeholder_object,
    plan_changes,
    queues_of,
    waiting_messages,
)
from ghostgpu.controller.inventory import gpu_predicate, pod_view, pods_by_workload, workload_from

IS_GPU = gpu_predicate(["nvidia.com/gpu"])
H100 = FlavorSpec("h100", "nvidia.com/gpu", {"gpu": "h100"})
H100_TAS = FlavorSpec("h100-tas", "nvidia.com/gpu", {"gpu": "h100"})  # same nodes, another flavor
A100 = FlavorSpec("a100", "nvidia.com/gpu", {"gpu": "a100"})
FLAVORS = [H100, H100_TAS, A100]
NODES = [
    {
        "metadata": {"name": "n-h100", "labels": {"gpu": "h100"}},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    },
    {
        "metadata": {"name": "n-a100", "labels": {"gpu": "a100"}},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    },
]
OPTED = {"ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": "vision"}


def deployment(name: str, ns: str = "ns-a", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                     "labels": {"ghostgpu.io/tracked": "true", **(labels or {})}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"spec": {"containers": [{"name": "c"}]}}},
    }  # fmt: skip


def pod(
    owner: str,
    i: int = 0,
    *,
    ns: str = "ns-a",
    gpus: str = "4",
    node: str | None = "n-h100",
    phase: str = "Running",
    deleting: bool = False,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"{owner}-abc-{i}",
        "namespace": ns,
        "uid": f"{owner}-{i}",
        "labels": {"app": owner, "pod-template-hash": "abc", **(labels or {})},
        "ownerReferences": [{"kind": "ReplicaSet", "name": f"{owner}-abc", "controller": True}],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def cq(name: str, *flavors: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": f, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]} for f in flavors]}]},
    }  # fmt: skip


def lq(ns: str, name: str, cluster_queue: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"clusterQueue": cluster_queue}}


def desired(
    deps: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    *,
    namespaces: dict[str, dict[str, str]] | None = None,
    cqs: list[dict[str, Any]] | None = None,
    lqs: list[dict[str, Any]] | None = None,
) -> list[Reservation]:
    workloads = {w.ref: w for w in (workload_from("Deployment", d, IS_GPU) for d in deps)}
    views = [pod_view(p, IS_GPU) for p in pods]
    return desired_reservations(
        FLAVORS,
        namespaces if namespaces is not None else {"ns-a": OPTED},
        workloads,
        pods_by_workload(workloads, views),
        NODES,
        queues_of(lqs if lqs is not None else [lq("ns-a", "default", "cq-vision")], "default"),
        cq_flavors(cqs if cqs is not None else [cq("cq-vision", "h100", "a100")]),
        local_queue="default",
    )


def test_a_live_holder_is_reserved_in_its_teams_cluster_queue_on_its_flavor() -> None:
    [r] = desired([deployment("x")], [pod("x", 0), pod("x", 1, gpus="2")])
    assert (r.namespace, r.holder, r.flavor, r.gpus, r.cluster_queue, r.team) == (
        "ns-a", "deployment/x", "h100", 6, "cq-vision", "vision"
    )  # fmt: skip
    assert r.name == "ghostgpu-reserve-deployment-x-h100-6"


def test_pods_on_two_flavors_make_two_reservations() -> None:
    got = desired([deployment("x")], [pod("x", 0), pod("x", 1, node="n-a100", gpus="1")])
    assert [(r.flavor, r.gpus) for r in got] == [("a100", 1), ("h100", 4)]


@pytest.mark.parametrize(
    "why,the_pod",
    [
        ("not scheduled: holds nothing", pod("x", node=None, phase="Pending")),
        ("finished", pod("x", phase="Succeeded")),
        ("failed", pod("x", phase="Failed")),
        ("Kueue's own pod: counted by Kueue", pod("x", labels={"kueue.x-k8s.io/managed": "true"})),
        ("defaulted into a queue by Kueue", pod("x", labels={"kueue.x-k8s.io/queue-name": "default"})),
    ],
)
def test_what_holds_no_gpu_outside_kueue_is_not_reserved(why: str, the_pod: dict[str, Any]) -> None:
    assert desired([deployment("x")], [the_pod]) == [], why


def test_a_workload_kueue_defaulted_into_a_queue_is_not_counted_twice() -> None:
    dep = deployment("x", labels={"kueue.x-k8s.io/queue-name": "default"})
    assert desired([dep], [pod("x")]) == []


def test_a_terminating_pod_stays_reserved_until_it_is_gone() -> None:
    # The scheduler counts it until it is gone: releasing earlier lets Kueue admit unschedulable pods.
    [r] = desired([deployment("x")], [pod("x", deleting=True)])
    assert r.gpus == 4
    assert desired([deployment("x")], []) == []


@pytest.mark.parametrize(
    "namespaces,lqs",
    [
        ({"ns-a": {"ghostgpu.io/team": "vision"}}, None),  # not opted in
        ({"ns-a": {"ghostgpu.io/reclaim": "enabled"}}, None),  # no team
        ({}, None),  # namespace unknown
        (None, [lq("ns-a", "other", "cq-vision")]),  # no LocalQueue of that name
        (None, [lq("ns-b", "default", "cq-vision")]),  # the team's queue is in another namespace
    ],
)
def test_only_opted_in_team_namespaces_with_the_queue_reserve(
    namespaces: dict[str, dict[str, str]] | None, lqs: list[dict[str, Any]] | None
) -> None:
    assert desired([deployment("x")], [pod("x")], namespaces=namespaces, lqs=lqs) == []


def test_gpus_outside_the_cluster_queues_flavors_are_not_its_to_reserve() -> None:
    assert desired([deployment("x")], [pod("x")], cqs=[cq("cq-vision", "a100")]) == []


def test_a_node_of_two_flavors_counts_once_on_the_cluster_queues_flavor() -> None:
    # n-h100 backs h100 and h100-tas; the ClusterQueue has only h100-tas: counted there, once.
    [r] = desired([deployment("x")], [pod("x")], cqs=[cq("cq-vision", "h100-tas")])
    assert (r.flavor, r.gpus) == ("h100-tas", 4)


def test_fractional_requests_round_up() -> None:
    [r] = desired([deployment("x")], [pod("x", 0, gpus="500m")])
    assert r.gpus == 1


def test_names_are_deterministic_valid_and_change_with_the_count() -> None:
    assert placeholder_name("deployment/x", "h100", 4) == placeholder_name("deployment/x", "h100", 4)
    assert placeholder_name("deployment/x", "h100", 4) != placeholder_name("deployment/x", "h100", 3)
    long = placeholder_name("statefulset/" + "n" * 250, "h100", 4)
    assert len(long) <= 253 and long.startswith("ghostgpu-reserve-statefulset-n")
    assert long != placeholder_name("statefulset/" + "n" * 251, "h100", 4)
    assert placeholder_name("pod/A.b", "h100", 1) != placeholder_name("pod/a-b", "h100", 1)


def res(holder: str = "deployment/x", gpus: int = 4, ns: str = "ns-a", flavor: str = "h100") -> Reservation:
    return Reservation(ns, holder, flavor, "nvidia.com/gpu", gpus, "cq-vision", "default", "vision")


def placeholder(r: Reservation, *, admitted: bool = True, ready: bool = False) -> Placeholder:
    obj = placeholder_object(r, {"gpu": "h100"})
    conds = [{"type": "Admitted", "status": "True" if admitted else "False"}]
    if ready:
        conds.append({"type": "PodsReady", "status": "True"})
    obj["status"] = {"conditions": conds, "admission": {"clusterQueue": r.cluster_queue} if admitted else {}}
    return Placeholder.from_object(obj)


def test_the_placeholder_object_is_ownerless_queued_and_never_an_orphan_to_kueue() -> None:
    obj = placeholder_object(res(), {"gpu": "h100"})
    md = obj["metadata"]
    assert "ownerReferences" not in md
    assert "kueue.x-k8s.io/job-uid" not in md["labels"]  # Kueue v0.18+ would finish it
    assert md["labels"][RESERVATION_LABEL] == "true"
    assert (md["annotations"][HOLDER_ANNOTATION], md["annotations"][FLAVOR_ANNOTATION]) == (
        "deployment/x",
        "h100",
    )
    assert obj["spec"]["queueName"] == "default"
    [ps] = obj["spec"]["podSets"]
    tpl = ps["template"]["spec"]
    assert tpl["nodeSelector"] == {"gpu": "h100"}  # Kueue's flavor assigner picks only this flavor
    assert tpl["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "4"}
    back = Placeholder.from_object(obj)
    assert (back.gpus, back.holder, back.flavor, back.admitted) == (4, "deployment/x", "h100", False)


def test_plan_creates_missing_deletes_unheld_and_marks_admitted_ready() -> None:
    keep, grown, gone = res("deployment/a", 2), res("deployment/b", 4), res("deployment/c", 1)
    existing = [
        placeholder(keep),
        placeholder(res("deployment/b", 3), ready=True),
        placeholder(gone, ready=True),
    ]
    ch = plan_changes([keep, grown], existing)
    assert [r.name for r in ch.create] == [grown.name]
    assert sorted(p.name for p in ch.delete) == sorted([res("deployment/b", 3).name, gone.name])
    assert [p.name for p in ch.mark_ready] == [keep.name]
    # Pending (not admitted) placeholders are left to Kueue; ready ones are not written again.
    assert plan_changes([keep], [placeholder(keep, admitted=False)]).mark_ready == []
    assert plan_changes([keep], [placeholder(keep, ready=True)]).mark_ready == []


reservations = st.builds(
    res,
    holder=st.sampled_from(["deployment/a", "deployment/b", "statefulset/s", "pod/p"]),
    gpus=st.integers(1, 16),
    ns=st.sampled_from(["ns-a", "ns-b"]),
    flavor=st.sampled_from(["h100", "a100"]),
)


@given(st.lists(reservations, max_size=8), st.lists(reservations, max_size=8))
def test_applying_the_plan_makes_existing_equal_desired(
    want: list[Reservation], had: list[Reservation]
) -> None:
    existing = [placeholder(r) for r in had]
    ch = plan_changes(want, existing)
    after = {(p.namespace, p.name) for p in existing} - {(p.namespace, p.name) for p in ch.delete}
    after |= {(r.namespace, r.name) for r in ch.create}
    assert after == {(r.namespace, r.name) for r in want}
    # Nothing still wanted is ever deleted, nothing that exists is created again.
    assert not {(p.namespace, p.name) for p in ch.delete} & {(r.namespace, r.name) for r in want}
    assert not {(r.namespace, r.name) for r in ch.create} & {(p.namespace, p.name) for p in existing}


def kueue_workload(name: str, ns: str, queue: str, *conds: tuple[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"u-{name}", "labels": {}},
        "spec": {"queueName": queue},
        "status": {"conditions": [{"type": t, "status": s} for t, s in conds]},
    }


def test_waiting_workloads_in_a_cluster_queue_with_reservations_are_told_why() -> None:
    lq_cq = {("ns-a", "jobs"): "cq-vision", ("ns-z", "jobs"): "cq-other"}
    wls = [
        kueue_workload("big", "ns-a", "jobs", ("QuotaReserved", "False")),
        kueue_workload("running", "ns-a", "jobs", ("QuotaReserved", "True"), ("Admitted", "True")),
        kueue_workload("done", "ns-a", "jobs", ("Finished", "True")),
        kueue_workload("elsewhere", "ns-z", "jobs", ("QuotaReserved", "False")),
    ]
    ph = placeholder_object(res(), {})
    ph["metadata"]["uid"] = "u-ph"
    out = waiting_messages([*wls, ph], [res()], lq_cq)
    assert list(out) == [("ns-a", "big", "u-big")]
    assert out[("ns-a", "big", "u-big")][1] == (
        "ClusterQueue cq-vision reserves 4 nvidia.com/gpu held outside Kueue by deployment/x in ns-a"
    )


class FakeApi:
    """Records kr8s call_api requests; answers LISTs from `objects`, writes with `fail` codes."""

    def __init__(self, objects: list[dict[str, Any]], fail: dict[str, int] | None = None) -> None:
        self.objects = objects
        self.fail = fail or {}
        self.calls: list[tuple[str, str, str | None, dict[str, Any] | None]] = []

    @contextlib.asynccontextmanager
    async def call_api(self, method: str, *, version: str, url: str, namespace: str | None = None,
                       params: dict[str, Any] | None = None, headers: Any = None,
                       content: str | None = None) -> Any:  # fmt: skip
        self.calls.append((method, url, namespace, params))
        if method in self.fail:
            from kr8s._exceptions import ServerError

            class Resp:
                status_code = self.fail[method]

            raise ServerError("refused", response=Resp())  # type: ignore[arg-type]
        if method == "GET":
            sel = (params or {}).get("labelSelector")
            items = [
                o for o in self.objects if not sel or o["metadata"].get("labels", {}).get(RESERVATION_LABEL)
            ]
            body = {"items": items, "metadata": {}}
        else:
            body = json.loads(content) if content else {}

        class R:
            def json(self) -> Any:
                return body

        yield R()

    def writes(self) -> list[tuple[str, str]]:
        return [(m, u) for m, u, _, _ in self.calls if m != "GET"]


def obj_of(p: Reservation, *, admitted: bool = True) -> dict[str, Any]:
    obj = placeholder_object(p, {"gpu": "h100"})
    obj["status"] = {"conditions": [{"type": "Admitted", "status": "True" if admitted else "False"}],
                     "admission": {"clusterQueue": "cq-vision"}}  # fmt: skip
    return obj


def run(api: FakeApi, mode: str, want: list[Reservation], *, leader: bool = True) -> Any:
    events: list[tuple[str, str]] = []

    async def event(involved: Any, *, reason: str, message: str) -> None:
        events.append((involved["metadata"]["name"], message))

    r = Reservations(api, mode=mode, local_queue="default", emit_event=event)
    report = asyncio.run(
        r.reconcile(want, [H100], leader=leader, local_queues=[lq("ns-a", "jobs", "cq-vision")], now="T")
    )
    return report, events


def test_enforce_creates_before_it_deletes_and_marks_admitted_ones_ready() -> None:
    old, new = res(gpus=3), res(gpus=4)
    api = FakeApi([obj_of(old), obj_of(res("deployment/keep", 1))])
    report, _ = run(api, "enforce", [new, res("deployment/keep", 1)])
    assert api.writes() == [
        ("POST", "workloads"),
        ("DELETE", f"workloads/{old.name}"),
        ("PATCH", f"workloads/{res('deployment/keep', 1).name}/status"),
    ]
    patch = next(c for c in api.calls if c[0] == "PATCH")
    # Forced server-side apply: from Kueue v0.18 `kueue-admission` co-owns PodsReady.
    assert patch[3] == {"fieldManager": "ghostgpu-reservation", "force": "true"}
    assert (report.created, report.deleted, report.marked_ready, report.errors) == (1, 1, 1, 0)
    assert report.admitted == {("cq-vision", "h100"): 4}


def test_a_new_leader_removes_leftovers_and_recreates_what_is_missing() -> None:
    held = res(gpus=4)
    leftovers = [obj_of(res(gpus=2)), obj_of(res("deployment/deleted", 8))]
    api = FakeApi(leftovers)
    run(api, "enforce", [held])
    assert sorted(api.writes()) == sorted(
        [("POST", "workloads"), ("DELETE", f"workloads/{res(gpus=2).name}"),
         ("DELETE", f"workloads/{res('deployment/deleted', 8).name}")]
    )  # fmt: skip


def test_shadow_writes_nothing_but_reports_the_same_numbers() -> None:
    want = [res(gpus=4)]
    api = FakeApi([])
    shadow, events = run(api, "shadow", want)
    assert api.writes() == [] and events == []
    enforce, _ = run(FakeApi([]), "enforce", want)
    assert shadow.desired_by() == enforce.desired_by() == {("cq-vision", "vision", "h100"): 4}


def test_shadow_only_removes_what_an_earlier_enforce_run_left() -> None:
    api = FakeApi([obj_of(res(gpus=4))])
    run(api, "shadow", [res(gpus=4)])
    assert api.writes() == [("DELETE", f"workloads/{res(gpus=4).name}")]


def test_followers_and_off_touch_nothing() -> None:
    for mode, leader in (("enforce", False), ("off", True)):
        api = FakeApi([obj_of(res(gpus=2))])
        run(api, mode, [res()], leader=leader)
        assert api.calls == []


def test_already_done_writes_count_as_done_and_refusals_as_errors() -> None:
    report, _ = run(FakeApi([], fail={"POST": 409}), "enforce", [res()])
    assert (report.created, report.errors) == (1, 0)
    report, _ = run(FakeApi([], fail={"POST": 403}), "enforce", [res()])
    assert (report.created, report.errors) == (0, 1)


def test_events_on_waiting_workloads_are_sent_once_per_message() -> None:
    waiting = kueue_workload("big", "ns-a", "jobs", ("QuotaReserved", "False"))
    api = FakeApi([waiting, obj_of(res())])
    events: list[str] = []

    async def event(involved: Any, *, reason: str, message: str) -> None:
        assert reason == "GPUsHeldOutsideKueue" and involved["kind"] == "Workload"
        events.append(message)

    r = Reservations(api, mode="enforce", local_queue="default", emit_event=event)
    lqs = [lq("ns-a", "jobs", "cq-vision")]
    for want in ([res()], [res()], [res(gpus=2)]):
        asyncio.run(r.reconcile(want, [H100], leader=True, local_queues=lqs, now="T"))
    assert events == [
        "ClusterQueue cq-vision reserves 4 nvidia.com/gpu held outside Kueue by deployment/x in ns-a",
        "ClusterQueue cq-vision reserves 2 nvidia.com/gpu held outside Kueue by deployment/x in ns-a",
    ]


def test_config_reads_a_bare_off_and_refuses_a_bare_on() -> None:
    assert ControllerConfig.model_validate(yaml.safe_load("reservation: off")).reservation == "off"
    assert ControllerConfig.model_validate({"reservation": "shadow"}).reservation == "shadow"
    with pytest.raises(ValueError, match="off, shadow or enforce"):
        ControllerConfig.model_validate(yaml.safe_load("reservation: on"))
    with pytest.raises(ValueError, match="'off', 'shadow' or 'enforce'"):
        ControllerConfig.model_validate({"reservation": "reserve"})


@pytest.mark.parametrize("mode", ["off", "shadow", "enforce"])
def test_rbac_for_placeholders_is_rendered_only_when_the_reservation_is_on(mode: str) -> None:
    from ghostgpu.render import render_objects

    cfg = load_default_config()
    cfg = cfg.model_copy(update={"controller": cfg.controller.model_copy(update={"reservation": mode})})
    [role] = [o for o in render_objects(cfg) if o["kind"] == "ClusterRole" and o["metadata"]["name"]
              == "ghostgpu-controller-namespaced"]  # fmt: skip
    kueue = [r for r in role["rules"] if "kueue.x-k8s.io" in r["apiGroups"]]
    if mode == "off":
        assert kueue == []
    else:
        assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in kueue} == {
            (("workloads",), ("create", "delete")),
            (("workloads/status",), ("patch",)),
        }
    read = next(o for o in render_objects(cfg) if o["kind"] == "ClusterRole" and o["metadata"]["name"]
            == "ghostgpu-controller-read")  # fmt: skip
    assert not any("create" in r["verbs"] or "delete" in r["verbs"] for r in read["rules"])


def test_the_default_is_off() -> None:
    assert ControllerConfig().reservation == "off"
    assert load_default_config().controller.reservation == "off"


# ----- evicted placeholders (preempted by a cohort reclaim or fair sharing, PodsReady timeout) -----


def evicted_obj(
    r: Reservation, reason: str = "Preempted", preempted: str = "InCohortReclamation", uid: str = "u1"
) -> dict[str, Any]:
    """A placeholder as Kueue leaves it after evicting it: Evicted=True, the quota still reserved
    (an owner-less Workload has no job controller to stop it and clear the admission)."""
    obj = obj_of(r)
    obj["metadata"]["uid"] = uid
    obj["status"]["conditions"] += [
        {"type": "QuotaReserved", "status": "True"},
        {"type": "PodsReady", "status": "True"},
        {"type": "Evicted", "status": "True", "reason": reason, "message": "to accommodate a workload"},
    ]
    if preempted:
        obj["status"]["conditions"].append(
            {"type": "Preempted", "status": "True", "reason": preempted, "message": "due to reclamation"}
        )
    return obj


def test_an_evicted_placeholder_is_read_as_evicted_with_the_preemptions_kind() -> None:
    p = Placeholder.from_object(evicted_obj(res()))
    assert (p.evicted, p.preempted, p.eviction_reason, p.uid) == (
        "Preempted", "InCohortReclamation", "InCohortReclamation", "u1"
    )  # fmt: skip
    assert "accommodate" in p.eviction_message
    timeout = Placeholder.from_object(evicted_obj(res(), reason="PodsReadyTimeout", preempted=""))
    assert timeout.eviction_reason == "PodsReadyTimeout"
    deactivated = obj_of(res())
    deactivated["spec"]["active"] = False
    assert Placeholder.from_object(deactivated).evicted == "Deactivated"
    assert Placeholder.from_object(obj_of(res())).evicted == ""
    # An evicted placeholder reserves nothing any more: it is not counted as reserved.
    assert admitted_by_flavor([p]) == {}


def test_an_evicted_placeholder_still_wanted_is_replaced_and_one_nobody_wants_is_just_deleted() -> None:
    kept, gone = res(), res("deployment/gone", 2)
    ev_kept = Placeholder.from_object(evicted_obj(kept))
    ev_gone = Placeholder.from_object(evicted_obj(gone, uid="u2"))
    ch = plan_changes([kept], [ev_kept, ev_gone])
    assert ch.evicted == [ev_kept] and ch.delete == [ev_gone]
    assert ch.create == [] and ch.mark_ready == []  # never marked ready: it is going
    # Being deleted: left alone (no second delete, no create under the name still taken).
    going = evicted_obj(kept)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    ch = plan_changes([kept], [Placeholder.from_object(going)])
    assert (ch.create, ch.delete, ch.evicted, ch.mark_ready) == ([], [], [], [])
    # Once it is gone, the next poll creates it again.
    assert plan_changes([kept], []).create == [kept]


def test_an_eviction_is_announced_counted_once_and_the_placeholder_deleted() -> None:
    api = FakeApi([evicted_obj(res())])
    events: list[tuple[str, str, str, str]] = []

    async def event(involved: Any, *, reason: str, message: str, type_: str = "Normal") -> None:
        events.append((involved["metadata"]["uid"], reason, type_, message))

    r = Reservations(api, mode="enforce", local_queue="default", emit_event=event)
    lqs = [lq("ns-a", "jobs", "cq-vision")]
    first = asyncio.run(r.reconcile([res()], [H100], leader=True, local_queues=lqs, now="T"))
    assert api.writes() == [("DELETE", f"workloads/{res().name}")]
    assert [(p.uid, p.eviction_reason, p.cluster_queue) for p in first.evicted] == [
        ("u1", "InCohortReclamation", "cq-vision")
    ]
    [(uid, reason, type_, message)] = events
    assert (uid, reason, type_) == ("u1", "ReservationEvicted", "Warning")
    assert "4 nvidia.com/gpu held outside Kueue by deployment/x: InCohortReclamation" in message
    # The delete did not go through yet (the same object is listed again): deleted again, not counted again.
    again = asyncio.run(r.reconcile([res()], [H100], leader=True, local_queues=lqs, now="T"))
    assert again.evicted == [] and len(events) == 1
    assert api.writes()[-1] == ("DELETE", f"workloads/{res().name}")
    metrics = ReservationMetrics(CollectorRegistry())
    metrics.set(first)
    metrics.set(again)
    assert metrics.evictions.labels("cq-vision", "InCohortReclamation")._value.get() == 1


def test_the_borrowed_part_of_a_reservation_is_at_most_what_its_cluster_queue_borrows() -> None:
    def cq_status(name: str, flavor: str, **borrowed: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"flavorsUsage": [{"name": flavor, "resources": [
            {"name": r.replace("_", "/").replace("nvidia/com", "nvidia.com"), "total": "9", "borrowed": v}
            for r, v in borrowed.items()]}]}}  # fmt: skip

    cqs = [
        cq_status("cq-a", "h100", nvidia_com_gpu="2", cpu="4"),  # borrows 2 GPUs (and CPUs: not ours)
        cq_status("cq-b", "h100", nvidia_com_gpu="8"),  # borrows more than its reservation
        cq_status("cq-c", "h100", nvidia_com_gpu="0"),
        cq_status("cq-d", "h100", nvidia_com_gpu="1500m"),
    ]
    admitted = {("cq-a", "h100"): 6, ("cq-b", "h100"): 3, ("cq-c", "h100"): 4, ("cq-d", "h100"): 4}
    assert borrowed_reservations(admitted, cqs, {"h100": "nvidia.com/gpu"}) == {
        ("cq-a", "h100"): 2,
        ("cq-b", "h100"): 3,
        ("cq-d", "h100"): 2,
    }
    assert borrowed_reservations({}, cqs, {"h100": "nvidia.com/gpu"}) == {}
