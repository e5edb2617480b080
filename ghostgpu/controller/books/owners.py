"""GPUs held outside Kueue by top owner group and kind (pure): which operators hold them, so a platform team
sees which kinds to add an actuator row for (`ghostgpu status --by owner`; the leader exports the
same rows each poll as `ghostgpu_owner_kind_outside_kueue_gpus`, books.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ghostgpu.controller.books.untracked import untracked_holders
from ghostgpu.controller.inventory import PodView, WorkloadRef
from ghostgpu.controller.poll import Snapshot


@dataclass(frozen=True, slots=True)
class OwnerKindRow:
    kind: str  # the top owner's kind (Deployment, RayJob, Job, a kind with no row...)
    acts: bool  # ghostgpu can stop this kind (an actuator row whose stop applies)
    holders: int  # distinct top owners of this kind holding GPUs
    gpus: float
    group: str = ""  # its API group: batch/v1's Job and Volcano's batch.volcano.sh Job are two rows

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "group": self.group,
            "actionable": self.acts,
            "holders": self.holders,
            "gpus": self.gpus,
        }


def by_owner_kind(
    snap: Snapshot,
    pods_of: Mapping[WorkloadRef, Sequence[PodView]],
    untracked: Mapping[WorkloadRef, Sequence[PodView]] | None = None,
) -> list[OwnerKindRow]:
    """Every GPU held outside Kueue in opted-in namespaces by its top owner's kind, most GPUs
    first: tracked workloads (acts unless judged with no actuator) and untracked holders (never).
    `untracked`: this snapshot's `untracked_holders` when the caller has them (the books' poll),
    else computed here."""
    opted = snap.opted_in()
    gpus: dict[tuple[str, str, bool], float] = {}
    holders: dict[tuple[str, str, bool], set[WorkloadRef]] = {}

    def add(ref: WorkloadRef, acts: bool, pods: Sequence[PodView]) -> None:
        if len(pods) == 1:  # one pod (nearly every workload): no generator
            p = pods[0]
            n = sum(p.gpu_requests.values()) if p.holds_gpus else 0
        else:
            n = sum(sum(p.gpu_requests.values()) for p in pods if p.holds_gpus)
        if n:
            key = (ref.kind, ref.group, acts)
            gpus[key] = gpus.get(key, 0.0) + n
            # Not setdefault(key, set()): that builds an empty set for every workload, every poll.
            held = holders.get(key)
            if held is None:
                held = holders[key] = set()
            held.add(ref)

    for ref, pods in pods_of.items():
        wl = snap.workloads.get(ref)
        if wl is not None and ref.namespace in opted:
            add(ref, not wl.no_actuator, pods)
    if untracked is None:
        untracked = untracked_holders(snap.pods, snap.namespaces, pods_of, snap.holder_of)
    for ref, pods in untracked.items():
        add(ref, False, pods)
    rows = [OwnerKindRow(k, acts, len(holders[(k, g, acts)]), n, g) for (k, g, acts), n in gpus.items()]
    return sorted(rows, key=lambda r: (-r.gpus, r.kind, r.group, r.acts))


__all__ = ["OwnerKindRow", "by_owner_kind"]
