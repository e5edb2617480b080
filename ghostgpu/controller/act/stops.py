"""Stopping and restoring a manager through its actuator (annotation and field stops; a `scale`
row goes through the scale subresource, act/stopping.py: Stopper.scale_to_zero).

The stop and its record (`ghostgpu.io/reclaimed-from`, the previous value of every pointer the stop
writes) are ONE merge patch with the object's resourceVersion as precondition: the object is never
stopped without the record `ghostgpu restore` needs, and a concurrent change makes it a no-op
(409). Both land on the top object, never on a child its manager rewrites.

A `create` row (Volcano's Job) writes only the record on the object, then creates the object its
controller reads as the stop (an AbortJob Command, owned by the Job); when that create fails, the
record is taken off again, so a record always stands for a stop that was asked for. Restore clears
the record, then creates the restore object (ResumeJob); when that create fails the record is put
back, so `ghostgpu restore` can be run again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ghostgpu.actuators import RECLAIMED_FROM_RECORD, Actuator
from ghostgpu.controller import keys
from ghostgpu.controller.inventory import WorkloadRef
from ghostgpu.controller.kube import AdmissionDenied, Conflict, NotFound

log = logging.getLogger("ghostgpu.controller")


@dataclass(frozen=True)
class StopOutcome:
    # "stopped", "gone", "already-stopped", "already-asked" (a create row's object is there and its
    # controller has not acted yet), "exempt", "unstoppable" (the stop's `requires` no longer
    # hold: judged again, then escalated), "not-leader", "conflict", "blocked", or what
    # `before` answered (a revert mark, the GitOps pre-flight)
    outcome: str
    fresh: Mapping[str, Any] | None = None
    detail: str = ""
    record: str = ""  # the ghostgpu.io/reclaimed-from value written with the stop


async def read_for_write(
    cluster: Any,
    ref: WorkloadRef,
    *,
    is_leader: Callable[[], bool],
    already: Callable[[Mapping[str, Any]], str | None],
) -> tuple[Mapping[str, Any] | None, str | None]:
    """Every stop re-reads the object right before its write and goes ahead only if it still should:
    (fresh, None) to go ahead, else (fresh or None, why not): gone, `already(fresh)` (someone — a
    person, the other replica — already did it), exempt by annotation, or not the leader (asked
    last, as close to the write as possible)."""
    try:
        fresh = await cluster.get(ref)
    except NotFound:
        return None, "gone"
    done = already(fresh)
    if done is not None:
        return fresh, done
    if keys.refuses_reclaim((fresh.get("metadata") or {}).get("annotations") or {}):
        return fresh, "exempt"
    if not is_leader():
        return fresh, "not-leader"
    return fresh, None


def _not_to_stop(a: Actuator, fresh: Mapping[str, Any]) -> str | None:
    if a.is_stopped(fresh):
        return "already-stopped"  # someone (a person, the other replica) did
    if a.stop == "create" and RECLAIMED_FROM_RECORD in (
        (fresh.get("metadata") or {}).get("annotations") or {}
    ):
        # Asked already; its controller has not acted yet (or is not running): one object per stop,
        # never one per poll. A stop undone since is the revert guard's (it removes the record).
        return "already-asked"
    if not a.can_stop(fresh):  # changed since the cache saw it (a RayJob's shutdownAfterJobFinishes)
        return "unstoppable"
    return None


async def stop(
    cluster: Any,
    ref: WorkloadRef,
    a: Actuator,
    *,
    is_leader: bool,
    before: Callable[[Mapping[str, Any]], Awaitable[str | None]] | None = None,
) -> StopOutcome:
    """Re-read the object and stop it through its actuator (leader only). `before(fresh)`: None to
    go ahead, else the outcome that replaces the stop (nothing is written)."""
    fresh, why_not = await read_for_write(
        cluster,
        ref,
        is_leader=lambda: is_leader,
        already=lambda o: _not_to_stop(a, o),
    )
    if why_not is not None:
        return StopOutcome(why_not, fresh)
    assert fresh is not None
    meta = fresh.get("metadata") or {}
    held = await before(fresh) if before is not None else None
    if held is not None:
        return StopOutcome(held, fresh)
    patch = a.stop_patch(fresh)
    try:
        written = await cluster.patch_object(
            ref, patch, resource_version=meta.get("resourceVersion"), current=fresh
        )
    except Conflict:
        return StopOutcome("conflict", fresh)  # changed since read: judged again next poll
    except NotFound:
        return StopOutcome("gone")
    except AdmissionDenied as exc:
        return StopOutcome("blocked", fresh, str(exc)[:300])
    record = patch["metadata"]["annotations"][RECLAIMED_FROM_RECORD]
    if a.stop == "create":
        try:
            await cluster.create_object(_plural(a), a.stop_object(fresh))
        except (NotFound, AdmissionDenied) as exc:
            await _drop_record(cluster, ref, written)
            if isinstance(exc, NotFound):
                return StopOutcome("gone", fresh, str(exc)[:300])
            return StopOutcome("blocked", fresh, str(exc)[:300])
    return StopOutcome("stopped", fresh, record=record)


def _plural(a: Actuator) -> str:
    assert a.create is not None
    return a.create.plural


_RECORD_KEYS = (RECLAIMED_FROM_RECORD, keys.RECLAIMED_AT)


async def _drop_record(cluster: Any, ref: WorkloadRef, written: Mapping[str, Any] | None) -> None:
    """Take the record of a stop that was never asked for off again (best effort, precondition: the
    object as the record left it; a 409 leaves it: the next poll sees a record with no stop and
    judges again, the revert guard never saw it stopped)."""
    rv = ((written or {}).get("metadata") or {}).get("resourceVersion")
    try:
        drop = {"metadata": {"annotations": dict.fromkeys(_RECORD_KEYS)}}
        await cluster.patch_object(ref, drop, resource_version=rv, current=written)
    except (Conflict, NotFound, AdmissionDenied) as exc:
        extra = {"workload": str(ref), "error": str(exc)[:200]}
        log.warning("record of a failed stop left in place", extra=extra)


@dataclass(frozen=True)
class RestoredManager:
    ref: WorkloadRef
    what: str  # e.g. "/spec/suspend=false"


class NotReclaimed(Exception):
    pass


async def restore(cluster: Any, ref: WorkloadRef, a: Actuator) -> RestoredManager:
    """Undo `stop` from the record on the object (a resourceVersion precondition: two concurrent
    restores cannot both apply). Also clears the verdict annotations, so the controller judges
    the restarted pods from scratch."""
    obj = await cluster.get(ref)
    meta = obj.get("metadata") or {}
    if RECLAIMED_FROM_RECORD not in (meta.get("annotations") or {}):
        raise NotReclaimed(
            f"{ref.short} in {ref.namespace} has no {RECLAIMED_FROM_RECORD} annotation: not reclaimed"
        )
    try:
        patch = a.restore_patch(obj)
    except ValueError as exc:
        raise NotReclaimed(f"{ref.short} in {ref.namespace}: {exc}") from None
    ann_patch = {**patch["metadata"]["annotations"], keys.VERDICT: None, keys.EVIDENCE: None}
    patch = {**patch, "metadata": {**patch["metadata"], "annotations": ann_patch}}
    rv = meta.get("resourceVersion")
    written = await cluster.patch_object(ref, patch, resource_version=rv, current=obj)
    restored = ", ".join(
        f"{p}={'(removed)' if v is None else json.dumps(v)}"
        for p, v in _flatten(patch).items()
        if "ghostgpu.io" not in p
    )
    if a.stop == "create":
        try:
            created = await cluster.create_object(_plural(a), a.restore_object(obj))
        except (NotFound, AdmissionDenied) as exc:
            # Put the record back: the workload is still stopped and restore can be run again.
            rv = ((written or {}).get("metadata") or {}).get("resourceVersion")
            back = {
                "metadata": {"annotations": {k: (meta.get("annotations") or {}).get(k) for k in _RECORD_KEYS}}
            }
            await cluster.patch_object(ref, back, resource_version=rv, current=written)
            why = f"could not create its restore object, the record is back: {exc}"
            raise NotReclaimed(f"{ref.short} in {ref.namespace}: {why}") from None
        assert a.create is not None
        name = (created.get("metadata") or {}).get("name", "")
        restored = (
            f"created {a.create.kind} {name} ({', '.join(f'{k}: {v}' for k, v in a.create.restore.items())})"
        )
    await cluster.event(obj, reason="Restored", message=f"ghostgpu restore: {ref.target}: {restored}")
    return RestoredManager(ref, restored)


def _flatten(patch: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in patch.items():
        key = f"{prefix}/{k.replace('~', '~0').replace('/', '~1')}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out
