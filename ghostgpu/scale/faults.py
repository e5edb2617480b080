"""Fault injectors for the fault-tolerance suite (tests/e2e/test_faults*.py), all real servers on
127.0.0.1 that the controller's own clients talk to:

- `PrometheusFaultProxy`: an HTTP proxy in front of the real Prometheus. Per request it forwards, or
  injects one fault: `down` (the port stops listening: connection refused), `reset` (the connection
  closes without an answer), `slow` (answers after the client's timeout), `http500`/`http503`,
  `garbage` (200 with a body that is not a query result), `empty` (a valid, empty result),
  `partial` (a random half of the series dropped), `stale` (the `ts` series moved an hour back).
- `ScaleWebhook`: a validating admission webhook on `deployments/scale` in one namespace, so the
  real kube-apiserver answers the controller's scale call with 429/500/503 bursts (denials carry
  the status code), or holds it (`hold`) while a test kills the caller. It is also a witness: it
  records every scale request it sees, by deployment and outcome.
- `hang_table` / `release_fifo`: a kwok pod's scripted `ps` table replaced by a FIFO with no
  writer, so the exec through the apiserver hangs for real until released.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import ssl
import stat
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx

PROM_MODES = ("down", "reset", "slow", "http500", "http503", "garbage", "empty", "partial", "stale")


class PrometheusFaultProxy:
    def __init__(self, upstream: str, *, port: int, slow_seconds: float, seed: int = 7) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = port
        self.slow_seconds = slow_seconds
        self.mode = "ok"
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()
        self.forwarded = 0
        self._server: asyncio.Server | None = None
        self._client = httpx.AsyncClient(timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._handle, "127.0.0.1", self.port, reuse_address=True
            )

    async def stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def aclose(self) -> None:
        await self.stop_listening()
        await self._client.aclose()

    async def set_mode(self, mode: str) -> None:
        """`down` closes the listening socket (refused); any other mode listens again."""
        self.mode = mode
        if mode == "down":
            await self.stop_listening()
            self.injected["down"] += 1  # one refused query per poll
        else:
            await self.start()

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
        return lines[0], headers, body

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line, headers, body = await self._read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            writer.close()
            return
        mode = self.mode
        try:
            if mode == "reset":
                self.injected[mode] += 1
                return  # close without a byte
            if mode == "slow":
                self.injected[mode] += 1
                await asyncio.sleep(self.slow_seconds)
            if mode in ("http500", "http503"):
                self.injected[mode] += 1
                err = {"status": "error", "errorType": "internal", "error": f"injected {mode}"}
                await self._reply(writer, int(mode[4:]), json.dumps(err).encode())
                return
            if mode == "garbage":
                self.injected[mode] += 1
                junk = self.rng.choice(
                    [b"<html>502 Bad Gateway</html>", b'{"status":"success","data":', b"\x00\xff"]
                )
                await self._reply(writer, 200, junk)
                return
            if mode == "empty":
                self.injected[mode] += 1
                ok = {"status": "success", "data": {"resultType": "vector", "result": []}}
                await self._reply(writer, 200, json.dumps(ok).encode())
                return
            method, path, _ = request_line.split(" ", 2)
            resp = await self._client.request(
                method,
                self.upstream + path,
                content=body,
                headers={"content-type": headers.get("content-type", "application/x-www-form-urlencoded")},
            )
            self.forwarded += 1
            payload = resp.content
            if mode in ("partial", "stale") and resp.status_code == 200:
                self.injected[mode] += 1
                payload = json.dumps(self._distort(resp.json(), mode)).encode()
            await self._reply(writer, resp.status_code, payload)
        except (ConnectionError, httpx.HTTPError):
            pass
        finally:
            writer.close()

    def _distort(self, body: dict[str, Any], mode: str) -> dict[str, Any]:
        result = body.get("data", {}).get("result", [])
        if mode == "partial":
            keep = [r for r in result if self.rng.random() < 0.5]
            if len(keep) == len(result) and result:
                keep = keep[1:]  # always lose at least one series
            body["data"]["result"] = keep
        else:
            # What Prometheus answers when every pod's newest sample is an hour old: the query sends
            # a stale pod its oldest sample's time (`ts`) instead of its reading (`util`).
            for r in result:
                metric = r.get("metric", {})
                if metric.get("ghostgpu_field") == "util":
                    t, _ = r["value"]
                    metric["ghostgpu_field"] = "ts"
                    r["value"] = [t, str(float(t) - 3600)]
        return body

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, code: int, body: bytes) -> None:
        head = (
            f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()


@dataclass
class WebhookState:
    deny_probability: float = 0.0
    codes: tuple[int, ...] = (429, 500, 503)
    hold: bool = False
    seed: int = 11
    rng: random.Random = field(init=False)
    seen: list[tuple[str, str]] = field(default_factory=list)  # (deployment, outcome)
    held: threading.Event = field(default_factory=threading.Event)  # a request is being held
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def outcome(self, name: str) -> tuple[bool, int]:
        """(allowed, status code) for one scale request."""
        with self.lock:
            if self.hold:
                self.hold = False
                holding = True
            else:
                holding = False
        if holding:
            self.held.set()
            self.release.wait(30)
            with self.lock:
                self.seen.append((name, "held-then-500"))
            return False, 500
        with self.lock:
            if self.rng.random() < self.deny_probability:
                code = self.rng.choice(self.codes)
                self.seen.append((name, f"denied-{code}"))
                return False, code
            self.seen.append((name, "allowed"))
            return True, 200

    def count(self, prefix: str) -> int:
        with self.lock:
            return sum(1 for _, o in self.seen if o.startswith(prefix))

    def allowed_by_name(self) -> Counter[str]:
        with self.lock:
            return Counter(n for n, o in self.seen if o == "allowed")

    def names(self) -> set[str]:
        with self.lock:
            return {n for n, _ in self.seen}


class _WebhookHandler(BaseHTTPRequestHandler):
    state: ClassVar[WebhookState]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        req = review.get("request") or {}
        allowed, code = self.state.outcome(str(req.get("name", "")))
        response: dict[str, Any] = {"uid": req.get("uid", ""), "allowed": allowed}
        if not allowed:
            response["status"] = {"code": code, "message": f"ghostgpu fault suite: injected HTTP {code}"}
        data = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())


class _QuietTLSServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the apiserver drops webhook connections when its caller is gone: not news


class ScaleWebhook:
    def __init__(self, cert: Path, key: Path, ca_pem: bytes, *, port: int, namespace: str) -> None:
        self.state = WebhookState()
        handler = type("Handler", (_WebhookHandler,), {"state": self.state})
        self.server = _QuietTLSServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = port
        self.namespace = namespace
        self.ca_pem = ca_pem
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.state.release.set()
        self.server.shutdown()
        self.server.server_close()

    def configuration(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "scale-faults.ghostgpu.io",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self.port}/validate",
                        "caBundle": base64.b64encode(self.ca_pem).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["deployments/scale"],
                            "scope": "Namespaced",
                        }
                    ],
                    # only the suite's namespace: nothing else in the cluster is affected
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    # Fail, so the witness misses nothing: no scale bypasses it in this namespace
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 30,
                }
            ],
        }


def hang_table(path: Path) -> None:
    """Replace a pod's `ps` table by a FIFO: the shim's `cat` blocks until `release_fifo`."""
    tmp = path.with_suffix(".fifo")
    tmp.unlink(missing_ok=True)
    os.mkfifo(tmp)
    os.replace(tmp, path)


def release_fifo(path: Path, text: str) -> None:
    """Unblock every reader of the FIFO (EOF), then put a regular table back."""
    try:
        if stat.S_ISFIFO(path.stat().st_mode):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass  # no reader is blocked on it
    except FileNotFoundError:
        pass
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


GARBAGE_LISTINGS: tuple[str, ...] = (
    "",  # nothing at all
    "Segmentation fault (core dumped)\n",
    "PID PPID STAT ELAPSED COMMAND\n 12 1 ?? 60 python\n",  # unknown state
    "PID PPID STAT ELAPSED COMMAND\n abc 1 S 60 python\n",  # not a pid
    "PID PPID STAT COMMAND\n 12 x S python\n",  # not a ppid
    "PID STAT COMMAND\n 1 S python\n",  # the old three-column listing
    "  PID TTY          TIME CMD\n    1 ?        00:00:01 python\n",  # another ps format
    "\x00\x01\x02 binary \xff\n",
    "PID STAT\n",  # a truncated header
)


def garbage_listing(rng: random.Random, valid: Callable[[str], bool]) -> str:
    """A malformed listing (checked with the parser: a well-formed lie is not a fault here)."""
    while True:
        text = rng.choice(GARBAGE_LISTINGS)
        if rng.random() < 0.3:
            text += "".join(chr(rng.randrange(32, 127)) for _ in range(rng.randrange(1, 40)))
        if not valid(text):
            return text
