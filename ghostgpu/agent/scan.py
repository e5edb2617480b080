"""One scan of a node: its GPU pods' containers, each matched to its processes and counted by role.

Which containers (the set the controller's exec source would list, and more): every container
that asks for a GPU in a Running pod that asks for one (any container, init containers too), or
the pod's first container when only an init container does. A container asks for a GPU when it
requests a device-plugin GPU resource or names a claim in `resources.claims` (DRA): the agent may
read pods only, not the ResourceClaims that say a claim's device class, so every claim counts (a
container of a NIC-only claim is reported too; the controller reads only its tracked pods'
containers). Per container:

- running with a container ID: its host processes are the ones whose cgroup names that ID; none
  at all is `no-cgroup-match` (the agent cannot see it: a private cgroup namespace, another
  layout, a proc root that is not the host's);
- in a pod with `shareProcessNamespace`: every process of the pod's pid namespace (the sandbox's
  pause as pid 1, every container's), as `ps` in any of its containers lists them. Which pod
  cgroup that is comes from the container's own processes (the kubelet names it after the pod's
  UID, a static pod's after its config hash), never from the pod's annotations, which its author
  writes;
- not running (waiting, terminated, no ID yet): `not-running`;
- one of its processes there but unreadable: `proc-unreadable`; more than procfs.MAX_PROCESSES
  processes: `too-many-processes`. Only that container (with a shared pid namespace, the pod's
  containers) is unseen, never the others;
- a proc root that could not be listed, or a process whose cgroup could not be read: every
  container `proc-unreadable` (a process that cannot be placed may be any container's, so no
  container's count is known to be complete).

The rows are counted with the configured ProcessPolicy (`count_roles`), exactly as the exec
source's rows are: same classifier, same shared-namespace rule (pause as pid 1 of the scope).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

from ghostgpu.agent import procfs
from ghostgpu.agent.idle_facts import IdleFacts, idle_facts
from ghostgpu.verdict import ProcessCounts, ProcessInfo, ProcessPolicy, count_roles


class Unseen(StrEnum):
    NO_CGROUP_MATCH = "no-cgroup-match"
    PROC_UNREADABLE = procfs.Incomplete.PROC_UNREADABLE.value
    TOO_MANY_PROCESSES = procfs.Incomplete.TOO_MANY_PROCESSES.value
    NOT_RUNNING = "not-running"


class ContainerKey(NamedTuple):
    namespace: str
    pod: str
    uid: str  # the pod's metadata.uid
    container: str


@dataclass(frozen=True, slots=True)
class Target:
    key: ContainerKey
    container_id: str | None  # None: not running
    shares_pids: bool


@dataclass(frozen=True, slots=True)
class Seen:
    counts: ProcessCounts
    rows: tuple[ProcessInfo, ...]
    # For a container an idle session may live in (agent/idle_facts.py); None for the others.
    idle: IdleFacts | None = None


@dataclass(frozen=True, slots=True)
class ScanResult:
    timestamp: float  # unix time the scan started
    containers: Mapping[ContainerKey, Seen | Unseen]
    scanned_pids: int
    duration_s: float = 0.0


def _requests_gpu(container: Mapping[str, Any], is_gpu: Callable[[str], bool]) -> bool:
    res = container.get("resources") or {}
    if res.get("claims"):  # DRA: a claim's class is not the agent's to read (see the module)
        return True
    return any(is_gpu(r) for r in (*(res.get("limits") or {}), *(res.get("requests") or {})))


def targets_of(pod: Mapping[str, Any], is_gpu: Callable[[str], bool]) -> list[Target]:
    """The containers of one pod the agent reports on (none for a pod that is not a Running GPU pod)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if status.get("phase") != "Running" or meta.get("deletionTimestamp"):
        return []
    containers = spec.get("containers") or []
    gpu = [str(c.get("name", "")) for c in containers if _requests_gpu(c, is_gpu)]
    if not gpu:
        if not any(_requests_gpu(c, is_gpu) for c in spec.get("initContainers") or []) or not containers:
            return []
        gpu = [str(containers[0].get("name", ""))]
    statuses = {str(s.get("name", "")): s for s in status.get("containerStatuses") or []}
    uid = str(meta.get("uid", ""))
    out = []
    for name in gpu:
        st = statuses.get(name) or {}
        cid = str(st.get("containerID") or "")
        running = "running" in (st.get("state") or {}) and "://" in cid
        out.append(
            Target(
                key=ContainerKey(str(meta.get("namespace", "")), str(meta.get("name", "")), uid, name),
                container_id=cid.split("://", 1)[1] if running else None,
                shares_pids=bool(spec.get("shareProcessNamespace")),
            )
        )
    return out


def _slim_container(c: Mapping[str, Any]) -> dict[str, Any]:
    res = c.get("resources") or {}
    kept = {k: dict.fromkeys(res.get(k) or {}, "") for k in ("limits", "requests")}  # names: no values
    return {"name": c.get("name", ""), "resources": {**kept, "claims": [{} for _ in res.get("claims") or []]}}


def agent_pod(obj: Mapping[str, Any], node: str, is_gpu: Callable[[str], bool]) -> dict[str, Any] | None:
    """What the agent's pod store keeps of a pod: the fields targets_of reads, or None for a pod
    it never reports on (another node's, one that finished, one that asks for no GPU). The watch
    already selects the node's unfinished pods; this keeps the store right whatever it is sent."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    if spec.get("nodeName") != node or status.get("phase") in ("Succeeded", "Failed"):
        return None
    containers = [_slim_container(c) for c in spec.get("containers") or []]
    inits = [_slim_container(c) for c in spec.get("initContainers") or []]
    if not any(_requests_gpu(c, is_gpu) for c in (*containers, *inits)):
        return None
    return {
        "metadata": {
            k: meta[k] for k in ("namespace", "name", "uid", "deletionTimestamp") if meta.get(k) is not None
        },
        "spec": {
            "nodeName": node,
            "containers": containers,
            "initContainers": inits,
            "shareProcessNamespace": bool(spec.get("shareProcessNamespace")),
        },
        "status": {
            "phase": status.get("phase"),
            "containerStatuses": [
                {
                    "name": st.get("name", ""),
                    "containerID": st.get("containerID") or "",
                    "state": {k: {} for k in st.get("state") or {}},  # which, not its details
                }
                for st in status.get("containerStatuses") or []
            ],
        },
    }


def scan_node(
    pods: Iterable[Mapping[str, Any]],
    proc: Path,
    policy: ProcessPolicy,
    is_gpu: Callable[[str], bool],
    *,
    now: float,
) -> ScanResult:
    """The node's GPU containers and their process counts, from one pass over `proc`."""
    targets = [t for pod in pods for t in targets_of(pod, is_gpu)]
    ids = {t.container_id for t in targets if t.container_id}
    shared = {t.container_id for t in targets if t.shares_pids and t.container_id}
    try:
        found = procfs.scan(proc, lambda ref: ref.container_id in ids, whole_pods_of=shared)
    except procfs.ProcUnreadable:
        return ScanResult(now, {t.key: Unseen.PROC_UNREADABLE for t in targets}, 0)
    by_container: dict[str, list[procfs.HostProcess]] = defaultdict(list)
    by_pod: dict[str, list[procfs.HostProcess]] = defaultdict(list)
    for p in found.processes.values():
        by_container[p.container.container_id].append(p)
        by_pod[p.container.pod_uid].append(p)
    failed_container = {ref.container_id: why for ref, why in found.failed.items()}
    failed_pod = {ref.pod_uid: why for ref, why in found.failed.items()}

    def outcome(t: Target) -> Seen | Unseen:
        if t.container_id is None:
            return Unseen.NOT_RUNNING
        if found.unplaced:
            return Unseen.PROC_UNREADABLE
        if t.container_id in failed_container:
            return Unseen(failed_container[t.container_id].value)
        own = by_container.get(t.container_id)
        if not own:
            return Unseen.NO_CGROUP_MATCH
        group = own
        if t.shares_pids:
            # The pod cgroup the container's own processes are in: one, a container ID is unique.
            pod_uids = {p.container.pod_uid for p in own}
            if len(pod_uids) != 1:
                return Unseen.PROC_UNREADABLE
            pod_uid = pod_uids.pop()
            if pod_uid in failed_pod:
                return Unseen(failed_pod[pod_uid].value)
            group = by_pod[pod_uid]
        rows = procfs.rows(group, f"{t.key.pod}/{t.key.container}")
        counts = count_roles(rows, policy)
        return Seen(counts, rows, idle_facts(group))

    out = {t.key: outcome(t) for t in targets}
    return ScanResult(now, out, found.scanned)
