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
    LISTING_ARGVS,
    PS_ARGV,
    PS_ARGV_BUSYBOX,
    ExecProcessSource,
    MalformedListing,
    merge_listings,
    parse_ps,
)
from ghostgpu.verdict import FailureReason, ProcessInfo, SignalFailure

POD = PodRef("team-a", "train-0", "main")

# What procps 4 prints for PS_ARGV (column widths as procps pads them).
LISTING = """    PID    PPID STAT ELAPSED COMMAND
      1       0 Ss       932 /bin/sh -c python train.py --epochs 3
     27       1 Sl       930 python train.py --epochs 3
     31      27 Z        120 [python] <defunct>
     88       0 R+         0 ps -eo pid,ppid,stat,etimes,args
"""
# What BusyBox 1.35 prints for PS_ARGV_BUSYBOX.
BUSYBOX_LISTING = """PID   PPID  STAT COMMAND
    1     0 S    sh -c while true; do python job.py; sleep 3600; done
   14     1 S    sleep 3600
   15     0 R    ps -eo pid,ppid,stat,args
"""


# --- parser ---------------------------------------------------------------------------------------


def test_parse_procps_listing_keeps_parents_ages_and_arguments_and_drops_the_probe() -> None:
    procs = parse_ps(LISTING, scope="train-0/main")
    assert [(p.pid, p.ppid, p.state, p.elapsed_s, p.command) for p in procs] == [
        (1, 0, "Ss", 932, "/bin/sh -c python train.py --epochs 3"),
        (27, 1, "Sl", 930, "python train.py --epochs 3"),
        (31, 27, "Z", 120, "[python] <defunct>"),
    ]
    assert [p.defunct for p in procs] == [False, False, True]
    assert {p.scope for p in procs} == {"train-0/main"}


def test_parse_busybox_listing_has_no_elapsed_column() -> None:
    procs = parse_ps(BUSYBOX_LISTING)
    assert [(p.pid, p.ppid, p.elapsed_s, p.command) for p in procs] == [
        (1, 0, None, "sh -c while true; do python job.py; sleep 3600; done"),
        (14, 1, None, "sleep 3600"),
    ]


def test_parse_ps_keeps_pid1_named_ps_and_a_ps_started_by_the_workload() -> None:
    text = "PID PPID STAT COMMAND\n1 0 S ps\n7 1 S my worker --x\n8 7 S ps aux\n"
    assert [(p.pid, p.command) for p in parse_ps(text)] == [(1, "ps"), (7, "my worker --x"), (8, "ps aux")]


def test_parse_ps_drops_the_other_probes_of_the_controller() -> None:
    text = "PID PPID STAT COMMAND\n1 0 S python serve.py\n40 0 D du -sk -- /data\n41 0 R ls -1a -- /data\n"
    assert [p.pid for p in parse_ps(text)] == [1]


def test_parse_ps_bounds_the_command_line() -> None:
    (proc,) = parse_ps("PID PPID STAT COMMAND\n1 0 S python " + "x" * 10_000 + "\n")
    assert len(proc.command) == 512 and proc.command.startswith("python xx")


@pytest.mark.parametrize(
    "text",
    [
        "",  # nothing at all
        "  PID TTY          TIME CMD\n    1 ?        00:00:00 sh\n",  # wrong columns (plain `ps`)
        "PID STAT COMMAND\n1 S python\n",  # the old three-column listing
        "PID PPID STAT ELAPSED COMMAND\nabc 0 S 5 python\n",  # non-numeric pid
        "PID PPID STAT ELAPSED COMMAND\n0 0 S 5 python\n",  # pid 0 does not exist in a container
        "PID PPID STAT ELAPSED COMMAND\n3 x S 5 python\n",  # non-numeric ppid
        "PID PPID STAT ELAPSED COMMAND\n3 1 S 05:12 python\n",  # etime, not etimes
        "PID PPID STAT ELAPSED COMMAND\n12 1 ?? 5 python\n",  # unknown state
        "PID PPID STAT ELAPSED COMMAND\n12 1\n",  # truncated row
        "ps: bad -o argument 'etimes', supported arguments: user,group,comm,args,pid,ppid\n",
    ],
)
def test_parse_ps_rejects_malformed_listings(text: str) -> None:
    with pytest.raises(MalformedListing):
        parse_ps(text)


def test_header_only_listing_is_no_processes() -> None:
    assert parse_ps("PID PPID STAT ELAPSED COMMAND\n") == ()
    assert parse_ps("PID PPID STAT COMMAND\n88 0 R ps -eo pid,ppid,stat,args\n") == ()  # only the probe


def test_argvs_are_fixed_read_only_constants() -> None:
    assert PS_ARGV == ("ps", "-eo", "pid,ppid,stat,etimes,args")
    assert PS_ARGV_BUSYBOX == ("ps", "-eo", "pid,ppid,stat,args")
    assert LISTING_ARGVS == (PS_ARGV, PS_ARGV_BUSYBOX)
    assert all(isinstance(a, tuple) for a in LISTING_ARGVS)


# --- the real procps and BusyBox ps of this machine -------------------------------------------------


def _run(argv: tuple[str, ...]) -> str:
    import subprocess

    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout


def test_the_real_procps_listing_parses_and_shows_a_timer() -> None:
    import shutil
    import subprocess

    if shutil.which("ps") is None:
        pytest.skip("no procps ps on this machine")
    with subprocess.Popen(["sleep", "3600"]) as timer:
        try:
            procs = parse_ps(_run(PS_ARGV))
        finally:
            timer.kill()
    (mine,) = [p for p in procs if p.pid == timer.pid]
    assert mine.command == "sleep 3600" and mine.elapsed_s is not None and mine.elapsed_s < 60


def test_an_elapsed_time_procps_wrapped_reads_as_just_started() -> None:
    listing = "PID PPID STAT ELAPSED COMMAND\n7 1 S 4123168608 sleep 3600\n"
    (p,) = parse_ps(listing)
    assert p.elapsed_s == 0


def test_the_real_busybox_listing_parses_and_shows_a_timer() -> None:
    import shutil
    import subprocess

    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("no busybox on this machine (hack/test installs it)")
    # BusyBox's ps rejects the procps columns: that is why the controller has a second argv.
    rejected = subprocess.run([busybox, *PS_ARGV], capture_output=True, text=True, timeout=10)
    assert rejected.returncode != 0 and "etimes" in rejected.stderr
    with subprocess.Popen(["sleep", "3600"]) as timer:
        try:
            procs = parse_ps(_run((busybox, *PS_ARGV_BUSYBOX)))
        finally:
            timer.kill()
    (mine,) = [p for p in procs if p.pid == timer.pid]
    assert mine.command == "sleep 3600" and mine.elapsed_s is None


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


# What containerd 1.6 + runc answered for a distroless container on the devcluster's real node: the
# cause comes after a 64-hex exec id, past the first 200 characters.
CONTAINERD_NO_PS = (
    "Internal error occurred: error executing command in container: failed to exec in container: "
    'failed to start exec "196ffbf624ae1dc83887bb9da1879b5a9a01fe6026390e7f342f3d2bc41f904c": OCI '
    'runtime exec failed: exec failed: unable to start container process: exec: "ps": executable '
    "file not found in $PATH: unknown"
)


def test_a_long_runtime_error_keeps_its_cause() -> None:
    s = ExecStream()
    with pytest.raises(ExecFailed) as e:
        s.feed(b"\x03" + json.dumps({"status": "Failure", "message": CONTAINERD_NO_PS}).encode())
    detail = e.value.failure.detail
    assert len(detail) <= 200 and "executable file not found" in detail
    assert detail.startswith("Internal error occurred")


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
    source = ExecProcessSource(await _kube_exec(url), timeout=5)
    out = await source.list_processes(POD)
    assert isinstance(out, SignalFailure) and out.reason is reason
    # the argv reached the apiserver as fixed, separate command parameters
    assert (
        "command=ps&command=-eo&command=pid%2Cppid%2Cstat%2Cetimes%2Cargs&container=main"
        in script["paths"][-1]
    )


async def test_exec_timeout(fake_apiserver: tuple[str, dict]) -> None:
    url, script = fake_apiserver
    script["delay"] = 2.0
    source = ExecProcessSource(await _kube_exec(url), timeout=0.3)
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
    src = ExecProcessSource(ex)
    pods = [PodRef("ns", n, "main") for n in ("ok", "exit1", "garbage", "forbidden")]
    out = await src.list_many(pods)
    assert isinstance(out[pods[0]], tuple) and len(out[pods[0]]) == 3
    assert out[pods[1]].reason is FailureReason.EXEC_ERROR  # type: ignore[union-attr]
    assert out[pods[2]].reason is FailureReason.PARSE_ERROR  # type: ignore[union-attr]
    assert out[pods[3]].reason is FailureReason.FORBIDDEN  # type: ignore[union-attr]
    # A ps that exits non-zero or prints what the parser rejects gets the BusyBox argv once more;
    # an exec that failed at the apiserver does not.
    assert sorted((pod.name, argv) for pod, argv in ex.calls) == sorted(
        [
            ("ok", PS_ARGV),
            ("exit1", PS_ARGV),
            ("exit1", PS_ARGV_BUSYBOX),
            ("garbage", PS_ARGV),
            ("garbage", PS_ARGV_BUSYBOX),
            ("forbidden", PS_ARGV),
        ]
    )


class ArgvExec:
    """A container's ps: BusyBox (rejects procps columns), procps, or none at all (distroless)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.calls: list[tuple[str, ...]] = []

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        self.calls.append(argv)
        if self.kind == "distroless":
            raise ExecFailed(
                FailureReason.EXEC_ERROR,
                'OCI runtime exec failed: exec: "ps": executable file not found in $PATH: unknown',
            )
        if self.kind == "busybox" and argv != PS_ARGV_BUSYBOX:
            return ExecResult("", "ps: bad -o argument 'etimes', supported arguments: user,pid", 1)
        return ExecResult(BUSYBOX_LISTING if self.kind == "busybox" else LISTING, "", 0)


async def test_busybox_container_gets_the_busybox_argv_and_it_is_remembered() -> None:
    ex = ArgvExec("busybox")
    src = ExecProcessSource(ex)
    first = await src.list_processes(POD)
    second = await src.list_processes(POD)
    assert isinstance(first, tuple) and first == second
    assert [p.command for p in first] == [
        "sh -c while true; do python job.py; sleep 3600; done",
        "sleep 3600",
    ]
    assert ex.calls == [PS_ARGV, PS_ARGV_BUSYBOX, PS_ARGV_BUSYBOX]


@pytest.mark.parametrize(
    "result",
    [
        ExecResult("", "sh: ps: not found", 127),
        ExecResult("", "", 126),
    ],
)
async def test_a_container_without_ps_is_no_listing(result: ExecResult) -> None:
    ex = ScriptedExec({"train-0": result})
    out = await ExecProcessSource(ex).list_processes(POD)
    assert isinstance(out, SignalFailure) and out.reason is FailureReason.NO_LISTING
    assert [argv for _, argv in ex.calls] == [PS_ARGV]  # no second try: there is no ps at all


async def test_distroless_container_is_no_listing_with_its_own_reason() -> None:
    ex = ArgvExec("distroless")
    out = await ExecProcessSource(ex).list_processes(POD)
    assert isinstance(out, SignalFailure) and out.reason is FailureReason.NO_LISTING
    assert "cannot be seen" in out.detail and "'main'" in out.detail
    assert ex.calls == [PS_ARGV]


async def test_containerds_long_not_found_error_is_no_listing() -> None:
    class Refused:
        async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
            raise ExecFailed(FailureReason.EXEC_ERROR, CONTAINERD_NO_PS)

    out = await ExecProcessSource(Refused()).list_processes(POD)
    assert isinstance(out, SignalFailure) and out.reason is FailureReason.NO_LISTING


async def test_source_bounds_concurrency() -> None:
    ex = ScriptedExec({f"p{i}": ExecResult(LISTING, "", 0) for i in range(10)}, delay=0.05)
    src = ExecProcessSource(ex, concurrency=3)
    await src.list_many([PodRef("ns", f"p{i}", "main") for i in range(10)])
    assert ex.max_running == 3


def test_merge_listings_fails_safe() -> None:
    a = (ProcessInfo(pid=1, state="S", command="python"),)
    fail = SignalFailure(reason=FailureReason.TIMEOUT)
    assert merge_listings([a, a]) == a + a
    assert merge_listings([a, fail]) == fail
    assert isinstance(merge_listings([]), SignalFailure)
