"""A tiny asyncio HTTP server on the controller port: /metrics, /healthz, /readyz, /decisions.

Why not prometheus_client.start_http_server: it runs in a thread and knows only /metrics; the
probes must reflect the event loop itself (a wedged loop must fail /healthz), so they are served
from the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Probe = Callable[[], tuple[bool, str]]
# An asynchronous /decisions handler: request target -> (status, content type, body).
DecisionsAnswer = Callable[[str], Awaitable[tuple[int, str, bytes]]]


class HealthServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        healthy: Probe,
        ready: Probe,
        decisions: Callable[[], bytes] = lambda: b"",
        decisions_answer: DecisionsAnswer | None = None,
        host: str = "0.0.0.0",
        port: int = 8080,
    ) -> None:
        self.registry = registry
        self.healthy = healthy
        self.ready = ready
        self.decisions = decisions
        self.decisions_answer = decisions_answer  # replaces `decisions` (the leader's log: app.py)
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sock = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server:
            self._server.close()
            await self._server.wait_closed()

    def route(self, path: str) -> tuple[int, str, bytes]:
        path = path.split("?", 1)[0]
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path in ("/healthz", "/readyz"):
            ok, detail = (self.healthy if path == "/healthz" else self.ready)()
            return (
                (200 if ok else 503),
                "text/plain; charset=utf-8",
                (detail or ("ok" if ok else "not ok")).encode(),
            )
        if path == "/decisions":
            return 200, "application/x-ndjson", self.decisions()
        return 404, "text/plain; charset=utf-8", b"not found"

    async def _answer(self, target: str) -> tuple[int, str, bytes]:
        if self.decisions_answer is not None and target.split("?", 1)[0] == "/decisions":
            return await self.decisions_answer(target)
        return self.route(target)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)).strip():
                pass  # headers are not needed
            parts = request.decode("latin-1").split()
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, ctype, body = 405, "text/plain", b"method not allowed"
            else:
                status, ctype, body = await self._answer(parts[1])
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}[
                status
            ]
            head = (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (body if parts and parts[0] != "HEAD" else b""))
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
