"""Every call the controller makes to the apiserver, on kr8s's asyncio `Api.call_api`.

- The resource types the controller reads; its watch caches are `reflector.Reflector`.
- `Cluster`: fresh reads and the few writes the controller is allowed (annotations with an
  optimistic-concurrency precondition, Events, the scale subresource, the Eviction API). There is
  deliberately no delete.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kr8s._exceptions import ServerError

from ghostgpu.controller import keys
from ghostgpu.controller.creating import ObjectCreator
from ghostgpu.controller.inventory import WorkloadRef

log = logging.getLogger("ghostgpu.controller.kube")


@dataclass(frozen=True, slots=True)
class ResourceType:
    version: str  # "v1" or "group/version"
    plural: str
    namespaced: bool = True
    kind: str = ""


NAMESPACES = ResourceType("v1", "namespaces", namespaced=False, kind="Namespace")
PODS = ResourceType("v1", "pods", kind="Pod")
NODES = ResourceType("v1", "nodes", namespaced=False, kind="Node")
DEPLOYMENTS = ResourceType("apps/v1", "deployments", kind="Deployment")
STATEFULSETS = ResourceType("apps/v1", "statefulsets", kind="StatefulSet")
JOBS = ResourceType("batch/v1", "jobs", kind="Job")  # read only: the owner chain Pod -> Job -> JobSet
CLUSTERQUEUES = ResourceType("kueue.x-k8s.io/v1beta2", "clusterqueues", namespaced=False, kind="ClusterQueue")
LEASES = ResourceType("coordination.k8s.io/v1", "leases", kind="Lease")
CONFIGMAPS = ResourceType("v1", "configmaps", kind="ConfigMap")
RESOURCE_OF_KIND = {(g, rt.kind): rt for g, rt in (("apps", DEPLOYMENTS), ("apps", STATEFULSETS), ("", PODS))}


class Conflict(Exception):
    """The object changed since we read it (HTTP 409): someone else acted; do not retry blindly."""


class NotFound(Exception):
    pass


class AdmissionDenied(Exception):
    """An admission webhook refused the write (e.g. Kueue's Deployment webhook, which defaults
    `kueue.x-k8s.io/queue-name` on UPDATE once the namespace has a LocalQueue `default` and then
    rejects its own change as immutable: no metadata write to such a Deployment can succeed)."""


class WouldMutate(AdmissionDenied):
    """The server-side dry-run of a metadata write showed the admission chain changing Kueue's
    fields (`kueue.x-k8s.io/*` labels or annotations, the pod template): Kueue's Deployment and
    StatefulSet webhooks (v0.17 to v0.19) default `queue-name` on every UPDATE and accept it while the
    workload has 0 ready replicas, which would roll it into Kueue (docs/design.md#labelling-contract:
    ghostgpu never adds queue-name to a live object). Nothing was written; callers fall back exactly
    as for a refusal (it is an AdmissionDenied)."""


KUEUE_PREFIX = "kueue.x-k8s.io/"


def _kueue_keys(m: Any) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k.startswith(KUEUE_PREFIX)} if isinstance(m, Mapping) else {}


def admission_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What an annotation-only patch would change beyond our annotations, as far as Kueue is
    concerned: `kueue.x-k8s.io/*` labels (queue-name, managed, priority class) and annotations on the
    object and on its pod template, and any other change of the pod template (when `before` has
    one). Not the generation: a Deployment's is bumped by annotation changes too. `before` may be a
    watch-cache copy: a stale one can only produce a false alarm (a fallback), never hide Kueue's
    change, since a tracked workload carries no queue-name to begin with."""
    changes: list[str] = []
    bmeta, ameta = before.get("metadata") or {}, after.get("metadata") or {}
    btpl = ((before.get("spec") or {}).get("template") or {}).get("metadata") or {}
    atpl = ((after.get("spec") or {}).get("template") or {}).get("metadata") or {}
    for where, b, a in (
        ("metadata.labels", bmeta.get("labels"), ameta.get("labels")),
        ("metadata.annotations", bmeta.get("annotations"), ameta.get("annotations")),
        ("spec.template.metadata.labels", btpl.get("labels"), atpl.get("labels")),
        ("spec.template.metadata.annotations", btpl.get("annotations"), atpl.get("annotations")),
    ):
        bk, ak = _kueue_keys(b), _kueue_keys(a)
        changes += [
            f"{where}[{k}]: {bk.get(k)!r} -> {ak.get(k)!r}"
            for k in sorted(bk.keys() | ak.keys())
            if bk.get(k) != ak.get(k)
        ]
    bt, at = (before.get("spec") or {}).get("template"), (after.get("spec") or {}).get("template")
    if bt is not None and at is not None and bt != at:
        changes.append("spec.template (the pod template would change)")
    return changes


def status_of(exc: ServerError) -> int:
    return exc.response.status_code if exc.response is not None else 0


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Cluster(ObjectCreator):
    """Fresh reads and guarded writes."""

    def __init__(self, api: Any, *, instance: str, field_manager: str = keys.COMPONENT) -> None:
        self.api = api
        self.instance = instance
        # Named in managedFields on every write: the revert guard tells ghostgpu's own writes
        # (the controller's, `ghostgpu restore`'s) from a manager's that undoes a reclaim.
        self.field_manager = field_manager

    async def get(self, ref: WorkloadRef) -> dict[str, Any]:
        rt = RESOURCE_OF_KIND[ref.group_kind]
        try:
            async with self.api.call_api(
                "GET", version=rt.version, namespace=ref.namespace, url=f"{rt.plural}/{ref.name}"
            ) as resp:
                return dict(resp.json())
        except ServerError as exc:
            if status_of(exc) == 404:
                raise NotFound(str(ref)) from exc
            raise

    async def list(self, rtype: ResourceType, *, namespace: str | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 500}
        while True:
            async with self.api.call_api(
                "GET", version=rtype.version, namespace=namespace, url=rtype.plural, params=params
            ) as resp:
                body = resp.json()
            items.extend(body.get("items") or [])
            cont = (body.get("metadata") or {}).get("continue")
            if not cont:
                return items
            params["continue"] = cont

    async def patch_annotations(
        self,
        ref: WorkloadRef,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str | None = None,
        current: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Merge-patch annotations (None removes one). With `resource_version`, the patch applies
        only if the object is unchanged since that read (409 -> Conflict).

        Every metadata write of ghostgpu to a workload or pod goes through here, so here the same
        patch is first sent with `dryRun=All` (Kueue's webhooks declare sideEffects=None, so they run
        on it) and compared with `current` (the caller's copy of the object; a GET when None): if
        the admission chain would change Kueue's fields, nothing is written and WouldMutate is
        raised (see admission_changes). One extra request per write; writes happen only on verdict
        changes and actions, never on the poll path. A cheaper check (e.g. "does the namespace have
        a LocalQueue `default`?") would encode one Kueue version's rule; the dry-run asks the
        admission chain itself, whatever webhooks and versions are installed."""
        rt = RESOURCE_OF_KIND[ref.group_kind]
        meta: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        body = json.dumps({"metadata": meta})
        if current is None:
            current = await self.get(ref)
        after = await self._patch(rt, ref, body, dry_run=True)
        changes = admission_changes(current, after)
        if changes:
            raise WouldMutate(f"{ref}: the admission chain would change " + "; ".join(changes))
        return await self._patch(rt, ref, body, dry_run=False)

    async def patch_object(
        self,
        ref: WorkloadRef,
        patch: Mapping[str, Any],
        *,
        resource_version: str | None = None,
        current: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A merge patch of any part of the object (a manager's stop: `spec.suspend`, an annotation
        and its record together), guarded like patch_annotations: a dry-run first, and nothing is
        written if the admission chain would change Kueue's fields (WouldMutate)."""
        rt = RESOURCE_OF_KIND[ref.group_kind]
        body_obj = dict(patch)
        if resource_version:
            body_obj["metadata"] = {**(body_obj.get("metadata") or {}), "resourceVersion": resource_version}
        body = json.dumps(body_obj)
        if current is None:
            current = await self.get(ref)
        after = await self._patch(rt, ref, body, dry_run=True)
        changes = admission_changes(current, after)
        if changes:
            raise WouldMutate(f"{ref}: the admission chain would change " + "; ".join(changes))
        return await self._patch(rt, ref, body, dry_run=False)

    async def _patch(self, rt: ResourceType, ref: WorkloadRef, body: str, *, dry_run: bool) -> dict[str, Any]:
        try:
            async with self.api.call_api(
                "PATCH",
                version=rt.version,
                namespace=ref.namespace,
                url=f"{rt.plural}/{ref.name}",
                params={"fieldManager": self.field_manager} | ({"dryRun": "All"} if dry_run else {}),
                content=body,
                headers={"Content-Type": "application/merge-patch+json"},
            ) as resp:
                return dict(resp.json())
        except ServerError as exc:
            if status_of(exc) == 409:
                raise Conflict(str(ref)) from exc
            if status_of(exc) == 404:
                raise NotFound(str(ref)) from exc
            if status_of(exc) in (400, 403, 422) and "admission webhook" in str(exc):
                raise AdmissionDenied(str(exc)) from exc
            raise

    async def annotate_node(self, node: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch a Node's annotations (the Kueue requeue nudge; see books.Books.nudge_kueue)."""
        async with self.api.call_api(
            "PATCH",
            version="v1",
            url=f"nodes/{node}",
            content=json.dumps({"metadata": {"annotations": dict(annotations)}}),
            headers={"Content-Type": "application/merge-patch+json"},
        ):
            pass

    async def scale(self, ref: WorkloadRef, replicas: int, *, resource_version: str | None = None) -> None:
        """Through the scale subresource (needs only `<kind>/scale` patch rights). With
        `resource_version` the scale applies only if the workload is unchanged since that read
        (the Scale's resourceVersion is the workload's; 409 -> Conflict)."""
        rt = RESOURCE_OF_KIND[ref.group_kind]
        body: dict[str, Any] = {"spec": {"replicas": replicas}}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            async with self.api.call_api(
                "PATCH",
                version=rt.version,
                namespace=ref.namespace,
                url=f"{rt.plural}/{ref.name}/scale",
                params={"fieldManager": self.field_manager},
                content=json.dumps(body),
                headers={"Content-Type": "application/merge-patch+json"},
            ):
                pass
        except ServerError as exc:
            if resource_version and status_of(exc) == 409:
                raise Conflict(str(ref)) from exc
            if status_of(exc) == 404:
                raise NotFound(str(ref)) from exc
            raise

    # --- ConfigMaps in the controller's namespace (the replica ledger, see ledger.py) ---------

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, or None when it does not exist."""
        try:
            async with self.api.call_api(
                "GET", version="v1", namespace=namespace, url=f"{CONFIGMAPS.plural}/{name}"
            ) as resp:
                return dict(resp.json())
        except ServerError as exc:
            if status_of(exc) == 404:
                return None
            raise

    async def create_configmap(
        self, namespace: str, name: str, data: Mapping[str, str], *, labels: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Create it; 409 (someone created it first) -> Conflict."""
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
            "data": dict(data),
        }
        try:
            async with self.api.call_api(
                "POST", version="v1", namespace=namespace, url=CONFIGMAPS.plural, content=json.dumps(body)
            ) as resp:
                return dict(resp.json())
        except ServerError as exc:
            if status_of(exc) == 409:
                raise Conflict(f"ConfigMap/{namespace}/{name}") from exc
            raise

    async def replace_configmap(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the whole object; its metadata.resourceVersion is the precondition (409 -> Conflict)."""
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        try:
            async with self.api.call_api(
                "PUT",
                version="v1",
                namespace=namespace,
                url=f"{CONFIGMAPS.plural}/{name}",
                content=json.dumps(obj),
            ) as resp:
                return dict(resp.json())
        except ServerError as exc:
            if status_of(exc) == 409:
                raise Conflict(f"ConfigMap/{namespace}/{name}") from exc
            if status_of(exc) == 404:
                raise NotFound(f"ConfigMap/{namespace}/{name}") from exc
            raise

    async def evict(self, namespace: str, pod: str) -> str:
        """Eviction API: honours PodDisruptionBudgets. Returns "evicted", "blocked" (429: a PDB
        forbids it now) or "gone" (404)."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        }
        try:
            async with self.api.call_api(
                "POST",
                version="v1",
                namespace=namespace,
                url=f"pods/{pod}/eviction",
                content=json.dumps(body),
            ):
                return "evicted"
        except ServerError as exc:
            if status_of(exc) == 429:
                return "blocked"
            if status_of(exc) == 404:
                return "gone"
            raise

    async def event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type_: str = "Normal",
    ) -> None:
        """A core/v1 Event on the workload (visible in `kubectl describe`)."""
        meta = involved.get("metadata") or {}
        namespace = meta.get("namespace", "default")
        ts = now_rfc3339()
        ev = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'ghostgpu')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", "v1"),
                "kind": involved.get("kind", ""),
                "name": meta.get("name", ""),
                "namespace": namespace,
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": keys.COMPONENT},
            "reportingComponent": keys.COMPONENT,
            "reportingInstance": self.instance[:128],
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
        }
        async with self.api.call_api(
            "POST", version="v1", namespace=namespace, url="events", content=json.dumps(ev)
        ):
            pass
