"""Managers: every GPU pod's workload is the top of its controller chain
(docs/design.md#managers-and-actuators).

Pod -> ReplicaSet -> Deployment -> InferenceService/NIMService/LLMInferenceService, Pod ->
StatefulSet -> Notebook/Workspace/LeaderWorkerSet, Pod -> RayCluster -> RayJob/RayService, Pod ->
Job -> JobSet -> TrainJob, Pod -> PyTorchJob, then a KEDA ScaledObject that targets the top
Deployment/StatefulSet. The verdict is taken on that top object as one workload over all its GPU
pods, and a reclaim acts on it through its actuator (actuators.py).

Everything comes from watch caches, nothing is fetched per pod:
- `owners`: every Deployment, StatefulSet and batch Job (tracked or not: the Notebook controller
  strips the labels it did not generate from its StatefulSet), reduced to its controller
  ownerReference;
- one cache per manager kind of the actuator table (all objects of the kind, as Workloads);
- ScaledObjects by target.
A ReplicaSet is known by its name (`<deployment>-<pod-template-hash>`, as before), so ReplicaSets
are not watched. Each pod's immediate owner is resolved once per poll (memoised): O(1) per pod.

A controller owner of a kind with no actuator stops the walk: the workload is that owner, judged
over its pods, never written (`Workload.no_actuator`), and its reclaim is escalated once; so is a
manager of a `stop: none` row (RayService) or one its stop's `requires` rules out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ghostgpu.actuators import POD_CONTROLLERS, Actuator, ActuatorTable, expand
from ghostgpu.config import KUEUE_MANAGED_LABEL, KUEUE_QUEUE_LABEL
from ghostgpu.controller.inventory import (
    GpuPredicate,
    OwnerRef,
    PodView,
    Workload,
    WorkloadRef,
    _gpu_requests,
    controller_owner,
    is_tracked,
    owner_workload,
    parse_time,
    slim_raw,
)
from ghostgpu.controller.kube import JOBS, RESOURCE_OF_KIND, Reflector, ResourceType, status_of
from ghostgpu.controller.packing import pack

log = logging.getLogger("ghostgpu.controller.managers")

MAX_DEPTH = 8  # ownerReference chains are short; a cycle (a broken object) must not loop
# Kinds whose objects are cached reduced to their controller owner: the Deployments and StatefulSets
# (tracked or not) and batch Jobs, which JobSets own (Pod -> Job -> JobSet -> TrainJob).
OWNER_INDEXED = (*POD_CONTROLLERS, "Job")
KEDA_SCALED_OBJECT = "ScaledObject"


def resource_type(a: Actuator) -> ResourceType:
    return ResourceType(a.api_version, a.plural, kind=a.kind)


def register_kinds(table: ActuatorTable) -> None:
    """Let Cluster.get/patch/scale address the manager kinds (kube.RESOURCE_OF_KIND)."""
    for a in table.managers:
        RESOURCE_OF_KIND.setdefault(a.kind, resource_type(a))


def manager_workload(a: Actuator, obj: Mapping[str, Any], is_gpu: GpuPredicate) -> Workload:
    """A manager object as a Workload: GPUs per pod from its pod templates (the largest one, so the
    risk gate never under-counts), replicas from its replica pointer(s) summed (1 without)."""
    meta = obj.get("metadata") or {}
    per_template = [_gpu_requests([c], is_gpu) for c in a.container_specs(obj)]
    gpus: dict[str, float] = {}
    for req in per_template:
        for r, n in req.items():
            gpus[r] = max(gpus.get(r, 0.0), n)
    replicas = 1
    if a.replicas:
        counts = [int(v) for v in expand(obj, a.replicas) if isinstance(v, int | float)]
        replicas = sum(counts) if counts else 1
    return Workload(
        ref=WorkloadRef(a.kind, meta.get("namespace", ""), meta.get("name", "")),
        uid=meta.get("uid", ""),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        created_at=parse_time(meta.get("creationTimestamp")),
        replicas=replicas,
        selector=None,
        volumes=0,
        gpus_per_pod=gpus,
        raw_packed=pack(slim_raw(obj)),
        owner=controller_owner(meta),
        # A kind with no stop, or an object its stop does not apply to: judged, never written.
        no_actuator=not a.can_stop(obj),
    )


def unactuated_workload(owner: OwnerRef, namespace: str, via: Workload | None) -> Workload:
    """The workload of a controller owner with no actuator: only its ownerReference is known (it is
    not watched: ghostgpu has no rights on it). Events name it; nothing is ever written to it or
    to its children."""
    raw = {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "metadata": {"name": owner.name, "namespace": namespace, "uid": owner.uid},
    }
    return Workload(
        ref=WorkloadRef(owner.kind, namespace, owner.name),
        uid=owner.uid,
        labels={},
        annotations={},
        created_at=via.created_at if via else None,
        replicas=via.replicas if via else 1,
        selector=None,
        volumes=via.volumes if via else 0,
        gpus_per_pod=dict(via.gpus_per_pod) if via else {},
        raw_packed=pack(raw),
        no_actuator=True,
    )


def kueue_managed(labels: Mapping[str, str]) -> bool:
    return KUEUE_QUEUE_LABEL in labels or labels.get(KUEUE_MANAGED_LABEL) == "true"


@dataclass
class Resolution:
    """One poll's view: which workloads exist at the top and how a pod finds its top."""

    workloads: dict[WorkloadRef, Workload]
    _chain_top: dict[tuple[str, str, str], WorkloadRef | None] = field(default_factory=dict)
    # (kind, ns, name) -> its controller owner, as the caches know it (Resolver.resolve's walk).
    _parent: Callable[[str, str, str], OwnerRef | None] | None = None

    def top_of(self, pod: PodView) -> WorkloadRef | None:
        if pod.owner_kind is None:
            return WorkloadRef("Pod", pod.namespace, pod.name)
        if pod.owner_kind == "ReplicaSet":
            dep = owner_workload(pod)  # by name; None for a ReplicaSet no Deployment owns
            if dep is None:
                return None
            start = (dep.kind, dep.namespace, dep.name)
        else:
            start = (pod.owner_kind, pod.namespace, pod.owner_name or "")
        return self._chain_top.get(start)

    def holder_of(self, pod: PodView) -> WorkloadRef:
        """The top of the pod's controller chain as far as the caches see it, tracked or not: who
        holds the GPUs of a pod no workload accounts for (books/untracked.py). A kind nobody
        watches (a Job, an operator with no row) ends the walk and is named as the holder."""
        if pod.owner_kind is None:
            return WorkloadRef("Pod", pod.namespace, pod.name)
        kind, name = pod.owner_kind, pod.owner_name or ""
        if kind == "ReplicaSet":
            dep = owner_workload(pod)
            if dep is None:
                return WorkloadRef(kind, pod.namespace, name)
            kind, name = dep.kind, dep.name
        for _ in range(MAX_DEPTH):
            owner = self._parent(kind, pod.namespace, name) if self._parent is not None else None
            if owner is None or owner.kind == "ReplicaSet":
                break
            kind, name = owner.kind, owner.name
        return WorkloadRef(kind, pod.namespace, name)


class Resolver:
    """Pure: the caches' contents in, a Resolution out (unit-tested without a cluster)."""

    def __init__(self, table: ActuatorTable) -> None:
        self.table = table

    def resolve(
        self,
        tracked: Mapping[WorkloadRef, Workload],
        owners: Mapping[tuple[str, str, str], OwnerRef | None],
        managers: Mapping[WorkloadRef, Workload],
        pods: Iterable[PodView],
        pod_owner: Callable[[str, str], OwnerRef | None] | None = None,
    ) -> Resolution:
        """`tracked`: labelled Deployments/StatefulSets/bare Pods; `owners`: (kind, ns, name) ->
        controller owner of every Deployment/StatefulSet/Job; `managers`: every object of the table's
        manager kinds (ScaledObjects included); `pod_owner`: (ns, name) -> a pod's controller owner
        (a LeaderWorkerSet's worker StatefulSet is owned by its leader Pod)."""
        by_target: dict[tuple[str, str, str], WorkloadRef] = {}
        for ref, wl in managers.items():
            if ref.kind == KEDA_SCALED_OBJECT:
                target = (wl.raw.get("spec") or {}).get("scaleTargetRef") or {}
                kind = str(target.get("kind") or "Deployment")
                by_target[(kind, ref.namespace, str(target.get("name", "")))] = ref
        out: dict[WorkloadRef, Workload] = {}
        res = Resolution(out)
        memo = res._chain_top

        def parent(kind: str, ns: str, name: str) -> OwnerRef | None:
            if kind in POD_CONTROLLERS:
                wl = tracked.get(WorkloadRef(kind, ns, name))
                return wl.owner if wl is not None else owners.get((kind, ns, name))
            if kind == "Pod":
                return pod_owner(ns, name) if pod_owner is not None else None
            if kind == "Job":
                return owners.get((kind, ns, name))
            mgr = managers.get(WorkloadRef(kind, ns, name))
            return mgr.owner if mgr is not None else None

        res._parent = parent

        def top(kind: str, ns: str, name: str) -> WorkloadRef | None:
            key = (kind, ns, name)
            if key in memo:
                return memo[key]
            chain = [WorkloadRef(kind, ns, name)]
            owner = parent(kind, ns, name)
            unactuated: OwnerRef | None = None
            while owner is not None and len(chain) < MAX_DEPTH:
                ref = WorkloadRef(owner.kind, ns, owner.name)
                if owner.kind == "ReplicaSet" or owner.kind == "Pod":
                    if owner.kind == "ReplicaSet":  # owns nothing here but pods; name it by its owner
                        break
                    chain.append(ref)  # a leader Pod owns its LeaderWorkerSet group's StatefulSet
                    owner = parent("Pod", ns, owner.name)
                    continue
                if owner.kind not in POD_CONTROLLERS and self.table.get(owner.kind) is None:
                    unactuated = owner
                    chain.append(ref)
                    break
                if owner.kind not in POD_CONTROLLERS and ref not in managers:
                    # Its kind has an actuator but the cache does not hold it (yet): judge nothing
                    # rather than act on the child the owner would rewrite.
                    memo[key] = None
                    return None
                chain.append(ref)
                owner = parent(owner.kind, ns, owner.name)
            head = chain[-1]
            scaler = by_target.get((head.kind, ns, head.name)) if head.kind in POD_CONTROLLERS else None
            if scaler is not None:
                chain.append(scaler)
                head = scaler
            memo[key] = self._admit(head, chain, unactuated, tracked, managers, out)
            return memo[key]

        for pod in pods:
            if pod.owner_kind is None:
                continue
            if pod.owner_kind == "ReplicaSet":
                dep = owner_workload(pod)
                if dep is not None:
                    top(dep.kind, dep.namespace, dep.name)
            else:
                top(pod.owner_kind, pod.namespace, pod.owner_name or "")
        # Tracked workloads with no pod right now (reclaimed, pending) still count, at their top.
        for ref, wl in tracked.items():
            if ref.kind == "Pod":
                out.setdefault(ref, wl)
            else:
                top(ref.kind, ref.namespace, ref.name)
        # A tracked manager with no pod (suspended, stopped) is still a workload.
        for ref, wl in managers.items():
            if is_tracked(wl.labels) and not kueue_managed(wl.labels) and wl.owner is None:
                out.setdefault(ref, wl)
        return res

    @staticmethod
    def _admit(
        head: WorkloadRef,
        chain: list[WorkloadRef],
        unactuated: OwnerRef | None,
        tracked: Mapping[WorkloadRef, Workload],
        managers: Mapping[WorkloadRef, Workload],
        out: dict[WorkloadRef, Workload],
    ) -> WorkloadRef | None:
        """The head becomes a workload when it or an object below it carries the tracked label
        (Kyverno labels GPU objects Kueue does not manage) and the head is not Kueue's."""
        via = next((tracked[r] for r in chain if r in tracked), None)
        if unactuated is not None:
            if via is None:
                return None
            out.setdefault(head, unactuated_workload(unactuated, head.namespace, via))
            return head
        if head.kind in POD_CONTROLLERS:
            wl = tracked.get(head)
            if wl is None:
                return None
            out[head] = wl
            return head
        mgr = managers.get(head)
        if mgr is None or kueue_managed(mgr.labels):
            return None
        if (
            via is None
            and not is_tracked(mgr.labels)
            and not any(is_tracked(managers[r].labels) for r in chain if r in managers)
        ):
            return None
        out[head] = mgr
        return head


class OptionalReflector(Reflector):
    """A watch of a kind whose CRD may not be installed, or that the controller may not be allowed
    to list (RBAC rendered before the kind was added): a failed first list leaves the cache empty
    and synced (readiness does not wait for an operator the cluster does not run) and is tried
    again after `recheck` seconds, then twice as long each time up to `max_recheck`, so a CRD
    installed later is picked up within ten minutes while a kind the cluster never runs costs one
    list per ten minutes, not one a minute for ever. An empty cache is safe: a pod whose owner is of
    a known kind but not in the cache is not judged at all."""

    def __init__(self, *args: Any, recheck: float = 60.0, max_recheck: float = 600.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recheck, self.max_recheck = recheck, max_recheck

    async def run(self) -> None:
        from kr8s._exceptions import ServerError

        delay = self.recheck
        while True:
            try:
                await self._list()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                missing = isinstance(exc, ServerError) and status_of(exc) == 404
                (log.info if missing else log.warning)(
                    "manager kind not listed, retrying later",
                    extra={"resource": self.rtype.plural, "error": f"{type(exc).__name__}: {str(exc)[:200]}"},
                )
                self.store = {}
                self.synced.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_recheck)
        await super().run()  # listed once: the plain reflector lists again and watches from there


class ManagerInformers:
    """The watch caches managers.py needs, next to app.Informers' own."""

    def __init__(self, api: Any, is_gpu: GpuPredicate, table: ActuatorTable) -> None:
        self.table = table
        self.resolver = Resolver(table)
        register_kinds(table)

        def owner_of(o: dict[str, Any]) -> OwnerRef | None:
            return controller_owner(o.get("metadata") or {})

        kinds = {**RESOURCE_OF_KIND, "Job": JOBS}
        self.owners = [Reflector(api, kinds[k], transform=owner_of) for k in OWNER_INDEXED]
        self.managers = [
            OptionalReflector(api, resource_type(a), transform=lambda o, a=a: manager_workload(a, o, is_gpu))
            for a in table.managers
        ]

    @property
    def reflectors(self) -> list[Reflector]:
        return [*self.owners, *self.managers]

    def resolve(
        self,
        tracked: Mapping[WorkloadRef, Workload],
        pods: Iterable[PodView],
        pod_owner: Callable[[str, str], OwnerRef | None] | None = None,
    ) -> Resolution:
        owners: dict[tuple[str, str, str], OwnerRef | None] = {}
        for kind, r in zip(OWNER_INDEXED, self.owners, strict=True):
            for (ns, name), owner in r.store.items():
                if owner is not None:
                    owners[(kind, ns, name)] = owner
        managers = {wl.ref: wl for r in self.managers for wl in r.store.values()}
        return self.resolver.resolve(tracked, owners, managers, pods, pod_owner)


__all__ = [
    "ManagerInformers",
    "OptionalReflector",
    "Resolution",
    "Resolver",
    "manager_workload",
    "register_kinds",
    "unactuated_workload",
]
