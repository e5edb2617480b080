"""Leader election against an in-memory Lease API with real optimistic concurrency (409 on a stale
resourceVersion), and a fake clock: one leader at a time, takeover within 2 lease durations, a
leader that cannot renew steps down before anyone may take over."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from kr8s._exceptions import ServerError

from ghostgpu.controller.leader import LeaderElector, LeaseRecord, should_try


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class LeaseApi:
    """Just enough of the apiserver for one Lease: GET, POST (create), PUT (update with RV check)."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.rv = 0
        self.down = False

    def _error(self, code: int) -> ServerError:
        resp = httpx.Response(code, request=httpx.Request("PUT", "http://x"))
        return ServerError(f"HTTP {code}", status=str(code), response=resp)

    @contextlib.asynccontextmanager
    async def call_api(self, method: str, **kw: Any) -> AsyncIterator[httpx.Response]:
        if self.down:
            raise OSError("apiserver unreachable")
        if method == "GET":
            if self.obj is None:
                raise self._error(404)
            yield httpx.Response(200, json=self.obj)
            return
        body = json.loads(kw["content"])
        if method == "POST" and self.obj is not None:
            raise self._error(409)
        if method == "PUT" and body["metadata"].get("resourceVersion") != str(self.rv):
            raise self._error(409)
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.obj = body
        yield httpx.Response(200, json=body)


def elector(api: LeaseApi, clock: Clock, name: str) -> LeaderElector:
    return LeaderElector(
        api, namespace="ghostgpu-system", name="lease", identity=name,
        lease_duration=15, renew_deadline=10, retry_period=2, clock=clock,
    )  # fmt: skip


async def test_one_leader_then_takeover_within_two_durations() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    assert await a.try_acquire_or_renew() is True
    assert await b.try_acquire_or_renew() is False
    assert a.is_leader() and not b.is_leader()
    # a keeps renewing: b never takes over
    for _ in range(20):
        clock.t += 2
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
    # a dies; b takes over once it has seen no change for a lease duration
    died = clock.t
    while not await b.try_acquire_or_renew():
        clock.t += 2
        assert clock.t - died < 2 * 15
    assert b.is_leader() and clock.t - died >= 15
    assert api.obj is not None and api.obj["spec"]["holderIdentity"] == "b"
    assert api.obj["spec"]["leaseTransitions"] == 1
    # a comes back: it must not steal the lease, and it knows it is no longer leader
    clock.t += 1
    assert not await a.try_acquire_or_renew()
    assert not a.is_leader()


async def test_leader_that_cannot_renew_steps_down_before_takeover() -> None:
    api, clock = LeaseApi(), Clock()
    a = elector(api, clock, "a")
    assert await a.try_acquire_or_renew()
    api.down = True
    clock.t += 9.9
    assert a.is_leader()
    clock.t += 0.2  # past the renew deadline (10s) but before the lease duration (15s)
    assert not a.is_leader()


async def test_concurrent_writers_cannot_both_win() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    # both read "no lease" and both try to create it: exactly one wins
    results = [await a.try_acquire_or_renew(), await b.try_acquire_or_renew()]
    assert results.count(True) == 1


async def test_release_lets_the_other_take_over_at_once() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    assert await a.try_acquire_or_renew()
    await a.release()
    assert await b.try_acquire_or_renew()


def test_should_try_is_pure() -> None:
    rec = LeaseRecord(holder="x", duration=15, transitions=0, renew_time=None, resource_version="1")
    assert should_try(None, "me", 0, 0, 15)
    assert should_try(rec, "x", 0, 1, 15)
    assert not should_try(rec, "me", 0, 14.9, 15)
    assert should_try(rec, "me", 0, 15, 15)
