"""Revert guard: a reclaim undone by anyone but `ghostgpu restore` is recorded once and not repeated.

A revert is a workload whose reclaimed-from record is still there (restore clears it before it
restarts anything) while the stop no longer holds (`is_stopped` is false) and the field the stop
wrote was last written, after the record, by someone else: Argo CD's self-heal, Flux, a person
with kubectl. Who it was comes from `metadata.managedFields` (the manager whose entry owns the
written field, newest first).

Recorded once, durably, on the object: one merge patch with a resourceVersion precondition removes
the record and adds the mark `ghostgpu.io/reclaim-reverted` (JSON: who, when, the record, and a
hash of the spec without the written fields); only after that patch lands come the
`ReclaimReverted` Event and `ghostgpu_reclaim_reverts_total`. The next poll sees no record, so
never a second Event; a 409 leaves everything for the next poll. While the mark's hash equals the
object's, the workload is not reclaimed again (`held`): a new image or command changes the spec,
and a person can delete the annotation. The stop's own fields are left out of the hash, so the
revert itself (replicas back to N) does not count as a change. Never a flip-flop.

Not a revert:
- the record's stop never landed (the leader died between writing the record and scaling): the
  field's newest writer wrote it before the record (`reclaimed-at`), and this process never saw the
  workload stopped; the next poll reclaims it normally;
- `ghostgpu restore`'s own scale (field manager `ghostgpu-restore`), for the case where restore had
  to leave the record in place (Kueue's webhook would add queue-name).

When the object refuses the mark (an admission webhook: the same workloads whose record lives in
the replica ledger) the mark is kept in memory only: recorded once per controller process.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ghostgpu.actuators import RECLAIMED_FROM_RECORD
from ghostgpu.controller import keys
from ghostgpu.controller.act.stopspec import StopSpec
from ghostgpu.controller.inventory import Workload, WorkloadRef, parse_time
from ghostgpu.controller.kube import AdmissionDenied, Conflict, NotFound
from ghostgpu.controller.ledger import LedgerBook, ledger_key

log = logging.getLogger("ghostgpu.controller.revert_guard")

MARK = "ghostgpu.io/reclaim-reverted"
CONTROLLER_MANAGER = keys.COMPONENT  # the field manager of the controller's writes (kube.Cluster)
RESTORE_MANAGER = "ghostgpu-restore"  # the field manager of `ghostgpu restore`
SEEN_GRACE_SECONDS = 120.0


# --- pure parts -----------------------------------------------------------------------------------


def _pointer_tokens(pointer: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")] if pointer else []


def _owns(fields: Mapping[str, Any], pointer: str) -> bool:
    """managedFields' fieldsV1 names an object field `f:<name>` at each level."""
    node: Any = fields
    for token in _pointer_tokens(pointer):
        if not isinstance(node, Mapping) or f"f:{token}" not in node:
            return False
        node = node[f"f:{token}"]
    return True


@dataclass(frozen=True, slots=True)
class FieldWriter:
    manager: str
    time: datetime | None
    operation: str
    subresource: str


def field_writer(obj: Mapping[str, Any], writes: Sequence[str]) -> FieldWriter | None:
    """The newest managedFields entry that owns any of the written fields (None: no entry does,
    e.g. managedFields were stripped). Ties on time go to the manager name, so it is deterministic."""
    owners = []
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        fields = entry.get("fieldsV1") or {}
        if any(_owns(fields, w) for w in writes):
            owners.append(
                FieldWriter(
                    manager=str(entry.get("manager") or "unknown"),
                    time=parse_time(entry.get("time")),
                    operation=str(entry.get("operation") or ""),
                    subresource=str(entry.get("subresource") or ""),
                )
            )
    if not owners:
        return None
    epoch = datetime.min.replace(tzinfo=UTC)
    return max(owners, key=lambda w: (w.time or epoch, w.manager))


def _remove(doc: Any, tokens: list[str]) -> None:
    for t in tokens[:-1]:
        if not isinstance(doc, dict) or t not in doc:
            return
        doc = doc[t]
    if isinstance(doc, dict) and tokens:
        doc.pop(tokens[-1], None)


def spec_hash(obj: Mapping[str, Any], writes: Sequence[str]) -> str:
    """Hash of `spec` without the fields the stop writes: what a person changes to have the
    workload judged again (a new image, command, resources), never the revert itself."""
    spec = copy.deepcopy(dict(obj.get("spec") or {}))
    for w in writes:
        tokens = _pointer_tokens(w)
        if tokens[:1] == ["spec"]:
            _remove(spec, tokens[1:])
    canon = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Mark:
    by: str
    at: str
    spec_hash: str
    record: str

    def value(self) -> str:
        return json.dumps(
            {"by": self.by, "at": self.at, "specHash": self.spec_hash, "record": self.record},
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, raw: str) -> Mark | None:
        try:
            d = json.loads(raw)
            return cls(str(d["by"]), str(d.get("at", "")), str(d["specHash"]), str(d.get("record", "")))
        except (ValueError, KeyError, TypeError):
            return None


def mark_holds(obj: Mapping[str, Any], writes: Sequence[str]) -> Mark | None:
    """The mark that keeps this object from being reclaimed, if any: present and its spec unchanged.
    A mark that cannot be read holds too (a person clears it; a guess could fight a manager)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(MARK)
    if raw is None:
        return None
    mark = Mark.parse(raw)
    if mark is None:
        return Mark(by="unknown (unreadable mark)", at="", spec_hash="", record="")
    return mark if mark.spec_hash == spec_hash(obj, writes) else None


@dataclass(frozen=True, slots=True)
class Revert:
    writer: str
    written_at: datetime | None
    record: str


def detect_revert(
    obj: Mapping[str, Any],
    stop: StopSpec,
    *,
    record: str,
    recorded_at: datetime | None,
    seen_stopped: bool,
    restore_manager: str = RESTORE_MANAGER,
) -> Revert | None:
    """A revert of the stop that `record` (the reclaimed-from record, written at `recorded_at`)
    stands for, or None. `seen_stopped`: this process saw the object stopped under this record."""
    if stop.is_stopped(obj):
        return None
    writer = field_writer(obj, stop.writes)
    if writer is not None and writer.manager == restore_manager:
        return None  # restore's own undo (it had to leave the record in place)
    landed = seen_stopped or (
        writer is not None
        and writer.time is not None
        and recorded_at is not None
        and writer.time > recorded_at
    )
    if not landed:
        return None  # the stop never landed: reclaim again, it is not someone undoing it
    return Revert(writer.manager if writer else "unknown", writer.time if writer else None, record)


# --- the guard (I/O through kube.Cluster) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """A workload the watch cache shows with a reclaimed-from record."""

    ref: WorkloadRef
    uid: str
    record: str
    recorded_at: datetime | None
    stopped: bool  # is_stopped on the cached copy
    stop: StopSpec
    # The annotations that make up the record, removed together with the mark being added.
    record_keys: tuple[str, ...] = (keys.RECLAIMED_FROM, keys.RECLAIMED_AT)


def revert_candidates(
    marked: Iterable[tuple[WorkloadRef, Workload]],
    opted_in: set[str],
    records: LedgerBook,
    stop_spec: Callable[[Workload], StopSpec | None],
) -> list[Candidate]:
    """The reclaimed workloads (a record on them or in the ledger) of opted-in namespaces, each
    with its record, when it was written and whether the stop holds in the cache."""
    candidates = []
    for ref, wl in marked:  # only these can be undone
        record = records.reclaimed_from(wl) if ref.namespace in opted_in else None
        if record is None and ref.namespace in opted_in and RECLAIMED_FROM_RECORD in wl.annotations:
            # A manager's annotation or field stop: its record is the previous values (stops.py).
            stop = stop_spec(wl)
            if stop is not None:
                candidates.append(
                    Candidate(
                        ref, wl.uid, wl.annotations[RECLAIMED_FROM_RECORD],
                        parse_time(wl.annotations.get(keys.RECLAIMED_AT)), stop.is_stopped(wl.raw),
                        stop, record_keys=(RECLAIMED_FROM_RECORD, keys.RECLAIMED_AT),
                    )
                )  # fmt: skip
            continue
        stop = stop_spec(wl) if record is not None else None
        if record is None or stop is None:
            continue
        at = wl.annotations.get(keys.RECLAIMED_AT)
        if at is None and wl.reclaimed_from is None:
            entry = records.entries.get(ledger_key(ref))
            at = entry.at if entry is not None else None
        candidates.append(Candidate(ref, wl.uid, str(record), parse_time(at), stop.is_stopped(wl.raw), stop))
    return candidates


class RevertGuard:
    def __init__(self, cluster: Any, metrics: Any, *, restore_manager: str = RESTORE_MANAGER) -> None:
        self.cluster = cluster
        self.metrics = metrics
        self.restore_manager = restore_manager
        # (uid, record) -> when this process saw the object stopped under that record (monotonic).
        self.seen_stopped: dict[tuple[str, str], float] = {}
        self.unwritable: dict[str, Mark] = {}  # uid -> mark kept in memory (the object refused it)

    def saw_stopped(self, uid: str, record: str) -> None:
        self.seen_stopped.setdefault((uid, record), time.monotonic())

    def forget(self, uid: str) -> None:
        """A new stop of `uid` is about to be recorded: what this process saw under an earlier
        record (often the same value: a restored workload reclaimed again) says nothing about the
        new one, whose stop may yet fail and must then not read as undone."""
        for key in [k for k in self.seen_stopped if k[0] == uid]:
            del self.seen_stopped[key]

    def held(self, obj: Mapping[str, Any], writes: Sequence[str]) -> Mark | None:
        mark = mark_holds(obj, writes)
        if mark is not None:
            return mark
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        kept = self.unwritable.get(uid)
        return kept if kept is not None and kept.spec_hash == spec_hash(obj, writes) else None

    async def sweep(self, candidates: Sequence[Candidate]) -> list[tuple[WorkloadRef, Revert]]:
        """Leader only, once a poll: record every revert among the candidates (each once)."""
        # Records that are gone (restored, re-created) are forgotten, once the watch cache has had
        # time to show a record this process just wrote.
        live = {(c.uid, c.record) for c in candidates}
        now = time.monotonic()
        for key, at in list(self.seen_stopped.items()):
            if key not in live and now - at > SEEN_GRACE_SECONDS:
                del self.seen_stopped[key]
        found: list[tuple[WorkloadRef, Revert]] = []
        for c in candidates:
            if c.stopped:
                self.saw_stopped(c.uid, c.record)
                continue
            if c.uid in self.unwritable:
                continue
            try:
                fresh = await self.cluster.get(c.ref)
            except NotFound:
                continue
            meta = fresh.get("metadata") or {}
            if str(meta.get("uid", "")) != c.uid:
                continue
            revert = detect_revert(
                fresh,
                c.stop,
                record=c.record,
                recorded_at=c.recorded_at,
                seen_stopped=(c.uid, c.record) in self.seen_stopped,
                restore_manager=self.restore_manager,
            )
            if revert is not None and await self._record(c, fresh, revert):
                found.append((c.ref, revert))
        return found

    async def _record(self, c: Candidate, fresh: Mapping[str, Any], revert: Revert) -> bool:
        meta = fresh.get("metadata") or {}
        mark = Mark(
            by=revert.writer,
            at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            spec_hash=spec_hash(fresh, c.stop.writes),
            record=c.record,
        )
        where = "on the workload"
        try:
            await self.cluster.patch_annotations(
                c.ref,
                {**dict.fromkeys(c.record_keys), MARK: mark.value()},
                resource_version=meta.get("resourceVersion"),
                current=fresh,
            )
        except (Conflict, NotFound):
            return False  # changed or gone since the read: the next poll looks again
        except AdmissionDenied as exc:
            self.unwritable[c.uid] = mark
            where = "in this controller's memory only (the workload refuses the mark)"
            log.warning("revert mark not writable", extra={"workload": str(c.ref), "error": str(exc)[:300]})
        self.seen_stopped.pop((c.uid, c.record), None)
        self.metrics.reclaim_reverts.labels(c.ref.namespace, revert.writer).inc()
        when = revert.written_at.strftime("%Y-%m-%dT%H:%M:%SZ") if revert.written_at else "an unknown time"
        await self.cluster.event(
            fresh,
            reason="ReclaimReverted",
            message=f"the reclaim of {c.ref.short} was undone by {revert.writer} (it wrote "
            f"{', '.join(c.stop.writes)} at {when}; the record was {keys.RECLAIMED_FROM}={c.record}). "
            f"Not reclaiming it again until its spec changes or someone removes the annotation {MARK} "
            f"(marked {where}). If a GitOps tool did this, make it ignore {', '.join(c.stop.writes)}.",
            type_="Warning",
        )
        log.warning(
            "reclaim reverted",
            extra={"workload": str(c.ref), "writer": revert.writer, "record": c.record},
        )
        return True
