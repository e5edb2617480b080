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
  pause as pid 1, every container's), as `ps` in any of its containers lists them;
- not running (waiting, terminated, no ID yet): `not-running`;
- a proc root that could not be read whole: every container `proc-unreadable` (a process that
  could not be placed may be any container's, so no container's count is known to be complete).

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
from ghostgpu.verdict import ProcessCounts, ProcessInfo, ProcessPolicy, count_roles

# A mirror pod's UID is not the one its cgroup carries: the kubelet names the static pod's cgroup
# after its config hash, which it writes into this annotation.
CONFIG_HASH = "kubernetes.io/config.hash"


class Unseen(StrEnum):
    NO_CGROUP_MATCH = "no-cgroup-match"
    PROC_UNREADABLE = "proc-unreadable"
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
    cgroup_uid: str  # the UID the pod's cgroup is named after
    shares_pids: bool


@dataclass(frozen=True, slots=True)
class Seen:
    counts: ProcessCounts
    rows: tuple[ProcessInfo, ...]


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
    cgroup_uid = str((meta.get("annotations") or {}).get(CONFIG_HASH) or uid)
    out = []
    for name in gpu:
        st = statuses.get(name) or {}
        cid = str(st.get("containerID") or "")
        running = "running" in (st.get("state") or {}) and "://" in cid
        out.append(
            Target(
                key=ContainerKey(str(meta.get("namespace", "")), str(meta.get("name", "")), uid, name),
                container_id=cid.split("://", 1)[1] if running else None,
                cgroup_uid=cgroup_uid,
                shares_pids=bool(spec.get("shareProcessNamespace")),
            )
        )
    return out


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
    shared_uids = {t.cgroup_uid for t in targets if t.shares_pids and t.container_id}
    try:
        found = procfs.scan(proc, lambda ref: ref.container_id in ids or ref.pod_uid in shared_uids)
    except procfs.ProcUnreadable:
        return ScanResult(now, {t.key: Unseen.PROC_UNREADABLE for t in targets}, 0)
    by_container: dict[str, list[procfs.HostProcess]] = defaultdict(list)
    by_pod: dict[str, list[procfs.HostProcess]] = defaultdict(list)
    for p in found.processes.values():
        by_container[p.container.container_id].append(p)
        if p.container.pod_uid in shared_uids:
            by_pod[p.container.pod_uid].append(p)
    out: dict[ContainerKey, Seen | Unseen] = {}
    for t in targets:
        if t.container_id is None:
            out[t.key] = Unseen.NOT_RUNNING
        elif found.unreadable:
            out[t.key] = Unseen.PROC_UNREADABLE
        elif not by_container.get(t.container_id):
            out[t.key] = Unseen.NO_CGROUP_MATCH
        else:
            group = by_pod[t.cgroup_uid] if t.shares_pids else by_container[t.container_id]
            rows = procfs.rows(group, f"{t.key.pod}/{t.key.container}")
            out[t.key] = Seen(count_roles(rows, policy), rows)
    return ScanResult(now, out, found.scanned)
