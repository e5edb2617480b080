"""The reservation on a MultiKueue manager and worker, without a cluster: a ClusterQueue whose
admission checks include a MultiKueue AdmissionCheck gets no placeholder (Kueue's MultiKueue
rejects an owner-less Workload, so it would be rejected, deleted and created at every poll); the
poll, `ghostgpu status` and `ghostgpu doctor` say so; a worker reserves as usual."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from test_controller_reservation import FLAVORS, NODES, OPTED, cq, deployment, lq, pod

from ghostgpu.config import load_default_config
from ghostgpu.controller.books import multikueue
from ghostgpu.controller.books.accounting import FlavorAccount
from ghostgpu.controller.books.placeholders import ReservationMetrics, Reservations, reserve
from ghostgpu.controller.books.reservation import desired_from
from ghostgpu.controller.inventory import gpu_predicate, pod_view, workload_from
from ghostgpu.controller.poll import PollResult, Snapshot
from ghostgpu.doctor import cluster_checks as cc

IS_GPU = gpu_predicate(["nvidia.com/gpu"])


def admission_check(name: str, controller: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"controllerName": controller}}


MK = admission_check("mk", multikueue.MULTIKUEUE_CONTROLLER)
PROV = admission_check("prov", "kueue.x-k8s.io/provisioning-request")


def checked(name: str, *checks: str, v1beta1: bool = False) -> dict[str, Any]:
    """ClusterQueue `name` (h100, a100) requiring `checks`, as v1beta2 writes them
    (admissionChecksStrategy) or as v1beta1's list of names."""
    out = cq(name, "h100", "a100")
    if v1beta1:
        out["spec"]["admissionChecks"] = list(checks)
    else:
        out["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return out


def test_a_cluster_queue_with_a_multikueue_check_is_skipped_either_way_it_is_written() -> None:
    cqs = [
        checked("mgr", "mk"),
        checked("old", "mk", v1beta1=True),
        checked("prov", "prov"),
        cq("plain", "h100"),
    ]
    skipped = multikueue.skipped_queues(cqs, [MK, PROV])
    assert sorted(skipped) == ["mgr", "old"]
    assert "MultiKueue AdmissionCheck mk" in skipped["mgr"]
    # One MultiKueue check among others (onFlavors or not) is enough.
    both = checked("both", "prov", "mk")
    assert list(multikueue.skipped_queues([both], [MK, PROV])) == ["both"]
    assert not multikueue.needs_admission_checks([cq("plain", "h100")])


def test_unreadable_admission_checks_skip_every_queue_that_names_one() -> None:
    cqs = [checked("mgr", "mk"), checked("prov", "prov"), cq("plain", "h100")]
    skipped = multikueue.skipped_queues(cqs, None, unreadable="403 Forbidden")
    assert sorted(skipped) == ["mgr", "prov"]  # fail safe: maybe MultiKueue; a plain one is not
    assert "cannot be read: 403 Forbidden" in skipped["prov"]


def _snapshot() -> Snapshot:
    return Snapshot(
        namespaces={"ns-a": OPTED},
        workloads={w.ref: w for w in [workload_from("Deployment", deployment("x"), IS_GPU)]},
        pods=[pod_view(pod("x"), IS_GPU)],
        nodes=NODES,
    )


def test_desired_skips_what_is_held_in_a_skipped_queue() -> None:
    lqs = [lq("ns-a", "default", "mgr")]
    cqs = [checked("mgr", "mk")]
    assert len(desired_from(FLAVORS, _snapshot(), cqs, lqs, local_queue="default")) == 1
    assert desired_from(FLAVORS, _snapshot(), cqs, lqs, local_queue="default", skip={"mgr"}) == []


class KueueApi:
    """kr8s call_api answering LISTs per resource (the URL's last part); records every call."""

    def __init__(self, lists: dict[str, list[dict[str, Any]]], refuse: frozenset[str] = frozenset()) -> None:
        self.lists = lists
        self.refuse = refuse
        self.calls: list[tuple[str, str]] = []

    @contextlib.asynccontextmanager
    async def call_api(self, method: str, *, url: str, content: str | None = None, **_: Any) -> Any:
        self.calls.append((method, url))
        if url in self.refuse:
            from kr8s._exceptions import ServerError

            class Resp:
                status_code = 403

            raise ServerError("forbidden", response=Resp())  # type: ignore[arg-type]
        body = (
            {"items": self.lists.get(url, []), "metadata": {}}
            if method == "GET"
            else json.loads(content or "{}")
        )

        class R:
            def json(self) -> Any:
                return body

        yield R()

    def posts(self) -> list[str]:
        return [u for m, u in self.calls if m == "POST"]


def _poll(api: KueueApi, cqs: list[dict[str, Any]]) -> tuple[Reservations, list[FlavorAccount]]:
    async def event(*_: Any, **__: Any) -> None:
        return None

    r = Reservations(api, mode="enforce", local_queue="default", emit_event=event)
    accounts = [FlavorAccount("h100", "nvidia.com/gpu")]
    metrics = ReservationMetrics(CollectorRegistry())
    for _ in range(3):  # every poll alike: nothing written, nothing deleted again
        asyncio.run(
            reserve(r, metrics, FLAVORS, _snapshot(), cqs, PollResult(started=0.0), accounts, leader=True)
        )
    return r, accounts


def test_a_manager_poll_writes_no_placeholder_into_a_multikueue_queue() -> None:
    cqs = [checked("mgr", "mk")]
    api = KueueApi({"localqueues": [lq("ns-a", "default", "mgr")], "admissionchecks": [MK]})
    r, accounts = _poll(api, cqs)
    assert api.posts() == []
    assert list(r.skipped) == ["mgr"]
    assert accounts[0].reservation_desired == 0


def test_a_queue_with_another_admission_check_is_reserved_as_usual() -> None:
    cqs = [checked("prov", "prov")]
    api = KueueApi({"localqueues": [lq("ns-a", "default", "prov")], "admissionchecks": [PROV]})
    r, accounts = _poll(api, cqs)
    assert api.posts() == ["workloads"] * 3  # the fake lists no placeholder back: created each poll
    assert r.skipped == {} and accounts[0].reservation_desired == 4


def test_admission_checks_are_listed_only_when_a_queue_names_one_and_a_refusal_skips() -> None:
    plain = KueueApi({"localqueues": [lq("ns-a", "default", "plain")]})
    _poll(plain, [cq("plain", "h100")])
    assert ("GET", "admissionchecks") not in plain.calls and plain.posts()
    refused = KueueApi({"localqueues": [lq("ns-a", "default", "mgr")]}, refuse=frozenset({"admissionchecks"}))
    r, _ = _poll(refused, [checked("mgr", "mk")])
    assert refused.posts() == [] and "cannot be read" in r.skipped["mgr"]


def test_a_placeholder_left_in_a_queue_that_became_multikueue_is_deleted() -> None:
    from ghostgpu.controller.books.reservation import RESERVATION_LABEL, Reservation, placeholder_object

    left = placeholder_object(
        Reservation("ns-a", "deployment/x", "h100", "nvidia.com/gpu", 4, "mgr", "default", "vision"), {}
    )
    assert left["metadata"]["labels"][RESERVATION_LABEL] == "true"
    api = KueueApi(
        {"localqueues": [lq("ns-a", "default", "mgr")], "admissionchecks": [MK], "workloads": [left]}
    )
    _poll(api, [checked("mgr", "mk")])
    assert ("DELETE", f"workloads/{left['metadata']['name']}") in api.calls and api.posts() == []


def _sent(name: str, flavor: str | None) -> dict[str, Any]:
    status = (
        {"admission": {"podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": flavor}}]}}
        if flavor
        else {}
    )
    return {"metadata": {"name": name, "labels": {multikueue.ORIGIN_LABEL: "multikueue"}}, "status": status}


def test_status_shows_skipped_queues_per_flavor_and_a_workers_sent_workloads() -> None:
    from ghostgpu.controller.books.reservation import cq_flavors
    from ghostgpu.controller.cli import multikueue_lines

    cqs = [checked("mgr", "mk"), cq("a100-only", "a100")]
    accounts = [FlavorAccount("h100", "nvidia.com/gpu"), FlavorAccount("b200", "nvidia.com/gpu")]
    skipped = multikueue.skipped_queues(cqs, [MK])
    wls = [_sent("w1", "h100"), _sent("w2", None), {"metadata": {"name": "own", "labels": {}}}]
    multikueue.fill_accounts(accounts, skipped, cq_flavors(cqs), wls)
    h100, b200 = (a.as_dict() for a in accounts)
    assert list(h100["reservationSkipped"]) == ["mgr"] and b200["reservationSkipped"] == {}
    assert (h100["multiKueueWorkloads"], b200["multiKueueWorkloads"]) == (1, 0)
    lines = multikueue_lines(accounts)
    assert lines[0].startswith("reservation skips ClusterQueue mgr: MultiKueue AdmissionCheck mk")
    assert lines[1].startswith("MultiKueue worker: Workloads a manager sent, admitted here: 1 on h100")
    assert multikueue_lines([FlavorAccount("h100", "nvidia.com/gpu")]) == []


@pytest.mark.parametrize("reservation", ["off", "enforce"])
def test_doctor_names_a_manager_and_a_worker(reservation: str) -> None:
    cfg = load_default_config()
    cfg = cfg.model_copy(
        update={"controller": cfg.controller.model_copy(update={"reservation": reservation})}
    )
    queue = cfg.controller.reservation_queue
    assert cc.multikueue_row([cq("plain", "h100")], [], {}, [], [], cfg).status == "skip"
    cqs = [checked("mgr", "mk")]
    lqs = [lq("team-a", queue, "mgr")]
    manager = cc.multikueue_row(cqs, [MK], {}, lqs, ["team-a"], cfg)
    assert "manager: ClusterQueues mgr" in manager.found
    # The reservation is on and an opted-in namespace queues into the manager's queue: held GPUs
    # there are reserved nowhere.
    assert manager.status == ("warn" if reservation == "enforce" else "ok")
    assert cc.multikueue_row(cqs, [MK], {}, lqs, [], cfg).status == "ok"  # not opted in
    worker = cc.multikueue_row([cq("plain", "h100")], [], {"multikueue": 3}, [], [], cfg)
    assert (
        worker.status == "ok" and "worker: 3 Workloads sent by a manager of origin multikueue" in worker.found
    )


@pytest.mark.parametrize("mode", ["off", "shadow", "enforce"])
def test_rbac_lists_admission_checks_only_when_the_reservation_is_on(mode: str) -> None:
    """The reservation lists AdmissionChecks (never gets or watches them: a list per poll, only
    when a ClusterQueue names one, test_admission_checks_are_listed_only_when_...); off never does."""
    from ghostgpu.render import render_objects

    cfg = load_default_config()
    cfg = cfg.model_copy(update={"controller": cfg.controller.model_copy(update={"reservation": mode})})
    read = next(
        o
        for o in render_objects(cfg)
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "ghostgpu-controller-read"
    )
    rules = [r for r in read["rules"] if "admissionchecks" in r["resources"]]
    if mode == "off":
        assert rules == []
    else:
        assert rules == [
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["admissionchecks"], "verbs": ["list"]}
        ]
