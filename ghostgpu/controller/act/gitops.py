"""GitOps pre-flight: before a reclaim writes anything, find out whether a GitOps manager syncs the
object from Git and would put what the stop writes straight back.

A stop that its manager reverts frees nothing: the GPU is held again within seconds (Argo CD's
self-heal) or at the next interval (Flux), and a controller that keeps acting would fight it every
window. So the reclaim is escalated instead, with the exact change that makes the manager keep
the stop, and nothing is written.

Who manages an object, from its markers:
- Argo CD: annotation `argocd.argoproj.io/tracking-id: <app>:<group>/<kind>:<ns>/<name>` (the
  default tracking method since Argo CD 3.0; `<app>` is `<namespace>_<name>` for an Application
  outside the control-plane namespace). A tracking id naming another object was copied with a
  manifest and Argo CD ignores it, so do we. Label tracking (`app.kubernetes.io/instance: <app>`)
  is trusted only when an Application of that name exists: Helm sets the same label.
- Flux: labels `kustomize.toolkit.fluxcd.io/name` + `/namespace` (a Kustomization),
  `helm.toolkit.fluxcd.io/name` + `/namespace` (a HelmRelease).

When it reverts (read from the manager object, read-only):
- Argo CD Application: automated sync (not `enabled: false`) with `selfHeal: true`, unless an
  `ignoreDifferences` entry matching the object covers every written pointer (`jsonPointers`, a
  plain `jqPathExpressions` path, or `managedFieldsManagers` naming ghostgpu's field manager) AND
  `syncOptions` holds `RespectIgnoreDifferences=true` (without it any sync applies the whole
  manifest again). Automated sync without selfHeal syncs only on a new Git revision; that later
  revert is the revert guard's to record.
- Flux Kustomization: every interval (server-side apply with force), unless suspended, the object
  opts out (`kustomize.toolkit.fluxcd.io/ssa: IfNotPresent|Ignore`,
  `kustomize.toolkit.fluxcd.io/reconcile: disabled`), or a `.spec.ignore` rule whose target
  matches the object covers every written pointer (the field exists in kustomize-controller v1.9).
- Flux HelmRelease: only with `spec.driftDetection.mode: enabled`, unless suspended or a
  `driftDetection.ignore` rule covers every written pointer.

Fail safe: a manager object that cannot be read (403, timeout, 5xx) gives UNKNOWN, which blocks the
stop like a revert does. A manager object that does not exist here while the object carries its
marker gives UNSEEN, which blocks too: the marker is written by the manager itself, and a hub Argo
CD (its Applications in the hub cluster) or a Flux applying through `spec.kubeConfig` manages this
cluster from another one, where it cannot be read. Unless the configuration says such markers are
stale (`controller.gitops.orphanMarkers: stale`): then nothing syncs the object and the stop goes
ahead. An Argo CD label (`app.kubernetes.io/instance`) without its Application is Helm's label, not
a marker: clear either way.

This module reads the managers (the only I/O); the rules above are gitops_rules.py (pure).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

from ghostgpu.controller.act.gitops_rules import (
    RESOURCES,
    ManagerKind,
    ManagerRef,
    Outcome,
    Preflight,
    ResourceId,
    Target,
    argocd_preflight,
    helmrelease_preflight,
    kustomization_preflight,
    managers_of,
    unseen_preflight,
)

# What a marker whose manager object this cluster does not have means (controller.gitops.orphanMarkers).
OrphanMarkers = Literal["escalate", "stale"]

# --- reading the manager (the only I/O) ----------------------------------------------------------


class ManagerReader(Protocol):
    async def get(self, rid: ResourceId, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it (or its resource type) does not exist; raises otherwise."""
        ...

    async def find(self, rid: ResourceId, name: str) -> list[dict[str, Any]]:
        """Every object of that name in any namespace ([] when the resource type does not exist)."""
        ...


class ApiReader:
    """ManagerReader on kr8s's `Api.call_api` (the controller's client)."""

    def __init__(self, api: Any) -> None:
        self.api = api

    async def get(self, rid: ResourceId, namespace: str, name: str) -> dict[str, Any] | None:
        from kr8s._exceptions import ServerError

        try:
            async with self.api.call_api(
                "GET", version=rid.version, namespace=namespace, url=f"{rid.plural}/{name}"
            ) as resp:
                return dict(resp.json())
        except ServerError as exc:
            if exc.response is not None and exc.response.status_code == 404:
                return None
            raise

    async def find(self, rid: ResourceId, name: str) -> list[dict[str, Any]]:
        from kr8s._exceptions import ServerError

        try:
            async with self.api.call_api(
                "GET", version=rid.version, url=rid.plural, params={"fieldSelector": f"metadata.name={name}"}
            ) as resp:
                return list(resp.json().get("items") or [])
        except ServerError as exc:
            if exc.response is not None and exc.response.status_code == 404:
                return []
            raise


class GitOpsPreflight:
    """Reads the managers an object's markers name and says whether the stop would stick.

    `orphan_markers`: "escalate" (a marker whose manager this cluster does not have blocks: UNSEEN)
    or "stale" (it names nothing that syncs: CLEAR).

    Blocking answers (REVERTS, UNKNOWN, UNSEEN) are kept for `cache_seconds` per (manager, object, writes):
    a blocked reclaim is planned again every poll, and its manager needs reading once a minute, not
    once a poll. A clear answer is never cached: the manager is read right before every stop."""

    def __init__(
        self,
        reader: ManagerReader,
        *,
        argocd_namespace: str = "argocd",
        field_manager: str = "ghostgpu-controller",
        timeout: float = 5.0,
        cache_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        orphan_markers: OrphanMarkers = "escalate",
    ) -> None:
        if orphan_markers not in ("escalate", "stale"):
            raise ValueError(f"orphan_markers is escalate or stale, not {orphan_markers!r}")
        self.reader = reader
        self.orphan_markers = orphan_markers
        self.argocd_namespace = argocd_namespace
        self.field_manager = field_manager
        self.timeout = timeout
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._blocked: dict[tuple[ManagerRef, Target, tuple[str, ...]], tuple[float, Preflight]] = {}

    async def check(self, obj: Mapping[str, Any], writes: Sequence[str]) -> Preflight:
        target = Target.of(obj)
        clear: list[str] = []
        for ref in managers_of(obj):
            key = (ref, target, tuple(writes))
            cached = self._blocked.get(key)
            if cached is not None and self.clock() - cached[0] < self.cache_seconds:
                return cached[1]
            result = await self._check(ref, obj, target, writes)
            if result.blocks:
                self._blocked[key] = (self.clock(), result)
                return result
            self._blocked.pop(key, None)
            clear.append(result.reason)
        return Preflight(Outcome.CLEAR, "; ".join(clear) or "no GitOps manager")

    async def _read(self, ref: ManagerRef) -> dict[str, Any] | None:
        rid = RESOURCES[ref.kind]
        if ref.namespace is not None:
            return await self.reader.get(rid, ref.namespace, ref.name)
        # An unprefixed Argo CD app name: the control-plane namespace, else the only Application of
        # that name (the configured namespace may be wrong; two candidates are not guessed between).
        obj = await self.reader.get(rid, self.argocd_namespace, ref.name)
        if obj is not None:
            return obj
        found = await self.reader.find(rid, ref.name)
        if len(found) > 1:
            spots = sorted(str((f.get("metadata") or {}).get("namespace")) for f in found)
            raise LookupError(f"{len(found)} Applications named {ref.name} ({', '.join(spots)})")
        return found[0] if found else None

    async def _check(
        self, ref: ManagerRef, obj: Mapping[str, Any], target: Target, writes: Sequence[str]
    ) -> Preflight:
        where = ref.where(self.argocd_namespace)
        try:
            manager = await asyncio.wait_for(self._read(ref), self.timeout)
        except Exception as exc:  # 403, timeout, 5xx, ambiguity: fail safe
            detail = (
                "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {str(exc)[:200]}"
            )
            return Preflight(
                Outcome.UNKNOWN,
                f"{target.short} carries {ref.marker}, but {where} cannot be read ({detail}); not "
                "stopping what may be synced back",
                ref,
            )
        if manager is None:
            if not ref.confirmed:
                return Preflight(Outcome.CLEAR, f"{where} does not exist (a Helm label, not Argo CD)", ref)
            if self.orphan_markers == "escalate":
                if ref.kind is ManagerKind.APPLICATION and ref.namespace is None:
                    where = f"{where} (nor an Application {ref.name} in another namespace)"
                return unseen_preflight(ref, target, writes, where=where)
            return Preflight(
                Outcome.CLEAR, f"{where} does not exist (orphanMarkers: stale, nothing syncs it)", ref
            )
        if ref.kind is ManagerKind.APPLICATION:
            return argocd_preflight(manager, target, writes, field_manager=self.field_manager, ref=ref)
        if ref.kind is ManagerKind.KUSTOMIZATION:
            return kustomization_preflight(manager, obj, writes, ref=ref)
        return helmrelease_preflight(manager, obj, writes, ref=ref)
