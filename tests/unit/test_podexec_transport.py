"""`KubeExec` against a scripted apiserver speaking the real wire protocol (HTTP/1.1 upgrade, websocket
frames, v4 channels, optionally mutual TLS): every outcome the controller relies on (result, exit code,
TIMEOUT / FORBIDDEN / NOT_FOUND / EXEC_ERROR / PARSE_ERROR) for both transports, the direct asyncio +
wsproto one and the httpx-ws one kept for proxied apiservers, plus the request itself (path, query,
subprotocol, bearer token, client certificate, SNI) and the connection being closed afterwards."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import httpx
import kr8s.asyncio
import pytest
import wsproto.events as wse
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from wsproto.connection import Connection, ConnectionType
from wsproto.utilities import generate_accept_token

from ghostgpu.signals.podexec import EXEC_PROTOCOL, MAX_OUTPUT, ExecFailed, ExecResult, KubeExec, PodRef
from ghostgpu.signals.processes import PS_ARGV, ExecProcessSource
from ghostgpu.verdict import FailureReason, ProcessInfo, SignalFailure

POD = PodRef("team-a", "train-0", "main")
LISTING = (
    "    PID    PPID STAT ELAPSED COMMAND\n"
    "      1       0 Ss       60 python\n"
    "     88       0 R+        0 ps\n"
)
SUCCESS = {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}


def exit_status(code: int) -> dict[str, Any]:
    return {
        "kind": "Status",
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "message": f"command terminated with non-zero exit code: exit status {code}",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


# --- a scripted apiserver ---------------------------------------------------------------------------


class Peer:
    """The server side of one exec connection, for a scenario to script."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: bytes) -> None:
        self.reader, self.writer, self.key = reader, writer, key
        self.ws = Connection(ConnectionType.SERVER)

    async def accept(self, subprotocol: str | None = EXEC_PROTOCOL) -> None:
        head = [
            b"HTTP/1.1 101 Switching Protocols",
            b"Upgrade: websocket",
            b"Connection: Upgrade",
            b"Sec-WebSocket-Accept: " + generate_accept_token(self.key),
        ]
        if subprotocol:
            head.append(b"Sec-WebSocket-Protocol: " + subprotocol.encode())
        await self.raw(b"\r\n".join(head) + b"\r\n\r\n")

    async def raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def event(self, event: wse.Event) -> None:
        await self.raw(self.ws.send(event))

    async def channel(self, channel: int, data: bytes | str, *, pieces: int = 1) -> None:
        """One v4 message, split over `pieces` websocket frames."""
        payload = bytes([channel]) + (data.encode() if isinstance(data, str) else data)
        step = max(1, -(-len(payload) // pieces))
        chunks = [payload[i : i + step] for i in range(0, len(payload), step)]
        for i, chunk in enumerate(chunks):
            await self.event(wse.BytesMessage(data=chunk, message_finished=i == len(chunks) - 1))

    async def status(self, status: dict[str, Any]) -> None:
        await self.channel(3, json.dumps(status))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.event(wse.CloseConnection(code=code, reason=reason))

    async def reject(self, code: int, body: dict[str, Any] | None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        reason = {401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}.get(code, "Error")
        await self.raw(
            f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )


Scenario = Callable[[Peer], Awaitable[None]]


@dataclass
class Seen:
    """What one exec connection showed the server."""

    target: str
    headers: dict[str, str]
    peer_cn: str | None
    resumed: bool | None = None  # TLS only: the client resumed an earlier session
    client_events: list[wse.Event] = field(default_factory=list)
    eof: asyncio.Event = field(default_factory=asyncio.Event)


class FakeApiserver:
    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.scenario: Scenario = ok_scenario
        self.seen: list[Seen] = []
        self.url = ""

    async def start(self, ssl_ctx: ssl.SSLContext | None = None) -> None:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0, ssl=ssl_ctx)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"{'https' if ssl_ctx else 'http'}://127.0.0.1:{port}{self.prefix}"

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                if not data:
                    return
                conn.receive_data(data)
                continue
            break
        assert isinstance(event, h11.Request)
        target = event.target.decode()
        headers = {k.decode().lower(): v.decode() for k, v in event.headers}
        if target.rstrip("/") == f"{self.prefix}/version":
            body = json.dumps({"major": "1", "minor": "33", "gitVersion": "v1.33.1"}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
            return
        if "sec-websocket-key" not in headers:
            raise AssertionError(f"unexpected request {event.method!r} {target!r}")
        peercert = writer.get_extra_info("peercert")
        cn = None
        if peercert:
            cn = next(v for rdn in peercert["subject"] for k, v in rdn if k == "commonName")
        tls = writer.get_extra_info("ssl_object")
        seen = Seen(target, headers, cn, tls.session_reused if tls is not None else None)
        self.seen.append(seen)
        peer = Peer(reader, writer, headers["sec-websocket-key"].encode())
        try:
            await self.scenario(peer)
            # What the client does afterwards: its close frame / pongs, then the end of the connection.
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                peer.ws.receive_data(data)
                seen.client_events.extend(peer.ws.events())
        finally:
            seen.eof.set()


async def ok_scenario(peer: Peer) -> None:
    await peer.accept()
    await peer.channel(1, LISTING)
    await peer.status(SUCCESS)
    await peer.close()


# --- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture
async def apiserver() -> AsyncIterator[FakeApiserver]:
    srv = FakeApiserver()
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture(params=["direct", "httpx-ws"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


async def make_exec(kubeconfig: dict[str, Any] | str, transport: str = "direct") -> KubeExec:
    api = await kr8s.asyncio.api(kubeconfig=kubeconfig)
    ex = KubeExec(api)
    if transport == "httpx-ws":

        async def no_direct() -> None:
            return None

        ex._direct_endpoint = no_direct  # type: ignore[method-assign]
    else:
        assert await ex._direct_endpoint() is not None
    return ex


def kubeconfig(server: str, *, user: dict[str, Any] | None = None, **cluster: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user if user is not None else {"token": "t0ken"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }


async def run_exec(
    srv: FakeApiserver, scenario: Scenario, transport: str, timeout: float = 5.0
) -> ExecResult:
    srv.scenario = scenario
    ex = await make_exec(kubeconfig(srv.url), transport)
    return await ex.run(POD, PS_ARGV, timeout=timeout)


async def failure(srv: FakeApiserver, scenario: Scenario, transport: str, timeout: float = 5.0) -> ExecFailed:
    with pytest.raises(ExecFailed) as e:
        await run_exec(srv, scenario, transport, timeout)
    return e.value


# --- results ------------------------------------------------------------------------------------------


async def test_listing_and_request(apiserver: FakeApiserver, transport: str) -> None:
    result = await run_exec(apiserver, ok_scenario, transport)
    assert result == ExecResult(LISTING, "", 0)
    (seen,) = apiserver.seen
    path, _, query = seen.target.partition("?")
    assert path == "/api/v1/namespaces/team-a/pods/train-0/exec"
    # httpx's encoding of the same parameters: the argv arrives as separate, fixed command values
    assert query == str(
        httpx.QueryParams(
            {
                "command": list(PS_ARGV),
                "container": "main",
                "stdout": "true",
                "stderr": "true",
                "stdin": "false",
            }
        )
    )
    assert seen.headers["sec-websocket-protocol"] == EXEC_PROTOCOL
    assert seen.headers["authorization"] == "Bearer t0ken"
    assert seen.headers["upgrade"].lower() == "websocket"
    await asyncio.wait_for(seen.eof.wait(), 5)  # the client closed the connection


async def test_stdout_stderr_fragments_and_pings(apiserver: FakeApiserver, transport: str) -> None:
    async def scenario(peer: Peer) -> None:
        await peer.accept()
        await peer.channel(1, LISTING[:10])
        await peer.event(wse.Ping(payload=b"hb"))
        await peer.channel(1, LISTING[10:], pieces=4)  # one message over four frames
        await peer.channel(2, "warn: x\n", pieces=2)
        await peer.status(SUCCESS)
        await peer.close()

    assert await run_exec(apiserver, scenario, transport) == ExecResult(LISTING, "warn: x\n", 0)
    seen = apiserver.seen[0]
    await asyncio.wait_for(seen.eof.wait(), 5)
    assert any(isinstance(e, wse.Pong) and e.payload == b"hb" for e in seen.client_events)


async def test_everything_in_one_packet(apiserver: FakeApiserver, transport: str) -> None:
    """The 101, the output, the status and the close frame arriving in a single read."""

    async def scenario(peer: Peer) -> None:
        ws = peer.ws
        parts = [
            ws.send(wse.BytesMessage(data=b"\x01" + LISTING.encode())),
            ws.send(wse.BytesMessage(data=b"\x03" + json.dumps(SUCCESS).encode())),
            ws.send(wse.CloseConnection(code=1000)),
        ]
        accept = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        accept += b"Sec-WebSocket-Accept: " + generate_accept_token(peer.key)
        accept += b"\r\nSec-WebSocket-Protocol: " + EXEC_PROTOCOL.encode() + b"\r\n\r\n"
        await peer.raw(accept + b"".join(parts))

    assert await run_exec(apiserver, scenario, transport) == ExecResult(LISTING, "", 0)


async def test_client_closes_the_websocket_after_the_status(apiserver: FakeApiserver) -> None:
    """The server keeps the websocket open after the exit status: the client ends it (close frame)."""

    async def scenario(peer: Peer) -> None:
        await peer.accept()
        await peer.channel(1, LISTING)
        await peer.status(SUCCESS)

    await run_exec(apiserver, scenario, "direct")
    seen = apiserver.seen[0]
    await asyncio.wait_for(seen.eof.wait(), 5)
    closes = [e for e in seen.client_events if isinstance(e, wse.CloseConnection)]
    assert [c.code for c in closes] == [1000]


async def test_nonzero_exit_code(apiserver: FakeApiserver, transport: str) -> None:
    async def scenario(peer: Peer) -> None:
        await peer.accept()
        await peer.channel(2, "ps: boom\n")
        await peer.status(exit_status(2))
        await peer.close()

    result = await run_exec(apiserver, scenario, transport)
    assert result == ExecResult("", "ps: boom\n", 2)


async def test_through_process_source(apiserver: FakeApiserver, transport: str) -> None:
    apiserver.scenario = ok_scenario
    ex = await make_exec(kubeconfig(apiserver.url), transport)
    pods = [PodRef("ns", f"p{i}", "main") for i in range(12)]
    out = await ExecProcessSource(ex, concurrency=8, timeout=5).list_many(pods)
    for pod, listing in out.items():
        assert listing == (
            ProcessInfo(pid=1, state="Ss", command="python", ppid=0, elapsed_s=60, scope=f"{pod.name}/main"),
        )
    assert len(apiserver.seen) == 12


# --- typed failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (401, FailureReason.FORBIDDEN),
        (403, FailureReason.FORBIDDEN),
        (404, FailureReason.NOT_FOUND),
        (400, FailureReason.EXEC_ERROR),
        (500, FailureReason.EXEC_ERROR),
    ],
)
async def test_http_rejections(
    apiserver: FakeApiserver, transport: str, code: int, reason: FailureReason
) -> None:
    body = {"kind": "Status", "status": "Failure", "message": f'pods "train-0" said {code}', "code": code}

    async def scenario(peer: Peer) -> None:
        await peer.reject(code, body)

    err = await failure(apiserver, scenario, transport)
    assert err.failure.reason is reason
    assert err.failure.detail.startswith(f"HTTP {code}")
    if transport == "direct":  # the Status message is reported (httpx-ws drops the body)
        assert err.failure.detail == f'HTTP {code}: pods "train-0" said {code}'


async def test_rejection_without_body(apiserver: FakeApiserver) -> None:
    async def scenario(peer: Peer) -> None:
        await peer.reject(403, None)

    err = await failure(apiserver, scenario, "direct")
    assert err.failure.reason is FailureReason.FORBIDDEN
    assert err.failure.detail == "HTTP 403: Forbidden"


async def test_failed_status_without_exit_code_is_exec_error(
    apiserver: FakeApiserver, transport: str
) -> None:
    async def scenario(peer: Peer) -> None:
        await peer.accept()
        await peer.status({"status": "Failure", "message": 'exec: "ps": executable file not found'})
        await peer.close()

    err = await failure(apiserver, scenario, transport)
    assert err.failure.reason is FailureReason.EXEC_ERROR
    assert "executable file not found" in err.failure.detail


async def test_status_not_json_is_parse_error(apiserver: FakeApiserver, transport: str) -> None:
    async def scenario(peer: Peer) -> None:
        await peer.accept()
        await peer.channel(3, "not json")
        await peer.close()

    err = await failure(apiserver, scenario, transport)
    assert err.failure.reason is FailureReason.PARSE_ERROR


@pytest.mark.parametrize("shape", ["many messages", "one message"])
async def test_output_is_bounded(apiserver: FakeApiserver, transport: str, shape: str) -> None:
    async def scenario(peer: Peer) -> None:
        await peer.accept()
        if shape == "one message":
            await peer.channel(1, b"x" * (MAX_OUTPUT + 10), pieces=40)
        else:
            for _ in range(20):
                await peer.channel(1, b"x" * (MAX_OUTPUT // 16))
        await peer.status(SUCCESS)
        await peer.close()

    err = await failure(apiserver, scenario, transport)
    assert err.failure.reason is FailureReason.PARSE_ERROR
    assert "exceeds" in err.failure.detail


async def test_output_at_the_bound_is_kept(apiserver: FakeApiserver) -> None:
    async def scenario(peer: Peer) -> None:
        await peer.accept()
        await peer.channel(1, b"y" * (MAX_OUTPUT - 5), pieces=8)
        await peer.channel(2, b"e" * 5)
        await peer.status(SUCCESS)
        await peer.close()

    result = await run_exec(apiserver, scenario, "direct")
    assert len(result.stdout) == MAX_OUTPUT - 5 and result.stderr == "eeeee"


@pytest.mark.parametrize("code", [1000, 1011])
async def test_close_before_the_exit_status(apiserver: FakeApiserver, transport: str, code: int) -> None:
    async def scenario(peer: Peer) -> None:
        await peer.accept()
        await peer.channel(1, LISTING)
        await peer.close(code, "going away")

    err = await failure(apiserver, scenario, transport)
    assert err.failure.reason is FailureReason.EXEC_ERROR


async def test_connection_dropped_before_the_exit_status(apiserver: FakeApiserver, transport: str) -> None:
    async def scenario(peer: Peer) -> None:
        await peer.accept()
        await peer.channel(1, LISTING)
        peer.writer.close()

    err = await failure(apiserver, scenario, transport)
    assert err.failure.reason is FailureReason.EXEC_ERROR


async def test_unexpected_channel_and_text_message(apiserver: FakeApiserver, transport: str) -> None:
    async def channel9(peer: Peer) -> None:
        await peer.accept()
        await peer.channel(9, "?")
        await peer.close()

    assert (await failure(apiserver, channel9, transport)).failure.reason is FailureReason.EXEC_ERROR

    async def text(peer: Peer) -> None:
        await peer.accept()
        await peer.event(wse.TextMessage(data="\x01hello"))
        await peer.close()

    assert (await failure(apiserver, text, transport)).failure.reason is FailureReason.EXEC_ERROR


async def test_bad_upgrade_is_exec_error(apiserver: FakeApiserver) -> None:
    async def scenario(peer: Peer) -> None:  # a 101 with a wrong accept token
        await peer.raw(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: bm9wZQ==\r\n\r\n"
        )

    err = await failure(apiserver, scenario, "direct")
    assert err.failure.reason is FailureReason.EXEC_ERROR


async def test_connection_refused_is_exec_error() -> None:
    srv = FakeApiserver()
    await srv.start()
    ex = await make_exec(kubeconfig(srv.url))
    await srv.stop()  # the apiserver goes away after kr8s connected
    with pytest.raises(ExecFailed) as e:
        await ex.run(POD, PS_ARGV, timeout=5)
    assert e.value.failure.reason is FailureReason.EXEC_ERROR


@pytest.mark.parametrize("stage", ["before the upgrade", "after the upgrade", "mid-output"])
async def test_hard_timeout_closes_the_connection(
    apiserver: FakeApiserver, transport: str, stage: str
) -> None:
    async def scenario(peer: Peer) -> None:  # then nothing more: the server just reads
        if stage != "before the upgrade":
            await peer.accept()
        if stage == "mid-output":
            await peer.channel(1, LISTING[:5])

    t0 = time.monotonic()
    err = await failure(apiserver, scenario, transport, timeout=0.3)
    assert time.monotonic() - t0 < 2
    assert err.failure.reason is FailureReason.TIMEOUT
    assert "0.3s" in err.failure.detail
    # the client hung up: the server sees the end of the connection (no socket left behind)
    await asyncio.wait_for(apiserver.seen[0].eof.wait(), 5)


# --- auth and addressing ------------------------------------------------------------------------------


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _key_and_cert(
    d: Path, name: str, cn: str, issuer: tuple[Any, x509.Certificate] | None, *, ca: bool = False, sans=()
) -> tuple[Any, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[1].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    cert = builder.sign(issuer[0] if issuer else key, hashes.SHA256())
    (d / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return key, cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = _key_and_cert(d, "ca", "test-ca", None, ca=True)
    _key_and_cert(d, "other-ca", "other-ca", None, ca=True)
    _key_and_cert(
        d,
        "server",
        "apiserver",
        ca,
        sans=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("apiserver.test")],
    )
    _key_and_cert(d, "client", "ghostgpu-controller", ca)
    return Pki(
        d / "ca.crt",
        d / "server.crt",
        d / "server.key",
        d / "client.crt",
        d / "client.key",
        d / "other-ca.crt",
    )


@pytest.fixture
async def tls_apiserver(pki: Pki) -> AsyncIterator[FakeApiserver]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    ctx.load_verify_locations(pki.ca)
    ctx.verify_mode = ssl.CERT_REQUIRED  # like an apiserver with --client-ca-file, for this test
    srv = FakeApiserver()
    await srv.start(ctx)
    yield srv
    await srv.stop()


def tls_kubeconfig(srv: FakeApiserver, pki: Pki, ca: Path | None = None, **cluster: Any) -> dict[str, Any]:
    return kubeconfig(
        srv.url,
        user={"client-certificate": str(pki.client_cert), "client-key": str(pki.client_key)},
        **{"certificate-authority": str(ca or pki.ca), **cluster},
    )


async def test_client_certificate_auth(tls_apiserver: FakeApiserver, pki: Pki, transport: str) -> None:
    ex = await make_exec(tls_kubeconfig(tls_apiserver, pki), transport)
    loads = 0
    load_ssl_context = ex.api.auth.ssl_context

    async def counting_ssl_context() -> Any:
        nonlocal loads
        loads += 1
        return await load_ssl_context()

    ex.api.auth.ssl_context = counting_ssl_context
    for _ in range(3):
        assert await ex.run(POD, PS_ARGV, timeout=5) == ExecResult(LISTING, "", 0)
    assert [s.peer_cn for s in tls_apiserver.seen] == ["ghostgpu-controller"] * 3
    assert not any("authorization" in s.headers for s in tls_apiserver.seen)
    assert loads <= 1  # the certificates are not re-read per exec


async def test_tls_sessions_are_resumed_with_the_client_identity(
    tls_apiserver: FakeApiserver, pki: Pki
) -> None:
    ex = await make_exec(tls_kubeconfig(tls_apiserver, pki))
    for _ in range(4):
        assert await ex.run(POD, PS_ARGV, timeout=5) == ExecResult(LISTING, "", 0)
    assert [s.resumed for s in tls_apiserver.seen] == [False, True, True, True]
    assert [s.peer_cn for s in tls_apiserver.seen] == ["ghostgpu-controller"] * 4


async def test_a_server_that_forgets_its_sessions_gets_full_handshakes(
    tls_apiserver: FakeApiserver, pki: Pki
) -> None:
    """A restarted apiserver (new ticket keys) refuses the kept session: the exec still works over a
    full handshake and the next one resumes the new session. One that keeps refusing is not
    offered a session any more (each offer costs a copy)."""
    ex = await make_exec(tls_kubeconfig(tls_apiserver, pki))

    def restart_with_new_keys() -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(pki.server_cert, pki.server_key)
        ctx.load_verify_locations(pki.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    port = int(tls_apiserver.url.rsplit(":", 1)[1])

    async def restart() -> None:
        await tls_apiserver.stop()
        tls_apiserver.server = await asyncio.start_server(
            tls_apiserver.handle, "127.0.0.1", port, ssl=restart_with_new_keys()
        )

    await ex.run(POD, PS_ARGV, timeout=5)
    await restart()
    for _ in range(2):
        assert (await ex.run(POD, PS_ARGV, timeout=5)).returncode == 0
    assert [s.resumed for s in tls_apiserver.seen] == [False, False, True]
    endpoint = ex._endpoint
    assert endpoint is not None and endpoint.tls.session is not None
    for _ in range(endpoint.tls.GIVE_UP_AFTER):
        await restart()
        assert (await ex.run(POD, PS_ARGV, timeout=5)).returncode == 0
    assert endpoint.tls.offer() is None
    assert [s.resumed for s in tls_apiserver.seen[3:]] == [False] * endpoint.tls.GIVE_UP_AFTER


async def test_tls_server_name_is_used_for_verification(tls_apiserver: FakeApiserver, pki: Pki) -> None:
    ex = await make_exec(tls_kubeconfig(tls_apiserver, pki, **{"tls-server-name": "apiserver.test"}))
    assert (await ex.run(POD, PS_ARGV, timeout=5)).returncode == 0
    # (kr8s's own /version check would fail the same way: build its Api without it)
    config = tls_kubeconfig(tls_apiserver, pki, **{"tls-server-name": "elsewhere.test"})
    ex = KubeExec(await _unchecked_api(config))
    with pytest.raises(ExecFailed) as e:
        await ex.run(POD, PS_ARGV, timeout=5)
    assert e.value.failure.reason is FailureReason.EXEC_ERROR
    assert "CERTIFICATE_VERIFY_FAILED" in e.value.failure.detail


async def test_untrusted_server_certificate_is_exec_error(tls_apiserver: FakeApiserver, pki: Pki) -> None:
    good = await make_exec(tls_kubeconfig(tls_apiserver, pki))
    # the same server, but the kubeconfig trusts another CA (kr8s could not even check the version)
    good.api.auth.server_ca_file = str(pki.other_ca)
    await good.api._create_session()
    with pytest.raises(ExecFailed) as e:
        await good.run(POD, PS_ARGV, timeout=5)
    assert e.value.failure.reason is FailureReason.EXEC_ERROR
    assert not tls_apiserver.seen


async def test_new_credentials_are_picked_up(apiserver: FakeApiserver) -> None:
    ex = await make_exec(kubeconfig(apiserver.url))
    await ex.run(POD, PS_ARGV, timeout=5)
    ex.api.auth.token = "rotated"  # what kr8s's reauthenticate() does, followed by a new session
    await ex.api._create_session()
    await ex.run(POD, PS_ARGV, timeout=5)
    assert [s.headers["authorization"] for s in apiserver.seen] == ["Bearer t0ken", "Bearer rotated"]


async def test_a_server_named_by_a_host_name_is_resolved(apiserver: FakeApiserver) -> None:
    """`localhost`, not an address: resolved per exec, every address tried in turn (a server
    listening on 127.0.0.1 only is reached even where `localhost` is ::1 first)."""
    ex = await make_exec(kubeconfig(apiserver.url.replace("127.0.0.1", "localhost")))
    assert await ex.run(POD, PS_ARGV, timeout=5) == ExecResult(LISTING, "", 0)
    assert apiserver.seen[-1].headers["host"].startswith("localhost:")


async def test_server_url_with_a_path_prefix() -> None:
    srv = FakeApiserver(prefix="/k8s/clusters/c-1")
    await srv.start()
    try:
        ex = await make_exec(kubeconfig(srv.url))
        assert (await ex.run(POD, PS_ARGV, timeout=5)).returncode == 0
        assert srv.seen[0].target.startswith("/k8s/clusters/c-1/api/v1/namespaces/team-a/pods/train-0/exec?")
    finally:
        await srv.stop()


async def test_argv_and_names_are_encoded_like_httpx(apiserver: FakeApiserver, transport: str) -> None:
    apiserver.scenario = ok_scenario
    ex = await make_exec(kubeconfig(apiserver.url), transport)
    argv = ("du", "-sk", "--", "/data/a b&c=d#e%f+g/é")
    await ex.run(PodRef("ns-1", "pod.x", "c-0"), argv, timeout=5)
    path, _, query = apiserver.seen[0].target.partition("?")
    assert path == "/api/v1/namespaces/ns-1/pods/pod.x/exec"
    params = {"command": list(argv), "container": "c-0", "stdout": "true", "stderr": "true", "stdin": "false"}
    assert query == str(httpx.QueryParams(params))


async def _unchecked_api(config: dict[str, Any]) -> Any:
    """A kr8s Api without its /version round trip (which would go through the unreachable proxy)."""
    api = kr8s.asyncio.Api(bypass_factory=True, kubeconfig=config)
    await api.auth
    await api._create_session()
    return api


async def test_a_proxy_means_the_httpx_path(
    apiserver: FakeApiserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await KubeExec(await _unchecked_api(kubeconfig(apiserver.url)))._direct_endpoint() is not None
    # kubeconfig proxy-url: kr8s hands it to httpx, which implements the proxy
    config = kubeconfig(apiserver.url, **{"proxy-url": "http://127.0.0.1:9"})
    assert await KubeExec(await _unchecked_api(config))._direct_endpoint() is None
    # proxy environment variables that httpx honours for this URL
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert await KubeExec(await _unchecked_api(kubeconfig(apiserver.url)))._direct_endpoint() is None
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert await KubeExec(await _unchecked_api(kubeconfig(apiserver.url)))._direct_endpoint() is not None


async def test_many_concurrent_execs_each_get_their_own_result(apiserver: FakeApiserver) -> None:
    async def scenario(peer: Peer) -> None:
        n = len(apiserver.seen)
        await peer.accept()
        await asyncio.sleep(0.01)
        await peer.channel(1, f"PID PPID STAT ELAPSED COMMAND\n1 0 S 5 n{n}\n")
        await peer.status(SUCCESS)
        await peer.close()

    apiserver.scenario = scenario
    ex = await make_exec(kubeconfig(apiserver.url))
    pods = [PodRef("ns", f"p{i}", "main") for i in range(20)]
    out = await ExecProcessSource(ex, concurrency=8, timeout=5).list_many(pods)
    assert not [v for v in out.values() if isinstance(v, SignalFailure)]
    assert len({v[0].command for v in out.values()}) == 20  # type: ignore[index]


async def test_admission_waits_once_connected_and_before_the_timeout_starts(
    apiserver: FakeApiserver, transport: str
) -> None:
    """A client-side rate limit (`admit`) lets the request go after the handshake (direct
    transport; kr8s's transport connects and sends in one step, so there it waits first), and
    the exec's timeout counts from there: a long wait for the budget is not an exec timeout."""
    connections = 0
    handle = apiserver.handle

    async def counting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await handle(reader, writer)

    apiserver.handle = counting  # type: ignore[method-assign]
    apiserver.server.close()
    await apiserver.start()
    at_admission: list[tuple[int, int]] = []
    ex = await make_exec(kubeconfig(apiserver.url), transport)
    connections = 0  # make_exec's own /version request, if any

    async def admit() -> None:
        await asyncio.sleep(0.05)  # let the server accept a connection already made
        at_admission.append((connections, len(apiserver.seen)))
        await asyncio.sleep(0.4)  # longer than the exec's timeout

    ex.admit = admit
    assert await ex.run(POD, PS_ARGV, timeout=0.3) == ExecResult(LISTING, "", 0)
    assert at_admission == [(1 if transport == "direct" else 0, 0)]
    assert len(apiserver.seen) == 1
