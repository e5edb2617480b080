"""Exec into a container through the apiserver (the `pods/exec` subresource, websocket v4 channel
protocol), with a hard timeout and a bounded output size; every failure is a typed SignalFailure.

Why not `kr8s.objects.Pod.exec`: it first waits, without bound, for the pod to be Ready (a crashed
workload's pod often is not) and does not bound the output. We reuse kr8s's authenticated websocket
(`Api.open_websocket`) and decode the channels ourselves.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import httpx_ws

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


class ExecFailed(Exception):
    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.failure = SignalFailure(reason=reason, detail=detail[:200])


class PodExec(Protocol):
    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult: ...


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
    """`PodExec` over a kr8s asyncio Api (uses its auth, TLS and websocket session)."""

    def __init__(self, api: Any) -> None:
        self.api = api

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        stream = ExecStream()
        try:
            async with asyncio.timeout(timeout):
                async with self.api.open_websocket(
                    version="v1",
                    url=f"pods/{pod.name}/exec",
                    namespace=pod.namespace,
                    subprotocols=(EXEC_PROTOCOL,),
                    params={
                        "command": list(argv),
                        "container": pod.container,
                        "stdout": "true",
                        "stderr": "true",
                        "stdin": "false",
                    },
                ) as ws:
                    while not stream.done:
                        stream.feed(await ws.receive_bytes())
        except TimeoutError as exc:
            raise ExecFailed(FailureReason.TIMEOUT, f"exec did not finish within {timeout}s") from exc
        except httpx_ws.WebSocketUpgradeError as exc:
            # httpx-ws has closed the response by now, so only the status line is left to report.
            resp = exc.response
            raise classify_http_status(resp.status_code, resp.reason_phrase) from exc
        except httpx_ws.WebSocketDisconnect as exc:
            if not stream.done:
                raise ExecFailed(
                    FailureReason.EXEC_ERROR, f"stream closed early: {exc.code} {exc.reason}"
                ) from exc
        except (httpx_ws.WebSocketNetworkError, httpx.HTTPError, OSError) as exc:
            raise ExecFailed(FailureReason.EXEC_ERROR, f"{type(exc).__name__}: {exc}") from exc
        if not stream.done:
            # kr8s swallows a normal close (code 1000) that arrives before the exit status.
            raise ExecFailed(FailureReason.EXEC_ERROR, "stream closed before the exit status")
        return stream.result()
