"""Every pod container's processes from a proc root, as the container's own `ps` would list them.

One pass over `<proc>/<pid>/` reads, per host process: `cgroup` (which pod and container:
`ghostgpu.agent.cgroups`), and for the processes of the containers asked for, `stat`, `status`
(NSpid, VmLck) and `cmdline`. `rows()` then turns a container's host processes into the
`ProcessInfo` rows `ps -eo pid,ppid,stat,etimes,args` prints inside it (procps' columns):

- pid: the process's pid in the container's pid namespace (its NSpid field at that depth);
- ppid: the parent's pid there when the parent is in the same pid namespace (same group, NSpid
  that deep), else 0: what `ps` prints for the container's pid 1 and for anything exec'd into it;
- stat: the state letter, `<`/`N` (nice), `L` (locked pages), `s` (session leader), `l`
  (multi-threaded), `+` (in its terminal's foreground process group), in procps' order;
- etimes: whole seconds since the process started (the proc root's uptime minus its start time);
- args: the command line, NULs and newlines as spaces, other control characters as `?` (procps
  in a UTF-8 locale); an empty one is `[comm]`,
  a zombie's `[comm] <defunct>`; cut at the exec listing's MAX_ARGS.

A process that exits while it is read is skipped: it is not there any more, which is no error.
On cgroup v1 the kernel prints an exited process's cgroups as `/`: a zombie is placed with its
parent (a zombie's parent is the one that has not reaped it, in the container).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ghostgpu.agent.cgroups import ContainerRef, container_of
from ghostgpu.signals.processes import MAX_ARGS
from ghostgpu.verdict import ProcessInfo

_CLK_TCK = os.sysconf("SC_CLK_TCK")
# A process gone between the directory listing and the read (ESRCH reads as ProcessLookupError).
_GONE = (FileNotFoundError, ProcessLookupError)
# procps in a UTF-8 locale: a newline prints as a space, any other control character (C0, DEL,
# C1) and every undecodable byte as '?'.
_CONTROL = {c: "?" for c in [*range(0x20), *range(0x7F, 0xA0), 0xFFFD]} | {0x0A: " "}


class ProcUnreadable(OSError):
    """The proc root itself cannot be listed: nothing about any container can be said."""


@dataclass(frozen=True, slots=True)
class HostProcess:
    pid: int  # in the proc root's pid namespace (the host's, for the agent)
    ppid: int
    nspid: tuple[int, ...]  # its pid in each pid namespace, outermost first (status NSpid)
    container: ContainerRef
    stat: str  # ps STAT
    elapsed_s: int
    args: str  # ps args, already cut

    def pid_at(self, depth: int) -> int:
        return self.nspid[depth - 1]


@dataclass(frozen=True, slots=True)
class ProcScan:
    processes: dict[int, HostProcess]  # host pid -> process, for the containers asked for
    scanned: int  # host pids looked at
    # Host pids whose files exist but could not be read (permission): they could be anyone's, so
    # the caller may not call any container's listing complete.
    unreadable: int


def _read(path: str) -> bytes:
    # os.open/os.read, not open(): no buffered file object per file (4 files per process, 10k+
    # processes per scan). /proc files of a process fit in one page but cmdline may not.
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        os.close(fd)


def uptime_s(proc: Path) -> float:
    return float((proc / "uptime").read_text().split()[0])


def stat_column(fields: list[str], pid: int, vm_locked_kb: int) -> str:
    """procps' STAT (ps/output.c pr_stat) from /proc/<pid>/stat's fields after the comm. The ids
    are the proc root's; compared with each other they say what the container's own ids would."""
    state, pgrp, session, tpgid = fields[0], int(fields[2]), int(fields[3]), int(fields[5])
    nice, threads = int(fields[16]), int(fields[17])
    out = state
    if nice < 0:
        out += "<"
    elif nice > 0:
        out += "N"
    if vm_locked_kb:
        out += "L"
    if session == pid:
        out += "s"
    if threads > 1:
        out += "l"
    if tpgid == pgrp:  # without a terminal tpgid is -1
        out += "+"
    return out


def _args(cmdline: bytes, comm: str, state: str) -> str:
    if state in ("Z", "X"):
        return f"[{comm}] <defunct>"
    text = cmdline.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace").translate(_CONTROL)
    if not text.strip():
        return f"[{comm}]"
    return text.strip()[:MAX_ARGS]


def read_process(proc: Path, pid: int, container: ContainerRef, uptime: float) -> HostProcess | None:
    """One host process's ps columns; None when it exited meanwhile."""
    base = f"{proc}/{pid}"
    try:
        stat = _read(f"{base}/stat").decode("utf-8", "replace")
        status = _read(f"{base}/status").decode("utf-8", "replace")
        cmdline = _read(f"{base}/cmdline")
    except _GONE:
        return None
    if not stat:
        return None
    # comm may hold spaces and parentheses: it ends at the last ')'.
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    nspid: tuple[int, ...] = ()
    vm_locked = 0
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            nspid = tuple(int(x) for x in line.split()[1:])
        elif line.startswith("VmLck:"):
            vm_locked = int(line.split()[1])
    if not nspid:
        nspid = (pid,)  # a kernel before 4.1: no NSpid (then no nested pid namespace is visible)
    started_s = int(fields[19]) / _CLK_TCK
    return HostProcess(
        pid=pid,
        ppid=int(fields[1]),
        nspid=nspid,
        container=container,
        stat=stat_column(fields, pid, vm_locked),
        elapsed_s=max(0, int(uptime - started_s)),
        args=_args(cmdline, comm, fields[0]),
    )


def pids(proc: Path) -> list[int]:
    try:
        return [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError as exc:
        raise ProcUnreadable(f"cannot list {proc}: {exc.strerror}") from exc


def scan(proc: Path, wanted: Callable[[ContainerRef], bool] = lambda ref: True) -> ProcScan:
    """The host processes of every container `wanted` accepts (by its cgroup), in one pass."""
    found: dict[int, HostProcess] = {}
    listed = pids(proc)
    try:
        uptime = uptime_s(proc)
    except OSError as exc:
        raise ProcUnreadable(f"cannot read {proc}/uptime: {exc.strerror}") from exc
    unreadable = 0
    zombies: dict[int, int] = {}  # pid -> parent, for processes whose cgroup the kernel hides
    for pid in listed:
        try:
            lines = _read(f"{proc}/{pid}/cgroup").decode("utf-8", "replace").splitlines()
        except _GONE:
            continue
        except OSError:
            unreadable += 1
            continue
        ref = container_of(lines)
        if ref is None:
            if _all_root(lines):
                zombie = _zombie_parent(proc, pid)
                if zombie is not None:
                    zombies[pid] = zombie
            continue
        if not wanted(ref):
            continue
        try:
            hp = read_process(proc, pid, ref, uptime)
        except _GONE:
            continue
        except (OSError, ValueError, IndexError):
            unreadable += 1  # present but not readable as a process: fail safe, never guess
            continue
        if hp is not None:
            found[pid] = hp
    for pid, parent in zombies.items():
        owner = found.get(parent)
        if owner is None:
            continue
        try:
            hp = read_process(proc, pid, owner.container, uptime)
        except _GONE:
            continue
        except (OSError, ValueError, IndexError):
            unreadable += 1
            continue
        if hp is not None and hp.stat[:1] in ("Z", "X"):
            found[pid] = hp
    return ProcScan(found, len(listed), unreadable)


def _all_root(lines: list[str]) -> bool:
    return all(line.rsplit(":", 1)[-1].strip() == "/" for line in lines if line.strip())


def _zombie_parent(proc: Path, pid: int) -> int | None:
    """The parent of a zombie (state Z or X), or None for a live process or one gone."""
    try:
        stat = _read(f"{proc}/{pid}/stat").decode("utf-8", "replace")
        fields = stat[stat.rindex(")") + 2 :].split()
        return int(fields[1]) if fields[0] in ("Z", "X") else None
    except (OSError, ValueError, IndexError):
        return None


def rows(group: Iterable[HostProcess], scope: str) -> tuple[ProcessInfo, ...]:
    """The `ps` rows of one pid namespace's processes (a container's, or a shared-namespace pod's
    with its sandbox), sorted by pid as `ps` lists them. The namespace's depth is its shallowest
    member's: the container's init. Deeper members (a pid namespace nested inside) are listed at
    that depth, as the container's `ps` sees them."""
    members = {p.pid: p for p in group}
    if not members:
        return ()
    depth = min(len(p.nspid) for p in members.values())
    out: list[ProcessInfo] = []
    for p in members.values():
        parent = members.get(p.ppid)
        ppid = parent.pid_at(depth) if parent is not None else 0
        out.append(
            ProcessInfo(
                pid=p.pid_at(depth),
                state=p.stat,
                command=p.args,
                ppid=ppid,
                elapsed_s=p.elapsed_s,
                scope=scope,
            )
        )
    out.sort(key=lambda r: r.pid)
    return tuple(out)
