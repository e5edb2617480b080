"""Managers: every GPU pod's workload is the top of its controller chain
(docs/design.md#managers-and-actuators).

Pod -> ReplicaSet -> Deployment -> InferenceService/NIMService/LLMInferenceService, Pod ->
StatefulSet -> Notebook/Workspace/LeaderWorkerSet, Pod -> RayCluster -> RayJob/RayService, Pod ->
Job -> JobSet -> TrainJob, Pod -> PyTorchJob/TFJob/MPIJob, Pod -> Volcano Job, then a KEDA
ScaledObject that targets the top Deployment/StatefulSet. Every link is known by its API group and
kind (an ownerReference's apiVersion): a pod of Volcano's `batch.volcano.sh` Job walks to Volcano's
row, a pod of a batch/v1 Job to the batch Job's owner. The verdict is taken on that top object as
one workload over all its GPU pods, and a reclaim acts on it through its actuator (actuators.py).

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
from ghostgpu.controller.kube import JOBS, RESOURCE_OF_KIND, ResourceType, status_of
from ghostgpu.controller.packing import pack
from ghostgpu.controller.reflector import Reflector

log = logging.getLogger("ghostgpu.controller.managers")

MAX_DEPTH = 8  # ownerReference chains are short; a cycle (a broken object) must not loop
# Kinds whose objects are cached reduced to their controller owner: the Deployments and StatefulSets
# (tracked or not) and batch Jobs, which JobSets own (Pod -> Job -> JobSet -> TrainJob).
OWNER_INDEXED: tuple[tuple[str, str], ...] = (*sorted(POD_CONTROLLERS), ("batch", "Job"))
KEDA_SCALED_OBJECT = ("keda.sh", "ScaledObject")
# (group, kind, namespace, name): one object in an owner chain.
Key = tuple[str, str, str, str]


def resource_type(a: Actuator) -> ResourceType:
    return ResourceType(a.api_version, a.plural, kind=a.kind)


def register_kinds(table: ActuatorTable) -> None:
    """Let Cluster.get/patch/scale address the manager kinds (kube.RESOURCE_OF_KIND)."""
    for a in table.managers:
        RESOURCE_OF_KIND.setdefault(a.group_kind, resource_type(a))


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
        ref=WorkloadRef(a.kind, meta.get("namespace", ""), meta.get("name", ""), a.group),
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
        ref=WorkloadRef(owner.kind, namespace, owner.name, owner.group),
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


def owner_of_view(v: PodView | None) -> OwnerRef | None:
    """A pod's controller owner from its cached view: kind, name and group (its apiVersion's version
    and the uid are not cached; `OwnerRef.group` reads the group from `<group>/`)."""
    if v is None or v.owner_group_kind is None:
        return None
    group, kind = v.owner_group_kind
    return OwnerRef(kind, v.owner_name or "", f"{group}/" if group else "v1", "")


def kueue_managed(labels: Mapping[str, str]) -> bool:
    return KUEUE_QUEUE_LABEL in labels or labels.get(KUEUE_MANAGED_LABEL) == "true"


@dataclass
class Resolution:
    """One poll's view: which workloads exist at the top and how a pod finds its top."""

    workloads: dict[WorkloadRef, Workload]
    _chain_top: dict[Key, WorkloadRef | None] = field(default_factory=dict)
    # (group, kind, ns, name) -> its controller owner, as the caches know it (Resolver.resolve's walk).
    _parent: Callable[[str, str, str, str], OwnerRef | None] | None = None

    def top_of(self, pod: PodView) -> WorkloadRef | None:
        start = _start(pod)
        if start is None:
            return WorkloadRef("Pod", pod.namespace, pod.name)
        return self._chain_top.get(start)

    def holder_of(self, pod: PodView) -> WorkloadRef:
        """The top of the pod's controller chain as far as the caches see it, tracked or not: who
        holds the GPUs of a pod no workload accounts for (books/untracked.py). A kind nobody
        watches (a Job, an operator with no row) ends the walk and is named as the holder."""
        gk = pod.owner_group_kind
        if gk is None:
            return WorkloadRef("Pod", pod.namespace, pod.name)
        (group, kind), name = gk, pod.owner_name or ""
        if gk == ("apps", "ReplicaSet"):
            dep = owner_workload(pod)
            if dep is None:
                return WorkloadRef(kind, pod.namespace, name, group)
            group, kind, name = dep.group, dep.kind, dep.name
        for _ in range(MAX_DEPTH):
            owner = self._parent(group, kind, pod.namespace, name) if self._parent is not None else None
            if owner is None or (owner.group, owner.kind) == ("apps", "ReplicaSet"):
                break
            group, kind, name = owner.group, owner.kind, owner.name
        return WorkloadRef(kind, pod.namespace, name, group)


def _start(pod: PodView) -> Key | None:
    """Where a pod's chain starts: its Deployment (a ReplicaSet is known by its name) or its
    controller owner; None for a bare pod; ("", "", "", "") for a ReplicaSet no Deployment owns."""
    gk = pod.owner_group_kind
    if gk is None:
        return None
    if gk == ("apps", "ReplicaSet"):
        dep = owner_workload(pod)  # by name; None for a ReplicaSet no Deployment owns
        return (dep.group, dep.kind, dep.namespace, dep.name) if dep is not None else ("", "", "", "")
    return (gk[0], gk[1], pod.namespace, pod.owner_name or "")


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
        controller owner of every Deployment/StatefulSet/batch Job (OWNER_INDEXED: one group per
        kind, so the kind names it); `managers`: every object of
        the table's manager kinds (ScaledObjects included); `pod_owner`: (ns, name) -> a pod's
        controller owner (a LeaderWorkerSet's worker StatefulSet is owned by its leader Pod)."""
        by_target: dict[Key, WorkloadRef] = {}
        for ref, wl in managers.items():
            if ref.group_kind == KEDA_SCALED_OBJECT:
                target = (wl.raw.get("spec") or {}).get("scaleTargetRef") or {}
                kind = str(target.get("kind") or "Deployment")
                group = str(target.get("apiVersion") or "apps/v1").rpartition("/")[0]
                by_target[(group, kind, ref.namespace, str(target.get("name", "")))] = ref
        out: dict[WorkloadRef, Workload] = {}
        res = Resolution(out)
        memo = res._chain_top
        table = self.table

        def parent(group: str, kind: str, ns: str, name: str) -> OwnerRef | None:
            if (group, kind) in POD_CONTROLLERS:
                wl = tracked.get(WorkloadRef(kind, ns, name, group))
                return wl.owner if wl is not None else owners.get((kind, ns, name))
            if (group, kind) == ("", "Pod"):
                return pod_owner(ns, name) if pod_owner is not None else None
            if (group, kind) in OWNER_INDEXED and table.get(group, kind) is None:
                return owners.get((kind, ns, name))
            mgr = managers.get(WorkloadRef(kind, ns, name, group))
            return mgr.owner if mgr is not None else None

        res._parent = parent

        def top(group: str, kind: str, ns: str, name: str) -> WorkloadRef | None:
            key = (group, kind, ns, name)
            if key in memo:
                return memo[key]
            chain = [WorkloadRef(kind, ns, name, group)]
            owner = parent(group, kind, ns, name)
            unactuated: OwnerRef | None = None
            while owner is not None and len(chain) < MAX_DEPTH:
                og = owner.group
                ref = WorkloadRef(owner.kind, ns, owner.name, og)
                if (og, owner.kind) == ("apps", "ReplicaSet"):
                    break  # owns nothing here but pods; name it by its owner
                if (og, owner.kind) == ("", "Pod"):
                    chain.append(ref)  # a leader Pod owns its LeaderWorkerSet group's StatefulSet
                    owner = parent("", "Pod", ns, owner.name)
                    continue
                pod_controller = (og, owner.kind) in POD_CONTROLLERS
                if not pod_controller and table.get(og, owner.kind) is None:
                    unactuated = owner
                    chain.append(ref)
                    break
                if not pod_controller and ref not in managers:
                    # Its kind has an actuator but the cache does not hold it (yet): judge nothing
                    # rather than act on the child the owner would rewrite.
                    memo[key] = None
                    return None
                chain.append(ref)
                owner = parent(og, owner.kind, ns, owner.name)
            head = chain[-1]
            if head.group_kind in POD_CONTROLLERS:
                scaler = by_target.get((head.group, head.kind, ns, head.name))
                if scaler is not None:
                    chain.append(scaler)
                    head = scaler
            memo[key] = self._admit(head, chain, unactuated, tracked, managers, out)
            return memo[key]

        for pod in pods:
            start = _start(pod)
            if start is not None and start[1]:
                top(*start)
        # Tracked workloads with no pod right now (reclaimed, pending) still count, at their top.
        for ref, wl in tracked.items():
            if ref.group_kind == ("", "Pod"):
                out.setdefault(ref, wl)
            else:
                top(ref.group, ref.kind, ref.namespace, ref.name)
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
        if head.group_kind in POD_CONTROLLERS:
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


class ServedGroupVersions:
    """The group/versions the apiserver serves (one GET /apis, which every authenticated user may
    read), shared by the manager kinds that recheck together and kept `ttl` seconds. A cluster
    without a dozen operators then costs one discovery request per recheck, not one 404 list per
    absent kind (12 in the bench's cluster). A served group/version proves nothing about the kind
    (another CRD of the group may serve it): the kind is listed to find out. `None`: discovery
    failed, and every kind is listed as without it."""

    def __init__(self, api: Any, ttl: float = 30.0) -> None:
        self.api, self.ttl = api, ttl
        self._served: set[str] | None = None
        self._at: float | None = None
        self._lock = asyncio.Lock()

    async def serves(self, rtype: ResourceType) -> bool | None:
        async with self._lock:
            now = asyncio.get_running_loop().time()
            if self._at is None or now - self._at > self.ttl:
                self._served = await self._discover()
                self._at = now
        return None if self._served is None else rtype.version in self._served

    async def _discover(self) -> set[str] | None:
        try:
            async with self.api.call_api("GET", base="/apis", version="", url="") as resp:
                body = resp.json()
            return {v["groupVersion"] for g in body["groups"] for v in g.get("versions") or []}
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info(
                "API discovery failed, listing each manager kind",
                extra={"error": f"{type(exc).__name__}: {exc}"[:200]},
            )
            return None


class OptionalReflector(Reflector):
    """A watch of a kind whose CRD may not be installed, or that the controller may not be allowed
    to list (RBAC rendered before the kind was added): a failed first list leaves the cache empty
    and synced (readiness does not wait for an operator the cluster does not run) and is tried
    again after `recheck` seconds, then twice as long each time up to `max_recheck`, so a CRD
    installed later is picked up within ten minutes while a kind the cluster never runs costs one
    list per ten minutes, not one a minute for ever. With `served`, a kind whose group/version the
    apiserver does not serve is not listed at all (one discovery request for all of them). An empty
    cache is safe: a pod whose owner is of a known kind but not in the cache is not judged at all."""

    def __init__(
        self,
        *args: Any,
        recheck: float = 60.0,
        max_recheck: float = 600.0,
        served: ServedGroupVersions | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.recheck, self.max_recheck, self.served = recheck, max_recheck, served

    async def run(self, listed: bool = False) -> None:
        from kr8s._exceptions import ServerError

        delay = self.recheck
        while not listed:
            try:
                if self.served is not None and await self.served.serves(self.rtype) is False:
                    missing, error = True, f"{self.rtype.version} is not served"
                else:
                    await self._list()
                    break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                missing = isinstance(exc, ServerError) and status_of(exc) == 404
                error = f"{type(exc).__name__}: {str(exc)[:200]}"
            (log.info if missing else log.warning)(
                "manager kind not listed, retrying later",
                extra={"resource": self.rtype.plural, "error": error},
            )
            self.store = {}
            self.synced.set()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_recheck)
        await super().run(listed=True)  # the plain reflector watches from that list on


class ManagerInformers:
    """The watch caches managers.py needs, next to app.Informers' own."""

    def __init__(self, api: Any, is_gpu: GpuPredicate, table: ActuatorTable) -> None:
        self.table = table
        self.resolver = Resolver(table)
        register_kinds(table)

        def owner_of(o: dict[str, Any]) -> OwnerRef | None:
            return controller_owner(o.get("metadata") or {})

        kinds = {**RESOURCE_OF_KIND, ("batch", "Job"): JOBS}
        self.owners = [Reflector(api, kinds[gk], transform=owner_of) for gk in OWNER_INDEXED]
        served = ServedGroupVersions(api)
        self.managers = [
            OptionalReflector(
                api, resource_type(a), transform=lambda o, a=a: manager_workload(a, o, is_gpu), served=served
            )
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
        for (_, kind), r in zip(OWNER_INDEXED, self.owners, strict=True):
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
    "ServedGroupVersions",
    "manager_workload",
    "owner_of_view",
    "register_kinds",
    "unactuated_workload",
]
