"""The HTTP server of the controller (8080) and of the node agent (9402, the same class) under a
flood: open connections are capped, a request's head has a size limit and a deadline, so any pod
that can reach the port cannot make either process run out of memory or stop answering."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import CollectorRegistry

from ghostgpu.controller.server import MAX_CONNECTIONS, MAX_HEAD_BYTES, HealthServer

FLOOD = 1000


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _server(**limits: float) -> HealthServer:
    ok = lambda: (True, "ok")  # noqa: E731
    return HealthServer(CollectorRegistry(), healthy=ok, ready=ok, host="127.0.0.1", port=0, **limits)  # type: ignore[arg-type]


@pytest.fixture
async def server() -> AsyncIterator[HealthServer]:
    s = _server()
    await s.start()
    yield s
    await s.stop()


async def _connect(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def test_a_flood_of_idle_connections_is_capped_and_the_server_still_answers(
    server: HealthServer,
) -> None:
    # 1,000 connections that never send a byte: the server keeps at most MAX_CONNECTIONS of them
    # (it sheds the oldest that has sent no request), its memory grows by a bounded amount, and a
    # real request is still answered at once.
    fds = _open_fds()
    tracemalloc.start()
    clients: list[socket.socket] = []
    try:
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.monotonic()
        for _ in range(FLOOD):
            clients.append(await _connect(server.port))
        for _ in range(50):  # let the server accept (and shed) what the kernel queued
            await asyncio.sleep(0.01)
        held = _open_fds() - fds - FLOOD  # the server's side of the connections
        grown = tracemalloc.get_traced_memory()[0] - base
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5) as c:
            assert (await c.get("/healthz")).status_code == 200
        elapsed = time.monotonic() - t0
    finally:
        tracemalloc.stop()
        for sock in clients:
            sock.close()
    assert held <= MAX_CONNECTIONS, f"{held} connections held open for {FLOOD} idle clients"
    assert grown < 2 << 20, f"{grown / 2**20:.1f} MiB for {FLOOD} idle connections"
    assert elapsed < 30


async def _exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * (16 << 10) + b"\r\n\r\n",  # one long line
        b"GET /healthz HTTP/1.1\r\n" + b"X-Pad: aaaaaaaaaaaaaaaaaaaa\r\n" * 400 + b"\r\n",  # many lines
    ],
)
async def test_a_request_head_past_the_limit_is_refused(server: HealthServer, head: bytes) -> None:
    assert len(head) > MAX_HEAD_BYTES
    answer = await _exchange(server.port, head)
    assert answer.startswith(b"HTTP/1.1 431 ")
    ok = await _exchange(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200 ") and ok.endswith(b"\r\n\r\nok")


async def test_a_head_sent_a_line_at_a_time_is_cut_at_the_deadline() -> None:
    # Each line arrives well within any per-line timeout; the whole head does not, and the
    # connection (and its memory) is released at the head's deadline.
    s = _server(head_timeout_s=0.5)
    await s.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        t0 = time.monotonic()
        closed_after = None
        while time.monotonic() - t0 < 3:
            try:
                writer.write(b"X-Slow: y\r\n")
                await writer.drain()
                if await asyncio.wait_for(reader.read(), 0.1) == b"":
                    closed_after = time.monotonic() - t0
                    break
            except TimeoutError:
                continue
            except ConnectionError:
                closed_after = time.monotonic() - t0
                break
        writer.close()
        assert closed_after is not None and closed_after < 1.5, closed_after
        assert s.open_connections == 0
    finally:
        await s.stop()


async def test_when_every_slot_is_answering_a_newcomer_is_refused_and_served_later() -> None:
    s = _server(max_connections=2)
    await s.start()
    # Two clients that send a request and never read the answer: /decisions' body is large enough
    # to fill the socket buffers, so both slots stay busy writing until the clients go.
    s.decisions = lambda: b"x" * (32 << 20)
    try:
        busy = [await asyncio.open_connection("127.0.0.1", s.port) for _ in range(2)]
        for _, w in busy:
            w.write(b"GET /decisions HTTP/1.1\r\n\r\n")
        for _ in range(100):
            await asyncio.sleep(0.01)
            if s.open_connections == 2 and not any(s._open.values()):
                break
        assert s.open_connections == 2 and not any(s._open.values())
        with pytest.raises(ConnectionResetError):  # reset at once, nothing buffered for it
            await _exchange(s.port, b"GET /healthz HTTP/1.1\r\n\r\n")
        for _, w in busy:
            w.transport.abort()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if s.open_connections == 0:
                break
        ok = await _exchange(s.port, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200 ")
    finally:
        await s.stop()
