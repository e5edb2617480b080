"""Artifact growth: the size of a workload's declared output location (`ghostgpu.io/artifacts`).

- `file:///abs/path`: measured inside the GPU container with a fixed argv (`du -sk -- PATH`, then
  `ls -1a -- PATH` for the completion marker). PATH comes from an annotation, i.e. from the
  workload's owner, so it is validated strictly (absolute, normalised, a conservative character set)
  and passed as one argv element after `--`: there is no shell to interpret it and it cannot
  become an option.
- `s3://bucket/prefix`: listed with boto3 against a configurable endpoint; size = sum of object
  sizes under the prefix.

The tracker keeps one size per poll so that `ArtifactSizes` compares window start with window end.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ghostgpu.signals.podexec import ExecFailed, PodExec, PodRef
from ghostgpu.verdict import (
    ArtifactObservation,
    ArtifactSizes,
    ArtifactsNotDeclared,
    FailureReason,
    SignalFailure,
)

COMPLETION_MARKER = "_SUCCESS"
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/@+=,-]*$")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
DU_ARGV_PREFIX: tuple[str, ...] = ("du", "-sk", "--")  # -k: busybox and coreutils agree on it
LS_ARGV_PREFIX: tuple[str, ...] = ("ls", "-1a", "--")


class InvalidArtifactURI(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class FileTarget:
    path: str


@dataclass(frozen=True, slots=True)
class S3Target:
    bucket: str
    prefix: str


ArtifactTarget = FileTarget | S3Target


def validate_container_path(path: str) -> str:
    """Accept only an absolute, already-normalised path made of safe characters."""
    if len(path) > 1024:
        raise InvalidArtifactURI("path longer than 1024 characters")
    if not _SAFE_PATH.match(path):
        raise InvalidArtifactURI(f"path must be absolute and use only [A-Za-z0-9._/@+=,-]: {path[:80]!r}")
    if posixpath.normpath(path) != path or "/../" in f"{path}/" or "/./" in f"{path}/":
        raise InvalidArtifactURI(f"path must be normalised (no '.', '..', '//', trailing '/'): {path!r}")
    return path


def parse_artifact_uri(uri: str) -> ArtifactTarget:
    """Parse the `ghostgpu.io/artifacts` annotation. Raises InvalidArtifactURI."""
    uri = uri.strip()
    try:
        parts = urlsplit(uri)
    except ValueError as exc:  # e.g. "s3://[": urlsplit's own error must not escape as a crash
        raise InvalidArtifactURI(f"malformed artifact URI: {exc}") from None
    if parts.query or parts.fragment:
        raise InvalidArtifactURI("artifact URI must not carry a query or fragment")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidArtifactURI("file:// URI must be file:///absolute/path")
        return FileTarget(validate_container_path(parts.path))
    if parts.scheme == "s3":
        if not _S3_BUCKET.match(parts.netloc):
            raise InvalidArtifactURI(f"invalid S3 bucket name {parts.netloc!r}")
        return S3Target(bucket=parts.netloc, prefix=parts.path.lstrip("/"))
    raise InvalidArtifactURI(f"unsupported artifact scheme {parts.scheme!r} (file:// or s3://)")


@dataclass(frozen=True, slots=True)
class Measurement:
    size_bytes: int
    completion_marker: bool


def parse_du(text: str, path: str) -> int:
    """`du -sk -- PATH` prints "<KiB>\\t<PATH>"; returns bytes."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) != 1:
        raise ValueError(f"expected one du line, got {len(lines)}")
    kib, _, printed = lines[0].partition("\t")
    if not kib.strip().isdigit() or printed.strip() != path:
        raise ValueError(f"unexpected du output {lines[0][:80]!r}")
    return int(kib) * 1024


class FileArtifactProbe:
    def __init__(self, executor: PodExec, *, timeout: float = 10.0) -> None:
        self.executor = executor
        self.timeout = timeout

    async def measure(self, pod: PodRef, target: FileTarget) -> Measurement | SignalFailure:
        try:
            du = await self.executor.run(pod, (*DU_ARGV_PREFIX, target.path), timeout=self.timeout)
            if du.returncode != 0:
                reason = FailureReason.NOT_FOUND if "No such file" in du.stderr else FailureReason.EXEC_ERROR
                return SignalFailure(reason=reason, detail=f"du exited {du.returncode}: {du.stderr[:120]}")
            size = parse_du(du.stdout, target.path)
            ls = await self.executor.run(pod, (*LS_ARGV_PREFIX, target.path), timeout=self.timeout)
        except ExecFailed as exc:
            return exc.failure
        except ValueError as exc:
            return SignalFailure(reason=FailureReason.PARSE_ERROR, detail=str(exc))
        # A failing `ls` only loses the optional marker, not the size.
        marker = ls.returncode == 0 and COMPLETION_MARKER in ls.stdout.split()
        return Measurement(size, marker)


class S3ArtifactProbe:
    """Lists an S3 prefix with boto3 (blocking, so it runs in a worker thread)."""

    def __init__(
        self,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        timeout: float = 10.0,
        max_keys: int = 100_000,
        client: Any | None = None,
    ) -> None:
        self.timeout = timeout
        self.max_keys = max_keys
        self._client = client
        self._endpoint_url, self._region = endpoint_url, region
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """Made on first use: boto3 and a client cost ~30 MB of RSS, paid only by controllers that
        meet an `s3://` artifact annotation. Listings run in worker threads, hence the lock."""
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                self._client = boto3.client(
                    "s3",
                    endpoint_url=self._endpoint_url,
                    region_name=self._region or "us-east-1",
                    config=Config(
                        connect_timeout=self.timeout,
                        read_timeout=self.timeout,
                        retries={"max_attempts": 1},
                        s3={"addressing_style": "path"},
                    ),
                )
            return self._client

    def _list(self, target: S3Target) -> Measurement:
        total, seen, marker = 0, 0, False
        paginator = self.client.get_paginator("list_objects_v2")
        marker_key = (
            f"{target.prefix.rstrip('/')}/{COMPLETION_MARKER}" if target.prefix else COMPLETION_MARKER
        )
        for page in paginator.paginate(Bucket=target.bucket, Prefix=target.prefix):
            for obj in page.get("Contents", []):
                total += int(obj["Size"])
                marker = marker or obj["Key"] == marker_key
                seen += 1
                if seen > self.max_keys:
                    raise OverflowError(f"more than {self.max_keys} objects under the prefix")
        return Measurement(total, marker)

    async def measure(self, target: S3Target) -> Measurement | SignalFailure:
        from botocore.exceptions import BotoCoreError, ClientError, ConnectTimeoutError, ReadTimeoutError

        try:
            return await asyncio.wait_for(asyncio.to_thread(self._list, target), self.timeout * 2)
        except (TimeoutError, ConnectTimeoutError, ReadTimeoutError) as exc:
            return SignalFailure(reason=FailureReason.TIMEOUT, detail=f"s3 listing: {type(exc).__name__}")
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if code in ("NoSuchBucket", "NoSuchKey") or status == 404:
                reason = FailureReason.NOT_FOUND
            elif code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status == 403:
                reason = FailureReason.FORBIDDEN
            else:
                reason = FailureReason.HTTP_ERROR
            return SignalFailure(reason=reason, detail=f"s3 {code or status}")
        except (BotoCoreError, OverflowError, OSError) as exc:
            return SignalFailure(
                reason=FailureReason.HTTP_ERROR, detail=f"s3 {type(exc).__name__}: {exc}"[:200]
            )


@dataclass(slots=True)
class ArtifactHistory:
    """One measurement (or failure) per poll for one workload, oldest first. An exact-size tuple
    (empty, the shared `()`, for the many workloads that declare no artifacts), not a deque."""

    size: int
    _items: tuple[Measurement | SignalFailure | None, ...] = ()

    def push(self, item: Measurement | SignalFailure | None) -> None:
        """`None` records a poll on which artifacts were not measured (window not yet zero)."""
        kept = self._items
        if len(kept) >= self.size:
            kept = kept[len(kept) - self.size + 1 :]
        self._items = (*kept, item)

    def clear(self) -> None:
        self._items = ()

    def observation(self, window: int) -> ArtifactObservation:
        """Window start = the measurement `window - 1` polls ago, window end = the newest one."""
        items = self._items
        if len(items) < window:
            return SignalFailure(reason=FailureReason.MISSING, detail="no measurement at window start yet")
        start, end = items[-window], items[-1]
        for item, name in ((end, "end"), (start, "start")):
            if isinstance(item, SignalFailure):
                return item
            if item is None:
                return SignalFailure(reason=FailureReason.MISSING, detail=f"not measured at window {name}")
        assert isinstance(start, Measurement) and isinstance(end, Measurement)
        return ArtifactSizes(
            start_bytes=start.size_bytes, end_bytes=end.size_bytes, completion_marker=end.completion_marker
        )


def not_declared() -> ArtifactObservation:
    return ArtifactsNotDeclared()
