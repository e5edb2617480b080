"""Artifact signal: URI/path validation, the fixed-argv `du`/`ls` probe (run for real through a local
executor), window start/end bookkeeping, and S3 listing against a real S3-compatible server on
127.0.0.1 (versitygw with its posix backend when built into ~/.cache/ghostgpu; moto's server mode
otherwise)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from ghostgpu.signals.artifacts import (
    ArtifactHistory,
    FileArtifactProbe,
    FileTarget,
    InvalidArtifactURI,
    Measurement,
    S3ArtifactProbe,
    S3Target,
    parse_artifact_uri,
    parse_du,
)
from ghostgpu.signals.podexec import ExecFailed, ExecResult, PodRef
from ghostgpu.signals.processes import PS_ARGV, parse_ps
from ghostgpu.verdict import ArtifactSizes, FailureReason, SignalFailure

POD = PodRef("team-a", "train-0", "main")
ACCESS, SECRET = "ghostgpu-test", "ghostgpu-test-secret"


class LocalExec:
    """Runs the probe's argv as a local process: the same argv a container would get, no shell."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        self.calls.append(argv)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        return ExecResult(out.decode(), err.decode(), proc.returncode or 0)


# --- URI and path validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "target"),
    [
        ("file:///data/ckpt", FileTarget("/data/ckpt")),
        ("file://localhost/out/run-1.2", FileTarget("/out/run-1.2")),
        ("s3://ckpt-bucket/runs/7/", S3Target("ckpt-bucket", "runs/7/")),
        ("s3://ckpt-bucket", S3Target("ckpt-bucket", "")),
    ],
)
def test_parse_valid_uris(uri: str, target: object) -> None:
    assert parse_artifact_uri(uri) == target


@pytest.mark.parametrize(
    "uri",
    [
        "file://data/ckpt",  # host part, not an absolute path
        "file:///data/../etc",  # traversal
        "file:///data/./x",
        "file:///data//x",
        "file:///data/x/",
        "file:///data/$(reboot)",  # shell metacharacters never reach anything, but are refused
        "file:///data/a;b",
        "file:///data/a b",
        "file:///-rf",  # fine as a path, but starts with a dash: still passed after `--`
        "file:///data/x?y=1",
        "http://example/x",
        "s3://UPPER/x",
        "relative/path",
    ],
)
def test_parse_rejects_unsafe_or_unsupported_uris(uri: str) -> None:
    if uri == "file:///-rf":
        assert parse_artifact_uri(uri) == FileTarget("/-rf")
        return
    with pytest.raises(InvalidArtifactURI):
        parse_artifact_uri(uri)


def test_parse_du() -> None:
    assert parse_du("1234\t/data/ckpt\n", "/data/ckpt") == 1234 * 1024
    for bad in ("", "12\t/other\n", "x\t/data/ckpt\n", "1\t/data/ckpt\n2\t/data/ckpt\n"):
        with pytest.raises(ValueError):
            parse_du(bad, "/data/ckpt")


# --- the real probe commands ----------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("du") is None, reason="du not installed")
async def test_file_probe_measures_growth_and_marker_with_real_du(tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "step-1.pt").write_bytes(os.urandom(64 * 1024))
    ex = LocalExec()
    probe = FileArtifactProbe(ex)
    first = await probe.measure(POD, FileTarget(str(out)))
    assert isinstance(first, Measurement) and first.size_bytes >= 64 * 1024 and not first.completion_marker
    (out / "step-2.pt").write_bytes(os.urandom(64 * 1024))
    (out / "_SUCCESS").write_bytes(b"")
    second = await probe.measure(POD, FileTarget(str(out)))
    assert isinstance(second, Measurement)
    assert second.size_bytes > first.size_bytes and second.completion_marker
    assert ex.calls[0] == ("du", "-sk", "--", str(out))
    assert ex.calls[1] == ("ls", "-1a", "--", str(out))


@pytest.mark.skipif(shutil.which("du") is None, reason="du not installed")
async def test_file_probe_missing_path_is_not_found(tmp_path: Path) -> None:
    got = await FileArtifactProbe(LocalExec()).measure(POD, FileTarget(str(tmp_path / "nope")))
    assert isinstance(got, SignalFailure) and got.reason is FailureReason.NOT_FOUND


async def test_file_probe_exec_failures() -> None:
    class Forbidden:
        async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
            raise ExecFailed(FailureReason.FORBIDDEN, "HTTP 403")

    class Garbage:
        async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
            return ExecResult("du: invalid option\n", "", 0)

    f = await FileArtifactProbe(Forbidden()).measure(POD, FileTarget("/data"))
    assert isinstance(f, SignalFailure) and f.reason is FailureReason.FORBIDDEN
    g = await FileArtifactProbe(Garbage()).measure(POD, FileTarget("/data"))
    assert isinstance(g, SignalFailure) and g.reason is FailureReason.PARSE_ERROR


@pytest.mark.skipif(shutil.which("ps") is None, reason="ps not installed")
async def test_real_ps_output_parses() -> None:
    result = await LocalExec().run(POD, PS_ARGV, timeout=10)
    procs = parse_ps(result.stdout)
    assert any(p.pid == os.getpid() for p in procs)


# --- window bookkeeping ---------------------------------------------------------------------------


def test_history_compares_window_start_with_end() -> None:
    h = ArtifactHistory(size=10)
    for size in (100, 200, 300, 300, 300):
        h.push(Measurement(size, False))
    assert h.observation(3) == ArtifactSizes(start_bytes=300, end_bytes=300)
    assert h.observation(4) == ArtifactSizes(start_bytes=200, end_bytes=300)
    assert isinstance(h.observation(6), SignalFailure)  # not enough history: never "unchanged"
    h.push(None)
    assert h.observation(3).reason is FailureReason.MISSING  # type: ignore[union-attr]
    h.push(SignalFailure(reason=FailureReason.TIMEOUT))
    assert h.observation(2).reason is FailureReason.TIMEOUT  # type: ignore[union-attr]


# --- S3 against a real local server ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


VERSITYGW_VERSION = "v1.8.0"


def _versitygw() -> str | None:
    """The versitygw binary: $GHOSTGPU_VERSITYGW, the cache, PATH, or built once from the Go module
    proxy into ~/.cache/ghostgpu/versitygw-<version>/bin (a couple of minutes, then cached)."""
    if os.environ.get("GHOSTGPU_VERSITYGW"):
        return os.environ["GHOSTGPU_VERSITYGW"]
    bindir = Path.home() / ".cache" / "ghostgpu" / f"versitygw-{VERSITYGW_VERSION}" / "bin"
    if (bindir / "versitygw").exists():
        return str(bindir / "versitygw")
    if shutil.which("versitygw"):
        return shutil.which("versitygw")
    if shutil.which("go") is None:
        return None
    bindir.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            ["go", "install", f"github.com/versity/versitygw/cmd/versitygw@{VERSITYGW_VERSION}"],
            env={**os.environ, "GOBIN": str(bindir), "GOFLAGS": "-mod=mod"},
            check=True,
            capture_output=True,
            timeout=900,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    return str(bindir / "versitygw") if (bindir / "versitygw").exists() else None


def _wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"S3 server did not listen on {port}")


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(endpoint URL, which server). versitygw preferred; moto's server only as a fallback."""
    port = _free_port()
    binary = _versitygw()
    if binary:
        root = tmp_path_factory.mktemp("s3root")
        proc = subprocess.Popen(
            [
                binary,
                "--access",
                ACCESS,
                "--secret",
                SECRET,
                "--port",
                f"127.0.0.1:{port}",
                "--quiet",
                "posix",
                "--nometa",
                str(root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_port(port)
            yield f"http://127.0.0.1:{port}", "versitygw"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        return
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        pytest.skip("no S3-compatible server: build versitygw into ~/.cache/ghostgpu or install moto[server]")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", "moto"
    finally:
        server.stop()


def _client(endpoint: str, secret: str = SECRET):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS,
        aws_secret_access_key=secret,
        region_name="us-east-1",
    )


async def test_s3_prefix_size_growth_and_marker(s3_server: tuple[str, str]) -> None:
    endpoint, _ = s3_server
    c = _client(endpoint)
    c.create_bucket(Bucket="ckpt")
    probe = S3ArtifactProbe(client=_client(endpoint), timeout=5)
    target = S3Target("ckpt", "runs/7/")
    empty = await probe.measure(target)
    assert empty == Measurement(0, False)
    c.put_object(Bucket="ckpt", Key="runs/7/step-1.pt", Body=b"x" * 1000)
    c.put_object(Bucket="ckpt", Key="runs/8/other.pt", Body=b"y" * 5000)  # another prefix: ignored
    assert await probe.measure(target) == Measurement(1000, False)
    c.put_object(Bucket="ckpt", Key="runs/7/step-2.pt", Body=b"x" * 500)
    c.put_object(Bucket="ckpt", Key="runs/7/_SUCCESS", Body=b"")
    assert await probe.measure(target) == Measurement(1500, True)


async def test_s3_endpoint_from_config(s3_server: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, _ = s3_server
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    _client(endpoint).create_bucket(Bucket="cfg-bucket")
    probe = S3ArtifactProbe(endpoint_url=endpoint, timeout=5)
    assert await probe.measure(S3Target("cfg-bucket", "")) == Measurement(0, False)


async def test_s3_missing_bucket_and_bad_credentials(s3_server: tuple[str, str]) -> None:
    endpoint, which = s3_server
    missing = await S3ArtifactProbe(client=_client(endpoint), timeout=5).measure(
        S3Target("no-such-bucket", "x")
    )
    assert isinstance(missing, SignalFailure) and missing.reason is FailureReason.NOT_FOUND
    if which == "versitygw":  # moto accepts any credentials
        _client(endpoint).create_bucket(Bucket="auth-bucket")
        denied = await S3ArtifactProbe(client=_client(endpoint, secret="wrong"), timeout=5).measure(
            S3Target("auth-bucket", "")
        )
        assert isinstance(denied, SignalFailure) and denied.reason is FailureReason.FORBIDDEN


async def test_s3_timeout_against_a_silent_server() -> None:
    """A server that accepts the connection and never answers: the listing must time out."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(sock.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=ACCESS,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
            config=Config(connect_timeout=0.5, read_timeout=0.5, retries={"max_attempts": 1}),
        )
        probe = S3ArtifactProbe(client=client, timeout=0.5)
        t0 = time.monotonic()
        got = await probe.measure(S3Target("ckpt", ""))
        assert time.monotonic() - t0 < 3
        assert isinstance(got, SignalFailure) and got.reason is FailureReason.TIMEOUT
    finally:
        stop.set()
        t.join()
        for c in conns:
            c.close()
        sock.close()
