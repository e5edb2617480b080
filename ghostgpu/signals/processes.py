"""Process listing inside the workload's GPU container, through the apiserver's exec endpoint.

Safety properties (DESIGN §4): the argv is a module constant (no shell, nothing from the workload
or its annotations ever reaches it), it only reads, the output size and the wall time are bounded,
and the number of concurrent execs is capped by a semaphore so a poll cannot flood the apiserver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ghostgpu.signals.podexec import ExecFailed, PodExec, PodRef
from ghostgpu.verdict import FailureReason, ProcessInfo, SignalFailure

# `ps -eo pid,stat,comm` prints a header ("PID STAT COMMAND") and one row per process. comm (not
# args) is the kernel's 15-char name; being the last column, whatever it contains cannot shift the
# other columns. Busybox and procps both accept this argv.
PS_ARGV: tuple[str, ...] = ("ps", "-eo", "pid,stat,comm")
_VALID_STATE = set("RSDZTtWXIKPLNsl<+")
_HEADER = ("PID", "STAT", "COMMAND")


class MalformedListing(ValueError):
    pass


def parse_ps(text: str) -> tuple[ProcessInfo, ...]:
    """Parse `ps -eo pid,stat,comm` output (header first); drops the probe's own `ps` process.

    Raises MalformedListing on empty output, when the header is not PID/STAT/COMMAND, and on any
    row that is not "<pid> <state> <command>". A header with no rows (other than the probe) parses
    as no processes: `ps` ran and saw nothing else.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise MalformedListing("empty output")
    header = tuple(lines[0].split())
    if header != _HEADER:
        raise MalformedListing(f"unexpected header {lines[0][:80]!r}, want 'PID STAT COMMAND'")
    procs: list[ProcessInfo] = []
    for lineno, line in enumerate(lines[1:], 2):
        parts = line.split(None, 2)
        if len(parts) < 2:
            raise MalformedListing(f"line {lineno}: expected pid stat command, got {line[:80]!r}")
        pid_s, stat = parts[0], parts[1]
        command = parts[2].strip() if len(parts) == 3 else ""
        if not pid_s.isdigit() or int(pid_s) < 1:
            raise MalformedListing(f"line {lineno}: pid not a positive integer: {line[:80]!r}")
        if not set(stat) <= _VALID_STATE or not stat[0].isupper():
            raise MalformedListing(f"line {lineno}: unknown process state {stat!r}")
        # Our own probe shows up in its listing; it is not the workload's (pid 1 is never the probe).
        if command == "ps" and pid_s != "1":
            continue
        procs.append(ProcessInfo(pid=int(pid_s), state=stat, command=command))
    return tuple(procs)


# Processes that only keep a container alive: a sleeping init/entrypoint that does no work. A
# terminal-attached shell (STAT has '+': someone's `kubectl exec -it`) is never one of them.
IDLE_HOLDERS = frozenset({"sleep", "pause", "tini", "dumb-init", "catatonit", "sh", "bash", "dash", "ash"})


def without_idle_holders(
    listing: tuple[ProcessInfo, ...] | SignalFailure | None,
    holders: frozenset[str] = IDLE_HOLDERS,
) -> tuple[tuple[ProcessInfo, ...] | SignalFailure | None, int]:
    """Drop idle holders, but only when nothing else non-defunct runs beside them.

    Why: a real container always has a pid 1; `sh -c "train.py; sleep infinity"` after training
    leaves `sh` + `sleep`, which is no work. If any other live process exists, the listing is kept
    whole (the holders may be its parents). Returns (listing, holders dropped).
    """
    if not isinstance(listing, tuple):
        return listing, 0
    live = [p for p in listing if not p.defunct]
    is_holder = [p.command in holders and p.state[:1] in ("S", "I", "T") and "+" not in p.state for p in live]
    if not live or not all(is_holder):
        return listing, 0
    kept = tuple(p for p in listing if p.defunct)
    return kept, len(listing) - len(kept)


class ProcessSource:
    """Lists processes in many containers with bounded concurrency; never raises."""

    def __init__(self, executor: PodExec, *, concurrency: int = 4, timeout: float = 10.0) -> None:
        self.executor = executor
        self.timeout = timeout
        self._sem = asyncio.Semaphore(concurrency)

    async def list_processes(self, pod: PodRef) -> tuple[ProcessInfo, ...] | SignalFailure:
        async with self._sem:
            try:
                result = await self.executor.run(pod, PS_ARGV, timeout=self.timeout)
            except ExecFailed as exc:
                return exc.failure
        if result.returncode != 0:
            return SignalFailure(
                reason=FailureReason.EXEC_ERROR,
                detail=f"ps exited {result.returncode}: {result.stderr[:120]!r}",
            )
        try:
            return parse_ps(result.stdout)
        except MalformedListing as exc:
            return SignalFailure(reason=FailureReason.PARSE_ERROR, detail=str(exc)[:200])

    async def list_many(
        self, pods: Sequence[PodRef]
    ) -> dict[PodRef, tuple[ProcessInfo, ...] | SignalFailure]:
        results = await asyncio.gather(*(self.list_processes(p) for p in pods))
        return dict(zip(pods, results, strict=True))


def merge_listings(
    listings: Sequence[tuple[ProcessInfo, ...] | SignalFailure],
) -> tuple[ProcessInfo, ...] | SignalFailure:
    """A workload's processes across its pods; any pod failing fails the workload (fail safe)."""
    merged: list[ProcessInfo] = []
    for listing in listings:
        if isinstance(listing, SignalFailure):
            return listing
        merged.extend(listing)
    if not listings:
        return SignalFailure(reason=FailureReason.MISSING, detail="no pod to list")
    return tuple(merged)
