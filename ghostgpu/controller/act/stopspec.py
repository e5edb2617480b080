"""What a stop writes and how to tell it holds: the two facts the GitOps pre-flight (gitops.py) and
the revert guard (revert_guard.py) need about any way of stopping a workload.

`writes` are RFC 6901 JSON pointers into the object the stop changes (`/spec/replicas`,
`/spec/suspend`, `/metadata/annotations/kubeflow-resource-stopped`); `is_stopped` says whether a
fresh copy of the object is stopped. Both are plain data, so an actuator table can hand them over
as they are (`StopSpec(tuple(actuator.writes), actuator.is_stopped)`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

IsStopped = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True, slots=True)
class StopSpec:
    writes: tuple[str, ...]
    is_stopped: IsStopped


def replicas_zero(obj: Mapping[str, Any]) -> bool:
    """A Deployment or StatefulSet is stopped at `spec.replicas: 0` (absent means the default, 1)."""
    replicas = (obj.get("spec") or {}).get("replicas", 1)
    return replicas is not None and int(replicas) == 0


# A scale row's stop (the actuator table's Deployment and StatefulSet rows write the same pointer).
SCALE_TO_ZERO = StopSpec(("/spec/replicas",), replicas_zero)
