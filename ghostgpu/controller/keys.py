"""The `ghostgpu.io/` labelling contract (docs/design.md#labelling-contract) as the controller uses it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ghostgpu.config import OPT_IN_LABEL, OPT_IN_VALUE, TEAM_LABEL, TRACKED_LABEL
from ghostgpu.idle_policy import AFTER_ANNOTATION

__all__ = ["OPT_IN_LABEL", "OPT_IN_VALUE", "TEAM_LABEL", "TRACKED_LABEL"]

RECLAIM_POLICY = "ghostgpu.io/reclaim-policy"  # "never": never act
GPU_EVICTION_POLICY = "gpu-eviction-policy"  # honoured the same way (docs/design.md#labelling-contract)
ARTIFACTS = "ghostgpu.io/artifacts"
VERDICT = "ghostgpu.io/verdict"
EVIDENCE = "ghostgpu.io/evidence"
RECLAIMED_FROM = "ghostgpu.io/reclaimed-from-replicas"
RECLAIMED_AT = "ghostgpu.io/reclaimed-at"
ESCALATED = "ghostgpu.io/escalated"
COMPONENT = "ghostgpu-controller"
# On the controller's Lease: HOST:PORT where the holder serves /decisions (followers proxy to it).
LEADER_ADDRESS = "ghostgpu.io/leader-address"
CAPACITY_FREED_AT = "ghostgpu.io/capacity-freed-at"  # on Nodes: nudges Kueue to retry pending work


def refuses_reclaim(annotations: Mapping[str, str]) -> bool:
    """The owner said never (either key), on the object as freshly read before a stop."""
    return annotations.get(RECLAIM_POLICY) == "never" or annotations.get(GPU_EVICTION_POLICY) == "never"


def namespace_view(obj: Mapping[str, Any]) -> dict[str, str]:
    """A Namespace as the controller keeps it: its labels, plus the one annotation it reads,
    ghostgpu.io/idle-after (docs/idle-sessions.md), under that key. A label of the same name reads
    the same when no annotation is set: both are the namespace's owner's to write, and the policy
    clamps the value to the file's bounds either way."""
    meta = obj.get("metadata") or {}
    out = dict(meta.get("labels") or {})
    after = (meta.get("annotations") or {}).get(AFTER_ANNOTATION)
    if isinstance(after, str):
        out[AFTER_ANNOTATION] = after[:64]
    return out
