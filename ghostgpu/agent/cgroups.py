"""Which pod and container a host process belongs to, from its `/proc/<pid>/cgroup` lines (pure).

The kubelet names every pod's cgroup after the pod UID and the runtime names every container's
cgroup after the container ID, whatever the layout:

- cgroupfs driver: `<cgroupRoot>/kubepods[/burstable|/besteffort]/pod<uid>/<id>` (containerd,
  docker) or `.../pod<uid>/crio-<id>` (CRI-O); Guaranteed pods have no QoS level.
- systemd driver: `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
  cri-containerd-<id>.scope` (or `crio-<id>.scope`, `docker-<id>.scope`), the UID's `-` written `_`.
- cgroup v2 (`0::<path>`), v1 (`<n>:<controllers>:<path>`) and hybrid (both kinds of line).
- A reader in a private cgroup namespace sees paths relative to its own root (`/../../kubepods-...`):
  the pod and container segments are still there when the process is outside the reader's subtree.

`crio-conmon-<id>` is CRI-O's monitor, not the container: it matches nothing. A pod's sandbox
(pause) matches with the sandbox's ID, which no container status carries.

Only the outermost pod segment counts, and only the container segment right below it: a tenant
who may create cgroups inside its own container cannot name another pod or container that way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

_HEX_ID = r"[0-9a-f]{64}"
# A pod segment: `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid>.slice` (systemd).
_POD_SEGMENT = re.compile(r"^(?:pod|kubepods(?:-burstable|-besteffort)?-pod)([0-9a-f_-]+?)(?:\.slice)?$")
_CONTAINER_SEGMENT = re.compile(
    rf"^(?:(?:cri-containerd|crio|docker)-({_HEX_ID})\.scope|(?:crio-)?({_HEX_ID}))$"
)
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_STATIC_UID = re.compile(r"^[0-9a-f]{32}$")  # a static pod's UID: its config's hash


class ContainerRef(NamedTuple):
    pod_uid: str  # as the API writes it (dashes), or a static pod's config hash
    container_id: str  # the runtime's ID: the part after `containerd://` in a container status


def container_of_path(path: str) -> ContainerRef | None:
    """The pod and container a cgroup path names, or None (not a pod's container)."""
    # Relative to the reader's cgroup namespace: the subtree above (kubepods) may be out of sight.
    relative = path.startswith("/..")
    segments = [s for s in path.split("/") if s and s != ".."]
    for i, seg in enumerate(segments):
        pod = _POD_SEGMENT.match(seg)
        if pod is None:
            continue
        # Only under a kubepods subtree: a `pod...` directory elsewhere is not the kubelet's.
        if not relative and not any(s.startswith("kubepods") for s in segments[: i + 1]):
            continue
        uid = pod.group(1)
        if seg.endswith(".slice"):
            uid = uid.replace("_", "-")
        if not (_UUID.match(uid) or _STATIC_UID.match(uid)):
            return None
        if i + 1 >= len(segments):
            return None  # the pod's own cgroup: no container
        found = _CONTAINER_SEGMENT.match(segments[i + 1])
        if found is None:
            return None  # crio-conmon-<id>, or anything else below the pod
        return ContainerRef(uid, found.group(1) or found.group(2))
    return None


def container_of(lines: Iterable[str]) -> ContainerRef | None:
    """The pod and container of a process from its `/proc/<pid>/cgroup` lines, or None.

    Every line that names a container must name the same one (v1 controllers and the unified line
    of a hybrid host agree for a container's process); lines naming none (`0::/` on a hybrid host,
    a controller the runtime does not use) are ignored. Disagreeing lines give None: the process
    cannot be placed with certainty, so it is not counted for either container."""
    found: set[ContainerRef] = set()
    for line in lines:
        parts = line.rstrip("\n").split(":", 2)
        if len(parts) != 3:
            continue
        ref = container_of_path(parts[2])
        if ref is not None:
            found.add(ref)
    return found.pop() if len(found) == 1 else None
