"""One-shot operations behind `ghostgpu restore` and `ghostgpu status` (they talk to the cluster
directly; no controller needs to run)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ghostgpu.actuators import CORE_GROUPS, POD_CONTROLLERS, ActuatorTable
from ghostgpu.config import ControllerConfig
from ghostgpu.controller import keys
from ghostgpu.controller.act import stops
from ghostgpu.controller.act.revert_guard import RESTORE_MANAGER
from ghostgpu.controller.app import (
    DEVICECLASSES,
    RESOURCECLAIMS,
    RESOURCESLICES,
    LoadedConfig,
    _kube_api,
    _slim_node,
    discover_flavors,
    dra_extended_aliases,
    dra_flavor_specs,
)
from ghostgpu.controller.books.accounting import FlavorAccount, FlavorSpec, node_labels_for_books
from ghostgpu.controller.claims import DraCounter, claim_view
from ghostgpu.controller.deviceclass import class_view
from ghostgpu.controller.inventory import (
    OwnerRef,
    WorkloadRef,
    controller_owner,
    gpu_predicate,
    pod_view,
    workload_from,
)
from ghostgpu.controller.kube import (
    CLUSTERQUEUES,
    DEPLOYMENTS,
    JOBS,
    NAMESPACES,
    NODES,
    PODS,
    STATEFULSETS,
    Cluster,
    NotFound,
    WouldMutate,
)
from ghostgpu.controller.ledger import LedgerEntry, ReplicaLedger
from ghostgpu.controller.managers import (
    Resolver,
    manager_workload,
    owner_of_view,
    register_kinds,
    resource_type,
)
from ghostgpu.controller.reconciler import Snapshot, accounting_from
from ghostgpu.controller.slices import Capacity, dra_capacity, slice_view

KIND_ALIASES = {
    "deployment": "Deployment",
    "deployments": "Deployment",
    "deploy": "Deployment",
    "statefulset": "StatefulSet",
    "statefulsets": "StatefulSet",
    "sts": "StatefulSet",
    "pod": "Pod",
    "pods": "Pod",
    "po": "Pod",
}


class RestoreError(Exception):
    pass


def parse_target(target: str, namespace: str, table: ActuatorTable | None = None) -> WorkloadRef:
    """KIND/NAME or KIND.GROUP/NAME (kubectl's spelling: `job.batch.volcano.sh/train`). KIND is a kind
    of the actuator table in any case, its plural, or an alias; KIND alone must name one API group
    (Deployment, StatefulSet, Pod, or the one row of that kind), else the error lists the
    KIND.GROUP spellings to choose from."""
    table = table or ActuatorTable()
    # (lower-case kind or plural or alias) -> {(group, kind)}
    names: dict[str, set[tuple[str, str]]] = {}
    for alias, kind in KIND_ALIASES.items():
        names.setdefault(alias, set()).add((CORE_GROUPS[kind], kind))
    for a in table.managers:
        for alias in (a.kind.lower(), a.plural):
            names.setdefault(alias, set()).add(a.group_kind)
    for kind, group in CORE_GROUPS.items():  # a bare `job` could mean batch/v1's too
        if kind.lower() in names:
            names[kind.lower()].add((group, kind))
    spelled, sep, name = target.partition("/")
    if not sep or not name or "/" in name:
        raise RestoreError(f"expected KIND/NAME or KIND.GROUP/NAME, got {target!r}")
    kind_part, dot, group = spelled.partition(".")
    found = names.get(kind_part.lower(), set())
    if dot:
        found = {gk for gk in found if gk[0] == group.lower()}
    if not found:
        known = ", ".join(sorted({f"{k.lower()}.{g}" if g else k.lower() for g, k in _restorable(table)}))
        raise RestoreError(f"{spelled!r} is no kind ghostgpu restores (one of {known}), in {target!r}")
    if len(found) > 1:
        choices = " or ".join(sorted(f"{k.lower()}.{g}/{name}" for g, k in found))
        raise RestoreError(f"kind {kind_part!r} is in more than one API group: name one, {choices}")
    ((group, kind),) = found
    if (group, kind) not in _restorable(table):  # a bare `job.batch`: no row, never stopped
        raise RestoreError(f"{kind.lower()}.{group} has no actuator row: ghostgpu never stops it")
    return WorkloadRef(kind, namespace, name, group)


def _restorable(table: ActuatorTable) -> set[tuple[str, str]]:
    return {("", "Pod"), *POD_CONTROLLERS, *(a.group_kind for a in table.managers)}


@dataclass(frozen=True)
class Restored:
    ref: WorkloadRef
    replicas: int | None  # None: a manager restored through its actuator (see `what`)
    what: str = ""

    def summary(self) -> str:
        if self.replicas is None:
            return f"restored {self.ref.short} in {self.ref.namespace}: {self.what}"
        return f"restored {self.ref.short} in {self.ref.namespace} to {self.replicas} replicas"


async def restore(
    target: str,
    namespace: str,
    *,
    kubeconfig: str | None = None,
    ledger_namespace: str = ControllerConfig().namespace,
    table: ActuatorTable | None = None,
) -> Restored:
    """Scale back to `ghostgpu.io/reclaimed-from-replicas` (the annotation, else the replica
    ledger in `ledger_namespace`, the controller's namespace) and clear the record; a manager
    stopped through an annotation or a field (RayCluster, Notebook, ...) is undone from its
    `ghostgpu.io/reclaimed-from` record (actuators.py)."""
    table = table or ActuatorTable()
    ref = parse_target(target, namespace, table)
    if ref.kind == "Pod":
        raise RestoreError("an evicted bare Pod cannot be scaled back; re-create it from its manifest")
    register_kinds(table)
    # Its own field manager: the controller's revert guard tells restore's scale from a revert.
    cluster = Cluster(await _kube_api(kubeconfig), instance="ghostgpu-restore", field_manager=RESTORE_MANAGER)
    return await restore_any(cluster, ref, ReplicaLedger(cluster, ledger_namespace), table)


async def restore_any(
    cluster: Any, ref: WorkloadRef, ledger: ReplicaLedger, table: ActuatorTable
) -> Restored:
    a = table.for_ref(ref)
    if a is None or a.stop == "scale":
        return await restore_workload(cluster, ref, ledger)
    try:
        done = await stops.restore(cluster, ref, a)
    except stops.NotReclaimed as exc:
        raise RestoreError(str(exc)) from None
    except NotFound:
        raise RestoreError(f"{ref.short} not found in {ref.namespace}") from None
    return Restored(ref, None, done.what)


async def restore_workload(cluster: Any, ref: WorkloadRef, ledger: ReplicaLedger) -> Restored:
    """The annotation is removed with a resourceVersion precondition so that two concurrent restores
    cannot both succeed; the verdict annotations are cleared too, so the controller judges the
    restored pods from scratch (after their start-up grace) and records the next verdict anew.
    Without the annotation the ledger entry is taken the same way (see ledger.py); the workload's
    metadata is then left alone (it refused writes, and once at zero ready replicas Kueue's webhook
    would accept one and add its queue-name label to the workload)."""
    obj = await cluster.get(ref)
    meta = obj.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(keys.RECLAIMED_FROM)
    if raw is None:
        return await _restore_from_ledger(cluster, ref, obj, ledger)
    try:
        replicas = int(raw)
    except ValueError as exc:
        raise RestoreError(f"{keys.RECLAIMED_FROM}={raw!r} is not a replica count") from exc
    if replicas < 1:
        raise RestoreError(f"{keys.RECLAIMED_FROM}={replicas}: nothing to restore")
    note = ""
    try:
        await cluster.patch_annotations(
            ref,
            {keys.RECLAIMED_FROM: None, keys.RECLAIMED_AT: None, keys.VERDICT: None, keys.EVIDENCE: None},
            resource_version=meta.get("resourceVersion"),
            current=obj,
        )
    except WouldMutate:
        # The dry-run shows Kueue's webhook adding queue-name (the namespace got a LocalQueue
        # `default` after the reclaim; at 0 ready replicas Kueue accepts that write): leave the
        # metadata alone and only scale back. The record stays (a second restore scales to the same
        # count again); it cannot be cleared without rolling the workload into Kueue.
        note = f" ({keys.RECLAIMED_FROM} left in place: clearing it would make Kueue add queue-name)"
    try:
        await cluster.scale(ref, replicas)
    except Exception:
        # The scale did not land (e.g. the apiserver answered 429/500): put the count back, or the
        # workload would stay at 0 with nothing left to restore it from (found by the fault suite).
        if not note:
            await cluster.patch_annotations(ref, {keys.RECLAIMED_FROM: raw})
        raise
    await cluster.event(
        obj,
        reason="Restored",
        message=f"ghostgpu restore: scaled {ref.short} back to {replicas} replicas{note}",
    )
    return Restored(ref, replicas)


async def _restore_from_ledger(
    cluster: Any, ref: WorkloadRef, obj: dict[str, Any], ledger: ReplicaLedger
) -> Restored:
    meta = obj.get("metadata") or {}
    where = f"{ref.short} in {ref.namespace}"
    entry = await ledger.get(ref)
    if entry is None:
        raise RestoreError(
            f"{where} has no {keys.RECLAIMED_FROM} annotation and no entry in the replica ledger "
            f"{ledger.namespace}/{ledger.name}: not reclaimed"
        )
    if entry.uid != meta.get("uid"):
        raise RestoreError(
            f"the replica ledger entry for {where} belongs to an earlier object of that name "
            f"(uid {entry.uid}); not restoring"
        )
    if entry.replicas < 1:
        raise RestoreError(
            f"the replica ledger records {entry.replicas} replicas for {where}: nothing to restore"
        )
    taken = await ledger.take(ref)
    if taken is None or taken != entry:
        raise RestoreError(f"the replica ledger entry for {where} changed meanwhile (a concurrent restore?)")
    try:
        await cluster.scale(ref, entry.replicas)
    except Exception:
        # Keep the record, as for the annotation: a failed scale must not lose the count.
        await ledger.record(ref, LedgerEntry(entry.replicas, entry.uid, entry.at))
        raise
    await cluster.event(
        obj,
        reason="Restored",
        message=(
            f"ghostgpu restore: scaled {ref.short} back to {entry.replicas} replicas"
            " (from the replica ledger)"
        ),
    )
    return Restored(ref, entry.replicas)


async def status(loaded: LoadedConfig, *, kubeconfig: str | None = None) -> list[FlavorAccount]:
    """The accounting gap from the cluster as it is now (verdicts from the workloads' annotations)."""
    cluster, flavors, snap, cqs = await _status_snapshot(loaded, kubeconfig)
    accounts = accounting_from(flavors, snap, cqs)
    await _fill_reservations(cluster, loaded, flavors, snap, cqs, accounts)
    return accounts


async def status_by_owner(loaded: LoadedConfig, *, kubeconfig: str | None = None) -> list[Any]:
    """GPUs held outside Kueue by top owner kind (books/owners.py)."""
    from ghostgpu.controller.books.books import opted_in_pods_of
    from ghostgpu.controller.books.owners import by_owner_kind

    _, _, snap, _ = await _status_snapshot(loaded, kubeconfig)
    return by_owner_kind(snap, opted_in_pods_of(snap))


async def _status_snapshot(
    loaded: LoadedConfig, kubeconfig: str | None
) -> tuple[Cluster, list[FlavorSpec], Snapshot, list[Any]]:
    """The cluster as the controller's caches would show it: one list per kind."""
    api = await _kube_api(kubeconfig)
    cluster = Cluster(api, instance="ghostgpu-status")
    is_gpu = gpu_predicate(
        [f.resource for f in loaded.flavors or [] if f.device_class is None],
        dra_extended_aliases(loaded.controller),
    )
    dra = dra_flavor_specs(loaded.controller)
    flavors: list[FlavorSpec] = loaded.flavors or (await discover_flavors(cluster, is_gpu) + dra)
    tracked: dict[WorkloadRef, Any] = {}
    chain: dict[tuple[str, str, str], OwnerRef | None] = {}  # Deployment/StatefulSet/Job -> its owner
    listed = (("Deployment", DEPLOYMENTS), ("StatefulSet", STATEFULSETS), ("Job", JOBS), ("Pod", PODS))
    for kind, rt in listed:
        for obj in await cluster.list(rt):
            meta = obj.get("metadata") or {}
            if kind != "Pod":
                chain[(kind, meta.get("namespace", ""), meta.get("name", ""))] = controller_owner(meta)
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if kind == "Job" or labels.get(keys.TRACKED_LABEL) != "true":
                continue
            owners = (obj.get("metadata") or {}).get("ownerReferences") or []
            if kind == "Pod" and any(o.get("controller") for o in owners):
                continue
            wl = workload_from(kind, obj, is_gpu)
            tracked[wl.ref] = wl
    namespaces = {
        (n.get("metadata") or {}).get("name", ""): dict((n.get("metadata") or {}).get("labels") or {})
        for n in await cluster.list(NAMESPACES)
    }
    nodes = [_slim_node(n) for n in await cluster.list(NODES)]
    for n in nodes:
        n.update(node_labels_for_books(n, flavors))
    pods = [pod_view(p, is_gpu) for p in await cluster.list(PODS)]
    if dra:  # DRA flavors: a pod's GPUs are also the devices allocated to its ResourceClaims
        claims = {(c.namespace, c.name): c for c in map(claim_view, await cluster.list(RESOURCECLAIMS))}
        pods = DraCounter(sorted({f.key for f in dra})).pods(pods, claims)
    try:
        cqs = await cluster.list(CLUSTERQUEUES)
    except Exception:
        cqs = []
    # The workloads at the top of their owner chains, as the controller sees them (managers.py).
    table = ActuatorTable(loaded.controller.actuators)
    managers: dict[WorkloadRef, Any] = {}
    for a in table.managers:
        try:
            objs = await cluster.list(resource_type(a))
        except Exception:  # no CRD, or no right to read it: that kind has no workload here
            continue
        for obj in objs:
            wl = manager_workload(a, obj, is_gpu)
            managers[wl.ref] = wl
    by_pod = {(p.namespace, p.name): p for p in pods}

    def pod_owner(ns: str, name: str) -> OwnerRef | None:
        v = by_pod.get((ns, name))
        return owner_of_view(v)

    res = Resolver(table).resolve(tracked, chain, managers, pods, pod_owner)
    capacity = await _dra_capacity(cluster, flavors, nodes) if dra else {}
    snap = Snapshot(
        namespaces=namespaces,
        workloads=res.workloads,
        pods=pods,
        nodes=nodes,
        top_of=res.top_of,
        holder_of=res.holder_of,
        dra_capacity=capacity,
    )
    return cluster, flavors, snap, cqs


async def _dra_capacity(cluster: Cluster, flavors: list[FlavorSpec], nodes: list[Any]) -> dict[str, Capacity]:
    """The DRA flavors' devices (slices.py); unknown, with the reason, when the slices or the
    classes cannot be listed (an older cluster, or no right to read them)."""
    try:
        slices = [slice_view(o) for o in await cluster.list(RESOURCESLICES)]
        classes = {c.name: c for c in map(class_view, await cluster.list(DEVICECLASSES))}
    except Exception as exc:
        why = f"cannot list ResourceSlices and DeviceClasses: {type(exc).__name__}: {str(exc)[:200]}"
        return {f.name: Capacity(None, why) for f in flavors if f.device_class is not None}
    return dra_capacity(flavors, nodes, slices, classes)


async def _fill_reservations(
    cluster: Cluster, loaded: LoadedConfig, flavors: list[FlavorSpec], snap: Snapshot, cqs: Any, accounts: Any
) -> None:
    """What the reservation counts (controller.reservation) and what Kueue admitted of it; which
    ClusterQueues it skips (a MultiKueue manager's) and what a MultiKueue manager sent here."""
    from ghostgpu.controller.books import multikueue
    from ghostgpu.controller.books.reservation import (
        LOCALQUEUES,
        RESERVATION_LABEL,
        WORKLOADS,
        Placeholder,
        admitted_by_flavor,
        cq_flavors,
        desired_from,
        fill_accounts,
    )

    try:
        lqs = await cluster.list(LOCALQUEUES)
        workloads = await cluster.list(WORKLOADS)
    except Exception:
        return  # no Kueue: nothing reserved
    placeholders = [
        Placeholder.from_object(w)
        for w in workloads
        if ((w.get("metadata") or {}).get("labels") or {}).get(RESERVATION_LABEL) == "true"
    ]
    skipped: dict[str, str] = {}
    if multikueue.needs_admission_checks(cqs):
        try:
            skipped = multikueue.skipped_queues(cqs, await cluster.list(multikueue.ADMISSIONCHECKS))
        except Exception as exc:  # as the controller does: unreadable checks skip their queues
            skipped = multikueue.skipped_queues(cqs, None, unreadable=f"{type(exc).__name__}: {exc}"[:200])
    desired = desired_from(
        flavors, snap, cqs, lqs, local_queue=loaded.controller.reservation_queue, skip=skipped
    )
    fill_accounts(accounts, desired, admitted_by_flavor(placeholders))
    multikueue.fill_accounts(accounts, skipped, cq_flavors(cqs), workloads)
