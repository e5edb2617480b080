"""What one poll hands from room to room (reconciler.py): the watch caches' snapshot it starts
from, each judged workload, and the result the caller (app.py: accounting, reservations) reads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ghostgpu.controller.inventory import PodView, Workload, WorkloadRef, namespace_opted_in
from ghostgpu.verdict import RECLAIMABLE_KINDS, Evidence, Verdict

if TYPE_CHECKING:  # the rooms' own types; this module sits below them
    from ghostgpu.controller.books.accounting import FlavorAccount
    from ghostgpu.controller.judge.planner import Plan
    from ghostgpu.controller.observe.evidence import WorkloadState
    from ghostgpu.controller.slices import Capacity


@dataclass
class Snapshot:
    """What the watch caches hold at the start of a poll."""

    namespaces: Mapping[str, Mapping[str, str]]  # name -> labels
    workloads: Mapping[WorkloadRef, Workload]  # tracked, any namespace
    pods: Sequence[PodView]  # every pod
    nodes: Sequence[Mapping[str, Any]]
    # A pod -> its workload at the top of its owner chain (managers.Resolution.top_of); None:
    # Deployment/StatefulSet/bare Pod only (inventory.owner_workload).
    top_of: Callable[[PodView], WorkloadRef | None] | None = None
    # A pod -> the top of its controller chain as the caches see it, tracked or not
    # (managers.Resolution.holder_of): names the holder of GPUs no workload accounts for.
    holder_of: Callable[[PodView], WorkloadRef] | None = None
    # Each DRA flavor's devices from the ResourceSlices (slices.dra_capacity); empty without DRA
    # flavors. A DRA flavor missing here has an unknown capacity.
    dra_capacity: Mapping[str, Capacity] = field(default_factory=dict)

    def opted_in(self) -> set[str]:
        return {ns for ns, labels in self.namespaces.items() if namespace_opted_in(labels)}


# Slotted: one object per judged workload per poll, not an object and its __dict__ (50,000 of
# each at 50,000 pods, every one tracked by the collector until the poll ends).
@dataclass(slots=True)
class Judged:
    workload: Workload
    pods: list[PodView]
    verdict: Verdict
    # None when the utilization window alone settled the verdict and nothing was written (the
    # evidence is assembled only where it is used: verdict.window_verdict).
    evidence: Evidence | None
    plan: Plan
    # verdict.kind's value, read once: an enum member's .value is a Python-level descriptor call,
    # and the accounting reads it for every pod of every poll.
    kind: str
    # The workload's memory (observe room): the act room's once-per-verdict announcements live there.
    state: WorkloadState | None = None


@dataclass
class PollResult:
    started: float
    duration: float = 0.0
    states: Counter[str] = field(default_factory=Counter)
    judged: dict[WorkloadRef, Judged] = field(default_factory=dict)
    actions: list[tuple[WorkloadRef, str]] = field(default_factory=list)
    accounts: list[FlavorAccount] = field(default_factory=list)
    # The poll's opted-in workloads and their pods, for accounting_from (computed once per poll).
    pods_of: dict[WorkloadRef, list[PodView]] | None = None
    # The GPU pods no such workload holds, by holder (books.untracked_of: computed once per poll,
    # read by the ghost gauge, the owner kinds, the accounting and the reservation).
    untracked: dict[WorkloadRef, list[PodView]] | None = None


# Outcomes of a reclaim that stops pods (the settle skip, the Kueue nudge).
RECLAIM_OUTCOMES = ("scaled-to-zero", "stopped")

# RECLAIMABLE_KINDS by value (Judged.kind): a str hashes in C, an enum member in Python.
RECLAIMABLE_VALUES = frozenset(k.value for k in RECLAIMABLE_KINDS)
