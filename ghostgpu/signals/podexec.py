"""Exec into a container through the apiserver (the `pods/exec` subresource, websocket v4 channel
protocol), with a hard timeout and a bounded output size; every failure is a typed SignalFailure.

Why not `kr8s.objects.Pod.exec`: it first waits, without bound, for the pod to be Ready (a crashed
workload's pod often is not) and does not bound the output. We decode the channels ourselves.

Transport. An exec upgrades its connection to a websocket, so every exec costs a new TCP + TLS
connection whatever the client. Over kr8s's `Api.open_websocket` (httpx -> httpcore -> anyio ->
httpx-ws) an exec also cost an anyio task group, a receive task, a keepalive-ping task, memory
streams and cancel scopes: ~3.1 ms of CPU per exec in all. So by default an exec is one non-blocking
socket driven by the event loop's readiness callbacks, with the TLS work in the ssl module's C code
(no asyncio SSL transport and its Python-level buffering) and `wsproto` (the websocket state machine
httpx-ws uses; its h11 handshake does the HTTP upgrade), read in the calling task. Each endpoint keeps
one TLS session and resumes it: a resumed handshake skips the certificate exchange and its signatures
(~0.3 ms of CPU against ~0.8 ms on the devcluster); the session is fetched only after a full
handshake, because the ssl module copies a session each time it hands one over. Auth is still
kr8s's: its ssl context (`api.auth.ssl_context()`: CA, client certificate, insecure-skip-tls-verify),
its session's Authorization / User-Agent headers, its server URL and tls-server-name. When a proxy
applies to the apiserver URL (kubeconfig `proxy-url`, or proxy environment variables that kr8s's httpx
session honours), the exec goes through `Api.open_websocket` as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http
import ipaddress
import json
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import httpx_ws
import wsproto
import wsproto.events as wse
import wsproto.utilities

from ghostgpu.verdict import FailureReason, SignalFailure

EXEC_PROTOCOL = "v4.channel.k8s.io"
STDOUT, STDERR, ERROR = 1, 2, 3
MAX_OUTPUT = 1 << 20  # 1 MiB: a process listing or a du line is far smaller


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    container: str


@dataclass(frozen=True, slots=True)
class ExecResult:
    stdout: str
    stderr: str
    returncode: int


MAX_DETAIL = 200


def bounded_detail(detail: str) -> str:
    """At most MAX_DETAIL characters, keeping the head and the tail: a runtime's message names its
    cause last (containerd: 'failed to start exec "<64 hex>": OCI runtime exec failed: ... exec:
    "ps": executable file not found in $PATH: unknown'), past where a plain cut would end."""
    if len(detail) <= MAX_DETAIL:
        return detail
    return detail[: MAX_DETAIL // 2 - 3] + " .. " + detail[-(MAX_DETAIL // 2 - 1) :]


class ExecFailed(Exception):
    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.failure = SignalFailure(reason=reason, detail=bounded_detail(detail))


class PodExec(Protocol):
    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult: ...


class NoExec:
    """The executor of agent mode (controller.processSource: agent), whose bundle grants no
    pods/exec: whatever would exec fails here, without a request (`file://` artifacts are measured
    by exec; an `s3://` location is measured without one)."""

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        raise ExecFailed(
            FailureReason.FORBIDDEN,
            f"processSource agent grants no pods/exec: {argv[0]} in {pod.namespace}/{pod.name} not run",
        )


class ExecStream:
    """Decoder for the v4 channel protocol: feed websocket messages until `done`."""

    def __init__(self, max_output: int = MAX_OUTPUT) -> None:
        self.max_output = max_output
        self._out = bytearray()
        self._err = bytearray()
        self.returncode: int | None = None
        self.error_message = ""

    @property
    def done(self) -> bool:
        return self.returncode is not None

    def feed(self, message: bytes) -> None:
        if not message:
            return
        channel, payload = message[0], message[1:]
        if channel in (STDOUT, STDERR):
            buf = self._out if channel == STDOUT else self._err
            buf += payload
            if len(self._out) + len(self._err) > self.max_output:
                raise ExecFailed(FailureReason.PARSE_ERROR, f"output exceeds {self.max_output} bytes")
        elif channel == ERROR:
            if not payload:
                return
            self.returncode, self.error_message = _status_returncode(payload)
        else:
            raise ExecFailed(FailureReason.EXEC_ERROR, f"unexpected exec channel {channel}")

    def result(self) -> ExecResult:
        assert self.returncode is not None
        return ExecResult(
            stdout=self._out.decode("utf-8", "replace"),
            stderr=(self._err.decode("utf-8", "replace") or self.error_message),
            returncode=self.returncode,
        )


def _status_returncode(payload: bytes) -> tuple[int, str]:
    """The exit code in a metav1.Status sent on the error channel."""
    try:
        status = json.loads(payload)
    except ValueError as exc:
        raise ExecFailed(FailureReason.PARSE_ERROR, "error channel is not JSON") from exc
    if status.get("status") == "Success":
        return 0, ""
    message = str(status.get("message", ""))
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message", "1")), message
            except ValueError:
                break
    # Not an exit code: the command never ran (executable not found, no such container, ...).
    raise ExecFailed(FailureReason.EXEC_ERROR, message or "exec failed")


def classify_http_status(status: int, text: str) -> ExecFailed:
    if status in (401, 403):
        return ExecFailed(FailureReason.FORBIDDEN, f"HTTP {status}: {text[:150]}")
    if status == 404:
        return ExecFailed(FailureReason.NOT_FOUND, f"HTTP 404: {text[:150]}")
    return ExecFailed(FailureReason.EXEC_ERROR, f"HTTP {status}: {text[:150]}")


class KubeExec:
    """`PodExec` over a kr8s asyncio Api (its auth, TLS settings and server address)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self._endpoint: _Endpoint | None = None
        self._endpoint_key: tuple[Any, ...] = ()
        # Awaited just before the request is sent, once the connection is up (a client-side rate
        # limit: the apiserver sees the request when the limiter let it go, not a TLS handshake
        # later). The exec's own timeout starts after it.
        self.admit: Callable[[], Awaitable[None]] | None = None

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        stream = ExecStream()
        try:
            async with asyncio.timeout(timeout) as deadline:

                async def admitted() -> None:
                    if self.admit is not None:
                        deadline.reschedule(None)  # the wait for the budget is not the exec's time
                        await self.admit()
                        deadline.reschedule(asyncio.get_running_loop().time() + timeout)

                endpoint = await self._direct_endpoint()
                if endpoint is None:
                    await admitted()  # kr8s connects and sends in one step
                    await self._run_open_websocket(pod, _exec_params(argv, pod.container), stream)
                else:
                    path = (
                        f"{endpoint.path_prefix}/api/v1/namespaces/{_seg(pod.namespace)}"
                        f"/pods/{_seg(pod.name)}/exec?{_exec_query(argv, pod.container)}"
                    )
                    await _run_direct(endpoint, path, stream, admitted)
        except TimeoutError as exc:
            raise ExecFailed(FailureReason.TIMEOUT, f"exec did not finish within {timeout}s") from exc
        except ExecFailed:
            raise
        except httpx_ws.WebSocketUpgradeError as exc:
            # httpx-ws has closed the response by now, so only the status line is left to report.
            resp = exc.response
            raise classify_http_status(resp.status_code, resp.reason_phrase) from exc
        except httpx_ws.WebSocketDisconnect as exc:
            if not stream.done:
                raise ExecFailed(
                    FailureReason.EXEC_ERROR, f"stream closed early: {exc.code} {exc.reason}"
                ) from exc
        except (
            httpx_ws.HTTPXWSException,
            httpx.HTTPError,
            wsproto.utilities.ProtocolError,
            OSError,
        ) as exc:
            raise ExecFailed(FailureReason.EXEC_ERROR, f"{type(exc).__name__}: {exc}") from exc
        if not stream.done:
            # The websocket closed normally (code 1000) or the connection ended before the exit status.
            raise ExecFailed(FailureReason.EXEC_ERROR, "stream closed before the exit status")
        return stream.result()

    async def _direct_endpoint(self) -> _Endpoint | None:
        """Where and how to connect, from kr8s's current session and auth (None: use kr8s's path).

        Rebuilt when kr8s replaces its session (it does after re-reading credentials) or its
        token / server changes; kr8s's ssl context is loaded from files, so it is cached here.
        """
        api = self.api
        create_session = getattr(api, "_create_session", None)
        if create_session is None:
            return None  # not the kr8s Api this was written against: let it do the exec
        session = api._session
        if session is None or session.is_closed:
            await create_session()
            session = api._session
        auth = api.auth
        key = (session, auth.server, auth.token, auth.tls_server_name)
        if key != self._endpoint_key:
            self._endpoint = await _endpoint_for(session, auth)
            self._endpoint_key = key
        return self._endpoint

    async def _run_open_websocket(self, pod: PodRef, params: dict[str, Any], stream: ExecStream) -> None:
        """The exec over kr8s's `Api.open_websocket` (httpx-ws), for a proxied apiserver."""
        try:
            async with self.api.open_websocket(
                version="v1",
                url=f"pods/{pod.name}/exec",
                namespace=pod.namespace,
                subprotocols=(EXEC_PROTOCOL,),
                params=params,
                keepalive_ping_interval_seconds=None,  # one short exec: no ping task needed
            ) as ws:
                while not stream.done:
                    stream.feed(await ws.receive_bytes())
        except BaseExceptionGroup as group:
            # httpx-ws runs the session in an anyio task group, which wraps what the body raises
            # (our ExecFailed, a WebSocketDisconnect, ...): hand back the first one, unwrapped.
            raise _first_leaf(group) from None


def _exec_params(argv: tuple[str, ...], container: str) -> dict[str, str | list[str]]:
    return {
        "command": list(argv),
        "container": container,
        "stdout": "true",
        "stderr": "true",
        "stdin": "false",
    }


@functools.lru_cache(maxsize=256)
def _exec_query(argv: tuple[str, ...], container: str) -> str:
    """The exec's query string: the same few commands and container names over and over."""
    return urllib.parse.urlencode(_exec_params(argv, container), doseq=True)


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _seg(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class _TlsResumption:
    """The TLS session an endpoint's connections resume. It belongs to one ssl context and one
    server (a new endpoint, made for new credentials, starts without one). A server that refuses
    the offered session 3 times in a row is not offered one again (fetching one costs a copy)."""

    GIVE_UP_AFTER = 3  # full handshakes in a row despite an offered session

    def __init__(self) -> None:
        self.session: ssl.SSLSession | None = None
        self.misses = 0

    def offer(self) -> ssl.SSLSession | None:
        return self.session if self.misses < self.GIVE_UP_AFTER else None

    def after(self, sock: ssl.SSLSocket) -> None:
        """Once a connection has read its answer (a TLS 1.3 ticket comes after the handshake)."""
        if sock.session_reused:
            self.misses = 0
            return
        if self.misses >= self.GIVE_UP_AFTER:
            return
        if self.session is not None:
            self.misses += 1
            if self.misses >= self.GIVE_UP_AFTER:
                self.session = None
                return
        session = sock.session
        self.session = session if session is not None and session.has_ticket else None


@dataclass(frozen=True, slots=True)
class _Endpoint:
    host: str
    port: int
    ssl: ssl.SSLContext | None
    server_hostname: str | None
    authority: str  # the Host header
    path_prefix: str  # a server URL's path (an apiserver behind a path-routing gateway), no trailing /
    headers: tuple[tuple[bytes, bytes], ...]
    family: socket.AddressFamily | None  # the host is an IP address of this family; None: a name
    tls: _TlsResumption = field(default_factory=_TlsResumption, compare=False)


async def _endpoint_for(session: httpx.AsyncClient, auth: Any) -> _Endpoint | None:
    url = httpx.URL(auth.server)
    transport_for = getattr(session, "_transport_for_url", None)
    direct = getattr(session, "_transport", None)
    if auth.proxy or transport_for is None or direct is None or transport_for(url) is not direct:
        return None  # a proxy applies (or httpx changed): leave the exec to httpx
    if url.scheme not in ("http", "https") or not url.host:
        return None
    ctx: ssl.SSLContext | None = None
    if url.scheme == "https":
        verify = await auth.ssl_context()
        # kr8s hands httpx `True` when the kubeconfig names no CA/cert: httpx's default context.
        ctx = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context()
    headers = [
        (name.encode("latin-1"), session.headers[name].encode("latin-1"))
        for name in ("authorization", "user-agent")
        if name in session.headers
    ]
    try:
        family: socket.AddressFamily | None = (
            socket.AF_INET6 if ipaddress.ip_address(url.host).version == 6 else socket.AF_INET
        )
    except ValueError:
        family = None
    return _Endpoint(
        family=family,
        host=url.host,
        port=url.port or (443 if url.scheme == "https" else 80),
        ssl=ctx,
        server_hostname=(auth.tls_server_name or url.host) if ctx is not None else None,
        authority=url.netloc.decode("ascii"),
        path_prefix=url.path.rstrip("/"),
        headers=tuple(headers),
    )


_READ_SIZE = 1 << 16
_MAX_ERROR_BODY = 1 << 16


class _Connection:
    """One non-blocking TCP (+ TLS) socket, read and written from the calling task: the ssl module
    does the TLS work in C, the event loop only says when the socket is ready."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, endpoint: _Endpoint) -> _Connection:
        loop = asyncio.get_running_loop()
        if endpoint.family is not None:  # an IP address (in a cluster: KUBERNETES_SERVICE_HOST)
            addresses = [(endpoint.family, endpoint.host)]
        else:  # a name: resolved as asyncio would (in its executor), for every exec
            infos = await loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
            addresses = [(family, addr[0]) for family, _, _, _, addr in infos]
        error: OSError = OSError(f"{endpoint.host} resolved to no address")
        for family, host in addresses:
            raw = socket.socket(family, socket.SOCK_STREAM)
            try:
                raw.setblocking(False)
                # The upgrade request follows the handshake's last flight: no Nagle delay between.
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(raw, (host, endpoint.port))
                if endpoint.ssl is None:
                    return cls(raw)
                conn = cls(
                    endpoint.ssl.wrap_socket(
                        raw,
                        server_hostname=endpoint.server_hostname,
                        do_handshake_on_connect=False,
                        session=endpoint.tls.offer(),
                    )
                )
                await conn._handshake()
                return conn
            except OSError as exc:  # ssl.SSLError included: try the next address, else report it
                raw.close()
                error = exc
            except BaseException:
                raw.close()
                raise
        raise error

    async def _ready(self, write: bool) -> None:
        fd = self.sock.fileno()
        ready = self._loop.create_future()
        if write:
            self._loop.add_writer(fd, ready.set_result, None)
        else:
            self._loop.add_reader(fd, ready.set_result, None)
        try:
            await ready
        finally:
            (self._loop.remove_writer if write else self._loop.remove_reader)(fd)

    async def _handshake(self) -> None:
        assert isinstance(self.sock, ssl.SSLSocket)
        while True:
            try:
                self.sock.do_handshake()
                return
            except ssl.SSLWantReadError:
                await self._ready(write=False)
            except ssl.SSLWantWriteError:
                await self._ready(write=True)

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view) :]
            except (BlockingIOError, ssl.SSLWantWriteError):
                await self._ready(write=True)
            except ssl.SSLWantReadError:
                await self._ready(write=False)

    async def recv(self) -> bytes:
        """What the socket has (b"" at its end). It is asked first, then waited on: the TLS layer
        may hold decrypted data the kernel no longer signals."""
        while True:
            try:
                return self.sock.recv(_READ_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError):
                await self._ready(write=False)
            except ssl.SSLWantWriteError:
                await self._ready(write=True)
            except ssl.SSLZeroReturnError:  # the server's close_notify
                return b""

    def send_nowait(self, data: bytes) -> None:
        """A last small frame (the websocket close), if the socket takes it now."""
        with contextlib.suppress(OSError):  # ssl.SSLWantWriteError too: the connection ends anyway
            self.sock.send(data)

    def close(self) -> None:
        self.sock.close()


async def _run_direct(
    endpoint: _Endpoint, path: str, stream: ExecStream, admitted: Callable[[], Awaitable[None]] | None = None
) -> None:
    """One exec: connect, wait for `admitted`, upgrade to a v4 websocket, feed binary messages to
    `stream` until the exit status. Raises ExecFailed for an HTTP rejection / an unexpected
    message; returns with `stream` not done when the stream closes early (the caller reports that)."""
    conn = await _Connection.open(endpoint)
    try:
        if admitted is not None:
            await admitted()
        ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        await conn.send(
            ws.send(
                wse.Request(
                    host=endpoint.authority,
                    target=path,
                    subprotocols=[EXEC_PROTOCOL],
                    extra_headers=list(endpoint.headers),
                )
            )
        )
        message = bytearray()  # one websocket message: wsproto hands over frames in pieces
        rejected: int | None = None
        error_body = bytearray()
        while not stream.done:
            data = await conn.recv()
            if not data:
                if rejected is not None:
                    raise _rejection(rejected, error_body)
                return
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, wse.BytesMessage):
                    message += event.data
                    if len(message) > stream.max_output + 1:
                        raise ExecFailed(
                            FailureReason.PARSE_ERROR, f"output exceeds {stream.max_output} bytes"
                        )
                    if event.message_finished:
                        stream.feed(bytes(message))
                        message.clear()
                        if stream.done:
                            break
                elif isinstance(event, wse.Ping):
                    await conn.send(ws.send(event.response()))
                elif isinstance(event, wse.CloseConnection):
                    if event.code != 1000:
                        raise ExecFailed(
                            FailureReason.EXEC_ERROR,
                            f"stream closed early: {event.code} {event.reason}",
                        )
                    return
                elif isinstance(event, wse.RejectConnection):
                    rejected = event.status_code
                    if not event.has_body:
                        raise _rejection(rejected, error_body)
                elif isinstance(event, wse.RejectData):
                    error_body += event.data[: _MAX_ERROR_BODY - len(error_body)]
                    if event.body_finished:
                        raise _rejection(rejected or 0, error_body)
                elif isinstance(event, wse.TextMessage):
                    raise ExecFailed(FailureReason.EXEC_ERROR, "text message on a v4 exec stream")
                # AcceptConnection, Pong: nothing to do
        if ws.state is wsproto.ConnectionState.OPEN:
            conn.send_nowait(ws.send(wse.CloseConnection(code=1000)))
        if isinstance(conn.sock, ssl.SSLSocket):
            endpoint.tls.after(conn.sock)
    finally:
        conn.close()


def _rejection(status: int, body: bytes) -> ExecFailed:
    """The typed failure for an HTTP answer other than 101; the text is the Status message."""
    text = ""
    try:
        text = str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        text = body.decode("utf-8", "replace").strip()
    if not text:
        try:
            text = http.HTTPStatus(status).phrase
        except ValueError:
            text = "no reason given"
    return classify_http_status(status, text)
