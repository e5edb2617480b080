"""GET /decisions gives the leader's decision log on every replica: two real controller HTTP
servers on 127.0.0.1, two real leader electors on one in-memory Lease (409 on a stale
resourceVersion) and a fake clock. Only the leader writes the log; `ghostgpu report` pointed at
either replica reads the leader's history, and follows it when the Lease changes hands."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from kr8s._exceptions import ServerError
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.controller.books.decisions import DecisionLog
from ghostgpu.controller.books.leader_decisions import LeaderDecisions
from ghostgpu.controller.keys import LEADER_ADDRESS
from ghostgpu.controller.leader import LeaderElector
from ghostgpu.controller.replica import advertised_address
from ghostgpu.controller.server import HealthServer


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class LeaseApi:
    """One Lease: GET, POST (create), PUT (update with a resourceVersion check)."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.rv = 0

    @contextlib.asynccontextmanager
    async def call_api(self, method: str, **kw: Any) -> AsyncIterator[httpx.Response]:
        if method == "GET":
            if self.obj is None:
                resp = httpx.Response(404, request=httpx.Request("GET", "http://x"))
                raise ServerError("HTTP 404", status="404", response=resp)
            yield httpx.Response(200, json=self.obj)
            return
        body = json.loads(kw["content"])
        if self.obj is not None and body["metadata"].get("resourceVersion") != str(self.rv):
            resp = httpx.Response(409, request=httpx.Request("PUT", "http://x"))
            raise ServerError("HTTP 409", status="409", response=resp)
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.obj = body
        yield httpx.Response(200, json=body)


@dataclass
class Replica:
    name: str
    elector: LeaderElector
    log: DecisionLog
    server: HealthServer

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/decisions"


async def replica(name: str, api: LeaseApi, clock: Clock, tmp: Path) -> Replica:
    elector = LeaderElector(
        api, namespace="ghostgpu-system", name="lease", identity=name,
        lease_duration=15, renew_deadline=10, retry_period=2, clock=clock,
    )  # fmt: skip
    log = DecisionLog(tmp / f"{name}.jsonl")
    answer = LeaderDecisions(
        read_own=log.read_bytes,
        is_leader=elector.is_leader,
        leader_address=elector.leader_address,
        holder=lambda: elector.holder,
        identity=name,
        timeout_s=5,
    )
    ok = lambda: (True, "ok")  # noqa: E731
    server = HealthServer(
        CollectorRegistry(), healthy=ok, ready=ok, decisions_answer=answer, host="127.0.0.1", port=0
    )
    elector.address = advertised_address("127.0.0.1", await server.start(), environ={})
    return Replica(name, elector, log, server)


def record(log: DecisionLog, poll: int, workload: str, verdict: str) -> None:
    log.record_poll(
        ts=1000.0 + 60 * poll, poll=poll, mode="shadow", interval_s=60.0,
        rows=[(workload, verdict, ("utilization-zero",), 2.0, "would-reclaim")],
    )  # fmt: skip


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(url)


async def test_every_replica_answers_with_the_leaders_log(tmp_path: Path) -> None:
    api, clock = LeaseApi(), Clock()
    a, b = await replica("a", api, clock, tmp_path), await replica("b", api, clock, tmp_path)
    try:
        assert await a.elector.try_acquire_or_renew()
        assert not await b.elector.try_acquire_or_renew()
        assert api.obj is not None
        assert api.obj["metadata"]["annotations"][LEADER_ADDRESS] == f"127.0.0.1:{a.server.port}"
        record(a.log, 1, "Deployment/ns/ghost", "FINISHED_IDLE")
        record(b.log, 7, "Deployment/ns/stale", "ACTIVE")  # b's own file: never what is served
        leader_log = a.log.read_bytes()
        for r in (a, b):
            got = await get(r.url)
            assert (got.status_code, got.content) == (200, leader_log), r.name
        local = await get(b.url + "?local=1")
        assert local.status_code == 503 and "b is not the leader (the Lease names a)" in local.text

        # `ghostgpu report` through the follower: the leader's history, a base URL is enough.
        out = await asyncio.to_thread(
            CliRunner().invoke, app, ["report", f"http://127.0.0.1:{b.server.port}", "--json"]
        )
        assert out.exit_code == 0, out.output
        assert json.loads(out.output)["wouldReclaim"] == ["Deployment/ns/ghost"]

        # a stops renewing; b takes over within two lease durations and now its log is the one.
        while not await b.elector.try_acquire_or_renew():
            clock.t += 2
        assert not await a.elector.try_acquire_or_renew() and not a.elector.is_leader()
        record(b.log, 8, "Deployment/ns/after", "ZOMBIE_CRASHED")
        for r in (a, b):
            got = await get(r.url)
            assert (got.status_code, got.content) == (200, b.log.read_bytes()), r.name
    finally:
        await a.server.stop()
        await b.server.stop()


async def test_no_leader_to_ask_is_a_503_that_report_names(tmp_path: Path) -> None:
    api, clock = LeaseApi(), Clock()
    a, b = await replica("a", api, clock, tmp_path), await replica("b", api, clock, tmp_path)
    try:
        assert await a.elector.try_acquire_or_renew()
        assert not await b.elector.try_acquire_or_renew()
        await a.server.stop()  # the leader's port is gone; its Lease record is still fresh
        down = await get(b.url)
        assert down.status_code == 503 and "b cannot fetch the leader's log from" in down.text
        clock.t += 15  # no change for a lease duration: the holder is presumed gone
        assert b.elector.leader_address() is None
        gone = await get(b.url)
        assert (
            gone.status_code == 503
            and "the Lease names no live leader with an address (holder: a)" in gone.text
        )
        out = await asyncio.to_thread(CliRunner().invoke, app, ["report", b.url])
        assert out.exit_code == 2 and "Traceback" not in out.output
        lines = out.output.strip().splitlines()
        assert lines[0].startswith(f"error: {b.url} answered 503: b is not the leader")
        assert lines[1].startswith("fix: ")
    finally:
        await b.server.stop()


async def test_two_replicas_that_each_take_the_other_for_the_leader_do_not_loop(tmp_path: Path) -> None:
    """While a Lease changes hands each replica may name the other: one hop, then 503."""
    servers: dict[str, HealthServer] = {}

    def peer_of(name: str) -> str:
        other = servers["b" if name == "a" else "a"]
        return f"127.0.0.1:{other.port}"

    for name in ("a", "b"):
        answer = LeaderDecisions(
            read_own=lambda: b"never served",
            is_leader=lambda: False,
            leader_address=lambda n=name: peer_of(n),  # type: ignore[misc]
            holder=lambda n=name: "b" if n == "a" else "a",  # type: ignore[misc]
            identity=name,
            timeout_s=5,
        )
        ok = lambda: (True, "ok")  # noqa: E731
        servers[name] = HealthServer(
            CollectorRegistry(), healthy=ok, ready=ok, decisions_answer=answer, port=0
        )
        await servers[name].start()
    try:
        got = await asyncio.wait_for(get(f"http://127.0.0.1:{servers['a'].port}/decisions"), 10)
        assert got.status_code == 503 and "answered 503" in got.text and "b is not the leader" in got.text
    finally:
        for s in servers.values():
            await s.stop()


async def test_the_lease_keeps_other_annotations_and_drops_a_stale_address() -> None:
    api, clock = LeaseApi(), Clock()
    a = LeaderElector(api, namespace="n", name="lease", identity="a", clock=clock, address="10.0.0.1:8080")
    assert await a.try_acquire_or_renew()
    assert api.obj is not None
    api.obj["metadata"]["annotations"]["team"] = "platform"  # someone else's annotation
    a.address = None  # restarted where it cannot say its address
    assert await a.try_acquire_or_renew()
    assert api.obj["metadata"]["annotations"] == {"team": "platform"}


def test_advertised_address_prefers_the_pod_ip() -> None:
    assert advertised_address("0.0.0.0", 8080, environ={"POD_IP": "10.1.2.3"}) == "10.1.2.3:8080"
    assert advertised_address("0.0.0.0", 8080, environ={"POD_IP": "fd00::5"}) == "[fd00::5]:8080"
    assert advertised_address("127.0.0.1", 9000, environ={}) == "127.0.0.1:9000"
    assert advertised_address("0.0.0.0", 8080, environ={}) is None
