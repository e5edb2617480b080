"""GPUs allocated through DRA (resource.k8s.io/v1 ResourceClaims), counted per pod (pure: no I/O).

A DRA pod requests no extended resource: its GPUs are the devices allocated to the ResourceClaims
it names. The controller watches ResourceClaims only when a flavor names a device class
(`flavors[].deviceClass`), keeps of each claim what counting needs (`ClaimView`), and adds a pod's
GPU devices to its `gpu_requests` under the device class's name (`with_dra_gpus`), where
accounting, the ghost gauge and the reservation find them beside the device-plugin resources
(a device class is a DNS subdomain, a device-plugin resource has a `/`: the keys never collide).

The rules:
- a pod's claims are `spec.resourceClaims`: a `resourceClaimName` (a shared claim) as named, a
  `resourceClaimTemplateName` through `status.resourceClaimStatuses` (the generated claim's name);
- a device counts when its request's device class (`exactly.deviceClassName`, or that of the
  `firstAvailable` subrequest chosen, named `<request>/<subrequest>` in the allocation) is a GPU
  class; a device named by two claims of the pod, or by one claim two containers use, counts once;
- a claim used by several pods (`status.reservedFor` lists more than one pod) counts once, on the
  consumer pod whose uid sorts first: the others count 0 for it (deterministic, the same on every
  replica and every poll while its consumers stay);
- a claim not allocated counts 0 (its pod is not scheduled yet);
- a claim the cache has not seen, or a template whose claim is not generated yet for a scheduled
  pod, makes the pod's DRA GPUs *unknown* (`PodView.gpus_unknown`): such a pod's workload is not
  judged that poll and the reservation changes nothing that poll (it never looks free);
- a finished pod (Succeeded, Failed) holds none, whatever its claims: Kubernetes deletes the
  claims generated for it while the pod stays, and that is no unknown.

For the signals (`DraCount.devices`, `.containers`, `.peers`), every consumer of a claim uses its
devices, holder or not: each GPU device of the pod's allocated claims must have its own GPU series
(signals/utilization.py), a container that names such a claim in `resources.claims` is a GPU
container (where processes are listed), and the other consumers of a claim with GPU devices are
named so that the pod is never reclaimed while they use it (judge/planner.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from sys import intern
from types import MappingProxyType
from typing import Any, NamedTuple

from ghostgpu.signals.dra import DraDevice

DONE_PHASES = ("Succeeded", "Failed")  # a pod in them runs no container again
UNRESOLVED = ""  # a template claim whose generated claim the pod's status does not name yet


class ClaimDevice(NamedTuple):
    """One allocated device (status.allocation.devices.results[]) and its request's class."""

    driver: str
    pool: str
    device: str
    request: str
    device_class: str


@dataclass(frozen=True, slots=True)
class ClaimView:
    """The parts of a ResourceClaim counting needs (every claim of the cluster is cached)."""

    namespace: str
    name: str
    uid: str
    allocated: bool
    devices: tuple[ClaimDevice, ...]
    reserved_for: tuple[str, ...]  # uids of the consumer Pods (status.reservedFor)
    # Their names, in the order of reserved_for (what a verdict names when the claim is shared).
    consumer_names: tuple[str, ...] = ()

    def holder(self) -> str | None:
        """The consumer pod its devices are counted on: the first uid (None: no consumer)."""
        return min(self.reserved_for) if self.reserved_for else None


def _request_classes(spec: Mapping[str, Any]) -> dict[str, str]:
    """request name -> device class: `exactly` as `<req>`, each firstAvailable choice as
    `<req>/<sub>` (the name an allocation result carries)."""
    out: dict[str, str] = {}
    for req in ((spec.get("devices") or {}).get("requests")) or []:
        name = str(req.get("name", ""))
        exactly = req.get("exactly")
        if exactly:
            out[name] = str(exactly.get("deviceClassName", ""))
        for sub in req.get("firstAvailable") or []:
            out[f"{name}/{sub.get('name', '')}"] = str(sub.get("deviceClassName", ""))
    return out


def claim_view(obj: Mapping[str, Any]) -> ClaimView:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    allocation = status.get("allocation")
    classes = _request_classes(obj.get("spec") or {})
    devices: list[ClaimDevice] = []
    for r in ((allocation or {}).get("devices") or {}).get("results") or []:
        request = str(r.get("request", ""))
        devices.append(
            ClaimDevice(
                intern(str(r.get("driver", ""))),
                intern(str(r.get("pool", ""))),
                str(r.get("device", "")),
                intern(request),
                intern(classes.get(request, "")),
            )
        )
    consumers = sorted(
        (str(c.get("uid", "")), str(c.get("name", "")))
        for c in status.get("reservedFor") or []
        if c.get("resource") == "pods" and not c.get("apiGroup")
    )
    return ClaimView(
        namespace=intern(str(meta.get("namespace", ""))),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        allocated=allocation is not None,
        devices=tuple(devices),
        reserved_for=tuple(uid for uid, _ in consumers),
        consumer_names=tuple(name for _, name in consumers),
    )


def _resolved_entries(spec: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, str]:
    """spec.resourceClaims entry name -> the ResourceClaim's name (UNRESOLVED: a template whose
    claim the status does not name yet); an entry whose template needed no claim is left out."""
    generated: dict[str, str | None] = {
        str(s.get("name", "")): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
    }
    out: dict[str, str] = {}
    for c in spec.get("resourceClaims") or []:
        entry = str(c.get("name", ""))
        if c.get("resourceClaimName"):
            out[entry] = str(c["resourceClaimName"])
        elif c.get("resourceClaimTemplateName"):
            if entry not in generated:
                out[entry] = UNRESOLVED
            elif generated[entry]:
                out[entry] = str(generated[entry])
    return out


def pod_claim_names(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceClaims a pod uses, by name; UNRESOLVED for a template whose claim its status
    does not name yet. A status entry without a claim name (no claim was needed) is left out."""
    if not spec.get("resourceClaims"):
        return ()
    return tuple(dict.fromkeys(_resolved_entries(spec, status).values()))


class ContainerClaim(NamedTuple):
    """A regular container's `resources.claims[]` entry, resolved to the ResourceClaim's name."""

    container: str
    claim: str  # UNRESOLVED: the template's claim is not generated yet
    request: str  # "" for every request of the claim


def pod_container_claims(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[ContainerClaim, ...]:
    """The claims each regular container names, in spec order (() for a pod without claims)."""
    if not spec.get("resourceClaims"):
        return ()
    entries = _resolved_entries(spec, status)
    out: list[ContainerClaim] = []
    for c in spec.get("containers") or []:
        for ref in (c.get("resources") or {}).get("claims") or []:
            claim = entries.get(str(ref.get("name", "")))
            if claim is not None:
                out.append(
                    ContainerClaim(intern(str(c.get("name", ""))), claim, str(ref.get("request") or ""))
                )
    return tuple(out)


class ClaimPeer(NamedTuple):
    """Another consumer pod of one of a pod's claims that holds GPU devices."""

    claim: str
    pod_uid: str
    pod_name: str


class DraCount(NamedTuple):
    gpus: dict[str, float]  # device class -> devices counted on this pod
    unknown: bool
    # Every GPU device of the pod's allocated claims, holder or not (each must have its series).
    devices: tuple[DraDevice, ...] = ()
    # Containers that name a claim holding a GPU device (in the request they name, if any).
    containers: tuple[str, ...] = ()
    # The other consumers of the pod's claims that hold GPU devices.
    peers: tuple[ClaimPeer, ...] = ()


def dra_gpus(
    namespace: str,
    uid: str,
    claim_names: tuple[str, ...],
    claims: Mapping[tuple[str, str], ClaimView],
    gpu_classes: Collection[str],
    *,
    scheduled: bool,
    container_claims: tuple[ContainerClaim, ...] = (),
) -> DraCount:
    """The GPU devices a pod holds through its claims, per device class (see the module's rules),
    and what its signals need: its GPU devices, GPU containers and the claims' other consumers."""
    gpus: dict[str, float] = {}
    seen: set[tuple[str, str, str]] = set()
    devices: dict[tuple[str, str, str], DraDevice] = {}
    peers: list[ClaimPeer] = []
    unknown = False
    for name in claim_names:
        if name == UNRESOLVED:
            unknown = unknown or scheduled  # not generated yet: nothing allocated before scheduling
            continue
        claim = claims.get((namespace, name))
        if claim is None:
            unknown = True
            continue
        if not claim.allocated:
            continue
        gpu_devices = [d for d in claim.devices if d.device_class in gpu_classes]
        for d in gpu_devices:
            devices.setdefault((d.driver, d.pool, d.device), DraDevice(d.driver, d.pool, d.device, name))
        if gpu_devices:
            names = claim.consumer_names or ("",) * len(claim.reserved_for)
            peers += (
                ClaimPeer(name, u, n) for u, n in zip(claim.reserved_for, names, strict=True) if u != uid
            )
        if claim.holder() != uid:
            continue
        for d in gpu_devices:
            key = (d.driver, d.pool, d.device)
            if key not in seen:
                seen.add(key)
                gpus[d.device_class] = gpus.get(d.device_class, 0.0) + 1.0
    containers = tuple(
        dict.fromkeys(
            c.container
            for c in container_claims
            if _names_gpu(claims.get((namespace, c.claim)), c.request, gpu_classes)
        )
    )
    return DraCount(gpus, unknown, tuple(devices[k] for k in sorted(devices)), containers, tuple(peers))


def _names_gpu(claim: ClaimView | None, request: str, gpu_classes: Collection[str]) -> bool:
    """A container's claim reference names a GPU device: one of the claim's allocated GPU devices,
    of the request it names (a firstAvailable result `<request>/<sub>` is of `<request>`)."""
    if claim is None or not claim.allocated:
        return False
    return any(
        d.device_class in gpu_classes
        and (not request or d.request == request or d.request.startswith(request + "/"))
        for d in claim.devices
    )


def with_dra_gpus(view: Any, count: DraCount) -> Any:
    """The pod's view (inventory.PodView) with its DRA GPUs added to `gpu_requests` and their sum in
    `dra_gpus`, `gpus_unknown` set, its claims' GPU containers added to `gpu_containers` (after the
    device-plugin ones) and its GPU devices and claim peers set; the view itself when nothing changes."""
    if not (count.gpus or count.unknown or count.devices or count.containers or count.peers):
        return view
    merged = MappingProxyType({**view.gpu_requests, **count.gpus}) if count.gpus else view.gpu_requests
    containers = tuple(dict.fromkeys((*view.gpu_containers, *count.containers)))
    return replace(
        view,
        gpu_requests=merged,
        gpus_unknown=count.unknown,
        dra_gpus=sum(count.gpus.values()),
        gpu_containers=containers,
        dra_devices=count.devices,
        claim_peers=count.peers,
    )


class DraCounter:
    """Adds DRA GPUs to the pods of a snapshot. A pod's counted view is kept while neither the
    cached pod nor any of its claims changed (the same objects), so an unchanged DRA pod is the
    same object every poll (the judge's settled-plan memo compares by identity)."""

    def __init__(self, gpu_classes: Collection[str]) -> None:
        self.gpu_classes = frozenset(gpu_classes)
        self._memo: dict[tuple[str, str], tuple[Any, tuple[ClaimView | None, ...], Any]] = {}

    def pods(self, views: Iterable[Any], claims: Mapping[tuple[str, str], ClaimView]) -> list[Any]:
        memo: dict[tuple[str, str], tuple[Any, tuple[ClaimView | None, ...], Any]] = {}
        out: list[Any] = []
        for view in views:
            if not view.claims or view.phase in DONE_PHASES:
                # A finished pod holds no device, and Kubernetes deletes the claims generated for
                # it while the pod itself stays (resourceclaim controller, isPodDone): a claim of
                # a finished pod that is gone is no unknown.
                out.append(view)
                continue
            key = (view.namespace, view.name)
            deps = tuple(claims.get((view.namespace, n)) for n in view.claims)
            old = self._memo.get(key)
            if old is not None and old[0] is view and all(a is b for a, b in zip(old[1], deps, strict=True)):
                counted = old[2]
            else:
                count = dra_gpus(
                    view.namespace,
                    view.uid,
                    view.claims,
                    claims,
                    self.gpu_classes,
                    scheduled=bool(view.node_name),
                    container_claims=view.container_claims,
                )
                counted = with_dra_gpus(view, count)
            memo[key] = (view, deps, counted)
            out.append(counted)
        self._memo = memo
        return out
