"""The replica ledger: a durable `reclaimed-from-replicas` record where the workload cannot hold it.

Why: once a namespace has a Kueue LocalQueue named `default`, Kueue's Deployment and StatefulSet
webhooks default `kueue.x-k8s.io/queue-name` on every UPDATE and then reject their own change as
immutable while the workload has ready replicas (v0.17 to v0.19, pkg/controller/jobs/{deployment,
statefulset}); so no metadata write to a pre-existing, running workload succeeds, while the
`scale` subresource still does. The annotation stays the primary record
(docs/design.md#labelling-contract); when it is refused, the count goes here first and the
workload is scaled only once the entry is stored.

One ConfigMap (`ghostgpu-replica-ledger`) in the controller's namespace, one key per workload,
`<namespace>.<kind>.<name>` (a namespace cannot contain a dot, so the key is unambiguous), value
`{"replicas": N, "uid": "...", "at": "...Z"}`. Every write is a read-modify-PUT with the
ConfigMap's resourceVersion as precondition, retried on conflict; `take` removes an entry the
same way, so two concurrent restores cannot both get it.

Entries whose workload is gone, or was re-created under a new uid, are useless (restore refuses
them) and would only grow the ConfigMap (read every poll; 1 MiB at most): the controller's leader
removes them (`remove_stale`), each confirmed by a fresh GET first (`LedgerBook.prune`).

`LedgerBook` is the controller's copy of the ledger, read once per poll: the act room writes it (a
reclaim's record, the pruning), the observe and books rooms read it (is this workload stopped, how
many pods' GPUs does its reclaim hold free).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from ghostgpu.actuators import RECLAIMED_FROM_RECORD
from ghostgpu.controller import keys
from ghostgpu.controller.inventory import Workload, WorkloadRef
from ghostgpu.controller.kube import Conflict, NotFound

log = logging.getLogger("ghostgpu.controller")

# Stale entries (workload deleted or re-created) are looked for this often, and at most this many
# are confirmed by a GET per round: a bounded, rare cost next to a poll.
LEDGER_PRUNE_INTERVAL_S = 600.0
LEDGER_PRUNE_BATCH = 50

LEDGER_NAME = "ghostgpu-replica-ledger"
MAX_KEY = 253  # ConfigMap keys: [-._a-zA-Z0-9], at most 253 characters
ATTEMPTS = 5


class LedgerStore(Protocol):
    """The ConfigMap calls the ledger needs (kube.Cluster implements them)."""

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create_configmap(
        self, namespace: str, name: str, data: Mapping[str, str], *, labels: Mapping[str, str] | None = None
    ) -> dict[str, Any]: ...

    async def replace_configmap(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...


class LedgerError(Exception):
    """The ledger could not be written (conflicts kept winning, or the apiserver refused)."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    replicas: int
    uid: str
    at: str

    def to_json(self) -> str:
        return json.dumps({"replicas": self.replicas, "uid": self.uid, "at": self.at}, sort_keys=True)

    @classmethod
    def parse(cls, raw: str) -> LedgerEntry | None:
        """None for anything that is not a well-formed entry (never guess a replica count)."""
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        replicas, uid, at = data.get("replicas"), data.get("uid"), data.get("at", "")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            return None
        if not isinstance(uid, str) or not isinstance(at, str):
            return None
        return cls(replicas, uid, at)


def ledger_key(ref: WorkloadRef) -> str:
    key = f"{ref.namespace}.{ref.kind.lower()}.{ref.name}"
    if len(key) <= MAX_KEY:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{key[: MAX_KEY - 17]}.{digest}"


_KINDS = {"deployment": "Deployment", "statefulset": "StatefulSet"}


def ref_of_key(key: str) -> WorkloadRef | None:
    """The workload a key was written for, or None when that cannot be known for sure: a key of
    MAX_KEY characters may have been shortened with a digest, and its name is then cut."""
    ns, _, rest = key.partition(".")
    kind, _, name = rest.partition(".")
    if len(key) >= MAX_KEY or not ns or not name or kind not in _KINDS:
        return None
    return WorkloadRef(_KINDS[kind], ns, name)


def parse_entries(data: Mapping[str, str]) -> dict[str, LedgerEntry]:
    out: dict[str, LedgerEntry] = {}
    for key, raw in data.items():
        entry = LedgerEntry.parse(raw)
        if entry is not None:
            out[key] = entry
    return out


class ReplicaLedger:
    def __init__(self, store: LedgerStore, namespace: str, name: str = LEDGER_NAME) -> None:
        self.store = store
        self.namespace = namespace
        self.name = name

    async def entries(self) -> dict[str, LedgerEntry]:
        """Every well-formed entry by key (empty when the ConfigMap does not exist yet)."""
        cm = await self.store.get_configmap(self.namespace, self.name)
        return parse_entries((cm or {}).get("data") or {})

    async def get(self, ref: WorkloadRef) -> LedgerEntry | None:
        return (await self.entries()).get(ledger_key(ref))

    async def record(self, ref: WorkloadRef, entry: LedgerEntry) -> None:
        """Store the entry durably (returns only once the apiserver has it), or raise LedgerError."""
        key = ledger_key(ref)
        for _ in range(ATTEMPTS):
            cm = await self.store.get_configmap(self.namespace, self.name)
            try:
                if cm is None:
                    await self.store.create_configmap(
                        self.namespace,
                        self.name,
                        {key: entry.to_json()},
                        labels={"app.kubernetes.io/name": "ghostgpu-controller"},
                    )
                else:
                    cm["data"] = {**(cm.get("data") or {}), key: entry.to_json()}
                    await self.store.replace_configmap(cm)
                return
            except Conflict:
                continue  # someone else wrote the ledger since we read it: read again
        raise LedgerError(f"{self.namespace}/{self.name}: still conflicting after {ATTEMPTS} attempts")

    async def take(self, ref: WorkloadRef) -> LedgerEntry | None:
        """Remove the entry and return it (None if there is none). Two concurrent callers cannot
        both get it: the removal carries the ConfigMap's resourceVersion."""
        key = ledger_key(ref)
        for _ in range(ATTEMPTS):
            cm = await self.store.get_configmap(self.namespace, self.name)
            data = dict((cm or {}).get("data") or {})
            entry = LedgerEntry.parse(data.pop(key, ""))
            if cm is None or entry is None:
                return None  # nothing (well-formed) to take: a malformed entry is left for a person
            cm["data"] = data
            try:
                await self.store.replace_configmap(cm)
            except Conflict:
                continue
            return entry
        raise LedgerError(f"{self.namespace}/{self.name}: still conflicting after {ATTEMPTS} attempts")

    async def remove_stale(self, stale: Mapping[str, str]) -> int:
        """Remove the entries named in `stale` (key -> the uid it was judged stale for) that still
        hold that uid, in one write with the ConfigMap's resourceVersion as precondition: an entry
        rewritten meanwhile (a new reclaim of a re-created workload) is kept. Returns how many went."""
        for _ in range(ATTEMPTS):
            cm = await self.store.get_configmap(self.namespace, self.name)
            if cm is None:
                return 0
            data = dict(cm.get("data") or {})
            gone = [
                key
                for key, uid in stale.items()
                if (entry := LedgerEntry.parse(data.get(key, ""))) is not None and entry.uid == uid
            ]
            if not gone:
                return 0
            for key in gone:
                del data[key]
            cm["data"] = data
            try:
                await self.store.replace_configmap(cm)
            except Conflict:
                continue
            return len(gone)
        raise LedgerError(f"{self.namespace}/{self.name}: still conflicting after {ATTEMPTS} attempts")


class LedgerBook:
    """The replica ledger as this process last read it (empty without a ledger)."""

    def __init__(self, ledger: ReplicaLedger | None) -> None:
        self.ledger = ledger
        self.entries: dict[str, LedgerEntry] = {}
        self.pruned_at: float | None = None

    async def load(self) -> None:
        """One read of the replica ledger per poll (a failure keeps the previous copy)."""
        if self.ledger is None:
            return
        try:
            self.entries = await self.ledger.entries()
        except Exception as exc:
            log.warning("cannot read the replica ledger", extra={"error": f"{type(exc).__name__}: {exc}"})

    def reclaimed_from(self, wl: Workload) -> int | None:
        """`reclaimed-from-replicas` from the workload's annotation, else from the ledger (an entry
        counts only for the object it was written for: same uid)."""
        if wl.reclaimed_from is not None:
            return wl.reclaimed_from
        entry = self.entries.get(ledger_key(wl.ref)) if self.entries else None
        return entry.replicas if entry is not None and entry.uid == wl.uid else None

    def marked(self, workloads: Mapping[WorkloadRef, Workload]) -> Iterator[tuple[WorkloadRef, Workload]]:
        """The workloads a reclaim has marked: a reclaimed-from annotation or record, or a ledger
        entry. Only they can hold GPUs free or be undone; the rest of a large fleet is passed over
        with two lookups each, every poll."""
        in_ledger = {ref_of_key(k) for k in self.entries}
        everyone = None in in_ledger  # a shortened key names no workload for sure: all of them
        for ref, wl in workloads.items():
            ann = wl.annotations
            if everyone or keys.RECLAIMED_FROM in ann or RECLAIMED_FROM_RECORD in ann or ref in in_ledger:
                yield ref, wl

    async def record(self, ref: WorkloadRef, fresh: Mapping[str, Any], replicas: int) -> str | None:
        """Store the replica count in the ledger; None once it is durably stored, else why not."""
        if self.ledger is None:
            return "no replica ledger configured"
        uid = str((fresh.get("metadata") or {}).get("uid", ""))
        try:
            await self.ledger.record(
                ref, LedgerEntry(replicas, uid, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            )
        except Exception as exc:
            log.warning(
                "cannot write the replica ledger", extra={"workload": str(ref), "error": str(exc)[:300]}
            )
            return f"{type(exc).__name__}: {str(exc)[:200]}"
        return None

    async def prune(self, cluster: Any, workloads: Mapping[WorkloadRef, Workload], now: float) -> int:
        """Remove ledger entries whose workload is gone or was re-created (another uid): restore
        refuses those, and they would only grow the ConfigMap read every poll. Leader only, every
        LEDGER_PRUNE_INTERVAL_S. An entry whose workload the cache shows with the same uid is kept
        without a request; any other is removed only after a fresh GET answers 404 or another uid.
        Any doubt (an error, an untracked but existing workload, a key that cannot be read back to
        a workload) keeps the entry: a lost replica count cannot be recovered."""
        if self.ledger is None or not self.entries:
            return 0
        if self.pruned_at is not None and now - self.pruned_at < LEDGER_PRUNE_INTERVAL_S:
            return 0
        self.pruned_at = now
        stale: dict[str, str] = {}
        checked = 0
        for key, entry in sorted(self.entries.items()):
            ref = ref_of_key(key)
            wl = workloads.get(ref) if ref is not None else None
            if ref is None or (wl is not None and wl.uid == entry.uid):
                continue
            if checked == LEDGER_PRUNE_BATCH:
                break  # the rest next round
            checked += 1
            try:
                uid = str(((await cluster.get(ref)).get("metadata") or {}).get("uid", ""))
            except NotFound:
                stale[key] = entry.uid
                continue
            except Exception as exc:
                log.warning(
                    "cannot check a ledger entry", extra={"workload": str(ref), "error": str(exc)[:300]}
                )
                continue
            if entry.uid and uid != entry.uid:
                stale[key] = entry.uid
        if not stale:
            return 0
        try:
            removed = await self.ledger.remove_stale(stale)
        except Exception as exc:
            log.warning("cannot prune the replica ledger", extra={"error": f"{type(exc).__name__}: {exc}"})
            return 0
        for key in stale:
            self.entries.pop(key, None)
        log.info("pruned the replica ledger", extra={"removed": removed, "entries": sorted(stale)})
        return removed


__all__ = [
    "LEDGER_NAME",
    "LEDGER_PRUNE_INTERVAL_S",
    "LedgerBook",
    "LedgerEntry",
    "LedgerError",
    "LedgerStore",
    "ReplicaLedger",
    "ledger_key",
    "ref_of_key",
]
