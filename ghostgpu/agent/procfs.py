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

Every file of a process is read through one open `/proc/<pid>` directory (`dir_fd`): a pid the
kernel hands to a new process meanwhile cannot mix two processes' files into one row (reads
through the old directory fail once its process is gone). Lines are split on `\\n` only (a
process name may hold any other control character, `\\x1c` included), every read is bounded
(`cmdline` to what the row keeps), a container holds at most MAX_PROCESSES processes, and a
process that cannot be read makes only its own container's listing incomplete (`failed`).

A process that exits while it is read is skipped: it is not there any more, which is no error.
On cgroup v1 the kernel prints an exited process's cgroups as `/`: a zombie is placed with its
parent (a zombie's parent is the one that has not reaped it, in the container).
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
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
# The processes of one container the agent reads: a fork bomb costs the agent this much per
# container, and its container is then `too-many-processes` (its listing would be incomplete).
MAX_PROCESSES = 1024
# The most a file may hold. `cgroup`: one line per hierarchy, each a path the kernel caps at
# PATH_MAX (longer fails the read). `stat` is under 1 KiB; `status` about 1.5 KiB, plus a
# `Groups:` line of up to 65,536 supplementary groups, which only a tenant's own process has.
_CGROUP_MAX = 64 << 10
_STAT_MAX = 4 << 10
_STATUS_MAX = 16 << 10
# cmdline: what the row keeps (MAX_ARGS characters, 4 bytes each at most in UTF-8) and no more.
_CMDLINE_MAX = 4 * MAX_ARGS
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC


class ProcUnreadable(OSError):
    """The proc root itself cannot be listed: nothing about any container can be said."""


class TooLarge(ValueError):
    """A /proc file longer than any the kernel writes for an ordinary process."""


class Incomplete(StrEnum):
    """Why a container's listing is not whole (the agent's unseen reasons)."""

    PROC_UNREADABLE = "proc-unreadable"  # one of its processes is there but could not be read
    TOO_MANY_PROCESSES = "too-many-processes"  # more than MAX_PROCESSES


@dataclass(frozen=True, slots=True)
class HostProcess:
    pid: int  # in the proc root's pid namespace (the host's, for the agent)
    ppid: int
    nspid: tuple[int, ...]  # its pid in each pid namespace, outermost first (status NSpid)
    container: ContainerRef
    stat: str  # ps STAT
    elapsed_s: int
    args: str  # ps args, already cut
    # For the idle-session facts (ghostgpu/agent/idle_facts.py), from the same two files (0444):
    tty: bool = False  # it has a controlling terminal (stat tty_nr)
    cpu_ticks: int = 0  # user + system CPU, with its reaped children's (stat utime..cstime)
    own_cpu_ticks: int = 0  # user + system CPU of the process alone (stat utime, stime)
    wakeups: int = 0  # voluntary + nonvoluntary context switches (status)

    def pid_at(self, depth: int) -> int:
        return self.nspid[depth - 1]


@dataclass(frozen=True, slots=True)
class ProcScan:
    processes: dict[int, HostProcess]  # host pid -> process, for the containers asked for
    scanned: int  # host pids looked at
    # Host pids whose cgroup exists but could not be read: they could be anyone's, so the caller
    # may not call any container's listing complete.
    unplaced: int
    # Containers asked for whose listing is incomplete, and why: only those, never the others.
    failed: Mapping[ContainerRef, Incomplete]


def _read(name: str, dir_fd: int | None, limit: int) -> bytes:
    """At most `limit` bytes of a file of an open /proc/<pid> directory. os.open/os.read, not
    open(): no buffered file object per file (4 files per process, 10k+ processes per scan). One
    read: the kernel writes these files whole (seq_file) or, cmdline, as far as asked."""
    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _read_whole(name: str, dir_fd: int | None, limit: int) -> bytes:
    data = _read(name, dir_fd, limit + 1)
    if len(data) > limit:
        raise TooLarge(f"{name}: more than {limit} bytes")
    return data


def _lines(data: bytes) -> list[str]:
    """A /proc file's lines: split on newlines only (str.splitlines also splits on \\x1c-\\x1e,
    \\x85, \\u2028, which a process name may hold)."""
    return data.decode("utf-8", "replace").split("\n")


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


def _split_stat(stat: str) -> tuple[str, list[str]]:
    # comm may hold spaces and parentheses: it ends at the last ')'.
    return stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()


def read_process(dir_fd: int, pid: int, container: ContainerRef, uptime: float) -> HostProcess | None:
    """One host process's ps columns from its open /proc/<pid> directory; None when it is empty.
    Raises what the reads raise (gone: _GONE; unreadable: OSError, ValueError, IndexError)."""
    stat = _read_whole("stat", dir_fd, _STAT_MAX).decode("utf-8", "replace")
    status = _read_whole("status", dir_fd, _STATUS_MAX)
    cmdline = _read("cmdline", dir_fd, _CMDLINE_MAX)
    if not stat:
        return None
    comm, fields = _split_stat(stat)
    nspid: tuple[int, ...] = ()
    vm_locked = wakeups = 0
    for line in _lines(status):
        if line.startswith("NSpid:"):
            nspid = tuple(int(x) for x in line.split()[1:])
        elif line.startswith("VmLck:"):
            vm_locked = int(line.split()[1])
        elif line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
            wakeups += int(line.split()[1])
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
        tty=int(fields[4]) != 0,
        cpu_ticks=sum(int(x) for x in fields[11:15]),
        own_cpu_ticks=int(fields[11]) + int(fields[12]),
        wakeups=wakeups,
    )


def pids(proc: Path) -> list[int]:
    try:
        return [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError as exc:
        raise ProcUnreadable(f"cannot list {proc}: {exc.strerror}") from exc


class _Pass:
    """The state of one scan: what was found, what failed, per container."""

    def __init__(self, proc: Path, uptime: float, max_per_container: int) -> None:
        self.proc = proc
        self.uptime = uptime
        self.max = max_per_container
        self.found: dict[int, HostProcess] = {}
        self.per_container: Counter[ContainerRef] = Counter()
        self.failed: dict[ContainerRef, Incomplete] = {}
        self.unplaced = 0

    def open(self, pid: int) -> int | None:
        """The process's /proc directory, open; None when it is gone (or not a directory)."""
        try:
            return os.open(f"{self.proc}/{pid}", _DIR_FLAGS)
        except (*_GONE, NotADirectoryError):
            return None

    def cgroup(self, pid: int, dir_fd: int | None = None) -> bytes | None:
        """Its cgroup file (through its open directory, or by path to decide whether to look
        closer); None when it is gone, or counted unplaced when unreadable."""
        try:
            if dir_fd is None:
                return _read_whole(f"{self.proc}/{pid}/cgroup", None, _CGROUP_MAX)
            return _read_whole("cgroup", dir_fd, _CGROUP_MAX)
        except _GONE:
            return None
        except (OSError, ValueError):
            self.unplaced += 1
            return None

    def take(
        self,
        pid: int,
        accept: Callable[[ContainerRef], bool],
        placed: tuple[bytes, ContainerRef] | None = None,
    ) -> None:
        """Read one process through its open directory, if the cgroup read there is one `accept`s
        (the pid may be another process's by now), within its container's cap. `placed`: the
        cgroup file as first read and where it placed the process (the same bytes need no parse)."""
        dir_fd = self.open(pid)
        if dir_fd is None:
            return
        try:
            again = self.cgroup(pid, dir_fd)
            if again is None:
                return
            if placed is not None and again == placed[0]:
                ref: ContainerRef | None = placed[1]
            else:  # another process by now, or moved
                ref = container_of(_lines(again))
                if ref is None or not accept(ref):
                    return
            if ref in self.failed:
                return
            if self.per_container[ref] >= self.max:
                self.failed[ref] = Incomplete.TOO_MANY_PROCESSES
                return
            try:
                hp = read_process(dir_fd, pid, ref, self.uptime)
            except _GONE:
                return
            except (OSError, ValueError, IndexError):
                self.failed[ref] = Incomplete.PROC_UNREADABLE  # there but unreadable: never guess
                return
            if hp is not None:
                self.found[pid] = hp
                self.per_container[ref] += 1
        finally:
            os.close(dir_fd)

    def zombie(self, pid: int) -> HostProcess | None:
        """A zombie (state Z or X) whose cgroup the kernel hides, read whole through its open
        directory (placed later with its parent); None for a live process, one gone or one
        unreadable."""
        try:
            stat = _read_whole(f"{self.proc}/{pid}/stat", None, _STAT_MAX).decode("utf-8", "replace")
            _, fields = _split_stat(stat)
            if fields[0] not in ("Z", "X"):
                return None  # most are kernel threads and the host's own processes: one read
        except (OSError, ValueError, IndexError):
            return None
        dir_fd = self.open(pid)
        if dir_fd is None:
            return None
        try:
            hp = read_process(dir_fd, pid, ContainerRef("", ""), self.uptime)
            return hp if hp is not None and hp.stat[:1] in ("Z", "X") else None
        except (OSError, ValueError, IndexError):
            return None
        finally:
            os.close(dir_fd)


def scan(
    proc: Path,
    wanted: Callable[[ContainerRef], bool] = lambda ref: True,
    *,
    whole_pods_of: Collection[str] = (),
    max_per_container: int | None = None,
) -> ProcScan:
    """The host processes of every container `wanted` accepts (by its cgroup), in one pass over
    the proc root, and of every pod (pid namespace shared by its containers) whose container IDs
    `whole_pods_of` names: which pod that is comes from the pod cgroup the kernel shows for the
    container's own processes, never from anything the pod's author writes.

    Every pid's cgroup is read by path first (most belong to no container asked for); a process
    that does is then read whole through its open directory, its cgroup again included."""
    cap = MAX_PROCESSES if max_per_container is None else max_per_container
    listed = pids(proc)
    try:
        uptime = uptime_s(proc)
    except OSError as exc:
        raise ProcUnreadable(f"cannot read {proc}/uptime: {exc.strerror}") from exc
    run = _Pass(proc, uptime, cap)
    whole = set(whole_pods_of)
    pods_wanted: set[str] = set()
    # Placed, not asked for: maybe in a pod of `whole` (pod -> pids: little kept per process).
    later: dict[str, list[int]] = defaultdict(list)
    zombies: list[HostProcess] = []
    for pid in listed:
        placed = run.cgroup(pid)
        if placed is None:
            continue
        lines = _lines(placed)
        ref = container_of(lines)
        if ref is None:
            if _all_root(lines) and (z := run.zombie(pid)) is not None:
                zombies.append(z)
            continue
        if ref.container_id in whole:
            pods_wanted.add(ref.pod_uid)
        if wanted(ref):
            run.take(pid, wanted, (placed, ref))
        elif whole:
            later[ref.pod_uid].append(pid)
    # The rest of the pods whose pid namespace is listed whole (their sandbox, other containers).
    for pod in pods_wanted & later.keys():
        for pid in later[pod]:
            run.take(pid, lambda r: r.pod_uid in pods_wanted)
    for z in zombies:
        owner = run.found.get(z.ppid)
        if owner is not None:
            run.found[z.pid] = replace(z, container=owner.container)
    return ProcScan(run.found, len(listed), run.unplaced, run.failed)


def _all_root(lines: list[str]) -> bool:
    return all(line.rsplit(":", 1)[-1].strip() == "/" for line in lines if line.strip())


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
