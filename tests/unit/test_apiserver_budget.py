"""The apiserver request budget (ghostgpu.controller.budget) on a fake clock: burst, rate, order by
priority, first come first served within one, no starvation, 429 Retry-After, cancellation, and the
event loop keeps running while requests wait."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from kr8s._exceptions import ServerError
from prometheus_client import CollectorRegistry
from test_config import MINIMAL

from ghostgpu.config import ConfigError, load_config_text
from ghostgpu.controller.budget import (
    BudgetedApi,
    BudgetedExec,
    BudgetMetrics,
    Priority,
    RequestBudget,
    priority,
)
from ghostgpu.scale.bench import budget_check
from ghostgpu.signals.podexec import ExecResult, PodRef


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)
        await asyncio.sleep(0)


def budget(qps: float = 20, burst: int = 30, **kw: Any) -> tuple[RequestBudget, FakeClock]:
    clock = FakeClock()
    return RequestBudget(qps, burst, clock=clock, sleep=clock.sleep, **kw), clock


async def test_burst_is_free_then_the_rate_holds_over_every_interval() -> None:
    b, clock = budget(qps=20, burst=30)
    times: list[float] = []

    async def one() -> None:
        await b.acquire(Priority.VERDICT)
        times.append(clock.now)

    await asyncio.gather(*(one() for _ in range(130)))
    assert times[:30] == [0.0] * 30  # the burst leaves at once
    assert times[-1] == pytest.approx(100 / 20)  # the other 100 at 20 per second
    # client-go's guarantee: over any interval of T seconds at most burst + qps*T requests
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            assert j - i + 1 <= 30 + 20 * (times[j] - start) + 1e-9
    assert b.granted == 130


async def test_once_the_burst_is_spent_waiters_leave_in_batches_at_the_same_rate() -> None:
    b, clock = budget(qps=20, burst=30, batch=8)
    times: list[float] = []

    async def one() -> None:
        await b.acquire(Priority.PROBE)
        times.append(clock.now)

    await asyncio.gather(*(one() for _ in range(30 + 20)))
    later = times[30:]
    # 8 at 0.4 s, 8 at 0.8 s, then the last 4 as soon as 4 tokens are back (1.0 s): the same rate,
    # in 3 wake-ups instead of 20
    assert later == pytest.approx([0.4] * 8 + [0.8] * 8 + [1.0] * 4)
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            assert j - i + 1 <= 30 + 20 * (times[j] - start) + 1e-9
    # a lone waiter is not held back for a batch: one token is enough
    clock.now += 0.001
    t0 = clock.now
    await b.acquire(Priority.RECLAIM)
    assert clock.now - t0 == pytest.approx((1 - 20 * 0.001) / 20)  # the rest of one token, 1/qps


async def test_headroom_keeps_the_budget_where_the_apiserver_receives_the_requests() -> None:
    """Requests that reach the apiserver up to `jitter_s` late (a new connection's handshake, a
    loaded apiserver) never look there like more than `burst` at once: `qps * jitter_s` tokens are
    held back (2 of 30 at 20 qps), and the rate is unchanged."""

    async def sent(jitter_s: float) -> list[float]:
        b, clock = budget(qps=20, burst=30, batch=8, jitter_s=jitter_s)
        times: list[float] = []

        async def one() -> None:
            await b.acquire(Priority.PROBE)
            times.append(clock.now)

        await asyncio.gather(*(one() for _ in range(130)))
        return times

    plain, kept = await sent(0.0), await sent(0.1)
    assert kept[:28] == [0.0] * 28 and kept[28] > 0  # 28 at once, not 30
    assert kept[-1] == pytest.approx(plain[-1], abs=0.11)  # the same rate: 20 per second
    # the worst arrivals: a whole burst as late as allowed, what follows on time; and random ones
    rng = random.Random(7)
    for late in [[0.1] * 30 + [0.0] * 100, *([rng.uniform(0, 0.1) for _ in range(130)] for _ in range(200))]:
        assert budget_check([t + d for t, d in zip(kept, late, strict=True)], 20)["peak_burst"] <= 30 + 1e-9
    # without the headroom, a late burst reads as 32 at the apiserver
    assert budget_check([t + d for t, d in zip(plain, [0.1] * 30 + [0.0] * 100, strict=True)], 20)[
        "peak_burst"
    ] == pytest.approx(32)


async def test_valuable_requests_are_served_first_and_in_arrival_order_within_a_priority() -> None:
    b, _ = budget(qps=10, burst=1)
    await b.acquire(Priority.VERDICT)  # the bucket is now empty: everything below queues
    served: list[str] = []

    async def one(name: str, level: Priority) -> None:
        await b.acquire(level)
        served.append(name)

    tasks = [
        asyncio.create_task(one("active-1", Priority.ACTIVE)),
        asyncio.create_task(one("verdict-1", Priority.VERDICT)),
        asyncio.create_task(one("active-2", Priority.ACTIVE)),
        asyncio.create_task(one("reclaim-1", Priority.RECLAIM)),
        asyncio.create_task(one("finding-1", Priority.FINDING)),
        asyncio.create_task(one("escalate-1", Priority.ESCALATE)),
        asyncio.create_task(one("reclaim-2", Priority.RECLAIM)),
    ]
    await asyncio.gather(*tasks)
    assert served == [
        "reclaim-1",
        "reclaim-2",
        "escalate-1",
        "finding-1",
        "verdict-1",
        "active-1",
        "active-2",
    ]


async def test_the_priority_comes_from_the_context() -> None:
    b, _ = budget(qps=10, burst=1)
    await b.acquire()
    served: list[str] = []

    async def one(name: str) -> None:
        await b.acquire()
        served.append(name)

    with priority(Priority.ACTIVE):
        low = asyncio.create_task(one("low"))
    with priority(Priority.RECLAIM):
        high = asyncio.create_task(one("high"))
    await asyncio.gather(low, high)
    assert served == ["high", "low"]


async def test_a_steady_stream_of_valuable_requests_cannot_starve_the_rest() -> None:
    b, clock = budget(qps=10, burst=1, aging_s=5.0)
    await b.acquire()
    low_done: list[float] = []

    async def low() -> None:
        await b.acquire(Priority.ACTIVE)
        low_done.append(clock.now)

    async def flood() -> None:
        # always more reclaim requests queued than the bucket can serve
        while not low_done and clock.now < 600:
            await asyncio.gather(*(b.acquire(Priority.RECLAIM) for _ in range(5)))

    await asyncio.gather(low(), flood())
    # ACTIVE is 5 levels below RECLAIM: aged one level per 5 s, it is served within ~30 s
    assert low_done and low_done[0] <= 5 * 5 + 5 + 1


async def test_cancelled_waiters_are_skipped_and_do_not_take_a_token() -> None:
    b, _ = budget(qps=1, burst=1)
    await b.acquire()
    gone = asyncio.create_task(b.acquire(Priority.RECLAIM))
    await asyncio.sleep(0)
    gone.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gone
    await b.acquire(Priority.ACTIVE)
    assert b.granted == 2 and b.depth == 0


async def test_waiting_leaves_the_event_loop_free_and_is_measured() -> None:
    registry = CollectorRegistry()
    b, clock = budget(qps=2, burst=1, metrics=BudgetMetrics(registry))
    await b.acquire()
    ticks = 0

    async def health() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    h = asyncio.create_task(health())
    waiters = [asyncio.create_task(b.acquire(Priority.PROBE)) for _ in range(4)]
    await asyncio.sleep(0)
    assert registry.get_sample_value("ghostgpu_apiserver_budget_queue_depth", {"priority": "probe"}) == 4
    waited = await asyncio.gather(*waiters)
    h.cancel()
    assert ticks > 4  # the loop kept running other work while the requests waited
    assert waited == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert b.last_grant == clock.now
    assert registry.get_sample_value("ghostgpu_apiserver_budget_queue_depth", {"priority": "probe"}) == 0
    assert registry.get_sample_value(
        "ghostgpu_apiserver_budget_wait_seconds_sum", {"priority": "probe"}
    ) == pytest.approx(5.0)
    assert registry.get_sample_value("ghostgpu_apiserver_budget_requests_total", {"priority": "probe"}) == 4


def _server_error(status: int, headers: dict[str, str] | None = None) -> ServerError:
    request = httpx.Request("PATCH", "https://apiserver/api/v1/namespaces/ns/pods/p")
    response = httpx.Response(status, headers=headers or {}, request=request, json={"message": "x"})
    return ServerError("x", status={"code": status}, response=response)


class FakeApi:
    """A kr8s Api stand-in: answers from a script, records when each request was sent."""

    def __init__(self, clock: FakeClock, script: list[ServerError | None]) -> None:
        self.clock = clock
        self.script = script
        self.sent: list[tuple[str, float]] = []
        self.auth = "kept"  # anything else is passed through

    @contextlib.asynccontextmanager
    async def call_api(self, method: str = "GET", **kwargs: Any) -> AsyncIterator[str]:
        self.sent.append((method, self.clock.now))
        error = self.script.pop(0) if method != "GET" and self.script else None
        if error is not None:
            raise error
        yield "ok"


async def test_429_with_retry_after_pauses_everything_and_resends() -> None:
    registry = CollectorRegistry()
    b, clock = budget(qps=100, burst=100, metrics=BudgetMetrics(registry))
    api = FakeApi(clock, [_server_error(429, {"Retry-After": "3"})])
    wrapped = BudgetedApi(api, b)
    assert wrapped.auth == "kept"

    async def write() -> str:
        async with wrapped.call_api("PATCH", url="pods/p") as resp:
            return str(resp)

    first = asyncio.create_task(write())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert await write() == "ok"  # a request after the 429 waits for the pause too
    assert await first == "ok"
    assert [m for m, _ in api.sent] == ["PATCH", "PATCH", "PATCH"]
    assert api.sent[0][1] == 0.0 and all(t >= 3.0 for _, t in api.sent[1:])
    assert registry.get_sample_value("ghostgpu_apiserver_throttled_total") == 1


async def test_429_without_retry_after_is_the_callers_and_reads_are_not_budgeted() -> None:
    b, clock = budget(qps=1, burst=1)
    api = FakeApi(clock, [_server_error(429)])  # a webhook's denial, a PodDisruptionBudget
    wrapped = BudgetedApi(api, b)
    with pytest.raises(ServerError):
        async with wrapped.call_api("POST", url="pods/p/eviction"):
            pass
    for _ in range(5):
        async with wrapped.call_api("GET", url="pods/p"):
            pass
    assert len(api.sent) == 6 and b.granted == 1 and clock.now == 0.0


async def test_retry_after_gives_up_after_a_bound() -> None:
    b, clock = budget(qps=100, burst=100)
    api = FakeApi(clock, [_server_error(429, {"Retry-After": "1"}) for _ in range(20)])
    with pytest.raises(ServerError):
        async with BudgetedApi(api, b).call_api("PATCH", url="pods/p"):
            pass
    assert len(api.sent) == 6  # the first try and 5 resends


async def test_exec_waits_on_the_same_budget() -> None:
    b, clock = budget(qps=4, burst=2)
    runs: list[float] = []

    class Exec:
        async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
            runs.append(clock.now)
            return ExecResult("", "", 0)

    ex = BudgetedExec(Exec(), b)
    await asyncio.gather(*(ex.run(PodRef("ns", f"p{i}", "c"), ("ps",), timeout=1) for i in range(6)))
    # the burst, then batches as large as the bucket (2) at the rate of 4 per second
    assert runs == pytest.approx([0, 0, 0.5, 0.5, 1.0, 1.0])


def test_config_defaults_and_clear_errors() -> None:
    cfg = load_config_text(MINIMAL).controller.apiserver
    assert (cfg.qps, cfg.burst) == (20.0, 30)
    custom = load_config_text(MINIMAL + "controller:\n  apiserver: {qps: 5, burst: 10}\n").controller
    assert (custom.apiserver.qps, custom.apiserver.burst) == (5.0, 10)
    with pytest.raises(ConfigError, match=r"controller\.apiserver\.qps"):
        load_config_text(MINIMAL + "controller:\n  apiserver: {qps: 0}\n", "c.yaml")
    with pytest.raises(ConfigError, match=r"controller\.apiserver\.burst"):
        load_config_text(MINIMAL + "controller:\n  apiserver: {burst: 0}\n", "c.yaml")
    with pytest.raises(ConfigError, match=r"controller\.apiserver\.rate"):
        load_config_text(MINIMAL + "controller:\n  apiserver: {rate: 3}\n", "c.yaml")
    with pytest.raises(ValueError, match="qps must be > 0"):
        RequestBudget(0, 1)
