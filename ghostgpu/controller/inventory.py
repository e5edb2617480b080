"""What the controller tracks, computed from the watch caches (pure: no I/O, no clock).

A tracked workload is a Deployment, StatefulSet or bare Pod labelled `ghostgpu.io/tracked=true`
(by Kyverno) in a namespace labelled `ghostgpu.io/reclaim=enabled`. Its pods are found through
owner references (Pod -> ReplicaSet -> Deployment, Pod -> StatefulSet) and checked against the
workload's selector, so a pod that merely shares a name prefix is never attributed to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from sys import intern
from types import MappingProxyType
from typing import Any, NamedTuple

from ghostgpu.actuators import CORE_GROUPS, POD_CONTROLLERS, default_group, group_of, known_groups
from ghostgpu.config import GPU_RESOURCE_PREFIXES
from ghostgpu.controller import keys
from ghostgpu.controller.claims import (
    ClaimPeer,
    ContainerClaim,
    pod_claim_names,
    pod_container_claims,
)
from ghostgpu.controller.packing import pack, unpack
from ghostgpu.quantity import Quantity
from ghostgpu.signals.dra import DraDevice
from ghostgpu.signals.faults import PodFaults, pod_faults


class _Ref(NamedTuple):
    kind: str
    namespace: str
    name: str
    group: str


class WorkloadRef(_Ref):
    """(kind, namespace, name, group), ordered that way. A tuple, not a dataclass: refs key every
    per-workload dict of a poll (~10⁵ lookups at N = 10,000) and a tuple hashes in C. `group` is the
    API group (two groups may name a kind alike: batch/v1 and Volcano's Job); left out, it is the
    group the kind means in Kubernetes or the one built-in row that has it (actuators.default_group)."""

    __slots__ = ()

    def __new__(cls, kind: str, namespace: str, name: str, group: str | None = None) -> WorkloadRef:
        return super().__new__(cls, kind, namespace, name, default_group(kind) if group is None else group)

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    @property
    def group_kind(self) -> tuple[str, str]:
        return (self.group, self.kind)

    @property
    def target(self) -> str:
        """kubectl's KIND/NAME, KIND.GROUP/NAME where the kind alone could mean another group
        (`job.batch.volcano.sh/x`, `job.batch/x`): what `ghostgpu restore` takes."""
        if not self.group or set(known_groups(self.kind)) <= {self.group}:
            return f"{self.kind.lower()}/{self.name}"
        return f"{self.kind.lower()}.{self.group}/{self.name}"

    @property
    def short(self) -> str:
        """A readable name: KIND/NAME for Kubernetes' own kinds (a batch Job is `job/x`, as in
        kubectl), else `target`."""
        if self.group == CORE_GROUPS.get(self.kind):
            return f"{self.kind.lower()}/{self.name}"
        return self.target


class OwnerRef(NamedTuple):
    """An object's controller ownerReference (managers.py walks these up to the manager)."""

    kind: str
    name: str
    api_version: str
    uid: str

    @property
    def group(self) -> str:
        """Its API group; an owner known only by kind (api_version "") is Kubernetes' own kind."""
        return group_of(self.api_version) if self.api_version else default_group(self.kind)


def controller_owner(meta: Mapping[str, Any]) -> OwnerRef | None:
    o = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    if o is None:
        return None
    return OwnerRef(
        str(o.get("kind", "")), str(o.get("name", "")), str(o.get("apiVersion", "")), str(o.get("uid", ""))
    )


@dataclass(frozen=True, slots=True)
class PodView:
    """The parts of a Pod the controller needs (kept small: every pod in the cluster is cached)."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    owner_kind: str | None
    owner_name: str | None
    phase: str
    node_name: str | None
    deleting: bool
    started_at: datetime | None
    gpu_requests: Mapping[str, float]  # resource name -> count, summed over regular containers
    gpu_containers: tuple[str, ...]  # every container that asked for a GPU (the probe targets)
    first_container: str
    # spec.shareProcessNamespace: one listing in any container shows every container's processes.
    shares_pids: bool
    faults: PodFaults  # container terminations from status (signals/faults.py), read at cache time
    # Only the ghostgpu.io/ annotations: where verdicts land when the workload cannot be written.
    annotations: Mapping[str, str] = field(default_factory=dict)
    # DRA (claims.py): the ResourceClaims it uses, by name; its DRA GPUs are added to
    # gpu_requests at each snapshot, and gpus_unknown says a claim of it is not known yet.
    claims: tuple[str, ...] = ()
    gpus_unknown: bool = False
    # The claims each container names (resources.claims); with the claims cache, the snapshot's
    # DraCounter adds the containers of GPU claims to gpu_containers, sets the GPU devices whose
    # series the utilization signal expects, and the other consumers of its GPU claims.
    container_claims: tuple[ContainerClaim, ...] = ()
    dra_devices: tuple[DraDevice, ...] = ()
    claim_peers: tuple[ClaimPeer, ...] = ()
    # The DRA devices counted on it (in gpu_requests too): a workload's own GPU count adds them to
    # the device-plugin count its template asks for (the decision log, the risk gate, GPU-hours).
    dra_gpus: float = 0.0
    # The controller owner's API group (from its apiVersion); None: the kind's own (default_group).
    owner_group: str | None = None

    @property
    def owner_group_kind(self) -> tuple[str, str] | None:
        if self.owner_kind is None:
            return None
        group = self.owner_group if self.owner_group is not None else default_group(self.owner_kind)
        return (group, self.owner_kind)

    @property
    def running(self) -> bool:
        return self.phase == "Running" and not self.deleting

    @property
    def gpu_container(self) -> str | None:
        return self.gpu_containers[0] if self.gpu_containers else None

    @property
    def probe_containers(self) -> tuple[str, ...]:
        """Where to list processes: every GPU container, or one when the pod shares its pid
        namespace (each container's listing would be the same); the first container of a pod
        with no GPU container (a GPU requested only by an init container)."""
        targets = self.gpu_containers or (self.first_container,)
        return targets[:1] if self.shares_pids else targets

    @property
    def holds_gpus(self) -> bool:
        """Scheduled and not finished: the scheduler counts its requests against the node."""
        return bool(self.node_name) and self.phase not in ("Succeeded", "Failed") and bool(self.gpu_requests)


@dataclass(frozen=True, slots=True)
class Workload:
    ref: WorkloadRef
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    created_at: datetime | None
    replicas: int  # spec.replicas (1 for a bare pod)
    selector: Mapping[str, Any] | None
    volumes: int  # PVC volumes + volumeClaimTemplates (blast radius for the risk gate)
    gpus_per_pod: Mapping[str, float]
    # The object (slim_raw) packed (packing.py): read only when writing (Events, the dry-run
    # comparison) or scoring risk, so it is kept as ~200 bytes, not ~10 KB of dicts.
    raw_packed: bytes
    owner: OwnerRef | None = None  # its controller ownerReference (managers.py)
    # A controller owner of a kind with no actuator (managers.py): judged, never written; its
    # reclaim is escalated once, naming the owner. `raw_packed` then describes the owner.
    no_actuator: bool = False

    @property
    def raw(self) -> dict[str, Any]:
        """A fresh copy of the slim object (see slim_raw)."""
        return unpack(self.raw_packed)

    @property
    def exempt(self) -> bool:
        return (
            self.annotations.get(keys.RECLAIM_POLICY) == "never"
            or self.annotations.get(keys.GPU_EVICTION_POLICY) == "never"
        )

    @property
    def reclaimed_from(self) -> int | None:
        raw = self.annotations.get(keys.RECLAIMED_FROM)
        try:
            return int(raw) if raw is not None else None
        except ValueError:
            return None


@lru_cache(maxsize=4096)  # pods created or started in the same second share one datetime
def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


GpuPredicate = Callable[[str], bool]
GPU_PREFIXES = GPU_RESOURCE_PREFIXES


class GpuNames:
    """A GpuPredicate that also knows the DRA extended resources (DRAExtendedResource): a pod
    requesting one of them holds devices of its device class, counted under the class's name
    (the key DRA flavors and claims.py count under), so the request and a claim's devices are
    one flavor's GPUs. The claim the scheduler creates for such a request is named only in the
    pod's status.extendedResourceClaimStatus, which claims.py does not read: counted once."""

    __slots__ = ("aliases", "names")

    def __init__(self, known: Iterable[str], aliases: Mapping[str, str]) -> None:
        self.aliases = MappingProxyType(dict(aliases))
        self.names = frozenset(known) | frozenset(aliases)

    def __call__(self, name: str) -> bool:
        return name in self.names or name.startswith(GPU_PREFIXES)


def gpu_predicate(known: Iterable[str] = (), aliases: Mapping[str, str] | None = None) -> GpuPredicate:
    """A resource counts as a GPU if a flavor names it or it is a well-known accelerator resource
    (nvidia.com/gpu, nvidia.com/mig-1g.10gb, amd.com/gpu, ...). `aliases`: extended resource name
    -> device class, for the DRA extended resources of the DRA flavors' classes."""
    if aliases:
        return GpuNames(known, aliases)
    names = frozenset(known)
    return lambda name: name in names or name.startswith(GPU_PREFIXES)


# Every pod of the cache has a few strings and maps that thousands of others have too (its
# namespace, label keys and values, phase, node, container names, GPU requests). Sharing one copy
# of each halves a cached pod (50,000 pods: ~25 MB); names and uids stay the pod's own.
_EMPTY: Mapping[str, str] = MappingProxyType({})
_SHAPES: dict[tuple[tuple[str, float], ...], Mapping[str, float]] = {}
_MAX_SHAPES = 4096  # distinct GPU request maps shared; beyond, each pod keeps its own


def _str(value: Any) -> str:
    return intern(value) if type(value) is str else str(value)


_LABEL_SETS: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}
_MAX_LABEL_SETS = 8192  # the replicas of a ReplicaSet share one; a StatefulSet's pods differ


def _labels(labels: Mapping[str, Any] | None) -> Mapping[str, str]:
    if not labels:
        return _EMPTY
    key = tuple((intern(str(k)), _str(v)) for k, v in labels.items())
    shared = _LABEL_SETS.get(key)
    if shared is None:
        shared = MappingProxyType(dict(key))
        if len(_LABEL_SETS) < _MAX_LABEL_SETS:
            _LABEL_SETS[key] = shared
    return shared


def _shared_shape(total: dict[str, float]) -> Mapping[str, float]:
    key = tuple(total.items())
    shape = _SHAPES.get(key)
    if shape is None:
        if len(_SHAPES) >= _MAX_SHAPES:
            return total
        shape = _SHAPES[key] = MappingProxyType(total)
    return shape


def _gpu_requests(containers: Iterable[Mapping[str, Any]], is_gpu: GpuPredicate) -> Mapping[str, float]:
    return _shared_shape(_gpu_totals(containers, is_gpu))


def _gpu_totals(containers: Iterable[Mapping[str, Any]], is_gpu: GpuPredicate) -> dict[str, float]:
    total: dict[str, float] = {}
    aliases = is_gpu.aliases if isinstance(is_gpu, GpuNames) else _EMPTY
    for c in containers:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        # Extended resources must have requests == limits: read limits, else requests, once.
        for name in sorted(set(limits) | set(requests)):
            if is_gpu(name):
                qty = limits.get(name, requests.get(name))
                key = aliases.get(name, name)
                total[key] = total.get(key, 0.0) + float(Quantity(str(qty)).value)
    return total


def _gpu_containers(containers: Iterable[Mapping[str, Any]], is_gpu: GpuPredicate) -> tuple[str, ...]:
    names: list[str] = []
    for c in containers:
        res = c.get("resources") or {}
        if any(is_gpu(r) for r in (*(res.get("limits") or {}), *(res.get("requests") or {}))):
            names.append(_str(c.get("name")))
    return tuple(names)


def pod_view(obj: Mapping[str, Any], is_gpu: GpuPredicate) -> PodView:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    containers = spec.get("containers") or [{}]
    node = spec.get("nodeName")
    ours = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("ghostgpu.io/")}
    return PodView(
        namespace=_str(meta.get("namespace", "")),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        labels=_labels(meta.get("labels")),
        owner_kind=_str(owner.get("kind")) if owner else None,
        owner_name=owner.get("name") if owner else None,
        owner_group=_str(group_of(str(owner["apiVersion"]))) if owner and owner.get("apiVersion") else None,
        phase=_str(status.get("phase", "Unknown")),
        node_name=_str(node) if node else None,
        deleting=bool(meta.get("deletionTimestamp")),
        started_at=parse_time(status.get("startTime")) or parse_time(meta.get("creationTimestamp")),
        gpu_requests=_gpu_requests(containers, is_gpu),
        gpu_containers=_gpu_containers(containers, is_gpu),
        first_container=_str(containers[0].get("name", "")),
        shares_pids=bool(spec.get("shareProcessNamespace")),
        faults=pod_faults(status),
        annotations=ours or _EMPTY,
        claims=pod_claim_names(spec, status),
        container_claims=pod_container_claims(spec, status),
    )


@dataclass(frozen=True, slots=True)
class CachedPod:
    """An entry of the controller's one pod cache: the pod's view and, when the pod is itself a
    tracked workload (labelled, no controlling owner: a bare pod), that workload. One watch for
    both views instead of two halves the watch events parsed and the copies cached (N = 10,000)."""

    view: PodView
    workload: Workload | None


def cached_pod(obj: Mapping[str, Any], is_gpu: GpuPredicate) -> CachedPod:
    view = pod_view(obj, is_gpu)
    bare_and_tracked = view.owner_kind is None and is_tracked(view.labels)
    workload = workload_from("Pod", obj, is_gpu, labels=view.labels) if bare_and_tracked else None
    return CachedPod(view, workload)


def workload_from(
    kind: str, obj: Mapping[str, Any], is_gpu: GpuPredicate, *, labels: Mapping[str, str] | None = None
) -> Workload:
    """`labels`: the object's labels when the caller already copied them (shared, not copied twice)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if kind == "Pod":
        pod_spec = spec
        replicas, selector = 1, None
        vcts = 0
    else:
        pod_spec = (spec.get("template") or {}).get("spec") or {}
        replicas = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
        selector = spec.get("selector") or {}
        vcts = len(spec.get("volumeClaimTemplates") or [])
    pvcs = sum(1 for v in pod_spec.get("volumes") or [] if "persistentVolumeClaim" in v)
    annotations = dict(meta.get("annotations") or {}) or _EMPTY
    return Workload(
        ref=WorkloadRef(kind, _str(meta.get("namespace", "")), meta.get("name", "")),
        uid=meta.get("uid", ""),
        labels=_labels(meta.get("labels")) if labels is None else labels,
        annotations=annotations,
        created_at=parse_time(meta.get("creationTimestamp")),
        replicas=replicas,
        selector=selector,
        volumes=pvcs + vcts,
        gpus_per_pod=_gpu_requests(pod_spec.get("containers") or [], is_gpu),
        raw_packed=pack(slim_raw(obj)),
        owner=controller_owner(meta),
    )


def slim_raw(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a workload object the controller reads later, as soon as it arrives: every
    tracked object is cached, and `managedFields` and `status` are most of its size (~22 KB per
    pod at N = 10,000, docs/scale.md) yet never read. Kept: apiVersion/kind (Events'
    involvedObject), metadata minus managedFields (name, namespace, uid, resourceVersion for
    Events; ownerReferences for the bare-pod filter; the rest for the risk score's manifest size,
    planner.manifest_lines, which drops status and managedFields itself) and spec (risk score)."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    return {k: (meta if k == "metadata" else v) for k, v in obj.items() if k != "status"}


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics. An empty or missing selector matches nothing here (a
    workload without a selector cannot own pods, and matching everything would be unsafe)."""
    if not selector:
        return False
    match_labels = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not match_labels and not exprs:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for e in exprs:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def owner_workload(pod: PodView) -> WorkloadRef | None:
    """The Deployment/StatefulSet that owns this pod, or the pod itself if it is bare."""
    if pod.owner_kind is None:
        return WorkloadRef("Pod", pod.namespace, pod.name, "")
    if pod.owner_group not in (None, "apps"):  # another group's StatefulSet or ReplicaSet kind
        return None
    if pod.owner_kind == "StatefulSet" and pod.owner_name:
        return WorkloadRef("StatefulSet", pod.namespace, pod.owner_name, "apps")
    if pod.owner_kind == "ReplicaSet" and pod.owner_name:
        # A Deployment's ReplicaSet is named "<deployment>-<pod-template-hash>".
        h = pod.labels.get("pod-template-hash")
        if h and pod.owner_name.endswith(f"-{h}"):
            return WorkloadRef("Deployment", pod.namespace, pod.owner_name[: -len(h) - 1], "apps")
    return None


def _pod_name(pod: PodView) -> str:
    return pod.name


def pods_by_workload(
    workloads: Mapping[WorkloadRef, Workload],
    pods: Iterable[PodView],
    top_of: Callable[[PodView], WorkloadRef | None] | None = None,
) -> dict[WorkloadRef, list[PodView]]:
    """`top_of`: the pod's manager (managers.Resolution.top_of); owner_workload without it."""
    out: dict[WorkloadRef, list[PodView]] = {ref: [] for ref in workloads}
    resolve = top_of or owner_workload
    for pod in pods:
        if pod.owner_kind is None:
            # A bare pod is its own workload (what both resolvers answer), looked up by a plain
            # tuple: a WorkloadRef's hash and equality, without a new namedtuple per pod per poll.
            bare = workloads.get(("Pod", pod.namespace, pod.name, ""))  # type: ignore[call-overload]
            if bare is not None:
                out[bare.ref].append(pod)
            continue
        ref = resolve(pod)
        if ref is None or ref not in workloads:
            continue
        wl = workloads[ref]
        # A manager's pods are its by controller ownerReferences, and only its GPU pods are judged
        # (a RayCluster's CPU head has no GPU series); a Deployment's or StatefulSet's must also
        # match its selector (a pod sharing a name prefix is not its pod). A pod whose DRA GPUs are
        # not known yet (claims.py) stays: left out, its manager would be judged without it.
        if ref.group_kind in POD_CONTROLLERS:
            if not selector_matches(wl.selector, pod.labels):
                continue
        elif ref.kind != "Pod" and not pod.gpu_requests and not pod.gpus_unknown:
            continue
        out[ref].append(pod)
    for lst in out.values():
        if len(lst) > 1:  # list.sort calls the key even for one item: 50,000 calls a poll
            lst.sort(key=_pod_name)
    return out


def dra_gpus_of(pods: Sequence[PodView]) -> float:
    """The DRA devices these pods hold (claims.py): 0 for device-plugin pods."""
    if len(pods) == 1:  # nearly every workload: no generator
        return pods[0].dra_gpus
    return sum(p.dra_gpus for p in pods)


def is_tracked(obj_labels: Mapping[str, str]) -> bool:
    return obj_labels.get(keys.TRACKED_LABEL) == "true"


def namespace_opted_in(ns_labels: Mapping[str, str]) -> bool:
    return ns_labels.get(keys.OPT_IN_LABEL) == keys.OPT_IN_VALUE
