"""Leader election on a coordination.k8s.io/v1 Lease (client-go's algorithm, simplified).

- Every replica tries to acquire/renew every `retry_period`. Writes are PUTs carrying the read
  resourceVersion, so two replicas can never both win the same round (the loser gets 409).
- A foreign lease counts as expired when its record has not changed for `lease_duration` as
  observed on OUR clock (not the holder's renewTime: no trust in clock sync between nodes).
  Takeover therefore happens within lease_duration + retry_period < 2 x lease_duration.
- A leader that cannot renew for `renew_deadline` (< lease_duration) stops acting at once, before
  anyone else may take over: `is_leader()` is checked right before every write.
- The holder writes where it serves its HTTP port into the Lease (annotation
  ghostgpu.io/leader-address), so a follower can answer /decisions from the leader's log
  (`leader_address()`): only the leader writes that log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kr8s._exceptions import ServerError

from ghostgpu.controller.keys import LEADER_ADDRESS
from ghostgpu.controller.kube import LEASES, status_of

log = logging.getLogger("ghostgpu.controller.leader")


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None
    duration: int
    transitions: int
    renew_time: str | None
    resource_version: str | None
    address: str | None = None  # where the holder serves /decisions (HOST:PORT)


def record_of(obj: dict[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") or {}
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return LeaseRecord(
        address=annotations.get(LEADER_ADDRESS) or None,
        holder=spec.get("holderIdentity"),
        duration=int(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
        renew_time=spec.get("renewTime"),
        resource_version=(obj.get("metadata") or {}).get("resourceVersion"),
    )


def should_try(
    record: LeaseRecord | None, me: str, observed_change_at: float, now: float, lease_duration: float
) -> bool:
    """Pure core of the election: may `me` write the lease now?"""
    if record is None or not record.holder:
        return True
    if record.holder == me:
        return True
    return now - observed_change_at >= (record.duration or lease_duration)


class LeaderElector:
    def __init__(
        self,
        api: Any,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
        address: str | None = None,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.on_change = on_change
        self.address = address
        self._observed: LeaseRecord | None = None
        self._observed_at = clock()
        self._renewed_at: float | None = None
        self._leading = False

    def is_leader(self) -> bool:
        """True only while our last successful renew is fresher than the renew deadline."""
        ok = (
            self._leading
            and self._renewed_at is not None
            and (self.clock() - self._renewed_at < self.renew_deadline)
        )
        if self._leading and not ok:
            self._set_leading(False)
        return ok

    def _set_leading(self, value: bool) -> None:
        if value != self._leading:
            self._leading = value
            log.info("leadership changed", extra={"leader": value, "identity": self.identity})
            if self.on_change:
                self.on_change(value)

    async def _get(self) -> dict[str, Any] | None:
        try:
            async with self.api.call_api(
                "GET", version=LEASES.version, namespace=self.namespace, url=f"leases/{self.name}"
            ) as resp:
                return dict(resp.json())
        except ServerError as exc:
            if status_of(exc) == 404:
                return None
            raise

    def _body(self, current: dict[str, Any] | None, transitions: int, acquire: bool) -> dict[str, Any]:
        now = _micro_time()
        spec: dict[str, Any] = dict((current or {}).get("spec") or {})
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self.lease_duration),
            renewTime=now,
            leaseTransitions=transitions,
        )
        if acquire:
            spec["acquireTime"] = now
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        annotations = dict(((current or {}).get("metadata") or {}).get("annotations") or {})
        annotations.pop(LEADER_ADDRESS, None)
        if self.address:
            annotations[LEADER_ADDRESS] = self.address
        if annotations:
            meta["annotations"] = annotations
        if current:
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {"apiVersion": LEASES.version, "kind": "Lease", "metadata": meta, "spec": spec}

    def leader_address(self) -> str | None:
        """Where another replica that holds the Lease serves /decisions, as last read from the
        Lease; None while this replica leads, nobody holds it, the holder gave no address, or the
        record has not changed for a lease duration (the holder is presumed gone)."""
        record = self._observed
        if record is None or not record.holder or record.holder == self.identity:
            return None
        if self.clock() - self._observed_at >= (record.duration or self.lease_duration):
            return None
        return record.address

    @property
    def holder(self) -> str | None:
        """The holder identity last read from the Lease."""
        return self._observed.holder if self._observed else None

    async def try_acquire_or_renew(self) -> bool:
        current = await self._get()
        record = record_of(current) if current else None
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        if not should_try(record, self.identity, self._observed_at, now, self.lease_duration):
            self._set_leading(False)
            return False
        acquire = record is None or record.holder != self.identity
        transitions = (
            (record.transitions + 1)
            if (record and acquire and record.holder)
            else (record.transitions if record else 0)
        )
        body = self._body(current, transitions, acquire)
        try:
            if current is None:
                async with self.api.call_api(
                    "POST",
                    version=LEASES.version,
                    namespace=self.namespace,
                    url="leases",
                    content=json.dumps(body),
                ):
                    pass
            else:
                async with self.api.call_api(
                    "PUT",
                    version=LEASES.version,
                    namespace=self.namespace,
                    url=f"leases/{self.name}",
                    content=json.dumps(body),
                ):
                    pass
        except ServerError as exc:
            if status_of(exc) in (409, 422):  # someone else wrote first (or created it first)
                self._set_leading(False)
                return False
            raise
        self._renewed_at = self.clock()
        self._set_leading(True)
        return True

    async def run(self) -> None:
        while True:
            try:
                await self.try_acquire_or_renew()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # apiserver unreachable: we cannot prove leadership
                log.warning("lease renew failed", extra={"error": f"{type(exc).__name__}: {exc}"})
                self.is_leader()  # steps down once the renew deadline passes
            await asyncio.sleep(self.retry_period)

    async def release(self) -> None:
        """Give the lease up on clean shutdown so the other replica need not wait it out."""
        if not self._leading:
            return
        self._set_leading(False)
        try:
            current = await self._get()
            if current and record_of(current).holder == self.identity:
                body = self._body(current, record_of(current).transitions, acquire=False)
                body["spec"]["holderIdentity"] = None
                async with self.api.call_api(
                    "PUT",
                    version=LEASES.version,
                    namespace=self.namespace,
                    url=f"leases/{self.name}",
                    content=json.dumps(body),
                ):
                    pass
        except Exception as exc:
            log.warning("lease release failed", extra={"error": str(exc)})
