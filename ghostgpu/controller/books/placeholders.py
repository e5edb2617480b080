"""Kueue's books, the writes: the placeholder Workloads that reserve what live non-Kueue work
holds (what to reserve, and why placeholders: reservation.py). `reserve` runs once per poll after
the reconcile (app.py); `Reservations.reconcile` lists, creates, deletes and marks PodsReady
(enforce mode, leader only); `ReservationMetrics` are its gauges.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kr8s._exceptions import ServerError

from ghostgpu.controller.books.accounting import FlavorSpec
from ghostgpu.controller.books.books import untracked_of
from ghostgpu.controller.books.multikueue import ADMISSIONCHECKS, needs_admission_checks
from ghostgpu.controller.books.multikueue import skipped_queues as multikueue_skipped
from ghostgpu.controller.books.reservation import (
    FIELD_MANAGER,
    LOCALQUEUES,
    RESERVATION_LABEL,
    WORKLOADS,
    Placeholder,
    Reservation,
    ReservationReport,
    admitted_by_flavor,
    borrowed_reservations,
    desired_from,
    fill_accounts,
    placeholder_object,
    plan_changes,
    pods_ready_patch,
    waiting_messages,
)
from ghostgpu.controller.kube import ResourceType, status_of
from ghostgpu.controller.poll import PollResult, Snapshot

log = logging.getLogger("ghostgpu.controller.reservation")


async def reserve(
    reservations: Reservations,
    rmetrics: ReservationMetrics,
    flavors: Sequence[FlavorSpec],
    snap: Snapshot,
    cqs: Sequence[Mapping[str, Any]],
    result: PollResult,
    accounts: Sequence[Any],
    *,
    leader: bool,
) -> None:
    """controller.reservation, once per poll after the reconcile: the GPUs held outside Kueue (as the
    poll's snapshot shows them) reserved in each team's ClusterQueue (reservation.py). While a
    pod's DRA GPUs are unknown (a ResourceClaim not in the cache yet, claims.py), nothing is
    created or deleted: a count short of that pod's devices would hand its quota back to Kueue."""
    unknown = [p for p in snap.pods if p.gpus_unknown]
    if unknown:
        log.info("reservation waits: DRA GPUs unknown", extra={"pods": len(unknown)})
        return
    try:
        lqs = await reservations.local_queues()
        skip = await reservations.skipped_queues(cqs)
        desired = desired_from(
            flavors,
            snap,
            cqs,
            lqs,
            local_queue=reservations.local_queue,
            pods_of=result.pods_of,
            untracked=untracked_of(snap, result),
            skip=skip,
        )
        report = await reservations.reconcile(
            desired,
            flavors,
            leader=leader,
            local_queues=lqs,
            now=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
    except Exception as exc:  # no Kueue (yet), an apiserver error: next poll tries again
        log.warning("reservation failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        return
    report.borrowed = borrowed_reservations(report.admitted, cqs, {f.name: f.resource for f in flavors})
    rmetrics.set(report)
    fill_accounts(accounts, report.desired, report.admitted)
    if report.created or report.deleted or report.errors:
        # Not `created`: a LogRecord attribute, which `extra` may not overwrite (the poll would fail).
        log.info(
            "reservations",
            extra={"mode": report.mode, "desired": [f"{r.namespace}/{r.name}" for r in report.desired],
                   "placeholdersCreated": report.created, "placeholdersDeleted": report.deleted,
                   "errors": report.errors},
        )  # fmt: skip


class Reservations:
    """The writes (enforce mode, leader only) on kr8s's `call_api`, as kube.Cluster does."""

    def __init__(self, api: Any, *, mode: str, local_queue: str, emit_event: Any) -> None:
        self.api = api
        self.mode = mode
        self.local_queue = local_queue
        self.emit_event = emit_event  # Cluster.event
        self.announced: dict[tuple[str, str, str], str] = {}  # workload -> last message sent
        self.evictions_seen: set[str] = set()  # uids of evicted placeholders already counted
        self.skipped: dict[str, str] = {}  # ClusterQueue -> why no placeholder goes there (last poll)

    async def _list(self, rt: ResourceType, selector: str | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": 500}
        if selector:
            params["labelSelector"] = selector
        items: list[dict[str, Any]] = []
        while True:
            async with self.api.call_api("GET", version=rt.version, url=rt.plural, params=params) as resp:
                body = resp.json()
            items.extend(body.get("items") or [])
            if not (body.get("metadata") or {}).get("continue"):
                return items
            params["continue"] = body["metadata"]["continue"]

    async def local_queues(self) -> list[dict[str, Any]]:
        return await self._list(LOCALQUEUES)

    async def skipped_queues(self, cluster_queues: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        """ClusterQueues that get no placeholder (multikueue.py: a MultiKueue manager's). The
        AdmissionChecks are listed only when some ClusterQueue names one; if they cannot be, those
        ClusterQueues are skipped (a placeholder in a MultiKueue one is rejected at every poll).
        Logged when the set changes."""
        if not needs_admission_checks(cluster_queues):
            skipped: dict[str, str] = {}
        else:
            try:
                skipped = multikueue_skipped(cluster_queues, await self._list(ADMISSIONCHECKS))
            except ServerError as exc:
                why = f"{status_of(exc) or ''} {str(exc)[:200]}".strip()
                skipped = multikueue_skipped(cluster_queues, None, unreadable=why)
        if skipped != self.skipped:
            log.info("reservation skips ClusterQueues", extra={"clusterQueues": skipped})
            self.skipped = skipped
        return skipped

    async def reconcile(
        self,
        desired: Sequence[Reservation],
        flavors: Sequence[FlavorSpec],
        *,
        leader: bool,
        local_queues: Sequence[Mapping[str, Any]],
        now: str,
    ) -> ReservationReport:
        report = ReservationReport(self.mode, list(desired))
        if self.mode == "off" or not leader:
            return report
        existing = [
            Placeholder.from_object(o) for o in await self._list(WORKLOADS, f"{RESERVATION_LABEL}=true")
        ]
        report.admitted = admitted_by_flavor(existing)
        self.evictions_seen &= {p.uid for p in existing}
        # Shadow reserves nothing: it only removes placeholders an earlier enforce run left behind.
        changes = plan_changes(desired if self.mode == "enforce" else [], existing)
        labels_of = {f.name: f.node_labels for f in flavors}
        for r in changes.create:
            report.created += await self._write(
                "POST", r.namespace, "workloads", placeholder_object(r, labels_of.get(r.flavor, {}))
            )
        for p in changes.delete:
            report.deleted += await self._write("DELETE", p.namespace, f"workloads/{p.name}", None)
        cq_of = {(r.namespace, r.name): r.cluster_queue for r in desired}
        for p in changes.evicted:
            if p.uid not in self.evictions_seen:  # a failed delete is retried, not counted again
                self.evictions_seen.add(p.uid)
                report.evicted.append(
                    replace(p, cluster_queue=p.cluster_queue or cq_of[(p.namespace, p.name)])
                )
                await self._announce_eviction(p)
            report.deleted += await self._write("DELETE", p.namespace, f"workloads/{p.name}", None)
        for p in changes.mark_ready:
            report.marked_ready += await self._write(
                "PATCH",
                p.namespace,
                f"workloads/{p.name}/status",
                pods_ready_patch(p.name, p.namespace, now),
                apply=True,
            )
        report.errors = (
            len(changes.create)
            + len(changes.delete)
            + len(changes.evicted)
            + len(changes.mark_ready)
            - (report.created + report.deleted + report.marked_ready)
        )
        if self.mode == "enforce" and desired:
            await self._announce(desired, local_queues)
        return report

    async def _write(
        self, method: str, namespace: str, url: str, body: Mapping[str, Any] | None, *, apply: bool = False
    ) -> int:
        params = {"fieldManager": FIELD_MANAGER, "force": "true"} if apply else None
        headers = {"Content-Type": "application/apply-patch+yaml"} if apply else None
        try:
            async with self.api.call_api(
                method,
                version=WORKLOADS.version,
                namespace=namespace,
                url=url,
                params=params,
                headers=headers,
                content=json.dumps(body) if body is not None else None,
            ):
                pass
        except ServerError as exc:
            code = status_of(exc)
            if (method == "POST" and code == 409) or (method == "DELETE" and code == 404):
                return 1  # already as wanted (another writer, or the previous poll)
            log.warning(
                "reservation write failed",
                extra={"method": method, "namespace": namespace, "url": url, "error": str(exc)[:300]},
            )
            return 0
        log.info("reservation", extra={"method": method, "namespace": namespace, "url": url})
        return 1

    async def _announce_eviction(self, p: Placeholder) -> None:
        why = f" ({p.eviction_message})" if p.eviction_message else ""
        message = (
            f"Kueue evicted the reservation of {p.gpus} {p.resource} held outside Kueue by {p.holder}: "
            f"{p.eviction_reason}{why}. Until it is admitted again Kueue may admit work onto those "
            "GPUs; ghostgpu deletes it (an owner-less Workload keeps its quota when evicted) and "
            "creates it again at the next poll."
        )
        try:
            await self.emit_event(p.involved(), reason="ReservationEvicted", message=message, type_="Warning")
        except ServerError as exc:
            log.warning("cannot write an Event", extra={"workload": p.name, "error": str(exc)[:300]})
        log.warning(
            "reservation evicted",
            extra={"namespace": p.namespace, "workload": p.name, "reason": p.eviction_reason,
                   "detail": p.eviction_message[:300]},
        )  # fmt: skip

    async def _announce(
        self, desired: Sequence[Reservation], local_queues: Sequence[Mapping[str, Any]]
    ) -> None:
        """An Event on each Kueue Workload that waits in a ClusterQueue holding reservations, once
        per message (a changed reservation is announced again)."""
        lq_cq = {
            (
                str((lq.get("metadata") or {}).get("namespace", "")),
                str((lq.get("metadata") or {}).get("name", "")),
            ): str((lq.get("spec") or {}).get("clusterQueue", ""))
            for lq in local_queues
        }
        try:
            pending = waiting_messages(await self._list(WORKLOADS), desired, lq_cq)
        except ServerError as exc:
            log.warning("cannot list Kueue workloads", extra={"error": str(exc)[:300]})
            return
        for key, (wl, message) in sorted(pending.items(), key=lambda kv: kv[0]):
            if self.announced.get(key) == message:
                continue
            try:
                await self.emit_event(
                    {"apiVersion": WORKLOADS.version, "kind": "Workload", **wl},
                    reason="GPUsHeldOutsideKueue",
                    message=message,
                )
                self.announced[key] = message
            except ServerError as exc:
                log.warning("cannot write an Event", extra={"workload": key[1], "error": str(exc)[:300]})
        for key in [k for k in self.announced if k not in pending]:
            del self.announced[key]


class ReservationMetrics:
    """Gauges on the controller's registry (same numbers as `ghostgpu status`)."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge

        self.desired = Gauge(
            "ghostgpu_reservation_gpus",
            "GPUs held outside Kueue that the reservation counts (enforce) or would count (shadow) in "
            "a team's ClusterQueue, by ClusterQueue, team, flavor and mode.",
            ["cluster_queue", "team", "flavor", "mode"],
            registry=registry,
        )
        self.admitted = Gauge(
            "ghostgpu_reservation_admitted_gpus",
            "GPUs reserved by placeholder Workloads that Kueue admitted, by ClusterQueue and flavor.",
            ["cluster_queue", "flavor"],
            registry=registry,
        )
        self.borrowed = Gauge(
            "ghostgpu_reservation_borrowed_gpus",
            "GPUs of the admitted reservation that may stand on quota the ClusterQueue borrows in its "
            "cohort: a reclaim by the lender or fair sharing can preempt them (then Kueue admits the "
            "lender's work onto GPUs still held until the placeholder is admitted again).",
            ["cluster_queue", "flavor"],
            registry=registry,
        )
        self.evictions = Counter(
            "ghostgpu_reservation_evictions_total",
            "Placeholder Workloads Kueue evicted (then deleted and created again by the controller), by "
            "ClusterQueue and reason (the preemption's kind, e.g. InCohortReclamation or "
            "InCohortFairSharing, else the eviction's, e.g. PodsReadyTimeout).",
            ["cluster_queue", "reason"],
            registry=registry,
        )
        self.writes = Gauge(
            "ghostgpu_reservation_last_writes",
            "Placeholder writes of the last poll, by kind (create, delete, ready, error).",
            ["kind"],
            registry=registry,
        )

    def set(self, report: ReservationReport) -> None:
        self.desired.clear()
        for (cq, team, flavor), gpus in sorted(report.desired_by().items()):
            self.desired.labels(cq, team, flavor, report.mode).set(gpus)
        self.admitted.clear()
        for (cq, flavor), gpus in sorted(report.admitted.items()):
            self.admitted.labels(cq, flavor).set(gpus)
        self.borrowed.clear()
        for (cq, flavor), gpus in sorted(report.borrowed.items()):
            self.borrowed.labels(cq, flavor).set(gpus)
        for p in report.evicted:
            self.evictions.labels(p.cluster_queue, p.eviction_reason).inc()
        for kind, n in (
            ("create", report.created),
            ("delete", report.deleted),
            ("ready", report.marked_ready),
            ("error", report.errors),
        ):
            self.writes.labels(kind).set(n)
