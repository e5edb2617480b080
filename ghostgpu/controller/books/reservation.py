"""Kueue's books: reserve, in each team's ClusterQueue, the GPUs that live non-Kueue work holds.

Kueue admits by quota alone and counts only what it admitted, so a Deployment that bypassed it and
holds 4 of a team's 8 GPUs leaves Kueue free to admit an 8-GPU Job whose pods then sit Pending.
Here the controller keeps one owner-less placeholder Workload per (holder, flavor) in the holder's
namespace, queued in the LocalQueue `controller.reservationQueue` (whose ClusterQueue is the team's):
Kueue admits and counts it like any other Workload, so the team's quota shrinks by what is held,
and the placeholder goes at the first poll after the holder's pods are gone (reclaimed, scaled
down, deleted).
Why placeholders and not a trimmed nominalQuota: docs/reservation.md (measured on v0.17 and v0.19).

The placeholder:
- has no ownerReferences and never the label `kueue.x-k8s.io/job-uid` (Kueue v0.18+ finishes an
  owner-less Workload that carries it: FinishOrphanedWorkloads);
- asks for the holder's GPUs in one pod whose nodeSelector is the flavor's node labels (Kueue's
  flavor assigner then only considers that flavor) and tolerates every taint;
- gets `PodsReady=True` once admitted (server-side apply, forced: from v0.18 `kueue-admission`
  co-owns the condition), or waitForPodsReady would evict it at the timeout and, with
  `blockAdmission: true`, block every admission until then;
- is named after what it reserves (holder, flavor, count): a different count is a new placeholder,
  created before the old one is deleted (Kueue's podSets are immutable once admitted, and the
  order never leaves the held GPUs unreserved);
- once Kueue evicts it (preempted by a cohort reclaim or fair sharing, a PodsReady timeout,
  deactivated) it is deleted and created anew at the next poll: Kueue hands an evicted Workload's
  quota back only after its job controller stops the job and clears the admission, and an
  owner-less Workload has no job controller, so an evicted placeholder would hold its quota and
  keep the preemptor waiting for ever. Each eviction is counted
  (`ghostgpu_reservation_evictions_total`) and announced by an Event on the placeholder.

`desired_reservations` is pure (the snapshot in, the reservations out); `plan_changes` compares it
with the placeholders that exist; `placeholders.Reservations.reconcile` (leader only) lists, creates, deletes,
marks PodsReady and puts an Event on Kueue Workloads that wait in a ClusterQueue with reservations.
Every poll compares everything afresh, so a new leader (or a restarted one) removes leftovers and
creates what is missing on its first poll: no state is kept between polls but the Events sent.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ghostgpu.controller import keys
from ghostgpu.controller.books.accounting import FlavorSpec, node_flavors_of
from ghostgpu.controller.books.untracked import untracked_holders
from ghostgpu.controller.inventory import PodView, Workload, WorkloadRef, namespace_opted_in
from ghostgpu.controller.kube import ResourceType
from ghostgpu.quantity import parse_quantity

log = logging.getLogger("ghostgpu.controller.reservation")

WORKLOADS = ResourceType("kueue.x-k8s.io/v1beta2", "workloads", kind="Workload")
LOCALQUEUES = ResourceType("kueue.x-k8s.io/v1beta2", "localqueues", kind="LocalQueue")
RESERVATION_LABEL = "ghostgpu.io/reservation"  # "true" on every placeholder (list selector)
HOLDER_ANNOTATION = "ghostgpu.io/reserved-for"  # "deployment/x"
FLAVOR_ANNOTATION = "ghostgpu.io/reserved-flavor"
FIELD_MANAGER = "ghostgpu-reservation"
PLACEHOLDER_IMAGE = "ghostgpu.io/reservation-placeholder"  # never pulled: the Workload has no pods
# Labels that make a pod Kueue's own (counted in Kueue's books already: never reserved again).
KUEUE_MANAGED = "kueue.x-k8s.io/managed"
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"


@dataclass(frozen=True, order=True, slots=True)
class Reservation:
    """GPUs of one flavor that one holder keeps outside Kueue, to be counted in `cluster_queue`."""

    namespace: str
    holder: str  # "deployment/x"
    flavor: str
    resource: str
    gpus: int
    cluster_queue: str
    local_queue: str
    team: str

    @property
    def name(self) -> str:
        return placeholder_name(self.holder, self.flavor, self.gpus)


_DNS = re.compile(r"[^a-z0-9-]+")


def placeholder_name(holder: str, flavor: str, gpus: int) -> str:
    """`ghostgpu-reserve-<kind>-<name>-<flavor>-<gpus>`; a digest replaces the readable middle when
    it would pass the 253 characters of a name or the characters differ from the inputs'."""
    kind, _, name = holder.partition("/")
    readable = f"ghostgpu-reserve-{kind}-{name}-{flavor}-{gpus}".lower()
    clean = _DNS.sub("-", readable).strip("-")
    if clean == readable and len(clean) <= 253:
        return clean
    digest = hashlib.sha256(f"{holder}\0{flavor}\0{gpus}".encode()).hexdigest()[:12]
    return f"{clean[:200].rstrip('-')}-{digest}"


def _holder(ref: WorkloadRef) -> str:
    return ref.short  # `job/x` for a batch Job, `job.batch.volcano.sh/x` for Volcano's


def queues_of(local_queues: Iterable[Mapping[str, Any]], name: str) -> dict[str, str]:
    """namespace -> ClusterQueue of its LocalQueue `name`."""
    out: dict[str, str] = {}
    for lq in local_queues:
        meta = lq.get("metadata") or {}
        cq = (lq.get("spec") or {}).get("clusterQueue")
        if meta.get("name") == name and cq:
            out[str(meta.get("namespace", ""))] = str(cq)
    return out


def cq_flavors(cluster_queues: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, set[str]]]:
    """ClusterQueue -> flavor -> resources it has a quota for."""
    out: dict[str, dict[str, set[str]]] = {}
    for cq in cluster_queues:
        name = str((cq.get("metadata") or {}).get("name", ""))
        flavors = out.setdefault(name, {})
        for group in (cq.get("spec") or {}).get("resourceGroups") or []:
            for fq in group.get("flavors") or []:
                res = flavors.setdefault(str(fq.get("name", "")), set())
                res.update(str(r.get("name", "")) for r in fq.get("resources") or [])
    return out


def kueue_owned(pod: PodView, wl: Workload) -> bool:
    """Kueue counts this pod itself: its pod (or the workload, defaulted into a LocalQueue by
    Kueue's webhook) carries Kueue's labels."""
    return (
        pod.labels.get(KUEUE_MANAGED) == "true"
        or KUEUE_QUEUE_NAME in pod.labels
        or KUEUE_QUEUE_NAME in wl.labels
    )


def desired_reservations(
    flavors: Sequence[FlavorSpec],
    namespaces: Mapping[str, Mapping[str, str]],
    workloads: Mapping[WorkloadRef, Workload],
    pods_of: Mapping[WorkloadRef, Sequence[PodView]],
    nodes: Iterable[Mapping[str, Any]],
    queues: Mapping[str, str],
    cluster_queues: Mapping[str, Mapping[str, set[str]]],
    *,
    local_queue: str,
    untracked: Mapping[WorkloadRef, Sequence[PodView]] | None = None,
    skip: Collection[str] = (),
) -> list[Reservation]:
    """What must be reserved now, sorted. A GPU counts when a tracked workload in an opted-in
    namespace with a team label holds it: its pod is scheduled and not finished (whatever its
    verdict: idle GPUs are held until reclaimed; a terminating pod too, as the scheduler still counts
    it until it is gone: releasing earlier would let Kueue admit pods that cannot be scheduled yet),
    and it is not Kueue's own pod. It counts in the ClusterQueue of the namespace's LocalQueue
    (`queues`), on the first flavor of that ClusterQueue whose node labels the pod's node carries;
    GPUs on nodes of no flavor of that ClusterQueue are not in its quota and reserve nothing.
    `untracked`: holder -> GPU pods no tracked workload accounts for (untracked.untracked_holders,
    Kueue's own pods left out already), reserved the same way under their holder's name.
    Fractional counts round up (whole GPUs). `skip`: ClusterQueues that get no placeholder (multikueue.py)."""
    node_flavor_names = {
        str((n.get("metadata") or {}).get("name", "")): [f for f in node_flavors_of(n, flavors)]
        for n in nodes
    }
    held: list[tuple[WorkloadRef, Sequence[PodView]]] = []
    for ref, wl in workloads.items():
        held.append((ref, [p for p in pods_of.get(ref, ()) if not kueue_owned(p, wl)]))
    held.extend((untracked or {}).items())
    totals: dict[tuple[str, str, str, str, str, str], float] = {}
    for ref, pods in held:
        labels = namespaces.get(ref.namespace)
        if labels is None or not namespace_opted_in(labels):
            continue
        team = labels.get(keys.TEAM_LABEL)
        cq = queues.get(ref.namespace)
        if not team or cq is None or cq in skip:
            continue
        quota = cluster_queues.get(cq, {})
        for pod in pods:
            if not pod.holds_gpus:
                continue
            for f in node_flavor_names.get(pod.node_name or "", []):
                count = pod.gpu_requests.get(f.key, 0.0)
                if count and f.resource in quota.get(f.name, ()):
                    key = (ref.namespace, _holder(ref), f.name, f.resource, cq, team)
                    totals[key] = totals.get(key, 0.0) + count
                    break  # one flavor per pod: its GPUs are counted once
    return sorted(
        Reservation(ns, holder, flavor, resource, math.ceil(gpus), cq, local_queue, team)
        for (ns, holder, flavor, resource, cq, team), gpus in totals.items()
        if gpus > 0
    )


@dataclass(frozen=True, slots=True)
class Placeholder:
    """A placeholder Workload as listed: enough to compare, delete and mark ready."""

    namespace: str
    name: str
    holder: str
    flavor: str
    gpus: int
    resource: str
    admitted: bool
    pods_ready: bool
    cluster_queue: str  # from status.admission, "" until admitted
    uid: str = ""
    # Kueue evicted it: "Preempted", "PodsReadyTimeout", "Deactivated"... ("" while it is not).
    evicted: str = ""
    # Why, when preempted: Kueue's Preempted condition reason (InCohortReclamation,
    # InCohortFairSharing, InClusterQueue...), and the condition messages (name the preemptor).
    preempted: str = ""
    eviction_message: str = ""
    deleting: bool = False

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Placeholder:
        meta = obj.get("metadata") or {}
        ann = meta.get("annotations") or {}
        cond_list = (obj.get("status") or {}).get("conditions") or []
        conds = {c.get("type"): c.get("status") for c in cond_list}
        true = {str(c.get("type")): c for c in cond_list if c.get("status") == "True"}
        evicted = str(true["Evicted"].get("reason") or "Evicted") if "Evicted" in true else ""
        if not evicted and (obj.get("spec") or {}).get("active") is False:
            evicted = "Deactivated"
        preempted = str(true["Preempted"].get("reason") or "") if "Preempted" in true else ""
        messages = [str(true[t].get("message") or "") for t in ("Evicted", "Preempted") if t in true]
        gpus, resource = 0, ""
        for ps in (obj.get("spec") or {}).get("podSets") or []:
            for c in ((ps.get("template") or {}).get("spec") or {}).get("containers") or []:
                for r, v in ((c.get("resources") or {}).get("requests") or {}).items():
                    resource, gpus = str(r), gpus + int(float(str(v))) * int(ps.get("count", 1))
        admission = (obj.get("status") or {}).get("admission") or {}
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            holder=str(ann.get(HOLDER_ANNOTATION, "")),
            flavor=str(ann.get(FLAVOR_ANNOTATION, "")),
            gpus=gpus,
            resource=resource,
            admitted=conds.get("Admitted") == "True",
            pods_ready=conds.get("PodsReady") == "True",
            cluster_queue=str(admission.get("clusterQueue", "")),
            uid=str(meta.get("uid", "")),
            evicted=evicted,
            preempted=preempted,
            eviction_message="; ".join(m for m in messages if m),
            deleting=bool(meta.get("deletionTimestamp")),
        )

    @property
    def eviction_reason(self) -> str:
        """The metric's `reason`: the preemption's kind when preempted, else the eviction's."""
        return self.preempted or self.evicted

    def involved(self) -> dict[str, Any]:
        """Enough of the Workload for an Event's involvedObject."""
        return {
            "apiVersion": WORKLOADS.version,
            "kind": "Workload",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }


@dataclass(frozen=True, slots=True)
class Changes:
    create: list[Reservation]
    delete: list[Placeholder]
    mark_ready: list[Placeholder]
    # Still wanted, but Kueue evicted them: deleted now (which hands their quota back), created
    # again at the next poll (a name is reused only once the old Workload is gone).
    evicted: list[Placeholder] = field(default_factory=list)


def plan_changes(desired: Sequence[Reservation], existing: Sequence[Placeholder]) -> Changes:
    """Create what is missing, delete what nobody holds any more (after the creates: the held
    GPUs never go unreserved), mark admitted placeholders ready, replace evicted ones. Matched by
    (namespace, name): the name carries holder, flavor and count. A placeholder being deleted is
    left alone (its name is created again once it is gone)."""
    have = {(p.namespace, p.name): p for p in existing}
    want = {(r.namespace, r.name): r for r in desired}
    live = {k: p for k, p in sorted(have.items()) if not p.deleting}
    return Changes(
        create=[r for k, r in sorted(want.items()) if k not in have],
        delete=[p for k, p in live.items() if k not in want],
        mark_ready=[
            p for k, p in live.items() if k in want and p.admitted and not p.pods_ready and not p.evicted
        ],
        evicted=[p for k, p in live.items() if k in want and p.evicted],
    )


def placeholder_object(r: Reservation, node_labels: Mapping[str, str]) -> dict[str, Any]:
    quantity = {r.resource: str(r.gpus)}
    return {
        "apiVersion": WORKLOADS.version,
        "kind": "Workload",
        "metadata": {
            "name": r.name,
            "namespace": r.namespace,
            # Never kueue.x-k8s.io/job-uid: Kueue v0.18+ would finish it as an orphan.
            "labels": {RESERVATION_LABEL: "true", "app.kubernetes.io/managed-by": keys.COMPONENT},
            "annotations": {HOLDER_ANNOTATION: r.holder, FLAVOR_ANNOTATION: r.flavor},
        },
        "spec": {
            "queueName": r.local_queue,
            "podSets": [
                {
                    "name": "held",
                    "count": 1,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "nodeSelector": dict(sorted(node_labels.items())),
                            "tolerations": [{"operator": "Exists"}],
                            "containers": [
                                {
                                    "name": "held",
                                    "image": PLACEHOLDER_IMAGE,
                                    "resources": {"requests": quantity, "limits": quantity},
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def pods_ready_patch(name: str, namespace: str, now: str) -> dict[str, Any]:
    cond = {
        "type": "PodsReady",
        "status": "True",
        "reason": "PodsReady",
        "message": "placeholder for GPUs held outside Kueue: it has no pods to wait for",
        "lastTransitionTime": now,
    }
    return {
        "apiVersion": WORKLOADS.version,
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "status": {"conditions": [cond]},
    }


def waiting_messages(
    kueue_workloads: Iterable[Mapping[str, Any]],
    desired: Sequence[Reservation],
    local_queue_cq: Mapping[tuple[str, str], str],
) -> dict[tuple[str, str, str], tuple[Mapping[str, Any], str]]:
    """(namespace, name, uid) -> (workload, message) for every Kueue Workload (not a placeholder)
    that waits for quota in a ClusterQueue holding reservations: why it may wait."""
    by_cq: dict[str, list[Reservation]] = {}
    for r in desired:
        by_cq.setdefault(r.cluster_queue, []).append(r)
    out: dict[tuple[str, str, str], tuple[Mapping[str, Any], str]] = {}
    for wl in kueue_workloads:
        meta = wl.get("metadata") or {}
        if (meta.get("labels") or {}).get(RESERVATION_LABEL) == "true":
            continue
        conds = {c.get("type"): c.get("status") for c in (wl.get("status") or {}).get("conditions") or []}
        if conds.get("QuotaReserved") == "True" or conds.get("Finished") == "True":
            continue
        ns = str(meta.get("namespace", ""))
        cq = local_queue_cq.get((ns, str((wl.get("spec") or {}).get("queueName", ""))))
        held = by_cq.get(cq or "")
        if not held:
            continue
        parts = [f"{r.gpus} {r.resource} held outside Kueue by {r.holder} in {r.namespace}" for r in held]
        message = f"ClusterQueue {cq} reserves " + "; ".join(parts)
        out[(ns, str(meta.get("name", "")), str(meta.get("uid", "")))] = (wl, message)
    return out


@dataclass
class ReservationReport:
    """One poll's numbers (metrics and logs): reserved GPUs per (ClusterQueue, team, flavor)."""

    mode: str
    desired: list[Reservation] = field(default_factory=list)
    admitted: dict[tuple[str, str], int] = field(default_factory=dict)  # (cq, flavor) -> GPUs
    created: int = 0
    deleted: int = 0
    marked_ready: int = 0
    errors: int = 0
    evicted: list[Placeholder] = field(default_factory=list)  # this poll's newly seen evictions
    borrowed: dict[tuple[str, str], int] = field(default_factory=dict)  # borrowed_reservations

    def desired_by(self) -> dict[tuple[str, str, str], int]:
        out: dict[tuple[str, str, str], int] = {}
        for r in self.desired:
            key = (r.cluster_queue, r.team, r.flavor)
            out[key] = out.get(key, 0) + r.gpus
        return out


def admitted_by_flavor(placeholders: Iterable[Placeholder]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for p in placeholders:
        if p.admitted and not p.evicted:  # an evicted one is about to be replaced: it holds nothing
            out[(p.cluster_queue, p.flavor)] = out.get((p.cluster_queue, p.flavor), 0) + p.gpus
    return out


def desired_from(
    flavors: Sequence[FlavorSpec],
    snap: Any,
    cluster_queues: Iterable[Mapping[str, Any]],
    local_queues: Iterable[Mapping[str, Any]],
    *,
    local_queue: str,
    pods_of: Mapping[WorkloadRef, Sequence[PodView]] | None = None,
    untracked: Mapping[WorkloadRef, Sequence[PodView]] | None = None,
    skip: Collection[str] = (),
) -> list[Reservation]:
    """desired_reservations over a reconciler.Snapshot and the listed Kueue objects; `pods_of` and
    `untracked`: the poll's (PollResult.pods_of, books.untracked_of), else computed here."""
    if pods_of is None:
        from ghostgpu.controller.inventory import pods_by_workload

        opted = {ns for ns, labels in snap.namespaces.items() if namespace_opted_in(labels)}
        pods_of = pods_by_workload(
            {ref: wl for ref, wl in snap.workloads.items() if ref.namespace in opted},
            snap.pods,
            getattr(snap, "top_of", None),
        )
    if untracked is None:
        untracked = untracked_holders(snap.pods, snap.namespaces, pods_of, getattr(snap, "holder_of", None))
    return desired_reservations(
        flavors,
        snap.namespaces,
        snap.workloads,
        pods_of,
        snap.nodes,
        queues_of(local_queues, local_queue),
        cq_flavors(cluster_queues),
        local_queue=local_queue,
        untracked=untracked,
        skip=skip,
    )


def borrowed_reservations(
    admitted: Mapping[tuple[str, str], int],
    cluster_queues: Iterable[Mapping[str, Any]],
    resource_of: Mapping[str, str],
) -> dict[tuple[str, str], int]:
    """(ClusterQueue, flavor) -> GPUs of the admitted reservation that may stand on quota borrowed
    in the cohort: at most what the ClusterQueue borrows of that flavor's GPU resource
    (status.flavorsUsage[].resources[].borrowed). A reclaim by the lender (`reclaimWithinCohort`)
    or fair sharing may preempt a Workload of a borrowing ClusterQueue, the placeholder too; Kueue
    then admits the lender's work onto GPUs the holder still uses until the placeholder is admitted
    again (docs/reservation.md). Whole GPUs, rounded up."""
    borrowed: dict[tuple[str, str], float] = {}
    for cq in cluster_queues:
        name = str((cq.get("metadata") or {}).get("name", ""))
        for fu in (cq.get("status") or {}).get("flavorsUsage") or []:
            flavor = str(fu.get("name", ""))
            for r in fu.get("resources") or []:
                if r.get("name") == resource_of.get(flavor) and r.get("borrowed"):
                    borrowed[(name, flavor)] = float(parse_quantity(str(r["borrowed"])))
    out: dict[tuple[str, str], int] = {}
    for key, gpus in sorted(admitted.items()):
        at_risk = min(gpus, math.ceil(borrowed.get(key, 0.0)))
        if at_risk > 0:
            out[key] = at_risk
    return out


def fill_accounts(
    accounts: Iterable[Any], desired: Sequence[Reservation], admitted: Mapping[tuple[str, str], int]
) -> None:
    """Per flavor: what should be reserved and what Kueue has admitted as placeholders (the latter
    is part of Kueue's admitted usage already, so the gap closes when both equal what is held)."""
    for a in accounts:
        a.reservation_desired = float(
            sum(r.gpus for r in desired if r.flavor == a.flavor and r.resource == a.resource)
        )
        a.reserved_outside = float(sum(v for (_, flavor), v in admitted.items() if flavor == a.flavor))


__all__ = [
    "Changes",
    "Placeholder",
    "Reservation",
    "ReservationReport",
    "admitted_by_flavor",
    "borrowed_reservations",
    "cq_flavors",
    "desired_from",
    "desired_reservations",
    "fill_accounts",
    "placeholder_name",
    "plan_changes",
    "queues_of",
    "waiting_messages",
]
