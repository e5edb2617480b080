"""The controller's Prometheus metrics (one registry per controller instance, so tests and two
replicas in one process never share counters)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ghostgpu.controller.books.accounting import FlavorAccount

if TYPE_CHECKING:
    from ghostgpu.controller.books.owners import OwnerKindRow


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.ghost_gpus = Gauge(
            "ghostgpu_ghost_gpus",
            "GPUs held by tracked workloads outside Kueue, by namespace, flavor and latest verdict.",
            ["namespace", "flavor", "verdict"],
            registry=r,
        )
        self.workloads = Gauge(
            "ghostgpu_tracked_workloads", "Tracked workloads by state.", ["state"], registry=r
        )
        self.reclaims = Counter(
            "ghostgpu_reclaims_total",
            "Reclaim actions taken (enforce mode), by namespace, verdict and action.",
            ["namespace", "verdict", "action"],
            registry=r,
        )
        self.would_reclaims = Counter(
            "ghostgpu_would_reclaims_total",
            "Reclaims shadow mode would have taken (counted when the verdict turns reclaimable).",
            ["namespace", "verdict"],
            registry=r,
        )
        self.idle_sessions = Gauge(
            "ghostgpu_idle_session_deadline_seconds",
            "Idle sessions warned (state warned: the unix time of the stop) or, in shadow mode, that "
            "would be (would-warn, would-stop: the time it was judged), by namespace, workload, "
            "class and team (controller.idleSessions).",
            ["namespace", "workload", "class", "team", "state"],
            registry=r,
        )
        self.idle_session_gpu_hours = Counter(
            "ghostgpu_idle_session_gpu_hours_total",
            "GPU-hours idle sessions held before they were stopped at their deadline, by namespace "
            "and class.",
            ["namespace", "class"],
            registry=r,
        )
        self.escalations = Counter(
            "ghostgpu_escalations_total",
            "Actions handed to a person by the risk gate.",
            ["namespace", "action"],
            registry=r,
        )
        self.reclaim_reverts = Counter(
            "ghostgpu_reclaim_reverts_total",
            "Reclaims undone by someone other than `ghostgpu restore` (recorded once each, by the "
            "field manager that wrote the stopped field back: argocd-controller, kubectl, ...).",
            ["namespace", "writer"],
            registry=r,
        )
        self.gpu_hours_recovered = Counter(
            "ghostgpu_gpu_hours_recovered_total",
            "GPU-hours freed by reclaimed workloads, managers stopped through their own API included "
            "(accrued every poll while the reclaim holds).",
            ["namespace", "flavor"],
            registry=r,
        )
        self.gpu_hours_reclaimable = Counter(
            "ghostgpu_gpu_hours_reclaimable_total",
            "GPU-hours held by workloads judged reclaimable (what shadow mode would have recovered).",
            ["namespace", "flavor"],
            registry=r,
        )
        self.signal_failures = Counter(
            "ghostgpu_signal_failures_total",
            "Failed signal readings by source and reason.",
            ["source", "reason"],
            registry=r,
        )
        self.no_listing = Gauge(
            "ghostgpu_workloads_without_process_listing",
            "Utilization-idle workloads with a GPU container that has no usable ps (distroless): "
            "their processes cannot be seen, so their verdict stays UNKNOWN.",
            registry=r,
        )
        self.without_processes = Gauge(
            "ghostgpu_workloads_without_process_signal",
            "Utilization-idle workloads whose processes could not be read this poll, by reason (the "
            "node agent not reporting a container: missing; its scan too old: stale; a container it "
            "cannot see: no-cgroup-match, proc-unreadable, not-running; exec: no-listing, ...). Their "
            "verdict stays UNKNOWN.",
            ["reason"],
            registry=r,
        )
        self.write_fallbacks = Counter(
            "ghostgpu_annotation_fallbacks_total",
            "Verdict annotations written to pods because an admission webhook refused the workload.",
            ["namespace"],
            registry=r,
        )
        self.poll_duration = Histogram(
            "ghostgpu_poll_duration_seconds",
            "Wall time of one reconcile poll (query, probes, verdicts, writes).",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.leader = Gauge("ghostgpu_leader", "1 while this replica holds the lease.", registry=r)
        self.flavor_gpus = Gauge(
            "ghostgpu_flavor_gpus",
            "Accounting gap per flavor: allocatable, kueue_admitted, kueue_nominal, held_outside_kueue, "
            "truly_free, kueue_believes_free (same numbers as `ghostgpu status`).",
            ["flavor", "kind"],
            registry=r,
        )
        self.flavor_outside = Gauge(
            "ghostgpu_flavor_outside_kueue_gpus",
            "GPUs held outside Kueue per flavor, split by verdict.",
            ["flavor", "verdict"],
            registry=r,
        )
        self.owner_kind_outside = Gauge(
            "ghostgpu_owner_kind_outside_kueue_gpus",
            "GPUs held outside Kueue by the top owner kind (and its API group) of their pods, and whether "
            "ghostgpu can stop that kind (stoppable: an actuator row whose stop applies); the same rows as "
            "`ghostgpu status --by owner`. Exported by the leader; a kind that no longer holds GPUs has no "
            "series.",
            ["owner_kind", "owner_group", "stoppable"],
            registry=r,
        )

    def set_accounting(self, accounts: Iterable[FlavorAccount]) -> None:
        self.flavor_outside.clear()
        for a in accounts:
            for kind, value in (
                ("allocatable", a.allocatable),
                ("kueue_nominal", a.kueue_nominal),
                ("kueue_admitted", a.kueue_admitted),
                ("held_outside_kueue", a.held_outside_kueue),
                ("truly_free", a.truly_free),
                ("kueue_believes_free", a.kueue_believes_free),
            ):
                if (kind == "allocatable" and not a.allocatable_known) or (
                    kind == "truly_free" and not a.free_known
                ):
                    # Unknown (a DRA flavor, accounting.FlavorAccount): no series rather than a
                    # made-up 0, and none left over from a poll when it was known.
                    with contextlib.suppress(KeyError):
                        self.flavor_gpus.remove(a.flavor, kind)
                    continue
                self.flavor_gpus.labels(a.flavor, kind).set(value)
            for verdict, value in a.outside_kueue.items():
                self.flavor_outside.labels(a.flavor, verdict).set(value)

    def set_ghosts(self, rows: Mapping[tuple[str, str, str], float]) -> None:
        self.ghost_gpus.clear()
        for (ns, flavor, verdict), value in rows.items():
            self.ghost_gpus.labels(ns, flavor, verdict).set(value)

    def set_owner_kinds(self, rows: Iterable[OwnerKindRow]) -> None:
        """One series per (kind, group, stoppable) holding GPUs now: cleared first, so a kind that
        stopped holding GPUs disappears instead of keeping its last value."""
        self.owner_kind_outside.clear()
        for row in rows:
            self.owner_kind_outside.labels(row.kind, row.group, "true" if row.acts else "false").set(row.gpus)

    def set_without_processes(self, counts: Mapping[str, int]) -> None:
        self.without_processes.clear()
        for reason, n in sorted(counts.items()):
            self.without_processes.labels(reason).set(n)

    def set_workload_states(self, counts: Mapping[str, int]) -> None:
        self.workloads.clear()
        for state, n in counts.items():
            self.workloads.labels(state).set(n)
