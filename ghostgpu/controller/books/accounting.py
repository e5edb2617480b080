"""The accounting gap, per GPU flavor (pure): what the nodes have, what Kueue admitted, what is
held by workloads outside Kueue (split by verdict), what is truly free, and what Kueue believes
is free. `ghostgpu status` prints it and the controller exports the same numbers as metrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ghostgpu.controller.inventory import PodView
from ghostgpu.controller.slices import Capacity
from ghostgpu.quantity import Quantity


@dataclass(frozen=True, slots=True)
class FlavorSpec:
    """A GPU flavor: `resource` is what Kueue charges (a device-plugin resource, or the Kueue
    resource of a DRA flavor's device class); `device_class` is set for a DRA flavor."""

    name: str
    resource: str
    node_labels: Mapping[str, str]
    device_class: str | None = None

    @property
    def key(self) -> str:
        """The key of a pod's gpu_requests its GPUs are under: the device-plugin resource, or
        the device class (claims.py adds a DRA pod's devices under their class)."""
        return self.device_class or self.resource


@dataclass
class FlavorAccount:
    flavor: str
    resource: str
    allocatable: float = 0.0
    kueue_nominal: float = 0.0
    kueue_admitted: float = 0.0  # ClusterQueue status.flavorsUsage (admitted workloads)
    kueue_reserved: float = 0.0  # status.flavorsReservation (quota reserved, admission pending)
    in_use: float = 0.0  # every scheduled, unfinished pod's request on this flavor's nodes
    outside_kueue: dict[str, float] = field(default_factory=dict)  # verdict bucket -> GPUs
    # controller.reservation (reservation.py): GPUs held outside Kueue that should be reserved in
    # Kueue, and what placeholder Workloads Kueue admitted (part of kueue_admitted).
    reservation_desired: float = 0.0
    reserved_outside: float = 0.0
    # MultiKueue (multikueue.py): ClusterQueues with quota on this flavor that get no placeholder
    # (a manager's, which sends its Workloads to workers) -> why; and, on a worker, the Workloads a
    # manager sent that Kueue admitted here on this flavor.
    reservation_skipped: dict[str, str] = field(default_factory=dict)
    multikueue_workloads: int = 0
    # A DRA flavor: its allocatable is the devices its class selects in its nodes' ResourceSlices
    # (slices.py); when they cannot be counted for sure, `capacity_unknown` says why and the
    # allocatable, what is truly free and the gap are unknown, never 0.
    dra: bool = False
    capacity_unknown: str = ""
    gpus_unknown_pods: int = 0  # pods on its nodes whose ResourceClaims are not known yet

    @property
    def held_outside_kueue(self) -> float:
        return sum(self.outside_kueue.values())

    @property
    def allocatable_known(self) -> bool:
        return not self.capacity_unknown

    @property
    def free_known(self) -> bool:
        """Truly free (and the gap) are known: the capacity is, and so is every pod's use of it (a
        pod whose claims are not known yet may hold devices of it)."""
        return self.allocatable_known and not self.gpus_unknown_pods

    @property
    def truly_free(self) -> float:
        return max(0.0, self.allocatable - self.in_use)

    @property
    def kueue_believes_free(self) -> float:
        return max(0.0, self.kueue_nominal - self.kueue_admitted)

    @property
    def gap(self) -> float:
        """GPUs Kueue would hand out that are not actually there."""
        return max(0.0, self.kueue_believes_free - self.truly_free)

    def as_dict(self) -> dict[str, Any]:
        if not self.dra:
            return self._as_dict()
        out = {
            **self._as_dict(),
            "gpusUnknownPods": self.gpus_unknown_pods,
            "capacityUnknown": self.capacity_unknown or None,
        }
        if not self.allocatable_known:
            out["allocatable"] = None
        if not self.free_known:
            out["trulyFree"] = out["gap"] = None
        return out

    def _as_dict(self) -> dict[str, Any]:
        return {
            "flavor": self.flavor,
            "resource": self.resource,
            "allocatable": self.allocatable,
            "kueueNominal": self.kueue_nominal,
            "kueueAdmitted": self.kueue_admitted,
            "kueueReserved": self.kueue_reserved,
            "inUse": self.in_use,
            "heldOutsideKueue": self.held_outside_kueue,
            "outsideKueueByVerdict": dict(sorted(self.outside_kueue.items())),
            "trulyFree": self.truly_free,
            "kueueBelievesFree": self.kueue_believes_free,
            "gap": self.gap,
            "reservationDesired": self.reservation_desired,
            "reservedOutsideKueue": self.reserved_outside,
            "reservationSkipped": dict(self.reservation_skipped),
            "multiKueueWorkloads": self.multikueue_workloads,
        }


def _qty(value: Any) -> float:
    try:
        return float(Quantity(str(value)).value)
    except (ValueError, ArithmeticError):
        return 0.0


def node_flavors_of(node: Mapping[str, Any], flavors: Sequence[FlavorSpec]) -> list[FlavorSpec]:
    labels = (node.get("metadata") or {}).get("labels") or {}
    alloc = (node.get("status") or {}).get("allocatable") or {}
    # A DRA flavor's nodes advertise no allocatable for it: its node labels alone say.
    return [
        f
        for f in flavors
        if (f.device_class is not None or f.resource in alloc)
        and all(labels.get(k) == v for k, v in f.node_labels.items())
    ]


def node_labels_for_books(node: Mapping[str, Any], flavors: Sequence[FlavorSpec]) -> dict[str, Any]:
    """What the books label a node's GPUs with (books.Books.accrue): `_flavor`, the node's flavor
    (a device-plugin flavor first, so a DRA flavor, matched by node labels alone, never relabels a
    device-plugin node), and on a node of a DRA flavor `_flavors`, the flavor of each gpu_requests key
    (device-plugin resource or device class: the first matching flavor of it), so that a node
    serving gpu.nvidia.com and mig.nvidia.com flavors labels each device with its own flavor."""
    matching = sorted(node_flavors_of(node, flavors), key=lambda f: f.device_class is not None)
    out: dict[str, Any] = {"_flavor": matching[0].name if matching else "unknown"}
    if any(f.device_class is not None for f in matching):
        by_key: dict[str, str] = {}
        for f in matching:
            by_key.setdefault(f.key, f.name)
        out["_flavors"] = by_key
    return out


def account(
    flavors: Sequence[FlavorSpec],
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[PodView],
    cluster_queues: Iterable[Mapping[str, Any]],
    outside_kueue: Mapping[tuple[str, str], str],
    dra_capacity: Mapping[str, Capacity] | None = None,
) -> list[FlavorAccount]:
    """`outside_kueue` maps (namespace, pod) of every tracked workload's pod to its verdict
    bucket (ACTIVE, FINISHED_IDLE, ..., or PENDING / EXEMPT for pods not judged).
    `dra_capacity`: each DRA flavor's devices (slices.dra_capacity); a DRA flavor not in it has
    an unknown capacity."""
    accounts = {f.name: FlavorAccount(f.name, f.resource, dra=f.device_class is not None) for f in flavors}
    for f in flavors:
        if f.device_class is not None:
            cap = (dra_capacity or {}).get(f.name, Capacity(None, "ResourceSlices not read"))
            if cap.devices is None:
                accounts[f.name].capacity_unknown = cap.why or "unknown"
            else:
                accounts[f.name].allocatable = cap.devices
    # A node can back several flavors (a TAS and a plain flavor over the same GPUs): each flavor's
    # ledger counts it, as each ClusterQueue's books do.
    node_flavors: dict[str, list[FlavorSpec]] = {}
    # Each node's flavors as (their key in a pod's gpu_requests, their account): read once per node,
    # not a property and a lookup per pod.
    node_accounts: dict[str, list[tuple[str, FlavorAccount]]] = {}
    for node in nodes:
        matching = node_flavors_of(node, flavors)
        name = (node.get("metadata") or {}).get("name", "")
        node_flavors[name] = matching
        node_accounts[name] = [(f.key, accounts[f.name]) for f in matching]
        alloc = (node.get("status") or {}).get("allocatable") or {}
        for f in matching:
            if f.device_class is None:
                accounts[f.name].allocatable += _qty(alloc[f.resource])
    none: list[tuple[str, FlavorAccount]] = []
    for pod in pods:
        if pod.gpus_unknown and pod.node_name:
            for f in node_flavors.get(pod.node_name, []):
                if f.device_class is not None:
                    accounts[f.name].gpus_unknown_pods += 1
        if not pod.holds_gpus:
            continue
        for key, acc in node_accounts.get(pod.node_name or "", none):
            count = pod.gpu_requests.get(key, 0.0)
            if not count:
                continue
            acc.in_use += count
            bucket = outside_kueue.get((pod.namespace, pod.name))
            if bucket is not None:
                acc.outside_kueue[bucket] = acc.outside_kueue.get(bucket, 0.0) + count
    for cq in cluster_queues:
        spec, status = cq.get("spec") or {}, cq.get("status") or {}
        for group in spec.get("resourceGroups") or []:
            for fq in group.get("flavors") or []:
                acc = accounts.get(fq.get("name", ""))
                if acc is None:
                    continue
                for r in fq.get("resources") or []:
                    if r.get("name") == acc.resource:
                        acc.kueue_nominal += _qty(r.get("nominalQuota", 0))
        for field_name, attr in (
            ("flavorsUsage", "kueue_admitted"),
            ("flavorsReservation", "kueue_reserved"),
        ):
            for fu in status.get(field_name) or []:
                acc = accounts.get(fu.get("name", ""))
                if acc is None:
                    continue
                for r in fu.get("resources") or []:
                    if r.get("name") == acc.resource:
                        setattr(acc, attr, getattr(acc, attr) + _qty(r.get("total", 0)))
    return [accounts[f.name] for f in flavors]
