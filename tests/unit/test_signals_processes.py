"""Process signal: the `ps` parser, the exec channel decoder, the apiserver exec path against a
real local HTTP server (forbidden / not found / timeout), and bounded concurrency."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ghostgpu.signals.podexec import ExecFailed, ExecResult, ExecStream, KubeExec, PodRef
from ghostgpu.signals.processes import (
    PS_ARGV,
    MalformedListing,
    ProcessSource,
    merge_listings,
    parse_ps,
    without_idle_holders,
)
from ghostgpu.verdict import FailureReason, ProcessInfo, SignalFailure

POD = PodRef("team-a", "train-0", "main")

LISTING = """    PID STAT COMMAND
      1 Ss   python
     27 Sl   pt_data_worker
     31 Z    python
     88 R+   ps
"""


# --- parser ---------------------------------------------------------------------------------------


def test_parse_ps_states_and_drops_the_probe() -> None:
    procs = parse_ps(LISTING)
    assert [(p.pid, p.state, p.command) for p in procs] == [
        (1, "Ss", "python"),
        (27, "Sl", "pt_data_worker"),
        (31, "Z", "python"),
    ]
    assert [p.defunct for p in procs] == [False, False, True]


def test_parse_ps_keeps_commands_with_spaces_and_pid1_named_ps() -> None:
    procs = parse_ps("PID STAT COMMAND\n1 S ps\n7 S my worker\n")
    assert [(p.pid, p.command) for p in procs] == [(1, "ps"), (7, "my worker")]


@pytest.mark.parametrize(
    "text",
    [
        "",  # nothing at all
        "  PID TTY          TIME CMD\n    1 ?        00:00:00 sh\n",  # wrong columns (plain `ps`)
        "PID STAT COMMAND\nabc S python\n",  # non-numeric pid
        "PID STAT COMMAND\n0 S python\n",  # pid 0 does not exist in a container
        "PID STAT COMMAND\n12 ?? python\n",  # unknown state
        "PID STAT COMMAND\n12\n",  # truncated row
        "ps: unrecognized option: o\nBusyBox v1.36\n",  # an error printed on stdout
    ],
)
def test_parse_ps_rejects_malformed_listings(text: str) -> None:
    with pytest.raises(MalformedListing):
        parse_ps(text)


def test_header_only_listing_is_no_processes() -> None:
    assert parse_ps("PID STAT COMMAND\n") == ()
    assert parse_ps("PID STAT COMMAND\n88 R ps\n") == ()  # only the probe itself


def test_idle_holders_are_dropped_only_when_alone() -> None:
    def procs(*rows: tuple[int, str, str]) -> tuple[ProcessInfo, ...]:
        return tuple(ProcessInfo(pid=p, state=s, command=c) for p, s, c in rows)

    finished = procs((1, "Ss", "sh"), (7, "S", "sleep"))
    assert without_idle_holders(finished) == ((), 2)
    zombie = procs((1, "Ss", "sh"), (9, "Z", "python"))
    assert without_idle_holders(zombie) == (procs((9, "Z", "python")), 1)
    working = procs((1, "Ss", "sh"), (8, "R", "python"))
    assert without_idle_holders(working) == (working, 0)
    interactive = procs((1, "Ss", "sleep"), (30, "Ss+", "bash"))  # someone's kubectl exec -it
    assert without_idle_holders(interactive) == (interactive, 0)
    busy_shell = procs(
        (1, "R", "sh"),
    )
    assert without_idle_holders(busy_shell) == (busy_shell, 0)
    fail = SignalFailure(reason=FailureReason.TIMEOUT)
    assert without_idle_holders(fail) == (fail, 0)
    assert without_idle_holders(None) == (None, 0)


def test_argv_is_a_fixed_read_only_constant() -> None:
    assert PS_ARGV == ("ps", "-eo", "pid,stat,comm")
    assert isinstance(PS_ARGV, tuple)


# --- exec stream decoder --------------------------------------------------------------------------


def test_exec_stream_collects_channels_and_exit_code() -> None:
    s = ExecStream()
    s.feed(b"\x01PID STAT COMMAND\n")
    s.feed(b"\x011 S python\n")
    s.feed(b"\x02warning\n")
    assert not s.done
    s.feed(b"\x03" + json.dumps({"status": "Success"}).encode())
    assert s.result() == ExecResult("PID STAT COMMAND\n1 S python\n", "warning\n", 0)


def test_exec_stream_nonzero_exit() -> None:
    s = ExecStream()
    status = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "message": "command terminated with non-zero exit code: exit status 2",
        "details": {"causes": [{"reason": "ExitCode", "message": "2"}]},
    }
    s.feed(b"\x03" + json.dumps(status).encode())
    assert s.result().returncode == 2


def test_exec_stream_failure_without_exit_code_is_exec_error() -> None:
    s = ExecStream()
    status = {"status": "Failure", "message": 'exec: "ps": executable file not found in $PATH'}
    with pytest.raises(ExecFailed) as e:
        s.feed(b"\x03" + json.dumps(status).encode())
    assert e.value.failure.reason is FailureReason.EXEC_ERROR
    assert "executable file not found" in e.value.failure.detail


def test_exec_stream_bounds_output() -> None:
    s = ExecStream(max_output=100)
    with pytest.raises(ExecFailed) as e:
        s.feed(b"\x01" + b"x" * 101)
    assert e.value.failure.reason is FailureReason.PARSE_ERROR


# --- the apiserver exec path against a real local server -------------------------------------------


@pytest.fixture
def fake_apiserver() -> Iterator[tuple[str, dict]]:
    """Answers /version like an apiserver and the exec upgrade with a scripted status (or a stall)."""
    script: dict = {"status": 403, "delay": 0.0, "paths": []}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.startswith("/version"):
                code, body = 200, {"major": "1", "minor": "35", "gitVersion": "v1.35.4"}
            else:
                script["paths"].append(self.path)
                time.sleep(script["delay"])
                code, body = (
                    script["status"],
                    {"kind": "Status", "status": "Failure", "code": script["status"]},
                )
            data = json.dumps(body).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", script
    server.shutdown()
    server.server_close()


async def _kube_exec(url: str) -> KubeExec:
    import kr8s.asyncio

    return KubeExec(await kr8s.asyncio.api(url=url))


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (403, FailureReason.FORBIDDEN),
        (401, FailureReason.FORBIDDEN),
        (404, FailureReason.NOT_FOUND),
        (500, FailureReason.EXEC_ERROR),
    ],
)
async def test_exec_http_errors_become_typed_failures(
    fake_apiserver: tuple[str, dict], status: int, reason: FailureReason
) -> None:
    url, script = fake_apiserver
    script["status"] = status
    source = ProcessSource(await _kube_exec(url), timeout=5)
    out = await source.list_processes(POD)
    assert isinstance(out, SignalFailure) and out.reason is reason
    # the argv reached the apiserver as fixed, separate command parameters
    assert "command=ps&command=-eo&command=pid%2Cstat%2Ccomm&container=main" in script["paths"][-1]


async def test_exec_timeout(fake_apiserver: tuple[str, dict]) -> None:
    url, script = fake_apiserver
    script["delay"] = 2.0
    source = ProcessSource(await _kube_exec(url), timeout=0.3)
    t0 = time.monotonic()
    out = await source.list_processes(POD)
    assert time.monotonic() - t0 < 1.5
    assert isinstance(out, SignalFailure) and out.reason is FailureReason.TIMEOUT


# --- the source over a scripted executor -----------------------------------------------------------


class ScriptedExec:
    def __init__(self, results: dict[str, ExecResult | ExecFailed], delay: float = 0.0) -> None:
        self.results = results
        self.delay = delay
        self.calls: list[tuple[PodRef, tuple[str, ...]]] = []
        self.running = 0
        self.max_running = 0

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        self.calls.append((pod, argv))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(self.delay)
            r = self.results[pod.name]
            if isinstance(r, ExecFailed):
                raise r
            return r
        finally:
            self.running -= 1


async def test_source_maps_exit_codes_parse_errors_and_exec_failures() -> None:
    ex = ScriptedExec(
        {
            "ok": ExecResult(LISTING, "", 0),
            "exit1": ExecResult("", "ps: no process table", 1),
            "garbage": ExecResult("Segmentation fault\n", "", 0),
            "forbidden": ExecFailed(FailureReason.FORBIDDEN, "HTTP 403"),
        }
    )
    src = ProcessSource(ex)
    pods = [PodRef("ns", n, "main") for n in ("ok", "exit1", "garbage", "forbidden")]
    out = await src.list_many(pods)
    assert isinstance(out[pods[0]], tuple) and len(out[pods[0]]) == 3
    assert out[pods[1]].reason is FailureReason.EXEC_ERROR  # type: ignore[union-attr]
    assert out[pods[2]].reason is FailureReason.PARSE_ERROR  # type: ignore[union-attr]
    assert out[pods[3]].reason is FailureReason.FORBIDDEN  # type: ignore[union-attr]
    assert {argv for _, argv in ex.calls} == {PS_ARGV}


async def test_source_bounds_concurrency() -> None:
    ex = ScriptedExec({f"p{i}": ExecResult(LISTING, "", 0) for i in range(10)}, delay=0.05)
    src = ProcessSource(ex, concurrency=3)
    await src.list_many([PodRef("ns", f"p{i}", "main") for i in range(10)])
    assert ex.max_running == 3


def test_merge_listings_fails_safe() -> None:
    a = (ProcessInfo(pid=1, state="S", command="python"),)
    fail = SignalFailure(reason=FailureReason.TIMEOUT)
    assert merge_listings([a, a]) == a + a
    assert merge_listings([a, fail]) == fail
    assert isinstance(merge_listings([]), SignalFailure)
