"""Process listing inside every GPU container of a workload, through the apiserver's exec endpoint.

`ProcessSource` is the seam the controller's observe room reads processes through: one batched
call per poll for every container whose workload's window is all zero. `ExecProcessSource` is the
implementation over exec; `signals.agent.AgentProcessSource` reads the node agent's per-container
counts from the poll's one PromQL query.

Safety properties (docs/design.md#signals): the argv is a module constant (no shell, nothing from the workload
or its annotations ever reaches it), it only reads, the output size and the wall time are bounded,
and the number of concurrent execs is capped by a semaphore so a poll cannot flood the apiserver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

from ghostgpu.signals.podexec import ExecFailed, PodExec, PodRef
from ghostgpu.verdict import FailureReason, ProcessCounts, ProcessInfo, SignalFailure, program_of

# procps (Debian, Ubuntu, UBI, Alpine's procps): pid, parent, state, seconds since start, and the
# command line last, so whatever it contains cannot shift the other columns. The arguments are what
# tells `sleep 3600` (a timer between periodic runs) from `sleep infinity` (a holder).
PS_ARGV: tuple[str, ...] = ("ps", "-eo", "pid,ppid,stat,etimes,args")
# BusyBox (Alpine, distroless :debug images) has no etimes; the rest is the same.
PS_ARGV_BUSYBOX: tuple[str, ...] = ("ps", "-eo", "pid,ppid,stat,args")
LISTING_ARGVS: tuple[tuple[str, ...], ...] = (PS_ARGV, PS_ARGV_BUSYBOX)
_HEADERS = {
    ("PID", "PPID", "STAT", "ELAPSED", "COMMAND"): True,  # True: has the elapsed column
    ("PID", "PPID", "STAT", "COMMAND"): False,
}
_VALID_STATE = set("RSDZTtWXIKPLNsl<+")
MAX_ARGS = 512  # characters of a command line kept: enough for the program and its first arguments
# Our own probes show up in the listing they produce (exec'd, so their parent is outside: ppid 0).
_PROBES = frozenset({"ps", "du", "ls"})
# An exec whose program does not exist: the runtime's message, or a shell-style exit code.
_NOT_FOUND_MARKERS = ("executable file not found", "no such file or directory", "not found in $path")
_NOT_FOUND_EXIT = (126, 127)
_VARIANT_MEMORY = 50_000  # containers whose working listing variant is remembered


class MalformedListing(ValueError):
    pass


# procps computes etimes as uptime minus start time, both rounded, in an unsigned long: a process
# started within the current clock tick reads as about 2**32 seconds old.
_WRAPPED_ELAPSED = 2**31


def parse_ps(text: str, *, scope: str = "") -> tuple[ProcessInfo, ...]:
    """Parse the output of one of `LISTING_ARGVS` (header first); drops the probes' own processes.

    Raises MalformedListing on empty output, an unknown header, and any row that is not
    "<pid> <ppid> <state> [<elapsed>] <command>". A header with no rows (other than the probe)
    parses as no processes: `ps` ran and saw nothing else.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise MalformedListing("empty output")
    header = tuple(lines[0].split())
    if header not in _HEADERS:
        raise MalformedListing(f"unexpected header {lines[0][:80]!r}, want 'PID PPID STAT [ELAPSED] COMMAND'")
    has_elapsed = _HEADERS[header]
    fixed = 4 if has_elapsed else 3
    procs: list[ProcessInfo] = []
    for lineno, line in enumerate(lines[1:], 2):
        parts = line.split(None, fixed)
        if len(parts) < fixed:
            raise MalformedListing(
                f"line {lineno}: expected {' '.join(header[:fixed]).lower()} ..., got {line[:80]!r}"
            )
        pid_s, ppid_s, stat = parts[0], parts[1], parts[2]
        command = parts[fixed].strip()[:MAX_ARGS] if len(parts) > fixed else ""
        if not pid_s.isdigit() or int(pid_s) < 1:
            raise MalformedListing(f"line {lineno}: pid not a positive integer: {line[:80]!r}")
        if not ppid_s.isdigit():
            raise MalformedListing(f"line {lineno}: ppid not an integer: {line[:80]!r}")
        if not set(stat) <= _VALID_STATE or not stat[0].isupper():
            raise MalformedListing(f"line {lineno}: unknown process state {stat!r}")
        elapsed: int | None = None
        if has_elapsed:
            if not parts[3].isdigit():
                raise MalformedListing(f"line {lineno}: elapsed seconds not an integer: {line[:80]!r}")
            elapsed = int(parts[3])
            if elapsed >= _WRAPPED_ELAPSED:  # procps: a process younger than a clock tick wraps below 0
                elapsed = 0
        pid, ppid = int(pid_s), int(ppid_s)
        if pid != 1 and ppid == 0 and program_of(command)[0] in _PROBES:
            continue
        procs.append(
            ProcessInfo(pid=pid, state=stat, command=command, ppid=ppid, elapsed_s=elapsed, scope=scope)
        )
    return tuple(procs)


def _not_found(text: str) -> bool:
    low = text.lower()
    return any(m in low for m in _NOT_FOUND_MARKERS)


def no_listing(pod: PodRef, detail: str) -> SignalFailure:
    return SignalFailure(
        reason=FailureReason.NO_LISTING,
        detail=f"container {pod.container!r} has no usable ps ({detail[:120]}): its processes cannot be seen",
    )


# Rows (exec'd `ps`), per-role counts (the node agent classified the rows on the node), or a failure.
Listing = tuple[ProcessInfo, ...] | ProcessCounts | SignalFailure


class ProcessSource(Protocol):
    """Where a poll's process listings come from. Never raises: a container that cannot be listed
    is a SignalFailure (the verdict stays UNKNOWN, never reclaims)."""

    async def list_many(self, pods: Sequence[PodRef]) -> Mapping[PodRef, Listing]: ...


class ExecProcessSource:
    """Lists processes in many containers with bounded concurrency; never raises.

    Tries the procps listing, then the BusyBox one, and remembers per container which one works
    (one exec per container per poll after the first). A container without `ps` at all is a
    `no-listing` failure: the verdict cannot see its processes and stays UNKNOWN."""

    def __init__(self, executor: PodExec, *, concurrency: int = 4, timeout: float = 10.0) -> None:
        self.executor = executor
        self.timeout = timeout
        self._sem = asyncio.Semaphore(concurrency)
        self._variant: dict[PodRef, int] = {}

    async def list_processes(self, pod: PodRef) -> tuple[ProcessInfo, ...] | SignalFailure:
        first = self._variant.get(pod, 0)
        outcome: tuple[ProcessInfo, ...] | SignalFailure = SignalFailure(reason=FailureReason.OTHER)
        for index in range(first, len(LISTING_ARGVS)):
            outcome, retry = await self._try(pod, LISTING_ARGVS[index])
            if not retry:
                if not isinstance(outcome, SignalFailure):
                    if len(self._variant) >= _VARIANT_MEMORY:
                        self._variant.clear()
                    self._variant[pod] = index
                return outcome
        return outcome

    async def _try(
        self, pod: PodRef, argv: tuple[str, ...]
    ) -> tuple[tuple[ProcessInfo, ...] | SignalFailure, bool]:
        """(outcome, whether the next listing variant may do better)."""
        async with self._sem:
            try:
                result = await self.executor.run(pod, argv, timeout=self.timeout)
            except ExecFailed as exc:
                if exc.failure.reason is FailureReason.EXEC_ERROR and _not_found(exc.failure.detail):
                    return no_listing(pod, exc.failure.detail), False
                return exc.failure, False
        if result.returncode != 0:
            if result.returncode in _NOT_FOUND_EXIT or _not_found(result.stderr):
                return no_listing(pod, f"exit {result.returncode}"), False
            # A ps that rejects these columns (BusyBox: "bad -o argument"): the next variant may work.
            failure = SignalFailure(
                reason=FailureReason.EXEC_ERROR,
                detail=f"ps exited {result.returncode}: {result.stderr[:120]!r}",
            )
            return failure, True
        try:
            return parse_ps(result.stdout, scope=f"{pod.name}/{pod.container}"), False
        except MalformedListing as exc:
            return SignalFailure(reason=FailureReason.PARSE_ERROR, detail=str(exc)[:200]), True

    async def list_many(
        self, pods: Sequence[PodRef]
    ) -> dict[PodRef, tuple[ProcessInfo, ...] | SignalFailure]:
        results = await asyncio.gather(*(self.list_processes(p) for p in pods))
        return dict(zip(pods, results, strict=True))


def merge_listings(listings: Sequence[Listing]) -> Listing:
    """A workload's processes across its pods and GPU containers: rows joined, counts summed (`+`);
    any one failing fails the workload (fail safe: an unseen container may be the one doing the
    work). One source gives one form; both at once is a failure, never a guess."""
    if not listings:
        return SignalFailure(reason=FailureReason.MISSING, detail="no pod to list")
    for listing in listings:
        if isinstance(listing, SignalFailure):
            return listing
    counts = [x for x in listings if isinstance(x, ProcessCounts)]
    if counts:
        if len(counts) != len(listings):
            return SignalFailure(reason=FailureReason.OTHER, detail="rows and counts for one workload")
        total = counts[0]
        for c in counts[1:]:
            total = total + c
        return total
    merged: list[ProcessInfo] = []
    for listing in listings:
        merged.extend(listing)  # type: ignore[arg-type]
    return tuple(merged)
