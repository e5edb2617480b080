"""Kueue's MultiKueue, as the reservation sees it (docs/reservation.md, "MultiKueue").

On a MultiKueue *manager* a ClusterQueue whose admission checks include a MultiKueue AdmissionCheck
(`spec.controllerName: kueue.x-k8s.io/multikueue`) does not run its Workloads: it sends a copy of
each to the worker clusters. Kueue's MultiKueue workload controller rejects a Workload without an
owner it has an adapter for ("No multikueue adapter found"), so a placeholder there would be
rejected, deactivated (the controller then deletes it, as any evicted placeholder) and created
again at every poll, while reserving nothing. No placeholder is written into such a ClusterQueue.

On a *worker* the copies arrive labelled `kueue.x-k8s.io/multikueue-origin` and are admitted by the
worker's own Kueue against its own quota: that is where the reservation belongs, unchanged.

Pure: the listed ClusterQueues, AdmissionChecks and Workloads in, the verdicts out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ghostgpu.controller.kube import ResourceType

ADMISSIONCHECKS = ResourceType(
    "kueue.x-k8s.io/v1beta2", "admissionchecks", namespaced=False, kind="AdmissionCheck"
)
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"  # AdmissionCheck spec.controllerName
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"  # on the Workloads a manager created in a worker


def admission_checks_of(cluster_queue: Mapping[str, Any]) -> list[str]:
    """The AdmissionCheck names a ClusterQueue requires: `spec.admissionChecksStrategy` (the only
    field of v1beta2) and `spec.admissionChecks` (v1beta1's list of names, as a v1beta1 manifest
    or an older reader may show it)."""
    spec = cluster_queue.get("spec") or {}
    names = [str(n) for n in spec.get("admissionChecks") or [] if isinstance(n, str)]
    for rule in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []:
        if isinstance(rule, Mapping) and rule.get("name"):
            names.append(str(rule["name"]))
    return sorted(set(names))


def needs_admission_checks(cluster_queues: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any ClusterQueue names an AdmissionCheck (else there is nothing to list)."""
    return any(admission_checks_of(cq) for cq in cluster_queues)


def multikueue_checks(admission_checks: Iterable[Mapping[str, Any]]) -> set[str]:
    return {
        str((ac.get("metadata") or {}).get("name", ""))
        for ac in admission_checks
        if (ac.get("spec") or {}).get("controllerName") == MULTIKUEUE_CONTROLLER
    }


def skipped_queues(
    cluster_queues: Iterable[Mapping[str, Any]],
    admission_checks: Iterable[Mapping[str, Any]] | None,
    *,
    unreadable: str = "",
) -> dict[str, str]:
    """ClusterQueue -> why the reservation writes no placeholder into it.

    A ClusterQueue whose admission checks include a MultiKueue one dispatches to workers. When the
    AdmissionChecks could not be listed (`admission_checks` None, `unreadable` says why), every
    ClusterQueue that names an admission check is skipped too: it may be a MultiKueue one, and a
    reservation that cannot be told apart from a rejection loop is not written."""
    mk = multikueue_checks(admission_checks) if admission_checks is not None else set()
    out: dict[str, str] = {}
    for cq in cluster_queues:
        name = str((cq.get("metadata") or {}).get("name", ""))
        checks = admission_checks_of(cq)
        if not checks:
            continue
        if admission_checks is None:
            out[name] = (
                f"its admission checks ({', '.join(checks)}) cannot be read"
                + (f": {unreadable}" if unreadable else "")
                + "; it may send its Workloads to MultiKueue workers"
            )
            continue
        multi = [c for c in checks if c in mk]
        if multi:
            out[name] = (
                f"MultiKueue AdmissionCheck {multi[0]}: Kueue sends its Workloads to worker clusters and "
                "rejects an owner-less placeholder there; reserve in each worker instead"
            )
    return out


def worker_workloads(workloads: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """MultiKueue origin -> Workloads in this cluster that a manager of that origin created: a
    cluster with any is a MultiKueue worker."""
    out: dict[str, int] = {}
    for wl in workloads:
        origin = ((wl.get("metadata") or {}).get("labels") or {}).get(ORIGIN_LABEL)
        if origin:
            out[str(origin)] = out.get(str(origin), 0) + 1
    return dict(sorted(out.items()))


def admitted_flavors(workload: Mapping[str, Any]) -> set[str]:
    """The flavors Kueue admitted a Workload on (status.admission.podSetAssignments[].flavors)."""
    admission = (workload.get("status") or {}).get("admission") or {}
    return {
        str(f)
        for psa in admission.get("podSetAssignments") or []
        for f in ((psa or {}).get("flavors") or {}).values()
    }


def fill_accounts(
    accounts: Iterable[Any],
    skipped: Mapping[str, str],
    quota_flavors: Mapping[str, Mapping[str, Any]],
    workloads: Iterable[Mapping[str, Any]],
) -> None:
    """Per flavor (`ghostgpu status`): the skipped ClusterQueues with quota on it, and how many
    Workloads a MultiKueue manager sent here are admitted on it. `quota_flavors`: ClusterQueue ->
    flavor -> resources (reservation.cq_flavors)."""
    sent = [w for w in workloads if ((w.get("metadata") or {}).get("labels") or {}).get(ORIGIN_LABEL)]
    for a in accounts:
        a.reservation_skipped = {
            cq: why for cq, why in sorted(skipped.items()) if a.flavor in quota_flavors.get(cq, {})
        }
        a.multikueue_workloads = sum(1 for w in sent if a.flavor in admitted_flavors(w))


__all__ = [
    "ADMISSIONCHECKS",
    "MULTIKUEUE_CONTROLLER",
    "ORIGIN_LABEL",
    "admission_checks_of",
    "admitted_flavors",
    "fill_accounts",
    "multikueue_checks",
    "needs_admission_checks",
    "skipped_queues",
    "worker_workloads",
]
