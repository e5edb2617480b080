"""A tiny asyncio HTTP server on the controller port: /metrics, /healthz, /readyz, /decisions.
The node agent serves its /metrics and probes with the same class.

Why not prometheus_client.start_http_server: it runs in a thread and knows only /metrics; the
probes must reflect the event loop itself (a wedged loop must fail /healthz), so they are served
from the loop.

Any pod that reaches the port may connect, so every connection is bounded: at most
MAX_CONNECTIONS open at once (a new one sheds the oldest that has not sent its request yet, or
is refused when all are busy answering), a request head of at most MAX_HEAD_BYTES (431 beyond,
the stream's own buffer limit), the head within HEAD_TIMEOUT_S of connecting and the whole
exchange within CONNECTION_TIMEOUT_S. One request per connection (`Connection: close`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Probe = Callable[[], tuple[bool, str]]
# An asynchronous /decisions handler: request target -> (status, content type, body).
DecisionsAnswer = Callable[[str], Awaitable[tuple[int, str, bytes]]]

# Prometheus, the kubelet's probes and a person's curl need a few; each costs ~7 KiB idle.
MAX_CONNECTIONS = 64
MAX_HEAD_BYTES = 8 << 10  # a scrape's head is ~300 bytes
HEAD_TIMEOUT_S = 5.0
CONNECTION_TIMEOUT_S = 15.0  # above Prometheus' default 10 s scrape timeout
_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class HeadTooLarge(Exception):
    """A request head past MAX_HEAD_BYTES."""


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
        max_connections: int = MAX_CONNECTIONS,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        connection_timeout_s: float = CONNECTION_TIMEOUT_S,
    ) -> None:
        self.registry = registry
        self.healthy = healthy
        self.ready = ready
        self.decisions = decisions
        self.decisions_answer = decisions_answer  # replaces `decisions` (the leader's log: app.py)
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.head_timeout_s = head_timeout_s
        self.connection_timeout_s = connection_timeout_s
        self._server: asyncio.Server | None = None
        # Open connections, oldest first; True while one has not sent its whole request head.
        self._open: dict[asyncio.StreamWriter, bool] = {}

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def start(self) -> int:
        # `limit`: the stream's buffer, so one header line can never hold more than the head may.
        self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=MAX_HEAD_BYTES)
        sock = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server:
            self._server.close()
            for writer in list(self._open):
                writer.transport.abort()
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

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        if len(self._open) >= self.max_connections:
            idle = next((w for w, waiting in self._open.items() if waiting), None)
            if idle is None:
                return False  # every slot is answering a request: refuse the newcomer
            self._open.pop(idle)
            idle.transport.abort()  # its handler ends on the reset
        self._open[writer] = True
        return True

    async def _read_head(self, reader: asyncio.StreamReader) -> bytes:
        """The request line, after reading the headers (not needed) up to the empty line."""
        request = b""
        size = 0
        while True:
            try:
                line = await reader.readline()
            except ValueError as exc:  # one line past the stream's limit
                raise HeadTooLarge from exc
            size += len(line)
            if size > MAX_HEAD_BYTES:
                raise HeadTooLarge
            if not line:
                raise asyncio.IncompleteReadError(request, None)
            if not request:
                request = line
            elif not line.strip():
                return request

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            writer.transport.abort()
            return
        try:
            async with asyncio.timeout(self.connection_timeout_s):
                try:
                    async with asyncio.timeout(self.head_timeout_s):
                        request = await self._read_head(reader)
                    parts = request.decode("latin-1").split()
                    if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                        status, ctype, body = 405, "text/plain", b"method not allowed"
                    else:
                        status, ctype, body = await self._answer(parts[1])
                except HeadTooLarge:
                    parts, status, ctype, body = [], 431, "text/plain", b"request head too large"
                self._open[writer] = False  # answering: not shed for a newcomer
                head = (
                    f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                )
                writer.write(head.encode() + (body if parts and parts[0] != "HEAD" else b""))
                await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            writer.transport.abort()  # a client too slow or gone: nothing more to send it
        finally:
            self._open.pop(writer, None)
            with contextlib.suppress(RuntimeError):  # the loop may be closing
                writer.close()
